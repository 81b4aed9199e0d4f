//! ARMOR's mixed-probability ratio (spec §4.2): PPO on a token-level mixture of the current
//! (or old) policy and the reference ("anchor") policy, with every option of the public code's
//! actor update (Hesse73/ARMOR `dp_actor.py`).
//!
//! ```text
//! q_θ,t   = log( r·exp(logp_t)     + (1 − r)·exp(logp_q,t) )
//! q_old,t = log( r·exp(logp_old_t) + (1 − r)·exp(logp_q,t) )
//! ρ̃_t     = exp(q_θ,t − q_old,t)
//! loss    = vanilla PPO (§1.1) on the log-ratio q_θ − q_old: ε 0.2 / 0.28, dual-clip c = 10,
//!           token-mean; r = the batch's share of policy rows (the reference's auto_mix_ratio,
//!           15/16 for its 15 + 1 groups) unless set
//! ```
//! The partner `q` is the reference (shipped), the constant probability 1 (`one`, the code's
//! `mix_probs_w_const`) or π_old (`old`, `mix_probs_w_old`). With `mix_on_anchors_only` the
//! policy's own rows keep the plain ratio. Before mixing, `replace_old` may replace π_old
//! (on anchor rows only by default) by the reference, the mixture
//! `r_old·π_old + (1 − r_old)·π_ref` (`mix`) or the average of π_old and the reference, or their
//! maximum; `renorm_adv` then multiplies anchor rows' advantages by
//! `min(π_new_old/π_old, 20)` per token or its per-row mean, and `replace_on_advantage` keeps
//! π_old in the ratio and multiplies the advantage by `π_old/π_new_old` instead.
//! Gradient: `∇ρ̃ = r·π_θ·∇logπ_θ / π̃_old`, bounded because `π̃_old ≥ (1 − r)·π_ref`.
//!
//! Two ratios, as in the public code: `update_policy` reads one `mix_probs_main_ratio` twice,
//! for `replace_method = mix` (always, when `replace_old_probs`) and for the ratio mixing (only
//! when `mix_probs`). So the reference can mix π_old into its replacement at 15/16 while its
//! ratio is plain (`mix_probs = False`), which one r cannot say (r = 1 turns both off). keel
//! therefore gives the replacement its own `replace_ratio` (r_old above) next to `replace_old`,
//! which already mirrors `replace_old_probs` + `replace_method`: unset, it is the ratio
//! mixing's r (`mix_ratio` or the auto share: the reference with `mix_probs` on, and today's
//! behaviour bit for bit); set, it is the replacement's `mix_probs_main_ratio` (the reference
//! with `mix_probs` off is `mix_ratio = 1` + `replace_ratio`; both on at different ratios is
//! the reference's two steps with a ratio each). A separate key rather than a `mix_probs`
//! switch: `mix_ratio = 1` already is that switch, and a ratio of its own names what it sets.
//!
//! Invariants:
//! - AM-1: with `r = 1` (and no replacement) the loss is vanilla PPO on the plain ratio.
//! - AM-2: mixtures are computed with `logaddexp`, so they are finite whenever an input is.
//! - AM-3: options only change anchor rows' terms where the public code does: with
//!   `mix_on_anchors_only` and `replace_on_anchors_only`, policy rows see plain PPO.
//! - AM-4: a fully masked row contributes nothing, also to `renorm_adv = "seq"` (the public
//!   code divides 0 by 0 there and turns the whole loss into NaN).
//! - AM-5: `replace_old = "mix"` mixes with `replace_ratio` when set and with the ratio
//!   mixing's r otherwise; no other option reads `replace_ratio`, and `validate` refuses it
//!   with another `replace_old` and refuses a `mix` replacement that would be π_old itself.

use tch::{Kind, Tensor};

use crate::algo::ppo::{clip_surrogate, select, ClipBounds, TokenLoss};
use crate::error::LearnerError;
use crate::step_metrics::{Stat, Stats};

/// ARMOR's shipped clip: ε 0.2 / 0.28, dual-clip c = 10 (its scripts; the preset's).
pub const ARMOR_CLIP: ClipBounds = ClipBounds {
    low: 0.2,
    high: 0.28,
    dual: Some(10.0),
};

/// The distribution π_θ and π_old are mixed with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MixPartner {
    /// The reference policy (the shipped scripts).
    #[default]
    Reference,
    /// The constant probability 1 (`mix_probs_w_const`).
    One,
    /// π_old (`mix_probs_w_old`).
    Old,
}

