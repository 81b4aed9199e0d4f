//! RTPO at run time: one reverse tree per task range — a `Trunks` generation, then one
//! `Branches` generation and one update per depth, the last turn's boundary first.
//!
//! Invariants:
//! - MS-1 (RTPO tree): a task range is one trunk batch then `depth` sibling batches, depth 0
//!   (the last turn's boundary) first; the range counts as trained (`consumed_tasks`) only after
//!   its last depth is trained, and until then it is pending in every checkpoint, with the tree
//!   position (`key`, `next`) in `method_state["rtpo"]`. A resumed run continues the tree at
//!   `next` from the stored trunk record; sibling batches lost with the crash are sampled again.
//!
//! The controller side is [`Rtpo`]; the generator side (GN-6, `generator.rs`) is
//! [`TrunkRecord`] and [`branch_plans`].

use std::collections::BTreeMap;

use keel_store::{RolloutBatch, Source};
use serde::{Deserialize, Serialize};

use super::{HeldStep, MethodFuture, MethodIo, MethodRuntime, Planned, StateKeys};
use crate::error::ActorError;
use crate::events::MethodDetail;
use crate::frontier::TaskCursor;
use crate::generator::{Generated, Work};
use crate::rollout::{BoundaryState, EpisodePlan, TaskRef};
use crate::setup::ModelSetup;

/// The key of RTPO's tree position in `method_state`.
pub const RTPO_STATE: &str = "rtpo";

/// RTPO: where the current tree stands (MS-1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RtpoTree {
    /// First task id of the range the trunks were sampled for.
    pub first_task: u64,
    /// Store key of the trunk record.
    pub key: String,
    /// Depths in all (the most turns of a trunk).
    pub depth: usize,
    /// The next depth to branch and train (0 = the last turn's boundary).
    pub next: usize,
}

impl RtpoTree {
    /// Parses the checkpoint form.
    pub fn from_state(text: &str) -> Result<Self, ActorError> {
        serde_json::from_str(text).map_err(|e| {
            ActorError::Resume(format!("method_state.rtpo is not a tree position: {e}"))
        })
    }

    /// The checkpoint form.
    pub fn to_state(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// RTPO's controller side: the tree in progress (MS-1).
#[derive(Debug, Default)]
pub struct Rtpo {
    tree: Option<RtpoTree>,
}

impl MethodRuntime for Rtpo {
    fn name(&self) -> &'static str {
        "rtpo"
    }

    fn reuses_stored_batches(&self) -> bool {
        false // MS-1: sibling batches lost with a crash are branched again from the trunk
    }

    fn start<'a>(
        &'a mut self,
        _io: &'a MethodIo,
        _model: &'a ModelSetup,
        method_state: &'a BTreeMap<String, String>,
        _version: u64,
    ) -> MethodFuture<'a, ()> {
        // MS-1: a tree in progress keeps its range (the controller claims it from the cursor).
        self.tree = method_state
            .get(RTPO_STATE)
            .and_then(|t| match RtpoTree::from_state(t) {
                Ok(tree) => Some(tree),
                Err(e) => {
                    tracing::warn!(error = %e, "ignoring the checkpoint's RTPO tree position; its range is sampled again");
                    None
                }
            });
        Box::pin(async { Ok(()) })
    }

    fn held_range(&self) -> Option<u64> {
        self.tree.as_ref().map(|t| t.first_task)
    }

    fn abandon(&mut self) {
        self.tree = None;
    }

    fn next_work(&mut self, seq: u64, cursor: &mut TaskCursor, keys: &StateKeys) -> Planned {
        match &self.tree {
            Some(tree) => Planned {
                first_task: tree.first_task,
                work: Work::Branches {
                    key: tree.key.clone(),
                    depth: tree.next,
                },
                held: true,
            },
            None => Planned {
                first_task: cursor.take(),
                work: Work::Trunks {
                    key: keys.key("rtpo", &format!("trunk-{seq:010}")),
                },
                held: false,
            },
        }
    }

    fn on_unstored(&mut self, planned: &Planned, g: &Generated) -> Result<(), ActorError> {
        match (&planned.work, g.trunk_depth) {
            (Work::Trunks { key }, Some(depth)) if depth > 0 => {
                self.tree = Some(RtpoTree {
                    first_task: planned.first_task,
                    key: key.clone(),
                    depth,
                    next: 0,
                });
                Ok(())
            }
            (_, Some(_)) => Err(ActorError::Internal(format!(
                "RTPO trunks of batch {} have no turn: raise model.context_len",
                g.batch_seq
            ))),
            _ => Err(ActorError::Internal("train batch was not stored".into())),
        }
    }

    fn on_held_consumed(&mut self, batch_seq: u64) -> Option<HeldStep> {
        let tree = self.tree.as_mut()?;
        let detail = MethodDetail {
            first_task: Some(tree.first_task),
            depth: Some(tree.next as u64),
            depths: Some(tree.depth as u64),
            batch_seq: Some(batch_seq),
            ..MethodDetail::default()
        };
        tree.next += 1;
        let trained = (tree.next >= tree.depth).then_some(tree.first_task);
        if trained.is_some() {
            self.tree = None;
        }
        Some(HeldStep { detail, trained })
    }

    fn save_state(&self, method_state: &mut BTreeMap<String, String>) {
        if let Some(tree) = &self.tree {
            method_state.insert(RTPO_STATE.to_string(), tree.to_state());
        }
    }
}

