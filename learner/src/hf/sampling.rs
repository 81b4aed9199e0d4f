//! Choosing the next token of many sequences at once, on the model's device, with per-row
//! temperature, top-k and top-p, from host-drawn uniforms.
//!
//! With `z = logits / T` (f32), `p = softmax(z)`, the kept set `K` is the `top_k` most likely
//! tokens (all when 0) intersected with the smallest prefix of tokens sorted by `p` whose mass
//! before each kept token is `< top_p`; the token is drawn from `q = p·[K] / Σ_K p` by inverse
//! CDF at `u · Σ_K p`.
//!
//! Invariants:
//! - SP-1 (learner log-prob): `logprob = log_softmax(z)[token]` over the full vocabulary, the
//!   number the learner recomputes from its own forward (`token_logprobs` on `logits / T`).
//! - SP-2 (sampling log-prob): `sampling_logprob = log q[token]`, the log-prob under the
//!   truncated distribution actually sampled from (0 for greedy rows); equal to SP-1 when
//!   neither top-k nor top-p truncates.
//! - SP-3 (greedy): temperature 0 picks `argmax(logits)` (lowest id on ties, as torch) and
//!   reports SP-1 at temperature 1.
//! - SP-4 (seeds): randomness enters only through `u`, one uniform per row drawn on the host from
//!   each sequence's own ChaCha8 stream, so a sequence's tokens do not depend on which other
//!   sequences share its batch or slot.

use tch::{Device, Kind, Tensor};

use super::error::HfError;

/// Per-row sampling parameters as device tensors (rebuilt only when the batch changes).
pub(crate) struct RowParams {
    /// `[n, 1]` f32: the temperature, 1 for greedy rows.
    temp: Tensor,
    /// `[n]` bool: greedy rows.
    greedy: Tensor,
    /// `[n, 1]` f32: top-p (1 keeps everything).
    top_p: Tensor,
    /// `[n, 1]` i64: top-k (vocab size when off).
    top_k: Tensor,
    /// Whether any row truncates (otherwise the sort is skipped).
    truncates: bool,
    /// Whether every row is greedy (otherwise sampling runs).
    all_greedy: bool,
}

impl RowParams {
    /// `(temperature, top_p, top_k)` per row; `top_k = 0` is off.
    pub(crate) fn new(
        rows: &[(f64, f64, usize)],
        vocab: i64,
        device: Device,
    ) -> Result<Self, HfError> {
        let temp: Vec<f32> = rows
            .iter()
            .map(|r| if r.0 > 0.0 { r.0 as f32 } else { 1.0 })
            .collect();
        let greedy: Vec<bool> = rows.iter().map(|r| r.0 <= 0.0).collect();
        let top_p: Vec<f32> = rows.iter().map(|r| r.1 as f32).collect();
        let top_k: Vec<i64> = rows
            .iter()
            .map(|r| {
                if r.2 == 0 {
                    vocab
                } else {
                    (r.2 as i64).min(vocab)
                }
            })
            .collect();
        let truncates = rows
            .iter()
            .any(|r| r.0 > 0.0 && (r.1 < 1.0 || (r.2 > 0 && (r.2 as i64) < vocab)));
        let n = rows.len() as i64;
        Ok(RowParams {
            temp: Tensor::f_from_slice(&temp)?
                .f_view([n, 1])?
                .f_to_device(device)?,
            greedy: Tensor::f_from_slice(&greedy)?.f_to_device(device)?,
            top_p: Tensor::f_from_slice(&top_p)?
                .f_view([n, 1])?
                .f_to_device(device)?,
            top_k: Tensor::f_from_slice(&top_k)?
                .f_view([n, 1])?
                .f_to_device(device)?,
            truncates,
            all_greedy: greedy.iter().all(|&g| g),
        })
    }
}

/// Chosen tokens `[n]` i64, SP-1 log-probs `[n]` f32 and SP-2 log-probs `[n]` f32, on device.
pub(crate) struct Choice {
    pub(crate) tokens: Tensor,
    pub(crate) logprobs: Tensor,
    pub(crate) sampling_logprobs: Tensor,
}