/// What replaces π_old before mixing (`replace_old_probs` + `replace_method`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplaceOld {
    /// No replacement (the shipped scripts).
    #[default]
    None,
    /// The reference's log-probs (`ref`).
    Reference,
    /// The mixture of π_old and the reference at `replace_ratio`, by default r (`mix`).
    Mix,
    /// Their even mixture (`avg`).
    Avg,
    /// Their elementwise maximum (`max`).
    Max,
}

/// How anchor rows' advantages are reweighted after a replacement (`renorm_adv`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RenormAdv {
    /// Not at all (the shipped scripts).
    #[default]
    None,
    /// By `min(π_new_old/π_old, 20)` per token.
    Token,
    /// By that weight's mean over the row's response tokens.
    Seq,
}

/// ARMOR's loss options (`[armor.loss]`); the defaults are the shipped scripts'.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ArmorLoss {
    /// Mixture weight r of the policy, in (0, 1]; unset = the batch's share of policy rows
    /// (`auto_mix_ratio`). 1 turns the ratio mixing off (`mix_probs = False`).
    pub mix_ratio: Option<f64>,
    /// Mix only on anchor rows (`mix_probs_on_ref_only`).
    pub mix_on_anchors_only: bool,
    /// The mixture partner.
    pub mix_partner: MixPartner,
    /// Replace π_old before mixing.
    pub replace_old: ReplaceOld,
    /// Weight of π_old in the `mix` replacement, in (0, 1] (the replacement's
    /// `mix_probs_main_ratio`); unset = the ratio mixing's r.
    pub replace_ratio: Option<f64>,
    /// The replacement applies to anchor rows only (`replace_on_ref_only`, true in the scripts).
    pub replace_on_anchors_only: bool,
    /// Advantage reweighting of anchor rows after a replacement.
    pub renorm_adv: RenormAdv,
    /// Keep π_old in the ratio and reweight the advantage by π_old/π_new_old instead.
    pub replace_on_advantage: bool,
}

impl Default for ArmorLoss {
    fn default() -> Self {
        ArmorLoss {
            mix_ratio: None,
            mix_on_anchors_only: false,
            mix_partner: MixPartner::Reference,
            replace_old: ReplaceOld::None,
            replace_ratio: None,
            replace_on_anchors_only: true,
            renorm_adv: RenormAdv::None,
            replace_on_advantage: false,
        }
    }
}

impl ArmorLoss {
    /// `mix_ratio`, or the auto ratio `policy_share` when unset.
    pub fn ratio(&self, policy_share: f64) -> f64 {
        self.mix_ratio.unwrap_or(policy_share)
    }

    /// Weight of π_old in the mixture that replaces it (AM-5): `mix`: `replace_ratio`, or the
    /// ratio mixing's `r`; `avg`: 1/2; 0 when no mixture replaces π_old.
    pub fn replace_weight(&self, r: f64) -> f64 {
        match self.replace_old {
            ReplaceOld::Mix => self.replace_ratio.unwrap_or(r),
            ReplaceOld::Avg => 0.5,
            ReplaceOld::None | ReplaceOld::Reference | ReplaceOld::Max => 0.0,
        }
    }

    /// Range checks, naming the key.
    pub fn validate(&self) -> Result<(), LearnerError> {
        for (key, value) in [
            ("armor.loss.mix_ratio", self.mix_ratio),
            ("armor.loss.replace_ratio", self.replace_ratio),
        ] {
            if let Some(r) = value {
                if !(r > 0.0 && r <= 1.0) {
                    return Err(LearnerError::config(
                        key,
                        format!("must be in (0, 1], got {r}"),
                    ));
                }
            }
        }
        self.validate_replace_ratio()?;
        if self.replace_old == ReplaceOld::None
            && (self.renorm_adv != RenormAdv::None || self.replace_on_advantage)
        {
            return Err(LearnerError::config(
                "armor.loss.renorm_adv",
                "renorm_adv and replace_on_advantage act on a replacement: set replace_old too",
            ));
        }
        Ok(())
    }

