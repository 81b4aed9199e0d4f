//! The control law: per-type success-rate EMA, bank pressure, edit mode and its budget.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::config::ScaffoldConfig;

/// How a task type's entries may be edited in one review.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Mode {
    /// The type is rarely solved: add skills and mistakes.
    Expand,
    /// The type is partly solved: fix entries that failures contradict.
    Revise,
    /// The type is well solved: shorten, merge, delete.
    Compress,
    /// The bank is full: only deletes and updates.
    ForcedPrune,
}

impl Mode {
    /// The spec's mode: `FORCED_PRUNE` if `pressure ≥ 1`, else `COMPRESS` if
    /// `ema ≥ compress_threshold`, `REVISE` if `ema ≥ revise_threshold`, else `EXPAND`.
    pub fn choose(ema: f64, pressure: f64, cfg: &ScaffoldConfig) -> Mode {
        if pressure >= 1.0 {
            Mode::ForcedPrune
        } else if ema >= cfg.compress_threshold {
            Mode::Compress
        } else if ema >= cfg.revise_threshold {
            Mode::Revise
        } else {
            Mode::Expand
        }
    }

    /// The proposal budget of one review in this mode.
    pub fn budget(self) -> Budget {
        let (skills, general, mistakes, paired_adds) = match self {
            Mode::Expand => (2, 1, 1, false),
            Mode::Revise => (1, 1, 1, false),
            Mode::Compress => (1, 1, 0, true),
            Mode::ForcedPrune => (0, 0, 0, false),
        };
        Budget {
            skills,
            general,
            mistakes,
            paired_adds,
        }
    }

    /// The spec's name, e.g. `FORCED_PRUNE`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Expand => "EXPAND",
            Mode::Revise => "REVISE",
            Mode::Compress => "COMPRESS",
            Mode::ForcedPrune => "FORCED_PRUNE",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one review may add (updates and deletes are not counted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budget {
    /// New skill entries.
    pub skills: usize,
    /// New entries without a task type (general), of either kind; they count toward `skills` or
    /// `mistakes` as well.
    pub general: usize,
    /// New mistake entries.
    pub mistakes: usize,
    /// Every add must pair with an applied update or delete of the same review (`COMPRESS`).
    pub paired_adds: bool,
}

/// One EMA step: `α·obs + (1−α)·prev`.
pub fn ema_update(prev: f64, obs: f64, alpha: f64) -> f64 {
    alpha * obs + (1.0 - alpha) * prev
}

/// Bank pressure: `max(entries / max_entries, words / max_tokens)`; 1 means full.
pub fn pressure(entries: usize, words: usize, cfg: &ScaffoldConfig) -> f64 {
    let by_entries = entries as f64 / cfg.max_entries.max(1) as f64;
    let by_words = words as f64 / cfg.max_tokens.max(1) as f64;
    by_entries.max(by_words)
}
