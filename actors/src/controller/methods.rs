//! The controller's per-method state: RTPO's reverse tree, the PATS scaffold and ARMOR's
//! reference resets. Each piece is small, serialisable into a checkpoint's `method_state`, and
//! consulted by the controller at three points: what to generate next, what a trained batch
//! means, and what to record in a checkpoint.
//!
//! Invariants:
//! - MS-1 (RTPO tree): a task range is one trunk batch then `depth` sibling batches, depth 0
//!   (the last turn's boundary) first; the range counts as trained (`consumed_tasks`) only after
//!   its last depth is trained, and until then it is pending in every checkpoint, with the tree
//!   position (`key`, `next`) in `method_state["rtpo"]`. A resumed run continues the tree at
//!   `next` from the stored trunk record; sibling batches lost with the crash are sampled again.
//! - MS-2 (PATS): the bank a generation uses is the one in force when it was asked for; a
//!   review runs after each trained batch that carries rollout groups, and every bank version it
//!   produces is stored create-only (`state/pats/scaffold-<version>.json`) before any generation
//!   uses it; checkpoints name the stored state in `method_state["pats"]`.
//! - MS-4 (state objects): trunk records and bank versions are stored create-only under keys
//!   that carry the writing life's tag (`life_tag`), so an object stored by a life that crashed
//!   before any checkpoint named it is left in place (an orphan) rather than overwritten; the
//!   checkpoint names the exact key a resumed run reads.
//! - MS-3 (ARMOR): a reference reset at step s copies the policy into the reference, publishes
//!   it to generators (WB-4) and forces a checkpoint at s tagged `reference-reset`; later
//!   checkpoints name that checkpoint as their reference. The reference weights themselves are
//!   in every checkpoint (`reference.safetensors`), so a resumed run samples anchors from the
//!   same reference.

use std::sync::Arc;

use keel_envs::scaffold::{Bank, GroupRecord, ScaffoldController, ScaffoldState, StepReview};
use serde::{Deserialize, Serialize};

use crate::error::ActorError;

/// The key of RTPO's tree position in `method_state`.
pub const RTPO_STATE: &str = "rtpo";
/// The key of the PATS scaffold state in `method_state`.
pub const PATS_STATE: &str = "pats";
/// The tag of a checkpoint taken at an ARMOR reference reset.
pub const REFERENCE_RESET_TAG: &str = "reference-reset";

/// The key suffix of one process life: method state objects of a life that crashed before a
/// checkpoint named them are never overwritten by the next life, which names its own (MS-4).
pub fn life_tag() -> String {
    format!("{:x}-{:x}", crate::rollout::unix_ms(), std::process::id())
}

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

/// PATS: where the scaffold state lives in the store (MS-2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PatsPointer {
    /// Store key of the scaffold state.
    pub key: String,
    /// Its bank version.
    pub version: u64,
}

/// A method state object to store: `(key, bytes)`.
pub type StateWrite = (String, Vec<u8>);

/// PATS at run time: the controller of the bank and the bank generators render.
pub struct PatsRuntime {
    /// Reviews and edits the bank.
    pub controller: ScaffoldController,
    /// The bank in force (handed to generations).
    pub bank: Arc<Bank>,
    /// Where the state in force is stored.
    pub pointer: Option<PatsPointer>,
}

impl PatsRuntime {
    /// Reviews one trained batch's groups; answers the review and, when the bank changed, the
    /// bytes and key to store the new state under (MS-2).
    pub fn review(
        &mut self,
        step: u64,
        groups: &[GroupRecord],
        key_of: impl Fn(u64) -> String,
    ) -> Result<(StepReview, Option<StateWrite>), ActorError> {
        let review = self
            .controller
            .observe_step(step, groups)
            .map_err(|e| ActorError::Internal(format!("PATS review at step {step}: {e}")))?;
        if !review.changed() {
            return Ok((review, None));
        }
        let state: &ScaffoldState = self.controller.state();
        let bytes = state
            .to_json_bytes()
            .map_err(|e| ActorError::Internal(format!("PATS state: {e}")))?;
        let version = self.controller.bank().version();
        let key = key_of(version);
        self.bank = Arc::new(self.controller.bank().clone());
        self.pointer = Some(PatsPointer {
            key: key.clone(),
            version,
        });
        Ok((review, Some((key, bytes))))
    }
}
