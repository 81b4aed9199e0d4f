//! KL estimators and the two ways KL enters the objective (spec §1.8, verl
//! `kl_penalty_forward`, `apply_kl_penalty`), plus the entropy bonus (§1.9).
//!
//! With `lp` the policy's log-prob (current or old) and `lq` the reference's:
//! ```text
//! k1  ("kl")          : lp − lq
//! abs                 : |lp − lq|
//! k2  ("mse")         : ½ (lp − lq)²
//! k3  ("low_var_kl")  : x = clamp(lq − lp, −20, 20);  clamp(exp(x) − x − 1, −10, 10)
//! <name>+             : value of <name>, gradient of k2:
//!                       ½(lp−lq)² − sg(½(lp−lq)²) + sg(<name>)
//! ```
//! KL as loss (GRPO convention): `policy_loss += β·agg(kl(logp, logp_ref))`.
//! KL in reward (PPO convention): `r_t ← r_t − β·kl(logp_old_t, logp_ref_t)` on model tokens,
//! with β fixed or adaptive:
//! ```text
//! err = clip(KL / target − 1, −0.2, 0.2) ;  β ← β·(1 + err·n_steps / horizon)
//! ```
//! Entropy bonus: `policy_loss −= entropy_coef·agg(H_t)`.
//!
//! Invariants:
//! - KL-1: every estimator is 0 where `lp = lq`; k2 and k3 are ≥ 0.
//! - KL-2: a "+" form has exactly its base estimator's value and k2's gradient.
//! - KL-3: KL in reward changes rewards only at mask-1 positions.
//! - KL-4: `masked_kl` is 0 at mask-0 positions and sends them no gradient.

use tch::Tensor;

use crate::algo::ppo::select;

/// A KL estimator, named as in verl (aliases accepted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum KlEstimator {
    /// `lp − lq`.
    #[serde(rename = "k1", alias = "kl")]
    K1,
    /// `|lp − lq|`.
    #[serde(rename = "abs")]
    Abs,
    /// `½(lp − lq)²`.
    #[serde(rename = "k2", alias = "mse")]
    K2,
    /// `exp(x) − x − 1` with `x = lq − lp`, clamped (low-variance KL).
    #[serde(rename = "k3", alias = "low_var_kl")]
    K3,
    /// k1's value with k2's gradient.
    #[serde(rename = "k1+", alias = "kl+")]
    K1Plus,
    /// abs's value with k2's gradient.
    #[serde(rename = "abs+")]
    AbsPlus,
    /// k2 (its own gradient).
    #[serde(rename = "k2+", alias = "mse+")]
    K2Plus,
    /// k3's value with k2's gradient.
    #[serde(rename = "k3+", alias = "low_var_kl+")]
    K3Plus,
}

/// The estimator per token (module doc), `[B, T]` → `[B, T]`.
pub fn kl_penalty(lp: &Tensor, lq: &Tensor, est: KlEstimator) -> Tensor {
    let lq = lq.to_kind(lp.kind());
    let d = lp - &lq;
    let base = |e: KlEstimator| -> Tensor {
        match e {
            KlEstimator::K1 | KlEstimator::K1Plus => d.shallow_clone(),
            KlEstimator::Abs | KlEstimator::AbsPlus => d.abs(),
            KlEstimator::K2 | KlEstimator::K2Plus => d.square() * 0.5,
            KlEstimator::K3 | KlEstimator::K3Plus => {
                let x = (&lq - lp).clamp(-20.0, 20.0);
                (x.exp() - &x - 1.0).clamp(-10.0, 10.0)
            }
        }
    };
    match est {
        KlEstimator::K1Plus | KlEstimator::AbsPlus | KlEstimator::K2Plus | KlEstimator::K3Plus => {
            let k2 = d.square() * 0.5;
            &k2 - k2.detach() + base(est).detach()
        }
        _ => base(est),
    }
}

/// [`kl_penalty`] with mask-0 entries of both inputs replaced by 0 first, so garbage there can
/// send no gradient (KL-4).
pub fn masked_kl(lp: &Tensor, lq: &Tensor, mask: &Tensor, est: KlEstimator) -> Tensor {
    select(
        &kl_penalty(
            &select(lp, mask),
            &select(&lq.to_kind(lp.kind()), mask),
            est,
        ),
        mask,
    )
}

/// `r_t − β·kl(logp_old_t, logp_ref_t)` at mask-1 positions, `r_t` elsewhere (KL-3); no
/// gradient. Also returns the token-mean KL (for the controller).
pub fn kl_in_reward(
    rewards: &Tensor,
    old_logp: &Tensor,
    ref_logp: &Tensor,
    mask: &Tensor,
    beta: f64,
    est: KlEstimator,
) -> (Tensor, f64) {
    tch::no_grad(|| {
        let kl = select(
            &kl_penalty(&old_logp.detach(), &ref_logp.detach(), est),
            mask,
        );
        let mean = crate::algo::aggregation::masked_mean_value(&kl, mask);
        (rewards - kl.to_kind(rewards.kind()) * beta, mean)
    })
}

/// The KL-in-reward coefficient controller (verl `FixedKLController` / `AdaptiveKLController`).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum KlController {
    /// β never changes.
    Fixed {
        /// β.
        beta: f64,
    },
    /// β follows a KL target (module doc).
    Adaptive {
        /// Current β.
        beta: f64,
        /// Target KL.
        target: f64,
        /// Horizon in samples.
        horizon: f64,
    },
}

