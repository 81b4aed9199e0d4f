//! The generator's engine: batched generation with a preallocated KV cache and continuous
//! batching, returning the exact log-probs of the sampled tokens.
//!
//! Each request is a token context (token-in) and sampling parameters; each completion is the
//! sampled tokens with their log-probs (token-out). The caller drives it: [`Sampler::submit`]
//! queues a request, [`Sampler::step`] admits, decodes one token per busy slot and hands back
//! what finished. Multi-turn episodes keep the sequence exactly as sampled: the caller appends
//! the completion and the observation tokens to the context and submits it again whenever the
//! observation arrives, and it joins the next step. History is never re-tokenised.
//!
//! Invariants:
//! - SA-1 (exactness): every log-prob is SP-1/SP-2 (module `sampling`) computed from the
//!   logits of the cached forward; prefill runs the same layers as the learner's forward and
//!   decode attends exactly the slot's cached positions `0..=pos`, so on CPU f32 the learner's
//!   recomputation differs only by float reassociation (`~1e-6`).
//! - SA-2 (continuous batching): a finished sequence frees its slot at once; waiting requests
//!   (including follow-ups submitted between steps) are prefilled into free slots before the
//!   next decode step. Slots are filled lowest first and decode runs only over slots
//!   `0..=highest occupied` (under SA-7: over the occupied slots, in groups).
//! - SA-3 (stops): a sequence ends after its first token in `stop_token_ids` (included in the
//!   output), after the token whose decoding first contains a stop string (included), or after
//!   `max_new_tokens`, whichever comes first.
//! - SA-4 (seeds): a request's tokens depend only on the model, its context, its parameters
//!   and its seed (SP-4), not on batch composition or admission order (up to float
//!   reassociation between batch shapes).
//! - SA-5 (capacity): `prompt.len() + max_new_tokens <= max_len`, checked before anything runs.
//! - SA-6 (weights): every step runs the model it is given, so weights may change between
//!   steps; a model of another shape, kind or device than the sampler was built for is refused.
//!   A failed step drops every queued and decoding sequence.
//! - SA-8 (versions): [`Sampler::mark_version`] between steps records in every queued or
//!   decoding completion that its tokens from the ones sampled so far on come from weights
//!   version `v` ([`Completion::versions`]); the caller marks after each weight update.
//! - SA-7 (batch invariance, opt-in): with [`Sampler::set_batch_invariant`] every forward's
//!   shape is a function of the sequence's own length alone (`invariant`: a prompt prefilled
//!   alone, padded to its power-of-two length bucket; decode in forwards of exactly
//!   [`INVARIANT_ROWS`] rows of slots in one bucket, attending that bucket's length under a
//!   mask, padding rows writing to a scratch slot), so on CPU a request's output is
//!   bit-identical whatever it shares the sampler with and wherever it sits in the batch:
//!   streaming rollouts stay reproducible, at a cost that follows the tokens in flight.

use std::collections::VecDeque;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tch::{Kind, Tensor};

use super::error::HfError;
use super::kv_cache::KvCache;
use super::layers::RopeTable;
use super::model::HfModel;
use super::sampling::RowParams;

/// How to sample one request.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 is greedy (argmax).
    pub temperature: f64,
    /// Nucleus mass in `(0, 1]`; 1 is off.
    pub top_p: f64,
    /// Keep only the `top_k` most likely tokens; 0 is off.
    pub top_k: usize,
    /// Most tokens to generate (≥ 1).
    pub max_new_tokens: usize,
    /// Tokens that end the sequence (e.g. the config's `eos_token_id`).
    pub stop_token_ids: Vec<u32>,
    /// Strings that end the sequence once the decoded completion contains one (needs
    /// [`Sampler::set_detokenizer`]).
    pub stop_strings: Vec<String>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            max_new_tokens: 64,
            stop_token_ids: vec![],
            stop_strings: vec![],
        }
    }
}

/// One sequence to continue.
#[derive(Clone, Debug)]
pub struct GenRequest {
    /// The exact token context (prompt, or the whole episode so far).
    pub prompt: Vec<u32>,
    /// Sampling parameters.
    pub params: SamplingParams,
    /// Seed of this sequence's random stream (SA-4).
    pub seed: u64,
}

/// Why a sequence ended (SA-3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A token of `stop_token_ids` was sampled.
    StopToken,
    /// The decoded completion contains a stop string.
    StopString,
    /// `max_new_tokens` were generated.
    Length,
}

