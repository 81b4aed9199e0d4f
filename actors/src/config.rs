//! The training-job configuration: one schema for TOML parsing, defaults and validation.
//!
//! Invariants:
//! - CF-1: the defaults of every section are the quickstart job; an empty TOML file is valid.
//! - CF-2: an unknown key anywhere is an error naming that key (serde `deny_unknown_fields`).
//! - CF-3: `TrainConfig::validate` rejects every out-of-range value with an error that names the
//!   key as it is written in TOML (`section.key`) and the allowed range.
//! - CF-4: `TrainConfig::config_hash` is a stable function of the effective configuration; it is
//!   recorded in every checkpoint so that a resume under a different config can be detected.

use keel_learner::{LearnerConfig, ModelSpec, TinyShape};
use serde::{Deserialize, Serialize};

pub use crate::faults::FaultsSection;
pub use crate::guard::GuardSection;
pub use crate::tracking::TrackingSection;

/// An invalid configuration value, naming the TOML key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be parsed (syntax, unknown key, wrong type).
    #[error("config is not valid TOML for keel: {0}")]
    Parse(String),
    /// A value is out of its allowed range.
    #[error("config key `{key}`: {reason}")]
    OutOfRange {
        /// The key as written in TOML, e.g. `rollout.group_size`.
        key: String,
        /// What is allowed and what was given.
        reason: String,
    },
}

/// Whether generation waits for the learner (sync) or runs ahead of it (async).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Generate with version v, train, publish v+1, repeat: every token is on-policy.
    Sync,
    /// Generators sample while the learner trains, at most `staleness_bound` versions behind.
    Async,
}

/// `rollout.batch_invariant`: whether the sampler decodes with fixed shapes (SA-7).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum BatchInvariance {
    /// On in sync mode (whose runs are reproducible), off in async mode (whose batches depend on
    /// timing anyway, through the weight version each one starts with).
    Auto,
    /// Always on.
    On,
    /// Always off.
    Off,
}

/// `[run]`: the job as a whole.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RunSection {
    /// Name of the run (recorded in every batch).
    pub name: String,
    /// Seed of everything: model init, task order, sampling, minibatch order.
    pub seed: u64,
    /// Number of RL steps (learner updates) in total.
    pub steps: u64,
    /// `sync` or `async`.
    pub mode: Mode,
    /// Async mode: the most policy versions between a sampled token and the update using it.
    pub staleness_bound: u64,
    /// Commit a checkpoint every this many RL steps (and at the end).
    pub checkpoint_every: u64,
    /// `cpu`, `cuda` or `auto` (CUDA when available).
    pub device: String,
    /// Torch intra-op threads (0 = torch's default).
    pub threads: usize,
    /// On SIGTERM/SIGINT (spot preemption): seconds to finish the current step, commit a
    /// checkpoint and exit 0; past it the process exits 1.
    pub sigterm_grace_s: u64,
    /// Checkpoint blobs of at least this many bytes are uploaded as S3 multipart uploads.
    pub checkpoint_multipart_bytes: u64,
    /// The metrics log stores a segment at most this often while events come in (JL-4).
    pub metrics_log_flush_ms: u64,
}

impl Default for RunSection {
    fn default() -> Self {
        Self {
            name: "quickstart".into(),
            seed: 7,
            steps: 200,
            mode: Mode::Sync,
            staleness_bound: 1,
            checkpoint_every: 25,
            device: "auto".into(),
            threads: 0,
            sigterm_grace_s: 60,
            checkpoint_multipart_bytes: 16 << 20,
            metrics_log_flush_ms: 1000,
        }
    }
}

/// `[env]`: which environment, how hard, and how its steps behave (`keel env list`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EnvSection {
    /// Environment name (`keel env list`): calc, search-qa, household, shop, sokoban,
    /// solver-verifier, search-team or external.
    pub name: String,
    /// The difficulty knob (sets the horizon); `n_ops` is accepted as an alias (calc).
    #[serde(alias = "n_ops")]
    pub difficulty: usize,
    /// Base URL of the env server for `name = "external"` (empty otherwise).
    pub url: String,
    /// External env: deadline of one request in milliseconds.
    pub timeout_ms: u64,
    /// External env: retries after a failed request.
    pub retries: u32,
    /// External env: environment variable holding a bearer token (empty: none).
    pub auth_env: String,
    /// External env: largest answer accepted, in bytes.
    pub max_response_bytes: u64,
    /// Dataset env: the training rows (`.jsonl` or `.parquet`, local or `s3://`).
    pub train_file: String,
    /// Dataset env: the held-out rows.
    pub eval_file: String,
    /// Dataset env: `auto`, `exact`, `numeric` or `choice`.
    pub verifier: String,
    /// Dataset env: dotted path of a row's prompt.
    pub prompt_key: String,
    /// Dataset env: dotted path of a row's ground truth.
    pub answer_key: String,
    /// Dataset env: a fresh seeded row order per epoch.
    pub shuffle: bool,
    /// Dataset env: the seed of that order.
    pub shuffle_seed: u64,
    /// Dataset env: turns of a row with tools.
    pub max_turns: usize,
    /// Dataset env: the reward service (empty: the built-in verifiers).
    pub reward_url: String,
    /// Reward service: deadline of one request in milliseconds.
    pub reward_timeout_ms: u64,
    /// Reward service: retries after a failed request.
    pub reward_retries: u32,
    /// Reward service: most answers per request.
    pub reward_batch: usize,
    /// Reward service: how long a batch waits for more answers, in milliseconds.
    pub reward_batch_wait_ms: u64,
    /// Reward service: most requests in flight.
    pub reward_concurrency: usize,
    /// Reward service: environment variable holding a bearer token (empty: none).
    pub reward_auth_env: String,
    /// Env calls each env shard serves at once (ES-3); 1 serves them one after another.
    pub concurrency: usize,
    /// Simulated step latency: `none`, `lognormal` or `pareto`.
    pub latency: String,
    /// Latency median (lognormal) or minimum (pareto) in milliseconds.
    pub latency_ms: f64,
    /// Latency shape: sigma (lognormal) or tail index alpha (pareto).
    pub latency_shape: f64,
    /// Longest simulated delay in milliseconds.
    pub latency_cap_ms: f64,
}

