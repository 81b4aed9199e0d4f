//! The learner: one policy, one AdamW, the RL update dispatched through the algorithm registry
//! (`algo::presets`), and the SFT step.
//!
//! `train_step`, for a batch of B trajectories and the resolved [`PresetConfig`]:
//! ```text
//! dynamic sampling (if the preset filters and the cold start is over): keep the rows of groups
//!   whose rewards are not all equal; keep everything when no group is informative
//! reference policy (if the preset needs one): a frozen copy of the weights at the first update
//! targets = scores, advantages (GRPO / Dr. MAS / RTPO / GiGPO / GAE / SAO-GAE), π_old, π_ref
//! for epoch in 1..=epochs, for each of min(minibatches, B) shuffled, near-equal minibatches:
//!   critic presets: K value-only steps on the trainable groups (always during the warm-up)
//!   unless in the critic warm-up:
//!     loss = agg(policy loss) − entropy_coef·agg(H) + kl_coef·agg(kl(logp, ref))
//!            [+ value_coef·value_loss when the critic is joint (K = 0)]
//!     backward; clip the global grad norm; AdamW step
//! ```
//! Metrics are documented in docs/metrics-learner.md.
//!
//! Invariants:
//! - LR-1 (off-policy ratio): by default (`ratio_base = behaviour`) the ratio is taken against
//!   the batch's behaviour log-probs — verl's bypass mode (§1.10) — in every epoch and
//!   minibatch; `recompute` uses the weights at the start of the update instead. Behaviour
//!   log-probs are `log_softmax(logits / T)` of the sampler (SP-1) and the learner's are taken
//!   on `logits / T` too (MD-5, `set_temperature`), so the ratio starts at 1 on-policy at any
//!   temperature.
//! - LR-2 (skip on non-finite): a non-finite loss or gradient norm returns `NonFinite` before
//!   the optimizer is touched: that step's weights and optimizer state are unchanged (earlier
//!   minibatch steps of the same call stand).
//! - LR-3 (counters): `step()` counts RL optimizer steps (actor and value-only steps);
//!   `policy_version()` counts successful `train_step` calls (one published policy version
//!   each); SFT steps are counted separately; AdamW's own counter counts all of them.
//! - LR-6 (one version for all models): [`Learner::count_refused_update`] advances the version
//!   of a model whose update was refused, so that every model of a job has the same version.
//! - LR-4 (exact resume): the minibatch order depends only on (seed, step). `state_files` holds
//!   weights, optimizer state, counters, the KL controller's β and the reference weights (when
//!   the preset has a reference), so `restore` followed by the same calls yields bit-identical
//!   weights to never stopping (same device, same thread count).
//! - LR-5 (config on restore): `restore` requires the checkpoint's model config to equal the
//!   running one; the running `LearnerConfig` is kept (the checkpoint's copy is informational).
//! - MB-1 (micro-batches): with `max_tokens_per_microbatch > 0` an actor update runs its
//!   mini-batch in row chunks of at most that many padded tokens, each forward + backward
//!   under the mini-batch's global denominators, then one clip and optimizer step: the same
//!   update as one pass (up to float reassociation). Value-only critic steps still run the
//!   whole mini-batch at once.
//! - CR-1 (separate critic): with `CriticModel::Separate` the values, value targets and
//!   value-only steps use the separate critic (the job's `set_critic_model`, else a copy of the
//!   policy's trunk taken at the first update, VM-1) and its own AdamW at `lr × lr_ratio`; the
//!   policy's loss never contains a value term and its optimizer never sees the critic. The
//!   critic's weights and optimizer are part of `state_files` once it exists (VM-3).
//! - LR-7 (LoRA): with adapters only they (and a value head) train, and the optimizer holds
//!   only their state (LO-4); the reference policy is the base with adapters off, sharing the
//!   policy's base tensors; a restore requires the checkpoint's base hash to equal the running
//!   base's; dropout masks are drawn from a generator seeded per step (LO-5). A separate
//!   critic is refused (it would be a full copy of the model).
//! - LR-8 (masks): no gradient reaches a position whose loss mask is 0 — observation tokens
//!   and padding — whatever the preset.
//! - LR-9 (ranks): after `join_ranks` every call that updates or checkpoints is a collective:
//!   every rank makes the same calls with the same batches in the same order. An actor update,
//!   an SFT step and a value-only critic step train this rank's token-balanced share of the
//!   rows (DDP-1); targets run whole on every rank; the policy's optimizer and a separate
//!   critic's are sharded (OP-7) and `state_files` holds the shards of all ranks (OF-1), so a
//!   checkpoint resumes on any number (OF-2).

mod actor_loss;
pub(crate) mod optimizer_files;

use std::time::Instant;

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tch::{Kind, Tensor};

use crate::algo::aggregation::{
    agg_loss, masked_mean_value, turn_records, AggDenominators, AggMode,
};
use crate::algo::dapo::informative_groups;
use crate::algo::kl::KlController;
use crate::algo::presets::{PolicyLossKind, PresetConfig};
use crate::algo::seq_mask::sequence_mask;
use crate::algo::value::{
    explained_variance, value_clip_frac, value_loss, CriticModel, CriticSchedule,
};
use crate::batch_tensors::TrainBatch;
use crate::data_parallel::{row_shares, DataParallel, SharedGroup};
use crate::error::LearnerError;
use crate::hf::HfModel;
use crate::learner_config::LearnerConfig;
use crate::logprobs::{token_entropy, token_logprobs};
use crate::lr_schedule::LrPlan;
use crate::model::{scale_logits, LoraBase, ModelSpec};
use crate::optimizer::{AdamW, AdamWConfig};
use crate::step_metrics::StepMetrics;
use crate::targets::{align_values, compute, Targets};
use crate::value_model::{ValueModel, CRITIC_FILE};
use optimizer_files::{CRITIC, POLICY};

/// The counters and configs stored in `learner.json`.
#[derive(serde::Serialize, serde::Deserialize)]
struct LearnerState {
    format: String,
    step: u64,
    sft_steps: u64,
    #[serde(default)]
    updates: u64,
    seed: u64,
    config: LearnerConfig,
    /// The architecture (MD-4): saved config.json and heads.
    model: serde_json::Value,
    #[serde(default)]
    kl_controller: Option<KlController>,
    /// β's exact bits (JSON floats do not round-trip every bit).
    #[serde(default)]
    kl_beta_bits: Option<u64>,
    /// Dr. MAS: the agents this learner's model serves (None = every agent); informational, the
    /// running job's config decides (LR-5).
    #[serde(default)]
    agents: Option<Vec<u32>>,
    /// The separate critic's architecture (MD-4), once it exists.
    #[serde(default)]
    critic: Option<serde_json::Value>,
    /// A LoRA run's base (MD-6): the checkpoint's weights are adapters for exactly this base.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lora_base: Option<LoraBase>,
}

