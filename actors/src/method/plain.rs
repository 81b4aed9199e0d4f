//! Methods with no runtime state (GRPO, PPO, Dr. GRPO, GSPO, DAPO, SO-PPO, SO-GRPO): plain
//! groups from the task cursor, nothing in `method_state`, nothing to restore (MR-1). What sets
//! them apart is their learner preset; DAPO's dynamic sampling reaches the generators through
//! the preset ([`super::Sampling::of`]).

use super::MethodRuntime;

/// A method that is its learner preset only.
#[derive(Debug, Clone, Copy, Default)]
pub struct Plain;

impl MethodRuntime for Plain {
    fn name(&self) -> &'static str {
        "plain"
    }
}