impl Default for EnvSection {
    fn default() -> Self {
        let data = keel_envs::DatasetConfig::default();
        Self {
            name: "calc".into(),
            difficulty: 2,
            url: String::new(),
            timeout_ms: 5_000,
            retries: 3,
            auth_env: String::new(),
            max_response_bytes: keel_envs::ExternalConfig::default().max_response_bytes,
            train_file: String::new(),
            eval_file: String::new(),
            verifier: data.verifier,
            prompt_key: data.prompt_key,
            answer_key: data.answer_key,
            shuffle: data.shuffle,
            shuffle_seed: data.shuffle_seed,
            max_turns: data.max_turns,
            reward_url: data.reward.url,
            reward_timeout_ms: data.reward.timeout_ms,
            reward_retries: data.reward.retries,
            reward_batch: data.reward.batch,
            reward_batch_wait_ms: data.reward.batch_wait_ms,
            reward_concurrency: data.reward.concurrency,
            reward_auth_env: data.reward.auth_env,
            concurrency: 32,
            latency: "none".into(),
            latency_ms: 20.0,
            latency_shape: 1.0,
            latency_cap_ms: 1_000.0,
        }
    }
}

impl EnvSection {
    /// The env to build (`keel_envs::make_env`).
    pub fn env_config(&self) -> keel_envs::EnvConfig {
        let external = (self.name == "external").then(|| keel_envs::ExternalConfig {
            url: self.url.clone(),
            timeout_ms: self.timeout_ms,
            retries: self.retries,
            auth_env: self.auth_env.clone(),
            max_response_bytes: self.max_response_bytes,
            ..keel_envs::ExternalConfig::default()
        });
        let dataset = (self.name == "dataset").then(|| keel_envs::DatasetConfig {
            train_file: dataset_file(&self.train_file),
            eval_file: dataset_file(&self.eval_file),
            verifier: self.verifier.clone(),
            prompt_key: self.prompt_key.clone(),
            answer_key: self.answer_key.clone(),
            shuffle: self.shuffle,
            shuffle_seed: self.shuffle_seed,
            max_turns: self.max_turns,
            reward: keel_envs::dataset::RewardConfig {
                url: self.reward_url.clone(),
                timeout_ms: self.reward_timeout_ms,
                retries: self.reward_retries,
                batch: self.reward_batch,
                batch_wait_ms: self.reward_batch_wait_ms,
                concurrency: self.reward_concurrency,
                auth_env: self.reward_auth_env.clone(),
            },
        });
        keel_envs::EnvConfig {
            name: self.name.clone(),
            difficulty: self.difficulty,
            external,
            dataset,
        }
    }

    /// The `s3://` dataset files, each with the local folder its own folder syncs into.
    pub fn remote_dataset_files(&self) -> Vec<(String, std::path::PathBuf)> {
        if self.name != "dataset" {
            return Vec::new();
        }
        let mut folders: Vec<(String, std::path::PathBuf)> = Vec::new();
        for file in [&self.train_file, &self.eval_file] {
            if let Some((folder, _)) = split_s3_file(file) {
                if let Some(dir) = local_model_dir(folder) {
                    if !folders.iter().any(|(f, _)| f == folder) {
                        folders.push((folder.to_string(), dir));
                    }
                }
            }
        }
        folders
    }

    /// The simulated latency of each step.
    pub fn latency_model(&self) -> Result<keel_envs::LatencyModel, ConfigError> {
        let (ms, shape, cap_ms) = (self.latency_ms, self.latency_shape, self.latency_cap_ms);
        let model = match self.latency.as_str() {
            "none" => keel_envs::LatencyModel::None,
            "lognormal" => keel_envs::LatencyModel::Lognormal {
                median_ms: ms,
                sigma: shape,
                cap_ms,
            },
            "pareto" => keel_envs::LatencyModel::Pareto {
                scale_ms: ms,
                alpha: shape,
                cap_ms,
            },
            other => {
                return Err(range_err(
                    "env.latency",
                    format!("must be none, lognormal or pareto, got {other:?}"),
                ))
            }
        };
        model
            .validate()
            .map_err(|e| range_err("env.latency_ms", e.to_string()))?;
        Ok(model)
    }
}

/// `[model]`: a Hugging Face model folder (`path`), or the built-in tiny Llama-shaped model
/// (vocabulary from the env, MD-1).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    /// A Hugging Face model folder to train; empty = the built-in tiny model.
    pub path: String,
    /// Parameter kind: `float32`, or `bfloat16` (bf16 weights and activations, f32 master
    /// weights and optimizer state).
    pub dtype: String,
    /// Folder of the separate critic's first weights (its trunk; a `score` head in it is kept,
    /// else it starts at zero); empty = a copy of the policy at the first update.
    pub critic_path: String,
    /// Longest token sequence (prompt + all turns).
    pub context_len: usize,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Residual width.
    pub d_model: usize,
    /// Attention heads (must divide d_model).
    pub n_head: usize,
    /// `[model.lora]`: LoRA adapters on the frozen model (rank 0 = full fine-tuning).
    pub lora: LoraSection,
    /// Extra variables of the chat template (HT-2), e.g. `enable_thinking = false`.
    pub chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// How turn-by-turn rendering must agree with the whole conversation's (CC-5).
    pub chat_template_check: keel_learner::hf::TemplateCheck,
}

/// `[model.lora]`: train low-rank adapters instead of the whole model (verl's `lora_rank`,
/// `lora_alpha`, `target_modules`; PEFT's `lora_dropout`). `rank = 0` trains every weight.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LoraSection {
    /// Adapter rank; 0 = no adapters (full fine-tuning).
    pub rank: usize,
    /// Scaling numerator: the update is `B A x · alpha / rank`.
    pub alpha: f64,
    /// Dropout on the adapters' input during training.
    pub dropout: f64,
    /// Linear modules that get adapters: names or suffixes, or `all-linear`.
    pub target_modules: Vec<String>,
}

