//! The actor's loss on one micro-batch, in parts that each return their statistics by name
//! (verl's `(loss, metrics)`): the policy loss of the preset, the reference KL terms and the
//! joint value term.
//!
//! Invariants:
//! - AL-1: each part only reads the micro-batch's rows and adds its statistics to [`Stats`];
//!   the caller sums the loss terms in the order policy, entropy, KL, value (bit-identical to
//!   one expression).
//! - AL-2: layout P aggregates over turn records (spec §0.1) under the mini-batch's global
//!   denominators when given (MB-1), else under this micro-batch's.

use tch::Tensor;

use crate::algo::aggregation::{
    agg_loss, masked_mean_value, turn_records, AggDenominators, AggMode,
};
use crate::algo::armor::{armor_loss, ArmorInputs, ArmorLoss};
use crate::algo::gspo::gspo_loss;
use crate::algo::kl::{masked_kl, KlEstimator};
use crate::algo::ppo::vanilla_ppo;
use crate::algo::presets::{PolicyLossKind, PresetConfig};
use crate::algo::reinforce::reinforce_loss;
use crate::algo::sao::dis_loss;
use crate::algo::sorl::turn_level_loss;
use crate::algo::value::{explained_variance, value_clip_frac, value_loss};
use crate::error::LearnerError;
use crate::step_metrics::{Stat, Stats};
use crate::targets::{align_values, Targets};

/// The (policy, value) denominators of a whole mini-batch (MB-1).
pub(super) type Global = (AggDenominators, AggDenominators);

/// One micro-batch's rows of the targets.
pub(super) struct MicroRows {
    idx: Tensor,
    pub(super) tokens: Tensor,
    pub(super) mask: Tensor,
    pub(super) old_logp: Tensor,
    pub(super) adv: Tensor,
    pub(super) ref_logp: Option<Tensor>,
    /// Rollout correction weights (RCO-1), when on.
    pub(super) is_weights: Option<Tensor>,
}

impl MicroRows {
    /// The rows `rows` of `tg`, on `device`.
    pub(super) fn of(
        tg: &Targets,
        rows: &[i64],
        device: tch::Device,
    ) -> Result<Self, LearnerError> {
        let idx = Tensor::f_from_slice(rows)?.f_to_device(device)?;
        let pick = |t: &Tensor| t.f_index_select(0, &idx);
        Ok(MicroRows {
            tokens: pick(&tg.tokens)?,
            mask: pick(&tg.mask)?,
            old_logp: pick(&tg.old_logp)?,
            adv: pick(&tg.advantages)?,
            ref_logp: tg.ref_logp.as_ref().map(pick).transpose()?,
            is_weights: tg.is_weights.as_ref().map(pick).transpose()?,
            idx,
        })
    }

    /// These rows of `t`.
    pub(super) fn pick(&self, t: &Tensor) -> Result<Tensor, LearnerError> {
        Ok(t.f_index_select(0, &self.idx)?)
    }
}

/// Aggregates per-token terms over trajectories or turn records (AL-2).
pub(super) struct Records {
    turn_ids: Option<Tensor>,
    mask: Tensor,
    max_turns: i64,
    agg: AggMode,
    den: AggDenominators,
}

impl Records {
    /// The aggregation of `rows` under `agg`, with `global`'s policy denominators if given.
    pub(super) fn new(
        p: &PresetConfig,
        tg: &Targets,
        rows: &MicroRows,
        agg: AggMode,
        global: Option<&Global>,
    ) -> Result<Self, LearnerError> {
        let turn_ids = p
            .turn_records
            .then(|| rows.pick(&tg.turn_ids))
            .transpose()?;
        let mut r = Records {
            turn_ids,
            mask: rows.mask.shallow_clone(),
            max_turns: tg.max_turns,
            agg,
            den: AggDenominators {
                tokens: 0.0,
                seqs: 0.0,
                scale: 0.0,
            },
        };
        r.den = match global {
            Some((den, _)) => *den,
            None => AggDenominators::of(&r.records(&rows.mask).1, p.loss_scale_factor),
        };
        Ok(r)
    }

    fn records(&self, x: &Tensor) -> (Tensor, Tensor) {
        match &self.turn_ids {
            Some(ids) => turn_records(x, &self.mask, ids, self.max_turns),
            None => (x.shallow_clone(), self.mask.shallow_clone()),
        }
    }

    /// The aggregated loss of per-token `x`.
    pub(super) fn agg(&self, x: &Tensor) -> Tensor {
        let (xs, ms) = self.records(x);
        agg_loss(&xs, &ms, self.agg, &self.den)
    }
}