const STATE_FORMAT: &str = "keel.learner.v2";
const REFERENCE_FILE: &str = "reference.safetensors";

/// Policy + optimizer + counters (+ the reference policy and KL controller when the preset
/// needs them).
pub struct Learner {
    model: HfModel,
    opt: AdamW,
    cfg: LearnerConfig,
    preset: PresetConfig,
    reference: Option<HfModel>,
    kl_ctl: Option<KlController>,
    seed: u64,
    step: u64,
    sft_steps: u64,
    updates: u64,
    /// Dr. MAS per-agent models: train only these agents' turns (None = every turn).
    agents: Option<Vec<u32>>,
    /// Sampling temperature of the batches (MD-5): log-probs are taken on logits / T.
    temperature: f64,
    /// Updates in the run: the horizon of a cosine learning-rate schedule (LS-1).
    lr_horizon: u64,
    /// The separate critic (CR-1): set by the job, or made from the policy at the first update.
    critic: Option<ValueModel>,
    /// Data-parallel learner ranks (DDP-1..4), when this learner is one of several.
    ranks: Option<DataParallel>,
}

/// Seeds torch's generator before a training forward of a model with LoRA dropout (LO-5), from
/// the run seed and `salt` (the optimizer's step count and the micro-batch's first row), so
/// a resumed run draws the same dropout masks; nothing happens without dropout.
fn seed_lora_dropout(model: &HfModel, seed: u64, salt: u64) {
    if model.lora().is_some_and(|l| l.dropout > 0.0) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(salt);
        tch::manual_seed(rand::Rng::gen::<i64>(&mut rng));
    }
}

/// The bytes of the learner checkpoint file `name`.
fn state_file<'a>(files: &'a [(String, Vec<u8>)], name: &str) -> Result<&'a [u8], LearnerError> {
    files
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, b)| b.as_slice())
        .ok_or_else(|| LearnerError::mismatch(name, "missing from the learner checkpoint"))
}

/// The loss tokens of `mask` (its entries above 0): what a part of a step weighs in the
/// folded report (DDP-7).
fn loss_tokens(mask: &Tensor) -> Result<usize, LearnerError> {
    Ok(f64::try_from(mask.f_gt(0.0)?.f_sum(Kind::Double)?)? as usize)
}

/// Mean, std, min and max of `x` over mask-1 entries.
fn masked_stats(x: &Tensor, mask: &Tensor) -> (f64, f64, f64, f64) {
    tch::no_grad(|| {
        let v = x
            .detach()
            .to_kind(Kind::Double)
            .masked_select(&mask.gt(0.0));
        if v.numel() == 0 {
            return (0.0, 0.0, 0.0, 0.0);
        }
        let std = if v.numel() > 1 {
            v.std(true).double_value(&[])
        } else {
            0.0
        };
        (
            v.mean(Kind::Double).double_value(&[]),
            std,
            v.min().double_value(&[]),
            v.max().double_value(&[]),
        )
    })
}

impl Learner {
    /// A fresh learner training `model` (from [`ModelSpec::build`]); critic presets require
    /// a value head. `seed` orders minibatches (LR-4).
    pub fn new(model: HfModel, cfg: LearnerConfig, seed: u64) -> Result<Self, LearnerError> {
        cfg.validate()?;
        let preset = cfg.resolve();
        if preset.policy_value_head() && !model.options().value_head {
            return Err(LearnerError::config(
                "model.value_head",
                format!("must be true when learner.algo = \"{}\" with a shared critic (the critic is the policy's value head)", cfg.algo.name()),
            ));
        }
        if let Some(c) = &preset.critic {
            // A separate critic has the policy's trunk names plus the value head.
            let names: Vec<String> = model
                .named_parameters()
                .into_iter()
                .map(|(n, _)| n)
                .chain(["score.weight".to_string(), "score.bias".to_string()])
                .collect();
            if let Some(p) = c
                .trainable
                .iter()
                .find(|p| !names.iter().any(|n| n.starts_with(p.as_str())))
            {
                return Err(LearnerError::config(
                    "learner.critic_trainable",
                    format!(
                        "{p:?} is the prefix of no parameter; parameters are named like {:?}",
                        names.iter().take(4).collect::<Vec<_>>()
                    ),
                ));
            }
        }
        if let Some(lora) = model.lora() {
            if preset
                .critic
                .as_ref()
                .is_some_and(|c| c.model == CriticModel::Separate)
            {
                return Err(LearnerError::config(
                    "model.lora",
                    format!("needs a critic-free preset or learner.critic_model = \"shared\" (a separate critic would be a full copy of the model), but learner.algo = \"{}\" has a separate critic", cfg.algo.name()),
                ));
            }
            if lora.dropout > 0.0 && cfg.activation_checkpointing {
                return Err(LearnerError::config(
                    "model.lora.dropout",
                    "must be 0 with learner.activation_checkpointing = true (recomputed layers would draw other dropout masks)",
                ));
            }
        }
        let opt = AdamW::new(
            model.var_store(),
            AdamWConfig::torch_default(cfg.lr, preset.weight_decay),
        );
        let kl_ctl = preset.kl_reward.map(|k| k.controller);
        Ok(Learner {
            model,
            opt,
            cfg,
            preset,
            reference: None,
            kl_ctl,
            seed,
            step: 0,
            sft_steps: 0,
            updates: 0,
            agents: None,
            temperature: 1.0,
            lr_horizon: 0,
            critic: None,
            ranks: None,
        })
    }

    /// Makes this learner one of `group.world()` data-parallel ranks (LR-9): from now on every
    /// rank must make the same calls with the same batches, in the same order.
    pub fn join_ranks(&mut self, group: SharedGroup) -> Result<(), LearnerError> {
        let dp = DataParallel::new(group, self.cfg.reduce_dtype)?;
        dp.shard(&mut self.opt);
        if let Some(critic) = self.critic.as_mut() {
            dp.shard(&mut critic.opt);
        }
        self.ranks = Some(dp);
        Ok(())
    }

    /// Peak resident memory of this process in MiB (0 where the kernel does not report it,
    /// SM-1); with ranks, the largest of any rank's (a collective: every rank calls it at the
    /// same point of a step).
    pub fn peak_rss_mib(&mut self) -> Result<f64, LearnerError> {
        let mine = crate::host_memory::peak_rss_mib().unwrap_or(0.0);
        match self.ranks.as_mut() {
            Some(dp) => dp.max_over_ranks(mine),
            None => Ok(mine),
        }
    }