impl Default for LoraSection {
    fn default() -> Self {
        Self {
            rank: 0,
            alpha: 16.0,
            dropout: 0.0,
            target_modules: vec![keel_learner::hf::lora::ALL_LINEAR.to_string()],
        }
    }
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            path: String::new(),
            dtype: "float32".into(),
            critic_path: String::new(),
            context_len: 64,
            n_layer: 2,
            d_model: 64,
            n_head: 4,
            lora: LoraSection::default(),
            chat_template_kwargs: serde_json::Map::new(),
            chat_template_check: keel_learner::hf::TemplateCheck::default(),
        }
    }
}

/// `[sft]`: the warm start on noised oracle demonstrations.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SftSection {
    /// Optimizer steps (0 skips the warm start).
    pub steps: u64,
    /// Demonstrations per step.
    pub batch_size: usize,
    /// Learning rate.
    pub lr: f64,
    /// Demonstrations generated (from train task seeds).
    pub demos: usize,
    /// Probability that a demonstrated turn is replaced by a plausible mistake.
    pub noise: f64,
    /// Commit an SFT checkpoint every this many steps (0: only when stopped), SF-1.
    pub checkpoint_every: u64,
}

impl Default for SftSection {
    fn default() -> Self {
        Self {
            steps: 300,
            batch_size: 32,
            lr: 3e-3,
            demos: 2000,
            noise: 0.3,
            checkpoint_every: 0,
        }
    }
}

/// `[rollout]`: how generators sample.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RolloutSection {
    /// Distinct tasks per rollout batch.
    pub tasks_per_batch: usize,
    /// Episodes per task (a GRPO group).
    pub group_size: usize,
    /// Sampling temperature (1.0 = the policy itself).
    pub temperature: f64,
    /// Most tokens the model may emit in one turn.
    pub max_turn_tokens: usize,
    /// Generator actors.
    pub generators: usize,
    /// Environment-shard actors.
    pub env_shards: usize,
    /// Held-out tasks used for each evaluation.
    pub eval_tasks: usize,
    /// k of avg@k: episodes per held-out task sampled at `temperature`, besides the greedy
    /// pass@1 episode (EV-5); 0 = greedy only.
    pub eval_samples: usize,
    /// Sample with fixed forward shapes (SA-7): a trajectory does not depend on which episodes
    /// shared its decoding steps, so streamed sync runs are bit-reproducible on CPU.
    pub batch_invariant: BatchInvariance,
    /// Async mode: newer weights reach the samplers between decode steps (RO-10).
    pub inflight_updates: bool,
}

impl Default for RolloutSection {
    fn default() -> Self {
        Self {
            tasks_per_batch: 16,
            group_size: 8,
            temperature: 1.0,
            max_turn_tokens: 6,
            generators: 1,
            env_shards: 1,
            eval_tasks: 256,
            eval_samples: 2,
            batch_invariant: BatchInvariance::Auto,
            inflight_updates: true,
        }
    }
}

impl RolloutSection {
    /// Whether the sampler decodes with fixed shapes in `mode` (SA-7).
    pub fn batch_invariant(&self, mode: Mode) -> bool {
        match self.batch_invariant {
            BatchInvariance::On => true,
            BatchInvariance::Off => false,
            BatchInvariance::Auto => mode == Mode::Sync,
        }
    }
}

/// `[armor]`: ARMOR's anchor rollouts and reference resets (used when `learner.algo = "armor"`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ArmorSection {
    /// Episodes per task sampled from the reference policy (the spec's `ref_n`).
    pub anchor_episodes: usize,
    /// Copy the policy into the reference every this many RL steps (0 = never; spec's
    /// `ref_policy_sync_steps`); each reset is a checkpoint tagged `reference-reset`.
    pub reference_reset_every: u64,
    /// `[armor.loss]`: the loss options of the public code (mixture ratio and partner,
    /// `replace_old`, ...); the learner reads them through [`TrainConfig::learner_config`].
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

/// `[distributed]`: trainer and generators as separate processes (`keel trainer`,
/// `keel generator --rank R`), coordinated through the run root only.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DistributedSection {
    /// Seconds a work order may go unanswered before its range is issued again (a rank that
    /// died and did not come back).
    pub order_timeout_s: u64,
    /// How often processes look at the run root for orders, results and weights (ms).
    pub poll_ms: u64,
}

impl Default for DistributedSection {
    fn default() -> Self {
        Self {
            order_timeout_s: 600,
            poll_ms: 100,
        }
    }
}

/// `[[agent_models]]`: Dr. MAS — a separate model for some agents, with its own optimizer.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct AgentModelSection {
    /// Agent ids whose turns this model samples and trains on.
    pub agents: Vec<u32>,
    /// Its learning rate (default: `learner.lr`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
    /// Its ratio clip below 1 (default: the preset's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clip_low: Option<f64>,
    /// Its ratio clip above 1 (default: the preset's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clip_high: Option<f64>,
    /// Its entropy bonus (default: the preset's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entropy_coef: Option<f64>,
}

/// `[metrics]`: the Prometheus endpoint.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSection {
    /// Serve `/metrics` at all.
    pub enabled: bool,
    /// Address to bind (loopback unless you mean otherwise).
    pub bind: String,
    /// Port (9464 by default; 0 picks a free port).
    pub port: u16,
    /// Pushgateway base URL (`http://host:9091`) to push the final metrics to; empty = off.
    pub pushgateway_url: String,
}

impl Default for MetricsSection {
    fn default() -> Self {
        Self {
            enabled: true,
            bind: "127.0.0.1".into(),
            port: 9464,
            pushgateway_url: String::new(),
        }
    }
}

/// The whole job configuration (`keel config show` prints it).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// `[run]`
    pub run: RunSection,
    /// `[env]`
    pub env: EnvSection,
    /// `[model]`
    pub model: ModelSection,
    /// `[sft]`
    pub sft: SftSection,
    /// `[rollout]`
    pub rollout: RolloutSection,
    /// `[learner]`
    pub learner: LearnerConfig,
    /// `[metrics]`
    pub metrics: MetricsSection,
    /// `[guard]`
    pub guard: GuardSection,
    /// `[tracking]`: TensorBoard and MLflow.
    pub tracking: TrackingSection,
    /// `[faults]` (testing aid)
    pub faults: FaultsSection,
    /// `[armor]`
    pub armor: ArmorSection,
    /// `[pats]`: the scaffold (used when `learner.algo = "pats"`).
    pub pats: keel_envs::scaffold::ScaffoldConfig,
    /// `[[agent_models]]`: Dr. MAS separate agent models (empty = one shared model).
    pub agent_models: Vec<AgentModelSection>,
    /// `[distributed]`: separate trainer and generator processes.
    pub distributed: DistributedSection,
}

