//! A policy model acting in an environment outside a training job: `keel env eval --policy CKPT`
//! and the per-env SFT warm-start checks.
//!
//! Invariants:
//! - MP-1 The token sequence is kept exactly as sampled and extended with observations rendered
//!   by the chat codec, as in training (RO-1): history is never re-tokenised.
//! - MP-2 Decoding is greedy, so an evaluation is a pure function of (weights, env, seeds).
//! - MP-3 An episode that would outgrow the model's context gets an empty (invalid) action,
//!   so it runs out its turns instead of failing.
//! - MP-4 With agent models (Dr. MAS), each turn is taken by the model of the agent the env says
//!   acts next; agents no agent model lists use the main model, as in training (LA-4).

use keel_envs::evaluate::Transcript;
use keel_envs::Env;
use keel_learner::hf::{ChatCodec, GenRequest, HfModel, Sampler, SamplingParams};
use keel_learner::policy_from_checkpoint;

use crate::error::ActorError;

/// A greedy policy over an [`HfModel`] (and, for Dr. MAS checkpoints, the agent models
/// that serve some agents' turns, MP-4), decoded by the KV-cache sampler.
pub struct ModelPolicy {
    model: HfModel,
    agent_models: Vec<(Vec<u32>, HfModel)>,
    sampler: Sampler,
    codec: ChatCodec,
    max_turn_tokens: usize,
    tokens: Vec<u32>,
}

/// A model from a checkpoint's `learner.json` (architecture MD-4, agents) and weights.
fn load_model(
    learner_json: &[u8],
    weights: &[u8],
) -> Result<(Option<Vec<u32>>, HfModel), ActorError> {
    let state: serde_json::Value = serde_json::from_slice(learner_json)
        .map_err(|e| ActorError::Resume(format!("learner.json is not JSON: {e}")))?;
    let agents: Option<Vec<u32>> =
        serde_json::from_value(state.get("agents").cloned().unwrap_or_default()).unwrap_or(None);
    Ok((agents, policy_from_checkpoint(learner_json, weights)?))
}

impl ModelPolicy {
    /// Wraps a model whose tokens `codec` renders (its checkpoint's tokenizer).
    pub fn new(
        model: HfModel,
        codec: ChatCodec,
        max_turn_tokens: usize,
    ) -> Result<Self, ActorError> {
        if codec.vocab_size() > model.config().vocab_size {
            return Err(ActorError::Resume(format!(
                "the tokenizer has {} token ids but the model only {}",
                codec.vocab_size(),
                model.config().vocab_size
            )));
        }
        let sampler = Sampler::new(&model, 1, model.config().max_position_embeddings)?;
        Ok(ModelPolicy {
            model,
            agent_models: Vec::new(),
            sampler,
            codec,
            max_turn_tokens,
            tokens: Vec::new(),
        })
    }

    /// Loads `model.safetensors` with the shape recorded in a checkpoint's `learner.json`,
    /// rendered by the codec of the checkpoint's tokenizer files.
    pub fn from_checkpoint_files(
        learner_json: &[u8],
        weights: &[u8],
        codec: ChatCodec,
        max_turn_tokens: usize,
    ) -> Result<Self, ActorError> {
        let (_, model) = load_model(learner_json, weights)?;
        Self::new(model, codec, max_turn_tokens)
    }

    /// Adds a Dr. MAS agent model from its checkpoint files (`agent-model-<k>.learner.json`,
    /// `agent-model-<k>.model.safetensors`): it acts for the agents its `learner.json` lists.
    pub fn with_agent_model(
        mut self,
        learner_json: &[u8],
        weights: &[u8],
    ) -> Result<Self, ActorError> {
        let (agents, model) = load_model(learner_json, weights)?;
        let agents = agents.ok_or_else(|| {
            ActorError::Resume("an agent model's learner.json lists no agents".into())
        })?;
        if model.saved_config() != self.model.saved_config() {
            return Err(ActorError::Resume(
                "an agent model's shape differs from the main model's".into(),
            ));
        }
        self.agent_models.push((agents, model));
        Ok(self)
    }

    /// The next action for the episode so far (MP-1..MP-3).
    pub fn act(&mut self, env: &dyn Env, transcript: &Transcript) -> Result<String, ActorError> {
        match transcript.turns.last() {
            None => self.tokens = self.codec.prompt(&transcript.prompt)?,
            Some((_, obs)) => self.tokens.extend(self.codec.observation(obs)?),
        }
        let start = self.tokens.len();
        if start + self.max_turn_tokens + 8 > self.model.config().max_position_embeddings {
            return Ok(String::new());
        }
        let agent = env.agent_id();
        let model = self
            .agent_models
            .iter()
            .find(|(agents, _)| agents.contains(&agent))
            .map_or(&self.model, |(_, m)| m);
        let request = GenRequest {
            prompt: self.tokens.clone(),
            params: SamplingParams {
                temperature: 0.0,
                max_new_tokens: self.max_turn_tokens,
                stop_token_ids: vec![self.codec.end_of_turn()],
                ..SamplingParams::default()
            },
            seed: 0,
        };
        let completion = self.sampler.generate(model, vec![request])?;
        if let Some(c) = completion.first() {
            self.tokens.extend(&c.tokens);
        }
        Ok(self.codec.action_text(&self.tokens[start..])?)
    }
}