    /// Seconds this rank spent in the ranks' gradient reduce and weight broadcast (0 alone).
    pub fn collective_seconds(&self) -> f64 {
        self.ranks
            .as_ref()
            .map_or(0.0, DataParallel::collective_seconds)
    }

    /// Bytes of gradient buckets this rank has all-reduced (DDP-6; 0 alone).
    pub fn reduced_bytes(&self) -> u64 {
        self.ranks.as_ref().map_or(0, DataParallel::reduced_bytes)
    }

    /// Bytes of the optimizer state this learner holds: the policy's and a separate critic's,
    /// once it exists (their shards with ranks, OP-7).
    pub fn optimizer_state_bytes(&self) -> usize {
        self.opt.state_bytes() + self.critic.as_ref().map_or(0, |c| c.opt.state_bytes())
    }

    /// This learner's (rank, ranks); (0, 1) alone.
    pub fn rank_place(&self) -> (usize, usize) {
        self.ranks
            .as_ref()
            .map_or((0, 1), |dp| (dp.rank(), dp.ranks()))
    }

    /// The separate critic's optimizer settings: AdamW at the preset's weight decay.
    fn critic_adamw(&self) -> AdamWConfig {
        AdamWConfig::torch_default(self.cfg.lr, self.preset.weight_decay)
    }

    /// Whether the resolved preset trains a separate value model.
    fn separate_critic(&self) -> bool {
        self.preset
            .critic
            .as_ref()
            .is_some_and(|c| c.model == CriticModel::Separate)
    }

    /// Installs `model` (value head, no LM head; e.g. loaded from `--critic DIR`) as the
    /// separate critic, with a fresh optimizer (CR-1). Only for presets whose critic is
    /// separate.
    pub fn set_critic_model(&mut self, model: HfModel) -> Result<(), LearnerError> {
        if !self.separate_critic() {
            return Err(LearnerError::config(
                "model.critic_path",
                format!(
                    "needs a separate critic, but learner.algo = \"{}\" has {}",
                    self.cfg.algo.name(),
                    if self.preset.needs_critic() {
                        "a shared one (set learner.critic_model = \"separate\")"
                    } else {
                        "no critic"
                    }
                ),
            ));
        }
        let critic = ValueModel::new(model, &self.model, self.critic_adamw())?;
        self.critic = Some(self.on_ranks(critic));
        Ok(())
    }

    /// `critic` with its optimizer sharded over this learner's ranks (DDP-2), unchanged alone.
    fn on_ranks(&self, mut critic: ValueModel) -> ValueModel {
        if let Some(dp) = &self.ranks {
            dp.shard(&mut critic.opt);
        }
        critic
    }

    /// The separate critic's model, once it exists (CR-1).
    pub fn critic_model(&self) -> Option<&HfModel> {
        self.critic.as_ref().map(|c| &c.model)
    }

    /// Optimizer steps taken by the policy's AdamW and by the separate critic's own (None
    /// without one): two counters, as their bias corrections are (CR-1).
    pub fn optimizer_steps(&self) -> (u64, Option<u64>) {
        (
            self.opt.steps(),
            self.critic.as_ref().map(|c| c.opt.steps()),
        )
    }

    /// The model whose value head gives the critic's values: the separate critic, the policy
    /// itself for a shared one, None without a critic.
    fn value_source(&self) -> Option<&HfModel> {
        match (&self.critic, &self.preset.critic) {
            (Some(c), _) => Some(&c.model),
            (None, Some(_)) => Some(&self.model),
            (None, None) => None,
        }
    }

    /// Restricts training to the turns of `agents` (a per-agent model of Dr. MAS); `None`
    /// trains every turn. Not part of the checkpoint: the job sets it from its config.
    pub fn set_agent_filter(&mut self, agents: Option<Vec<u32>>) {
        self.agents = agents;
    }

    /// Sets the temperature the batches are sampled at (`rollout.temperature`, MD-5); not part
    /// of the checkpoint: the job sets it from its config.
    pub fn set_temperature(&mut self, temperature: f64) -> Result<(), LearnerError> {
        if !(temperature.is_finite() && temperature > 0.0) {
            return Err(LearnerError::config(
                "rollout.temperature",
                format!("must be finite and > 0 for training, got {temperature}"),
            ));
        }
        self.temperature = temperature;
        Ok(())
    }

    /// Sets the number of updates of the run, the horizon of a cosine schedule (LS-1); not
    /// part of the checkpoint: the job sets it from `run.steps`.
    pub fn set_lr_horizon(&mut self, updates: u64) {
        self.lr_horizon = updates;
    }

    /// The learning rate of the current update: `lr` × the schedule's factor (LS-1, LS-2).
    pub fn current_lr(&self) -> f64 {
        let plan = LrPlan {
            schedule: self.cfg.lr_schedule,
            warmup: self.preset.lr_warmup_steps,
            min_ratio: self.cfg.lr_min_ratio,
            total: self.lr_horizon,
        };
        self.cfg.lr * plan.factor(self.updates)
    }

    /// Sets the learning rate of later steps (a collapse-guard rewind lowers it); weights,
    /// optimizer state and counters are untouched.
    pub fn set_lr(&mut self, lr: f64) -> Result<(), LearnerError> {
        if !(lr.is_finite() && lr > 0.0) {
            return Err(LearnerError::config(
                "learner.lr",
                format!("must be finite and > 0, got {lr}"),
            ));
        }
        self.cfg.lr = lr;
        Ok(())
    }

    /// The policy being trained.
    pub fn model(&self) -> &HfModel {
        &self.model
    }

    /// The running configuration.
    pub fn config(&self) -> &LearnerConfig {
        &self.cfg
    }

    /// The resolved algorithm (preset + overrides).
    pub fn preset(&self) -> &PresetConfig {
        &self.preset
    }

    /// The frozen reference policy, once the first update has taken it.
    pub fn reference(&self) -> Option<&HfModel> {
        self.reference.as_ref()
    }

    /// Installs `safetensors` (a policy checkpoint of this model's shape) as the reference
    /// policy, replacing the default (the weights at the first update). For a lineage's
    /// reference anchor or ARMOR's reference resets.
    pub fn set_reference(&mut self, safetensors: &[u8]) -> Result<(), LearnerError> {
        let mut r = self.model.try_clone()?;
        r.load_safetensors(safetensors)?;
        self.reference = Some(r);
        Ok(())
    }

