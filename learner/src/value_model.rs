//! The separate critic ([`CriticModel::Separate`](crate::algo::value::CriticModel)): a value
//! model of its own — a decoder with the `score` head and no LM head — trained by its own AdamW,
//! as SAO (spec §3) and verl's critic worker have it. It is the policy's architecture
//! initialised from the policy's weights, or a folder given by the job (`model.critic_path`).
//!
//! Invariants:
//! - VM-1 (init from the policy): [`ValueModel::from_policy`] copies every trunk tensor of the
//!   policy by name and starts `score` at zero (HM-3), so at creation it predicts 0 everywhere.
//! - VM-2 (vocabulary): a critic reads the policy's token ids, so its `vocab_size` is at least
//!   the policy's; a critic without a value head, or with an LM head, is refused.
//! - VM-3 (state): a checkpoint holds the critic's weights as `critic.safetensors` (HF names,
//!   F32) and its optimizer as `critic_optimizer` files (one, or one shard per learner rank,
//!   OF-1); [`ValueModel::restored`] builds a new critic from them and checks everything before
//!   returning, so a failed restore changes nothing.

use serde_json::Value;
use tch::Tensor;

use crate::error::LearnerError;
use crate::hf::{HfModel, LoadOptions};
use crate::model::ModelSpec;
use crate::optimizer::{AdamW, AdamWConfig};

/// The critic's weights in a learner checkpoint.
pub(crate) const CRITIC_FILE: &str = "critic.safetensors";

/// A value model and its optimizer.
pub(crate) struct ValueModel {
    pub(crate) model: HfModel,
    pub(crate) opt: AdamW,
}

impl ValueModel {
    /// `model` as the critic of `policy` (VM-2), with a fresh AdamW.
    pub(crate) fn new(
        model: HfModel,
        policy: &HfModel,
        opt: AdamWConfig,
    ) -> Result<Self, LearnerError> {
        let o = model.options();
        if !o.value_head || o.lm_head {
            return Err(LearnerError::config(
                "model.critic_path",
                "the critic must be loaded with a value head and without an LM head",
            ));
        }
        let (mine, theirs) = (model.config().vocab_size, policy.config().vocab_size);
        if mine < theirs {
            return Err(LearnerError::config(
                "model.critic_path",
                format!("the critic's vocab_size {mine} is smaller than the policy's {theirs}: it cannot read every token the policy emits"),
            ));
        }
        let opt = AdamW::new(model.var_store(), opt);
        Ok(ValueModel { model, opt })
    }

    /// A critic of the policy's architecture holding its trunk weights (VM-1).
    pub(crate) fn from_policy(policy: &HfModel, opt: AdamWConfig) -> Result<Self, LearnerError> {
        let mut model = Self::blank_of(policy)?;
        let trunk: std::collections::HashMap<String, Tensor> =
            policy.named_parameters().into_iter().collect();
        let values = model
            .named_parameters()
            .into_iter()
            .map(|(name, t)| match trunk.get(&name) {
                Some(p) if !name.starts_with("score.") => Ok(p.detach()),
                _ if name.starts_with("score.") => Ok(t.zeros_like()),
                _ => Err(LearnerError::mismatch(&name, "missing from the policy")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        model.commit_weights(&values)?;
        Self::new(model, policy, opt)
    }

    /// A zero critic of `like`'s architecture, placement and kind.
    fn blank_of(like: &HfModel) -> Result<HfModel, LearnerError> {
        let o = like.options();
        Ok(HfModel::zeros(
            like.config().clone(),
            LoadOptions::critic(o.device, o.kind),
        )?)
    }

    /// What identifies the critic's architecture (MD-4).
    pub(crate) fn identity(&self) -> Value {
        ModelSpec::identity(&self.model)
    }

    /// A critic of `like`'s architecture (the running critic's, or the policy's when none
    /// exists yet) restored from `weights`, whose identity must be `recorded`, and whose new
    /// optimizer `optimizer` shards and restores (VM-3). Nothing outside the new value is
    /// touched.
    pub(crate) fn restored(
        like: &HfModel,
        policy: &HfModel,
        recorded: &Value,
        weights: &[u8],
        opt: AdamWConfig,
        optimizer: impl FnOnce(&mut AdamW) -> Result<(), LearnerError>,
    ) -> Result<Self, LearnerError> {
        let mut critic = Self::new(Self::blank_of(like)?, policy, opt)?;
        let running = critic.identity();
        if &running != recorded {
            return Err(LearnerError::mismatch(
                "learner.json",
                format!("the checkpoint's critic {recorded} differs from the running {running}"),
            ));
        }
        critic.model.load_safetensors(weights)?;
        optimizer(&mut critic.opt)?;
        Ok(critic)
    }
}
