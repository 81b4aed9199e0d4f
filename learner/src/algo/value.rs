//! The critic: value loss (spec §1.3, verl `compute_value_loss`; SAO §3.2), explained variance,
//! and the critic schedule (SAO's faster value updates, critic-only warm-up, frozen groups).
//!
//! ```text
//! clipped   : Vc = clamp(V, V_old − c, V_old + c) ;  loss = ½·agg(max((V − R)², (Vc − R)²))
//! unclipped : loss = ½·agg((V − R)²)                 (SAO: keel's choice for the PROPOSAL)
//! explained_var = 1 − Var_m(R − V) / Var_m(R)        (mask-1 tokens, verl `vf_explained_var`)
//! vf_clipfrac   = mean_m[(Vc − R)² > (V − R)²]        (mask-1 tokens, verl `vf_clipfrac`; 0 unclipped)
//! ```
//! Critic schedule, per `train_step` number `u` (0-based):
//! ```text
//! critic_steps(u) = K                 value-only optimizer steps per mini-batch (0 = joint loss)
//! actor_step(u)   = u ≥ warmup        the first `warmup` updates train only the critic
//! ```
//! The critic is either the value head on the policy's trunk ([`CriticModel::Shared`]) or a
//! separate value model of its own — backbone + `score` head, its own AdamW — as SAO (spec §3)
//! and verl's critic worker have it ([`CriticModel::Separate`]). During value-only steps only
//! parameters whose names start with one of `trainable` move (the rest is frozen; empty =
//! every parameter of the critic). A shared critic's value-only steps default to `["score"]`:
//! they must not move the policy. A separate critic trains everything by default (the spec's
//! dense critic) and always takes at least one value step per mini-batch (there is no joint
//! loss with a model the actor does not own).
//!
//! Invariants:
//! - VL-1: with `clip` None or a clip range no value moved beyond, both forms agree.
//! - VL-2: explained variance is 1 for a perfect critic and 0 for a constant critic at the
//!   mean return.
//! - CS-1: `actor_step` is false exactly for the first `warmup` updates; with K = 0 the value
//!   loss joins the actor loss (`value_coef`), as in verl PPO.

use tch::{Kind, Tensor};

use crate::algo::aggregation::{agg_loss, AggDenominators, AggMode};
use crate::algo::ppo::select;

/// `Vc = clamp(V, V_old − c, V_old + c)`, exactly `V` inside the band (so a value the clip did
/// not move ties with itself, as in verl's `clip_by_value`; `V_old + clamp(V − V_old, ±c)`
/// would differ by rounding and count as clipped).
fn clipped_values(values: &Tensor, old_values: &Tensor, c: f64) -> Tensor {
    let old = old_values.to_kind(values.kind());
    values.clamp_tensor(Some(&(&old - c)), Some(&(&old + c)))
}

/// `½·agg(max((V − R)², (Vc − R)²))`, or `½·agg((V − R)²)` when `clip` is None.
pub fn value_loss(
    values: &Tensor,
    old_values: &Tensor,
    returns: &Tensor,
    mask: &Tensor,
    clip: Option<f64>,
    mode: AggMode,
    den: &AggDenominators,
) -> Tensor {
    let ret = returns.to_kind(values.kind());
    let err = (values - &ret).square();
    let err = match clip {
        Some(c) => err.maximum(&(clipped_values(values, old_values, c) - &ret).square()),
        None => err,
    };
    agg_loss(&select(&err, mask), mask, mode, den) * 0.5
}

/// Fraction of mask-1 tokens where the clipped value error is the larger one, i.e. where the
/// clip decided the loss (verl `vf_clipfrac`); 0 when `clip` is None.
pub fn value_clip_frac(
    values: &Tensor,
    old_values: &Tensor,
    returns: &Tensor,
    mask: &Tensor,
    clip: Option<f64>,
) -> f64 {
    let Some(c) = clip else {
        return 0.0;
    };
    tch::no_grad(|| {
        let v = values.detach().to_kind(Kind::Double);
        let ret = returns.to_kind(Kind::Double);
        let vc = clipped_values(&v, &old_values.to_kind(Kind::Double), c);
        let clipped = (vc - &ret).square().gt_tensor(&(v - &ret).square());
        crate::algo::aggregation::masked_mean_value(&clipped.to_kind(Kind::Double), mask)
    })
}

/// `1 − Var(R − V)/Var(R)` over mask-1 tokens (VL-2); 0 when fewer than two tokens or `Var(R) = 0`.
pub fn explained_variance(values: &Tensor, returns: &Tensor, mask: &Tensor) -> f64 {
    tch::no_grad(|| {
        let keep = mask.gt(0.0);
        let v = values.detach().to_kind(Kind::Double).masked_select(&keep);
        let r = returns.detach().to_kind(Kind::Double).masked_select(&keep);
        if r.numel() < 2 {
            return 0.0;
        }
        let var = |x: &Tensor| x.var(true).double_value(&[]);
        let vr = var(&r);
        if vr <= 0.0 {
            return 0.0;
        }
        1.0 - var(&(&r - &v)) / vr
    })
}

/// Where the critic's values come from (module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CriticModel {
    /// The `score` head on the policy's trunk.
    Shared,
    /// A value model of its own (policy architecture, `score` head, no LM head), own AdamW.
    Separate,
}

