//! `[[agent_models]]`: Dr. MAS — separate models for some agents, each with its own optimizer
//! and learner overrides.
//!
//! Invariants:
//! - CA-1: every agent id is below 64 and served by at most one `[[agent_models]]` entry;
//!   agents no entry lists are served by the main model (index 0).

use serde::{Deserialize, Serialize};

use super::key::{Key, Range};
use super::{ConfigError, TrainConfig};

/// Agent ids are below this (CA-1).
pub const MAX_AGENTS: usize = 64;

/// `[[agent_models]]`: a separate model for some agents, with its own optimizer.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct AgentModelSection {
    /// Agent ids whose turns this model samples and trains on.
    pub agents: Vec<u32>,
    /// Its learning rate (default: `learner.lr`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
    /// Its ratio clip below 1 (default: the preset's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clip_low: Option<f64>,
    /// Its ratio clip above 1 (default: the preset's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clip_high: Option<f64>,
    /// Its entropy bonus (default: the preset's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entropy_coef: Option<f64>,
}

/// The key of `[[agent_models]]`.
pub const KEYS: &[Key] = &[Key::new(
    "agent_models",
    Range::Text("array of tables"),
    "Dr. MAS: [[agent_models]] agents = [1], lr = ..., clip_low/clip_high/entropy_coef = ...: a separate model with its own optimizer for those agents (others use the main model).",
)];

/// Checks every `[[agent_models]]` entry (CA-1) and its learner overrides.
pub fn validate(cfg: &TrainConfig) -> Result<(), ConfigError> {
    let mut seen = std::collections::BTreeSet::new();
    for (i, m) in cfg.agent_models.iter().enumerate() {
        let key = format!("agent_models[{i}].agents");
        let bad = |reason: String| ConfigError::OutOfRange {
            key: key.clone(),
            reason,
        };
        if m.agents.is_empty() {
            return Err(bad("must list at least one agent id".into()));
        }
        for a in &m.agents {
            if *a as usize >= MAX_AGENTS || !seen.insert(*a) {
                return Err(bad(format!(
                    "agent {a} is listed twice or is not below {MAX_AGENTS}"
                )));
            }
        }
        cfg.agent_learner_config(m)
            .validate()
            .map_err(|e| ConfigError::OutOfRange {
                key: format!("agent_models[{i}]"),
                reason: e.to_string(),
            })?;
    }
    if !cfg.agent_models.is_empty() && cfg.learner.algo != keel_learner::Algo::DrMas {
        return Err(ConfigError::OutOfRange {
            key: "agent_models".into(),
            reason: format!(
                "separate agent models need learner.algo = \"dr_mas\", got {:?}",
                cfg.learner.algo.name()
            ),
        });
    }
    Ok(())
}

impl TrainConfig {
    /// The learner settings of a Dr. MAS agent model: `[learner]` with its overrides.
    pub fn agent_learner_config(&self, m: &AgentModelSection) -> keel_learner::LearnerConfig {
        let mut cfg = self.learner_config();
        if let Some(lr) = m.lr {
            cfg.lr = lr;
        }
        if m.clip_low.is_some() {
            cfg.clip_low = m.clip_low;
        }
        if m.clip_high.is_some() {
            cfg.clip_high = m.clip_high;
        }
        if m.entropy_coef.is_some() {
            cfg.entropy_coef = m.entropy_coef;
        }
        cfg
    }

    /// `agent_model[a]` = index of the model serving agent `a` (0 = the main model, CA-1).
    pub fn agent_model_map(&self) -> Vec<usize> {
        let mut map = vec![0usize; MAX_AGENTS];
        for (k, m) in self.agent_models.iter().enumerate() {
            for &a in &m.agents {
                if let Some(slot) = map.get_mut(a as usize) {
                    *slot = k + 1;
                }
            }
        }
        map
    }
}
