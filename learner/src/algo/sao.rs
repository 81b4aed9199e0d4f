//! SAO (spec §3): the direct double-sided importance-sampling (DIS) loss against the behaviour
//! log-probs, and the length-adaptive GAE λ.
//!
//! DIS, per token (REINFORCE form; no π_old recompute):
//! ```text
//! r_t    = exp(clamp(logp_t − logp_beh_t, −20, 20))
//! keep_t = (1 − ε_l < r_t < 1 + ε_h)                   (strict, open interval)
//! f_t    = keep_t ? r_t : 0
//! loss_t = −sg(f_t)·A_t·logp_t                          (∇ = −f_t·A_t·∇logp_t)
//! dis_masked_frac = mean(¬keep_t)
//! ```
//! Bands: reasoning/TIR ε_l = 0.3, ε_h = 5.0 (the preset's default); SWE/coding 0.8 / 3.0.
//!
//! Length-adaptive policy λ: `λ(L) = clamp(1 − 1/(α·L), 0, 1)`, α = 1.5, `λ(0) = 0`, where
//! `L` is the sample's response span in tokens (first to last model token, observations
//! included, as reef does). The critic's targets use λ = 1 (Monte-Carlo returns).
//!
//! Invariants:
//! - SAO-1: a token outside the band contributes neither value nor gradient.
//! - SAO-2: inside the band the gradient is exactly `−r_t·A_t·∇logp_t` (the weight is a constant).

use tch::{Kind, Tensor};

use crate::algo::aggregation::masked_mean_value;
use crate::algo::ppo::select;

/// Smallest and largest ratio among the kept tokens (those that carry gradient); (1, 1) when
/// no token was kept.
fn kept_range(r: &Tensor, keep: &Tensor) -> (f64, f64) {
    let v = r.detach().to_kind(Kind::Double).masked_select(keep);
    if v.numel() == 0 {
        return (1.0, 1.0);
    }
    (v.min().double_value(&[]), v.max().double_value(&[]))
}

/// The DIS loss (module doc): per-token loss `[B, T]`, the masked fraction and the range of
/// ratios that carried gradient.
pub fn dis_loss(
    logp: &Tensor,
    beh_logp: &Tensor,
    adv: &Tensor,
    mask: &Tensor,
    eps_l: f64,
    eps_h: f64,
) -> (Tensor, f64, (f64, f64)) {
    let lp = select(logp, mask);
    let lr = select(&(logp.detach() - beh_logp.to_kind(logp.kind())), mask).clamp(-20.0, 20.0);
    let r = lr.exp();
    let keep = r
        .gt(1.0 - eps_l)
        .logical_and(&r.lt(1.0 + eps_h))
        .logical_and(&mask.gt(0.0));
    let f = r.where_self(&keep, &Tensor::zeros([], (r.kind(), r.device())));
    let a = select(&adv.to_kind(logp.kind()), mask);
    let loss = select(&(-(f * a) * lp), mask);
    let masked = masked_mean_value(&keep.logical_not().to_kind(Kind::Double), mask);
    let range = kept_range(&r, &keep);
    (loss, masked, range)
}

/// `λ(L) = clamp(1 − 1/(α·L), 0, 1)`, `λ(0) = 0` (module doc).
pub fn length_adaptive_lambda(len: usize, alpha: f64) -> f64 {
    if len == 0 {
        return 0.0;
    }
    (1.0 - 1.0 / (alpha * len as f64)).clamp(0.0, 1.0)
}

/// The SAO `L` of each row of `mask` `[B, T]`: last minus first mask-1 position, plus one
/// (0 for a row without model tokens).
pub fn response_spans(mask: &Tensor) -> Vec<usize> {
    let rows = Vec::<Vec<f64>>::try_from(&mask.to_kind(Kind::Double)).unwrap_or_default();
    rows.iter()
        .map(|r| {
            let first = r.iter().position(|&m| m > 0.0);
            let last = r.iter().rposition(|&m| m > 0.0);
            match (first, last) {
                (Some(a), Some(b)) => b - a + 1,
                _ => 0,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::aggregation::masked_mean;
    use crate::algo::ppo::tests::{check_grad_against, row, values};

    #[test]
    fn spec_dis_weights() {
        // (ratio, weight): 0.5 → 0 ; 0.8 → 0.8 ; 5.9 → 5.9 ; 6.1 → 0. A = −1, logp = 1 so the
        // per-token loss equals the weight.
        let ratios = [0.5f64, 0.8, 5.9, 6.1];
        let lr: Vec<f64> = ratios.iter().map(|r| r.ln()).collect();
        let (loss, masked, (kept_min, kept_max)) = dis_loss(
            &row(&[1.0; 4]),
            &row(&lr.iter().map(|x| 1.0 - x).collect::<Vec<_>>()),
            &row(&[-1.0; 4]),
            &row(&[1.0; 4]),
            0.3,
            5.0,
        );
        let got = values(&loss);
        for (g, want) in got.iter().zip([0.0, 0.8, 5.9, 0.0]) {
            assert!((g - want).abs() < 1e-9, "{got:?}");
        }
        assert_eq!(masked, 0.5);
        assert!((kept_min - 0.8).abs() < 1e-9 && (kept_max - 5.9).abs() < 1e-9);
    }

    #[test]
    fn spec_length_adaptive_lambda() {
        for (l, want) in [(100, 0.993333), (1000, 0.999333), (10000, 0.999933)] {
            assert!((length_adaptive_lambda(l, 1.5) - want).abs() < 1e-6);
        }
        assert_eq!(length_adaptive_lambda(0, 1.5), 0.0);
        assert_eq!(length_adaptive_lambda(1, 0.5), 0.0, "clamped at 0");
    }

    #[test]
    fn response_span_includes_observations() {
        let m =
            Tensor::from_slice(&[0.0f64, 1., 1., 0., 0., 1., 0., 0., 0., 0., 0., 0.]).view([2, 6]);
        assert_eq!(response_spans(&m), vec![5, 0]);
    }

    #[test]
    fn sa2_dis_gradient_matches_finite_differences() {
        let beh = row(&[-1.0, -1.0, -1.0, -1.0]);
        let adv = row(&[1.0, -2.0, 0.5, 3.0]);
        let mask = row(&[1.0, 1.0, 0.0, 1.0]);
        // Token 3 has ratio e^2 ≈ 7.4 outside (0.7, 6): SAO-1, no gradient.
        let x0 = [-0.8, -1.2, -0.5, 1.0];
        let f = |x: &Tensor| masked_mean(&dis_loss(x, &beh, &adv, &mask, 0.3, 5.0).0, &mask);
        // The equivalent objective with the weights frozen at x0: −Σ f_t·A_t·logp_t / 3.
        let w: Vec<f64> = x0
            .iter()
            .zip([true, true, false, false])
            .map(|(x, k)| if k { (x + 1.0f64).exp() } else { 0.0 })
            .collect();
        let frozen = |x: &Tensor| masked_mean(&(-(row(&w) * &adv) * x), &mask);
        check_grad_against(&x0, &f, &frozen);
    }
}