/// The learner defaults of the quickstart: the `grpo` preset with the spec's defaults (the
/// optimisation keys' defaults are tuned for the built-in tiny model, see `LearnerConfig`).
pub fn default_learner_config() -> LearnerConfig {
    LearnerConfig::default()
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            run: RunSection::default(),
            env: EnvSection::default(),
            model: ModelSection::default(),
            sft: SftSection::default(),
            rollout: RolloutSection::default(),
            learner: default_learner_config(),
            metrics: MetricsSection::default(),
            guard: GuardSection::default(),
            tracking: TrackingSection::default(),
            faults: FaultsSection::default(),
            armor: ArmorSection::default(),
            distributed: DistributedSection::default(),
            pats: keel_envs::scaffold::ScaffoldConfig::default(),
            agent_models: Vec::new(),
        }
    }
}

fn range_err(key: &str, reason: String) -> ConfigError {
    ConfigError::OutOfRange {
        key: key.into(),
        reason,
    }
}

fn check_at_least(key: &str, value: u64, min: u64) -> Result<(), ConfigError> {
    if value < min {
        return Err(range_err(
            key,
            format!("must be at least {min}, got {value}"),
        ));
    }
    Ok(())
}

fn check_unit(key: &str, value: f64, lo_open: bool) -> Result<(), ConfigError> {
    let ok = value.is_finite() && value <= 1.0 && if lo_open { value > 0.0 } else { value >= 0.0 };
    if !ok {
        let lo = if lo_open { "(0" } else { "[0" };
        return Err(range_err(key, format!("must be in {lo}, 1], got {value}")));
    }
    Ok(())
}

