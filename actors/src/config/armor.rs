//! `[armor]` and `[armor.loss]`: ARMOR's anchor rollouts, reference resets and loss options
//! (used when `learner.algo = "armor"`; the loss options are the learner crate's own
//! `ArmorLoss`).

use serde::{Deserialize, Serialize};

use super::key::{at_least, Key, Range, UNIT_OPEN_LOW};
use super::ConfigError;

/// `[armor]`: ARMOR's anchor rollouts and reference resets.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ArmorSection {
    /// Episodes per task sampled from the reference policy (the spec's `ref_n`).
    pub anchor_episodes: usize,
    /// Copy the policy into the reference every this many RL steps (0 = never; spec's
    /// `ref_policy_sync_steps`); each reset is a checkpoint tagged `reference-reset`.
    pub reference_reset_every: u64,
    /// `[armor.loss]`: the loss options of the public code (mixture ratio and partner,
    /// `replace_old`, ...); the learner reads them through [`super::TrainConfig::learner_config`].
    pub loss: keel_learner::algo::armor::ArmorLoss,
}

impl Default for ArmorSection {
    fn default() -> Self {
        Self {
            anchor_episodes: 2,
            reference_reset_every: 0,
            loss: Default::default(),
        }
    }
}

const ANCHOR_EPISODES: Key = Key::with_also("armor.anchor_episodes", at_least(1), "with algo armor", "ARMOR: episodes per task sampled from the reference policy; the first successful one joins the group (source = anchor) when the policy's episodes are neither all right nor all wrong.");

/// The keys of `[armor]` and `[armor.loss]`.
pub const KEYS: &[Key] = &[
    ANCHOR_EPISODES,
    Key::new("armor.reference_reset_every", at_least(0), "ARMOR: copy the policy into the reference every this many steps (0 = never); each reset is a checkpoint tagged reference-reset that later checkpoints name as their reference."),
    Key::with_also("armor.loss.mix_ratio", UNIT_OPEN_LOW, "unset = auto", "ARMOR: weight r of the policy in the token mixture r*pi + (1-r)*q; unset = the batch's share of policy episodes (the reference's auto_mix_ratio: 15/16 for its 15 + 1 groups); 1 turns the ratio mixing off (a mix replacement then needs replace_ratio)."),
    Key::new("armor.loss.mix_partner", Range::Words(&["reference", "one", "old"]), "ARMOR: the mixture partner q: the reference policy (shipped scripts), the constant probability 1 (mix_probs_w_const) or pi_old (mix_probs_w_old)."),
    Key::new("armor.loss.mix_on_anchors_only", Range::Bool, "ARMOR: mix only on anchor (reference-sampled) rows; the policy's rows keep the plain ratio (mix_probs_on_ref_only)."),
    Key::new("armor.loss.replace_old", Range::Words(&["none", "reference", "mix", "avg", "max"]), "ARMOR: replace pi_old before mixing by the reference, the mixture of pi_old and the reference at replace_ratio, their even mixture, or their maximum (replace_old_probs + replace_method); none in the shipped scripts."),
    Key::with_also("armor.loss.replace_ratio", UNIT_OPEN_LOW, "with replace_old = mix; unset = mix_ratio's r", "ARMOR: weight of pi_old in the mix replacement r_old*pi_old + (1-r_old)*pi_ref (the replacement's mix_probs_main_ratio); unset = the ratio mixing's r. Set it with mix_ratio = 1 to replace pi_old by the mixture while the ratio stays plain (the reference's mix_probs off), or to mix the two at different ratios."),
    Key::new("armor.loss.replace_on_anchors_only", Range::Bool, "ARMOR: the replacement applies to anchor rows only (replace_on_ref_only; true in the scripts)."),
    Key::with_also("armor.loss.renorm_adv", Range::Words(&["none", "token", "seq"]), "token and seq with replace_old set", "ARMOR: after a replacement, multiply anchor rows' advantages by min(pi_new_old / pi_old, 20) per token or by its mean over the row (renorm_adv)."),
    Key::with_also("armor.loss.replace_on_advantage", Range::Bool, "true with replace_old set", "ARMOR: keep pi_old in the ratio and multiply the advantage by pi_old / pi_new_old instead (replace_on_adv)."),
];

impl ArmorSection {
    /// Checks `[armor]` when ARMOR runs (`[armor.loss]` is checked with the learner's keys).
    pub fn validate(&self, armor_runs: bool) -> Result<(), ConfigError> {
        if armor_runs {
            ANCHOR_EPISODES.check_int(self.anchor_episodes as u64)?;
        }
        Ok(())
    }
}
