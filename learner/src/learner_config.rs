//! The learner's configuration: which algorithm (a preset name), the optimisation settings, and
//! optional overrides of the preset's hyper-parameters.
//!
//! `algo` names a [`Preset`]; the preset supplies the spec's defaults ([`Preset::config`]) and
//! each override key that is set replaces one field ([`LearnerConfig::resolve`]). The keys of the
//! walking skeleton (`clip_low`, `clip_high`, `gamma`, `lam`, `value_coef`, `value_clip`,
//! `entropy_coef`, `grpo_normalize_std`) keep their names and meaning as overrides.
//!
//! Invariants:
//! - LC-1: `validate` accepts exactly the documented ranges, checked on the *resolved*
//!   hyper-parameters; a rejection names the key as `learner.<field>` and shows the offending
//!   value ("learner.lr must be in (0, 1], got 5").
//! - LC-2: an unset override means the preset's default; the defaults of the optimisation keys
//!   are the quickstart's (`grpo`, lr 1e-3, 2 mini-batches).
//! - LC-3: every key may be omitted in TOML (`serde(default)`), unknown keys are rejected.

use crate::algo::aggregation::AggMode;
use crate::algo::armor::ArmorLoss;
use crate::algo::kl::{KlController, KlEstimator};
use crate::algo::presets::{
    AdvantageKind, DynamicSampling, KlLoss, KlReward, PolicyLossKind, Preset, PresetConfig,
    RatioBase,
};
use crate::algo::rollout_correction::{IsLevel, RejectLevel, RolloutCorrection};
use crate::algo::value::{CriticModel, CriticSchedule};
use crate::data_parallel::ReduceDtype;
use crate::error::LearnerError;
use crate::lr_schedule::LrSchedule;

/// The walking skeleton's name for the objective; now the preset registry.
pub type Algo = Preset;

/// The policy losses `learner.policy_loss` can select (those without parameters of their own).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyLossChoice {
    /// Vanilla PPO clip (dual-clip per `learner.dual_clip`).
    Ppo,
    /// GSPO's sequence ratio.
    Gspo,
    /// REINFORCE with truncated IS weights against the behaviour log-probs.
    Reinforce,
}

/// verl's default `rollout_is_threshold`.
pub const ROLLOUT_IS_THRESHOLD: f64 = 2.0;

