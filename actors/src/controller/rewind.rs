//! The collapse guard's action (CT-4): rewind to the newest healthy checkpoint on the lineage and
//! continue on a new branch from it.
//!
//! Steps, in order: refuse if the rewind budget is spent (GD-5); bump the epoch so that every
//! batch sampled on the abandoned branch is discarded (the ready ones now, the in-flight ones
//! when they arrive); find `newest_tagged_on_lineage("healthy")` on the current branch; restore
//! its files into the learner and set the lowered learning rate;
//! publish the restored weights under a new board epoch (WB-3); tag the abandoned head
//! `rewound-to-rewind-<n>` (GD-6); switch the store handle and the metrics to the new branch
//! `rewind-<n>`; commit the branch's first checkpoint (parent: the healthy one; tags `rewind`,
//! `anomaly-<kind>`) before any further update. Method state goes back with the weights (MR-4):
//! the method first abandons what it holds (an RTPO tree in progress; its range is sampled
//! again), then reads what the target names (ARMOR's reference from the restored learner, the
//! PATS bank the target checkpoint names) and applies it once the learner is restored; the
//! lineage reference is the target's.
//!
//! Invariants:
//! - RW-1 (the data goes back with the weights): the task cursor becomes the target
//!   checkpoint's frontier (its next task and pending ranges, DF-1), and what the abandoned
//!   branch consumed, skipped or dropped since its last checkpoint is forgotten with it. So every
//!   range trained (or skipped) on the abandoned branch after the target is owed again and
//!   sampled afresh by the restored policy on the new branch. Generation orders still out at the
//!   rewind belong to the abandoned branch (an older controller epoch): their results are
//!   discarded when they arrive, and the new branch's checkpoints never count their ranges as
//!   pending. Along the new branch's lineage each range is then trained at most once, and
//!   trained + skipped + pending ranges are exactly those handed out (the crash harness's
//!   accounting, `check_accounting`).
//! - RW-2: batch sequence numbers keep growing across a rewind (the target's `next_batch_seq`
//!   is not taken back): an order of the abandoned branch answered late is never taken for one
//!   of the new branch (orders out are known by sequence number and epoch), and no batch key is
//!   written twice (DF-3, ST-1).

use std::sync::Arc;

use actix::prelude::*;
use bytes::Bytes;
use keel_store::{CheckpointManifest, RunStore};

use super::Controller;
use crate::error::ActorError;
use crate::events::TrainEvent;
use crate::frontier::{Frontier, TaskCursor};
use crate::guard::{Anomaly, HEALTHY_TAG, REWOUND_TO_PREFIX};
use crate::learner_actor::{CurrentWeights, LearnerActor, Restore, SetLearningRate};
use crate::method::{RewindRead, Rewound as MethodRewound, REFERENCE_RESET_TAG};
use crate::weights::PublishedWeights;

/// The prefix of branches started by a rewind.
pub const REWIND_BRANCH_PREFIX: &str = "rewind-";

/// What the asynchronous part of a rewind found and did.
struct Rewound {
    target_id: String,
    target_step: u64,
    /// The target's data frontier (RW-1): the ranges it had not trained on are owed again.
    frontier: Frontier,
    version: u64,
    weights: PublishedWeights,
    branch: String,
    read_seconds: f64,
    read_bytes: u64,
    /// The reference anchor the target checkpoint names (itself when it is a reset).
    reference_id: Option<String>,
    /// What the method restores (MR-4).
    method: Option<crate::method::Restore>,
}

/// The first `rewind-<n>` not among `existing` branch names.
pub fn next_rewind_branch<'a>(existing: impl IntoIterator<Item = &'a str>) -> String {
    let taken: std::collections::BTreeSet<&str> = existing.into_iter().collect();
    (1u64..)
        .map(|n| format!("{REWIND_BRANCH_PREFIX}{n}"))
        .find(|b| !taken.contains(b.as_str()))
        .unwrap_or_default()
}

fn io_err(e: tokio::task::JoinError) -> ActorError {
    ActorError::Internal(format!("rewind I/O task: {e}"))
}

fn mailbox(e: MailboxError) -> ActorError {
    ActorError::Mailbox(e.to_string())
}

/// The asynchronous part of a rewind: everything it needs, owned.
struct RewindJob {
    store: RunStore,
    io: tokio::runtime::Handle,
    learner: Addr<LearnerActor>,
    /// The lowered learning rate.
    lr: f64,
    /// The anomaly, for the error when no target exists.
    reason: String,
    rewinds: u32,
    /// The method's reader of the target (MR-4).
    method: Option<RewindRead>,
}

