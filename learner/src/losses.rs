//! Policy and value losses (spec §1.1–§1.3), token-mean aggregated over the loss mask.
//!
//! PPO clipped surrogate (verl `compute_policy_loss_vanilla` without dual-clip):
//! ```text
//! lr = clamp(logp − old_logp, −20, 20) ;  ρ = exp(lr)
//! L1 = −A·ρ ;  L2 = −A·clamp(ρ, 1 − clip_low, 1 + clip_high) ;  L = max(L1, L2)
//! loss = token-mean(L) ;  clip_frac = token-mean(L2 > L1) ;  approx_kl = token-mean(−lr)  (k1)
//! ```
//! Clipped value loss (verl `compute_value_loss`):
//! ```text
//! Vc = clamp(V, V_old − c, V_old + c) ;  loss = ½ · token-mean(max((V − R)², (Vc − R)²))
//! ```
//!
//! Invariants:
//! - LS-1: token-mean is `Σ m·x / max(Σ m, 1)` over the whole tensor (verl's `token-mean`).
//! - LS-2: mask-0 entries are *selected away* (`where`), not multiplied by 0, so a NaN or inf
//!   at a masked position can neither reach the loss nor send gradient back.
//! - LS-3: `approx_kl` is the k1 estimator `mean(old_logp − logp)` (verl's `ppo_kl`).

use tch::{Kind, Tensor};

/// The PPO surrogate and its diagnostics.
pub struct PolicyLoss {
    /// Scalar loss (with gradient).
    pub loss: Tensor,
    /// Fraction of mask-1 tokens where the clipped term was active.
    pub clip_frac: f64,
    /// k1 estimate of KL(old ‖ current) over mask-1 tokens (LS-3).
    pub approx_kl: f64,
}

/// `Σ m·x / max(Σ m, 1)`, with mask-0 entries selected away (LS-1, LS-2); a scalar of `x`'s kind.
pub fn masked_mean(x: &Tensor, mask: &Tensor) -> Tensor {
    let keep = mask.gt(0.0);
    let zero = Tensor::zeros([], (x.kind(), x.device()));
    let weighted = (x * mask.to_kind(x.kind())).where_self(&keep, &zero);
    let count = mask.to_kind(x.kind()).where_self(&keep, &zero).sum(x.kind()).clamp_min(1.0);
    weighted.sum(x.kind()) / count
}

/// PPO clipped policy loss (module doc). All inputs `[B, T]`; `advantages` already broadcast.
pub fn ppo_clip_loss(
    logp: &Tensor,
    old_logp: &Tensor,
    advantages: &Tensor,
    mask: &Tensor,
    clip_low: f64,
    clip_high: f64,
) -> PolicyLoss {
    let keep = mask.gt(0.0);
    let zero = Tensor::zeros([], (logp.kind(), logp.device()));
    // Select before exp so masked garbage never produces inf·0 (LS-2).
    let lr = (logp - old_logp).where_self(&keep, &zero).clamp(-20.0, 20.0);
    let ratio = lr.exp();
    let adv = advantages.to_kind(logp.kind()).where_self(&keep, &zero);
    let l1 = -&adv * &ratio;
    let l2 = -&adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high);
    let clipped = l2.gt_tensor(&l1).to_kind(logp.kind());
    let loss = masked_mean(&l1.maximum(&l2), mask);
    let (clip_frac, approx_kl) = tch::no_grad(|| {
        (masked_mean(&clipped, mask).double_value(&[]), masked_mean(&-lr.detach(), mask).double_value(&[]))
    });
    PolicyLoss { loss, clip_frac, approx_kl }
}

/// Clipped value loss (module doc), `½ · token-mean(max((V − R)², (Vc − R)²))`.
pub fn value_loss(values: &Tensor, old_values: &Tensor, returns: &Tensor, mask: &Tensor, clip: f64) -> Tensor {
    let old = old_values.to_kind(values.kind());
    let ret = returns.to_kind(values.kind());
    let clipped = &old + (values - &old).clamp(-clip, clip);
    let unclipped_err = (values - &ret).square();
    let clipped_err = (clipped - &ret).square();
    masked_mean(&unclipped_err.maximum(&clipped_err), mask) * 0.5
}

