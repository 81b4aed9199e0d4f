//! `StepMetrics`: what one learner call reports, declared once. Every field, its verl
//! counterpart and its meaning are listed in docs/metrics-learner.md.
//!
//! The one table in [`step_stats!`] declares each statistic: its field (the JSON name in the
//! metrics log), how it folds over micro- and mini-batches ([`Fold`]) and over a Dr. MAS call's
//! models ([`ModelFold`]) and, when Prometheus exports it, the metric name and HELP text
//! ([`Export`]). The struct, the [`Stat`] names, the
//! folds and the registry [`STATS`] that `actors::metrics` iterates all come from it, so a new
//! statistic is one table row plus the code that computes it. Losses hand their statistics back
//! as [`Stats`] (named values, as verl's `(loss, metrics)`).
//!
//! Invariants:
//! - SM-1: every preset fills every field; a field that does not apply is 0, never NaN.
//! - SM-2: per-minibatch fields are means over the call's minibatches; `actor_steps` and
//!   `critic_steps` are counts for the call.
//! - SM-3: the serialized form is the struct's, fields in table order (the metrics log's
//!   `metrics` object); `tokens` is an integer.
//! - SM-4 (Dr. MAS, LA-4): the statistics of a step of several models are the main model's,
//!   except those the table folds over models ([`ModelFold`]): `loss` is the sum of the models'
//!   losses, and `grad_norm` and `approx_kl` are the largest of any model, so the collapse
//!   guard (GD) sees a spike in any model.

/// How a statistic combines over a mini-batch's micro-batches (MB-1) and a call's
/// mini-batches (SM-2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fold {
    /// Token-weighted over micro-batches; mean over mini-batches.
    Mean,
    /// Summed over micro-batches (each is over the mini-batch's denominators); mean over
    /// mini-batches.
    Loss,
    /// Token-weighted over micro-batches; summed over mini-batches (optimizer step counts).
    Count,
    /// Smallest of the parts.
    Min,
    /// Largest of the parts.
    Max,
    /// Summed over micro-batches; set once per call from the whole batch.
    Sum,
    /// Set once per call from the whole batch; never folded.
    Batch,
}

/// How a statistic combines over the models of one Dr. MAS step (SM-4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelFold {
    /// The main model's value.
    Main,
    /// Summed over the models.
    Sum,
    /// The largest of the models' values (a NaN loses to a number, as `f64::max`).
    Max,
}

/// A statistic's Prometheus gauge (`keel_…`, MT-2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Export {
    /// Metric name.
    pub metric: &'static str,
    /// HELP text.
    pub help: &'static str,
}

/// One row of the statistics table.
#[derive(Clone, Copy, Debug)]
pub struct StatSpec {
    /// Which statistic.
    pub stat: Stat,
    /// Its name: the `StepMetrics` field and the JSON key.
    pub name: &'static str,
    /// How it folds.
    pub fold: Fold,
    /// How it combines over a Dr. MAS step's models.
    pub models: ModelFold,
    /// Its Prometheus gauge, when exported.
    pub export: Option<Export>,
}

/// A field type of `StepMetrics`, seen as `f64`.
trait StatValue: Copy {
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
}

impl StatValue for f64 {
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(v: f64) -> Self {
        v
    }
}

impl StatValue for usize {
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as usize
    }
}