/// What one request produced.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    /// The sampled tokens, stop token included.
    pub tokens: Vec<u32>,
    /// `log_softmax(logits / T)[token]` over the full vocabulary (SP-1): what the learner
    /// recomputes.
    pub logprobs: Vec<f32>,
    /// Log-prob under the truncated distribution actually sampled from (SP-2).
    pub sampling_logprobs: Vec<f32>,
    /// Why it ended.
    pub finish: FinishReason,
    /// Weight versions marked while it was sampled (SA-8), as `(k, v)`: tokens `k..` came from
    /// version `v`; in order of `k`, empty when no update landed.
    pub versions: Vec<(usize, u64)>,
}

impl Completion {
    /// An empty completion, before its first token.
    pub fn started() -> Self {
        Completion {
            tokens: Vec::new(),
            logprobs: Vec::new(),
            sampling_logprobs: Vec::new(),
            finish: FinishReason::Length,
            versions: Vec::new(),
        }
    }

    /// Records that the tokens from now on come from weights version `version` (SA-8).
    pub fn mark_version(&mut self, version: u64) {
        self.note_version(self.tokens.len(), version);
    }

    /// Records that tokens `at..` come from weights version `version`, unless the tokens
    /// before already do (SA-8).
    pub fn note_version(&mut self, at: usize, version: u64) {
        self.versions.retain(|&(k, _)| k < at);
        if self.versions.last().is_none_or(|&(_, v)| v != version) {
            self.versions.push((at, version));
        }
    }
}

/// Turns completion tokens into text, for stop strings.
pub type Detokenize = Box<dyn Fn(&[u32]) -> Result<String, HfError> + Send>;

/// Counters of one sampler's work.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SamplerStats {
    /// Tokens run through prefill.
    pub prefill_tokens: u64,
    /// Decode steps (each advances every occupied slot by one token).
    pub decode_steps: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
    /// Decode steps with at least 90% of the slots busy (sampler utilisation).
    pub busy_decode_steps: u64,
}

struct Slot {
    id: usize,
    params: SamplingParams,
    rng: ChaCha8Rng,
    /// Tokens in the cache (the next decode input goes at this position).
    len: i64,
    out: Completion,
}

/// Batched KV-cache generation (SA-1..SA-7). The sampler owns the cache, not the model: each
/// step takes the model, so a generator can update the weights between steps (SA-6).
pub struct Sampler {
    /// (layers, kv heads, head dim, vocab, rope theta bits, kind, device) the cache was built for.
    shape: (usize, usize, usize, usize, u64, Kind, tch::Device),
    cache: KvCache,
    rope: RopeTable,
    row_base: Tensor,
    detok: Option<Detokenize>,
    prefill_budget: usize,
    stats: SamplerStats,
    /// Requests waiting for a slot, by caller id, with the version marked while they waited.
    queue: VecDeque<(usize, GenRequest, Option<u64>)>,
    /// The KV-cache slots and the sequences decoding in them.
    slots: Vec<Option<Slot>>,
    /// Row parameters of the current slot occupancy (rebuilt when it changes).
    params: Option<RowParams>,
    /// SA-7: fixed shapes, so a sequence's samples do not depend on its batch mates.
    batch_invariant: bool,
}

pub use invariant::INVARIANT_ROWS;

/// Draws one uniform in `[0, 1)` that stays below 1 after multiplying by a mass in f32.
fn uniform(rng: &mut ChaCha8Rng) -> f32 {
    rng.gen::<f32>().min(0.999_999)
}

fn shape_of(model: &HfModel) -> (usize, usize, usize, usize, u64, Kind, tch::Device) {
    let c = model.config();
    let o = model.options();
    (
        c.num_hidden_layers,
        c.num_key_value_heads,
        c.head_dim,
        c.vocab_size,
        c.rope_theta.to_bits(),
        o.kind,
        o.device,
    )
}

impl Sampler {
    /// A sampler for models shaped like `model`, with `slots` concurrent sequences of up to
    /// `max_len` tokens each.
    pub fn new(model: &HfModel, slots: usize, max_len: usize) -> Result<Self, HfError> {
        if slots == 0 || max_len == 0 {
            return Err(HfError::input(
                "a sampler needs at least one slot and max_len > 0",
            ));
        }
        let (dev, kind) = (model.device(), model.options().kind);
        let row_base =
            Tensor::f_arange(slots as i64, (Kind::Int64, dev))?.f_mul_scalar(max_len as i64)?;
        Ok(Sampler {
            shape: shape_of(model),
            // One slot more than asked: SA-7's padding rows of a prefill write there.
            cache: KvCache::new(model.config(), slots + 1, max_len, dev, kind)?,
            rope: RopeTable::new(model.config(), max_len as i64, dev, kind)?,
            row_base,
            detok: None,
            prefill_budget: 16_384,
            stats: SamplerStats::default(),
            queue: VecDeque::new(),
            slots: (0..slots).map(|_| None).collect(),
            params: None,
            batch_invariant: false,
        })
    }

