//! Rollout correction (verl `rollout_corr_helper`, slime `--use-tis`): the behaviour log-probs
//! π_rollout come from the generator (an inference engine, or stale weights), while the ratio's
//! denominator π_old is recomputed by the learner (`ratio_base = "recompute"`). Their gap is
//! corrected by truncated importance sampling and, optionally, by rejecting whole sequences:
//!
//! ```text
//! δ_t      = π_old_t − π_rollout_t                     (log space, over the mask)
//! token:     w_t = min(exp(clamp(δ_t, −20, 20)), τ)    τ = rollout_is_threshold (2.0)
//! sequence:  w_t = min(exp(clamp(Σ_s δ_s, −20, 20)), τ) for every token of the sequence
//! loss_t   ← loss_t · sg(w_t)
//! reject (sequence: Σ δ, geometric: mean δ) a sequence whose exp(·) is outside [1/ρ, ρ]:
//!            its mask becomes 0 (its advantages are 0, its group statistics unchanged)
//! ```
//!
//! Invariants:
//! - RCO-1: weights are constants (no gradient flows through them) and are 0 off the mask.
//! - RCO-2: on-policy (δ = 0) every weight is 1 and nothing is rejected: the correction is a
//!   no-op for the built-in sampler in a synchronous run.
//! - RCO-3: the statistics are over the mask *before* rejection: `mismatch` = mean |δ| over
//!   model tokens, `truncated` = share of model tokens (sequence level: of sequences) whose
//!   weight hit τ, `rejected` = share of sequences with model tokens that were rejected.

use tch::{Kind, Tensor};

/// verl's safety bound on log-ratios before `exp`.
const SAFETY_BOUND: f64 = 20.0;

/// At which level importance weights are taken (verl `rollout_is`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IsLevel {
    /// One weight per token (biased, low variance; the peers' TIS).
    Token,
    /// One weight per sequence: the product of its token ratios.
    Sequence,
}

/// How whole sequences are rejected (verl `rollout_rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectLevel {
    /// The sequence's ratio (product of token ratios).
    Sequence,
    /// The geometric mean of its token ratios.
    Geometric,
}

/// The correction's settings (`learner.rollout_is*`, `learner.rollout_rs*`).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RolloutCorrection {
    /// Importance weights, or None for none.
    pub is: Option<IsLevel>,
    /// τ, the weights' truncation (> 0).
    pub is_threshold: f64,
    /// Sequence rejection, or None for none.
    pub reject: Option<RejectLevel>,
    /// ρ > 1: a sequence is kept when its ratio is within [1/ρ, ρ].
    pub reject_threshold: f64,
}

/// What the correction gives one batch.
pub struct Correction {
    /// `[B, T]` weights for the policy loss (RCO-1), when importance weighting is on.
    pub weights: Option<Tensor>,
    /// The mask after rejection.
    pub mask: Tensor,
    /// Statistics (RCO-3).
    pub stats: CorrectionStats,
}

/// The correction's statistics (RCO-3).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CorrectionStats {
    /// Mean |π_old − π_rollout| over model tokens.
    pub mismatch: f64,
    /// Share of model tokens (sequence level: of sequences) whose weight was truncated.
    pub truncated: f64,
    /// Share of sequences with model tokens that were rejected.
    pub rejected: f64,
}

/// Mean |δ| over `mask` (RCO-3): the engine/trainer mismatch, also without any correction.
pub fn mismatch(old_logp: &Tensor, rollout_logp: &Tensor, mask: &Tensor) -> f64 {
    let delta = (old_logp - rollout_logp) * mask;
    ratio_of(&delta.abs().sum(Kind::Double), &mask.sum(Kind::Double))
}

/// `num / den` as f64, 0 when `den` is 0.
fn ratio_of(num: &Tensor, den: &Tensor) -> f64 {
    let d = den.double_value(&[]);
    if d > 0.0 {
        num.double_value(&[]) / d
    } else {
        0.0
    }
}

