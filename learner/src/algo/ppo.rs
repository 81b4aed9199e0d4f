//! Vanilla PPO clip with asymmetric bounds (clip-higher) and dual-clip (spec §1.1, verl
//! `compute_policy_loss_vanilla`), written over a generic log-ratio so that GSPO, SORL and
//! ARMOR reuse the same clipping.
//!
//! Per token, with `x` the log-ratio (`logp − logp_old` for vanilla PPO):
//! ```text
//! ρ      = exp(clamp(x, −20, 20))
//! L1     = −A·ρ ;  L2 = −A·clamp(ρ, 1 − ε_low, 1 + ε_high) ;  Lclip = max(L1, L2)
//! L3     = −A·c                                     (dual-clip, c > 1)
//! loss_t = (A < 0 and dual-clip on) ? min(L3, Lclip) : Lclip
//! loss_t ← loss_t · w_t                             (optional rollout-correction weights)
//! ```
//! Metrics (token means over the mask): `clip_frac = [L2 > L1]`, split into `clip_frac_upper`
//! (`ρ > 1`, positive advantages) and `clip_frac_lower` (`ρ < 1`, negative advantages);
//! `clip_frac_dual = [Lclip > L3 ∧ A < 0]` (verl's `pg_clipfrac_lower`); `approx_kl =
//! mean(−x)` (verl's `ppo_kl`, k1 of old‖current).
//!
//! Invariants:
//! - PP-1: mask-0 entries are selected away before `exp`, so garbage there cannot make inf·0;
//!   their per-token loss is exactly 0 and they receive no gradient.
//! - PP-2: dual-clip only changes tokens with `A < 0` and `ρ > c`, capping their loss at `−A·c`.
//! - PP-3: the log-ratio is clamped to [−20, 20] before `exp` (verl), for every caller.

use tch::{Kind, Tensor};

use crate::algo::aggregation::masked_mean_value;
use crate::step_metrics::{Stat, Stats};

/// Clip bounds of the PPO surrogate.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ClipBounds {
    /// `ε_low`: the ratio is clipped below at `1 − ε_low`.
    pub low: f64,
    /// `ε_high`: the ratio is clipped above at `1 + ε_high` (clip-higher when > `low`).
    pub high: f64,
    /// Dual-clip constant `c > 1`, or None.
    pub dual: Option<f64>,
}

/// A per-token policy loss and its diagnostics.
pub struct TokenLoss {
    /// `[B, T]` per-token loss, 0 at mask-0 positions (with gradient).
    pub loss: Tensor,
    /// Diagnostics, token means over the mask.
    pub stats: ClipStats,
}

/// Clip diagnostics (module doc; names as in docs/metrics-learner.md).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ClipStats {
    /// Fraction of tokens whose clipped term was active (verl `pg_clipfrac`).
    pub clip_frac: f64,
    /// … of which the ratio was above 1.
    pub clip_frac_upper: f64,
    /// … of which the ratio was below 1.
    pub clip_frac_lower: f64,
    /// Fraction of tokens capped by dual-clip (verl `pg_clipfrac_lower`).
    pub clip_frac_dual: f64,
    /// k1 estimate of KL(old ‖ current): mean of `−x`.
    pub approx_kl: f64,
}

impl ClipStats {
    /// These statistics by name (docs/metrics-learner.md).
    pub fn named(&self) -> Stats {
        Stats::new()
            .with(Stat::ClipFrac, self.clip_frac)
            .with(Stat::ClipFracUpper, self.clip_frac_upper)
            .with(Stat::ClipFracLower, self.clip_frac_lower)
            .with(Stat::ClipFracDual, self.clip_frac_dual)
            .with(Stat::ApproxKl, self.approx_kl)
    }
}

/// `x` with mask-0 entries replaced by 0 (PP-1).
pub(crate) fn select(x: &Tensor, mask: &Tensor) -> Tensor {
    x.where_self(&mask.gt(0.0), &Tensor::zeros([], (x.kind(), x.device())))
}