impl RewindJob {
    /// Finds the target, restores the learner from it, reads the method's state and starts the
    /// new branch (GD-6).
    async fn run(self) -> Result<Rewound, ActorError> {
        let target = Arc::new(self.find_target().await?);
        let started = std::time::Instant::now();
        let files = self.read_files(&target).await?;
        let read_bytes = files.iter().map(|(_, b)| b.len() as u64).sum();
        let read_seconds = started.elapsed().as_secs_f64();
        let version = self.learner.send(Restore(files)).await.map_err(mailbox)??;
        let lr = SetLearningRate(self.lr);
        self.learner.send(lr).await.map_err(mailbox)??;
        let weights = self.learner.send(CurrentWeights).await.map_err(mailbox)??;
        let method = match self.method {
            Some(read) => Some(read(target.clone()).await?),
            None => None,
        };
        let reference_id = if target.tags.iter().any(|t| t == REFERENCE_RESET_TAG) {
            Some(target.id.clone())
        } else {
            target.reference.clone()
        };
        let branch = start_branch(&self.store, &self.io).await?;
        Ok(Rewound {
            frontier: Frontier {
                next_task: target.data.next_task_index,
                pending: target.data.pending_tasks.clone(),
                next_batch_seq: target.data.next_batch_seq,
            },
            target_id: target.id.clone(),
            target_step: target.step,
            version,
            weights,
            branch,
            read_seconds,
            read_bytes,
            reference_id,
            method,
        })
    }

    /// The newest checkpoint tagged `healthy` on the lineage, or the collapse error.
    async fn find_target(&self) -> Result<CheckpointManifest, ActorError> {
        let s = self.store.clone();
        let found = self
            .io
            .spawn(async move { s.newest_tagged_on_lineage(HEALTHY_TAG).await })
            .await
            .map_err(io_err)??;
        found.ok_or_else(|| ActorError::Collapse {
            reason: format!(
                "{}, and no checkpoint on the lineage is tagged `{HEALTHY_TAG}`",
                self.reason
            ),
            rewinds: self.rewinds,
        })
    }

    /// Every file of `target`, verified (CP-7).
    async fn read_files(
        &self,
        target: &Arc<CheckpointManifest>,
    ) -> Result<Vec<(String, Vec<u8>)>, ActorError> {
        let mut files = Vec::with_capacity(target.files.len());
        for f in &target.files {
            let (s, m, name) = (self.store.clone(), target.clone(), f.name.clone());
            let bytes: Bytes = self
                .io
                .spawn(async move { s.read_checkpoint_file(&m, &name).await })
                .await
                .map_err(io_err)??;
            files.push((f.name.clone(), bytes.to_vec()));
        }
        Ok(files)
    }
}

/// Names the new branch and tags the abandoned head with it (GD-6: a resume follows it).
async fn start_branch(store: &RunStore, io: &tokio::runtime::Handle) -> Result<String, ActorError> {
    let s = store.clone();
    let heads = io
        .spawn(async move { s.list_branches().await })
        .await
        .map_err(io_err)??;
    let branch = next_rewind_branch(heads.iter().map(|h| h.branch.as_str()));
    if let Some(head) = heads.iter().find(|h| h.branch == store.branch()) {
        let (s, id, tag) = (
            store.clone(),
            head.id.clone(),
            format!("{REWOUND_TO_PREFIX}{branch}"),
        );
        io.spawn(async move { s.tag_checkpoint(&id, &tag).await })
            .await
            .map_err(io_err)??;
    }
    Ok(branch)
}

impl Controller {
    /// RW-1: continues the data stream from the rewind target's frontier; what the abandoned
    /// branch consumed, skipped or dropped since its last checkpoint stays with that branch.
    fn replay_from(&mut self, target: &Frontier) {
        let tasks_per_batch = self.s.cfg.rollout.tasks_per_batch as u64;
        self.cursor = TaskCursor::new(target, tasks_per_batch);
        self.consumed_since_checkpoint.clear();
        self.consumed_tasks_since_checkpoint.clear();
        self.skipped_tasks_since_checkpoint.clear();
        self.dropped_since_checkpoint.clear();
    }

