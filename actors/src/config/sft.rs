//! `[sft]`: the supervised warm start on noised oracle demonstrations (and its checkpoints).

use serde::{Deserialize, Serialize};

use super::key::{at_least, ints, Key, UNIT, UNIT_OPEN_LOW};
use super::ConfigError;

/// `[sft]`: the warm start on noised oracle demonstrations.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SftSection {
    /// Optimizer steps (0 skips the warm start).
    pub steps: u64,
    /// Demonstrations per step.
    pub batch_size: usize,
    /// Learning rate.
    pub lr: f64,
    /// Demonstrations generated (from train task seeds).
    pub demos: usize,
    /// Probability that a demonstrated turn is replaced by a plausible mistake.
    pub noise: f64,
    /// Commit an SFT checkpoint every this many steps (0: only when stopped), SF-1.
    pub checkpoint_every: u64,
}

impl Default for SftSection {
    fn default() -> Self {
        Self {
            steps: 300,
            batch_size: 32,
            lr: 3e-3,
            demos: 2000,
            noise: 0.3,
            checkpoint_every: 0,
        }
    }
}

const STEPS: Key = Key::new(
    "sft.steps",
    at_least(0),
    "SFT warm-start optimizer steps (0 skips the warm start).",
);
const BATCH_SIZE: Key = Key::new(
    "sft.batch_size",
    ints(1, 1 << 16),
    "Demonstrations per SFT step.",
);
const LR: Key = Key::new("sft.lr", UNIT_OPEN_LOW, "SFT learning rate.");
const DEMOS: Key = Key::with_also(
    "sft.demos",
    ints(1, 10_000_000),
    "when sft.steps > 0",
    "Demonstrations generated from train task seeds.",
);
const NOISE: Key = Key::new(
    "sft.noise",
    UNIT,
    "Probability that a demonstrated turn is replaced by a plausible mistake.",
);
const CHECKPOINT_EVERY: Key = Key::new("sft.checkpoint_every", at_least(0), "Commit an SFT checkpoint (tag sft-partial) every this many SFT steps, so a killed run resumes SFT where it was; 0: only when stopped (SIGTERM during SFT always commits one). A resumed SFT ends bit-identical to an uninterrupted one.");

/// The keys of `[sft]`.
pub const KEYS: &[Key] = &[STEPS, BATCH_SIZE, LR, DEMOS, NOISE, CHECKPOINT_EVERY];

impl SftSection {
    /// Checks every key of `[sft]`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        BATCH_SIZE.check_int(self.batch_size as u64)?;
        if self.steps > 0 || self.demos != 0 {
            DEMOS.check_int(self.demos as u64)?;
        }
        LR.check_real(self.lr)?;
        NOISE.check_real(self.noise)
    }
}
