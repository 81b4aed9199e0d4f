//! The train/inference log-prob mismatch: the sampler's log-probs against the learner's
//! recomputation from its own forward over the final token sequence.
//!
//! Invariants:
//! - LM-1: the learner side is `token_logprobs(logits / T, tokens)` of [`crate::model::policy_logits`]
//!   over the whole sequence (the same function the learner's losses use), compared at every
//!   sampled position; `mean_abs` and `max_abs` are over all sampled tokens of all sequences.
//! - LM-2: on CPU in f32 the mismatch is float reassociation only (< 1e-4, in practice ~1e-6);
//!   a larger value means sampler and learner disagree about the model or the tokens.

use tch::Tensor;

use super::error::HfError;
use super::model::HfModel;
use crate::logprobs::token_logprobs;
use crate::model::policy_logits;

/// One sampled sequence: the full tokens, and the log-probs the sampler reported for
/// `tokens[start..start + logprobs.len()]`.
pub struct SampledSequence<'a> {
    /// The whole sequence (context and every sampled token).
    pub tokens: &'a [u32],
    /// Index of the first sampled token that `logprobs` describes.
    pub start: usize,
    /// The sampler's log-probs (SP-1).
    pub logprobs: &'a [f32],
}

/// Summary of |sampler − learner| over sampled tokens (LM-1).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LogprobMismatch {
    /// Mean absolute difference.
    pub mean_abs: f64,
    /// Largest absolute difference.
    pub max_abs: f64,
    /// Number of tokens compared.
    pub tokens: usize,
}

/// Recomputes the log-probs of `seqs` with `model` at `temperature` (1 for greedy) and
/// compares (LM-1).
pub fn logprob_mismatch(
    model: &HfModel,
    seqs: &[SampledSequence<'_>],
    temperature: f64,
) -> Result<LogprobMismatch, HfError> {
    let _guard = tch::no_grad_guard();
    let mut out = LogprobMismatch::default();
    let mut sum = 0.0;
    for s in seqs {
        if s.start == 0 || s.start + s.logprobs.len() > s.tokens.len() {
            return Err(HfError::input(format!(
                "sampled span {}..{} must lie within 1..={} tokens",
                s.start,
                s.start + s.logprobs.len(),
                s.tokens.len()
            )));
        }
        let toks: Vec<i64> = s.tokens.iter().map(|&t| i64::from(t)).collect();
        let toks = Tensor::f_from_slice(&toks)?
            .f_view([1, -1])?
            .f_to_device(model.device())?;
        let t = if temperature > 0.0 { temperature } else { 1.0 };
        let (scaled, _) = policy_logits(model, &toks, t)?;
        let re = token_logprobs(&scaled, &toks)
            .f_to_device(tch::Device::Cpu)?
            .f_view([-1])?;
        let re = Vec::<f32>::try_from(&re)?;
        for (i, &lp) in s.logprobs.iter().enumerate() {
            let d = f64::from((re[s.start + i] - lp).abs());
            sum += d;
            out.max_abs = out.max_abs.max(d);
            out.tokens += 1;
        }
    }
    if out.tokens > 0 {
        out.mean_abs = sum / out.tokens as f64;
    }
    Ok(out)
}