/// Hyper-parameters of `Learner::train_step`.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LearnerConfig {
    /// The algorithm preset (`keel algo list`).
    pub algo: Preset,
    /// AdamW learning rate, in (0, 1].
    pub lr: f64,
    /// Override: AdamW decoupled weight decay, in [0, 1] (matrices and embeddings only; the
    /// preset's default is verl's 0.01, DAPO's recipes 0.1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight_decay: Option<f64>,
    /// Global gradient-norm clip, > 0.
    pub max_grad_norm: f64,
    /// Override: learning-rate warm-up in updates (LS-1); 0 = none (the preset's default is 0,
    /// ARMOR's 10).
    pub lr_warmup_steps: Option<u64>,
    /// Learning-rate shape after the warm-up: constant or cosine (LS-1).
    pub lr_schedule: LrSchedule,
    /// Cosine floor as a fraction of `lr`, in [0, 1].
    pub lr_min_ratio: f64,
    /// Most padded tokens (rows × length) in one forward/backward of an update; the
    /// mini-batch's gradients accumulate over such micro-batches (MB-1). 0 = one pass.
    pub max_tokens_per_microbatch: usize,
    /// Data-parallel learner ranks (LR-9, DDP-1..4): each trains its share of every
    /// mini-batch, gradients are summed over c10d, AdamW's state is sharded. 1 = alone.
    pub ranks: usize,
    /// The element type gradients are summed in over the ranks (DDP-6).
    pub reduce_dtype: ReduceDtype,
    /// Recompute layer activations in the backward pass instead of keeping them (AC-1):
    /// about one extra forward of compute for activation memory of one layer.
    pub activation_checkpointing: bool,
    /// Passes over each batch, ≥ 1.
    pub epochs: usize,
    /// Optimizer steps per pass (trajectories split evenly), ≥ 1.
    pub minibatches: usize,
    /// Override: ratio clip below 1 (`ε_low`; SAO: the DIS band's lower width), in (0, 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clip_low: Option<f64>,
    /// Override: ratio clip above 1 (`ε_high`; 0.28 = DAPO clip-higher), in (0, 10].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clip_high: Option<f64>,
    /// Override: dual-clip constant c > 1, or 0 to turn dual-clip off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dual_clip: Option<f64>,
    /// Override: the policy loss — `ppo` (vanilla clip), `gspo` or `reinforce` (verl's bypass
    /// mode: `−A·logp·min(sg(π/π_beh), τ)`); the turn-level, DIS and ARMOR losses come with
    /// their presets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy_loss: Option<PolicyLossChoice>,
    /// Override: REINFORCE's IS-weight truncation τ (verl `rollout_is_threshold`, default 2.0),
    /// > 0, or 0 for untruncated weights; only with `policy_loss = "reinforce"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout_is_threshold: Option<f64>,
    /// Override: truncated importance weights against the rollout log-probs (verl
    /// `rollout_is`): `token` (the peers' TIS) or `sequence`, truncated at
    /// `rollout_is_threshold` (2.0); needs `ratio_base = "recompute"` (RCO-*).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout_is: Option<IsLevel>,
    /// Override: reject whole sequences whose ratio to the rollout policy (`sequence`) or its
    /// geometric mean per token (`geometric`) is outside [1/ρ, ρ] (verl `rollout_rs`); needs
    /// `ratio_base = "recompute"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout_rs: Option<RejectLevel>,
    /// Override: ρ of `rollout_rs`, > 1 (default 2.0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout_rs_threshold: Option<f64>,
    /// Override: loss aggregation (`token-mean`, `seq-mean-token-mean`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss_agg: Option<AggMode>,
    /// Override: `H` of seq-mean-token-sum-norm, > 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss_scale_factor: Option<f64>,
    /// Override: ratio denominator (`behaviour` or `recompute`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio_base: Option<RatioBase>,
    /// Override: ARLArena sequence-mask δ, > 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq_mask_delta: Option<f64>,
    /// Override: GAE discount, in [0, 1].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gamma: Option<f64>,
    /// Override: GAE λ, in [0, 1].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lam: Option<f64>,
    /// Override: whiten advantages over the batch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub whiten: Option<bool>,
    /// Override: GRPO-family std normalisation (false = Dr. GRPO).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grpo_normalize_std: Option<bool>,
    /// Override: weight of the joint value loss, ≥ 0 (critic presets).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value_coef: Option<f64>,
    /// Override: value clip range, > 0, or 0 for the unclipped loss (critic presets).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value_clip: Option<f64>,
    /// Override: value-only optimizer steps per mini-batch (critic presets).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub critic_steps: Option<usize>,
    /// Override: critic-only warm-up updates (critic presets).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub critic_warmup: Option<u64>,
    /// Override: parameter-name prefixes the value-only steps train (critic presets; e.g.
    /// `["score", "model.layers.1.mlp"]`); the rest is frozen during them; empty = all. A shared
    /// critic is the policy's trunk, so prefixes beyond `score` also move the policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub critic_trainable: Option<Vec<String>>,
    /// Override: the critic is the value head on the policy's trunk (`shared`) or a value
    /// model of its own with its own optimizer (`separate`) (critic presets).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub critic_model: Option<CriticModel>,
    /// Override: entropy bonus coefficient, ≥ 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entropy_coef: Option<f64>,
    /// Override: KL-to-reference loss coefficient, ≥ 0 (0 turns the KL loss off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kl_coef: Option<f64>,
    /// Override: KL estimator of the KL loss and KL in reward (`k1`, `k3`, `low_var_kl+`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kl_estimator: Option<KlEstimator>,
    /// Override: KL-in-reward β, ≥ 0 (fixed controller; 0 = off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kl_reward_coef: Option<f64>,
    /// Override: KL-in-reward target; with it the controller is adaptive (horizon 10000).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kl_reward_target: Option<f64>,
    /// Override: penalty per invalid action, ≥ 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub invalid_action_penalty: Option<f64>,
    /// Override: dynamic-sampling rollout passes per batch (0 = unlimited; turns dynamic
    /// sampling on for any preset).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dynamic_sampling_tries: Option<usize>,
    /// Override: updates before dynamic sampling starts (its cold start).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dynamic_sampling_cold_start: Option<u64>,
    /// Override: GiGPO step groups by anchor-state text similarity (ARL-Arena's
    /// `enable_similarity`): turns join a group when difflib's SequenceMatcher ratio to its
    /// first observation is at least this, in (0, 1) (the reference's 0.95); GiGPO presets only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gigpo_similarity: Option<f64>,
    /// Keep a frozen reference policy (the weights at the first update) and report `kl_ref`
    /// even when the preset has no KL term and no reference: one extra forward pass per
    /// micro-batch, no change to the loss. Presets with a reference always report it.
    pub reference_kl: bool,
    /// ARMOR's loss options; not a `[learner]` key: the run config sets them from
    /// `[armor.loss]` (one place for ARMOR's settings).
    #[serde(skip)]
    pub armor: ArmorLoss,
}