    /// Rewinds after `anomaly` (CT-4, GD-5).
    pub(super) fn rewind(&mut self, anomaly: Anomaly, ctx: &mut Context<Self>) {
        let rewinds = self.guard.rewinds();
        tracing::warn!(step = self.s.version, anomaly = %anomaly, rewinds, "collapse guard: anomaly");
        if !self.guard.may_rewind() {
            return self.finish(
                ctx,
                Err(ActorError::Collapse {
                    reason: anomaly.to_string(),
                    rewinds,
                }),
            );
        }
        self.rewinding = true;
        self.epoch += 1;
        // MR-4: what the method holds is abandoned with its branch; RW-1 owes its range again.
        self.method.abandon();
        self.drop_ready();
        let lr = self
            .s
            .cfg
            .guard
            .rewound_lr(self.s.cfg.learner.lr, rewinds + 1);
        let job = RewindJob {
            store: self.s.store.clone(),
            io: self.s.io.clone(),
            learner: self.s.learner.clone(),
            lr,
            reason: anomaly.to_string(),
            rewinds,
            method: self.method.rewind_reader(&self.method_io()),
        };
        let from_step = self.s.version;
        job.run()
            .into_actor(self)
            .map(move |res, act, ctx| {
                act.rewinding = false;
                match res {
                    Ok(r) => act.rewound(r, from_step, &anomaly, lr, ctx),
                    Err(e) => act.finish(ctx, Err(e)),
                }
            })
            .spawn(ctx);
    }

    /// Drops the ready batches of the abandoned branch (held ones are the method's, MR-2).
    fn drop_ready(&mut self) {
        for b in self.ready.drain(..) {
            if b.branch {
                continue;
            }
            self.dropped += 1;
            self.s.metrics.batches_dropped_by.inc_for("rewind", 1);
            (self.s.events)(&TrainEvent::Dropped {
                batch_seq: b.batch_seq,
                reason: "trained on a branch a collapse-guard rewind abandoned".into(),
            });
        }
    }

    /// The restored learner's branch: switches to it, restores the method's state and commits
    /// the branch's first checkpoint before any further update (CT-4).
    fn rewound(
        &mut self,
        r: Rewound,
        from_step: u64,
        anomaly: &Anomaly,
        lr: f64,
        ctx: &mut Context<Self>,
    ) {
        let store = match self.s.store.on_branch(&r.branch) {
            Ok(s) => s,
            Err(e) => return self.finish(ctx, Err(e.into())),
        };
        self.s.store = store;
        self.head_generation = None; // a fresh branch: its first commit creates the head
        self.s.version = r.version;
        self.s.parent_checkpoint = Some(r.target_id.clone());
        self.replay_from(&r.frontier);
        self.s.board.rewind(r.weights);
        if let Some(restore) = r.method {
            let at = MethodRewound {
                board: self.s.board.as_ref(),
                version: r.version,
            };
            if let Err(e) = restore(&at) {
                return self.finish(ctx, Err(e));
            }
        }
        if r.reference_id.is_some() {
            self.s.reference = r.reference_id;
        }
        self.guard.on_rewound();
        let m = &self.s.metrics;
        m.store_get_seconds
            .observe_for("checkpoint", r.read_seconds);
        m.store_bytes.inc_for("get", r.read_bytes);
        m.set_branch(&r.branch);
        m.guard_rewinds.inc();
        self.export_static(lr);
        let kind = anomaly.kind();
        self.next_tags = vec!["rewind".to_string(), format!("anomaly-{kind}")];
        self.last_metrics
            .insert("rewind_from_step".into(), from_step as f64);
        self.last_metrics
            .insert("rewind_number".into(), f64::from(self.guard.rewinds()));
        tracing::warn!(from_step, to = %r.target_id, to_step = r.target_step, branch = %r.branch, lr, "collapse guard: rewound");
        (self.s.events)(&TrainEvent::Rewind {
            from_step,
            to_step: r.target_step,
            to_checkpoint: r.target_id,
            branch: r.branch,
            kind: kind.to_string(),
            reason: anomaly.to_string(),
            lr,
        });
        // The branch's first checkpoint: committed before any further update (CT-4).
        self.checkpointed_version = None;
        self.checkpoint(ctx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewind_branch_names_are_fresh() {
        assert_eq!(next_rewind_branch([]), "rewind-1");
        assert_eq!(
            next_rewind_branch(["main", "rewind-1", "rewind-3"]),
            "rewind-2"
        );
    }
}
