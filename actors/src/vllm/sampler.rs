//! The rollout engine's sampler over a vLLM server: the same submit / step / idle contract as
//! the built-in KV-cache sampler (SA-2), with the server doing the continuous batching.
//!
//! Invariants:
//! - VQ-1: every submitted request is one completion request in flight on its own thread; its
//!   answer comes back on a channel and [`EngineSampler::step`] hands it over. `step` blocks at
//!   most [`STEP_WAIT`] when nothing has arrived, so the engine's loop still drains env answers
//!   and picks up new weights.
//! - VQ-2 (abort and resubmit): an answer aborted by a weight swap (`finish_reason = "abort"`,
//!   VC-2) keeps its partial tokens and log-probs; the request is resubmitted with them appended
//!   to its context, its token budget reduced and a seed of its own (from the request's seed and
//!   the tokens already sampled), so no sampled token is lost or sampled twice.
//!   A request is resubmitted only from `step`, on the engine's thread, so never while a swap
//!   is under way.
//! - VQ-3: a transport or server error fails the step (the server died or refused): the caller's
//!   error, with nothing half-recorded.
//! - VQ-4 (versions): every token's weight version is the one the server reports for it
//!   (VC-1), recorded where it changes in SA-8's `Completion::versions`: a request resubmitted
//!   after a swap continues under the new version at its pause point.

use std::collections::HashMap;
use std::sync::mpsc;
use std::time::Duration;

use keel_learner::hf::{Completion, FinishReason, GenRequest};

use super::client::{EngineOutput, VllmClient};
use crate::error::ActorError;
use crate::seeds::mix_seed;

/// Longest wait of one step for an answer (VQ-1).
pub const STEP_WAIT: Duration = Duration::from_millis(20);

/// A request's id and what its server answered.
type Answer = (usize, Result<EngineOutput, ActorError>);

/// A request in flight and what it sampled so far (VQ-2).
struct Pending {
    request: GenRequest,
    sampled: Completion,
}

/// Completion requests in flight on one vLLM server (VQ-1..3).
pub struct EngineSampler {
    client: VllmClient,
    pending: HashMap<usize, Pending>,
    answers: (mpsc::Sender<Answer>, mpsc::Receiver<Answer>),
    /// Requests resubmitted after an abort (VQ-2).
    resubmitted: u64,
}

impl EngineSampler {
    /// A sampler sending its requests through `client`.
    pub fn new(client: VllmClient) -> Self {
        EngineSampler {
            client,
            pending: HashMap::new(),
            answers: mpsc::channel(),
            resubmitted: 0,
        }
    }

    /// Queues request `id`: it is sent at once.
    pub fn submit(&mut self, id: usize, request: GenRequest) {
        let pending = Pending {
            request,
            sampled: Completion::started(),
        };
        self.pending.insert(id, pending);
        self.send(id);
    }

    /// Sends request `id`'s context so far with its remaining budget.
    fn send(&mut self, id: usize) {
        let Some(p) = self.pending.get(&id) else {
            return;
        };
        let mut prompt = p.request.prompt.clone();
        prompt.extend_from_slice(&p.sampled.tokens);
        let mut params = p.request.params.clone();
        params.max_new_tokens = params.max_new_tokens.saturating_sub(p.sampled.tokens.len());
        // A resubmission draws from a stream of its own: reusing the request's seed would
        // replay the draws of its first tokens.
        let seed = match p.sampled.tokens.len() {
            0 => p.request.seed,
            n => mix_seed(&[p.request.seed, n as u64]),
        };
        let (client, tx) = (self.client.clone(), self.answers.0.clone());
        std::thread::spawn(move || {
            let _ = tx.send((id, client.complete(&prompt, &params, seed)));
        });
    }

    /// Whether nothing is in flight.
    pub fn is_idle(&self) -> bool {
        self.pending.is_empty()
    }

    /// Requests resubmitted after a weight swap aborted them (VQ-2).
    pub fn resubmitted(&self) -> u64 {
        self.resubmitted
    }

    /// The requests that finished since the last step, as `(id, completion)` (VQ-1..3).
    pub fn step(&mut self) -> Result<Vec<(usize, Completion)>, ActorError> {
        let mut arrived = Vec::new();
        if let Ok(first) = self.answers.1.recv_timeout(STEP_WAIT) {
            arrived.push(first);
            arrived.extend(self.answers.1.try_iter());
        }
        let mut done = Vec::new();
        for (id, answer) in arrived {
            let out = answer?;
            let Some(p) = self.pending.get_mut(&id) else {
                continue;
            };
            let stop_token = out.stop_reason.as_u64().is_some()
                || (out.finish == "stop"
                    && out
                        .tokens
                        .last()
                        .is_some_and(|t| p.request.params.stop_token_ids.contains(t)));
            let before = p.sampled.tokens.len();
            for &(start, version) in &out.versions {
                p.sampled.note_version(before + start, version);
            }
            p.sampled.tokens.extend(&out.tokens);
            p.sampled.logprobs.extend(&out.logprobs);
            p.sampled.sampling_logprobs.extend(&out.logprobs);
            let budget_left = p.sampled.tokens.len() < p.request.params.max_new_tokens;
            match out.finish.as_str() {
                "abort" if budget_left => {
                    self.resubmitted += 1;
                    self.send(id);
                    continue;
                }
                "stop" if stop_token => p.sampled.finish = FinishReason::StopToken,
                "stop" => p.sampled.finish = FinishReason::StopString,
                _ => p.sampled.finish = FinishReason::Length,
            }
            if let Some(p) = self.pending.remove(&id) {
                done.push((id, p.sampled));
            }
        }
        Ok(done)
    }
}
