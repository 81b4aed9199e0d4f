//! RTPO sibling-group advantages and the branched-turn loss mask (spec §7.2; **keel's
//! choice** where the spec marks a PROPOSAL).
//!
//! Siblings are the G rollouts branched from the same boundary state `S_k` (the exact context
//! before turn k). PROPOSAL adopted: group-relative advantages over siblings, GRPO-style:
//! ```text
//! A_{k,j} = (R_j − mean_j R) / (std_j R + ε)       (unbiased std, singleton → mean 0, std 1)
//! ```
//! and the loss covers only the tokens of the branched turn `k` (downstream tokens are
//! discarded); the clipped PPO/GRPO surrogate with ε = 0.2 is applied to them.
//!
//! Runtime gap: keel's generators do not yet branch reverse trees, so the learner treats each
//! rollout group (one task, one shared prompt) as the siblings of boundary `S_1` and trains on
//! turn 1 of each trajectory only (branch turn 0). The functions below take any boundary key and
//! branch turn, ready for tree rollouts.
//!
//! Invariants:
//! - RT-1: the branched-turn mask is a subset of the loss mask and covers exactly the tokens of
//!   the branch turn's span.
//! - RT-2: siblings with equal rewards get advantage 0.

use tch::Tensor;

use crate::algo::grpo::group_advantages;

/// Sibling advantages: GRPO over `boundary_keys` (module doc).
pub fn sibling_advantages(rewards: &[f64], boundary_keys: &[u64], eps: f64) -> Vec<f64> {
    group_advantages(rewards, boundary_keys, true, eps)
}

/// `mask` restricted, per row, to the span `[start, end)` of that row's branch turn (RT-1).
/// A row with no span keeps nothing.
pub fn branch_turn_mask(mask: &Tensor, spans: &[Option<(usize, usize)>]) -> Tensor {
    let size = mask.size();
    let (b, t) = (size[0] as usize, size[1] as usize);
    let mut keep = vec![0f32; b * t];
    for (i, span) in spans.iter().enumerate().take(b) {
        if let Some((s, e)) = span {
            for j in *s..(*e).min(t) {
                keep[i * t + j] = 1.0;
            }
        }
    }
    let keep = Tensor::from_slice(&keep)
        .view([size[0], size[1]])
        .to_device(mask.device())
        .to_kind(mask.kind());
    (mask * keep).to_kind(mask.kind()).where_self(
        &mask.gt(0.0),
        &Tensor::zeros([], (mask.kind(), mask.device())),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::grpo::GRPO_EPS;
    use tch::Kind;

    #[test]
    fn rt1_branch_mask_is_the_turn_span() {
        let mask = Tensor::from_slice(&[0f32, 1., 1., 0., 1., 1.]).view([1, 6]);
        let m = branch_turn_mask(&mask, &[Some((4, 6))]);
        assert_eq!(
            Vec::<f32>::try_from(&m.view([-1])).expect("m"),
            vec![0., 0., 0., 0., 1., 1.]
        );
        let none = branch_turn_mask(&mask, &[None]);
        assert_eq!(none.sum(Kind::Float).double_value(&[]), 0.0);
    }

    #[test]
    fn rt2_equal_siblings_get_zero() {
        let a = sibling_advantages(&[1.0, 1.0, 1.0, 0.0, 1.0], &[4, 4, 4, 8, 8], GRPO_EPS);
        assert_eq!(&a[..3], &[0.0, 0.0, 0.0]);
        assert!(a[3] < 0.0 && a[4] > 0.0);
    }
}
