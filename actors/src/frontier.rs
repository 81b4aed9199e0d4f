//! The data frontier: which tasks have been handed out, which are still owed a training update,
//! and how a resumed run accounts for the batches it finds in the store.
//!
//! Tasks are handed out in ranges of `tasks_per_batch` consecutive task ids; a range is named by
//! its first task id.
//!
//! Invariants:
//! - DF-1: every task range below `next_task` is either consumed (trained on) or `pending`
//!   (assigned, not yet trained); a checkpoint records `next_task` and `pending`, so a resumed run
//!   owes exactly the pending ranges and everything from `next_task` on: none is skipped.
//! - DF-2 (resume): a batch found in the store is reused only if it covers a range still owed,
//!   no other found batch already covers it, and its policy version is within the staleness bound
//!   of the restored version (sync mode: equal). Every other found batch that covers an owed range
//!   is dropped and counted; its range is regenerated. No range is trained on twice. Every turn
//!   counts, not only the batch's start: with in-flight weight updates (RO-10) a batch that started
//!   under an old version may hold turns of a version published after the checkpoint, by a policy
//!   the resumed run never had (its update was lost with the crash); such a batch is dropped.
//! - DF-3: batch sequence numbers after a resume are above every sequence number in the store, so
//!   no batch object is ever overwritten (ST-1).
//! - DF-5: a found batch whose first task lies more than [`MAX_RANGES_AHEAD`] ranges beyond the
//!   checkpoint's next task is never reused (dropped and counted): keel never has that many
//!   ranges in flight, and the owed gaps before it would have to be listed one by one. Planning
//!   never overflows, whatever the store holds.

use std::collections::{BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

/// How far beyond the checkpoint's next task a reusable batch may start, in ranges (DF-5).
pub const MAX_RANGES_AHEAD: u64 = 4096;

/// The frontier as recorded in a checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frontier {
    /// First task id never handed out.
    pub next_task: u64,
    /// First task ids of ranges handed out but not trained on, ascending.
    pub pending: Vec<u64>,
    /// Next batch sequence number.
    pub next_batch_seq: u64,
}

/// A batch found in the store at resume time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundBatch {
    /// Its key (two writers may have stored one seq, ST-12).
    pub key: String,
    /// Its sequence number.
    pub batch_seq: u64,
    /// Its first task id.
    pub first_task: u64,
    /// The oldest policy version of its turns.
    pub oldest_version: u64,
    /// The newest policy version of its turns.
    pub newest_version: u64,
}

/// What a resumed run does with the store's batches.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResumePlan {
    /// Batches to train on first, in sequence order.
    pub reuse: Vec<FoundBatch>,
    /// Batches that covered an owed range but cannot be used (DF-2).
    pub dropped: Vec<FoundBatch>,
    /// The frontier to continue from.
    pub frontier: Frontier,
}

/// Plans a resume (DF-2, DF-3) from the checkpoint's frontier, the restored policy version, the
/// staleness bound and every batch in the store.
pub fn plan_resume(
    saved: &Frontier,
    restored_version: u64,
    bound: u64,
    tasks_per_batch: u64,
    mut found: Vec<FoundBatch>,
) -> ResumePlan {
    found.sort_by_key(|b| b.batch_seq);
    let mut pending: BTreeSet<u64> = saved.pending.iter().copied().collect();
    let mut next_task = saved.next_task;
    let mut claimed = BTreeSet::new();
    let mut plan = ResumePlan::default();
    let max_seq = found
        .iter()
        .map(|b| b.batch_seq.saturating_add(1))
        .max()
        .unwrap_or(0);
    let reach = next_task.saturating_add(MAX_RANGES_AHEAD.saturating_mul(tasks_per_batch));
    for b in found {
        let owed = pending.contains(&b.first_task) || b.first_task >= next_task;
        let dispatched_before_checkpoint = b.batch_seq < saved.next_batch_seq;
        if !owed || (dispatched_before_checkpoint && !pending.contains(&b.first_task)) {
            continue; // consumed before the checkpoint
        }
        if claimed.contains(&b.first_task) {
            continue; // an earlier batch already covers this range (superseded duplicate)
        }
        let fresh_enough = b.newest_version <= restored_version
            && b.oldest_version <= b.newest_version
            && restored_version - b.oldest_version <= bound;
        if !fresh_enough || b.first_task >= reach {
            plan.dropped.push(b);
            continue;
        }
        claimed.insert(b.first_task);
        if !pending.remove(&b.first_task) {
            let mut gap = next_task;
            while gap < b.first_task {
                pending.insert(gap);
                gap = gap.saturating_add(tasks_per_batch.max(1));
            }
            next_task = b.first_task.saturating_add(tasks_per_batch);
        }
        plan.reuse.push(b);
    }
    plan.frontier = Frontier {
        next_task,
        pending: pending.into_iter().collect(),
        next_batch_seq: saved.next_batch_seq.max(max_seq),
    };
    plan
}

