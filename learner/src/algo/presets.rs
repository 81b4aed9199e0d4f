//! The algorithm registry: one [`Preset`] per named algorithm, mapped to components and the
//! spec's default hyper-parameters ([`PresetConfig`]). `learner.algo` in the TOML config names a
//! preset; `learner.*` override keys replace single fields (see `LearnerConfig::resolve`).
//!
//! Adding an algorithm built from existing components touches this file only: a variant in
//! [`Preset`], its entry in [`Preset::ALL`], and its arm in [`Preset::config`]. One with a new
//! loss or estimator adds that component's module as the second file (and its arm in the
//! learner's dispatch).
//!
//! | preset | policy loss | advantage | aggregation | extras |
//! |---|---|---|---|---|
//! | ppo | PPO clip 0.2/0.2, dual c=3 | GAE γ=1 λ=1, whitened | token-mean | shared critic (joint, value_coef 0.5, clip 0.5) |
//! | grpo | PPO clip 0.2/0.2, dual c=3 | GRPO (std) | token-mean | — |
//! | dr_grpo | PPO clip 0.2/0.2, dual c=3 | GRPO (no std) | seq-mean-token-sum-norm | — |
//! | gspo | GSPO ε 3e-3/4e-3 | GRPO (std) | seq-mean-token-mean | — |
//! | dapo | PPO clip 0.2/0.28, dual c=3 | GRPO (std) | token-mean | group filter, overlong shaping, weight decay 0.1 |
//! | sampo | GSPO ratio per turn, ε 3e-3/4e-3 | GiGPO ω=1 γ=0.95 | seq-mean-token-mean | k3 KL 0.01, entropy 0.001, invalid −0.1, filter (3 tries, cold start 15) |
//! | sao | DIS band (0.7, 6.0) vs behaviour | skip-obs GAE, λ=1−1/(1.5L) | seq-mean-token-mean | separate critic K=2, warm-up 10, lr ×5 |
//! | armor | PPO on mixed ratio r = policy share (15/16 in the paper), 0.2/0.28, c=10, π_old recomputed | GRPO (std) | token-mean | reference policy, anchor rollouts, dynamic sampling (10 passes), weight decay 0.1, 10 warm-up updates |
//! | so_ppo | turn-level ratio ε=0.2 + CTN δ=5 | GAE, whitened | token-mean | shared critic (joint) |
//! | so_grpo | turn-level ratio ε=0.2 + CTN δ=5 | GRPO (std) | token-mean | — |
//! | rtpo | PPO clip 0.2/0.2 on the branched turn | sibling GRPO | token-mean | — |
//! | dr_mas | PPO clip 0.2/0.2, dual c=3 | GRPO per (group, agent) | token-mean | invalid −0.1 |
//! | pats | PPO clip 0.2/0.2, dual c=3 | GRPO (std) | token-mean | scaffold (runtime, not in the learner) |
//!
//! Every preset's AdamW weight decay is verl's 0.01 and its warm-up 0 unless its row says otherwise.
//!
//! Invariants:
//! - PRS-1: every preset's name round-trips through serde and [`Preset::from_name`]; `ALL` lists
//!   each variant once.
//! - PRS-2: `config()` is a pure function of the preset; overrides never mutate the registry.

use crate::algo::aggregation::AggMode;
use crate::algo::armor::{ArmorLoss, ARMOR_CLIP};
use crate::algo::gigpo::GigpoNorm;
use crate::algo::kl::{KlController, KlEstimator};
use crate::algo::ppo::ClipBounds;
use crate::algo::rollout_correction::RolloutCorrection;
use crate::algo::value::{CriticModel, CriticSchedule};

