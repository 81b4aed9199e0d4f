//! The sampler a rollout queues its turns in: the built-in KV-cache sampler, or a vLLM server
//! (`rollout.backend`). Both keep SA-2's contract: `submit` queues a turn, `step` hands back the
//! turns that finished, `is_idle` says nothing is queued or running.

use keel_learner::hf::{Completion, GenRequest, HfModel, Sampler};

use crate::error::ActorError;
use crate::vllm::EngineSampler;

/// One model's sampler (module doc).
pub(super) enum TurnSampler {
    /// The built-in KV-cache sampler, stepped with the model in force.
    Keel(Sampler),
    /// Requests in flight on a vLLM server.
    Vllm(EngineSampler),
}

impl TurnSampler {
    /// Queues turn `id`.
    pub(super) fn submit(
        &mut self,
        model: &HfModel,
        id: usize,
        request: GenRequest,
    ) -> Result<(), ActorError> {
        match self {
            TurnSampler::Keel(s) => s.submit(model, id, request)?,
            TurnSampler::Vllm(s) => s.submit(id, request),
        }
        Ok(())
    }

    /// Whether nothing is queued or running.
    pub(super) fn is_idle(&self) -> bool {
        match self {
            TurnSampler::Keel(s) => s.is_idle(),
            TurnSampler::Vllm(s) => s.is_idle(),
        }
    }

    /// One decode step (keel) or the answers that arrived (vLLM).
    pub(super) fn step(&mut self, model: &HfModel) -> Result<Vec<(usize, Completion)>, ActorError> {
        match self {
            TurnSampler::Keel(s) => Ok(s.step(model)?),
            TurnSampler::Vllm(s) => s.step(),
        }
    }

    /// The tokens sampled from now on come from weights version `version` (SA-8). A vLLM
    /// server reports each token's version itself (VQ-4).
    pub(super) fn mark_version(&mut self, version: u64) {
        if let TurnSampler::Keel(s) = self {
            s.mark_version(version);
        }
    }

    /// `(decode steps, busy decode steps, requests resubmitted after an abort)`.
    pub(super) fn counters(&self) -> (u64, u64, u64) {
        match self {
            TurnSampler::Keel(s) => (s.stats().decode_steps, s.stats().busy_decode_steps, 0),
            TurnSampler::Vllm(s) => (0, 0, s.resubmitted()),
        }
    }
}