    /// RL optimizer steps taken (LR-3).
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Completed `train_step` calls: the policy version of the current weights (LR-3).
    pub fn policy_version(&self) -> u64 {
        self.updates
    }

    /// Counts an update that was refused as non-finite (LR-2) as a policy version all the
    /// same, with the weights unchanged (LR-6): a Dr. MAS agent model keeps the version of the
    /// models whose update on the same batch went through.
    pub fn count_refused_update(&mut self) {
        self.updates += 1;
    }

    /// SFT optimizer steps taken (LR-3).
    pub fn sft_steps(&self) -> u64 {
        self.sft_steps
    }

    fn check_batch(&self, batch: &TrainBatch) -> Result<(), LearnerError> {
        let size = batch.tokens.size();
        if size.len() != 2
            || batch.loss_mask.size() != size
            || batch.behaviour_logp.size() != size
            || batch.turn_ids.size() != size
        {
            return Err(LearnerError::input(format!(
                "tokens, loss_mask, behaviour_logp and turn_ids must share one [B, T] shape, got {:?}, {:?}, {:?}, {:?}",
                size,
                batch.loss_mask.size(),
                batch.behaviour_logp.size(),
                batch.turn_ids.size()
            )));
        }
        let b = size[0] as usize;
        let lens = [
            batch.final_rewards.len(),
            batch.group_ids.len(),
            batch.turns.len(),
            batch.agent_ids.len(),
            batch.anchors.len(),
        ];
        if lens.iter().any(|&n| n != b) {
            return Err(LearnerError::input(format!(
                "{b} trajectories but {} rewards, {} group ids, {} turn lists, {} agent ids, {} source flags",
                lens[0], lens[1], lens[2], lens[3], lens[4]
            )));
        }
        if batch.n_tokens == 0 {
            return Err(LearnerError::input(
                "the batch has no model tokens (loss_mask is all 0)",
            ));
        }
        Ok(())
    }

    /// Dynamic sampling within the batch: rows of informative groups (ARMOR: with an anchor
    /// row), or None to keep all.
    fn filtered_rows(&self, batch: &TrainBatch) -> (Option<Vec<usize>>, usize, usize) {
        let metric: Vec<f64> = batch.final_rewards.iter().map(|&r| f64::from(r)).collect();
        let (mut informative, mut uniform) = informative_groups(&batch.group_ids, &metric);
        if matches!(self.preset.policy_loss, PolicyLossKind::Armor(_)) {
            // ARMOR (spec §4.2): a prompt is kept only with a correct reference rollout, which
            // the generator adds as the group's one anchor row; without it the group is dropped.
            let anchored: std::collections::HashSet<u64> = (0..batch.len())
                .filter(|&i| batch.anchors[i])
                .map(|i| batch.group_ids[i])
                .collect();
            let (kept, dropped): (Vec<u64>, Vec<u64>) =
                informative.into_iter().partition(|g| anchored.contains(g));
            informative = kept;
            uniform.extend(dropped);
        }
        let total = informative.len() + uniform.len();
        // A filling filter (SAMPO) trains on the uniform groups its generator's last try kept.
        let active = self
            .preset
            .dynamic_sampling
            .is_some_and(|d| !d.fill_with_uniform && self.updates >= d.cold_start_updates);
        if !active || informative.is_empty() || uniform.is_empty() {
            return (None, total, total);
        }
        let keep: std::collections::HashSet<u64> = informative.iter().copied().collect();
        let rows = (0..batch.len())
            .filter(|&i| keep.contains(&batch.group_ids[i]))
            .collect();
        (Some(rows), total, informative.len())
    }

    /// One RL update on `batch` (module doc; LR-1 … LR-3).
    pub fn train_step(&mut self, batch: &TrainBatch) -> Result<StepMetrics, LearnerError> {
        let start = Instant::now();
        self.check_batch(batch)?;
        let (rows, groups_total, groups_kept) = self.filtered_rows(batch);
        let filtered = match rows {
            Some(rows) => Some(batch.select_rows(&rows)?),
            None => None,
        };
        let train = filtered.as_ref().unwrap_or(batch);
        if (self.preset.needs_reference() || self.cfg.reference_kl) && self.reference.is_none() {
            // LR-7: with LoRA the reference is the base with adapters off (no weight copy).
            self.reference = Some(match self.model.lora() {
                Some(_) => self.model.adapter_view(false)?,
                None => self.model.try_clone()?,
            });
        }
        if self.separate_critic() && self.critic.is_none() {
            let critic = ValueModel::from_policy(&self.model, self.critic_adamw())?;
            self.critic = Some(self.on_ranks(critic));
        }
        let beta = self.kl_ctl.map(|c| c.beta()).unwrap_or(0.0);
        let tg = compute(
            &self.model,
            self.value_source(),
            self.reference.as_ref(),
            train,
            &self.preset,
            beta,
            self.agents.as_deref(),
            self.temperature,
        )?;
        let actor = self
            .preset
            .critic
            .as_ref()
            .is_none_or(|c| c.actor_step(self.updates));
        let b = train.len();
        let n_mb = self.cfg.minibatches.min(b);
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(self.step);
        let mut sum = StepMetrics::default();
        let mut n = 0.0;
        for _ in 0..self.cfg.epochs {
            let mut order: Vec<i64> = (0..b as i64).collect();
            if n_mb > 1 {
                order.shuffle(&mut rng);
            }
            for k in 0..n_mb {
                let chunk = &order[k * b / n_mb..(k + 1) * b / n_mb];
                let m = self.minibatch_step(&tg, chunk, actor)?;
                sum.accumulate(&m, n as usize);
                n += 1.0;
            }
        }
        sum.finish_means(n);
        let (mean, std, min, max) = masked_stats(&tg.advantages, &tg.mask);
        (sum.adv_mean, sum.adv_std, sum.adv_min, sum.adv_max) = (mean, std, min, max);
        sum.groups_total = groups_total as f64;
        sum.groups_kept = groups_kept as f64;
        if let Some(c) = tg.correction {
            sum.rollout_logp_mismatch = c.mismatch;
            sum.rollout_is_truncated_frac = c.truncated;
            sum.rollout_rs_rejected_frac = c.rejected;
        }
        if let (Some(ctl), Some(kl)) = (self.kl_ctl.as_mut(), tg.kl_reward_mean) {
            sum.kl_reward_beta = ctl.beta();
            sum.kl_reward = kl;
            ctl.update(kl, b as f64);
        }
        sum.tokens = batch.n_tokens;
        sum.mean_reward = batch
            .final_rewards
            .iter()
            .map(|&r| f64::from(r))
            .sum::<f64>()
            / batch.len() as f64;
        sum.step_seconds = start.elapsed().as_secs_f64();
        sum.tokens_per_s = sum.tokens as f64 / sum.step_seconds.max(1e-9);
        sum.peak_rss_mib = self.peak_rss_mib()?;
        self.updates += 1;
        Ok(sum)
    }