/// Token-mean of `x` as an `f64` (a metric; no gradient).
pub(crate) fn masked_mean_value(x: &Tensor, mask: &Tensor) -> f64 {
    tch::no_grad(|| masked_mean(&x.detach(), mask).to_kind(Kind::Double).double_value(&[]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: &[f64]) -> Tensor {
        Tensor::from_slice(v).view([1, -1])
    }

    #[test]
    fn spec_per_token_vectors() {
        // §10 (the non-dual-clip entries; ratio 5, A = −1 is 5.0 here since there is no dual clip).
        let cases = [(1.5, 1.0, -1.2), (1.5, -1.0, 1.5), (0.5, 1.0, -0.5), (0.5, -1.0, 0.8), (1.1, 1.0, -1.1), (5.0, -1.0, 5.0)];
        for (ratio, a, want) in cases {
            let f: f64 = ratio;
            let out = ppo_clip_loss(&t(&[f.ln()]), &t(&[0.0]), &t(&[a]), &t(&[1.0]), 0.2, 0.2);
            assert!((out.loss.double_value(&[]) - want).abs() < 1e-9, "ratio {ratio} A {a}");
        }
    }

    #[test]
    fn ratio_one_has_no_clipping_and_zero_kl() {
        let lp = t(&[-1.0, -2.0, -0.5]);
        let out = ppo_clip_loss(&lp, &lp, &t(&[1.0, -1.0, 0.5]), &t(&[1.0, 1.0, 1.0]), 0.2, 0.28);
        assert_eq!(out.clip_frac, 0.0);
        assert_eq!(out.approx_kl, 0.0);
        assert!((out.loss.double_value(&[]) - (-(1.0 - 1.0 + 0.5) / 3.0)).abs() < 1e-12);
    }

    #[test]
    fn gradient_matches_finite_differences() {
        // Token 5 sits in the clipped region (ratio ≈ 1.49, A > 0): zero gradient.
        let base = [-1.0, -0.7, -2.0, -0.1, -1.5, -0.5];
        let old = t(&[-1.1, -0.5, -2.05, -0.4, -1.5, -0.9]);
        let adv = t(&[1.0, -0.5, 2.0, 1.5, -1.0, 1.0]);
        let mask = t(&[1.0, 1.0, 1.0, 0.0, 1.0, 1.0]);
        let f = |v: &[f64]| ppo_clip_loss(&t(v), &old, &adv, &mask, 0.2, 0.28).loss.double_value(&[]);
        let logp = t(&base).set_requires_grad(true);
        ppo_clip_loss(&logp, &old, &adv, &mask, 0.2, 0.28).loss.backward();
        let grad = Vec::<f64>::try_from(&logp.grad().get(0)).expect("grad");
        let h = 1e-6;
        for i in 0..base.len() {
            let (mut up, mut down) = (base, base);
            up[i] += h;
            down[i] -= h;
            let fd = (f(&up) - f(&down)) / (2.0 * h);
            assert!((fd - grad[i]).abs() < 1e-7, "token {i}: analytic {} vs fd {fd}", grad[i]);
        }
        assert_eq!(grad[3], 0.0, "no gradient reaches a mask-0 token");
        assert_eq!(grad[5], 0.0, "no gradient through the clipped branch");
    }

    #[test]
    fn ls2_masked_positions_cannot_leak_nan() {
        let logp = t(&[-1.0, f64::NAN]).set_requires_grad(true);
        let out = ppo_clip_loss(&logp, &t(&[-1.0, 0.0]), &t(&[1.0, f64::INFINITY]), &t(&[1.0, 0.0]), 0.2, 0.2);
        assert!(out.loss.double_value(&[]).is_finite());
        out.loss.backward();
        let g = Vec::<f64>::try_from(&logp.grad().get(0)).expect("grad");
        assert_eq!(g[1], 0.0);
        assert!(g[0].is_finite());
    }

    #[test]
    fn value_loss_clips_against_old_values() {
        let old = t(&[0.0]);
        let ret = t(&[1.0]);
        // V moved to 2 from 0, clip 0.5 → Vc = 0.5; max((2−1)², (0.5−1)²) = 1 → ½.
        let l = value_loss(&t(&[2.0]), &old, &ret, &t(&[1.0]), 0.5);
        assert!((l.double_value(&[]) - 0.5).abs() < 1e-12);
        // V = 0.8: unclipped err .04, clipped (0.5) err .25 → ½·.25.
        let l = value_loss(&t(&[0.8]), &old, &ret, &t(&[1.0]), 0.5);
        assert!((l.double_value(&[]) - 0.125).abs() < 1e-12);
    }

    #[test]
    fn masked_mean_is_token_mean() {
        let x = Tensor::from_slice(&[1.0f64, 2., 0., 3., 0., 0.]).view([2, 3]);
        let m = Tensor::from_slice(&[1.0f64, 1., 0., 1., 0., 0.]).view([2, 3]);
        assert_eq!(masked_mean(&x, &m).double_value(&[]), 2.0);
    }
}