impl TrainConfig {
    /// Parses TOML text (CF-2) and validates it (CF-3).
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let cfg: TrainConfig =
            toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The effective configuration as TOML, as a person or a tracker may see it: URL
    /// credentials redacted (RD-1).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(&self.redacted())
            .unwrap_or_else(|e| format!("# cannot render config: {e}\n"))
    }

    /// This configuration with the user info of every URL key replaced by `***` (RD-1): what
    /// `keel config show`, TensorBoard and MLflow get. The run itself uses the real values.
    pub fn redacted(&self) -> TrainConfig {
        let mut c = self.clone();
        for url in [
            &mut c.env.url,
            &mut c.env.reward_url,
            &mut c.metrics.pushgateway_url,
            &mut c.pats.reviewer_url,
            &mut c.tracking.mlflow_url,
        ] {
            *url = keel_envs::redact_url(url);
        }
        c
    }

    /// Checks every value's range (CF-3).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let r = &self.run;
        if r.name.is_empty()
            || r.name.len() > 64
            || r.name.starts_with('-')
            || !r
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(range_err(
                "run.name",
                format!(
                    "must be 1 to 64 characters of [A-Za-z0-9_-], not starting with '-', got {:?}",
                    r.name
                ),
            ));
        }
        check_at_least("run.steps", r.steps, 1)?;
        check_at_least("run.checkpoint_every", r.checkpoint_every, 1)?;
        check_at_least("run.sigterm_grace_s", r.sigterm_grace_s, 1)?;
        if r.metrics_log_flush_ms > 60_000 {
            return Err(range_err(
                "run.metrics_log_flush_ms",
                format!("must be at most 60000, got {}", r.metrics_log_flush_ms),
            ));
        }
        check_at_least(
            "distributed.order_timeout_s",
            self.distributed.order_timeout_s,
            1,
        )?;
        check_at_least("distributed.poll_ms", self.distributed.poll_ms, 1)?;
        check_at_least(
            "run.checkpoint_multipart_bytes",
            r.checkpoint_multipart_bytes,
            1,
        )?;
        if r.mode == Mode::Async {
            check_at_least("run.staleness_bound", r.staleness_bound, 1)?;
        }
        if !["cpu", "cuda", "auto"].contains(&r.device.as_str()) {
            return Err(range_err(
                "run.device",
                format!("must be cpu, cuda or auto, got {:?}", r.device),
            ));
        }
        // VB-1..3: sizes bounded by what they allocate, before any product of them is taken.
        crate::footprint::check(self)?;
        let env_cfg = self.env.env_config();
        env_cfg.validate().map_err(|e| {
            let key = match &e {
                keel_envs::EnvError::UnknownEnv { .. } => "env.name",
                _ if self.env.name == "external" => "env.url",
                keel_envs::EnvError::InvalidConfig {
                    env: "dataset",
                    field,
                    ..
                } => match *field {
                    "train_file" => "env.train_file",
                    "eval_file" => "env.eval_file",
                    "verifier" => "env.verifier",
                    "prompt_key" => "env.prompt_key",
                    "answer_key" => "env.answer_key",
                    "reward_url" => "env.reward_url",
                    "reward_timeout_ms" => "env.reward_timeout_ms",
                    "reward_batch" => "env.reward_batch",
                    "reward_concurrency" => "env.reward_concurrency",
                    "reward_auth_env" => "env.reward_auth_env",
                    _ => "env.max_turns",
                },
                keel_envs::EnvError::Dataset { .. } => "env.train_file",
                _ => "env.difficulty",
            };
            range_err(key, e.to_string())
        })?;
        check_at_least("env.concurrency", self.env.concurrency as u64, 1)?;
        self.env.latency_model()?;
        let m = &self.model;
        check_at_least("model.context_len", m.context_len as u64, 16)?;
        check_at_least("model.n_layer", m.n_layer as u64, 1)?;
        check_at_least("model.n_head", m.n_head as u64, 1)?;
        check_at_least("model.d_model", m.d_model as u64, 8)?;
        if !m.d_model.is_multiple_of(m.n_head) {
            return Err(range_err(
                "model.d_model",
                format!(
                    "must be a multiple of model.n_head ({}), got {}",
                    m.n_head, m.d_model
                ),
            ));
        }
        if !(m.d_model / m.n_head).is_multiple_of(2) {
            return Err(range_err(
                "model.n_head",
                format!(
                    "must split model.d_model ({}) into heads of even width (RoPE), got {}",
                    m.d_model, m.n_head
                ),
            ));
        }
        let s = &self.sft;
        check_at_least("sft.batch_size", s.batch_size as u64, 1)?;
        if s.steps > 0 {
            check_at_least("sft.demos", s.demos as u64, 1)?;
        }
        check_unit("sft.lr", s.lr, true)?;
        check_unit("sft.noise", s.noise, false)?;
        let ro = &self.rollout;
        check_at_least("rollout.tasks_per_batch", ro.tasks_per_batch as u64, 1)?;
        check_at_least("rollout.group_size", ro.group_size as u64, 1)?;
        check_at_least("rollout.max_turn_tokens", ro.max_turn_tokens as u64, 1)?;
        check_at_least("rollout.generators", ro.generators as u64, 1)?;
        check_at_least("rollout.env_shards", ro.env_shards as u64, 1)?;
        check_at_least("rollout.eval_tasks", ro.eval_tasks as u64, 1)?;
        if ro.eval_samples > 64 {
            return Err(range_err(
                "rollout.eval_samples",
                format!("must be in 0..=64, got {}", ro.eval_samples),
            ));
        }
        if !(ro.temperature.is_finite() && ro.temperature > 0.0 && ro.temperature <= 10.0) {
            return Err(range_err(
                "rollout.temperature",
                format!("must be in (0, 10], got {}", ro.temperature),
            ));
        }
        // A lower bound: every turn needs its action, `<eot>`, a short observation and `<agent>`.
        // External and dataset envs learn their horizon from the server or the rows.
        if !["external", "dataset"].contains(&self.env.name.as_str()) {
            let max_turns = keel_envs::build_env(&env_cfg)
                .map_err(|e| range_err("env.name", e.to_string()))?
                .max_turns();
            let horizon = max_turns * (ro.max_turn_tokens + 3) + 16;
            if horizon > m.context_len {
                return Err(range_err(
                    "model.context_len",
                    format!("must be at least {horizon} for env {} at difficulty {} ({max_turns} turns) and rollout.max_turn_tokens = {}, got {}", self.env.name, self.env.difficulty, ro.max_turn_tokens, m.context_len),
                ));
            }
        }
        self.learner_config()
            .validate()
            .map_err(|e| range_err("learner", e.to_string()))?;
        if self.metrics.bind.parse::<std::net::IpAddr>().is_err() {
            return Err(range_err(
                "metrics.bind",
                format!("must be an IP address, got {:?}", self.metrics.bind),
            ));
        }
        let url = &self.metrics.pushgateway_url;
        if !url.is_empty() && !url.starts_with("http://") && !url.starts_with("https://") {
            return Err(range_err(
                "metrics.pushgateway_url",
                format!(
                    "must be empty or start with http:// or https://, got {:?}",
                    keel_envs::redact_url(url)
                ),
            ));
        }
        let g = &self.guard;
        check_at_least(
            "guard.max_consecutive_skips",
            u64::from(g.max_consecutive_skips),
            1,
        )?;
        check_at_least("guard.window", g.window as u64, 1)?;
        for (key, v) in [
            ("guard.grad_norm_spike_ratio", g.grad_norm_spike_ratio),
            ("guard.kl_spike_ratio", g.kl_spike_ratio),
        ] {
            if !(v.is_finite() && (v == 0.0 || v > 1.0)) {
                return Err(range_err(
                    key,
                    format!("must be 0 (off) or above 1, got {v}"),
                ));
            }
        }
        for (key, v) in [
            ("guard.grad_norm_floor", g.grad_norm_floor),
            ("guard.kl_floor", g.kl_floor),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(range_err(
                    key,
                    format!("must be a finite number >= 0, got {v}"),
                ));
            }
        }
        check_unit("guard.rewind_lr_factor", g.rewind_lr_factor, true)?;
        let f = &self.faults;
        check_at_least("faults.nan_loss_count", u64::from(f.nan_loss_count), 1)?;
        if f.nan_loss_model > self.agent_models.len() {
            return Err(range_err(
                "faults.nan_loss_model",
                format!(
                    "must be at most the number of [[agent_models]] ({}), got {}",
                    self.agent_models.len(),
                    f.nan_loss_model
                ),
            ));
        }
        check_unit("faults.lr_blowup_to", f.lr_blowup_to, true)?;
        self.validate_methods()
    }

    /// The method sections (`[armor]`, `[pats]`, `[[agent_models]]`) and what each algorithm
    /// needs from the rest of the config.
    fn validate_methods(&self) -> Result<(), ConfigError> {
        use keel_learner::Algo;
        let algo = self.learner.algo;
        if algo == Algo::Rtpo && self.run.mode != Mode::Sync {
            return Err(range_err(
                "run.mode",
                "must be sync when learner.algo = \"rtpo\" (siblings are continued with the current weights)".into(),
            ));
        }
        self.model_kind()?;
        check_at_least(
            "tracking.flush_every_steps",
            self.tracking.flush_every_steps,
            1,
        )?;
        let url = &self.tracking.mlflow_url;
        if !url.is_empty() && !url.starts_with("http://") {
            return Err(range_err(
                "tracking.mlflow_url",
                format!(
                    "must be an http:// URL (keel's MLflow client has no TLS; put an https server behind a local proxy), got {:?}",
                    keel_envs::redact_url(url)
                ),
            ));
        }
        if let Some(lora) = self.lora_config() {
            lora.validate().map_err(|e| match e {
                keel_learner::hf::HfError::Learner(keel_learner::LearnerError::InvalidConfig {
                    key,
                    reason,
                }) => range_err(&key, reason),
                other => range_err("model.lora", other.to_string()),
            })?;
            let resolved = self.learner.resolve();
            if resolved.needs_critic() && !resolved.policy_value_head() {
                return Err(range_err(
                    "model.lora.rank",
                    format!(
                        "LoRA needs a critic-free preset or learner.critic_model = \"shared\" (a separate critic would be a full copy of the model), but learner.algo = {:?} has a separate critic",
                        algo.name()
                    ),
                ));
            }
            if lora.dropout > 0.0 && self.learner.activation_checkpointing {
                return Err(range_err(
                    "model.lora.dropout",
                    "must be 0 with learner.activation_checkpointing = true (recomputed layers would draw other dropout masks)".to_string(),
                ));
            }
        }
        if !self.model.critic_path.is_empty() {
            let resolved = self.learner.resolve();
            if !resolved.needs_critic() || resolved.policy_value_head() {
                return Err(range_err(
                    "model.critic_path",
                    format!(
                        "needs a separate critic, but learner.algo = {:?} has {} critic",
                        algo.name(),
                        if resolved.needs_critic() {
                            "a shared (set learner.critic_model = \"separate\")"
                        } else {
                            "no"
                        }
                    ),
                ));
            }
        }
        if algo == Algo::Armor {
            check_at_least(
                "armor.anchor_episodes",
                self.armor.anchor_episodes as u64,
                1,
            )?;
        }
        self.pats
            .validate()
            .map_err(|e| range_err("pats", e.to_string()))?;
        let mut seen = std::collections::BTreeSet::new();
        for (i, m) in self.agent_models.iter().enumerate() {
            let key = format!("agent_models[{i}].agents");
            if m.agents.is_empty() {
                return Err(range_err(&key, "must list at least one agent id".into()));
            }
            for a in &m.agents {
                if *a >= 64 || !seen.insert(*a) {
                    return Err(range_err(
                        &key,
                        format!("agent {a} is listed twice or is not below 64"),
                    ));
                }
            }
            self.agent_learner_config(m)
                .validate()
                .map_err(|e| range_err(&format!("agent_models[{i}]"), e.to_string()))?;
        }
        if !self.agent_models.is_empty() && algo != Algo::DrMas {
            return Err(range_err(
                "agent_models",
                format!(
                    "separate agent models need learner.algo = \"dr_mas\", got {:?}",
                    algo.name()
                ),
            ));
        }
        Ok(())
    }

    /// The learner settings of the main model: `[learner]` with ARMOR's `[armor.loss]`.
    pub fn learner_config(&self) -> LearnerConfig {
        LearnerConfig {
            armor: self.armor.loss,
            ..self.learner.clone()
        }
    }

    /// The learner settings of a Dr. MAS agent model: `[learner]` with its overrides.
    pub fn agent_learner_config(&self, m: &AgentModelSection) -> LearnerConfig {
        let mut cfg = self.learner_config();
        if let Some(lr) = m.lr {
            cfg.lr = lr;
        }
        if m.clip_low.is_some() {
            cfg.clip_low = m.clip_low;
        }
        if m.clip_high.is_some() {
            cfg.clip_high = m.clip_high;
        }
        if m.entropy_coef.is_some() {
            cfg.entropy_coef = m.entropy_coef;
        }
        cfg
    }

    /// `agent_model[a]` = index of the model serving agent `a` (0 = the main model).
    pub fn agent_model_map(&self) -> Vec<usize> {
        let mut map = vec![0usize; 64];
        for (k, m) in self.agent_models.iter().enumerate() {
            for &a in &m.agents {
                if let Some(slot) = map.get_mut(a as usize) {
                    *slot = k + 1;
                }
            }
        }
        map
    }

    /// The built-in tiny model's shape over `tokenizer`'s vocabulary (MD-1).
    pub fn tiny_shape(&self, tokenizer: &keel_envs::Tokenizer) -> TinyShape {
        let sp = tokenizer.special();
        TinyShape {
            vocab_size: tokenizer.vocab_size(),
            context_len: self.model.context_len,
            n_layer: self.model.n_layer,
            d_model: self.model.d_model,
            n_head: self.model.n_head,
            bos_token_id: sp.bos,
            eos_token_id: sp.eot,
            pad_token_id: sp.pad,
        }
    }

    /// The tokenizer files every checkpoint carries: the model folder's (`model.path`), or the
    /// env's word-level vocabulary as `tokenizer.json` + `tokenizer_config.json` with keel's
    /// chat template (TK-5) for the built-in model.
    pub fn tokenizer_files(
        &self,
        tokenizer: &keel_envs::Tokenizer,
    ) -> Result<Vec<(String, Vec<u8>)>, keel_learner::hf::HfError> {
        use keel_learner::hf::tokenizer::{folder_files, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE};
        if let Some(dir) = self.model_dir() {
            return folder_files(&dir);
        }
        Ok(vec![
            (
                TOKENIZER_FILE.to_string(),
                tokenizer.hf_tokenizer_json().into_bytes(),
            ),
            (
                TOKENIZER_CONFIG_FILE.to_string(),
                tokenizer
                    .hf_tokenizer_config_json(self.model.context_len)
                    .into_bytes(),
            ),
        ])
    }

    /// The chat codec every role renders episodes with (CC-1..4), over the tokenizer files.
    pub fn chat_codec(
        &self,
        tokenizer: &keel_envs::Tokenizer,
    ) -> Result<keel_learner::hf::ChatCodec, keel_learner::hf::HfError> {
        codec_from_files(&self.tokenizer_files(tokenizer)?, &self.model)
    }

    /// The local folder of `model.path`: the path itself, or for `s3://…` its cache folder
    /// under `$KEEL_MODEL_CACHE` (default `~/.cache/keel/models`), which the job syncs first
    /// (MC-1..3); `None` for the built-in model.
    pub fn model_dir(&self) -> Option<std::path::PathBuf> {
        local_model_dir(&self.model.path)
    }

    /// The local folder of `model.critic_path`, like [`TrainConfig::model_dir`]; `None` when
    /// the critic starts from the policy.
    pub fn critic_dir(&self) -> Option<std::path::PathBuf> {
        local_model_dir(&self.model.critic_path)
    }

    /// The LoRA adapters of `[model.lora]` (seeded by the run seed), or None for full
    /// fine-tuning (`rank = 0`).
    pub fn lora_config(&self) -> Option<keel_learner::hf::LoraConfig> {
        let l = &self.model.lora;
        (l.rank > 0).then(|| keel_learner::hf::LoraConfig {
            rank: l.rank,
            alpha: l.alpha,
            dropout: l.dropout,
            target_modules: l.target_modules.clone(),
            seed: self.run.seed,
        })
    }

    /// The parameter kind of `model.dtype`.
    pub fn model_kind(&self) -> Result<tch::Kind, ConfigError> {
        match self.model.dtype.as_str() {
            "float32" | "f32" => Ok(tch::Kind::Float),
            "bfloat16" | "bf16" => Ok(tch::Kind::BFloat16),
            other => Err(range_err(
                "model.dtype",
                format!("must be float32 or bfloat16, got {other:?}"),
            )),
        }
    }

    /// The separate critic's first weights (`model.critic_path`), or None to copy the policy.
    pub fn critic_spec(
        &self,
        device: tch::Device,
    ) -> Result<Option<ModelSpec>, keel_learner::LearnerError> {
        let Some(dir) = self.critic_dir() else {
            return Ok(None);
        };
        let kind = self
            .model_kind()
            .map_err(|e| config_error("model.dtype", e))?;
        Ok(Some(ModelSpec::folder(&dir, device, kind, true)?))
    }

    /// The model every role builds (policy, reference, generators): the folder of
    /// `model.path`, else the tiny model over `tokenizer`'s vocabulary initialised from the run
    /// seed; with a value head when the preset needs a critic. A folder must hold
    /// `model.context_len` positions.
    pub fn model_spec(
        &self,
        tokenizer: &keel_envs::Tokenizer,
        device: tch::Device,
    ) -> Result<ModelSpec, keel_learner::LearnerError> {
        let value_head = self.learner.resolve().policy_value_head();
        let kind = self
            .model_kind()
            .map_err(|e| config_error("model.dtype", e))?;
        let Some(dir) = self.model_dir() else {
            let shape = self.tiny_shape(tokenizer);
            let spec = ModelSpec::tiny(&shape, device, self.run.seed, value_head)?;
            return Ok(ModelSpec {
                kind,
                lora: self.lora_config(),
                ..spec
            });
        };
        let spec = ModelSpec {
            lora: self.lora_config(),
            ..ModelSpec::folder(&dir, device, kind, value_head)?
        };
        let positions = spec.config.max_position_embeddings;
        if self.model.context_len > positions {
            return Err(keel_learner::LearnerError::InvalidConfig {
                key: "model.context_len".into(),
                reason: format!(
                    "{} exceeds the {positions} positions of {}",
                    self.model.context_len,
                    dir.display()
                ),
            });
        }
        Ok(spec)
    }

    /// Everything about a local model folder that a run would refuse, checked without loading
    /// a weight and before anything is written (`keel train` before it opens the run root,
    /// `keel data check --model`): config.json (architecture, RoPE), the weights' names and
    /// shapes, `model.context_len` against its positions, the tokenizer and the chat template
    /// (CC-4, CC-5), and the same for `model.critic_path`. A folder still to be synced from
    /// s3:// is checked when the run loads it. Returns the policy folder's config.
    pub fn preflight(
        &self,
    ) -> Result<Option<keel_learner::hf::HfConfig>, keel_learner::LearnerError> {
        use keel_learner::hf::{HfModel, LoadOptions};
        let value_head = self.learner.resolve().policy_value_head();
        let local =
            |d: Option<std::path::PathBuf>| d.filter(|_| !self.model.path.starts_with("s3://"));
        let Some(dir) = local(self.model_dir()) else {
            return Ok(None);
        };
        let mut opts = LoadOptions::policy(tch::Device::Cpu, tch::Kind::Float);
        opts.value_head = value_head;
        let cfg = HfModel::check_folder(&dir, opts)?;
        if let Some(memory) = crate::footprint::machine_memory() {
            let shape = crate::footprint::ModelShape::of_folder(&cfg);
            crate::footprint::check_memory(self, &shape, memory).map_err(|e| {
                keel_learner::LearnerError::InvalidConfig {
                    key: "model.path".into(),
                    reason: format!("{}: {e}", dir.display()),
                }
            })?;
        }
        if self.model.context_len > cfg.max_position_embeddings {
            return Err(keel_learner::LearnerError::InvalidConfig {
                key: "model.context_len".into(),
                reason: format!(
                    "{} exceeds the {} positions of {}",
                    self.model.context_len,
                    cfg.max_position_embeddings,
                    dir.display()
                ),
            });
        }
        codec_from_files(
            &keel_learner::hf::tokenizer::folder_files(&dir)?,
            &self.model,
        )?;
        if let Some(critic) = self
            .critic_dir()
            .filter(|_| !self.model.critic_path.starts_with("s3://"))
        {
            HfModel::check_folder(
                &critic,
                LoadOptions::critic(tch::Device::Cpu, tch::Kind::Float),
            )?;
        }
        Ok(Some(cfg))
    }

    /// The staleness bound in force: 0 in sync mode.
    pub fn staleness_bound(&self) -> u64 {
        match self.run.mode {
            Mode::Sync => 0,
            Mode::Async => self.run.staleness_bound,
        }
    }

    /// A stable hash of the effective configuration (CF-4), as 8 hex digits.
    pub fn config_hash(&self) -> String {
        let text = serde_json::to_string(self).unwrap_or_default();
        format!("{:08x}", crc32fast::hash(text.as_bytes()))
    }
}