/// A named algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Preset {
    /// PPO with a critic (verl defaults).
    Ppo,
    /// GRPO (verl defaults; the quickstart's).
    Grpo,
    /// Dr. GRPO: no std normalisation, length-normalised sequence sums.
    DrGrpo,
    /// GSPO: sequence-level ratio.
    Gspo,
    /// DAPO: clip-higher, token-mean, dynamic sampling, overlong shaping.
    Dapo,
    /// ARLArena's SAMPO: GSPO + GiGPO + filtering + KL.
    Sampo,
    /// SAO: single rollout, critic baseline, DIS mask.
    Sao,
    /// ARMOR: mixed-probability ratio with the reference policy.
    Armor,
    /// SO-PPO: turn-level ratio + CTN with a critic.
    SoPpo,
    /// SO-GRPO: turn-level ratio + CTN with GRPO advantages.
    SoGrpo,
    /// RTPO: sibling advantages, loss on the branched turn.
    Rtpo,
    /// Dr. MAS: agent-wise GRPO normalisation.
    DrMas,
    /// PATS: GRPO under a training-only prompt scaffold.
    Pats,
}

/// Which policy loss (each a module of `algo`).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PolicyLossKind {
    /// Vanilla PPO clip (`algo::ppo`), dual-clip when `clip.dual` is set.
    Ppo,
    /// GSPO sequence ratio (`algo::gspo`).
    Gspo,
    /// SORL turn-level ratio with optional CTN (`algo::sorl`).
    TurnLevel {
        /// CTN threshold δ, or None for no CTN.
        ctn_delta: Option<f64>,
    },
    /// SAO's DIS mask (`algo::sao`); the band is `(1 − clip.low, 1 + clip.high)`.
    Dis,
    /// ARMOR's mixed ratio (`algo::armor`) with its options (`[armor.loss]`).
    Armor(ArmorLoss),
    /// REINFORCE with truncated IS weights (`algo::reinforce`).
    Reinforce {
        /// Truncation τ, or None.
        is_threshold: Option<f64>,
    },
}

/// Which advantage estimator.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AdvantageKind {
    /// Skip-observation GAE with the critic (`algo::gae`), γ and λ from the config.
    Gae,
    /// SAO's GAE with the length-adaptive λ (`algo::sao`); critic targets with λ = 1.
    SaoGae {
        /// α of `λ = 1 − 1/(α·L)`.
        alpha: f64,
    },
    /// GRPO over rollout groups (`algo::grpo`).
    Grpo,
    /// GiGPO over turns (`algo::gigpo`).
    Gigpo {
        /// Weight ω of the step part.
        omega: f64,
        /// γ of the step returns.
        step_gamma: f64,
        /// Normalisation of both parts.
        norm: GigpoNorm,
        /// Step groups by text similarity at this SequenceMatcher-ratio threshold (ARL-Arena's
        /// `enable_similarity`, 0.95 when on); None = identical anchor states (its default).
        #[serde(default)]
        similarity: Option<f64>,
    },
    /// Dr. MAS agent-wise GRPO (`algo::drmas`).
    DrMas,
    /// RTPO sibling advantages (`algo::rtpo`).
    Rtpo,
}

/// Where the PPO ratio's denominator comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RatioBase {
    /// The batch's behaviour log-probs (bypass mode, §1.10): corrects for staleness.
    Behaviour,
    /// A forward pass of the weights at the start of the update (π_old recompute).
    Recompute,
}

/// KL to the reference as a loss term.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct KlLoss {
    /// Estimator.
    pub estimator: KlEstimator,
    /// Coefficient.
    pub coef: f64,
}

/// KL to the reference subtracted from token rewards (GAE presets only).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct KlReward {
    /// Estimator (verl default k1).
    pub estimator: KlEstimator,
    /// β and its controller.
    pub controller: KlController,
}

/// Dynamic sampling (DAPO group filter).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DynamicSampling {
    /// Generation tries before filling with uniform groups (0 = unlimited).
    pub max_tries: usize,
    /// Updates before filtering starts.
    pub cold_start_updates: u64,
    /// What happens to the groups still uniform after the last try: `true` trains on them too,
    /// filling the batch (SAMPO's `filter_group_data`: informative groups first, then uniform
    /// ones in order); `false` drops them (DAPO's filter).
    #[serde(default)]
    pub fill_with_uniform: bool,
}

/// DAPO overlong reward shaping.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Overlong {
    /// `L_max` in model tokens.
    pub max_len: usize,
    /// Buffer `B`.
    pub buffer: usize,
    /// Factor `f`.
    pub factor: f64,
}