/// When and what the critic trains (module doc).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CriticSchedule {
    /// `K`: value-only optimizer steps per mini-batch; 0 = value loss joined to the actor loss.
    pub steps_per_actor_step: usize,
    /// Updates at the start that train only the critic.
    pub warmup_updates: u64,
    /// Critic learning rate as a multiple of the actor's (SAO: 5e-6 / 1e-6 = 5).
    pub lr_ratio: f64,
    /// Parameter-name prefixes that value-only steps may move; the rest is frozen.
    pub trainable: Vec<String>,
    /// Weight of the value loss in the joint loss (K = 0).
    pub value_coef: f64,
    /// Value clip range, or None for the unclipped loss.
    pub value_clip: Option<f64>,
    /// The value head on the policy's trunk, or a separate value model.
    pub model: CriticModel,
}

impl CriticSchedule {
    /// Whether update `u` (0-based) takes actor steps (CS-1).
    pub fn actor_step(&self, update: u64) -> bool {
        update >= self.warmup_updates
    }

    /// Whether value-only steps may move the parameter called `name` (empty = every one).
    pub fn is_trainable(&self, name: &str) -> bool {
        self.trainable.is_empty() || self.trainable.iter().any(|p| name.starts_with(p.as_str()))
    }

    /// Value-only optimizer steps per mini-batch in an update with (`actor`) or without actor
    /// steps: `K`, at least 1 during the warm-up, and at least 1 for a separate critic.
    pub fn value_steps(&self, actor: bool) -> usize {
        if !actor || self.model == CriticModel::Separate {
            self.steps_per_actor_step.max(1)
        } else {
            self.steps_per_actor_step
        }
    }

    /// Whether the value loss joins the actor's loss (`value_coef`): a shared critic with K = 0.
    pub fn joint(&self) -> bool {
        self.model == CriticModel::Shared && self.steps_per_actor_step == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::ppo::tests::{check_grad, row};

    fn den(mask: &Tensor) -> AggDenominators {
        AggDenominators::of(mask, None)
    }

    /// The token-mean value loss of one token: value `v`, old value `old`, return `ret`.
    fn one(v: f64, old: f64, ret: f64, clip: Option<f64>) -> f64 {
        let m = row(&[1.0]);
        value_loss(
            &row(&[v]),
            &row(&[old]),
            &row(&[ret]),
            &m,
            clip,
            AggMode::TokenMean,
            &den(&m),
        )
        .double_value(&[])
    }

    #[test]
    fn clipped_value_loss_vectors() {
        // V moved to 2 from 0, clip 0.5 → Vc = 0.5; max(1, .25) → ½.
        assert!((one(2.0, 0.0, 1.0, Some(0.5)) - 0.5).abs() < 1e-12);
        // V = 0.8: unclipped .04, clipped (0.5) .25 → ½·.25.
        assert!((one(0.8, 0.0, 1.0, Some(0.5)) - 0.125).abs() < 1e-12);
        assert!((one(0.8, 0.0, 1.0, None) - 0.02).abs() < 1e-12);
    }

    #[test]
    fn vl1_forms_agree_inside_the_clip_range() {
        let m = row(&[1.0, 1.0, 0.0]);
        let (v, old, r) = (
            row(&[0.3, 0.5, 9.0]),
            row(&[0.2, 0.6, 0.0]),
            row(&[1.0, 0.0, 1.0]),
        );
        let a =
            value_loss(&v, &old, &r, &m, Some(0.5), AggMode::TokenMean, &den(&m)).double_value(&[]);
        let b = value_loss(&v, &old, &r, &m, None, AggMode::TokenMean, &den(&m)).double_value(&[]);
        assert!((a - b).abs() < 1e-12);
    }

    #[test]
    fn value_loss_gradient_matches_finite_differences() {
        let m = row(&[1.0, 1.0, 0.0, 1.0]);
        let (old, r) = (row(&[0.0, 0.5, 0.0, 1.0]), row(&[1.0, -1.0, 2.0, 0.2]));
        check_grad(&[0.3, 1.2, 0.4, 0.6], |v| {
            value_loss(
                v,
                &old,
                &r,
                &m,
                Some(0.5),
                AggMode::SeqMeanTokenMean,
                &den(&m),
            )
        });
    }

    #[test]
    fn vl2_explained_variance() {
        let m = row(&[1.0, 1.0, 1.0, 0.0]);
        let r = row(&[1.0, 2.0, 3.0, 100.0]);
        assert!((explained_variance(&r, &r, &m) - 1.0).abs() < 1e-12);
        assert!(explained_variance(&row(&[2.0; 4]), &r, &m).abs() < 1e-12);
    }

    #[test]
    fn cs1_warmup_and_trainable_groups() {
        let s = CriticSchedule {
            steps_per_actor_step: 2,
            warmup_updates: 3,
            lr_ratio: 5.0,
            trainable: vec!["score".into()],
            value_coef: 0.5,
            value_clip: None,
            model: CriticModel::Shared,
        };
        assert_eq!(
            (0..5).map(|u| s.actor_step(u)).collect::<Vec<_>>(),
            vec![false, false, false, true, true]
        );
        assert!(
            s.is_trainable("score.weight")
                && !s.is_trainable("model.layers.0.self_attn.q_proj.weight")
        );
    }
}