    /// AM-5: `replace_ratio` only with a `mix` replacement, and a `mix` replacement that is not
    /// π_old itself.
    fn validate_replace_ratio(&self) -> Result<(), LearnerError> {
        let key = "armor.loss.replace_ratio";
        match (self.replace_old, self.replace_ratio, self.mix_ratio) {
            (ReplaceOld::Mix, None, Some(r)) if r >= 1.0 => Err(LearnerError::config(
                key,
                "replace_old = \"mix\" with mix_ratio = 1 replaces pi_old by itself: set \
                 replace_ratio (the reference's mix_probs_main_ratio with mix_probs off)",
            )),
            (ReplaceOld::Mix, _, _) | (_, None, _) => Ok(()),
            (_, Some(_), _) => Err(LearnerError::config(
                key,
                "weights only replace_old = \"mix\" (avg mixes at 1/2, none, reference and max \
                 do not mix): unset it or set replace_old = \"mix\"",
            )),
        }
    }
}

/// The tensors of one ARMOR loss, `[B, T]` unless said.
pub struct ArmorInputs<'a> {
    /// Current log-probs (with gradient).
    pub logp: &'a Tensor,
    /// π_old's log-probs.
    pub old_logp: &'a Tensor,
    /// The reference's log-probs.
    pub ref_logp: &'a Tensor,
    /// Advantages.
    pub adv: &'a Tensor,
    /// Loss mask.
    pub mask: &'a Tensor,
    /// `[B]`, 1 for anchor rows.
    pub anchor_rows: &'a Tensor,
}

/// What the loss reports besides the clip statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ArmorStats {
    /// Largest mixed ratio on anchor tokens.
    pub anchor_mixed_ratio_max: f64,
    /// Largest plain ratio π_θ/π_old on anchor tokens (what the mixture bounds).
    pub anchor_plain_ratio_max: f64,
    /// Anchor tokens in the loss.
    pub anchor_tokens: f64,
    /// Mean advantage weight of `renorm_adv` over response tokens (1 without it).
    pub renorm_weight_mean: f64,
}

impl ArmorStats {
    /// These statistics by name (docs/metrics-learner.md).
    pub fn named(&self) -> Stats {
        Stats::new()
            .with(Stat::ArmorRenormWeight, self.renorm_weight_mean)
            .with(Stat::AnchorMixedRatioMax, self.anchor_mixed_ratio_max)
            .with(Stat::AnchorPlainRatioMax, self.anchor_plain_ratio_max)
            .with(Stat::AnchorTokens, self.anchor_tokens)
    }
}

/// `log(r·exp(a) + (1 − r)·exp(b))`, elementwise (AM-2); `r` in (0, 1].
pub fn mixed_logp(logp: &Tensor, partner: &Tensor, r: f64) -> Tensor {
    if r >= 1.0 {
        return logp.shallow_clone();
    }
    (logp + r.ln()).logaddexp(&(partner.to_kind(logp.kind()) + (1.0 - r).ln()))
}

/// `[B, T]` bool: true on the rows the option restricts to (anchors) or everywhere.
fn rows_where(anchors_only: bool, inp: &ArmorInputs) -> Tensor {
    let all = inp.mask.ones_like().gt(0.0);
    if anchors_only {
        all.logical_and(&inp.anchor_rows.gt(0.0).unsqueeze(1))
    } else {
        all
    }
}

/// π_old after `replace_old`, and the advantages after `renorm_adv` / `replace_on_advantage`.
fn replaced_old(inp: &ArmorInputs, opt: &ArmorLoss, r: f64) -> (Tensor, Tensor, f64) {
    let old = inp.old_logp.to_kind(inp.logp.kind()).detach();
    let rf = inp.ref_logp.to_kind(old.kind()).detach();
    let adv = inp.adv.to_kind(old.kind());
    let new_old = match opt.replace_old {
        ReplaceOld::None => return (old, adv, 1.0),
        ReplaceOld::Reference => rf.shallow_clone(),
        ReplaceOld::Mix | ReplaceOld::Avg => mixed_logp(&old, &rf, opt.replace_weight(r)),
        ReplaceOld::Max => old.maximum(&rf),
    };
    let new_old = new_old.where_self(&rows_where(opt.replace_on_anchors_only, inp), &old);
    let anchors = inp.anchor_rows.gt(0.0).unsqueeze(1).expand_as(inp.mask);
    let mut adv = adv;
    let mut renorm_mean = 1.0;
    if opt.renorm_adv != RenormAdv::None {
        let w = (&new_old - &old).exp().clamp_max(20.0);
        let w = match opt.renorm_adv {
            RenormAdv::Seq => {
                let m = inp.mask.to_kind(w.kind());
                let n = m.sum_dim_intlist(1, true, w.kind());
                // AM-4: an empty row's weight is 1, not 0/0.
                let mean = (select(&w, inp.mask) * &m).sum_dim_intlist(1, true, w.kind())
                    / n.clamp_min(1.0);
                mean.where_self(&n.gt(0.0), &mean.ones_like()).expand_as(&w)
            }
            _ => w,
        };
        let w = w.where_self(&anchors, &w.ones_like());
        renorm_mean = crate::algo::aggregation::masked_mean_value(&w, inp.mask);
        // Not `*=`: `to_kind` to the same kind aliases the caller's tensor.
        adv = &adv * &w;
    }
    if opt.replace_on_advantage {
        let back = (&old - &new_old).clamp(-20.0, 20.0).exp();
        (old, adv * back, renorm_mean)
    } else {
        (new_old, adv, renorm_mean)
    }
}