    /// Sets the detokenizer used for stop strings.
    pub fn set_detokenizer(&mut self, detok: Detokenize) {
        self.detok = Some(detok);
    }

    /// Most tokens (rows × padded length) prefilled in one forward.
    pub fn set_prefill_budget(&mut self, tokens: usize) {
        self.prefill_budget = tokens.max(1);
    }

    /// SA-7: give every forward a shape that depends only on the sequence it serves (module
    /// `invariant`), so that a sequence's tokens and log-probs are bit-identical whatever other
    /// sequences share the sampler and whenever they arrive. Costs padding to length buckets
    /// and fixed-size row groups; off by default.
    pub fn set_batch_invariant(&mut self, on: bool) {
        self.batch_invariant = on;
        self.params = None;
    }

    /// Work counters since creation.
    pub fn stats(&self) -> SamplerStats {
        self.stats
    }

    /// Generates one completion per request, in request order.
    pub fn generate(
        &mut self,
        model: &HfModel,
        requests: Vec<GenRequest>,
    ) -> Result<Vec<Completion>, HfError> {
        let n = requests.len();
        for (id, r) in requests.into_iter().enumerate() {
            self.submit(model, id, r)?;
        }
        let mut out: Vec<Option<Completion>> = vec![None; n];
        while !self.is_idle() {
            for (id, c) in self.step(model)? {
                if let Some(o) = out.get_mut(id) {
                    *o = Some(c);
                }
            }
        }
        out.into_iter()
            .map(|c| c.ok_or_else(|| HfError::input("internal: a request produced no completion")))
            .collect()
    }

    /// Queues a request under the caller's `id` (SA-5 is checked here); it takes the first free
    /// slot at the next [`Sampler::step`] (SA-2).
    pub fn submit(
        &mut self,
        model: &HfModel,
        id: usize,
        request: GenRequest,
    ) -> Result<(), HfError> {
        if shape_of(model) != self.shape {
            return Err(HfError::input(
                "the model's shape, kind or device differs from the one this sampler was built for",
            ));
        }
        self.check(model, &request)?;
        self.queue.push_back((id, request, None));
        Ok(())
    }