/// Everything `train_step` needs to know about an algorithm.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PresetConfig {
    /// The policy loss.
    pub policy_loss: PolicyLossKind,
    /// Ratio clip bounds (DIS: its band).
    pub clip: ClipBounds,
    /// Denominator of the ratio.
    pub ratio_base: RatioBase,
    /// Loss aggregation.
    pub agg: AggMode,
    /// `H` of seq-mean-token-sum-norm (None: padded length).
    pub loss_scale_factor: Option<f64>,
    /// Sequence-mask δ (ARLArena GRPO_SM), or None.
    pub seq_mask_delta: Option<f64>,
    /// The advantage estimator.
    pub advantage: AdvantageKind,
    /// GRPO-family: divide by the group std.
    pub normalize_std: bool,
    /// GAE γ.
    pub gamma: f64,
    /// GAE λ (GAE only; SAO computes its own).
    pub lam: f64,
    /// Whiten advantages over the batch.
    pub whiten: bool,
    /// KL-to-reference loss.
    pub kl_loss: Option<KlLoss>,
    /// KL-to-reference in the reward.
    pub kl_reward: Option<KlReward>,
    /// Entropy bonus coefficient.
    pub entropy_coef: f64,
    /// The critic, when the advantage needs one.
    pub critic: Option<CriticSchedule>,
    /// Dynamic sampling.
    pub dynamic_sampling: Option<DynamicSampling>,
    /// Overlong shaping.
    pub overlong: Option<Overlong>,
    /// Penalty per invalid action (subtracted from the record's score).
    pub invalid_action_penalty: f64,
    /// AdamW decoupled weight decay (verl's actor and critic default 0.01; DAPO's recipes 0.1).
    pub weight_decay: f64,
    /// Learning-rate warm-up in updates (0 = none; ARMOR's scripts 10).
    #[serde(default)]
    pub lr_warmup_steps: u64,
    /// Layout P (spec §0.1): every turn is a record, so "seq" aggregation averages over turns.
    #[serde(default)]
    pub turn_records: bool,
    /// Truncated IS / sequence rejection against the rollout log-probs (`ratio_base =
    /// recompute` only), or None.
    #[serde(default)]
    pub rollout_correction: Option<RolloutCorrection>,
    /// What the learner does not do for this algorithm (runtime parts), for `keel algo show`.
    pub runtime_notes: String,
}

impl PresetConfig {
    /// Whether the algorithm needs a critic.
    pub fn needs_critic(&self) -> bool {
        self.critic.is_some()
    }

    /// Whether the policy model carries the value head (a shared critic).
    pub fn policy_value_head(&self) -> bool {
        self.critic
            .as_ref()
            .is_some_and(|c| c.model == CriticModel::Shared)
    }

    /// GiGPO's similarity threshold, when its step groups are by text similarity.
    pub fn gigpo_similarity(&self) -> Option<f64> {
        match self.advantage {
            AdvantageKind::Gigpo { similarity, .. } => similarity,
            _ => None,
        }
    }

    /// Whether the learner must keep a reference policy.
    pub fn needs_reference(&self) -> bool {
        self.kl_loss.is_some()
            || self.kl_reward.is_some()
            || matches!(self.policy_loss, PolicyLossKind::Armor(_))
    }
}

const VANILLA: ClipBounds = ClipBounds {
    low: 0.2,
    high: 0.2,
    dual: Some(3.0),
};
const GSPO_CLIP: ClipBounds = ClipBounds {
    low: 3e-3,
    high: 4e-3,
    dual: None,
};

fn joint_critic() -> CriticSchedule {
    CriticSchedule {
        steps_per_actor_step: 0,
        warmup_updates: 0,
        lr_ratio: 1.0,
        trainable: vec![],
        value_coef: 0.5,
        value_clip: Some(0.5),
        model: CriticModel::Shared,
    }
}

/// The verl GRPO baseline every other preset starts from.
fn base() -> PresetConfig {
    PresetConfig {
        policy_loss: PolicyLossKind::Ppo,
        clip: VANILLA,
        ratio_base: RatioBase::Behaviour,
        agg: AggMode::TokenMean,
        loss_scale_factor: None,
        seq_mask_delta: None,
        advantage: AdvantageKind::Grpo,
        normalize_std: true,
        gamma: 1.0,
        lam: 1.0,
        whiten: false,
        kl_loss: None,
        kl_reward: None,
        entropy_coef: 0.0,
        critic: None,
        dynamic_sampling: None,
        overlong: None,
        invalid_action_penalty: 0.0,
        weight_decay: 0.01,
        lr_warmup_steps: 0,
        turn_records: false,
        rollout_correction: None,
        runtime_notes: String::new(),
    }
}

