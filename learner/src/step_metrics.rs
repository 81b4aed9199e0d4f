//! `StepMetrics`: what one learner call reports. Every field, its verl counterpart and its
//! meaning are listed in docs/metrics-learner.md.
//!
//! Invariants:
//! - SM-1: every preset fills every field; a field that does not apply is 0, never NaN.
//! - SM-2: per-minibatch fields are means over the call's minibatches; `actor_steps` and
//!   `critic_steps` are counts for the call.

use crate::algo::ppo::ClipStats;

/// What one `train_step` / `sft_step` did; per-minibatch quantities are averaged. Every field
/// is documented in docs/metrics-learner.md.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct StepMetrics {
    /// Total loss that was minimised.
    pub loss: f64,
    /// Policy-gradient part (aggregated surrogate); 0 for SFT.
    pub pg_loss: f64,
    /// Value-loss part (before `value_coef`); 0 without a critic.
    pub value_loss: f64,
    /// Fraction of tokens where the ratio clip was active (verl `pg_clipfrac`).
    pub clip_frac: f64,
    /// … with the ratio above 1.
    pub clip_frac_upper: f64,
    /// … with the ratio below 1.
    pub clip_frac_lower: f64,
    /// Fraction of tokens capped by dual-clip (verl `pg_clipfrac_lower`).
    pub clip_frac_dual: f64,
    /// k1 KL estimate between the ratio's denominator (behaviour or old) and the current policy.
    pub approx_kl: f64,
    /// k3 KL estimate of the current policy to the reference (0 without a reference).
    pub kl_ref: f64,
    /// The KL loss term before its coefficient (0 when off).
    pub kl_loss: f64,
    /// KL-in-reward β used this step (0 when off).
    pub kl_reward_beta: f64,
    /// Token-mean KL(old ‖ ref) subtracted in the reward (0 when off).
    pub kl_reward: f64,
    /// Token-mean entropy of the current policy on model tokens.
    pub entropy: f64,
    /// Pre-clip global gradient norm of the actor step (of the critic step during warm-up).
    pub grad_norm: f64,
    /// SAO: fraction of tokens the DIS mask removed.
    pub dis_masked_frac: f64,
    /// Sequence mask: fraction of sequences dropped.
    pub seq_mask_frac: f64,
    /// SORL: mean turn-level ratio.
    pub turn_ratio_mean: f64,
    /// SORL: smallest turn-level ratio.
    pub turn_ratio_min: f64,
    /// SORL: largest turn-level ratio.
    pub turn_ratio_max: f64,
    /// SORL: fraction of samples whose CTN weight was below 1.
    pub ctn_trigger_frac: f64,
    /// Critic: explained variance of the returns.
    pub explained_var: f64,
    /// Critic: fraction of model tokens whose value loss the value clip decided.
    pub vf_clipfrac: f64,
    /// Mean advantage over model tokens.
    pub adv_mean: f64,
    /// Std of the advantage over model tokens.
    pub adv_std: f64,
    /// Smallest advantage on a model token.
    pub adv_min: f64,
    /// Largest advantage on a model token.
    pub adv_max: f64,
    /// Dynamic sampling: groups in the batch.
    pub groups_total: f64,
    /// Dynamic sampling: groups trained on.
    pub groups_kept: f64,
    /// SAO: smallest ratio `π_θ/π_beh` among tokens that carried gradient (inside the DIS band;
    /// 1 when none did). Min over mini-batches.
    pub dis_kept_ratio_min: f64,
    /// SAO: largest ratio among tokens that carried gradient. Max over mini-batches.
    pub dis_kept_ratio_max: f64,
    /// ARMOR: largest mixed ratio ρ̃ on anchor (reference-sampled) tokens. Max over mini-batches.
    pub anchor_mixed_ratio_max: f64,
    /// ARMOR: largest plain ratio π_θ/π_old on the same anchor tokens. Max over mini-batches.
    pub anchor_plain_ratio_max: f64,
    /// ARMOR: model tokens of anchor trajectories in the batch.
    pub anchor_tokens: f64,
    /// ARMOR: the ratio mixing's r in force (`armor.loss.mix_ratio`, or the batch's policy
    /// share); 1 = no ratio mixing.
    pub armor_mix_ratio: f64,
    /// ARMOR: weight of π_old in the mixture that replaces it (`armor.loss.replace_ratio`, or the
    /// ratio mixing's r, for `replace_old = "mix"`; 1/2 for `avg`); 0 without such a replacement.
    pub armor_replace_ratio: f64,
    /// ARMOR: mean advantage weight of `armor.loss.renorm_adv` over model tokens (1 without).
    pub armor_renorm_weight: f64,
    /// Actor optimizer steps taken in this call.
    pub actor_steps: f64,
    /// Value-only optimizer steps taken in this call.
    pub critic_steps: f64,
    /// Model tokens in the batch.
    pub tokens: usize,
    /// `tokens / step_seconds`.
    pub tokens_per_s: f64,
    /// Mean outcome reward of the batch (0 for SFT).
    pub mean_reward: f64,
    /// Wall time of the whole call.
    pub step_seconds: f64,
}