    /// Whether nothing is queued or decoding.
    pub fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.slots.iter().all(Option::is_none)
    }

    /// SA-8: the tokens every queued or decoding sequence samples from now on come from
    /// weights version `version`.
    pub fn mark_version(&mut self, version: u64) {
        for (_, _, v) in &mut self.queue {
            *v = Some(version);
        }
        for slot in self.slots.iter_mut().flatten() {
            slot.out.mark_version(version);
        }
    }

    /// Sequences queued or decoding.
    pub fn in_flight(&self) -> usize {
        self.queue.len() + self.slots.iter().filter(|s| s.is_some()).count()
    }

    /// One round of continuous batching (SA-2): admits queued requests into free slots and
    /// prefills them, runs one decode step over the occupied slots, and returns the sequences
    /// that finished, as `(id, completion)`.
    pub fn step(&mut self, model: &HfModel) -> Result<Vec<(usize, Completion)>, HfError> {
        if shape_of(model) != self.shape {
            return Err(HfError::input(
                "the model's shape, kind or device differs from the one this sampler was built for",
            ));
        }
        let mut slots = std::mem::take(&mut self.slots);
        let result = self.step_slots(model, &mut slots);
        self.slots = slots;
        if result.is_err() {
            // A failed forward leaves the batch in an unknown state: drop it all.
            self.slots.iter_mut().for_each(|s| *s = None);
            self.queue.clear();
            self.params = None;
        }
        result
    }

    fn step_slots(
        &mut self,
        model: &HfModel,
        slots: &mut [Option<Slot>],
    ) -> Result<Vec<(usize, Completion)>, HfError> {
        let mut admitted: Vec<(usize, Vec<u32>)> = Vec::new();
        while let Some(s) = slots.iter().position(Option::is_none) {
            let Some((id, r, version)) = self.queue.pop_front() else {
                break;
            };
            let mut out = Completion::started();
            if let Some(v) = version {
                out.mark_version(v);
            }
            slots[s] = Some(Slot {
                id,
                params: r.params,
                rng: ChaCha8Rng::seed_from_u64(r.seed),
                len: r.prompt.len() as i64,
                out,
            });
            admitted.push((s, r.prompt));
        }
        if !admitted.is_empty() {
            self.prefill(model, &admitted, slots)?;
            self.params = None;
        }
        let mut done = self.retire(slots);
        if self.batch_invariant {
            if slots.iter().any(Option::is_some) {
                self.decode_invariant(model, slots)?;
                done.extend(self.retire(slots));
            }
            return Ok(done);
        }
        let rows = slots.iter().rposition(Option::is_some).map_or(0, |r| r + 1);
        if slots.iter().any(Option::is_some) {
            if self.params.is_none() {
                let p: Vec<(f64, f64, usize)> = slots[..rows]
                    .iter()
                    .map(|s| {
                        s.as_ref().map_or((0.0, 1.0, 0), |s| {
                            (s.params.temperature, s.params.top_p, s.params.top_k)
                        })
                    })
                    .collect();
                self.params = Some(RowParams::new(
                    &p,
                    model.config().vocab_size as i64,
                    model.device(),
                )?);
            }
            let params = self.params.take();
            if let Some(p) = &params {
                self.decode(model, &mut slots[..rows], p)?;
            }
            self.params = params;
            done.extend(self.retire(slots));
        }
        Ok(done)
    }

    /// Frees the slots of finished sequences (SA-2) and returns their completions.
    fn retire(&mut self, slots: &mut [Option<Slot>]) -> Vec<(usize, Completion)> {
        let mut done = Vec::new();
        for slot in slots.iter_mut() {
            if slot.as_ref().is_some_and(|s| self.finished(s)) {
                if let Some(s) = slot.take() {
                    done.push((s.id, s.out));
                    self.params = None;
                }
            }
        }
        done
    }

    fn check(&self, model: &HfModel, r: &GenRequest) -> Result<(), HfError> {
        let p = &r.params;
        let max_len = self.cache.max_len() as usize;
        if r.prompt.is_empty() {
            return Err(HfError::input("a request needs a non-empty prompt"));
        }
        if p.max_new_tokens == 0 || r.prompt.len() + p.max_new_tokens > max_len {
            return Err(HfError::input(format!(
                "prompt ({}) + max_new_tokens ({}) must be within the sampler's max_len ({max_len}) and max_new_tokens ≥ 1",
                r.prompt.len(),
                p.max_new_tokens
            )));
        }
        if !(p.temperature.is_finite() && p.temperature >= 0.0 && p.top_p > 0.0 && p.top_p <= 1.0) {
            return Err(HfError::input(format!(
                "temperature must be ≥ 0 and top_p in (0, 1], got {} and {}",
                p.temperature, p.top_p
            )));
        }
        let vocab = model.config().vocab_size as u32;
        if let Some(t) = r.prompt.iter().find(|&&t| t >= vocab) {
            return Err(HfError::input(format!(
                "prompt token {t} is outside the vocabulary (0..{vocab})"
            )));
        }
        if !p.stop_strings.is_empty() && self.detok.is_none() {
            return Err(HfError::input(
                "stop strings need a detokenizer (Sampler::set_detokenizer)",
            ));
        }
        Ok(())
    }

    /// Records one chosen token per slot and applies SA-3.
    fn record(&mut self, slot: &mut Slot, token: u32, lp: f32, slp: f32) -> Result<(), HfError> {
        let out = &mut slot.out;
        out.tokens.push(token);
        out.logprobs.push(lp);
        out.sampling_logprobs.push(slp);
        self.stats.generated_tokens += 1;
        if slot.params.stop_token_ids.contains(&token) {
            out.finish = FinishReason::StopToken;
            slot.params.max_new_tokens = out.tokens.len();
        } else if !slot.params.stop_strings.is_empty() {
            if let Some(detok) = &self.detok {
                let text = detok(&out.tokens)?;
                if slot
                    .params
                    .stop_strings
                    .iter()
                    .any(|s| text.contains(s.as_str()))
                {
                    out.finish = FinishReason::StopString;
                    slot.params.max_new_tokens = out.tokens.len();
                }
            }
        }
        Ok(())
    }

    fn finished(&self, s: &Slot) -> bool {
        s.out.tokens.len() >= s.params.max_new_tokens
    }
}

mod invariant;
mod steps;