/// A config error as the learner's error type (the key and reason are kept).
fn config_error(key: &str, e: ConfigError) -> keel_learner::LearnerError {
    keel_learner::LearnerError::InvalidConfig {
        key: key.into(),
        reason: match e {
            ConfigError::OutOfRange { reason, .. } => reason,
            other => other.to_string(),
        },
    }
}

/// `s3://bucket/dir/train.parquet` as (`s3://bucket/dir`, `train.parquet`).
fn split_s3_file(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix("s3://")?;
    let cut = rest.rfind('/')?;
    Some((&path[..5 + cut], &rest[cut + 1..]))
}

/// The local path of a dataset file: the path itself, or for `s3://…/FILE` the file in the
/// cache folder its folder syncs into (see [`local_model_dir`]).
fn dataset_file(path: &str) -> std::path::PathBuf {
    match split_s3_file(path).and_then(|(folder, name)| Some(local_model_dir(folder)?.join(name))) {
        Some(local) => local,
        None => std::path::PathBuf::from(path),
    }
}

/// The local folder of a model path: the path itself, or for `s3://…` its cache folder under
/// `$KEEL_MODEL_CACHE` (default `~/.cache/keel/models`); `None` for an empty path.
fn local_model_dir(path: &str) -> Option<std::path::PathBuf> {
    if path.is_empty() {
        return None;
    }
    let Some(rest) = path.strip_prefix("s3://") else {
        return Some(std::path::PathBuf::from(path));
    };
    let root = std::env::var_os("KEEL_MODEL_CACHE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_else(|| ".".into());
            std::path::Path::new(&home).join(".cache/keel/models")
        });
    let name: String = rest
        .trim_end_matches('/')
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '-' | '_' => c,
            _ => '_',
        })
        .collect();
    Some(root.join(format!("s3_{name}")))
}

