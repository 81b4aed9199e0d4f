//! Next-token sampling for generators (no KV cache: each step re-runs the forward pass over the
//! right-padded contexts, which is cheap for contexts of a few hundred tokens).
//!
//! Invariants:
//! - SM-1: the returned `logprob` is `log_softmax(logits / temperature)[token]` computed in f32
//!   on the CPU from the logits at each context's last position, over the *whole* vocabulary:
//!   exactly what `token_logprobs` gives on `logits / temperature` (at temperature 1, the
//!   learner's recomputation, so the PPO ratio starts at 1 on-policy). Banned tokens only shape
//!   the draw, not the reported log-prob.
//! - SM-2: the draw is a function of the logits and the rng alone: one `f64` from the rng per
//!   context, inverse-CDF over the banned-masked probabilities in vocabulary order.
//! - SM-3: a banned token is never returned.
//! - SM-4: right padding does not change the result (model invariant MD-2).

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use tch::{Device, Kind, Tensor};

use crate::error::LearnerError;
use crate::model::PolicyModel;

/// One sampled (or greedy) next token and its log-probability (SM-1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NextTokenSample {
    /// The chosen token id.
    pub token: u32,
    /// `log_softmax(logits / temperature)[token]` over the full vocabulary.
    pub logprob: f32,
}

/// Last-position logits of each context, as a CPU f32 `[N, V]` tensor.
fn last_logits(model: &PolicyModel, contexts: &[&[u32]]) -> Result<Tensor, LearnerError> {
    if contexts.is_empty() {
        return Err(LearnerError::input("sampling needs at least one context"));
    }
    let max_len = contexts.iter().map(|c| c.len()).max().unwrap_or(0);
    if let Some(i) = contexts.iter().position(|c| c.is_empty()) {
        return Err(LearnerError::input(format!(
            "context {i} is empty; start it with a <bos> token"
        )));
    }
    let mut flat = vec![0i64; contexts.len() * max_len];
    for (i, c) in contexts.iter().enumerate() {
        for (j, &tok) in c.iter().enumerate() {
            flat[i * max_len + j] = i64::from(tok);
        }
    }
    let tokens = Tensor::f_from_slice(&flat)?.f_reshape([contexts.len() as i64, max_len as i64])?;
    let last: Vec<i64> = contexts.iter().map(|c| c.len() as i64 - 1).collect();
    let _guard = tch::no_grad_guard();
    let (logits, _) = model.try_forward(&tokens.f_to_device(model.device())?)?;
    let v = logits.size()[2];
    let idx = Tensor::f_from_slice(&last)?
        .f_to_device(model.device())?
        .f_reshape([contexts.len() as i64, 1, 1])?
        .f_expand([contexts.len() as i64, 1, v], false)?;
    Ok(logits
        .f_gather(1, &idx, false)?
        .f_squeeze_dim(1)?
        .f_to_device(Device::Cpu)?
        .f_to_kind(Kind::Float)?)
}

/// Rows of a `[N, V]` CPU f32 tensor.
fn rows(t: &Tensor) -> Result<Vec<Vec<f32>>, LearnerError> {
    Ok(Vec::<Vec<f32>>::try_from(t)?)
}

/// Checks banned ids against the vocabulary and that at least one token stays allowed.
fn check_banned(banned: &[u32], vocab: usize) -> Result<(), LearnerError> {
    if let Some(b) = banned.iter().find(|&&b| b as usize >= vocab) {
        return Err(LearnerError::input(format!(
            "banned token {b} is outside the vocabulary (0..{vocab})"
        )));
    }
    let mut distinct = banned.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() >= vocab {
        return Err(LearnerError::input(
            "every token is banned; nothing can be sampled",
        ));
    }
    Ok(())
}

/// One sampling step for a batch of contexts: draws from `softmax(logits / temperature)` with
/// banned tokens removed (SM-2, SM-3) and reports the full-vocabulary log-prob (SM-1).
pub fn sample_next(
    model: &PolicyModel,
    contexts: &[&[u32]],
    temperature: f64,
    banned: &[u32],
    rng: &mut ChaCha8Rng,
) -> Result<Vec<NextTokenSample>, LearnerError> {
    if !(temperature.is_finite() && temperature > 0.0) {
        return Err(LearnerError::input(format!(
            "temperature must be finite and > 0, got {temperature}"
        )));
    }
    check_banned(banned, model.config().vocab_size)?;
    let scaled = last_logits(model, contexts)?.f_div_scalar(temperature)?;
    let logp = rows(&scaled.f_log_softmax(-1, Kind::Float)?)?;
    let mut out = Vec::with_capacity(logp.len());
    for row in logp {
        let mut probs: Vec<f64> = row.iter().map(|&lp| f64::from(lp).exp()).collect();
        for &b in banned {
            probs[b as usize] = 0.0;
        }
        let total: f64 = probs.iter().sum();
        if !(total.is_finite() && total > 0.0) {
            return Err(LearnerError::NonFinite {
                what: "sampling distribution".into(),
            });
        }
        let u = rng.gen::<f64>() * total;
        let mut acc = 0.0;
        // Fallback: the last allowed token with positive mass (guards against rounding at u≈total).
        let mut token = probs.iter().rposition(|&p| p > 0.0).unwrap_or(0);
        for (i, &p) in probs.iter().enumerate() {
            acc += p;
            if p > 0.0 && u < acc {
                token = i;
                break;
            }
        }
        out.push(NextTokenSample {
            token: token as u32,
            logprob: row[token],
        });
    }
    Ok(out)
}

