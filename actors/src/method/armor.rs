//! ARMOR at run time: anchor episodes from the reference policy, and reference resets.
//!
//! Invariants:
//! - MS-3 (ARMOR): a reference reset at step s copies the policy into the reference, publishes
//!   it to generators (WB-4) and forces a checkpoint at s tagged `reference-reset`; later
//!   checkpoints name that checkpoint as their reference. The reference weights themselves are
//!   in every checkpoint (`reference.safetensors`), so a resumed run samples anchors from the
//!   same reference, and a rewound one from the restored reference.
//!
//! Generators sample the anchors (`Sampling::anchor_episodes`) and keep them as GN-7
//! (`generator.rs`) says, through [`filter_anchors`].
//! The reset itself (learner `ResetReference`, the board, the tagged checkpoint) is the
//! controller's generic reference reset; ARMOR says when ([`MethodRuntime::resets_reference_at`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use keel_store::{CheckpointManifest, RolloutBatch, Source};

use super::{MethodFuture, MethodIo, MethodRuntime, Restore, RewindRead, Rewound, Sampling};
use crate::config::TrainConfig;
use crate::learner_actor::ReferenceWeights;
use crate::rollout::uninformative;
use crate::setup::ModelSetup;
use crate::weights::PublishedReference;

/// The tag of a checkpoint taken at an ARMOR reference reset.
pub const REFERENCE_RESET_TAG: &str = "reference-reset";

/// ARMOR's controller side.
#[derive(Debug, Clone, Copy)]
pub struct Armor {
    /// `armor.reference_reset_every` (0 = never).
    pub reset_every: u64,
}

impl MethodRuntime for Armor {
    fn name(&self) -> &'static str {
        "armor"
    }

    fn sampling(&self, cfg: &TrainConfig) -> Sampling {
        Sampling {
            anchor_episodes: cfg.armor.anchor_episodes,
            ..Sampling::of(cfg)
        }
    }

    fn start<'a>(
        &'a mut self,
        io: &'a MethodIo,
        _model: &'a ModelSetup,
        _method_state: &'a BTreeMap<String, String>,
        version: u64,
    ) -> MethodFuture<'a, ()> {
        Box::pin(async move {
            // WB-4: anchor episodes sample from the reference the learner holds (restored with
            // the checkpoint, or the current weights at the RL start).
            let weights = io.ask(ReferenceWeights).await??;
            io.board.publish_reference(PublishedReference {
                copied_at: version,
                serial: 0,
                safetensors: Arc::new(weights),
            });
            Ok(())
        })
    }

    fn resets_reference_at(&self, version: u64) -> bool {
        self.reset_every > 0 && version.is_multiple_of(self.reset_every)
    }

    fn rewind_reader(&self, io: &MethodIo) -> Option<RewindRead> {
        let io = io.clone();
        Some(Box::new(
            move |_target: Arc<CheckpointManifest>| -> MethodFuture<'static, Restore> {
                Box::pin(async move {
                    let weights = io.ask(ReferenceWeights).await??;
                    // MS-3: anchors sample from the restored reference, named as before.
                    let restore: Restore = Box::new(move |r: &Rewound<'_>| {
                        r.board.publish_reference(PublishedReference {
                            copied_at: r.version,
                            serial: 0,
                            safetensors: Arc::new(weights),
                        });
                        Ok(())
                    });
                    Ok(restore)
                })
            },
        ))
    }
}

/// ARMOR's group construction (spec §4.2, GN-7): a group keeps its first successful anchor
/// episode when its on-policy episodes are neither all right nor all wrong; every other anchor
/// episode is dropped.
pub fn filter_anchors(batch: &mut RolloutBatch) {
    let mut groups: BTreeMap<u64, Vec<&keel_store::Trajectory>> = Default::default();
    for t in &batch.trajectories {
        groups.entry(t.group_id).or_default().push(t);
    }
    let informative: Vec<u64> = groups
        .into_iter()
        .filter(|(_, ts)| !uninformative(ts.iter().copied(), false))
        .map(|(g, _)| g)
        .collect();
    let mut taken = std::collections::BTreeSet::new();
    batch.trajectories.retain(|t| {
        t.source == Source::OnPolicy
            || (t.final_reward >= 1.0
                && informative.contains(&t.group_id)
                && taken.insert(t.group_id))
    });
}