/// The clipped surrogate on a given log-ratio `x` (module doc). `weights`, when given, multiply
/// the per-token loss and are treated as constants.
pub fn clip_surrogate(
    x: &Tensor,
    adv: &Tensor,
    mask: &Tensor,
    clip: ClipBounds,
    weights: Option<&Tensor>,
) -> TokenLoss {
    let x = select(x, mask).clamp(-20.0, 20.0);
    let adv = select(&adv.to_kind(x.kind()), mask);
    let ratio = x.exp();
    let l1 = -&adv * &ratio;
    let l2 = -&adv * ratio.clamp(1.0 - clip.low, 1.0 + clip.high);
    let lclip = l1.maximum(&l2);
    let negative = adv.lt(0.0);
    let (mut loss, dual_active) = match clip.dual {
        Some(c) => {
            let l3 = -&adv * c;
            let dual_active = lclip.gt_tensor(&l3).logical_and(&negative);
            (
                lclip.where_self(&negative.logical_not(), &l3.minimum(&lclip)),
                Some(dual_active),
            )
        }
        None => (lclip, None),
    };
    if let Some(w) = weights {
        loss *= w.detach().to_kind(x.kind());
    }
    let loss = select(&loss, mask);
    let stats = tch::no_grad(|| {
        let clipped = l2.gt_tensor(&l1);
        let f = |t: &Tensor| masked_mean_value(&t.to_kind(Kind::Double), mask);
        ClipStats {
            clip_frac: f(&clipped),
            clip_frac_upper: f(&clipped.logical_and(&ratio.gt(1.0))),
            clip_frac_lower: f(&clipped.logical_and(&ratio.lt(1.0))),
            clip_frac_dual: dual_active.as_ref().map(f).unwrap_or(0.0),
            approx_kl: masked_mean_value(&-x.detach(), mask),
        }
    });
    TokenLoss { loss, stats }
}

