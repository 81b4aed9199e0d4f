//! `[faults]`: deliberate faults injected into a real run — a **testing aid** for the collapse
//! guard, never for production configs; every key defaults to "off" (the injection itself is
//! `crate::faults`).

use serde::{Deserialize, Serialize};

use super::key::{at_least, Key, Range, UNIT_OPEN_LOW};
use super::ConfigError;

/// `[faults]`: testing aid; all off by default.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FaultsSection {
    /// Poison the update that would produce this policy version with NaN log-probs (0 = off).
    pub nan_loss_at_step: u64,
    /// How many attempts at that update are poisoned in a row.
    pub nan_loss_count: u32,
    /// Which model's update is poisoned: 0 = the main model, k = the k-th `[[agent_models]]`
    /// (Dr. MAS).
    pub nan_loss_model: usize,
    /// Before the update that would produce this policy version, set the learning rate to
    /// `lr_blowup_to` (0 = off).
    pub lr_blowup_at_step: u64,
    /// The blown-up learning rate.
    pub lr_blowup_to: f64,
    /// Panic in the learner before the update that would produce this policy version
    /// (0 = off): stands for a bug in the loss code (LA-6).
    pub learner_panic_at_step: u64,
    /// Generators keep their old tensors when they should load a newer policy version (a
    /// reload that did not happen): the provenance probe must refuse them (PV-2).
    pub skip_weight_reload: bool,
    /// vLLM: the engine keeps its prefix cache across a weight swap: the engine provenance
    /// check must refuse it (VE-2).
    pub skip_prefix_cache_reset: bool,
}

impl Default for FaultsSection {
    fn default() -> Self {
        Self {
            nan_loss_at_step: 0,
            nan_loss_count: 1,
            nan_loss_model: 0,
            lr_blowup_at_step: 0,
            lr_blowup_to: 1.0,
            learner_panic_at_step: 0,
            skip_weight_reload: false,
            skip_prefix_cache_reset: false,
        }
    }
}

const NAN_LOSS_COUNT: Key = Key::new(
    "faults.nan_loss_count",
    at_least(1),
    "TESTING AID: attempts at that update poisoned in a row.",
);
const NAN_LOSS_MODEL: Key = Key::with_also("faults.nan_loss_model", at_least(0), "at most the number of [[agent_models]]", "TESTING AID: the model whose update is poisoned: 0 = the main model, k = the k-th [[agent_models]] (Dr. MAS).");
const LR_BLOWUP_TO: Key = Key::new(
    "faults.lr_blowup_to",
    UNIT_OPEN_LOW,
    "TESTING AID: the blown-up learning rate.",
);

/// The keys of `[faults]`.
pub const KEYS: &[Key] = &[
    Key::new("faults.nan_loss_at_step", at_least(0), "TESTING AID (0 = off): poison the update producing this policy version with NaN log-probs."),
    NAN_LOSS_COUNT,
    NAN_LOSS_MODEL,
    Key::new("faults.lr_blowup_at_step", at_least(0), "TESTING AID (0 = off): before the update producing this version, set the learning rate to faults.lr_blowup_to."),
    LR_BLOWUP_TO,
    Key::new("faults.learner_panic_at_step", at_least(0), "TESTING AID (0 = off): panic in the learner before the update producing this policy version (the run must end naming it)."),
    Key::new("faults.skip_weight_reload", Range::Bool, "TESTING AID: generators keep their old tensors (with rollout.backend = vllm: the engine keeps its old weights) instead of loading a newer policy version; the weights provenance probe must refuse to sample (the run ends naming the version)."),
    Key::new("faults.skip_prefix_cache_reset", Range::Bool, "TESTING AID: with rollout.backend = vllm, the engine keeps its prefix cache across weight swaps; the engine's provenance check must refuse to sample (the run ends naming the version)."),
];

impl FaultsSection {
    /// Checks every key of `[faults]`; `agent_models` is how many `[[agent_models]]` there are.
    pub fn validate(&self, agent_models: usize) -> Result<(), ConfigError> {
        NAN_LOSS_COUNT.check_int(u64::from(self.nan_loss_count))?;
        if self.nan_loss_model > agent_models {
            return Err(NAN_LOSS_MODEL.error(format!(
                "must be at most the number of [[agent_models]] ({agent_models}), got {}",
                self.nan_loss_model
            )));
        }
        LR_BLOWUP_TO.check_real(self.lr_blowup_to)
    }

    /// True when no fault is configured.
    pub fn is_off(&self) -> bool {
        self.nan_loss_at_step == 0 && self.lr_blowup_at_step == 0 && self.learner_panic_at_step == 0
    }
}