impl StepMetrics {
    /// The fields averaged over minibatches.
    pub(crate) fn averaged(&mut self) -> [&mut f64; 25] {
        [
            &mut self.loss,
            &mut self.pg_loss,
            &mut self.value_loss,
            &mut self.clip_frac,
            &mut self.clip_frac_upper,
            &mut self.clip_frac_lower,
            &mut self.clip_frac_dual,
            &mut self.approx_kl,
            &mut self.kl_ref,
            &mut self.kl_loss,
            &mut self.entropy,
            &mut self.grad_norm,
            &mut self.dis_masked_frac,
            &mut self.seq_mask_frac,
            &mut self.turn_ratio_mean,
            &mut self.turn_ratio_min,
            &mut self.turn_ratio_max,
            &mut self.ctn_trigger_frac,
            &mut self.explained_var,
            &mut self.vf_clipfrac,
            &mut self.armor_mix_ratio,
            &mut self.armor_replace_ratio,
            &mut self.armor_renorm_weight,
            &mut self.actor_steps,
            &mut self.critic_steps,
        ]
    }

    /// Folds the extreme-value fields of a mini-batch into `self` (min of mins, max of maxes).
    pub(crate) fn fold_extremes(&mut self, m: &StepMetrics, first: bool) {
        if first {
            self.dis_kept_ratio_min = m.dis_kept_ratio_min;
            self.dis_kept_ratio_max = m.dis_kept_ratio_max;
            self.anchor_mixed_ratio_max = m.anchor_mixed_ratio_max;
            self.anchor_plain_ratio_max = m.anchor_plain_ratio_max;
            self.anchor_tokens = m.anchor_tokens;
            return;
        }
        self.dis_kept_ratio_min = self.dis_kept_ratio_min.min(m.dis_kept_ratio_min);
        self.dis_kept_ratio_max = self.dis_kept_ratio_max.max(m.dis_kept_ratio_max);
        self.anchor_mixed_ratio_max = self.anchor_mixed_ratio_max.max(m.anchor_mixed_ratio_max);
        self.anchor_plain_ratio_max = self.anchor_plain_ratio_max.max(m.anchor_plain_ratio_max);
        self.anchor_tokens = self.anchor_tokens.max(m.anchor_tokens);
    }

    pub(crate) fn set_clip(&mut self, s: ClipStats) {
        self.clip_frac = s.clip_frac;
        self.clip_frac_upper = s.clip_frac_upper;
        self.clip_frac_lower = s.clip_frac_lower;
        self.clip_frac_dual = s.clip_frac_dual;
        self.approx_kl = s.approx_kl;
    }
}
