//! ARMOR's mixed-probability ratio (spec §4.2): PPO on a token-level mixture of the current
//! (or old) policy and the reference ("anchor") policy.
//!
//! ```text
//! q_θ,t   = log( r·exp(logp_t)     + (1 − r)·exp(logp_ref_t) )
//! q_old,t = log( r·exp(logp_old_t) + (1 − r)·exp(logp_ref_t) )
//! ρ̃_t     = exp(q_θ,t − q_old,t)
//! loss    = vanilla PPO (§1.1) on the log-ratio q_θ − q_old: ε 0.2 / 0.28, dual-clip c = 10,
//!           token-mean; r = 0.9375 (15/16; 0.875 for the 8B recipe)
//! ```
//! Gradient: `∇ρ̃ = r·π_θ·∇logπ_θ / π̃_old`, bounded because `π̃_old ≥ (1 − r)·π_ref`.
//!
//! Invariants:
//! - AR-1: with `r = 1` the mixed ratio equals the plain ratio.
//! - AR-2: `q` is computed with `logaddexp`, so it is finite whenever either input is.

use tch::Tensor;

use crate::algo::ppo::{clip_surrogate, select, ClipBounds, TokenLoss};

/// `log(r·exp(a) + (1 − r)·exp(b))`, elementwise (AR-2); `r` in (0, 1].
pub fn mixed_logp(logp: &Tensor, logp_ref: &Tensor, r: f64) -> Tensor {
    if r >= 1.0 {
        return logp.shallow_clone();
    }
    (logp + r.ln()).logaddexp(&(logp_ref.to_kind(logp.kind()) + (1.0 - r).ln()))
}

/// The mixed log-ratio `q_θ − q_old` (module doc).
pub fn mixed_log_ratio(
    logp: &Tensor,
    old_logp: &Tensor,
    logp_ref: &Tensor,
    mask: &Tensor,
    r: f64,
) -> Tensor {
    let lp = select(logp, mask);
    let old = select(&old_logp.to_kind(logp.kind()), mask);
    let rf = select(&logp_ref.to_kind(logp.kind()), mask).detach();
    mixed_logp(&lp, &rf, r) - mixed_logp(&old, &rf, r)
}

/// ARMOR's policy loss: vanilla PPO (with dual-clip when `clip.dual` is set) on the mixed ratio.
pub fn armor_loss(
    logp: &Tensor,
    old_logp: &Tensor,
    logp_ref: &Tensor,
    adv: &Tensor,
    mask: &Tensor,
    r: f64,
    clip: ClipBounds,
) -> TokenLoss {
    clip_surrogate(
        &mixed_log_ratio(logp, old_logp, logp_ref, mask, r),
        adv,
        mask,
        clip,
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::aggregation::masked_mean;
    use crate::algo::ppo::tests::{check_grad, row, values};

    #[test]
    fn spec_vectors() {
        for ((lp, old, rf), plain, mixed) in [
            ((-1.0, -1.2, -0.5), 1.221403, 1.171939),
            ((-5.0, -6.0, -0.3), std::f64::consts::E, 1.039324),
        ] {
            let x = mixed_log_ratio(&row(&[lp]), &row(&[old]), &row(&[rf]), &row(&[1.0]), 0.875);
            assert!((values(&x.exp())[0] - mixed).abs() < 1e-6);
            let p = mixed_log_ratio(&row(&[lp]), &row(&[old]), &row(&[rf]), &row(&[1.0]), 1.0);
            assert!((values(&p.exp())[0] - plain).abs() < 1e-6, "AR-1");
        }
    }

    #[test]
    fn armor_gradient_matches_finite_differences() {
        let old = row(&[-1.2, -6.0, -0.7, -2.0]);
        let rf = row(&[-0.5, -0.3, -3.0, -1.0]);
        let adv = row(&[1.0, -1.0, 0.5, 2.0]);
        let mask = row(&[1.0, 1.0, 1.0, 0.0]);
        let c = ClipBounds {
            low: 0.2,
            high: 0.28,
            dual: Some(10.0),
        };
        check_grad(&[-1.0, -5.0, -0.65, -1.0], |x| {
            masked_mean(&armor_loss(x, &old, &rf, &adv, &mask, 0.875, c).loss, &mask)
        });
    }
}