impl Default for LearnerConfig {
    fn default() -> Self {
        LearnerConfig {
            algo: Preset::Grpo,
            lr: 1e-3,
            weight_decay: None,
            max_grad_norm: 1.0,
            lr_warmup_steps: None,
            lr_schedule: LrSchedule::Constant,
            lr_min_ratio: 0.0,
            max_tokens_per_microbatch: 0,
            ranks: 1,
            reduce_dtype: ReduceDtype::F32,
            activation_checkpointing: false,
            epochs: 1,
            minibatches: 2,
            clip_low: None,
            clip_high: None,
            dual_clip: None,
            policy_loss: None,
            rollout_is_threshold: None,
            rollout_is: None,
            rollout_rs: None,
            rollout_rs_threshold: None,
            loss_agg: None,
            loss_scale_factor: None,
            ratio_base: None,
            seq_mask_delta: None,
            gamma: None,
            lam: None,
            whiten: None,
            grpo_normalize_std: None,
            value_coef: None,
            value_clip: None,
            critic_steps: None,
            critic_warmup: None,
            critic_trainable: None,
            critic_model: None,
            entropy_coef: None,
            kl_coef: None,
            kl_estimator: None,
            kl_reward_coef: None,
            kl_reward_target: None,
            invalid_action_penalty: None,
            dynamic_sampling_tries: None,
            dynamic_sampling_cold_start: None,
            gigpo_similarity: None,
            reference_kl: false,
            armor: ArmorLoss::default(),
        }
    }
}

/// An interval check: `lo_open`/`hi_open` say whether each end is excluded.
fn in_range(
    key: &str,
    v: f64,
    lo: f64,
    lo_open: bool,
    hi: f64,
    hi_open: bool,
) -> Result<(), LearnerError> {
    let above = if lo_open { v > lo } else { v >= lo };
    let below = if hi_open { v < hi } else { v <= hi };
    if above && below {
        return Ok(());
    }
    let (l, r) = (
        if lo_open { "(" } else { "[" },
        if hi_open { ")" } else { "]" },
    );
    let hi_text = if hi.is_infinite() {
        "inf".to_string()
    } else {
        hi.to_string()
    };
    Err(LearnerError::config(
        key,
        format!("must be in {l}{lo}, {hi_text}{r}, got {v}"),
    ))
}

impl LearnerConfig {
    /// A config for `algo` with every other key at its default.
    pub fn for_preset(algo: Preset) -> Self {
        LearnerConfig {
            algo,
            ..LearnerConfig::default()
        }
    }

    /// Whether the learner keeps a reference policy: the preset needs one, or `reference_kl`.
    pub fn keeps_reference(&self) -> bool {
        self.reference_kl || self.resolve().needs_reference()
    }

    /// The preset's components and hyper-parameters with the overrides applied (LC-2).
    pub fn resolve(&self) -> PresetConfig {
        let mut p = self.algo.config();
        self.override_policy_loss(&mut p);
        self.override_advantages(&mut p);
        if let Some(c) = p.critic.as_mut() {
            self.override_critic(c);
        }
        self.override_regularisers(&mut p);
        self.override_sampling(&mut p);
        p
    }