impl Preset {
    /// Every preset, in documentation order (PRS-1).
    pub const ALL: [Preset; 13] = [
        Preset::Ppo,
        Preset::Grpo,
        Preset::DrGrpo,
        Preset::Gspo,
        Preset::Dapo,
        Preset::Sampo,
        Preset::Sao,
        Preset::Armor,
        Preset::SoPpo,
        Preset::SoGrpo,
        Preset::Rtpo,
        Preset::DrMas,
        Preset::Pats,
    ];

    /// The config name (`so_ppo`, …).
    pub fn name(self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    }

    /// The preset called `name`, if any.
    pub fn from_name(name: &str) -> Option<Preset> {
        Preset::ALL.into_iter().find(|p| p.name() == name)
    }

    /// One line for `keel algo list`, with the spec section.
    pub fn summary(self) -> &'static str {
        match self {
            Preset::Ppo => "PPO with a critic: GAE, clipped value loss, dual-clip (spec §1.1, §1.3)",
            Preset::Grpo => "GRPO: group-normalised outcome advantages, PPO clip (spec §1.4)",
            Preset::DrGrpo => "Dr. GRPO: no std normalisation, seq-mean-token-sum-norm (spec §1.5)",
            Preset::Gspo => "GSPO: sequence-level length-normalised ratio (spec §1.6)",
            Preset::Dapo => "DAPO: clip-higher, dynamic sampling, overlong shaping (spec §1.7)",
            Preset::Sampo => "SAMPO (ARLArena): GSPO + GiGPO + filtering + k3 KL (spec §2)",
            Preset::Sao => "SAO: single rollout, critic baseline, DIS mask vs behaviour (spec §3)",
            Preset::Armor => "ARMOR: PPO on a policy/reference mixture ratio (spec §4)",
            Preset::SoPpo => "SO-PPO (SORL): turn-level ratio + clipping-triggered normalisation, critic (spec §6)",
            Preset::SoGrpo => "SO-GRPO (SORL): turn-level ratio + clipping-triggered normalisation, GRPO (spec §6)",
            Preset::Rtpo => "RTPO: sibling advantages, loss on the branched turn only (spec §7)",
            Preset::DrMas => "Dr. MAS: GRPO normalised per (group, agent) (spec §8)",
            Preset::Pats => "PATS: GRPO under a training-only prompt scaffold (spec §5)",
        }
    }

    /// Components and default hyper-parameters (PRS-2).
    pub fn config(self) -> PresetConfig {
        match self {
            Preset::Ppo => PresetConfig { advantage: AdvantageKind::Gae, whiten: true, critic: Some(joint_critic()), ..base() },
            Preset::Grpo => base(),
            Preset::DrGrpo => PresetConfig { normalize_std: false, agg: AggMode::SeqMeanTokenSumNorm, ..base() },
            Preset::Gspo => PresetConfig { policy_loss: PolicyLossKind::Gspo, clip: GSPO_CLIP, agg: AggMode::SeqMeanTokenMean, ..base() },
            Preset::Dapo => PresetConfig {
                clip: ClipBounds { low: 0.2, high: 0.28, dual: Some(3.0) },
                dynamic_sampling: Some(DynamicSampling { max_tries: 10, cold_start_updates: 0, fill_with_uniform: false }),
                overlong: Some(Overlong { max_len: 20480, buffer: 4096, factor: 1.0 }),
                weight_decay: 0.1,
                runtime_notes: "the generator re-rolls groups whose rewards are all equal (same task, fresh sampling seed) up to max_tries; the learner then drops the groups still uniform".into(),
                ..base()
            },
            Preset::Sampo => PresetConfig {
                policy_loss: PolicyLossKind::TurnLevel { ctn_delta: None },
                clip: GSPO_CLIP,
                agg: AggMode::SeqMeanTokenMean,
                advantage: AdvantageKind::Gigpo { omega: 1.0, step_gamma: 0.95, norm: GigpoNorm::MeanStdNorm, similarity: None },
                kl_loss: Some(KlLoss { estimator: KlEstimator::K3, coef: 0.01 }),
                entropy_coef: 0.001,
                invalid_action_penalty: 0.1,
                dynamic_sampling: Some(DynamicSampling { max_tries: 3, cold_start_updates: 15, fill_with_uniform: true }),
                // SAMPO's trainer recomputes π_old before the update (spec §2.4, §9).
                ratio_base: RatioBase::Recompute,
                turn_records: true,
                runtime_notes: "layout P over stored layout-C trajectories: GSPO's ratio and seq-mean-token-mean are per turn record; GiGPO step groups use the env's anchor keys stored with each turn; the generator re-rolls uniform groups (dynamic sampling) with the same task seed, and the groups still uniform after the last try are trained on (the reference's fill rule); π_old is recomputed at the start of the update".into(),
                ..base()
            },
            Preset::Sao => PresetConfig {
                policy_loss: PolicyLossKind::Dis,
                clip: ClipBounds { low: 0.3, high: 5.0, dual: None },
                agg: AggMode::SeqMeanTokenMean,
                advantage: AdvantageKind::SaoGae { alpha: 1.5 },
                critic: Some(CriticSchedule {
                    steps_per_actor_step: 2,
                    warmup_updates: 10,
                    lr_ratio: 5.0,
                    trainable: vec![],
                    value_coef: 1.0,
                    value_clip: None,
                    model: CriticModel::Separate,
                }),
                runtime_notes: "the critic is a separate value model (the policy's architecture with a score head, initialised from the policy at the first update or from model.critic_path) with its own AdamW; learner.critic_model = \"shared\" puts it on the policy's trunk instead; one rollout per prompt is a rollout setting (rollout.group_size = 1)".into(),
                ..base()
            },
            Preset::Armor => PresetConfig {
                policy_loss: PolicyLossKind::Armor(ArmorLoss::default()),
                clip: ARMOR_CLIP,
                ratio_base: RatioBase::Recompute,
                // AdamW as the shipped scripts: 10 warm-up updates, weight decay 0.1 (spec §4.3).
                weight_decay: 0.1,
                lr_warmup_steps: 10,
                dynamic_sampling: Some(DynamicSampling { max_tries: 10, cold_start_updates: 0, fill_with_uniform: false }),
                runtime_notes: "reference = the weights at the first RL update (or --reference); generators sample rollout.anchor_episodes per task from it, the first correct one joins the group with source = anchor; learner.reference_reset_every copies the policy into the reference and records it in the lineage".into(),
                ..base()
            },
            Preset::SoPpo => PresetConfig {
                policy_loss: PolicyLossKind::TurnLevel { ctn_delta: Some(5.0) },
                clip: ClipBounds { low: 0.2, high: 0.2, dual: None },
                advantage: AdvantageKind::Gae,
                whiten: true,
                critic: Some(joint_critic()),
                ..base()
            },
            Preset::SoGrpo => PresetConfig {
                policy_loss: PolicyLossKind::TurnLevel { ctn_delta: Some(5.0) },
                clip: ClipBounds { low: 0.2, high: 0.2, dual: None },
                ..base()
            },
            Preset::Rtpo => PresetConfig {
                clip: ClipBounds { low: 0.2, high: 0.2, dual: None },
                advantage: AdvantageKind::Rtpo,
                runtime_notes: "the controller runs reverse trees: one trunk per task with its boundary states stored, then per boundary (last first) rollout.group_size siblings continued with the current weights; only the branched turn (trained_turn) is trained".into(),
                ..base()
            },
            Preset::DrMas => PresetConfig {
                advantage: AdvantageKind::DrMas,
                invalid_action_penalty: 0.1,
                runtime_notes: "advantages per (group, agent) over turn records; [[agent_models]] maps agents to separate models, each with its own optimizer, lr and clip".into(),
                ..base()
            },
            Preset::Pats => PresetConfig {
                runtime_notes: "the scaffold bank, evidence cards and reviewer run in the controller ([pats]); the learner trains GRPO on the rendered prompts exactly as sampled".into(),
                ..base()
            },
        }
    }

    /// A multi-line description for `keel algo show`.
    pub fn describe(self) -> String {
        let cfg = self.config();
        let json = serde_json::to_string_pretty(&cfg).unwrap_or_default();
        format!(
            "{}: {}\ncritic: {}   reference policy: {}\n{}\n",
            self.name(),
            self.summary(),
            match cfg.critic.as_ref().map(|c| c.model) {
                None => "no",
                Some(CriticModel::Shared) => "value head on the policy",
                Some(CriticModel::Separate) => "separate value model",
            },
            if cfg.needs_reference() { "yes" } else { "no" },
            json
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pr1_names_round_trip() {
        let mut seen = std::collections::HashSet::new();
        for p in Preset::ALL {
            assert!(seen.insert(p), "{p:?} twice");
            assert_eq!(Preset::from_name(&p.name()), Some(p));
            let json = serde_json::to_string(&p).expect("json");
            assert_eq!(serde_json::from_str::<Preset>(&json).expect("back"), p);
        }
        let names: Vec<String> = Preset::ALL.iter().map(|p| p.name()).collect();
        assert_eq!(
            names,
            [
                "ppo", "grpo", "dr_grpo", "gspo", "dapo", "sampo", "sao", "armor", "so_ppo",
                "so_grpo", "rtpo", "dr_mas", "pats"
            ]
        );
        assert_eq!(Preset::from_name("nope"), None);
    }

    #[test]
    fn spec_defaults() {
        let dapo = Preset::Dapo.config();
        assert_eq!((dapo.clip.low, dapo.clip.high), (0.2, 0.28));
        let sao = Preset::Sao.config();
        assert_eq!(
            (sao.clip.low, sao.clip.high, sao.ratio_base),
            (0.3, 5.0, RatioBase::Behaviour)
        );
        let critic = sao.critic.expect("critic");
        assert_eq!(
            (critic.steps_per_actor_step, critic.warmup_updates),
            (2, 10)
        );
        let armor = Preset::Armor.config();
        assert_eq!(
            armor.policy_loss,
            PolicyLossKind::Armor(ArmorLoss::default())
        );
        assert!(armor.needs_reference() && !armor.needs_critic());
        let sampo = Preset::Sampo.config();
        assert_eq!(
            sampo.kl_loss,
            Some(KlLoss {
                estimator: KlEstimator::K3,
                coef: 0.01
            })
        );
        assert_eq!(Preset::Gspo.config().agg, AggMode::SeqMeanTokenMean);
        assert!(!Preset::DrGrpo.config().normalize_std);
        assert!(Preset::Ppo.config().needs_critic() && Preset::SoPpo.config().needs_critic());
        for p in Preset::ALL {
            assert!(p.describe().starts_with(&p.name()));
        }
    }

    #[test]
    fn weight_decay_is_per_preset_and_overridable() {
        for p in Preset::ALL {
            let want = if matches!(p, Preset::Dapo | Preset::Armor) {
                0.1
            } else {
                0.01
            };
            assert_eq!(p.config().weight_decay, want, "{p:?}");
            // ARMOR's scripts warm the learning rate up over 10 updates; nobody else does.
            let warmup = if p == Preset::Armor { 10 } else { 0 };
            assert_eq!(p.config().lr_warmup_steps, warmup, "{p:?}");
        }
        let cfg = crate::LearnerConfig {
            lr_warmup_steps: Some(0),
            ..crate::LearnerConfig::for_preset(Preset::Armor)
        };
        assert_eq!(cfg.resolve().lr_warmup_steps, 0);
        let cfg = crate::LearnerConfig {
            weight_decay: Some(0.0),
            ..crate::LearnerConfig::for_preset(Preset::Dapo)
        };
        assert_eq!(cfg.resolve().weight_decay, 0.0);
        let bad = crate::LearnerConfig {
            weight_decay: Some(2.0),
            ..crate::LearnerConfig::default()
        };
        let e = bad.validate().expect_err("2.0").to_string();
        assert!(e.contains("learner.weight_decay"), "{e}");
    }
}
