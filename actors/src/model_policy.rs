//! A policy model acting in an environment outside a training job: `keel env eval --policy CKPT`
//! and the per-env SFT warm-start checks.
//!
//! Invariants:
//! - MP-1 The token sequence is kept exactly as sampled and extended with rendered observations,
//!   in the layout of `keel_envs::demo` (RO-1): history is never re-tokenised.
//! - MP-2 Decoding is greedy, so an evaluation is a pure function of (weights, env, seeds).
//! - MP-3 An episode that would outgrow the model's context gets an empty (invalid) action,
//!   so it runs out its turns instead of failing.

use keel_envs::demo::{render_observation, render_prompt};
use keel_envs::evaluate::Transcript;
use keel_envs::{Env, Tokenizer};
use keel_learner::sampler::greedy_next;
use keel_learner::{ModelConfig, PolicyModel};

use crate::error::ActorError;

/// A greedy policy over a [`PolicyModel`].
pub struct ModelPolicy {
    model: PolicyModel,
    tokenizer: Tokenizer,
    max_turn_tokens: usize,
    tokens: Vec<u32>,
}

impl ModelPolicy {
    /// Wraps a model whose vocabulary is `tokenizer`'s.
    pub fn new(
        model: PolicyModel,
        tokenizer: Tokenizer,
        max_turn_tokens: usize,
    ) -> Result<Self, ActorError> {
        if model.config().vocab_size != tokenizer.vocab_size() {
            return Err(ActorError::Resume(format!(
                "the model has {} token ids but the env's tokenizer {}: it was trained on another env",
                model.config().vocab_size,
                tokenizer.vocab_size()
            )));
        }
        Ok(ModelPolicy {
            model,
            tokenizer,
            max_turn_tokens,
            tokens: Vec::new(),
        })
    }

    /// Loads `model.safetensors` with the shape recorded in a checkpoint's `learner.json`.
    pub fn from_checkpoint_files(
        learner_json: &[u8],
        weights: &[u8],
        tokenizer: Tokenizer,
        max_turn_tokens: usize,
    ) -> Result<Self, ActorError> {
        let state: serde_json::Value = serde_json::from_slice(learner_json)
            .map_err(|e| ActorError::Resume(format!("learner.json is not JSON: {e}")))?;
        let cfg: ModelConfig =
            serde_json::from_value(state.get("model").cloned().unwrap_or_default())
                .map_err(|e| ActorError::Resume(format!("learner.json has no model shape: {e}")))?;
        let mut model = PolicyModel::new(&cfg, tch::Device::Cpu, 0)?;
        model.load_safetensors(weights)?;
        Self::new(model, tokenizer, max_turn_tokens)
    }

    /// The next action for the episode so far (MP-1..MP-3).
    pub fn act(&mut self, _env: &dyn Env, transcript: &Transcript) -> Result<String, ActorError> {
        match transcript.turns.last() {
            None => self.tokens = render_prompt(&self.tokenizer, &transcript.prompt)?,
            Some((_, obs)) => self
                .tokens
                .extend(render_observation(&self.tokenizer, obs)?),
        }
        let sp = self.tokenizer.special();
        let banned = [sp.pad, sp.bos, sp.agent];
        let start = self.tokens.len();
        if start + self.max_turn_tokens + 8 > self.model.config().context_len {
            return Ok(String::new());
        }
        for _ in 0..self.max_turn_tokens {
            let next = greedy_next(&self.model, &[self.tokens.as_slice()], &banned)?;
            let token = next.first().map_or(sp.eot, |s| s.token);
            self.tokens.push(token);
            if token == sp.eot {
                break;
            }
        }
        Ok(self.tokenizer.decode_action(&self.tokens[start..]))
    }
}