    /// The policy loss, its clip, ratio base, rollout correction, aggregation and optimizer
    /// overrides.
    fn override_policy_loss(&self, p: &mut PresetConfig) {
        if let Some(v) = self.weight_decay {
            p.weight_decay = v;
        }
        if let Some(v) = self.lr_warmup_steps {
            p.lr_warmup_steps = v;
        }
        if let PolicyLossKind::Armor(a) = &mut p.policy_loss {
            *a = self.armor;
        }
        if let Some(v) = self.clip_low {
            p.clip.low = v;
        }
        if let Some(v) = self.clip_high {
            p.clip.high = v;
        }
        if let Some(c) = self.dual_clip {
            p.clip.dual = if c == 0.0 { None } else { Some(c) };
        }
        if let Some(choice) = self.policy_loss {
            p.policy_loss = match choice {
                PolicyLossChoice::Ppo => PolicyLossKind::Ppo,
                PolicyLossChoice::Gspo => PolicyLossKind::Gspo,
                PolicyLossChoice::Reinforce => PolicyLossKind::Reinforce {
                    is_threshold: Some(ROLLOUT_IS_THRESHOLD),
                },
            };
        }
        if let (PolicyLossKind::Reinforce { is_threshold }, Some(t)) =
            (&mut p.policy_loss, self.rollout_is_threshold)
        {
            *is_threshold = if t == 0.0 { None } else { Some(t) };
        }
        if self.rollout_is.is_some() || self.rollout_rs.is_some() {
            p.rollout_correction = Some(RolloutCorrection {
                is: self.rollout_is,
                is_threshold: self.rollout_is_threshold.unwrap_or(ROLLOUT_IS_THRESHOLD),
                reject: self.rollout_rs,
                reject_threshold: self.rollout_rs_threshold.unwrap_or(ROLLOUT_IS_THRESHOLD),
            });
        }
        if let Some(v) = self.loss_agg {
            p.agg = v;
        }
        if let Some(v) = self.loss_scale_factor {
            p.loss_scale_factor = Some(v);
        }
        if let Some(v) = self.ratio_base {
            p.ratio_base = v;
        }
        if let Some(v) = self.seq_mask_delta {
            p.seq_mask_delta = Some(v);
        }
    }

    /// The advantage estimator's overrides (GAE's γ, λ, whitening; GRPO's std; GiGPO's
    /// similarity).
    fn override_advantages(&self, p: &mut PresetConfig) {
        if let (AdvantageKind::Gigpo { similarity, .. }, Some(v)) =
            (&mut p.advantage, self.gigpo_similarity)
        {
            *similarity = Some(v);
        }
        if let Some(v) = self.gamma {
            p.gamma = v;
        }
        if let Some(v) = self.lam {
            p.lam = v;
        }
        if let Some(v) = self.whiten {
            p.whiten = v;
        }
        if let Some(v) = self.grpo_normalize_std {
            p.normalize_std = v;
        }
    }

    /// The critic's overrides.
    fn override_critic(&self, c: &mut CriticSchedule) {
        if let Some(v) = self.value_coef {
            c.value_coef = v;
        }
        if let Some(v) = self.value_clip {
            c.value_clip = if v == 0.0 { None } else { Some(v) };
        }
        if let Some(v) = self.critic_steps {
            c.steps_per_actor_step = v;
        }
        if let Some(v) = self.critic_model {
            c.model = v;
        }
        // A shared critic's value-only steps train the head alone unless told otherwise; a
        // separate critic trains all of itself (empty).
        c.trainable = match (&self.critic_trainable, c.model) {
            (Some(v), _) => v.clone(),
            (None, CriticModel::Separate) => vec![],
            (None, CriticModel::Shared) if c.steps_per_actor_step > 0 => vec!["score".into()],
            (None, CriticModel::Shared) => c.trainable.clone(),
        };
        if let Some(v) = self.critic_warmup {
            c.warmup_updates = v;
        }
    }

    /// The entropy bonus, the KL loss and the KL-in-reward overrides.
    fn override_regularisers(&self, p: &mut PresetConfig) {
        if let Some(v) = self.entropy_coef {
            p.entropy_coef = v;
        }
        let estimator = self.kl_estimator;
        match self.kl_coef {
            Some(0.0) => p.kl_loss = None,
            Some(coef) => {
                p.kl_loss = Some(KlLoss {
                    estimator: estimator.unwrap_or(KlEstimator::K3),
                    coef,
                });
            }
            None => {
                if let (Some(k), Some(e)) = (p.kl_loss.as_mut(), estimator) {
                    k.estimator = e;
                }
            }
        }
        match (self.kl_reward_coef, self.kl_reward_target) {
            (Some(0.0), _) => p.kl_reward = None,
            (Some(beta), target) => {
                let controller = match target {
                    Some(target) => KlController::Adaptive {
                        beta,
                        target,
                        horizon: 10000.0,
                    },
                    None => KlController::Fixed { beta },
                };
                p.kl_reward = Some(KlReward {
                    estimator: estimator.unwrap_or(KlEstimator::K1),
                    controller,
                });
            }
            (None, _) => {}
        }
    }

