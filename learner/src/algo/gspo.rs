//! GSPO: the sequence-level, length-normalised importance ratio (spec §1.6, verl
//! `compute_policy_loss_gspo`), generalised to *segments* so that SORL's turn-level ratio
//! (§6.2) is the same function with one segment per turn.
//!
//! For segment `k` (a whole sequence for GSPO, one turn for SORL) with tokens `t ∈ k`:
//! ```text
//! lr_t       = logp_t − logp_old_t
//! log s_k    = Σ_{t∈k} m_t·lr_t / max(1, Σ_{t∈k} m_t)                (geometric-mean ratio)
//! log s_{k,t}= sg(log s_k) + logp_t − sg(logp_t)                       (value s_k, grad s_k·∇logp_t)
//! log s_{k,t}= min(log s_{k,t}, 10)                                    (GSPO's stability clamp)
//! loss_t     = max(−A·s_{k,t}, −A·clip(s_{k,t}, 1 − ε_low, 1 + ε_high))   (no dual-clip)
//! ```
//! GSPO always aggregates with `seq-mean-token-mean` (verl forces it; the preset sets it).
//!
//! Invariants:
//! - GS-1: every token of a segment carries the same ratio value `s_k`; the gradient reaching
//!   `logp_t` is `s_k·∂loss/∂s` for that token only (stop-gradient form).
//! - GS-2: segment ids are read only at mask-1 positions; a segment with no valid token has
//!   ratio 1.
//! - GS-3: the clamp at 10 applies to the log-ratio before the surrogate.

use tch::{Kind, Tensor};

use crate::algo::ppo::{clip_surrogate, select, ClipBounds, TokenLoss};

/// Per-segment mean of `x` over mask-1 tokens, broadcast back to every token: `[B, T]`.
/// `segments` `[B, T]` i64 in `0..n_segments` (values at mask-0 positions are ignored, GS-2).
pub fn segment_mean(x: &Tensor, mask: &Tensor, segments: &Tensor, n_segments: i64) -> Tensor {
    let b = x.size()[0];
    let seg = select(segments, mask).to_kind(Kind::Int64);
    let xm = select(&(x * mask.to_kind(x.kind())), mask);
    let m = select(&mask.to_kind(x.kind()), mask);
    let zeros = Tensor::zeros([b, n_segments.max(1)], (x.kind(), x.device()));
    let sums = zeros.scatter_add(1, &seg, &xm);
    let counts = zeros.scatter_add(1, &seg, &m).clamp_min(1.0);
    (sums / counts).gather(1, &seg, false)
}

/// GSPO's per-token log surrogate ratio `log s_{k,t}` (module doc, clamp included).
pub fn segment_log_ratio(
    logp: &Tensor,
    old_logp: &Tensor,
    mask: &Tensor,
    segments: &Tensor,
    n_segments: i64,
) -> Tensor {
    let lr = select(&(logp - old_logp.to_kind(logp.kind())), mask).detach();
    let log_s = segment_mean(&lr, mask, segments, n_segments);
    let lp = select(logp, mask);
    select(&(log_s + &lp - lp.detach()).clamp_max(10.0), mask)
}

/// One segment per row: the GSPO segments.
pub fn whole_sequence_segments(mask: &Tensor) -> Tensor {
    mask.zeros_like().to_kind(Kind::Int64)
}