    /// Value-only optimizer steps on the critic's trainable groups (critic schedule): on the
    /// separate critic with its own optimizer, or on the policy's value head. With ranks each
    /// rank trains its share of the rows under the whole mini-batch's denominators and the
    /// critic's gradients are summed (DDP-1); the value model's optimizer (a separate critic's,
    /// or the policy's for a shared head) is sharded, and each parameter is broadcast from its
    /// owner after each step (DDP-2).
    fn critic_steps(
        &mut self,
        c: &CriticSchedule,
        tokens: &Tensor,
        mask: &Tensor,
        old_v: &Tensor,
        returns: &Tensor,
        k: usize,
    ) -> Result<StepMetrics, LearnerError> {
        let mut m = StepMetrics::default();
        let den = AggDenominators::of(mask, self.preset.loss_scale_factor);
        let lr = self.current_lr() * c.lr_ratio;
        let model = self.critic.as_ref().map_or(&self.model, |vm| &vm.model);
        // Value-only steps that train no trunk parameter (a shared critic's head) backpropagate
        // into the head alone; clipping and stepping see only what moves (OP-5).
        let head_only = !model
            .named_parameters()
            .iter()
            .any(|(n, _)| !n.starts_with("score.") && c.is_trainable(n));
        let mine = self.share_of(mask)?;
        let rows = match mine.is_empty() {
            true => None,
            false => {
                let idx = Tensor::f_from_slice(&mine)?.f_to_device(mask.device())?;
                let pick = |t: &Tensor| t.f_index_select(0, &idx);
                Some([pick(tokens)?, pick(mask)?, pick(old_v)?, pick(returns)?])
            }
        };
        for _ in 0..k {
            let opt = self.value_optimizer();
            opt.set_lr(lr);
            opt.zero_grad();
            let part = match &rows {
                Some(rows) => self.critic_backward(c, rows, &den, head_only),
                None => Ok(StepMetrics::default()),
            };
            let part = self.sum_grads(true, part, "value loss")?;
            let max_norm = self.cfg.max_grad_norm;
            let opt = self.value_optimizer();
            let grad_norm = opt.clip_grad_norm_where(max_norm, |name| c.is_trainable(name));
            if !grad_norm.is_finite() {
                opt.zero_grad();
                return Err(LearnerError::NonFinite {
                    what: "critic gradient norm".into(),
                });
            }
            opt.step_where(|name| c.is_trainable(name));
            if let Some(dp) = self.ranks.as_mut() {
                let opt = self.critic.as_ref().map_or(&self.opt, |vm| &vm.opt);
                dp.broadcast_weights(opt)?; // DDP-2: each parameter from its owner
            }
            self.step += 1;
            m = self.across_ranks(part)?;
            m.loss = m.value_loss;
            m.grad_norm = grad_norm;
        }
        m.critic_steps = k as f64;
        m.tokens = 0;
        Ok(m)
    }

    /// The optimizer of the value model: the separate critic's, or the policy's.
    fn value_optimizer(&mut self) -> &mut AdamW {
        match self.critic.as_mut() {
            Some(vm) => &mut vm.opt,
            None => &mut self.opt,
        }
    }

    /// One value-only forward and backward on `[tokens, mask, old values, returns]` of some
    /// rows under the mini-batch's denominators `den` (into the value head alone with
    /// `head_only`); its statistics (this share's).
    fn critic_backward(
        &self,
        c: &CriticSchedule,
        [tokens, mask, old_v, returns]: &[Tensor; 4],
        den: &AggDenominators,
        head_only: bool,
    ) -> Result<StepMetrics, LearnerError> {
        let model = self.critic.as_ref().map_or(&self.model, |vm| &vm.model);
        let opt = self.critic.as_ref().map_or(&self.opt, |vm| &vm.opt);
        seed_lora_dropout(model, self.seed, opt.steps().wrapping_mul(1 << 20));
        let pass = model.train_pass(tokens, self.cfg.activation_checkpointing)?;
        let hidden = if head_only {
            pass.hidden.detach()
        } else {
            pass.hidden.shallow_clone()
        };
        let values = align_values(&model.values(&hidden)?.ok_or_else(|| {
            LearnerError::config("model.value_head", "must be true for a critic preset")
        })?)?;
        let vl = value_loss(
            &values,
            old_v,
            returns,
            mask,
            c.value_clip,
            self.preset.agg,
            den,
        );
        let v = vl.f_double_value(&[])?;
        if !v.is_finite() {
            return Err(LearnerError::NonFinite {
                what: "value loss".into(),
            });
        }
        pass.backward(&vl, model)?;
        Ok(StepMetrics {
            value_loss: v,
            explained_var: explained_variance(&values, returns, mask),
            vf_clipfrac: value_clip_frac(&values, old_v, returns, mask, c.value_clip),
            tokens: loss_tokens(mask)?,
            ..StepMetrics::default()
        })
    }

    fn minibatch_step(
        &mut self,
        tg: &Targets,
        rows: &[i64],
        actor: bool,
    ) -> Result<StepMetrics, LearnerError> {
        let p = self.preset.clone();
        let mut out = StepMetrics::default();
        if let (Some((v, r)), Some(c)) = (&tg.critic, &p.critic) {
            let k = c.value_steps(actor);
            if k > 0 {
                let idx = Tensor::f_from_slice(rows)?.f_to_device(self.model.device())?;
                let pick = |t: &Tensor| t.f_index_select(0, &idx);
                let (tokens, mask) = (pick(&tg.tokens)?, pick(&tg.mask)?);
                out = self.critic_steps(c, &tokens, &mask, &pick(v)?, &pick(r)?, k)?;
            }
        }
        if !actor {
            return Ok(out);
        }
        // MB-1: micro-batches of at most `max_tokens_per_microbatch` padded tokens accumulate
        // gradients under the mini-batch's global denominators, then one optimizer step.
        // DDP-1: with ranks, this rank's share of the rows, under the same global denominators.
        let mine = self.share_of_rows(&tg.mask, rows)?;
        let micro = self.micro_batches(&mine, tg.tokens.size()[1]);
        let global = if micro.len() > 1 || self.ranks.is_some() {
            Some(self.minibatch_denominators(tg, rows)?)
        } else {
            None
        };
        self.opt.set_lr(self.current_lr());
        self.opt.zero_grad();
        let parts = micro
            .iter()
            .filter(|m| !m.is_empty())
            .map(|m| self.actor_micro_backward(tg, m, global.as_ref()))
            .collect::<Result<Vec<_>, _>>();
        let parts = self.sum_grads(false, parts, "loss")?;
        let grad_norm = self.clip_and_step()?;
        let mut actor_out = self.across_ranks(StepMetrics::combine_micro(parts))?;
        actor_out.critic_steps = out.critic_steps;
        if out.critic_steps > 0.0 && actor_out.value_loss == 0.0 {
            actor_out.value_loss = out.value_loss;
            actor_out.explained_var = out.explained_var;
            actor_out.vf_clipfrac = out.vf_clipfrac;
        }
        actor_out.grad_norm = grad_norm;
        actor_out.actor_steps = 1.0;
        self.step += 1;
        Ok(actor_out)
    }

