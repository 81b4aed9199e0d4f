//! The sequence-mask variant (spec §2.2, ARLArena `apply_seq_mask`, "GRPO_SM"): drop a whole
//! sequence whose advantage is negative and whose policy has drifted too far from the old one.
//!
//! ```text
//! drop_i = (A_i < 0) ∧ ( Σ_t m (logp_old − logp) / Σ_t m  >  δ )      δ = 0.223 (code) / 3e-3 (scripts)
//! m'_{i,t} = drop_i ? 0 : m_{i,t}
//! ```
//! `A_i` is the sequence's token-mean advantage.
//!
//! Invariants:
//! - MK-1: the new mask is a constant (no gradient flows through the decision) and is a subset
//!   of the old mask.

use tch::{Kind, Tensor};

use crate::algo::ppo::select;

/// The reduced mask and the fraction of sequences dropped (module doc).
pub fn sequence_mask(
    logp: &Tensor,
    old_logp: &Tensor,
    adv: &Tensor,
    mask: &Tensor,
    delta: f64,
) -> (Tensor, f64) {
    tch::no_grad(|| {
        let m = select(&mask.to_kind(Kind::Double), mask);
        let n = m.sum_dim_intlist(1, true, Kind::Double).clamp_min(1.0);
        let kl = select(
            &(old_logp.to_kind(Kind::Double) - logp.detach().to_kind(Kind::Double)),
            mask,
        )
        .sum_dim_intlist(1, true, Kind::Double)
            / &n;
        let a =
            select(&adv.to_kind(Kind::Double), mask).sum_dim_intlist(1, true, Kind::Double) / &n;
        let drop = a.lt(0.0).logical_and(&kl.gt(delta));
        let frac = drop
            .to_kind(Kind::Double)
            .mean(Kind::Double)
            .double_value(&[]);
        let new_mask = mask.where_self(
            &drop.logical_not(),
            &Tensor::zeros([], (mask.kind(), mask.device())),
        );
        (new_mask, frac)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sq1_drops_only_negative_drifted_sequences() {
        let t = |v: &[f64]| Tensor::from_slice(v).view([3, 2]);
        let logp = t(&[-1.5, -1.5, -1.5, -1.5, -1.0, -1.0]);
        let old = t(&[-1.0, -1.0, -1.0, -1.0, -1.0, -1.0]);
        let adv = t(&[-1.0, -1.0, 1.0, 1.0, -1.0, -1.0]);
        let mask = t(&[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]);
        let (m, frac) = sequence_mask(&logp, &old, &adv, &mask, 0.223);
        assert_eq!(
            Vec::<f64>::try_from(&m.view([-1])).expect("m"),
            vec![0.0, 0.0, 1.0, 1.0, 1.0, 0.0]
        );
        assert!((frac - 1.0 / 3.0).abs() < 1e-12);
    }
}