    /// The invalid-action penalty and dynamic sampling overrides.
    fn override_sampling(&self, p: &mut PresetConfig) {
        if let Some(v) = self.invalid_action_penalty {
            p.invalid_action_penalty = v;
        }
        if self.dynamic_sampling_tries.is_some() || self.dynamic_sampling_cold_start.is_some() {
            let d = p.dynamic_sampling.get_or_insert(DynamicSampling {
                max_tries: 3,
                cold_start_updates: 0,
                fill_with_uniform: false,
            });
            if let Some(t) = self.dynamic_sampling_tries {
                d.max_tries = t;
            }
            if let Some(c) = self.dynamic_sampling_cold_start {
                d.cold_start_updates = c;
            }
        }
    }

    /// The IS threshold and the rollout correction (RCO-*) apply where a loss uses them.
    fn validate_rollout_correction(&self, p: &PresetConfig) -> Result<(), LearnerError> {
        let reinforce = matches!(p.policy_loss, PolicyLossKind::Reinforce { .. });
        if let Some(t) = self.rollout_is_threshold {
            if !reinforce && self.rollout_is.is_none() {
                return Err(LearnerError::config(
                    "learner.rollout_is_threshold",
                    "applies only to learner.policy_loss = \"reinforce\" or with learner.rollout_is",
                ));
            }
            if t != 0.0 || !reinforce {
                in_range(
                    "learner.rollout_is_threshold",
                    t,
                    0.0,
                    true,
                    f64::INFINITY,
                    true,
                )?;
            }
        }
        if let Some(r) = self.rollout_rs_threshold {
            if self.rollout_rs.is_none() {
                return Err(LearnerError::config(
                    "learner.rollout_rs_threshold",
                    "applies only with learner.rollout_rs",
                ));
            }
            in_range(
                "learner.rollout_rs_threshold",
                r,
                1.0,
                true,
                f64::INFINITY,
                true,
            )?;
        }
        if p.rollout_correction.is_none() {
            return Ok(());
        }
        let key = if self.rollout_is.is_some() {
            "learner.rollout_is"
        } else {
            "learner.rollout_rs"
        };
        if p.ratio_base != RatioBase::Recompute {
            return Err(LearnerError::config(
                key,
                "needs learner.ratio_base = \"recompute\": against the behaviour log-probs the ratio already is the rollout correction (verl's bypass mode)",
            ));
        }
        if matches!(
            p.policy_loss,
            PolicyLossKind::Reinforce { .. } | PolicyLossKind::Dis
        ) {
            return Err(LearnerError::config(
                key,
                "does not apply to the REINFORCE and DIS losses, which weight against the behaviour log-probs themselves",
            ));
        }
        Ok(())
    }

    /// Checks every field against its documented range, on the resolved values (LC-1).
    pub fn validate(&self) -> Result<(), LearnerError> {
        self.validate_schedule()?;
        let p = self.resolve();
        self.validate_loss(&p)?;
        self.validate_regularisers(&p)
    }

    /// The optimizer's schedule and the batch's split: rates, counts and the combinations
    /// that are refused.
    fn validate_schedule(&self) -> Result<(), LearnerError> {
        let inf = f64::INFINITY;
        in_range("learner.lr", self.lr, 0.0, true, 1.0, false)?;
        in_range(
            "learner.max_grad_norm",
            self.max_grad_norm,
            0.0,
            true,
            inf,
            true,
        )?;
        in_range(
            "learner.lr_min_ratio",
            self.lr_min_ratio,
            0.0,
            false,
            1.0,
            false,
        )?;
        if self.max_tokens_per_microbatch > 0 && self.seq_mask_delta.is_some() {
            return Err(LearnerError::config(
                "learner.max_tokens_per_microbatch",
                "cannot be combined with learner.seq_mask_delta yet (its mask, and so the mini-batch's denominators, depend on every row's log-probs)",
            ));
        }
        if self.ranks == 0 {
            return Err(LearnerError::config("learner.ranks", "must be >= 1, got 0"));
        }
        if self.ranks > 1 && self.seq_mask_delta.is_some() {
            return Err(LearnerError::config(
                "learner.ranks",
                "above 1 cannot be combined with learner.seq_mask_delta yet (its mask, and so the mini-batch's denominators, depend on every row's log-probs, which no single rank has)",
            ));
        }
        if self.epochs == 0 {
            return Err(LearnerError::config(
                "learner.epochs",
                "must be >= 1, got 0",
            ));
        }
        if self.minibatches == 0 {
            return Err(LearnerError::config(
                "learner.minibatches",
                "must be >= 1, got 0",
            ));
        }
        Ok(())
    }

