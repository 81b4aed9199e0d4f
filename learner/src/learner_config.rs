//! The learner's configuration: which objective, and its hyper-parameters with their ranges.
//!
//! Invariants:
//! - LC-1: `validate` accepts exactly the documented ranges; a rejection names the key as
//!   `learner.<field>` and shows the offending value ("learner.lr must be in (0, 1], got 5").
//! - LC-2: defaults are verl's where verl has one (§1.1, §1.3): clip 0.2/0.2, γ = λ = 1,
//!   value clip 0.5, entropy coefficient 0, one epoch.

use crate::error::LearnerError;

/// The RL objective.
#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Algo {
    /// PPO with a value head: GAE advantages, clipped value loss.
    Ppo,
    /// GRPO: group-normalised outcome advantages, no critic.
    Grpo,
}

/// Hyper-parameters of `Learner::train_step`.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct LearnerConfig {
    /// The objective. Range: `ppo` needs `model.value_head = true`.
    pub algo: Algo,
    /// AdamW learning rate, in (0, 1].
    pub lr: f64,
    /// AdamW decoupled weight decay, in [0, 1] (matrices and embeddings only).
    pub weight_decay: f64,
    /// Global gradient-norm clip, > 0.
    pub max_grad_norm: f64,
    /// PPO ratio clip below 1, in (0, 1).
    pub clip_low: f64,
    /// PPO ratio clip above 1, in (0, 1) (0.28 = DAPO clip-higher).
    pub clip_high: f64,
    /// GAE discount, in [0, 1] (PPO only).
    pub gamma: f64,
    /// GAE λ, in [0, 1] (PPO only).
    pub lam: f64,
    /// Weight of the value loss, ≥ 0 (PPO only).
    pub value_coef: f64,
    /// Value clip range around the old values, > 0 (PPO only).
    pub value_clip: f64,
    /// Weight of the entropy bonus, ≥ 0.
    pub entropy_coef: f64,
    /// Passes over each batch, ≥ 1.
    pub epochs: usize,
    /// Optimizer steps per pass (trajectories split evenly), ≥ 1.
    pub minibatches: usize,
    /// GRPO: divide by the group's std (GRPO) or not (Dr. GRPO).
    pub grpo_normalize_std: bool,
}

impl Default for LearnerConfig {
    fn default() -> Self {
        LearnerConfig {
            algo: Algo::Grpo,
            lr: 1e-4,
            weight_decay: 0.0,
            max_grad_norm: 1.0,
            clip_low: 0.2,
            clip_high: 0.2,
            gamma: 1.0,
            lam: 1.0,
            value_coef: 0.5,
            value_clip: 0.5,
            entropy_coef: 0.0,
            epochs: 1,
            minibatches: 1,
            grpo_normalize_std: true,
        }
    }
}

/// An interval check: `lo_open`/`hi_open` say whether each end is excluded.
fn in_range(key: &str, v: f64, lo: f64, lo_open: bool, hi: f64, hi_open: bool) -> Result<(), LearnerError> {
    let above = if lo_open { v > lo } else { v >= lo };
    let below = if hi_open { v < hi } else { v <= hi };
    if above && below {
        return Ok(());
    }
    let (l, r) = (if lo_open { "(" } else { "[" }, if hi_open { ")" } else { "]" });
    let hi_text = if hi.is_infinite() { "inf".to_string() } else { hi.to_string() };
    Err(LearnerError::config(key, format!("must be in {l}{lo}, {hi_text}{r}, got {v}")))
}

impl LearnerConfig {
    /// Checks every field against its documented range (LC-1).
    pub fn validate(&self) -> Result<(), LearnerError> {
        let inf = f64::INFINITY;
        in_range("learner.lr", self.lr, 0.0, true, 1.0, false)?;
        in_range("learner.weight_decay", self.weight_decay, 0.0, false, 1.0, false)?;
        in_range("learner.max_grad_norm", self.max_grad_norm, 0.0, true, inf, true)?;
        in_range("learner.clip_low", self.clip_low, 0.0, true, 1.0, true)?;
        in_range("learner.clip_high", self.clip_high, 0.0, true, 1.0, true)?;
        in_range("learner.gamma", self.gamma, 0.0, false, 1.0, false)?;
        in_range("learner.lam", self.lam, 0.0, false, 1.0, false)?;
        in_range("learner.value_coef", self.value_coef, 0.0, false, inf, true)?;
        in_range("learner.value_clip", self.value_clip, 0.0, true, inf, true)?;
        in_range("learner.entropy_coef", self.entropy_coef, 0.0, false, inf, true)?;
        if self.epochs == 0 {
            return Err(LearnerError::config("learner.epochs", "must be >= 1, got 0"));
        }
        if self.minibatches == 0 {
            return Err(LearnerError::config("learner.minibatches", "must be >= 1, got 0"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lc1_default_is_valid_and_messages_name_the_key() {
        LearnerConfig::default().validate().expect("defaults are valid");
        let c = LearnerConfig { lr: 5.0, ..LearnerConfig::default() };
        assert_eq!(c.validate().expect_err("lr").to_string(), "learner.lr must be in (0, 1], got 5");
        let c = LearnerConfig { clip_high: 1.0, ..LearnerConfig::default() };
        assert_eq!(c.validate().expect_err("clip").to_string(), "learner.clip_high must be in (0, 1), got 1");
        let c = LearnerConfig { max_grad_norm: f64::NAN, ..LearnerConfig::default() };
        assert_eq!(c.validate().expect_err("nan").to_string(), "learner.max_grad_norm must be in (0, inf), got NaN");
        let c = LearnerConfig { epochs: 0, ..LearnerConfig::default() };
        assert_eq!(c.validate().expect_err("epochs").to_string(), "learner.epochs must be >= 1, got 0");
    }

    #[test]
    fn algo_serialises_snake_case() {
        assert_eq!(serde_json::to_string(&Algo::Grpo).expect("json"), "\"grpo\"");
        assert_eq!(serde_json::from_str::<Algo>("\"ppo\"").expect("json"), Algo::Ppo);
    }
}