    /// This rank's rows of the whole of `mask` `[B, T]` (DDP-1).
    fn share_of(&self, mask: &Tensor) -> Result<Vec<i64>, LearnerError> {
        let all: Vec<i64> = (0..mask.size()[0]).collect();
        self.share_of_rows(mask, &all)
    }

    /// This rank's rows of `rows` of `mask` `[B, T]`, balanced by loss tokens (DDP-1); all of
    /// them without ranks.
    fn share_of_rows(&self, mask: &Tensor, rows: &[i64]) -> Result<Vec<i64>, LearnerError> {
        let Some(dp) = &self.ranks else {
            return Ok(rows.to_vec());
        };
        let idx = Tensor::f_from_slice(rows)?.f_to_device(mask.device())?;
        let tokens = mask
            .f_index_select(0, &idx)?
            .f_gt(0.0)?
            .f_sum_dim_intlist(1, false, Kind::Int64)?
            .f_to_device(tch::Device::Cpu)?;
        let tokens = Vec::<i64>::try_from(&tokens)?;
        let mut shares = row_shares(rows, &tokens, dp.ranks());
        Ok(std::mem::take(&mut shares[dp.rank()]))
    }

    /// DDP-3: sums the step's gradients of the policy's optimizer (of the value model's with
    /// `value_model`) over the ranks. When this rank's `part` or another rank's failed, every
    /// rank drops its gradients and fails: with this rank's error, or with `what` failed on
    /// another rank.
    fn sum_grads<T>(
        &mut self,
        value_model: bool,
        part: Result<T, LearnerError>,
        what: &str,
    ) -> Result<T, LearnerError> {
        let opt = match (value_model, &self.critic) {
            (true, Some(vm)) => &vm.opt,
            _ => &self.opt,
        };
        let failed_somewhere = match self.ranks.as_mut() {
            Some(dp) => dp.reduce_grads(opt, part.is_err())?,
            None => part.is_err(),
        };
        if !failed_somewhere {
            return part;
        }
        match value_model {
            true => self.value_optimizer().zero_grad(),
            false => self.opt.zero_grad(),
        }
        Err(part.err().unwrap_or_else(|| LearnerError::NonFinite {
            what: format!("{what} on another learner rank"),
        }))
    }

    /// Every rank's statistics of one step folded as micro-batches fold (DDP-7): a
    /// collective with ranks; `mine` alone.
    fn across_ranks(&mut self, mine: StepMetrics) -> Result<StepMetrics, LearnerError> {
        let Some(dp) = self.ranks.as_mut() else {
            return Ok(mine);
        };
        let parts = dp
            .all_gather_values(&mine.values())?
            .iter()
            .map(|v| StepMetrics::from_values(v))
            .filter(|m| m.tokens > 0)
            .collect();
        Ok(StepMetrics::combine_micro(parts))
    }

    /// Row chunks of `rows` holding at most `learner.max_tokens_per_microbatch` padded tokens
    /// (`t` per row) each; one chunk when the budget is 0 (MB-1).
    fn micro_batches(&self, rows: &[i64], t: i64) -> Vec<Vec<i64>> {
        let budget = self.cfg.max_tokens_per_microbatch;
        if budget == 0 {
            return vec![rows.to_vec()];
        }
        let per = (budget / t.max(1) as usize).max(1);
        rows.chunks(per).map(<[i64]>::to_vec).collect()
    }

    /// The policy and value denominators of the whole mini-batch `rows` (AG-1, MB-1).
    fn minibatch_denominators(
        &self,
        tg: &Targets,
        rows: &[i64],
    ) -> Result<(AggDenominators, AggDenominators), LearnerError> {
        let idx = Tensor::f_from_slice(rows)?.f_to_device(self.model.device())?;
        let mask = tg.mask.f_index_select(0, &idx)?;
        let rec_mask = if self.preset.turn_records {
            let ids = tg.turn_ids.f_index_select(0, &idx)?;
            turn_records(&mask, &mask, &ids, tg.max_turns).1
        } else {
            mask.shallow_clone()
        };
        let lsf = self.preset.loss_scale_factor;
        Ok((
            AggDenominators::of(&rec_mask, lsf),
            AggDenominators::of(&mask, lsf),
        ))
    }