/// GSPO loss (module doc) with one segment per row.
pub fn gspo_loss(
    logp: &Tensor,
    old_logp: &Tensor,
    adv: &Tensor,
    mask: &Tensor,
    clip: ClipBounds,
) -> TokenLoss {
    let x = segment_log_ratio(logp, old_logp, mask, &whole_sequence_segments(mask), 1);
    let mut out = clip_surrogate(&x, adv, mask, ClipBounds { dual: None, ..clip }, None);
    // approx_kl stays the token-level k1 (verl reports ppo_kl from the token log-ratios).
    out.stats.approx_kl = crate::algo::aggregation::masked_mean_value(
        &(old_logp.to_kind(logp.kind()) - logp.detach()),
        mask,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::aggregation::{agg_loss_local, AggMode};
    use crate::algo::ppo::tests::{check_grad_against, row, values};

    #[test]
    fn spec_vector_sequence_ratio() {
        // lr = [0.1, −0.2, 0.0] → s = exp(−0.1/3) = 0.967216.
        let lp = row(&[0.1, -0.2, 0.0]);
        let x = segment_log_ratio(
            &lp,
            &row(&[0.0; 3]),
            &row(&[1.0; 3]),
            &whole_sequence_segments(&row(&[1.0; 3])),
            1,
        );
        for v in values(&x.exp()) {
            assert!((v - 0.967216).abs() < 1e-6, "{v}");
        }
    }

    #[test]
    fn gs1_segments_share_their_ratio() {
        let lp = row(&[0.2, 0.4, 0.0, -0.3, 0.1]);
        let mask = row(&[1.0, 1.0, 0.0, 1.0, 1.0]);
        let seg = Tensor::from_slice(&[0i64, 0, 0, 1, 1]).view([1, 5]);
        let x = values(&segment_log_ratio(&lp, &row(&[0.0; 5]), &mask, &seg, 2));
        assert!((x[0] - 0.3).abs() < 1e-12 && (x[1] - 0.3).abs() < 1e-12);
        assert!((x[3] + 0.1).abs() < 1e-12 && (x[4] + 0.1).abs() < 1e-12);
        assert_eq!(x[2], 0.0);
    }

    #[test]
    fn gs3_log_ratio_is_clamped_at_10() {
        let x = segment_log_ratio(
            &row(&[30.0]),
            &row(&[0.0]),
            &row(&[1.0]),
            &Tensor::zeros([1, 1], (Kind::Int64, tch::Device::Cpu)),
            1,
        );
        assert_eq!(values(&x), vec![10.0]);
    }

    #[test]
    fn gspo_gradient_matches_stop_gradient_form() {
        // Inside the clip band every valid token gets gradient −A·s/n (one sequence, n = 3).
        let old = row(&[-1.0, -1.2, -0.8, -2.0]);
        let adv = row(&[0.7, 0.7, 0.7, 0.7]);
        let mask = row(&[1.0, 1.0, 0.0, 1.0]);
        let x0 = [-1.05, -1.1, -0.5, -2.02];
        let c = ClipBounds {
            low: 0.2,
            high: 0.2,
            dual: None,
        };
        let loss = |x: &Tensor| {
            agg_loss_local(
                &gspo_loss(x, &old, &adv, &mask, c).loss,
                &mask,
                AggMode::SeqMeanTokenMean,
                None,
            )
        };
        let x = row(&x0).set_requires_grad(true);
        loss(&x).backward();
        let g = values(&x.grad());
        let s = ((x0[0] + 1.0 + x0[1] + 1.2 + x0[3] + 2.0) / 3.0f64).exp();
        for (i, gi) in g.iter().enumerate() {
            let want = if i == 2 { 0.0 } else { -0.7 * s / 3.0 };
            assert!((gi - want).abs() < 1e-12, "token {i}: {gi} vs {want}");
        }
        // And the value is −A·s (every token carries s).
        assert!((loss(&row(&x0)).double_value(&[]) + 0.7 * s).abs() < 1e-12);
        // The stop-gradient form equals the true gradient of the sequence objective (ratio
        // differentiated through its geometric mean) under seq-mean-token-mean.
        let full = |x: &Tensor| {
            let lr = x - &old;
            let xs = segment_mean(&lr, &mask, &whole_sequence_segments(&mask), 1);
            agg_loss_local(
                &clip_surrogate(&xs, &adv, &mask, c, None).loss,
                &mask,
                AggMode::SeqMeanTokenMean,
                None,
            )
        };
        check_grad_against(&x0, &loss, &full);
    }
}
