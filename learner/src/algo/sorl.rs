//! SORL (SO-PPO / SO-GRPO, spec §6): a turn-level importance ratio shared by the tokens of a
//! turn, and clipping-triggered normalisation (CTN).
//!
//! Turn-level ratio — GSPO's segment ratio ([`crate::algo::gspo`]) with one segment per turn
//! (a maximal run of model tokens), geometric mean, stop-gradient routing, ε = 0.2 (SAMPO uses
//! the same per-turn ratio with GSPO's bounds, its layout-P records being turns):
//! ```text
//! ρ_k = exp( Σ_{t∈k} m_t (logp_t − logp_old_t) / |k| ) ;  s_t = sg(ρ_k)·exp(logp_t − sg(logp_t))
//! L_t = max(−A_t s_t, −A_t clip(s_t, 1 − ε, 1 + ε))
//! ```
//! CTN — **keel's choice** (the paper's formula is not public; this is the spec's PROPOSAL,
//! marked experimental), per sample i:
//! ```text
//! b_i = | Σ_{t∈i} m_t · (s_t − clip(s_t, 1 − ε_low, 1 + ε_high)) · A_t |      (clipping-bias magnitude)
//! w_i = 1 / max(1, b_i / δ)                                          (acts only when b_i > δ)
//! loss = agg(sg(w_i) · L_t)                                          (token-mean in SO-* presets)
//! ```
//! Metrics: `turn_ratio_{mean,min,max}` over turns with a valid token, `ctn_trigger_frac` =
//! fraction of samples with `b_i > δ`.
//!
//! Invariants:
//! - SO-1: with every `b_i ≤ δ` the loss equals the plain turn-level loss (weights 1).
//! - SO-2: the weights are constants: CTN rescales a sample's gradient, never adds a path.
//! - SO-3: a turn's tokens share one ratio value; tokens of other turns do not affect it.

use tch::{Kind, Tensor};

use crate::algo::gspo::segment_log_ratio;
use crate::algo::ppo::{clip_surrogate, select, ClipBounds, TokenLoss};
use crate::step_metrics::{Stat, Stats};

/// Turn-ratio statistics (module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TurnStats {
    /// Mean of `ρ_k` over turns with a valid token.
    pub ratio_mean: f64,
    /// Smallest `ρ_k`.
    pub ratio_min: f64,
    /// Largest `ρ_k`.
    pub ratio_max: f64,
    /// Fraction of samples whose CTN weight is below 1.
    pub ctn_trigger_frac: f64,
}

impl TurnStats {
    /// These statistics by name (docs/metrics-learner.md).
    pub fn named(&self) -> Stats {
        Stats::new()
            .with(Stat::TurnRatioMean, self.ratio_mean)
            .with(Stat::TurnRatioMin, self.ratio_min)
            .with(Stat::TurnRatioMax, self.ratio_max)
            .with(Stat::CtnTriggerFrac, self.ctn_trigger_frac)
    }
}

/// Turn ratios `ρ_k` of turns that have at least one valid token (row-major order).
pub fn turn_ratios(
    logp: &Tensor,
    old_logp: &Tensor,
    mask: &Tensor,
    turns: &Tensor,
    n_turns: i64,
) -> Vec<f64> {
    tch::no_grad(|| {
        let b = logp.size()[0];
        let lr = select(&(logp - old_logp.to_kind(logp.kind())), mask).to_kind(Kind::Double);
        let seg = select(turns, mask).to_kind(Kind::Int64);
        let m = select(&mask.to_kind(Kind::Double), mask);
        let zeros = Tensor::zeros([b, n_turns.max(1)], (Kind::Double, logp.device()));
        let sums = zeros.scatter_add(1, &seg, &(lr * &m));
        let counts = zeros.scatter_add(1, &seg, &m);
        let keep = counts.gt(0.0);
        let ratios = (sums / counts.clamp_min(1.0)).exp().masked_select(&keep);
        Vec::<f64>::try_from(&ratios).unwrap_or_default()
    })
}

/// CTN weights `w_i` `[B, 1]` (constants) and the trigger fraction, from the surrogate ratio
/// `s` `[B, T]` (module doc).
pub fn ctn_weights(
    s: &Tensor,
    adv: &Tensor,
    mask: &Tensor,
    eps_low: f64,
    eps_high: f64,
    delta: f64,
) -> (Tensor, f64) {
    tch::no_grad(|| {
        let s = select(&s.detach().to_kind(Kind::Double), mask);
        let a = select(&adv.to_kind(Kind::Double), mask);
        let bias = ((&s - s.clamp(1.0 - eps_low, 1.0 + eps_high)) * a)
            .sum_dim_intlist(1, true, Kind::Double)
            .abs();
        let w = (&bias / delta).clamp_min(1.0).reciprocal();
        let frac = bias
            .gt(delta)
            .to_kind(Kind::Double)
            .mean(Kind::Double)
            .double_value(&[]);
        (w, frac)
    })
}