    /// Forward, loss and backward of the actor on `rows` (one micro-batch); gradients
    /// accumulate. `global` = the mini-batch's (policy, value) denominators, or None to take
    /// them from these rows (a single micro-batch). Each loss part returns its statistics by
    /// name (`actor_loss`, AL-1).
    fn actor_micro_backward(
        &mut self,
        tg: &Targets,
        rows: &[i64],
        global: Option<&actor_loss::Global>,
    ) -> Result<StepMetrics, LearnerError> {
        let p = self.preset.clone();
        let mut r = actor_loss::MicroRows::of(tg, rows, self.model.device())?;
        let mut out = StepMetrics::default();
        let salt = self.opt.steps().wrapping_mul(1 << 20) + rows.first().map_or(0, |&r| r as u64);
        seed_lora_dropout(&self.model, self.seed, salt);
        let pass = self
            .model
            .train_pass(&r.tokens, self.cfg.activation_checkpointing)?;
        let logits = scale_logits(self.model.logits(&pass.hidden)?, self.temperature)?;
        let values = self.model.values(&pass.hidden)?;
        let logp = token_logprobs(&logits, &r.tokens);
        if let Some(delta) = p.seq_mask_delta {
            let (m, frac) = sequence_mask(&logp, &r.old_logp, &r.adv, &r.mask, delta);
            r.mask = m;
            out.seq_mask_frac = frac;
        }
        let (mut token_loss, agg, stats) = actor_loss::policy_token_loss(&p, tg, &r, &logp)?;
        if let Some(w) = &r.is_weights {
            token_loss = token_loss.f_mul(&w.f_to_kind(token_loss.kind())?)?;
        }
        out.absorb(&stats);
        let records = actor_loss::Records::new(&p, tg, &r, agg, global)?;
        let pg = records.agg(&token_loss);
        let mut loss = pg.shallow_clone();
        let entropy = token_entropy(&logits);
        if p.entropy_coef > 0.0 {
            loss = loss.f_sub(&records.agg(&entropy).f_mul_scalar(p.entropy_coef)?)?;
        }
        out.entropy = masked_mean_value(&entropy, &r.mask);
        let (kl, kl_stats) = actor_loss::kl_terms(&p, &r, &logp, &records)?;
        let (value, value_stats) = actor_loss::value_term(&p, tg, &r, values, agg, global)?;
        for (term, stats) in [(kl, kl_stats), (value, value_stats)] {
            out.absorb(&stats);
            if let Some(t) = term {
                loss = loss.f_add(&t)?;
            }
        }
        let loss_value = loss.f_double_value(&[])?;
        if !loss_value.is_finite() {
            return Err(LearnerError::NonFinite {
                what: "loss".into(),
            });
        }
        pass.backward(&loss, &self.model)?;
        out.loss = loss_value;
        out.pg_loss = pg.f_double_value(&[])?;
        out.tokens = f64::try_from(r.mask.f_sum(Kind::Double)?)? as usize;
        Ok(out)
    }

    /// Clips the accumulated gradients and steps, unless their norm is non-finite (LR-2): then
    /// they are zeroed and nothing moves.
    fn clip_and_step(&mut self) -> Result<f64, LearnerError> {
        let grad_norm = self.opt.clip_grad_norm(self.cfg.max_grad_norm);
        if !grad_norm.is_finite() {
            self.opt.zero_grad();
            return Err(LearnerError::NonFinite {
                what: "gradient norm".into(),
            });
        }
        self.opt.step();
        self.share_weights()?;
        Ok(grad_norm)
    }

    /// DDP-2: after a step of the sharded optimizer, every parameter from its owner.
    fn share_weights(&mut self) -> Result<(), LearnerError> {
        match self.ranks.as_mut() {
            Some(dp) => dp.broadcast_weights(&self.opt),
            None => Ok(()),
        }
    }

    /// Supervised fine-tuning: token-mean cross-entropy on mask-1 tokens, one AdamW step at `lr`
    /// (not counted in `step()`, LR-3).
    pub fn sft_step(&mut self, batch: &TrainBatch, lr: f64) -> Result<StepMetrics, LearnerError> {
        let start = Instant::now();
        if !(lr > 0.0 && lr <= 1.0) {
            return Err(LearnerError::config(
                "sft.lr",
                format!("must be in (0, 1], got {lr}"),
            ));
        }
        self.check_batch(batch)?;
        let dev = self.model.device();
        let mask = batch.loss_mask.f_to_device(dev)?.f_to_kind(Kind::Float)?;
        // DDP-1: each rank its share of the rows, under the whole batch's token count.
        let global = AggDenominators::of(&mask, None);
        let mine = self.share_of(&mask)?;
        self.opt.set_lr(lr);
        self.opt.zero_grad();
        let part = match mine.is_empty() {
            true => Ok(StepMetrics::default()),
            false => self.sft_backward(batch, &mask, &mine, &global),
        };
        let part = self.sum_grads(false, part, "loss")?;
        let grad_norm = self.clip_and_step()?;
        let mut out = self.across_ranks(part)?;
        self.sft_steps += 1;
        let step_seconds = start.elapsed().as_secs_f64();
        out.grad_norm = grad_norm;
        out.tokens = batch.n_tokens;
        out.tokens_per_s = batch.n_tokens as f64 / step_seconds.max(1e-9);
        out.step_seconds = step_seconds;
        out.peak_rss_mib = self.peak_rss_mib()?;
        Ok(out)
    }

    /// SFT's forward and backward on `rows` of `batch`: token-mean cross-entropy under the
    /// whole batch's denominators `global`; its loss (this share's part) and entropy.
    fn sft_backward(
        &mut self,
        batch: &TrainBatch,
        mask: &Tensor,
        rows: &[i64],
        global: &AggDenominators,
    ) -> Result<StepMetrics, LearnerError> {
        let dev = self.model.device();
        let idx = Tensor::f_from_slice(rows)?.f_to_device(dev)?;
        let tokens = batch.tokens.f_to_device(dev)?.f_index_select(0, &idx)?;
        let mask = mask.f_index_select(0, &idx)?;
        seed_lora_dropout(
            &self.model,
            self.seed,
            self.opt.steps().wrapping_mul(1 << 20),
        );
        let pass = self
            .model
            .train_pass(&tokens, self.cfg.activation_checkpointing)?;
        let logits = self.model.logits(&pass.hidden)?;
        let logp = token_logprobs(&logits, &tokens);
        let loss = agg_loss(&logp, &mask, AggMode::TokenMean, global).f_neg()?;
        let loss_value = loss.f_double_value(&[])?;
        if !loss_value.is_finite() {
            return Err(LearnerError::NonFinite {
                what: "loss".into(),
            });
        }
        let entropy = tch::no_grad(|| masked_mean_value(&token_entropy(&logits.detach()), &mask));
        pass.backward(&loss, &self.model)?;
        Ok(StepMetrics {
            loss: loss_value,
            entropy,
            tokens: loss_tokens(&mask)?,
            ..StepMetrics::default()
        })
    }

    /// The policy weights as safetensors (what generators load).
    pub fn weights_safetensors(&self) -> Result<Vec<u8>, LearnerError> {
        self.model.to_safetensors()
    }