/// The preset's per-token policy loss, the aggregation it needs and its statistics.
pub(super) fn policy_token_loss(
    p: &PresetConfig,
    tg: &Targets,
    r: &MicroRows,
    logp: &Tensor,
) -> Result<(Tensor, AggMode, Stats), LearnerError> {
    let (old, adv, mask) = (&r.old_logp, &r.adv, &r.mask);
    Ok(match p.policy_loss {
        PolicyLossKind::Ppo => {
            let l = vanilla_ppo(logp, old, adv, mask, p.clip);
            (l.loss, p.agg, l.stats.named())
        }
        PolicyLossKind::Gspo => {
            let l = gspo_loss(logp, old, adv, mask, p.clip);
            // verl forces seq-mean-token-mean for GSPO
            (l.loss, AggMode::SeqMeanTokenMean, l.stats.named())
        }
        PolicyLossKind::TurnLevel { ctn_delta } => {
            let turns = r.pick(&tg.turn_ids)?;
            let (l, s) = turn_level_loss(
                logp,
                old,
                adv,
                mask,
                &turns,
                tg.max_turns,
                p.clip,
                ctn_delta,
            );
            let mut stats = l.stats.named();
            stats.extend(s.named().iter());
            (l.loss, p.agg, stats)
        }
        PolicyLossKind::Dis => {
            let beh = r.pick(&tg.behaviour_logp)?;
            let (l, masked, (lo, hi)) = dis_loss(logp, &beh, adv, mask, p.clip.low, p.clip.high);
            let stats = Stats::new()
                .with(Stat::DisMaskedFrac, masked)
                .with(Stat::DisKeptRatioMin, lo)
                .with(Stat::DisKeptRatioMax, hi)
                .with(Stat::ApproxKl, behaviour_kl(&beh, logp, mask));
            (l, p.agg, stats)
        }
        PolicyLossKind::Armor(opt) => armor_token_loss(p, tg, r, logp, &opt)?,
        PolicyLossKind::Reinforce { is_threshold } => {
            let beh = r.pick(&tg.behaviour_logp)?;
            let stats = Stats::new().with(Stat::ApproxKl, behaviour_kl(&beh, logp, mask));
            let l = reinforce_loss(logp, &beh, adv, mask, is_threshold);
            (l, p.agg, stats)
        }
    })
}

/// k1 KL of the current policy to the behaviour policy over the mask.
fn behaviour_kl(beh: &Tensor, logp: &Tensor, mask: &Tensor) -> f64 {
    masked_mean_value(&(beh - logp.detach()), mask)
}

/// ARMOR's loss (mixed ratio against the reference, AM-*) and its statistics.
fn armor_token_loss(
    p: &PresetConfig,
    tg: &Targets,
    r: &MicroRows,
    logp: &Tensor,
    opt: &ArmorLoss,
) -> Result<(Tensor, AggMode, Stats), LearnerError> {
    let reference = r
        .ref_logp
        .as_ref()
        .ok_or_else(|| LearnerError::input("armor needs the reference policy's log-probs"))?;
    let anchor_rows = r.pick(&tg.anchor_rows)?;
    let inputs = ArmorInputs {
        logp,
        old_logp: &r.old_logp,
        ref_logp: reference,
        adv: &r.adv,
        mask: &r.mask,
        anchor_rows: &anchor_rows,
    };
    let ratio = opt.ratio(tg.policy_share);
    let (l, s) = armor_loss(&inputs, opt, ratio, p.clip)?;
    let mut stats = l.stats.named();
    stats.push(Stat::ArmorMixRatio, ratio);
    stats.push(Stat::ArmorReplaceRatio, opt.replace_weight(ratio));
    stats.extend(s.named().iter());
    Ok((l.loss, p.agg, stats))
}

/// The reference terms: the k3 KL to the reference (a statistic) and, with a KL loss, the
/// term `coef · KL` the loss adds.
pub(super) fn kl_terms(
    p: &PresetConfig,
    r: &MicroRows,
    logp: &Tensor,
    records: &Records,
) -> Result<(Option<Tensor>, Stats), LearnerError> {
    let mut stats = Stats::new();
    let Some(reference) = &r.ref_logp else {
        return Ok((None, stats));
    };
    let k3 = masked_kl(&logp.detach(), reference, &r.mask, KlEstimator::K3);
    stats.push(Stat::KlRef, masked_mean_value(&k3, &r.mask));
    let Some(k) = p.kl_loss else {
        return Ok((None, stats));
    };
    let kl = records.agg(&masked_kl(logp, reference, &r.mask, k.estimator));
    stats.push(Stat::KlLoss, kl.f_double_value(&[])?);
    Ok((Some(kl.f_mul_scalar(k.coef)?), stats))
}

/// The joint value term `value_coef · L_V` of a shared critic trained with the actor, with the
/// critic's statistics; None otherwise.
pub(super) fn value_term(
    p: &PresetConfig,
    tg: &Targets,
    r: &MicroRows,
    values: Option<Tensor>,
    agg: AggMode,
    global: Option<&Global>,
) -> Result<(Option<Tensor>, Stats), LearnerError> {
    let (Some((old_v, returns)), Some(c), Some(values)) = (&tg.critic, &p.critic, values) else {
        return Ok((None, Stats::new()));
    };
    if !c.joint() {
        return Ok((None, Stats::new()));
    }
    let (old_v, returns, mask) = (r.pick(old_v)?, r.pick(returns)?, &r.mask);
    let v = align_values(&values)?;
    let vden = match global {
        Some((_, vden)) => *vden,
        None => AggDenominators::of(mask, p.loss_scale_factor),
    };
    let vl = value_loss(&v, &old_v, &returns, mask, c.value_clip, agg, &vden);
    let stats = Stats::new()
        .with(Stat::ValueLoss, vl.f_double_value(&[])?)
        .with(Stat::ExplainedVar, explained_variance(&v, &returns, mask))
        .with(
            Stat::VfClipfrac,
            value_clip_frac(&v, &old_v, &returns, mask, c.value_clip),
        );
    Ok((Some(vl.f_mul_scalar(c.value_coef)?), stats))
}
