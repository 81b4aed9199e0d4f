//! REINFORCE with truncated importance weights in bypass mode (spec §1.10, verl
//! `compute_policy_loss_bypass_mode`, `loss_type = "reinforce"`).
//!
//! ```text
//! w_t    = min( sg(exp(clamp(logp_t − logp_beh_t, −20, 20))), τ )     τ = rollout_is_threshold (2.0)
//! loss_t = −A_t · logp_t · w_t
//! ```
//!
//! Invariants:
//! - RF-1: the weight is a constant: the gradient is exactly `−A_t·w_t·∇logp_t`.
//! - RF-2: with `τ = None` the weight is the untruncated ratio.

use tch::Tensor;

use crate::algo::ppo::select;

/// Per-token REINFORCE loss (module doc).
pub fn reinforce_loss(
    logp: &Tensor,
    beh_logp: &Tensor,
    adv: &Tensor,
    mask: &Tensor,
    threshold: Option<f64>,
) -> Tensor {
    let lr = select(&(logp.detach() - beh_logp.to_kind(logp.kind())), mask).clamp(-20.0, 20.0);
    let mut w = lr.exp();
    if let Some(tau) = threshold {
        w = w.clamp_max(tau);
    }
    let a = select(&adv.to_kind(logp.kind()), mask);
    select(&(-(a * w) * select(logp, mask)), mask)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::aggregation::masked_mean;
    use crate::algo::ppo::tests::{check_grad_against, row, values};

    #[test]
    fn rf2_weights_truncate_at_threshold() {
        // logp = 1, A = −1: loss = w.
        let beh = row(&[1.0 - 0.5f64.ln(), 1.0 - 3f64.ln()]);
        assert_eq!(
            values(&reinforce_loss(
                &row(&[1.0, 1.0]),
                &beh,
                &row(&[-1.0, -1.0]),
                &row(&[1.0, 1.0]),
                Some(2.0)
            ))
            .iter()
            .map(|v| (v * 1e9).round() / 1e9)
            .collect::<Vec<_>>(),
            vec![0.5, 2.0]
        );
        let untruncated = values(&reinforce_loss(
            &row(&[1.0, 1.0]),
            &beh,
            &row(&[-1.0, -1.0]),
            &row(&[1.0, 1.0]),
            None,
        ));
        assert!((untruncated[1] - 3.0).abs() < 1e-9);
    }

    #[test]
    fn rf1_gradient_matches_finite_differences() {
        let beh = row(&[-1.0, -2.0, -0.5]);
        let adv = row(&[1.0, -0.5, 2.0]);
        let mask = row(&[1.0, 1.0, 0.0]);
        let x0 = [-0.9, -0.4, -0.2];
        let w = [(0.1f64).exp(), 2.0, 0.0];
        let f = |x: &Tensor| masked_mean(&reinforce_loss(x, &beh, &adv, &mask, Some(2.0)), &mask);
        let frozen = |x: &Tensor| masked_mean(&(-(row(&w) * &adv) * x), &mask);
        check_grad_against(&x0, &f, &frozen);
    }
}