/// The mixed log-ratio `q_θ − q_old` (module doc) over an already-replaced π_old.
fn mixed_log_ratio(inp: &ArmorInputs, old: &Tensor, opt: &ArmorLoss, r: f64) -> Tensor {
    let lp = select(inp.logp, inp.mask);
    let old = select(old, inp.mask);
    if r >= 1.0 {
        return lp - old;
    }
    let partner = match opt.mix_partner {
        MixPartner::Reference => select(&inp.ref_logp.to_kind(lp.kind()), inp.mask).detach(),
        MixPartner::One => lp.zeros_like(),
        MixPartner::Old => old.shallow_clone(),
    };
    let mixed = mixed_logp(&lp, &partner, r) - mixed_logp(&old, &partner, r);
    mixed.where_self(&rows_where(opt.mix_on_anchors_only, inp), &(lp - old))
}

/// ARMOR's policy loss: vanilla PPO (with dual-clip when `clip.dual` is set) on the mixed ratio,
/// with `r` already resolved ([`ArmorLoss::ratio`]).
pub fn armor_loss(
    inp: &ArmorInputs,
    opt: &ArmorLoss,
    r: f64,
    clip: ClipBounds,
) -> Result<(TokenLoss, ArmorStats), LearnerError> {
    let (old, adv, renorm_weight_mean) = replaced_old(inp, opt, r);
    let x = mixed_log_ratio(inp, &old, opt, r);
    let loss = clip_surrogate(&x, &adv, inp.mask, clip, None);
    let on_anchor = inp
        .mask
        .f_mul(&inp.anchor_rows.f_unsqueeze(1)?)?
        .f_gt(0.0)?;
    let max_on = |x: &Tensor| -> Result<f64, LearnerError> {
        let v = x.detach().f_exp()?.f_masked_select(&on_anchor)?;
        Ok(if v.numel() == 0 {
            0.0
        } else {
            v.f_max()?.f_double_value(&[])?
        })
    };
    let plain = inp.logp.f_sub(&inp.old_logp.to_kind(inp.logp.kind()))?;
    let stats = ArmorStats {
        anchor_mixed_ratio_max: max_on(&x)?,
        anchor_plain_ratio_max: max_on(&plain)?,
        anchor_tokens: f64::try_from(on_anchor.f_sum(Kind::Double)?)?,
        renorm_weight_mean,
    };
    Ok((loss, stats))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::aggregation::masked_mean;
    use crate::algo::ppo::tests::{check_grad, row, values};

    fn one_row<'a>(
        lp: &'a Tensor,
        old: &'a Tensor,
        rf: &'a Tensor,
        adv: &'a Tensor,
        mask: &'a Tensor,
        anchor: &'a Tensor,
    ) -> ArmorInputs<'a> {
        ArmorInputs {
            logp: lp,
            old_logp: old,
            ref_logp: rf,
            adv,
            mask,
            anchor_rows: anchor,
        }
    }

    #[test]
    fn spec_vectors() {
        let (one, anchor) = (row(&[1.0]), Tensor::from_slice(&[0.0f64]));
        for ((lp, old, rf), plain, mixed) in [
            ((-1.0, -1.2, -0.5), 1.221403, 1.171939),
            ((-5.0, -6.0, -0.3), std::f64::consts::E, 1.039324),
        ] {
            let (lp, old, rf) = (row(&[lp]), row(&[old]), row(&[rf]));
            let inp = one_row(&lp, &old, &rf, &one, &one, &anchor);
            let opt = ArmorLoss::default();
            let x = mixed_log_ratio(&inp, &old, &opt, 0.875);
            assert!((values(&x.exp())[0] - mixed).abs() < 1e-6);
            let p = mixed_log_ratio(&inp, &old, &opt, 1.0);
            assert!((values(&p.exp())[0] - plain).abs() < 1e-6, "AM-1");
        }
    }

    #[test]
    fn am3_anchor_only_options_leave_policy_rows_plain() {
        let lp = Tensor::from_slice(&[-1.0f64, -0.5, -2.0, -0.7]).view([2, 2]);
        let old = Tensor::from_slice(&[-1.2f64, -0.4, -2.5, -0.9]).view([2, 2]);
        let rf = Tensor::from_slice(&[-0.3f64, -3.0, -0.2, -1.5]).view([2, 2]);
        let (adv, mask) = (lp.ones_like(), lp.ones_like());
        let anchor = Tensor::from_slice(&[0.0f64, 1.0]);
        let inp = one_row(&lp, &old, &rf, &adv, &mask, &anchor);
        let opt = ArmorLoss {
            mix_on_anchors_only: true,
            replace_old: ReplaceOld::Max,
            renorm_adv: RenormAdv::Token,
            ..ArmorLoss::default()
        };
        let (new_old, new_adv, _) = replaced_old(&inp, &opt, 0.9);
        let x = values(&mixed_log_ratio(&inp, &new_old, &opt, 0.9));
        let plain = values(&(&lp - &old));
        assert_eq!(&x[..2], &plain[..2], "policy row: plain ratio");
        assert_ne!(&x[2..], &plain[2..], "anchor row: mixed, replaced");
        assert_eq!(&values(&new_adv)[..2], &[1.0, 1.0]);
    }

    #[test]
    fn am4_an_empty_row_keeps_seq_renorm_finite() {
        let lp = Tensor::from_slice(&[-1.0f64, -0.5, -2.0, -0.7]).view([2, 2]);
        let old = lp.shallow_clone();
        let rf = lp.f_sub_scalar(1.0).expect("ref");
        let adv = lp.ones_like();
        let mask = Tensor::from_slice(&[1.0f64, 1.0, 0.0, 0.0]).view([2, 2]);
        let anchor = Tensor::from_slice(&[1.0f64, 1.0]);
        let inp = one_row(&lp, &old, &rf, &adv, &mask, &anchor);
        let opt = ArmorLoss {
            replace_old: ReplaceOld::Reference,
            renorm_adv: RenormAdv::Seq,
            ..ArmorLoss::default()
        };
        let (l, s) = armor_loss(&inp, &opt, 0.9, ARMOR_CLIP).expect("loss");
        assert!(values(&l.loss).iter().all(|v| v.is_finite()));
        assert!((s.renorm_weight_mean - (-1.0f64).exp()).abs() < 1e-12);
    }

    #[test]
    fn the_inputs_are_never_modified() {
        let lp = row(&[-1.0, -0.5]);
        let (old, rf) = (row(&[-1.2, -0.4]), row(&[-0.3, -3.0]));
        let (adv, mask, anchor) = (
            row(&[1.0, -1.0]),
            row(&[1.0, 1.0]),
            Tensor::from_slice(&[1.0f64]),
        );
        let inp = one_row(&lp, &old, &rf, &adv, &mask, &anchor);
        let opt = ArmorLoss {
            replace_old: ReplaceOld::Reference,
            renorm_adv: RenormAdv::Token,
            replace_on_advantage: true,
            ..ArmorLoss::default()
        };
        for _ in 0..2 {
            armor_loss(&inp, &opt, 0.9, ARMOR_CLIP).expect("loss");
        }
        assert_eq!(values(&adv), [1.0, -1.0]);
        assert_eq!(values(&old), [-1.2, -0.4]);
    }

    #[test]
    fn am5_replace_ratio_weights_only_the_mix_replacement() {
        let lp = Tensor::from_slice(&[-1.0f64, -0.5, -2.0, -0.7]).view([2, 2]);
        let old = Tensor::from_slice(&[-1.2f64, -0.4, -2.5, -0.9]).view([2, 2]);
        let rf = Tensor::from_slice(&[-0.3f64, -3.0, -0.2, -1.5]).view([2, 2]);
        let (adv, mask) = (lp.ones_like(), lp.ones_like());
        let anchor = Tensor::from_slice(&[0.0f64, 1.0]);
        let inp = one_row(&lp, &old, &rf, &adv, &mask, &anchor);
        let mix = ArmorLoss {
            replace_old: ReplaceOld::Mix,
            ..ArmorLoss::default()
        };
        // Unset = the ratio mixing's r, bit for bit.
        let same = ArmorLoss {
            replace_ratio: Some(0.875),
            ..mix
        };
        let loss = |o: &ArmorLoss, r: f64| {
            values(&armor_loss(&inp, o, r, ARMOR_CLIP).expect("loss").0.loss)
        };
        assert_eq!(loss(&mix, 0.875), loss(&same, 0.875));
        // Ratio mixing off, replacement at 3/4: the plain ratio over the replaced π_old.
        let own = ArmorLoss {
            mix_ratio: Some(1.0),
            replace_ratio: Some(0.75),
            ..mix
        };
        let (new_old, _, _) = replaced_old(&inp, &own, 1.0);
        let want = mixed_logp(&old, &rf, 0.75).where_self(&anchor.gt(0.5).unsqueeze(1), &old);
        assert_eq!(values(&new_old), values(&want));
        let x = mixed_log_ratio(&inp, &new_old, &own, 1.0);
        assert_eq!(values(&x), values(&(&lp - &want)));
        assert_eq!(
            (own.replace_weight(1.0), mix.replace_weight(0.9)),
            (0.75, 0.9)
        );
        assert_ne!(
            loss(&own, 1.0),
            loss(&mix, 1.0),
            "mix_ratio = 1 alone: no replacement"
        );
    }

    #[test]
    fn am5_validate_names_replace_ratio() {
        let key_of = |o: ArmorLoss| match o.validate() {
            Err(e) => e.to_string(),
            Ok(()) => "ok".into(),
        };
        let mix = ArmorLoss {
            replace_old: ReplaceOld::Mix,
            ..ArmorLoss::default()
        };
        for bad in [0.0, -0.5, 1.5, f64::NAN] {
            let e = key_of(ArmorLoss {
                replace_ratio: Some(bad),
                ..mix
            });
            assert!(
                e.contains("armor.loss.replace_ratio") && e.contains("(0, 1]"),
                "{e}"
            );
        }
        for other in [ReplaceOld::None, ReplaceOld::Avg, ReplaceOld::Max] {
            let e = key_of(ArmorLoss {
                replace_old: other,
                replace_ratio: Some(0.5),
                ..mix
            });
            assert!(e.contains("armor.loss.replace_ratio"), "{other:?}: {e}");
        }
        let off = ArmorLoss {
            mix_ratio: Some(1.0),
            ..mix
        };
        assert!(key_of(off).contains("replaces pi_old by itself"));
        for ok in [
            ArmorLoss::default(),
            mix,
            ArmorLoss {
                replace_ratio: Some(0.9375),
                ..off
            },
            ArmorLoss {
                mix_ratio: Some(0.9375),
                replace_ratio: Some(1.0),
                ..mix
            },
        ] {
            assert_eq!(key_of(ok), "ok", "{ok:?}");
        }
    }

    #[test]
    fn armor_gradient_matches_finite_differences() {
        let old = row(&[-1.2, -6.0, -0.7, -2.0]);
        let rf = row(&[-0.5, -0.3, -3.0, -1.0]);
        let adv = row(&[1.0, -1.0, 0.5, 2.0]);
        let mask = row(&[1.0, 1.0, 1.0, 0.0]);
        let anchor = Tensor::from_slice(&[1.0f64]);
        let c = ARMOR_CLIP;
        for opt in [
            ArmorLoss::default(),
            ArmorLoss {
                mix_partner: MixPartner::One,
                ..ArmorLoss::default()
            },
            ArmorLoss {
                replace_old: ReplaceOld::Mix,
                renorm_adv: RenormAdv::Seq,
                ..ArmorLoss::default()
            },
        ] {
            check_grad(&[-1.0, -5.0, -0.65, -1.0], |x| {
                let inp = one_row(x, &old, &rf, &adv, &mask, &anchor);
                masked_mean(
                    &armor_loss(&inp, &opt, 0.875, c).expect("loss").0.loss,
                    &mask,
                )
            });
        }
    }
}
