//! Per-token log-probabilities and entropies from next-token logits.
//!
//! Invariants:
//! - LP-1 (alignment): `out[b, t]` describes token `t` as predicted from `logits[b, t-1]`, i.e.
//!   from the prefix `tokens[b, ..t]`; `out[b, 0] = 0` (the first token has no prediction).
//!   This is the alignment of `TrainBatch::loss_mask` and of behaviour log-probs.
//! - LP-2 (precision): the softmax is taken in f32 (f64 when the logits are f64), whatever the
//!   logits' kind, so the sampler and the learner compute the same numbers.

use tch::{Kind, Tensor};

/// The kind reductions are done in: f64 stays f64, everything else becomes f32 (LP-2).
fn reduce_kind(logits: &Tensor) -> Kind {
    if logits.kind() == Kind::Double {
        Kind::Double
    } else {
        Kind::Float
    }
}

/// Prepends a zero column to `[B, T-1]` → `[B, T]` (LP-1).
fn shift_right(x: &Tensor) -> Tensor {
    let size = x.size();
    let zeros = Tensor::zeros([size[0], 1], (x.kind(), x.device()));
    Tensor::cat(&[zeros, x.shallow_clone()], 1)
}

/// `out[b, t] = log p(tokens[b, t] | tokens[b, ..t])` for `t ≥ 1`, from `logits[b, t-1]`;
/// `out[b, 0] = 0` (LP-1). `logits` `[B, T, V]`, `tokens` `[B, T]` i64 → `[B, T]`.
///
/// # Panics
/// When the shapes disagree or a token id is out of range (libtorch error); callers pass
/// tensors produced together by `HfModel::forward`.
pub fn token_logprobs(logits: &Tensor, tokens: &Tensor) -> Tensor {
    let t = tokens.size()[1];
    let lp = logits
        .narrow(1, 0, t - 1)
        .log_softmax(-1, reduce_kind(logits));
    let next = tokens.narrow(1, 1, t - 1).unsqueeze(-1);
    shift_right(&lp.gather(-1, &next, false).squeeze_dim(-1))
}

/// Entropy of the next-token distribution, aligned like [`token_logprobs`]: `out[b, t]` is the
/// entropy of the distribution at `logits[b, t-1]` (the one `tokens[b, t]` was drawn from);
/// `out[b, 0] = 0`.
pub fn token_entropy(logits: &Tensor) -> Tensor {
    let t = logits.size()[1];
    let lp = logits
        .narrow(1, 0, t - 1)
        .log_softmax(-1, reduce_kind(logits));
    let h = -(lp.exp() * &lp).sum_dim_intlist(-1, false, lp.kind());
    shift_right(&h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    #[test]
    fn matches_manual_log_softmax_gather() {
        tch::set_num_threads(1);
        let logits = Tensor::randn([2, 5, 7], (Kind::Double, Device::Cpu));
        let tokens = Tensor::from_slice(&[0i64, 3, 6, 1, 2, 5, 5, 0, 4, 1]).view([2, 5]);
        let out = token_logprobs(&logits, &tokens);
        assert_eq!(out.size(), vec![2, 5]);
        let toks: Vec<Vec<i64>> = Vec::<Vec<i64>>::try_from(&tokens).expect("tokens");
        for b in 0..2 {
            assert_eq!(out.double_value(&[b, 0]), 0.0);
            for t in 1..5 {
                let row = Vec::<f64>::try_from(&logits.get(b).get(t - 1)).expect("row");
                let lse = row.iter().map(|x| x.exp()).sum::<f64>().ln();
                let want = row[toks[b as usize][t as usize] as usize] - lse;
                assert!((out.double_value(&[b, t]) - want).abs() < 1e-12);
            }
        }
    }

    #[test]
    fn entropy_of_uniform_is_log_v() {
        tch::set_num_threads(1);
        let logits = Tensor::zeros([1, 3, 8], (Kind::Float, Device::Cpu));
        let h = token_entropy(&logits);
        assert_eq!(h.double_value(&[0, 0]), 0.0);
        assert!((h.double_value(&[0, 2]) - 8f64.ln()).abs() < 1e-6);
    }
}
