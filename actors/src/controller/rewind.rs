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
//! `anomaly-<kind>`) before any further update. Method state goes back with the weights: ARMOR's
//! reference is re-published from the restored learner (and the lineage reference is the
//! target's), the PATS bank becomes the one the target checkpoint names, an RTPO tree in
//! progress is abandoned and its range sampled again.
//!
//! The data goes back too (RW-1): the task cursor becomes the target checkpoint's frontier, so
//! every range trained (or skipped) on the abandoned branch after the target is owed again and
//! sampled afresh by the restored policy on the new branch, and what the abandoned branch used
//! since its last checkpoint is forgotten with it. Generation orders still out at the rewind
//! belong to the abandoned branch: their results are discarded when they arrive and the new
//! branch's checkpoints never count their ranges as pending. Along the new branch's lineage each range is
//! then trained at most once and trained + skipped + pending ranges are exactly those handed out
//! (the crash harness's accounting, `check_accounting`). Batch sequence numbers keep growing
//! (DF-3).

use actix::prelude::*;
use bytes::Bytes;
use keel_store::RunStore;

use super::Controller;
use crate::error::ActorError;
use crate::events::TrainEvent;
use crate::guard::{Anomaly, HEALTHY_TAG, REWOUND_TO_PREFIX};
use crate::learner_actor::{CurrentWeights, ReferenceWeights, Restore, SetLearningRate};
use crate::weights::PublishedReference;

use super::methods;
use crate::frontier::{Frontier, TaskCursor};
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
    /// ARMOR: the restored reference policy's weights (MS-3).
    reference_weights: Option<Vec<u8>>,
    /// The reference anchor the target checkpoint names (itself when it is a reset).
    reference_id: Option<String>,
    /// PATS: the target's scaffold state and where it is stored (MS-2), or None for a fresh bank.
    pats: Option<(keel_envs::scaffold::ScaffoldState, methods::PatsPointer)>,
}