/// Picks one token per row of `logits` `[n, V]` (SP-1..SP-4); `u` `[n]` f32 in `[0, 1)`.
pub(crate) fn choose(logits: &Tensor, params: &RowParams, u: &Tensor) -> Result<Choice, HfError> {
    let v = logits.size()[1];
    let z = logits.f_to_kind(Kind::Float)?.f_div(&params.temp)?;
    let logp = z.f_log_softmax(-1, Kind::Float)?;
    let argmax = logits.f_argmax(-1, true)?;
    if params.all_greedy {
        let lp = logp.f_gather(1, &argmax, false)?.f_squeeze_dim(1)?;
        let zeros = lp.f_zeros_like()?;
        return Ok(Choice {
            tokens: argmax.f_squeeze_dim(1)?,
            logprobs: lp,
            sampling_logprobs: zeros,
        });
    }
    let u = u.f_to_device(logits.device())?.f_unsqueeze(1)?;
    let (token, samp_lp) = if params.truncates {
        let (sorted, idx) = z.f_sort(-1, true)?;
        let probs = sorted.f_softmax(-1, Kind::Float)?;
        let before = probs.f_cumsum(-1, Kind::Float)?.f_sub(&probs)?;
        let rank = Tensor::f_arange(v, (Kind::Int64, logits.device()))?.f_unsqueeze(0)?;
        let keep = before
            .f_lt_tensor(&params.top_p)?
            .f_logical_and(&rank.f_lt_tensor(&params.top_k)?)?;
        // The most likely token is always kept, whatever top_p.
        let keep = keep.f_logical_or(&rank.f_eq(0)?)?;
        let masked = probs.f_mul(&keep)?;
        let cdf = masked.f_cumsum(-1, Kind::Float)?;
        let total = cdf.f_narrow(1, v - 1, 1)?;
        let j = u
            .f_mul(&total)?
            .f_searchsorted(&cdf, false, true, "right", None::<Tensor>)?
            .f_clamp_max(v - 1)?;
        let token = idx.f_gather(1, &j, false)?;
        let q = masked.f_gather(1, &j, false)?.f_div(&total)?;
        (token, q.f_log()?)
    } else {
        let probs = logp.f_exp()?;
        let cdf = probs.f_cumsum(-1, Kind::Float)?;
        let total = cdf.f_narrow(1, v - 1, 1)?;
        let j = u
            .f_mul(&total)?
            .f_searchsorted(&cdf, false, true, "right", None::<Tensor>)?
            .f_clamp_max(v - 1)?;
        let lp = logp.f_gather(1, &j, false)?;
        (j, lp)
    };
    let greedy = params.greedy.f_unsqueeze(1)?;
    let token = argmax.f_where_self(&greedy, &token)?;
    let lp = logp.f_gather(1, &token, false)?.f_squeeze_dim(1)?;
    let samp = samp_lp
        .f_zeros_like()?
        .f_where_self(&greedy, &samp_lp)?
        .f_squeeze_dim(1)?;
    Ok(Choice {
        tokens: token.f_squeeze_dim(1)?,
        logprobs: lp,
        sampling_logprobs: samp,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sp_rules_on_a_known_distribution() {
        tch::set_num_threads(1);
        // logits chosen so that softmax = [0.5, 0.3, 0.15, 0.05].
        let p = [0.5f64, 0.3, 0.15, 0.05];
        let logits: Vec<f32> = p.iter().map(|x| x.ln() as f32).collect();
        let logits = Tensor::from_slice(&logits).view([1, 4]).repeat([4, 1]);
        let rows = [(1.0, 1.0, 0), (1.0, 0.7, 0), (1.0, 1.0, 1), (0.0, 1.0, 0)];
        let params = RowParams::new(&rows, 4, Device::Cpu).expect("params");
        let u = Tensor::from_slice(&[0.97f32, 0.99, 0.9, 0.5]);
        let c = choose(&logits, &params, &u).expect("choose");
        let toks = Vec::<i64>::try_from(&c.tokens).expect("tokens");
        // Row 0: cdf 0.5,0.8,0.95,1.0 at 0.97 → token 3. Row 1: top-p 0.7 keeps {0,1}. Row 2: top-1.
        assert_eq!(toks, vec![3, 1, 0, 0]);
        let lp = Vec::<f32>::try_from(&c.logprobs).expect("lp");
        let sl = Vec::<f32>::try_from(&c.sampling_logprobs).expect("sl");
        assert!((lp[0] - 0.05f32.ln()).abs() < 1e-5 && (sl[0] - lp[0]).abs() < 1e-5);
        assert!((lp[1] - 0.3f32.ln()).abs() < 1e-5 && (sl[1] - (0.3f32 / 0.8).ln()).abs() < 1e-5);
        assert!(sl[2].abs() < 1e-6 && sl[3] == 0.0);
    }
}