/// RTPO: the trunk of one task and the boundary before each of its turns (GN-6).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Trunk {
    /// The task.
    pub task_id: u64,
    /// Its env seed.
    pub task_seed: u64,
    /// Boundary k = the state before turn k.
    pub boundaries: Vec<BoundaryState>,
    /// The trunk's final reward.
    pub final_reward: f32,
}

/// The stored record of one trunk batch.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TrunkRecord {
    /// Format tag.
    pub format: String,
    /// Policy version that sampled the trunks.
    pub policy_version: u64,
    /// The trunks.
    pub trunks: Vec<Trunk>,
}

const TRUNK_FORMAT: &str = "keel.rtpo.trunks.v1";

impl TrunkRecord {
    /// The record of a trunk batch: each trajectory with the boundaries captured for it.
    pub fn of_batch(
        batch: &RolloutBatch,
        boundaries: Vec<Vec<BoundaryState>>,
        tasks: &[TaskRef],
        policy_version: u64,
    ) -> Self {
        let seed_of = |id: u64| {
            tasks
                .iter()
                .find(|x| x.task_id == id)
                .map(|x| x.task_seed)
                .unwrap_or_default()
        };
        TrunkRecord {
            format: TRUNK_FORMAT.into(),
            policy_version,
            trunks: batch
                .trajectories
                .iter()
                .zip(boundaries)
                .map(|(t, boundaries)| Trunk {
                    task_id: t.task_id,
                    task_seed: seed_of(t.task_id),
                    boundaries,
                    final_reward: t.final_reward,
                })
                .collect(),
        }
    }

    /// The most turns of any trunk.
    pub fn depth(&self) -> usize {
        self.trunks
            .iter()
            .map(|t| t.boundaries.len())
            .max()
            .unwrap_or(0)
    }

    /// Parses and checks a stored record.
    pub fn from_bytes(key: &str, bytes: &[u8]) -> Result<Self, ActorError> {
        let r: TrunkRecord = serde_json::from_slice(bytes)
            .map_err(|e| ActorError::Resume(format!("RTPO trunk record {key}: {e}")))?;
        if r.format != TRUNK_FORMAT {
            return Err(ActorError::Resume(format!(
                "RTPO trunk record {key}: format {:?}, expected {TRUNK_FORMAT:?}",
                r.format
            )));
        }
        Ok(r)
    }
}

/// Group id of the siblings branched at `depth` from a task's trunk (unique per boundary).
pub fn sibling_group(task_id: u64, depth: usize) -> u64 {
    (task_id << 16) | depth as u64
}

/// RTPO siblings: `group_size` continuations of each trunk's boundary `depth` turns from its
/// end (trunks with fewer turns sit this depth out).
pub fn branch_plans(record: &TrunkRecord, depth: usize, group_size: usize) -> Vec<EpisodePlan> {
    let mut plans = Vec::new();
    for trunk in &record.trunks {
        let k = trunk.boundaries.len();
        if depth >= k {
            continue;
        }
        let boundary = &trunk.boundaries[k - 1 - depth];
        for _ in 0..group_size {
            plans.push(EpisodePlan {
                task: TaskRef {
                    task_id: trunk.task_id,
                    task_seed: trunk.task_seed,
                },
                group_id: sibling_group(trunk.task_id, depth),
                source: Source::OnPolicy,
                start: Some(boundary.clone()),
            });
        }
    }
    plans
}