/// The first `rewind-<n>` not among `existing` branch names.
pub fn next_rewind_branch<'a>(existing: impl IntoIterator<Item = &'a str>) -> String {
    let taken: std::collections::BTreeSet<&str> = existing.into_iter().collect();
    (1u64..)
        .map(|n| format!("{REWIND_BRANCH_PREFIX}{n}"))
        .find(|b| !taken.contains(b.as_str()))
        .unwrap_or_default()
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
        // An RTPO tree is abandoned with its branch; RW-1 owes its range again.
        self.rtpo = None;
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
        let from_step = self.s.version;
        let store: RunStore = self.s.store.clone();
        let io = self.s.io.clone();
        let learner = self.s.learner.clone();
        let lr = self
            .s
            .cfg
            .guard
            .rewound_lr(self.s.cfg.learner.lr, rewinds + 1);
        let reason = anomaly.to_string();
        let armor = self.s.cfg.learner.algo == keel_learner::Algo::Armor;
        let fut = async move {
            let io_err =
                |e: tokio::task::JoinError| ActorError::Internal(format!("rewind I/O task: {e}"));
            let s = store.clone();
            let found = io
                .spawn(async move { s.newest_tagged_on_lineage(HEALTHY_TAG).await })
                .await
                .map_err(io_err)??;
            let Some(target) = found else {
                return Err(ActorError::Collapse {
                    reason: format!(
                        "{reason}, and no checkpoint on the lineage is tagged `{HEALTHY_TAG}`"
                    ),
                    rewinds,
                });
            };
            let started = std::time::Instant::now();
            let mut files = Vec::with_capacity(target.files.len());
            for f in &target.files {
                let (s, m, name) = (store.clone(), target.clone(), f.name.clone());
                let bytes: Bytes = io
                    .spawn(async move { s.read_checkpoint_file(&m, &name).await })
                    .await
                    .map_err(io_err)??;
                files.push((f.name.clone(), bytes.to_vec()));
            }
            let read_bytes = files.iter().map(|(_, b)| b.len() as u64).sum();
            let read_seconds = started.elapsed().as_secs_f64();
            let mailbox = |e: MailboxError| ActorError::Mailbox(e.to_string());
            let version = learner.send(Restore(files)).await.map_err(mailbox)??;
            learner.send(SetLearningRate(lr)).await.map_err(mailbox)??;
            let weights = learner.send(CurrentWeights).await.map_err(mailbox)??;
            let reference_weights = if armor {
                Some(learner.send(ReferenceWeights).await.map_err(mailbox)??)
            } else {
                None
            };
            let reference_id = if target
                .tags
                .iter()
                .any(|t| t == methods::REFERENCE_RESET_TAG)
            {
                Some(target.id.clone())
            } else {
                target.reference.clone()
            };
            let pats = match target.data.method_state.get(methods::PATS_STATE) {
                Some(text) => {
                    let pointer: methods::PatsPointer =
                        serde_json::from_str(text).map_err(|e| {
                            ActorError::Resume(format!(
                                "checkpoint {}: method_state.pats: {e}",
                                target.id
                            ))
                        })?;
                    let (s, key) = (store.clone(), pointer.key.clone());
                    let bytes = io
                        .spawn(async move { s.get_object(&key).await })
                        .await
                        .map_err(io_err)??;
                    let state = keel_envs::scaffold::ScaffoldState::from_json_bytes(&bytes)
                        .map_err(|e| {
                            ActorError::Resume(format!("PATS state {}: {e}", pointer.key))
                        })?;
                    Some((state, pointer))
                }
                None => None,
            };
            let s = store.clone();
            let heads = io
                .spawn(async move { s.list_branches().await })
                .await
                .map_err(io_err)??;
            let branch = next_rewind_branch(heads.iter().map(|h| h.branch.as_str()));
            // GD-6: the abandoned head points to the new branch, so a resume follows it.
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
            Ok(Rewound {
                frontier: Frontier {
                    next_task: target.data.next_task_index,
                    pending: target.data.pending_tasks.clone(),
                    next_batch_seq: target.data.next_batch_seq,
                },
                target_id: target.id,
                target_step: target.step,
                version,
                weights,
                branch,
                read_seconds,
                read_bytes,
                reference_weights,
                reference_id,
                pats,
            })
        };
        let kind = anomaly.kind();
        let reason = anomaly.to_string();
        fut.into_actor(self)
            .map(move |res, act, ctx| {
                act.rewinding = false;
                let r = match res {
                    Ok(r) => r,
                    Err(e) => return act.finish(ctx, Err(e)),
                };
                let store = match act.s.store.on_branch(&r.branch) {
                    Ok(s) => s,
                    Err(e) => return act.finish(ctx, Err(e.into())),
                };
                act.s.store = store;
                act.head_generation = None; // a fresh branch: its first commit creates the head
                act.s.version = r.version;
                act.s.parent_checkpoint = Some(r.target_id.clone());
                act.replay_from(&r.frontier);
                act.s.board.rewind(r.weights);
                if let Some(weights) = r.reference_weights {
                    // MS-3: anchors sample from the restored reference, named as before.
                    act.s.board.publish_reference(PublishedReference {
                        copied_at: r.version,
                        serial: 0,
                        safetensors: std::sync::Arc::new(weights),
                    });
                }
                if r.reference_id.is_some() {
                    act.s.reference = r.reference_id;
                }
                if let Some(pats) = act.pats.as_mut() {
                    // MS-2: the bank goes back with the weights it was trained under.
                    let (state, pointer) = match r.pats {
                        Some((state, pointer)) => (state, Some(pointer)),
                        None => (keel_envs::scaffold::ScaffoldState::new(), None),
                    };
                    if let Err(e) = pats.controller.restore_state(state) {
                        return act.finish(ctx, Err(ActorError::Resume(format!("PATS rewind: {e}"))));
                    }
                    pats.bank = std::sync::Arc::new(pats.controller.bank().clone());
                    pats.pointer = pointer;
                }
                act.guard.on_rewound();
                let m = &act.s.metrics;
                m.store_get_seconds.observe_for("checkpoint", r.read_seconds);
                m.store_bytes.inc_for("get", r.read_bytes);
                m.set_branch(&r.branch);
                m.guard_rewinds.inc();
                act.export_static(lr);
                act.next_tags = vec!["rewind".to_string(), format!("anomaly-{kind}")];
                act.last_metrics.insert("rewind_from_step".into(), from_step as f64);
                act.last_metrics.insert("rewind_number".into(), f64::from(act.guard.rewinds()));
                tracing::warn!(from_step, to = %r.target_id, to_step = r.target_step, branch = %r.branch, lr, "collapse guard: rewound");
                (act.s.events)(&TrainEvent::Rewind {
                    from_step,
                    to_step: r.target_step,
                    to_checkpoint: r.target_id,
                    branch: r.branch,
                    kind: kind.to_string(),
                    reason: reason.clone(),
                    lr,
                });
                // The branch's first checkpoint: committed before any further update (CT-4).
                act.checkpointed_version = None;
                act.checkpoint(ctx);
            })
            .spawn(ctx);
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