/// Declares `StepMetrics`, `Stat` and `STATS` from one table:
/// `field: type, Variant, Fold [, models ModelFold] [=> "metric", "help"];` (no `models`: the
/// main model's value).
macro_rules! step_stats {
    ($(
        $(#[doc = $doc:literal])*
        $field:ident : $ty:ty, $variant:ident, $fold:ident $(, models $models:ident)?
            $(=> $metric:literal, $help:literal)?;
    )*) => {
        /// What one `train_step` / `sft_step` did; per-minibatch quantities are averaged.
        /// Every field is documented in docs/metrics-learner.md.
        #[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
        #[serde(default)]
        pub struct StepMetrics {
            $( $(#[doc = $doc])* #[serde(deserialize_with = "null_as_nan")] pub $field: $ty, )*
        }

        /// The name of one learner statistic (a `StepMetrics` field).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Stat {
            $( $(#[doc = $doc])* $variant, )*
        }

        /// Every statistic, in field order.
        pub const STATS: &[StatSpec] = &[
            $( StatSpec {
                stat: Stat::$variant,
                name: stringify!($field),
                fold: Fold::$fold,
                models: step_stats!(@models $($models)?),
                export: step_stats!(@export $($metric, $help)?),
            }, )*
        ];

        impl StepMetrics {
            /// The value of `stat`.
            pub fn get(&self, stat: Stat) -> f64 {
                match stat {
                    $( Stat::$variant => StatValue::to_f64(self.$field), )*
                }
            }

            /// Sets `stat` to `v`.
            pub fn set(&mut self, stat: Stat, v: f64) {
                match stat {
                    $( Stat::$variant => self.$field = StatValue::from_f64(v), )*
                }
            }
        }
    };
    (@models) => { ModelFold::Main };
    (@models $models:ident) => { ModelFold::$models };
    (@export) => { None };
    (@export $metric:literal, $help:literal) => { Some(Export { metric: $metric, help: $help }) };
}

step_stats! {
    /// Total loss that was minimised.
    loss: f64, Loss, Loss, models Sum => "keel_actor_loss", "Total loss of the last step";
    /// Policy-gradient part (aggregated surrogate); 0 for SFT.
    pg_loss: f64, PgLoss, Loss => "keel_actor_pg_loss", "Policy-gradient loss of the last step";
    /// Value-loss part (before `value_coef`); 0 without a critic.
    value_loss: f64, ValueLoss, Loss => "keel_critic_vf_loss", "Value loss of the last step (PPO)";
    /// Fraction of tokens where the ratio clip was active (verl `pg_clipfrac`).
    clip_frac: f64, ClipFrac, Mean
        => "keel_actor_pg_clipfrac", "Fraction of model tokens whose ratio was clipped";
    /// … with the ratio above 1.
    clip_frac_upper: f64, ClipFracUpper, Mean
        => "keel_actor_pg_clipfrac_high", "Fraction of model tokens clipped with the ratio above 1";
    /// … with the ratio below 1.
    clip_frac_lower: f64, ClipFracLower, Mean
        => "keel_actor_pg_clipfrac_low", "Fraction of model tokens clipped with the ratio below 1";
    /// Fraction of tokens capped by dual-clip (verl `pg_clipfrac_lower`).
    clip_frac_dual: f64, ClipFracDual, Mean
        => "keel_actor_pg_clipfrac_lower",
           "Fraction of model tokens capped by dual-clip (verl pg_clipfrac_lower)";
    /// k1 KL estimate between the ratio's denominator (behaviour or old) and the current policy.
    approx_kl: f64, ApproxKl, Mean, models Max
        => "keel_actor_ppo_kl", "Approximate KL between the behaviour (old) and current policy";
    /// k3 KL estimate of the current policy to the reference (0 without a reference).
    kl_ref: f64, KlRef, Mean
        => "keel_actor_kl_ref",
           "k3 KL estimate of the current policy to the reference (0 without one)";
    /// The KL loss term before its coefficient (0 when off).
    kl_loss: f64, KlLoss, Loss
        => "keel_actor_kl_loss", "KL loss term before its coefficient (0 when off)";
    /// KL-in-reward β used this step (0 when off).
    kl_reward_beta: f64, KlRewardBeta, Batch
        => "keel_actor_kl_reward_beta", "KL-in-reward coefficient used this step";
    /// Token-mean KL(old ‖ ref) subtracted in the reward (0 when off).
    kl_reward: f64, KlReward, Batch
        => "keel_actor_kl_reward", "Token-mean KL(old || ref) subtracted in the reward (0 when off)";
    /// Mean |π_old − π_rollout| over model tokens: the engine/trainer (and staleness) log-prob
    /// gap; measured with `ratio_base = recompute`, 0 otherwise.
    rollout_logp_mismatch: f64, RolloutLogpMismatch, Batch
        => "keel_actor_rollout_logp_mismatch",
           "Mean absolute log-prob gap between the learner's pi_old and the rollout policy (ratio_base = recompute)";
    /// Rollout correction: share of model tokens (sequence level: of sequences) whose IS weight
    /// was truncated at `rollout_is_threshold`.
    rollout_is_truncated_frac: f64, RolloutIsTruncatedFrac, Batch
        => "keel_actor_rollout_is_truncated_frac",
           "Share of model tokens (or sequences) whose rollout IS weight was truncated";
    /// Rollout correction: share of sequences rejected by `rollout_rs`.
    rollout_rs_rejected_frac: f64, RolloutRsRejectedFrac, Batch
        => "keel_actor_rollout_rs_rejected_frac",
           "Share of sequences rejected by the rollout correction";
    /// Token-mean entropy of the current policy on model tokens.
    entropy: f64, Entropy, Mean => "keel_actor_entropy", "Mean token entropy of the policy";
    /// Pre-clip global gradient norm of the actor step (of the critic step during warm-up).
    grad_norm: f64, GradNorm, Mean, models Max
        => "keel_actor_grad_norm", "Gradient L2 norm before clipping, last step";
    /// SAO: fraction of tokens the DIS mask removed.
    dis_masked_frac: f64, DisMaskedFrac, Mean;
    /// Sequence mask: fraction of sequences dropped.
    seq_mask_frac: f64, SeqMaskFrac, Mean;
    /// SORL: mean turn-level ratio.
    turn_ratio_mean: f64, TurnRatioMean, Mean;
    /// SORL: smallest turn-level ratio.
    turn_ratio_min: f64, TurnRatioMin, Mean;
    /// SORL: largest turn-level ratio.
    turn_ratio_max: f64, TurnRatioMax, Mean;
    /// SORL: fraction of samples whose CTN weight was below 1.
    ctn_trigger_frac: f64, CtnTriggerFrac, Mean;
    /// Critic: explained variance of the returns.
    explained_var: f64, ExplainedVar, Mean
        => "keel_critic_vf_explained_var", "Explained variance of the returns by the critic";
    /// Critic: fraction of model tokens whose value loss the value clip decided.
    vf_clipfrac: f64, VfClipfrac, Mean
        => "keel_critic_vf_clipfrac",
           "Fraction of model tokens whose value loss the value clip decided";
    /// Mean advantage over model tokens.
    adv_mean: f64, AdvMean, Batch
        => "keel_critic_advantages_mean", "Mean advantage over model tokens";
    /// Std of the advantage over model tokens.
    adv_std: f64, AdvStd, Batch
        => "keel_critic_advantages_std", "Std of the advantage over model tokens";
    /// Smallest advantage on a model token.
    adv_min: f64, AdvMin, Batch
        => "keel_critic_advantages_min", "Smallest advantage on a model token";
    /// Largest advantage on a model token.
    adv_max: f64, AdvMax, Batch
        => "keel_critic_advantages_max", "Largest advantage on a model token";
    /// Dynamic sampling: groups in the batch.
    groups_total: f64, GroupsTotal, Batch;
    /// Dynamic sampling: groups trained on.
    groups_kept: f64, GroupsKept, Batch;
    /// SAO: smallest ratio `π_θ/π_beh` among tokens that carried gradient (inside the DIS band;
    /// 1 when none did). Min over mini-batches.
    dis_kept_ratio_min: f64, DisKeptRatioMin, Min;
    /// SAO: largest ratio among tokens that carried gradient. Max over mini-batches.
    dis_kept_ratio_max: f64, DisKeptRatioMax, Max;
    /// ARMOR: largest mixed ratio ρ̃ on anchor (reference-sampled) tokens. Max over mini-batches.
    anchor_mixed_ratio_max: f64, AnchorMixedRatioMax, Max;
    /// ARMOR: largest plain ratio π_θ/π_old on the same anchor tokens. Max over mini-batches.
    anchor_plain_ratio_max: f64, AnchorPlainRatioMax, Max;
    /// ARMOR: model tokens of anchor trajectories in the batch.
    anchor_tokens: f64, AnchorTokens, Max;
    /// ARMOR: the ratio mixing's r in force (`armor.loss.mix_ratio`, or the batch's policy
    /// share); 1 = no ratio mixing.
    armor_mix_ratio: f64, ArmorMixRatio, Mean;
    /// ARMOR: weight of π_old in the mixture that replaces it (`armor.loss.replace_ratio`, or the
    /// ratio mixing's r, for `replace_old = "mix"`; 1/2 for `avg`); 0 without such a replacement.
    armor_replace_ratio: f64, ArmorReplaceRatio, Mean;
    /// ARMOR: mean advantage weight of `armor.loss.renorm_adv` over model tokens (1 without).
    armor_renorm_weight: f64, ArmorRenormWeight, Mean;
    /// Actor optimizer steps taken in this call.
    actor_steps: f64, ActorSteps, Count;
    /// Value-only optimizer steps taken in this call.
    critic_steps: f64, CriticSteps, Count;
    /// Model tokens in the batch.
    tokens: usize, Tokens, Sum;
    /// `tokens / step_seconds`.
    tokens_per_s: f64, TokensPerS, Batch
        => "keel_perf_learner_tokens_per_second", "Learner model tokens per second";
    /// Mean outcome reward of the batch (0 for SFT).
    mean_reward: f64, MeanReward, Batch;
    /// Wall time of the whole call.
    step_seconds: f64, StepSeconds, Batch;
    /// Peak resident memory (the kernel's high-water mark, MiB) of the learner's process; with
    /// learner ranks, the largest of any rank's.
    peak_rss_mib: f64, PeakRssMib, Batch
        => "keel_learner_peak_rss_mib", "Peak resident memory of the learner process, the largest over learner ranks (MiB)";
}

/// A number of the metrics log; `null` (how JSON writes a non-finite float) reads as NaN.
fn null_as_nan<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: StatValue + serde::Deserialize<'de>,
{
    let v: Option<T> = serde::Deserialize::deserialize(d)?;
    Ok(v.unwrap_or_else(|| T::from_f64(f64::NAN)))
}

/// Named statistics, in the order they were given: what a loss returns beside its tensor
/// (verl's `(loss, metrics)`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats(Vec<(Stat, f64)>);

impl Stats {
    /// No statistics.
    pub fn new() -> Self {
        Self::default()
    }

    /// These statistics and `stat` = `v`.
    pub fn with(mut self, stat: Stat, v: f64) -> Self {
        self.0.push((stat, v));
        self
    }

    /// Adds `stat` = `v`.
    pub fn push(&mut self, stat: Stat, v: f64) {
        self.0.push((stat, v));
    }

    /// The (statistic, value) pairs, in order.
    pub fn iter(&self) -> impl Iterator<Item = (Stat, f64)> + '_ {
        self.0.iter().copied()
    }
}

impl Extend<(Stat, f64)> for Stats {
    fn extend<I: IntoIterator<Item = (Stat, f64)>>(&mut self, iter: I) {
        self.0.extend(iter);
    }
}

impl StepMetrics {
    /// Sets every statistic `stats` names (a later value of a name wins).
    pub fn absorb(&mut self, stats: &Stats) {
        for (stat, v) in stats.iter() {
            self.set(stat, v);
        }
    }

    /// Every statistic as (name, value), in field order.
    pub fn named(&self) -> impl Iterator<Item = (&'static str, f64)> + '_ {
        STATS.iter().map(|s| (s.name, self.get(s.stat)))
    }

    /// Every statistic's value in table order: what learner ranks exchange (DDP-7).
    pub(crate) fn values(&self) -> Vec<f64> {
        self.named().map(|(_, v)| v).collect()
    }

    /// The statistics of [`StepMetrics::values`]; missing values are 0.
    pub(crate) fn from_values(values: &[f64]) -> StepMetrics {
        let mut m = StepMetrics::default();
        for (s, &v) in STATS.iter().zip(values) {
            m.set(s.stat, v);
        }
        m
    }

    /// One mini-batch's statistics from its micro-batches' (MB-1): losses add up, rates and
    /// means are weighted by each part's share of `tokens`, extremes fold, token counts add.
    pub(crate) fn combine_micro(parts: Vec<StepMetrics>) -> StepMetrics {
        let total: f64 = parts.iter().map(|m| m.tokens as f64).sum::<f64>().max(1.0);
        let mut out = StepMetrics::default();
        for (k, m) in parts.iter().enumerate() {
            let w = m.tokens as f64 / total;
            for s in STATS {
                let (acc, x) = (out.get(s.stat), m.get(s.stat));
                let v = match s.fold {
                    Fold::Mean | Fold::Count => acc + x * w,
                    Fold::Loss => acc + x * w + x * (1.0 - w),
                    Fold::Min | Fold::Max => out.extreme(s, x, k == 0),
                    Fold::Sum => acc + x,
                    Fold::Batch => continue,
                };
                out.set(s.stat, v);
            }
        }
        out
    }

    /// Adds mini-batch `m` (the `index`-th of the call) into the running sums of a call.
    pub(crate) fn accumulate(&mut self, m: &StepMetrics, index: usize) {
        for s in STATS {
            let (acc, x) = (self.get(s.stat), m.get(s.stat));
            let v = match s.fold {
                Fold::Mean | Fold::Loss | Fold::Count => acc + x,
                Fold::Min | Fold::Max => self.extreme(s, x, index == 0),
                Fold::Sum | Fold::Batch => continue,
            };
            self.set(s.stat, v);
        }
    }

    /// Turns the sums of `n` mini-batches into means; counts stay sums (SM-2).
    pub(crate) fn finish_means(&mut self, n: f64) {
        for s in STATS {
            let v = self.get(s.stat);
            match s.fold {
                Fold::Mean | Fold::Loss => self.set(s.stat, v / n),
                Fold::Count => self.set(s.stat, v / n * n),
                Fold::Min | Fold::Max | Fold::Sum | Fold::Batch => {}
            }
        }
    }

    /// Folds in the statistics `other` of another model of the same Dr. MAS step (SM-4):
    /// these are the main model's (or the models' folded so far).
    pub fn merge_model(&mut self, other: &StepMetrics) {
        for s in STATS {
            let (acc, x) = (self.get(s.stat), other.get(s.stat));
            match s.models {
                ModelFold::Main => {}
                ModelFold::Sum => self.set(s.stat, acc + x),
                ModelFold::Max => self.set(s.stat, acc.max(x)),
            }
        }
    }

    /// The extreme of the current value and `x` for a Min/Max statistic (`x` when `first`).
    fn extreme(&self, s: &StatSpec, x: f64, first: bool) -> f64 {
        let acc = self.get(s.stat);
        match (first, s.fold) {
            (true, _) => x,
            (false, Fold::Min) => acc.min(x),
            _ => acc.max(x),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn st3_fields_serialize_in_table_order_tokens_as_integer() {
        let m = StepMetrics {
            tokens: 7,
            loss: 1.5,
            ..StepMetrics::default()
        };
        let text = serde_json::to_string(&m).expect("json");
        let keys: Vec<&str> = STATS.iter().map(|s| s.name).collect();
        let mut at = 0;
        for k in &keys {
            let pos = text[at..].find(&format!("\"{k}\":")).expect(k);
            at += pos;
        }
        assert!(text.starts_with("{\"loss\":1.5,"), "{text}");
        assert!(text.contains("\"tokens\":7,"), "{text}");
        assert_eq!(keys.len(), 46);
    }

    #[test]
    fn null_reads_as_nan_and_missing_as_zero() {
        let m: StepMetrics =
            serde_json::from_str(r#"{"grad_norm":null,"tokens":3}"#).expect("parse");
        assert!(m.grad_norm.is_nan());
        assert_eq!((m.tokens, m.loss), (3, 0.0));
    }

    #[test]
    fn get_and_set_agree_with_the_fields() {
        let mut m = StepMetrics::default();
        m.absorb(
            &Stats::new()
                .with(Stat::ClipFrac, 0.25)
                .with(Stat::Tokens, 4.0),
        );
        assert_eq!((m.clip_frac, m.tokens), (0.25, 4));
        assert_eq!(m.get(Stat::ClipFrac), 0.25);
        assert!(m.named().any(|(n, v)| n == "clip_frac" && v == 0.25));
    }

    #[test]
    fn micro_batches_weight_means_and_add_losses() {
        let a = StepMetrics {
            loss: 1.0,
            entropy: 1.0,
            dis_kept_ratio_min: 0.5,
            anchor_tokens: 2.0,
            tokens: 1,
            ..StepMetrics::default()
        };
        let b = StepMetrics {
            loss: 2.0,
            entropy: 4.0,
            dis_kept_ratio_min: 0.7,
            anchor_tokens: 3.0,
            tokens: 3,
            ..StepMetrics::default()
        };
        let c = StepMetrics::combine_micro(vec![a, b]);
        assert_eq!(c.tokens, 4);
        assert!((c.loss - 3.0).abs() < 1e-12);
        assert!((c.entropy - 3.25).abs() < 1e-12);
        assert_eq!((c.dis_kept_ratio_min, c.anchor_tokens), (0.5, 3.0));
    }

    #[test]
    fn sm4_models_sum_the_loss_take_the_largest_spike_and_keep_the_rest_main() {
        let mut main = StepMetrics {
            loss: 1.0,
            grad_norm: 2.0,
            approx_kl: 0.5,
            entropy: 0.7,
            pg_loss: 0.25,
            tokens: 10,
            ..StepMetrics::default()
        };
        let agent = StepMetrics {
            loss: 3.0,
            grad_norm: 1.0,
            approx_kl: f64::NAN,
            entropy: 0.1,
            pg_loss: 9.0,
            tokens: 4,
            ..StepMetrics::default()
        };
        main.merge_model(&agent);
        assert_eq!((main.loss, main.grad_norm, main.approx_kl), (4.0, 2.0, 0.5));
        assert_eq!((main.entropy, main.pg_loss, main.tokens), (0.7, 0.25, 10));
        let folded: Vec<&str> = STATS
            .iter()
            .filter(|s| s.models != ModelFold::Main)
            .map(|s| s.name)
            .collect();
        assert_eq!(folded, ["loss", "approx_kl", "grad_norm"]);
    }
}