/// Vanilla PPO: the surrogate on `x = logp − old_logp` (module doc).
pub fn vanilla_ppo(
    logp: &Tensor,
    old_logp: &Tensor,
    adv: &Tensor,
    mask: &Tensor,
    clip: ClipBounds,
) -> TokenLoss {
    clip_surrogate(
        &(logp - old_logp.to_kind(logp.kind())),
        adv,
        mask,
        clip,
        None,
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::algo::aggregation::masked_mean;

    pub(crate) fn row(v: &[f64]) -> Tensor {
        Tensor::from_slice(v).view([1, -1])
    }

    pub(crate) fn values(t: &Tensor) -> Vec<f64> {
        Vec::<f64>::try_from(&t.to_kind(Kind::Double).view([-1])).expect("values")
    }

    /// Compares the autograd gradient of `f` at `x0` with central finite differences (f64).
    pub(crate) fn check_grad(x0: &[f64], f: impl Fn(&Tensor) -> Tensor) {
        check_grad_against(x0, &f, &f)
    }

    /// Autograd of `f_grad` against finite differences of `f_value` (equal where the
    /// stop-gradient forms are exact, e.g. GSPO's).
    pub(crate) fn check_grad_against(
        x0: &[f64],
        f_grad: &dyn Fn(&Tensor) -> Tensor,
        f: &dyn Fn(&Tensor) -> Tensor,
    ) {
        let x = row(x0).set_requires_grad(true);
        f_grad(&x).backward();
        let g = values(&x.grad());
        let h = 1e-6;
        for i in 0..x0.len() {
            let (mut up, mut down) = (x0.to_vec(), x0.to_vec());
            up[i] += h;
            down[i] -= h;
            let fd =
                (f(&row(&up)).double_value(&[]) - f(&row(&down)).double_value(&[])) / (2.0 * h);
            assert!(
                (fd - g[i]).abs() < 1e-6 * (1.0 + fd.abs()),
                "coordinate {i}: autograd {} vs fd {fd}",
                g[i]
            );
        }
    }

    const DUAL: ClipBounds = ClipBounds {
        low: 0.2,
        high: 0.2,
        dual: Some(3.0),
    };

    #[test]
    fn spec_dual_clip_vectors() {
        let cases = [
            (1.5, 1.0, -1.2),
            (1.5, -1.0, 1.5),
            (0.5, 1.0, -0.5),
            (0.5, -1.0, 0.8),
            (5.0, -1.0, 3.0),
            (1.1, 1.0, -1.1),
        ];
        for (ratio, a, want) in cases {
            let r: f64 = ratio;
            let out = vanilla_ppo(
                &row(&[r.ln()]),
                &row(&[0.0]),
                &row(&[a]),
                &row(&[1.0]),
                DUAL,
            );
            assert!(
                (out.loss.double_value(&[0, 0]) - want).abs() < 1e-9,
                "ratio {ratio} A {a}"
            );
        }
    }

    #[test]
    fn pp2_dual_clip_only_touches_negative_advantages_beyond_c() {
        let lp = row(&[5f64.ln(), 5f64.ln(), 2f64.ln()]);
        let out = vanilla_ppo(
            &lp,
            &row(&[0.0; 3]),
            &row(&[-1.0, 1.0, -1.0]),
            &row(&[1.0; 3]),
            DUAL,
        );
        for (got, want) in values(&out.loss).iter().zip([3.0, -1.2, 2.0]) {
            assert!((got - want).abs() < 1e-12, "{got} vs {want}");
        }
        assert!((out.stats.clip_frac_dual - 1.0 / 3.0).abs() < 1e-12);
        let no_dual = vanilla_ppo(
            &lp,
            &row(&[0.0; 3]),
            &row(&[-1.0, 1.0, -1.0]),
            &row(&[1.0; 3]),
            ClipBounds { dual: None, ..DUAL },
        );
        assert!((values(&no_dual.loss)[0] - 5.0).abs() < 1e-12);
    }

    #[test]
    fn clip_higher_splits_upper_and_lower() {
        let c = ClipBounds {
            low: 0.2,
            high: 0.28,
            dual: None,
        };
        // ratio 1.25 with A>0 is inside [0.8, 1.28]; 1.3 is clipped (upper); 0.7 with A<0 (lower).
        let lp = row(&[1.25f64.ln(), 1.3f64.ln(), 0.7f64.ln(), 0.0]);
        let out = vanilla_ppo(
            &lp,
            &row(&[0.0; 4]),
            &row(&[1.0, 1.0, -1.0, 1.0]),
            &row(&[1.0; 4]),
            c,
        );
        assert_eq!(
            (
                out.stats.clip_frac,
                out.stats.clip_frac_upper,
                out.stats.clip_frac_lower
            ),
            (0.5, 0.25, 0.25)
        );
    }

    #[test]
    fn ppo_gradient_matches_finite_differences() {
        let old = row(&[-1.1, -0.5, -2.05, -0.4, -1.5, -0.9, -3.0]);
        let adv = row(&[1.0, -0.5, 2.0, 1.5, -1.0, 1.0, -2.0]);
        let mask = row(&[1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0]);
        let c = ClipBounds {
            low: 0.2,
            high: 0.28,
            dual: Some(3.0),
        };
        // Token 6 has ratio e^1.7 ≈ 5.5 > c with A < 0: dual-clipped, zero gradient.
        let x0 = [-1.0, -0.7, -2.0, -0.1, -1.5, -0.5, -1.3];
        check_grad(&x0, |x| {
            masked_mean(&vanilla_ppo(x, &old, &adv, &mask, c).loss, &mask)
        });
        let x = row(&x0).set_requires_grad(true);
        masked_mean(&vanilla_ppo(&x, &old, &adv, &mask, c).loss, &mask).backward();
        let g = values(&x.grad());
        assert_eq!(
            (g[3], g[5], g[6]),
            (0.0, 0.0, 0.0),
            "masked, clipped and dual-clipped tokens get no gradient"
        );
    }

    #[test]
    fn pp1_masked_garbage_is_inert() {
        let lp = row(&[-1.0, f64::NAN]).set_requires_grad(true);
        let out = vanilla_ppo(
            &lp,
            &row(&[-1.0, 0.0]),
            &row(&[1.0, f64::INFINITY]),
            &row(&[1.0, 0.0]),
            DUAL,
        );
        let l = masked_mean(&out.loss, &row(&[1.0, 0.0]));
        assert!(l.double_value(&[]).is_finite());
        l.backward();
        assert_eq!(values(&lp.grad())[1], 0.0);
    }
}