/// Applies `cfg` to one batch (module doc); `old_logp`, `rollout_logp` and `mask` are `[B, T]`.
pub fn correct(
    old_logp: &Tensor,
    rollout_logp: &Tensor,
    mask: &Tensor,
    cfg: &RolloutCorrection,
) -> Correction {
    let delta = ((old_logp - rollout_logp) * mask).detach();
    let tokens = mask.sum_dim_intlist(1, false, Kind::Float);
    let has_tokens = tokens.gt(0.0).to_kind(Kind::Float);
    let n_seqs = has_tokens.sum(Kind::Double);
    let seq_sum = delta.sum_dim_intlist(1, true, Kind::Float);
    let mut stats = CorrectionStats {
        mismatch: mismatch(old_logp, rollout_logp, mask),
        ..CorrectionStats::default()
    };
    let weights = cfg.is.map(|level| {
        let tau = cfg.is_threshold;
        let log_w = match level {
            IsLevel::Token => delta.shallow_clone(),
            IsLevel::Sequence => seq_sum.expand_as(&delta),
        };
        let w = log_w.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp() * mask;
        let over = w.gt(tau).to_kind(Kind::Float);
        stats.truncated = match level {
            IsLevel::Token => ratio_of(&(&over * mask).sum(Kind::Double), &mask.sum(Kind::Double)),
            IsLevel::Sequence => ratio_of(
                &(seq_sum.squeeze_dim(1).gt(tau.ln()).to_kind(Kind::Float) * &has_tokens)
                    .sum(Kind::Double),
                &n_seqs,
            ),
        };
        w.clamp_max(tau).detach()
    });
    let mask = match cfg.reject {
        None => mask.shallow_clone(),
        Some(level) => {
            let log_r = match level {
                RejectLevel::Sequence => seq_sum.shallow_clone(),
                RejectLevel::Geometric => &seq_sum / tokens.clamp_min(1.0).unsqueeze(1),
            };
            let bound = cfg.reject_threshold.ln();
            let keep = log_r
                .ge(-bound)
                .logical_and(&log_r.le(bound))
                .to_kind(Kind::Float);
            let dropped: Tensor = (1.0 - keep.squeeze_dim(1)) * &has_tokens;
            stats.rejected = ratio_of(&dropped.sum(Kind::Double), &n_seqs);
            mask * keep
        }
    };
    Correction {
        weights,
        mask,
        stats,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(rows: &[&[f64]]) -> Tensor {
        let flat: Vec<f32> = rows
            .iter()
            .flat_map(|r| r.iter().map(|&x| x as f32))
            .collect();
        Tensor::from_slice(&flat).reshape([rows.len() as i64, rows[0].len() as i64])
    }

    fn values(x: &Tensor) -> Vec<Vec<f64>> {
        Vec::<Vec<f64>>::try_from(x.to_kind(Kind::Double)).expect("values")
    }

    fn cfg(is: Option<IsLevel>, reject: Option<RejectLevel>) -> RolloutCorrection {
        RolloutCorrection {
            is,
            is_threshold: 2.0,
            reject,
            reject_threshold: 2.0,
        }
    }

    #[test]
    fn rc2_on_policy_is_a_no_op() {
        let lp = t(&[&[-1.0, -2.0, -0.5], &[-0.1, -0.2, 0.0]]);
        let mask = t(&[&[1.0, 1.0, 1.0], &[1.0, 1.0, 0.0]]);
        for level in [IsLevel::Token, IsLevel::Sequence] {
            let c = correct(
                &lp,
                &lp,
                &mask,
                &cfg(Some(level), Some(RejectLevel::Sequence)),
            );
            assert_eq!(values(&c.weights.expect("weights")), values(&mask));
            assert_eq!(values(&c.mask), values(&mask));
            assert_eq!(c.stats, CorrectionStats::default());
        }
    }

    /// Token weights against hand values: ratios 0.5, 3 (truncated to 2), 1; padding 0.
    #[test]
    fn rc1_token_weights_truncate_and_vanish_off_the_mask() {
        let rollout = t(&[&[-1.0, -2.0, -1.0, -1.0]]);
        let old = t(&[&[-1.0 + 0.5f64.ln(), -2.0 + 3f64.ln(), -1.0, 5.0]]);
        let mask = t(&[&[1.0, 1.0, 1.0, 0.0]]);
        let c = correct(&old, &rollout, &mask, &cfg(Some(IsLevel::Token), None));
        let w = &values(&c.weights.expect("weights"))[0];
        for (got, want) in w.iter().zip([0.5, 2.0, 1.0, 0.0]) {
            assert!((got - want).abs() < 1e-6, "{w:?}");
        }
        assert!((c.stats.truncated - 1.0 / 3.0).abs() < 1e-9);
        let gap = (0.5f64.ln().abs() + 3f64.ln()) / 3.0;
        assert!((c.stats.mismatch - gap).abs() < 1e-6);
    }

    /// Sequence weights are the product of the row's token ratios, truncated; rejection by
    /// the sequence ratio and by its geometric mean.
    #[test]
    fn sequence_weights_and_rejection() {
        let rollout = t(&[&[0.0, 0.0], &[0.0, 0.0], &[0.0, 0.0]]);
        // Row 0: ratios 1.2 · 1.2 = 1.44; row 1: 1.5 · 1.5 = 2.25; row 2: no model tokens.
        let old = t(&[
            &[1.2f64.ln(), 1.2f64.ln()],
            &[1.5f64.ln(), 1.5f64.ln()],
            &[9.0, 9.0],
        ]);
        let mask = t(&[&[1.0, 1.0], &[1.0, 1.0], &[0.0, 0.0]]);
        let c = correct(
            &old,
            &rollout,
            &mask,
            &cfg(Some(IsLevel::Sequence), Some(RejectLevel::Sequence)),
        );
        let w = values(&c.weights.expect("weights"));
        assert!((w[0][0] - 1.44).abs() < 1e-5 && (w[0][1] - 1.44).abs() < 1e-5);
        assert!((w[1][0] - 2.0).abs() < 1e-6, "truncated at τ: {w:?}");
        assert_eq!(w[2], vec![0.0, 0.0]);
        assert!((c.stats.truncated - 0.5).abs() < 1e-9, "1 of 2 sequences");
        assert_eq!(
            values(&c.mask),
            vec![vec![1.0, 1.0], vec![0.0, 0.0], vec![0.0, 0.0]]
        );
        assert!((c.stats.rejected - 0.5).abs() < 1e-9);
        // Geometric means 1.2 and 1.5 are both inside [1/2, 2]: nothing is rejected.
        let g = correct(
            &old,
            &rollout,
            &mask,
            &cfg(None, Some(RejectLevel::Geometric)),
        );
        assert!(g.weights.is_none());
        assert_eq!(values(&g.mask), values(&mask));
        assert_eq!(g.stats.rejected, 0.0);
    }
}
