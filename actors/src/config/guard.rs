//! `[guard]`: collapse detection and automatic rewind (the guard itself is `crate::guard`).

use serde::{Deserialize, Serialize};

use super::key::{at_least, Key, Range, NON_NEGATIVE, UNIT_OPEN_LOW};
use super::ConfigError;

/// `[guard]`: collapse detection and automatic rewind.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct GuardSection {
    /// Watch for collapses at all (off: a non-finite step ends the run, spikes are ignored).
    pub enabled: bool,
    /// Non-finite steps in a row that trigger a rewind.
    pub max_consecutive_skips: u32,
    /// Healthy values in each median window.
    pub window: usize,
    /// Healthy values needed before spikes are judged.
    pub warmup: usize,
    /// Grad-norm spike: this many times the window median (0 disables).
    pub grad_norm_spike_ratio: f64,
    /// Grad norms at or below this are never spikes.
    pub grad_norm_floor: f64,
    /// KL spike: this many times the window median (0 disables).
    pub kl_spike_ratio: f64,
    /// KL values at or below this are never spikes.
    pub kl_floor: f64,
    /// Rewinds allowed before the run gives up (GD-5).
    pub max_rewinds: u32,
    /// The learning rate is multiplied by this at every rewind (1 keeps it).
    pub rewind_lr_factor: f64,
}

impl Default for GuardSection {
    fn default() -> Self {
        Self {
            enabled: true,
            max_consecutive_skips: 3,
            window: 20,
            warmup: 5,
            grad_norm_spike_ratio: 10.0,
            grad_norm_floor: 1.0,
            kl_spike_ratio: 10.0,
            kl_floor: 0.05,
            max_rewinds: 3,
            rewind_lr_factor: 0.5,
        }
    }
}

const MAX_CONSECUTIVE_SKIPS: Key = Key::new(
    "guard.max_consecutive_skips",
    at_least(1),
    "Non-finite steps in a row that trigger a rewind.",
);
const WINDOW: Key = Key::new(
    "guard.window",
    at_least(1),
    "Healthy values in each median window (grad norm, KL).",
);
const GRAD_NORM_SPIKE_RATIO: Key = Key::new(
    "guard.grad_norm_spike_ratio",
    Range::OffOrAbove(1.0),
    "Rewind when the grad norm exceeds this many times its recent median.",
);
const GRAD_NORM_FLOOR: Key = Key::new(
    "guard.grad_norm_floor",
    NON_NEGATIVE,
    "Grad norms at or below this are never spikes.",
);
const KL_SPIKE_RATIO: Key = Key::new(
    "guard.kl_spike_ratio",
    Range::OffOrAbove(1.0),
    "Rewind when the KL to the behaviour policy exceeds this many times its recent median.",
);
const KL_FLOOR: Key = Key::new(
    "guard.kl_floor",
    NON_NEGATIVE,
    "KL values at or below this are never spikes.",
);
const REWIND_LR_FACTOR: Key = Key::new(
    "guard.rewind_lr_factor",
    UNIT_OPEN_LOW,
    "Learning rate multiplier applied at every rewind (1 keeps it).",
);

/// The keys of `[guard]`.
pub const KEYS: &[Key] = &[
    Key::new("guard.enabled", Range::Bool, "Collapse guard: skip non-finite steps and rewind on collapse; off = a non-finite step ends the run."),
    MAX_CONSECUTIVE_SKIPS,
    WINDOW,
    Key::new("guard.warmup", at_least(0), "Healthy values needed before spikes are judged."),
    GRAD_NORM_SPIKE_RATIO,
    GRAD_NORM_FLOOR,
    KL_SPIKE_RATIO,
    KL_FLOOR,
    Key::new("guard.max_rewinds", at_least(0), "Rewinds allowed before the run gives up with an error (keel train then exits 3)."),
    REWIND_LR_FACTOR,
];

impl GuardSection {
    /// Checks every key of `[guard]`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        MAX_CONSECUTIVE_SKIPS.check_int(u64::from(self.max_consecutive_skips))?;
        WINDOW.check_int(self.window as u64)?;
        GRAD_NORM_SPIKE_RATIO.check_real(self.grad_norm_spike_ratio)?;
        KL_SPIKE_RATIO.check_real(self.kl_spike_ratio)?;
        GRAD_NORM_FLOOR.check_real(self.grad_norm_floor)?;
        KL_FLOOR.check_real(self.kl_floor)?;
        REWIND_LR_FACTOR.check_real(self.rewind_lr_factor)
    }

    /// The learning rate after `rewinds` rewinds from `base`: `base · rewind_lr_factor^rewinds`.
    pub fn rewound_lr(&self, base: f64, rewinds: u32) -> f64 {
        base * self
            .rewind_lr_factor
            .powi(rewinds.min(i32::MAX as u32) as i32)
    }
}