    /// Everything `restore` needs (LR-4): `model.safetensors`, `optimizer.safetensors`,
    /// `learner.json`, and `reference.safetensors` once a reference policy exists.
    ///
    /// With ranks (LR-9) this is a collective: every rank calls it, and each gets the whole
    /// checkpoint, the optimizer as one `optimizer.rank-R-of-N.safetensors` per rank (OP-7).
    pub fn state_files(&mut self) -> Result<Vec<(String, Vec<u8>)>, LearnerError> {
        let state = LearnerState {
            format: STATE_FORMAT.to_string(),
            step: self.step,
            sft_steps: self.sft_steps,
            updates: self.updates,
            seed: self.seed,
            config: self.cfg.clone(),
            model: ModelSpec::identity(&self.model),
            kl_controller: self.kl_ctl,
            kl_beta_bits: self.kl_ctl.map(|c| c.beta().to_bits()),
            agents: self.agents.clone(),
            critic: self.critic.as_ref().map(ValueModel::identity),
            lora_base: LoraBase::of(&self.model)?,
        };
        let mut files = vec![(
            "model.safetensors".to_string(),
            self.model.to_safetensors()?,
        )];
        files.extend(optimizer_files::write(
            optimizer_files::POLICY,
            &self.opt,
            self.ranks.as_mut(),
        )?);
        files.push((
            "learner.json".to_string(),
            serde_json::to_vec_pretty(&state)?,
        ));
        if let Some(r) = &self.reference {
            files.push((REFERENCE_FILE.to_string(), r.to_safetensors()?));
        }
        if let Some(c) = &self.critic {
            files.push((CRITIC_FILE.to_string(), c.model.to_safetensors()?));
            files.extend(optimizer_files::write(
                optimizer_files::CRITIC,
                &c.opt,
                self.ranks.as_mut(),
            )?);
        }
        Ok(files)
    }

    /// The checkpoint's separate critic (VM-3), when it has one and the running preset trains
    /// one; built from the running critic's architecture, else the policy's.
    fn restored_critic(
        &self,
        state: &LearnerState,
        files: &[(String, Vec<u8>)],
    ) -> Result<Option<ValueModel>, LearnerError> {
        let Some(recorded) = state.critic.as_ref().filter(|_| self.separate_critic()) else {
            return Ok(None);
        };
        let like = self.critic_model().unwrap_or(&self.model);
        let ranks = self.ranks.as_ref();
        let optimizer = |opt: &mut AdamW| {
            if let Some(dp) = ranks {
                dp.shard(opt);
            }
            let (state, steps) = optimizer_files::read(CRITIC, opt, ranks.is_some(), files)?;
            opt.commit_state(&state, steps)
        };
        let weights = state_file(files, CRITIC_FILE)?;
        ValueModel::restored(
            like,
            &self.model,
            recorded,
            weights,
            self.critic_adamw(),
            optimizer,
        )
        .map(Some)
    }

    /// Restores weights, optimizer state and counters from `state_files` output (LR-4, LR-5).
    /// Everything is checked before anything changes.
    pub fn restore(&mut self, files: &[(String, Vec<u8>)]) -> Result<(), LearnerError> {
        let get = |name: &str| state_file(files, name);
        let state: LearnerState = serde_json::from_slice(get("learner.json")?)?;
        if state.format != STATE_FORMAT {
            return Err(LearnerError::mismatch(
                "learner.json",
                format!("format {:?}, expected {STATE_FORMAT:?}", state.format),
            ));
        }
        let running = ModelSpec::identity(&self.model);
        if state.model != running {
            return Err(LearnerError::mismatch(
                "learner.json",
                format!(
                    "this run root holds a run of another model ({}) than this one ({}){}: start a new run in another run root (keel train --run-root DIR)",
                    model_summary(&state.model),
                    model_summary(&running),
                    model_differences(&state.model, &running),
                ),
            ));
        }
        let base = LoraBase::of(&self.model)?.map(|b| b.hash);
        if state.lora_base.as_ref().map(|b| &b.hash) != base.as_ref() {
            return Err(LearnerError::mismatch(
                "learner.json",
                format!(
                    "the checkpoint's adapters were trained on base {}, the running base is {} (LR-7)",
                    state.lora_base.map_or("none (full fine-tune)".to_string(), |b| b.hash),
                    base.unwrap_or_else(|| "none (full fine-tune)".to_string())
                ),
            ));
        }
        let weights = self.model.decode_weights(get("model.safetensors")?)?;
        let (moments, opt_steps) = self.decode_optimizer(files)?;
        let reference = match files.iter().find(|(n, _)| n == REFERENCE_FILE) {
            Some((_, bytes)) => {
                let mut r = self.model.try_clone()?;
                r.load_safetensors(bytes)?;
                Some(r)
            }
            None => None,
        };
        let critic = self.restored_critic(&state, files)?;
        self.model.commit_weights(&weights)?;
        self.reference = reference;
        if critic.is_some() {
            self.critic = critic;
        }
        if let (Some(mut ctl), true) = (state.kl_controller, self.kl_ctl.is_some()) {
            if let Some(bits) = state.kl_beta_bits {
                ctl.set_beta(f64::from_bits(bits));
            }
            self.kl_ctl = Some(ctl);
        }
        self.opt.commit_state(&moments, opt_steps)?;
        self.step = state.step;
        self.sft_steps = state.sft_steps;
        self.updates = state.updates;
        self.seed = state.seed;
        Ok(())
    }

    /// The checkpoint's optimizer state for this rank (OF-2).
    fn decode_optimizer(
        &self,
        files: &[(String, Vec<u8>)],
    ) -> Result<(Vec<Tensor>, u64), LearnerError> {
        optimizer_files::read(POLICY, &self.opt, self.ranks.is_some(), files)
    }
}

/// A model identity (`ModelSpec::identity`) in a few words: architecture, depth, width, vocab,
/// parameter kind.
fn model_summary(identity: &serde_json::Value) -> String {
    let c = &identity["config"];
    let arch = c["architectures"][0].as_str().unwrap_or("?");
    format!(
        "{arch}, {} layers, hidden {}, vocab {}, {}",
        c["num_hidden_layers"],
        c["hidden_size"],
        c["vocab_size"],
        identity["dtype"].as_str().unwrap_or("?")
    )
}

/// The names of the first config keys (and identity fields) on which two identities differ.
fn model_differences(a: &serde_json::Value, b: &serde_json::Value) -> String {
    let mut keys: Vec<String> = Vec::new();
    let (ca, cb) = (&a["config"], &b["config"]);
    if let (Some(x), Some(y)) = (ca.as_object(), cb.as_object()) {
        let mut names: Vec<&String> = x.keys().chain(y.keys()).collect();
        names.sort();
        names.dedup();
        keys.extend(
            names
                .into_iter()
                .filter(|k| x.get(*k) != y.get(*k))
                .cloned(),
        );
    }
    for field in ["dtype", "value_head"] {
        if a[field] != b[field] {
            keys.push(field.to_string());
        }
    }
    match keys.len() {
        0 => String::new(),
        n if n > 4 => format!(
            "; they differ in {} and {} more",
            keys[..4].join(", "),
            n - 4
        ),
        _ => format!("; they differ in {}", keys.join(", ")),
    }
}
