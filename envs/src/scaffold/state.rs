//! [`ScaffoldState`]: what a checkpoint keeps of PATS, as versioned JSON.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::bank::Bank;
use super::error::ScaffoldError;
use super::mode::Mode;

/// The `format` string of [`ScaffoldState`] JSON.
pub const SCAFFOLD_FORMAT: &str = "keel.scaffold.v1";

/// One mode decision of a review.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModeDecision {
    /// The RL step.
    pub step: u64,
    /// The task type reviewed.
    pub task_type: String,
    /// The mode chosen.
    pub mode: Mode,
    /// The type's EMA it was chosen from.
    pub ema: f64,
    /// The bank pressure it was chosen from.
    pub pressure: f64,
}

/// The persistent PATS state: bank, per-type EMAs, last step, card counter, recent decisions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScaffoldState {
    format: String,
    pub(crate) bank: Bank,
    pub(crate) ema: BTreeMap<String, f64>,
    pub(crate) step: Option<u64>,
    pub(crate) next_card_id: u64,
    pub(crate) history: Vec<ModeDecision>,
}

impl Default for ScaffoldState {
    fn default() -> Self {
        ScaffoldState::new()
    }
}

fn invalid(reason: impl Into<String>) -> ScaffoldError {
    ScaffoldError::InvalidState {
        reason: reason.into(),
    }
}

fn unit(x: f64) -> bool {
    (0.0..=1.0).contains(&x)
}

impl ScaffoldState {
    /// The state before the first step: empty bank, no EMAs.
    pub fn new() -> ScaffoldState {
        ScaffoldState {
            format: SCAFFOLD_FORMAT.to_string(),
            bank: Bank::new(),
            ema: BTreeMap::new(),
            step: None,
            next_card_id: 0,
            history: Vec::new(),
        }
    }

    /// The bank.
    pub fn bank(&self) -> &Bank {
        &self.bank
    }

    /// The success-rate EMA of `task_type` (0 for a type never observed).
    pub fn ema(&self, task_type: &str) -> f64 {
        self.ema.get(task_type).copied().unwrap_or(0.0)
    }

    /// Every observed type's EMA.
    pub fn emas(&self) -> &BTreeMap<String, f64> {
        &self.ema
    }

    /// The last step observed (`None` before the first).
    pub fn step(&self) -> Option<u64> {
        self.step
    }

    /// The most recent mode decisions, oldest first.
    pub fn history(&self) -> &[ModeDecision] {
        &self.history
    }

    /// The JSON bytes (format [`SCAFFOLD_FORMAT`]).
    pub fn to_json_bytes(&self) -> Result<Vec<u8>, ScaffoldError> {
        serde_json::to_vec_pretty(self).map_err(|e| invalid(format!("cannot serialise: {e}")))
    }

    /// Parses and validates JSON written by [`ScaffoldState::to_json_bytes`]; the error names
    /// what is wrong (never panics). The bank, ids and steps come back exactly; an EMA or a
    /// pressure may come back one ulp off (serde_json's default float parser).
    pub fn from_json_bytes(bytes: &[u8]) -> Result<ScaffoldState, ScaffoldError> {
        let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| {
            invalid(format!(
                "not JSON ({e}); expected a {SCAFFOLD_FORMAT} object"
            ))
        })?;
        match value.get("format").map(|f| f.as_str()) {
            Some(Some(SCAFFOLD_FORMAT)) => {}
            Some(Some(other)) => {
                return Err(invalid(format!(
                    "format = {:?}, expected {SCAFFOLD_FORMAT:?}",
                    crate::error::quote(other)
                )))
            }
            _ => {
                return Err(invalid(format!(
                    "no `format` string; expected a {SCAFFOLD_FORMAT} object"
                )))
            }
        }
        let state: ScaffoldState =
            serde_json::from_value(value).map_err(|e| invalid(e.to_string()))?;
        state.validate()?;
        Ok(state)
    }

    /// The invariants a loaded state must hold.
    pub(crate) fn validate(&self) -> Result<(), ScaffoldError> {
        self.bank.validate().map_err(invalid)?;
        for (t, &v) in &self.ema {
            if t.is_empty() {
                return Err(invalid("ema: empty task type"));
            }
            if !unit(v) {
                return Err(invalid(format!(
                    "ema[{t:?}] = {v}, expected a number in [0, 1]"
                )));
            }
        }
        if let Some(e) = self
            .bank
            .entries
            .iter()
            .find(|e| e.cites.iter().any(|&c| c >= self.next_card_id))
        {
            return Err(invalid(format!(
                "bank.entries: entry {} cites a card id not below next_card_id = {}",
                e.id, self.next_card_id
            )));
        }
        let mut prev = 0;
        for (i, d) in self.history.iter().enumerate() {
            if self.step.is_none_or(|s| d.step > s) || d.step < prev {
                return Err(invalid(format!(
                    "history[{i}].step = {} is out of order or after step {:?}",
                    d.step, self.step
                )));
            }
            prev = d.step;
            if !(unit(d.ema) && d.pressure.is_finite() && d.pressure >= 0.0) {
                return Err(invalid(format!(
                    "history[{i}] has ema {} and pressure {}; expected ema in [0, 1] and a finite pressure >= 0",
                    d.ema, d.pressure
                )));
            }
        }
        Ok(())
    }
}