/// SO-PPO / SO-GRPO per-token loss (module doc); `ctn_delta` None turns CTN off. `turns`
/// `[B, T]` holds each token's turn index in `0..n_turns`.
#[allow(clippy::too_many_arguments)] // the tensors of one loss, all required
pub fn turn_level_loss(
    logp: &Tensor,
    old_logp: &Tensor,
    adv: &Tensor,
    mask: &Tensor,
    turns: &Tensor,
    n_turns: i64,
    clip: ClipBounds,
    ctn_delta: Option<f64>,
) -> (TokenLoss, TurnStats) {
    let x = segment_log_ratio(logp, old_logp, mask, turns, n_turns);
    let clip = ClipBounds { dual: None, ..clip };
    let (weights, frac) = match ctn_delta {
        Some(delta) => {
            let (w, f) = ctn_weights(&x.exp(), adv, mask, clip.low, clip.high, delta);
            (Some(w.to_kind(logp.kind())), f)
        }
        None => (None, 0.0),
    };
    let out = clip_surrogate(&x, adv, mask, clip, weights.as_ref());
    let rs = turn_ratios(logp, old_logp, mask, turns, n_turns);
    let stats = if rs.is_empty() {
        TurnStats {
            ratio_mean: 1.0,
            ratio_min: 1.0,
            ratio_max: 1.0,
            ctn_trigger_frac: frac,
        }
    } else {
        TurnStats {
            ratio_mean: rs.iter().sum::<f64>() / rs.len() as f64,
            ratio_min: rs.iter().copied().fold(f64::INFINITY, f64::min),
            ratio_max: rs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            ctn_trigger_frac: frac,
        }
    };
    (out, stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::aggregation::masked_mean;
    use crate::algo::gspo::segment_mean;
    use crate::algo::ppo::tests::{check_grad_against, row, values};

    fn turns() -> Tensor {
        Tensor::from_slice(&[0i64, 0, 0, 1, 1, 1]).view([1, 6])
    }

    #[test]
    fn so3_turn_ratios_are_per_turn_geometric_means() {
        let lp = row(&[0.1, 0.3, 0.0, 0.0, -0.2, -0.4]);
        let mask = row(&[1.0, 1.0, 0.0, 0.0, 1.0, 1.0]);
        let r = turn_ratios(&lp, &row(&[0.0; 6]), &mask, &turns(), 2);
        assert_eq!(r.len(), 2);
        assert!((r[0] - 0.2f64.exp()).abs() < 1e-12 && (r[1] - (-0.3f64).exp()).abs() < 1e-12);
    }

    #[test]
    fn so1_ctn_is_inactive_below_delta_and_scales_above() {
        let s = row(&[1.5, 1.5, 1.0, 1.0]);
        let adv = row(&[2.0, 2.0, 2.0, 2.0]);
        let mask = row(&[1.0; 4]);
        // bias = |(1.5 − 1.2)·2·2| = 1.2.
        let (w, f) = ctn_weights(&s, &adv, &mask, 0.2, 0.2, 5.0);
        assert_eq!((values(&w), f), (vec![1.0], 0.0));
        let (w, f) = ctn_weights(&s, &adv, &mask, 0.2, 0.2, 0.6);
        assert!((values(&w)[0] - 0.5).abs() < 1e-12 && f == 1.0);
    }

    #[test]
    fn turn_level_gradient_matches_finite_differences() {
        let old = row(&[-1.0, -1.2, 0.0, 0.0, -0.9, -2.0]);
        let adv = row(&[0.5, 0.5, 0.0, 0.0, 0.5, 0.5]);
        let mask = row(&[1.0, 1.0, 0.0, 0.0, 1.0, 1.0]);
        let x0 = [-1.05, -1.1, -0.3, -7.0, -0.5, -1.5]; // turn 1 is clipped (ρ ≈ 1.57)
        for delta in [None, Some(1e-3)] {
            let f = |x: &Tensor| {
                masked_mean(
                    &turn_level_loss(
                        x,
                        &old,
                        &adv,
                        &mask,
                        &turns(),
                        2,
                        ClipBounds {
                            low: 0.2,
                            high: 0.2,
                            dual: None,
                        },
                        delta,
                    )
                    .0
                    .loss,
                    &mask,
                )
            };
            // The true objective: the turn ratio differentiated through its geometric mean, with
            // the CTN weight frozen at its value at x0.
            let w0 = match delta {
                Some(d) => {
                    let s = segment_log_ratio(&row(&x0), &old, &mask, &turns(), 2).exp();
                    values(&ctn_weights(&s, &adv, &mask, 0.2, 0.2, d).0)[0]
                }
                None => 1.0,
            };
            let full = |x: &Tensor| {
                let xs = segment_mean(&(x - &old), &mask, &turns(), 2);
                let c = ClipBounds {
                    low: 0.2,
                    high: 0.2,
                    dual: None,
                };
                masked_mean(&clip_surrogate(&xs, &adv, &mask, c, None).loss, &mask) * w0
            };
            // Token-mean over 4 tokens of per-turn means: the true gradient of turn k is
            // (|k|/4)·∂/∂x of the turn's mean objective; the stop-gradient form gives the same
            // because every token of the turn carries the ratio.
            check_grad_against(&x0, &f, &full);
        }
    }
}