impl KlController {
    /// The current β.
    pub fn beta(&self) -> f64 {
        match *self {
            KlController::Fixed { beta } | KlController::Adaptive { beta, .. } => beta,
        }
    }

    /// Replaces β (exact resume).
    pub fn set_beta(&mut self, value: f64) {
        match self {
            KlController::Fixed { beta } | KlController::Adaptive { beta, .. } => *beta = value,
        }
    }

    /// One update with the observed `kl` over `n_steps` samples (module doc).
    pub fn update(&mut self, kl: f64, n_steps: f64) {
        if let KlController::Adaptive {
            beta,
            target,
            horizon,
        } = self
        {
            let err = (kl / *target - 1.0).clamp(-0.2, 0.2);
            *beta *= 1.0 + err * n_steps / *horizon;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::ppo::tests::{check_grad, row, values};

    const ALL: [KlEstimator; 8] = [
        KlEstimator::K1,
        KlEstimator::Abs,
        KlEstimator::K2,
        KlEstimator::K3,
        KlEstimator::K1Plus,
        KlEstimator::AbsPlus,
        KlEstimator::K2Plus,
        KlEstimator::K3Plus,
    ];

    #[test]
    fn spec_vectors() {
        let v = |lp: f64, lq: f64, e| values(&kl_penalty(&row(&[lp]), &row(&[lq]), e))[0];
        assert!((v(-1.0, -1.5, KlEstimator::K1) - 0.5).abs() < 1e-12);
        assert!((v(-1.0, -1.5, KlEstimator::K2) - 0.125).abs() < 1e-12);
        assert!((v(-1.0, -1.5, KlEstimator::K3) - 0.106531).abs() < 1e-6);
        assert!((v(-2.0, -1.0, KlEstimator::K1) + 1.0).abs() < 1e-12);
        assert!((v(-2.0, -1.0, KlEstimator::K2) - 0.5).abs() < 1e-12);
        assert!((v(-2.0, -1.0, KlEstimator::K3) - 0.718282).abs() < 1e-6);
        assert!((v(-2.0, -1.0, KlEstimator::Abs) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn kl1_zero_at_equality_and_nonnegative() {
        for e in ALL {
            assert_eq!(
                values(&kl_penalty(&row(&[-0.7]), &row(&[-0.7]), e))[0],
                0.0,
                "{e:?}"
            );
        }
        let lp = row(&[-3.0, -0.1, -1.0]);
        let lq = row(&[-0.2, -2.0, -1.5]);
        for e in [KlEstimator::K2, KlEstimator::K3] {
            assert!(values(&kl_penalty(&lp, &lq, e)).iter().all(|&x| x >= 0.0));
        }
        // k3's clamp at 10.
        assert_eq!(
            values(&kl_penalty(&row(&[-30.0]), &row(&[0.0]), KlEstimator::K3))[0],
            10.0
        );
    }

    #[test]
    fn kl2_plus_forms_have_base_value_and_k2_gradient() {
        let lq = row(&[-1.5, -0.3, -2.0]);
        let x0 = [-1.0, -0.9, -0.4];
        for (plus, base) in [
            (KlEstimator::K1Plus, KlEstimator::K1),
            (KlEstimator::AbsPlus, KlEstimator::Abs),
            (KlEstimator::K3Plus, KlEstimator::K3),
        ] {
            assert_eq!(
                values(&kl_penalty(&row(&x0), &lq, plus)),
                values(&kl_penalty(&row(&x0), &lq, base))
            );
            let x = row(&x0).set_requires_grad(true);
            kl_penalty(&x, &lq, plus).sum(tch::Kind::Double).backward();
            let g = values(&x.grad());
            let want: Vec<f64> = x0.iter().zip(values(&lq)).map(|(a, b)| a - b).collect();
            for (a, b) in g.iter().zip(&want) {
                assert!((a - b).abs() < 1e-12);
            }
        }
    }

    #[test]
    fn estimator_gradients_match_finite_differences() {
        let lq = row(&[-1.5, -0.3, -2.0]);
        for e in [
            KlEstimator::K1,
            KlEstimator::Abs,
            KlEstimator::K2,
            KlEstimator::K3,
        ] {
            check_grad(&[-1.0, -0.9, -0.4], |x| {
                kl_penalty(x, &lq, e).sum(tch::Kind::Double)
            });
        }
    }

    #[test]
    fn kl3_in_reward_only_on_model_tokens_and_controller() {
        let r = row(&[0.0, 0.0, 1.0]);
        let (out, kl) = kl_in_reward(
            &r,
            &row(&[-1.0, -5.0, -2.0]),
            &row(&[-1.5, 0.0, -1.0]),
            &row(&[1.0, 0.0, 1.0]),
            0.1,
            KlEstimator::K1,
        );
        let o = values(&out);
        assert!((o[0] + 0.05).abs() < 1e-12 && o[1] == 0.0 && (o[2] - 1.1).abs() < 1e-12);
        assert!((kl + 0.25).abs() < 1e-12);
        let mut c = KlController::Adaptive {
            beta: 0.1,
            target: 0.1,
            horizon: 100.0,
        };
        c.update(1.0, 10.0); // err clipped to 0.2 → β·(1 + 0.02)
        assert!((c.beta() - 0.102).abs() < 1e-12);
        let mut f = KlController::Fixed { beta: 0.3 };
        f.update(5.0, 10.0);
        assert_eq!(f.beta(), 0.3);
        assert_eq!(
            serde_json::from_str::<KlEstimator>("\"low_var_kl\"").expect("alias"),
            KlEstimator::K3
        );
    }
}