/// The live frontier of a running controller.
#[derive(Debug, Clone, Default)]
pub struct TaskCursor {
    next_task: u64,
    owed: VecDeque<u64>,
    tasks_per_batch: u64,
}

impl TaskCursor {
    /// Continues from `frontier`, owing its pending ranges first.
    pub fn new(frontier: &Frontier, tasks_per_batch: u64) -> Self {
        Self {
            next_task: frontier.next_task,
            owed: frontier.pending.iter().copied().collect(),
            tasks_per_batch,
        }
    }

    /// The next range to generate: an owed one first, else a fresh one.
    pub fn take(&mut self) -> u64 {
        if let Some(first) = self.owed.pop_front() {
            return first;
        }
        let first = self.next_task;
        self.next_task += self.tasks_per_batch;
        first
    }

    /// Takes `first` out of the owed ranges (a resumed RTPO tree keeps its range, MS-1); false
    /// when it was not owed.
    pub fn claim(&mut self, first: u64) -> bool {
        match self.owed.iter().position(|&x| x == first) {
            Some(i) => {
                self.owed.remove(i);
                true
            }
            None => false,
        }
    }

    /// A range must be generated again (its batch was dropped or its generator panicked).
    pub fn give_back(&mut self, first: u64) {
        let pos = self
            .owed
            .iter()
            .position(|&x| x > first)
            .unwrap_or(self.owed.len());
        self.owed.insert(pos, first);
    }