/// Greedy decoding: the highest-logit allowed token (lowest id on ties) and its temperature-1
/// log-prob over the full vocabulary.
pub fn greedy_next(
    model: &PolicyModel,
    contexts: &[&[u32]],
    banned: &[u32],
) -> Result<Vec<NextTokenSample>, LearnerError> {
    check_banned(banned, model.config().vocab_size)?;
    let logp = rows(&last_logits(model, contexts)?.f_log_softmax(-1, Kind::Float)?)?;
    let mut out = Vec::with_capacity(logp.len());
    for row in logp {
        let mut best: Option<usize> = None;
        for (i, &lp) in row.iter().enumerate() {
            if banned.contains(&(i as u32)) {
                continue;
            }
            if best.is_none_or(|b| lp > row[b]) {
                best = Some(i);
            }
        }
        let token = best.ok_or_else(|| LearnerError::input("every token is banned"))?;
        if !row[token].is_finite() {
            return Err(LearnerError::NonFinite {
                what: "logits".into(),
            });
        }
        out.push(NextTokenSample {
            token: token as u32,
            logprob: row[token],
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logprobs::token_logprobs;
    use crate::model::ModelConfig;
    use rand::SeedableRng;

    fn model() -> PolicyModel {
        let cfg = ModelConfig {
            vocab_size: 13,
            context_len: 24,
            n_layer: 2,
            d_model: 16,
            n_head: 2,
            value_head: false,
        };
        PolicyModel::new(&cfg, Device::Cpu, 5).expect("model")
    }

    #[test]
    fn sm1_logprob_equals_learner_recomputation() {
        tch::set_num_threads(1);
        let m = model();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let a: Vec<u32> = vec![1, 4, 5];
        let b: Vec<u32> = vec![1, 7, 8, 9, 2, 3];
        let mut ctx = [a, b];
        let mut logps: [Vec<f32>; 2] = [vec![], vec![]];
        for _ in 0..6 {
            let refs: Vec<&[u32]> = ctx.iter().map(|c| c.as_slice()).collect();
            let s = sample_next(&m, &refs, 1.0, &[0, 1], &mut rng).expect("sample");
            for (i, smp) in s.iter().enumerate() {
                assert!(smp.token > 1, "banned tokens are never drawn");
                ctx[i].push(smp.token);
                logps[i].push(smp.logprob);
            }
        }
        for (c, lps) in ctx.iter().zip(&logps) {
            let toks: Vec<i64> = c.iter().map(|&t| i64::from(t)).collect();
            let toks = Tensor::from_slice(&toks).view([1, -1]);
            let (logits, _) = m.forward(&toks);
            let re = Vec::<f32>::try_from(&token_logprobs(&logits, &toks).get(0)).expect("row");
            let tail = &re[re.len() - lps.len()..];
            for (x, y) in tail.iter().zip(lps) {
                assert!((x - y).abs() < 2e-6, "recomputed {x} vs sampled {y}");
            }
        }
    }

    #[test]
    fn same_seed_same_draws_and_greedy_is_argmax() {
        tch::set_num_threads(1);
        let m = model();
        let ctx: Vec<&[u32]> = vec![&[1, 2, 3], &[1]];
        let mut r1 = ChaCha8Rng::seed_from_u64(9);
        let mut r2 = ChaCha8Rng::seed_from_u64(9);
        let s1 = sample_next(&m, &ctx, 0.7, &[], &mut r1).expect("s1");
        let s2 = sample_next(&m, &ctx, 0.7, &[], &mut r2).expect("s2");
        assert_eq!(s1, s2);
        let g = greedy_next(&m, &ctx, &[]).expect("greedy");
        let (logits, _) = m.forward(&Tensor::from_slice(&[1i64, 2, 3]).view([1, 3]));
        let argmax = logits.get(0).get(2).argmax(0, false).int64_value(&[]);
        assert_eq!(i64::from(g[0].token), argmax);
        assert!(sample_next(&m, &ctx, 0.0, &[], &mut r1).is_err());
        assert!(sample_next(&m, &[&[]], 1.0, &[], &mut r1).is_err());
    }
}