    /// The resolved policy loss: decay, clips, loss scale, rollout correction, sequence mask,
    /// γ and λ.
    fn validate_loss(&self, p: &PresetConfig) -> Result<(), LearnerError> {
        let inf = f64::INFINITY;
        in_range(
            "learner.weight_decay",
            p.weight_decay,
            0.0,
            false,
            1.0,
            false,
        )?;
        in_range("learner.clip_low", p.clip.low, 0.0, true, 1.0, true)?;
        in_range("learner.clip_high", p.clip.high, 0.0, true, 10.0, false)?;
        if let Some(c) = p.clip.dual {
            in_range("learner.dual_clip", c, 1.0, true, inf, true)?;
        }
        if let Some(h) = p.loss_scale_factor {
            in_range("learner.loss_scale_factor", h, 0.0, true, inf, true)?;
        }
        self.validate_rollout_correction(p)?;
        if let Some(d) = p.seq_mask_delta {
            in_range("learner.seq_mask_delta", d, 0.0, true, inf, true)?;
        }
        in_range("learner.gamma", p.gamma, 0.0, false, 1.0, false)?;
        in_range("learner.lam", p.lam, 0.0, false, 1.0, false)?;
        Ok(())
    }

    /// The resolved regularisers and critic: entropy, penalties, KL terms, value loss, ARMOR
    /// and GiGPO's similarity.
    fn validate_regularisers(&self, p: &PresetConfig) -> Result<(), LearnerError> {
        let inf = f64::INFINITY;
        in_range(
            "learner.entropy_coef",
            p.entropy_coef,
            0.0,
            false,
            inf,
            true,
        )?;
        in_range(
            "learner.invalid_action_penalty",
            p.invalid_action_penalty,
            0.0,
            false,
            inf,
            true,
        )?;
        if let Some(k) = p.kl_loss {
            in_range("learner.kl_coef", k.coef, 0.0, false, inf, true)?;
        }
        if let Some(k) = p.kl_reward {
            in_range(
                "learner.kl_reward_coef",
                k.controller.beta(),
                0.0,
                false,
                inf,
                true,
            )?;
            if let KlController::Adaptive { target, .. } = k.controller {
                in_range("learner.kl_reward_target", target, 0.0, true, inf, true)?;
            }
        }
        if let Some(c) = &p.critic {
            in_range("learner.value_coef", c.value_coef, 0.0, false, inf, true)?;
            if let Some(v) = c.value_clip {
                in_range("learner.value_clip", v, 0.0, true, inf, true)?;
            }
        }
        if let PolicyLossKind::Armor(a) = p.policy_loss {
            a.validate()?;
        }
        if let Some(v) = self.gigpo_similarity {
            if !matches!(p.advantage, AdvantageKind::Gigpo { .. }) {
                return Err(LearnerError::config(
                    "learner.gigpo_similarity",
                    format!(
                        "needs GiGPO advantages (sampo), but {:?} has none",
                        self.algo.name()
                    ),
                ));
            }
            in_range("learner.gigpo_similarity", v, 0.0, true, 1.0, true)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lc1_default_is_valid_and_messages_name_the_key() {
        LearnerConfig::default()
            .validate()
            .expect("defaults are valid");
        for p in Preset::ALL {
            LearnerConfig::for_preset(p)
                .validate()
                .expect("every preset is valid");
        }
        let c = LearnerConfig {
            lr: 5.0,
            ..LearnerConfig::default()
        };
        assert_eq!(
            c.validate().expect_err("lr").to_string(),
            "learner.lr must be in (0, 1], got 5"
        );
        let c = LearnerConfig {
            clip_low: Some(1.0),
            ..LearnerConfig::default()
        };
        assert_eq!(
            c.validate().expect_err("clip").to_string(),
            "learner.clip_low must be in (0, 1), got 1"
        );
        let c = LearnerConfig {
            max_grad_norm: f64::NAN,
            ..LearnerConfig::default()
        };
        assert_eq!(
            c.validate().expect_err("nan").to_string(),
            "learner.max_grad_norm must be in (0, inf), got NaN"
        );
        let c = LearnerConfig {
            epochs: 0,
            ..LearnerConfig::default()
        };
        assert_eq!(
            c.validate().expect_err("epochs").to_string(),
            "learner.epochs must be >= 1, got 0"
        );
        let c = LearnerConfig {
            dual_clip: Some(0.5),
            ..LearnerConfig::default()
        };
        assert_eq!(
            c.validate().expect_err("dual").to_string(),
            "learner.dual_clip must be in (1, inf), got 0.5"
        );
    }

    #[test]
    fn lc2_overrides_replace_single_fields() {
        let c = LearnerConfig {
            clip_high: Some(0.28),
            dual_clip: Some(0.0),
            kl_coef: Some(0.001),
            ..LearnerConfig::for_preset(Preset::Grpo)
        };
        let p = c.resolve();
        assert_eq!((p.clip.low, p.clip.high, p.clip.dual), (0.2, 0.28, None));
        assert_eq!(
            p.kl_loss,
            Some(KlLoss {
                estimator: KlEstimator::K3,
                coef: 0.001
            })
        );
        assert!(p.needs_reference());
        let off = LearnerConfig {
            kl_coef: Some(0.0),
            ..LearnerConfig::for_preset(Preset::Sampo)
        }
        .resolve();
        assert_eq!(off.kl_loss, None);
        let adaptive = LearnerConfig {
            kl_reward_coef: Some(0.1),
            kl_reward_target: Some(6.0),
            ..LearnerConfig::for_preset(Preset::Ppo)
        }
        .resolve();
        assert!(matches!(
            adaptive.kl_reward.map(|k| k.controller),
            Some(KlController::Adaptive { .. })
        ));
        assert_eq!(LearnerConfig::default().resolve(), Preset::Grpo.config());
    }

    #[test]
    fn lc3_toml_keys_are_optional_and_snake_case() {
        let c: LearnerConfig =
            serde_json::from_str(r#"{"algo": "so_grpo", "clip_high": 0.3}"#).expect("json");
        assert_eq!(
            (c.algo, c.clip_high, c.lr),
            (Preset::SoGrpo, Some(0.3), 1e-3)
        );
        assert!(serde_json::from_str::<LearnerConfig>(r#"{"algo": "grpo", "nope": 1}"#).is_err());
        assert_eq!(
            serde_json::to_string(&Algo::DrMas).expect("json"),
            "\"dr_mas\""
        );
        assert!(!serde_json::to_string(&LearnerConfig::default())
            .expect("json")
            .contains("clip_low"));
    }

    #[test]
    fn reinforce_is_selectable_with_verls_truncation() {
        let pick = |t: Option<f64>| LearnerConfig {
            policy_loss: Some(PolicyLossChoice::Reinforce),
            rollout_is_threshold: t,
            ..LearnerConfig::default()
        };
        assert_eq!(
            pick(None).resolve().policy_loss,
            PolicyLossKind::Reinforce {
                is_threshold: Some(ROLLOUT_IS_THRESHOLD)
            }
        );
        assert_eq!(
            pick(Some(0.0)).resolve().policy_loss,
            PolicyLossKind::Reinforce { is_threshold: None }
        );
        pick(Some(1.5)).validate().expect("valid");
        let err = pick(Some(-1.0)).validate().expect_err("negative");
        assert!(
            err.to_string().contains("learner.rollout_is_threshold"),
            "{err}"
        );
        let ppo = LearnerConfig {
            rollout_is_threshold: Some(2.0),
            ..LearnerConfig::default()
        };
        let err = ppo.validate().expect_err("not reinforce");
        assert!(err.to_string().contains("policy_loss"), "{err}");
        let c: LearnerConfig =
            serde_json::from_str(r#"{"algo": "grpo", "policy_loss": "reinforce"}"#).expect("json");
        assert_eq!(c.policy_loss, Some(PolicyLossChoice::Reinforce));
        let gspo = LearnerConfig {
            policy_loss: Some(PolicyLossChoice::Gspo),
            ..LearnerConfig::default()
        };
        assert_eq!(gspo.resolve().policy_loss, PolicyLossKind::Gspo);
    }
}