    /// The frontier to record, given the ranges handed out and not yet trained on.
    pub fn frontier(
        &self,
        in_flight: impl IntoIterator<Item = u64>,
        next_batch_seq: u64,
    ) -> Frontier {
        let mut pending: BTreeSet<u64> = self.owed.iter().copied().collect();
        pending.extend(in_flight);
        Frontier {
            next_task: self.next_task,
            pending: pending.into_iter().collect(),
            next_batch_seq,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fb(seq: u64, first: u64, v: u64) -> FoundBatch {
        FoundBatch {
            key: format!("batches/{seq}"),
            batch_seq: seq,
            first_task: first,
            oldest_version: v,
            newest_version: v,
        }
    }

    #[test]
    fn sync_resume_reuses_the_on_policy_batch_and_drops_the_future() {
        // Checkpoint after step 2: tasks 0..32 consumed (T = 16), batches 0, 1 trained.
        let saved = Frontier {
            next_task: 32,
            pending: vec![],
            next_batch_seq: 2,
        };
        let found = vec![fb(0, 0, 0), fb(1, 16, 1), fb(2, 32, 2), fb(3, 48, 3)];
        let plan = plan_resume(&saved, 2, 0, 16, found);
        assert_eq!(plan.reuse, vec![fb(2, 32, 2)]);
        assert_eq!(plan.dropped, vec![fb(3, 48, 3)]);
        assert_eq!(
            plan.frontier,
            Frontier {
                next_task: 48,
                pending: vec![],
                next_batch_seq: 4
            }
        );
    }

    #[test]
    fn df2_a_batch_with_a_turn_newer_than_the_checkpoint_is_dropped() {
        // Async, bound 2, checkpoint at version 78. Batch 93 started under 77, and in-flight
        // updates (RO-10) gave its last turns version 79: weights published just before the
        // crash, by an update the checkpoint does not hold. Batch 94 ends at 78: reusable.
        let saved = Frontier {
            next_task: 96,
            pending: vec![84, 90],
            next_batch_seq: 95,
        };
        let mixed = FoundBatch {
            newest_version: 79,
            ..fb(93, 84, 77)
        };
        let ok = FoundBatch {
            newest_version: 78,
            ..fb(94, 90, 77)
        };
        let plan = plan_resume(&saved, 78, 2, 6, vec![mixed.clone(), ok.clone()]);
        assert_eq!(plan.reuse, vec![ok]);
        assert_eq!(plan.dropped, vec![mixed]);
        assert_eq!(plan.frontier.pending, vec![84], "its range is owed again");
    }

    #[test]
    fn pending_ranges_are_reused_or_owed() {
        let saved = Frontier {
            next_task: 64,
            pending: vec![32, 48],
            next_batch_seq: 4,
        };
        let found = vec![fb(2, 32, 1), fb(3, 48, 2), fb(0, 0, 0)];
        let plan = plan_resume(&saved, 2, 1, 16, found);
        assert_eq!(plan.reuse, vec![fb(2, 32, 1), fb(3, 48, 2)]);
        assert!(plan.dropped.is_empty());
        assert_eq!(plan.frontier.pending, Vec::<u64>::new());
    }

    #[test]
    fn duplicates_are_not_trained_twice_and_gaps_are_owed() {
        let saved = Frontier {
            next_task: 0,
            pending: vec![],
            next_batch_seq: 0,
        };
        let found = vec![fb(0, 16, 0), fb(1, 16, 0), fb(2, 48, 0)];
        let plan = plan_resume(&saved, 0, 0, 16, found);
        assert_eq!(plan.reuse, vec![fb(0, 16, 0), fb(2, 48, 0)]);
        assert_eq!(plan.frontier.pending, vec![0, 32]);
        assert_eq!(plan.frontier.next_task, 64);
        assert_eq!(plan.frontier.next_batch_seq, 3);
    }

    #[test]
    fn df5_a_batch_far_beyond_the_frontier_is_dropped_and_nothing_overflows() {
        let saved = Frontier {
            next_task: 32,
            pending: vec![],
            next_batch_seq: 2,
        };
        let far = fb(3, 32 + 16 * MAX_RANGES_AHEAD, 2);
        let huge = FoundBatch {
            batch_seq: u64::MAX,
            ..fb(0, u64::MAX - 3, 2)
        };
        let plan = plan_resume(
            &saved,
            2,
            0,
            16,
            vec![fb(2, 32, 2), far.clone(), huge.clone()],
        );
        assert_eq!(plan.reuse, vec![fb(2, 32, 2)]);
        assert_eq!(plan.dropped, vec![far, huge]);
        assert_eq!(plan.frontier.next_task, 48);
        assert_eq!(plan.frontier.next_batch_seq, u64::MAX);
    }

    #[test]
    fn cursor_owes_given_back_ranges_in_order() {
        let mut c = TaskCursor::new(
            &Frontier {
                next_task: 32,
                pending: vec![16],
                next_batch_seq: 0,
            },
            16,
        );
        assert_eq!(c.take(), 16);
        assert_eq!(c.take(), 32);
        c.give_back(16);
        assert_eq!(c.take(), 16);
        assert_eq!(c.take(), 48);
        assert_eq!(
            c.frontier([48], 9),
            Frontier {
                next_task: 64,
                pending: vec![48],
                next_batch_seq: 9
            }
        );
    }
}