/// A chat codec from `tokenizer.json` + `tokenizer_config.json` contents (a checkpoint's
/// files, or the built-in model's), rendering with `model`'s template kwargs and check.
pub fn codec_from_files(
    files: &[(String, Vec<u8>)],
    model: &ModelSection,
) -> Result<keel_learner::hf::ChatCodec, keel_learner::hf::HfError> {
    use keel_learner::hf::tokenizer::{TOKENIZER_CONFIG_FILE, TOKENIZER_FILE};
    use keel_learner::hf::{ChatCodec, HfError, HfTokenizer};
    let text = |name: &str| -> Result<&str, HfError> {
        let bytes = files
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, b)| b.as_slice())
            .ok_or_else(|| HfError::Tokenizer(format!("{name} is missing")))?;
        std::str::from_utf8(bytes).map_err(|e| HfError::Tokenizer(format!("{name}: {e}")))
    };
    let tok = HfTokenizer::from_json(text(TOKENIZER_FILE)?, text(TOKENIZER_CONFIG_FILE)?)?
        .with_template_kwargs(model.chat_template_kwargs.clone());
    let name = if model.path.is_empty() {
        "the built-in model"
    } else {
        model.path.as_str()
    };
    ChatCodec::new(tok, model.chat_template_check).map_err(|e| match e {
        HfError::Tokenizer(reason) => HfError::Tokenizer(format!("{name}: {reason}")),
        other => other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_toml_is_the_quickstart() {
        let cfg = TrainConfig::from_toml("").expect("defaults are valid");
        assert_eq!(cfg, TrainConfig::default());
    }

    #[test]
    fn lora_section_is_checked_and_seeded_by_the_run() {
        assert!(
            TrainConfig::default().lora_config().is_none(),
            "rank 0 = full fine-tune"
        );
        let cfg =
            TrainConfig::from_toml("[run]\nseed = 9\n[model.lora]\nrank = 8\n").expect("lora");
        let lora = cfg.lora_config().expect("adapters");
        assert_eq!((lora.rank, lora.seed, lora.alpha), (8, 9, 16.0));
        assert_eq!(lora.target_modules, ["all-linear"]);
        for (toml, key) in [
            ("[model.lora]\nrank = 8\nalpha = 0.0\n", "model.lora.alpha"),
            ("[model.lora]\nrank = 8\ndropout = 1.0\n", "model.lora.dropout"),
            ("[model.lora]\nrank = 8\ntarget_modules = []\n", "model.lora.target_modules"),
            ("[model.lora]\nrank = 8\n[learner]\nalgo = \"sao\"\n", "model.lora.rank"),
            (
                "[model.lora]\nrank = 8\ndropout = 0.1\n[learner]\nactivation_checkpointing = true\n",
                "model.lora.dropout",
            ),
            ("[model.lora]\nrnak = 8\n", "rnak"),
        ] {
            let err = TrainConfig::from_toml(toml).expect_err(toml).to_string();
            assert!(err.contains(key), "{toml}: {err}");
        }
    }

    #[test]
    fn unknown_key_is_named() {
        let err = TrainConfig::from_toml("[rollout]\ngroup_sise = 4\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("group_sise"), "{err}");
    }

    #[test]
    fn out_of_range_value_is_named() {
        let err = TrainConfig::from_toml("[rollout]\ngroup_size = 0\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("rollout.group_size"), "{err}");
        let err = TrainConfig::from_toml("[model]\nd_model = 30\nn_head = 4\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("model.d_model"), "{err}");
        let err = TrainConfig::from_toml("[run]\ndevice = \"tpu\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("run.device"), "{err}");
    }

    #[test]
    fn env_section_accepts_the_suite_and_names_bad_keys() {
        let cfg =
            TrainConfig::from_toml("[env]\nn_ops = 3\n").expect("n_ops is an alias of difficulty");
        assert_eq!(cfg.env.difficulty, 3);
        let cfg = TrainConfig::from_toml("[env]\nname = \"household\"\ndifficulty = 1\nlatency = \"pareto\"\n\n[model]\ncontext_len = 256\n")
            .expect("household");
        assert!(matches!(
            cfg.env.latency_model(),
            Ok(keel_envs::LatencyModel::Pareto { .. })
        ));
        let err = TrainConfig::from_toml("[env]\nname = \"maze\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("env.name") && err.contains("unknown environment `maze`"),
            "{err}"
        );
        let err = TrainConfig::from_toml("[env]\nname = \"external\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("env.url"), "{err}");
        let err = TrainConfig::from_toml("[env]\nlatency = \"gamma\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("env.latency"), "{err}");
        let err = TrainConfig::from_toml("[env]\nname = \"sokoban\"\ndifficulty = 4\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("model.context_len"), "{err}");
    }

    #[test]
    fn config_hash_is_stable_and_sensitive() {
        let a = TrainConfig::default();
        let mut b = TrainConfig::default();
        assert_eq!(a.config_hash(), b.config_hash());
        b.run.seed += 1;
        assert_ne!(a.config_hash(), b.config_hash());
    }
}
