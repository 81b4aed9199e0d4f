//! The run configuration: one module per TOML section, each holding its struct, defaults,
//! validation and the documentation of its keys side by side ([`key::Key`]); this module
//! composes them into [`TrainConfig`]. Builders of runtime objects from a config (model specs,
//! chat codecs, env configs, dataset files) live in `crate::parts`, not here.
//!
//! Invariants:
//! - CF-1: the defaults of every section are the quickstart job; an empty TOML file is valid.
//! - CF-2: an unknown key anywhere is an error naming that key (serde `deny_unknown_fields`);
//!   an old spelling of a renamed key is read as its new name with a warning naming both
//!   ([`legacy`]).
//! - CF-3: `TrainConfig::validate` rejects every out-of-range value with an error that names the
//!   key as it is written in TOML (`section.key`) and the allowed range.
//! - CF-4: `TrainConfig::config_hash` is a stable function of the effective configuration; it is
//!   recorded in every checkpoint so that a resume under a different config can be detected.

pub mod agent_models;
pub mod armor;
pub mod distributed;
pub mod env;
pub mod explain;
pub mod faults;
pub mod guard;
pub mod key;
pub mod learner;
pub mod legacy;
pub mod metrics;
pub mod model;
pub mod pats;
pub mod rollout;
pub mod run;
pub mod sft;
pub mod tracking;

use keel_learner::LearnerConfig;
use serde::{Deserialize, Serialize};

pub use agent_models::AgentModelSection;
pub use armor::ArmorSection;
pub use distributed::DistributedSection;
pub use env::EnvSection;
pub use faults::FaultsSection;
pub use guard::GuardSection;
pub use metrics::MetricsSection;
pub use model::{LoraSection, ModelSection};
pub use rollout::{BatchInvariance, RolloutSection};
pub use run::{Mode, RunSection};
pub use sft::SftSection;
pub use tracking::TrackingSection;

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

/// The whole job configuration (`keel config show` prints it); its default is the quickstart
/// (CF-1).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
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

/// Every documented key, section by section, in the order `keel config explain` lists them.
pub fn keys() -> impl Iterator<Item = &'static key::Key> {
    [
        run::KEYS,
        env::KEYS,
        model::KEYS,
        sft::KEYS,
        rollout::KEYS,
        learner::KEYS,
        tracking::KEYS,
        metrics::KEYS,
        guard::KEYS,
        faults::KEYS,
        distributed::KEYS,
        armor::KEYS,
        pats::KEYS,
        agent_models::KEYS,
    ]
    .into_iter()
    .flatten()
}

impl TrainConfig {
    /// Env calls each shard serves at once: `env.concurrency`, or with 0 every episode in
    /// flight (`batches_in_flight` batches of `tasks_per_batch × (group_size + anchors)`)
    /// spread over `rollout.env_shards`, within the key's range.
    pub fn env_concurrency(&self, batches_in_flight: usize) -> usize {
        if self.env.concurrency > 0 {
            return self.env.concurrency;
        }
        let anchors = crate::method::select(self).sampling(self).anchor_episodes;
        let episodes = self.rollout.tasks_per_batch
            * (self.rollout.group_size + anchors)
            * batches_in_flight.max(1);
        episodes
            .div_ceil(self.rollout.env_shards.max(1))
            .clamp(1, 1 << 16)
    }

    /// Parses TOML text (CF-2) and validates it (CF-3). Old spellings of renamed keys are read
    /// under their new names, each with a warning.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let mut table: toml::Table =
            toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        for note in legacy::rename_old_keys(&mut table)? {
            tracing::warn!("config: {note}");
        }
        let cfg = TrainConfig::deserialize(table).map_err(|e| ConfigError::Parse(e.to_string()))?;
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
            &mut c.env.external.url,
            &mut c.env.dataset.reward.url,
            &mut c.metrics.pushgateway_url,
            &mut c.pats.reviewer_url,
            &mut c.tracking.mlflow_url,
        ] {
            *url = keel_envs::redact_url(url);
        }
        c
    }

    /// Checks every value's range (CF-3): each section's own keys, then what keys of several
    /// sections must satisfy together.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.run.validate()?;
        self.distributed.validate()?;
        // VB-1..3: sizes bounded by what they allocate, before any product of them is taken.
        self.model.validate()?;
        self.sft.validate()?;
        self.rollout.validate()?;
        rollout::validate_backend(self)?;
        crate::footprint::check(self)?;
        let env_cfg = self.env_config();
        self.env.validate(&env_cfg)?;
        self.check_horizon(&env_cfg)?;
        learner::validate(self)?;
        self.metrics.validate()?;
        self.guard.validate()?;
        self.faults.validate(self.agent_models.len())?;
        self.tracking.validate()?;
        self.armor
            .validate(self.learner.algo == keel_learner::Algo::Armor)?;
        pats::validate(&self.pats)?;
        agent_models::validate(self)
    }

    /// `model.context_len` holds the env's horizon: every turn needs its action, `<eot>`, a
    /// short observation and `<agent>`. External and dataset envs learn their horizon from the
    /// server or the rows.
    fn check_horizon(&self, env_cfg: &keel_envs::EnvConfig) -> Result<(), ConfigError> {
        if ["external", "dataset", "agent"].contains(&self.env.name.as_str()) {
            return Ok(());
        }
        let max_turns = keel_envs::build_env(env_cfg)
            .map_err(|e| ConfigError::OutOfRange {
                key: "env.name".into(),
                reason: e.to_string(),
            })?
            .max_turns();
        let (ro, m) = (&self.rollout, &self.model);
        let horizon = max_turns * (ro.max_turn_tokens + 3) + 16;
        if horizon > m.context_len {
            return Err(model::CONTEXT_LEN.error(format!(
                "must be at least {horizon} for env {} at difficulty {} ({max_turns} turns) and rollout.max_turn_tokens = {}, got {}",
                self.env.name, self.env.difficulty, ro.max_turn_tokens, m.context_len
            )));
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

    /// The staleness bound in force: 0 in sync mode.
    pub fn staleness_bound(&self) -> u64 {
        self.run.staleness_bound()
    }

    /// A stable hash of the effective configuration (CF-4), as 8 hex digits.
    pub fn config_hash(&self) -> String {
        let text = serde_json::to_string(self).unwrap_or_default();
        format!("{:08x}", crc32fast::hash(text.as_bytes()))
    }
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
    fn env_concurrency_defaults_to_every_episode_in_flight() {
        let cfg = TrainConfig::default();
        let per_batch = cfg.rollout.tasks_per_batch * cfg.rollout.group_size;
        assert_eq!(cfg.env_concurrency(1), per_batch);
        assert_eq!(cfg.env_concurrency(4), 4 * per_batch);
        let sharded = TrainConfig::from_toml(
            "[rollout]\nenv_shards = 3\ntasks_per_batch = 5\ngroup_size = 2\n",
        )
        .expect("config");
        assert_eq!(sharded.env_concurrency(1), 4, "10 episodes over 3 shards");
        let fixed = TrainConfig::from_toml("[env]\nconcurrency = 7\n").expect("config");
        assert_eq!(fixed.env_concurrency(4), 7, "a set value is kept");
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
        assert!(err.contains("env.external.url"), "{err}");
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

    #[test]
    fn the_vllm_backend_needs_an_interpreter_or_a_server_and_one_policy() {
        let err = |toml: &str| TrainConfig::from_toml(toml).unwrap_err().to_string();
        let e = err("[rollout]\nbackend = \"vllm\"\n");
        assert!(e.contains("rollout.vllm.python"), "{e}");
        let e = err("[rollout]\nbackend = \"vllm\"\n[rollout.vllm]\nurl = \"localhost:8000\"\n");
        assert!(e.contains("rollout.vllm.url"), "{e}");
        let e = err("[rollout]\nbackend = \"sglang\"\n");
        assert!(e.contains("backend"), "{e}");
        let vllm = "[rollout]\nbackend = \"vllm\"\n[rollout.vllm]\npython = \"/venv/bin/python\"\n";
        let e = err(&format!("{vllm}[learner]\nalgo = \"armor\"\n"));
        assert!(e.contains("rollout.backend") && e.contains("ARMOR"), "{e}");
        let cfg = TrainConfig::from_toml(vllm).expect("an interpreter is enough");
        assert_eq!(cfg.rollout.backend, rollout::Backend::Vllm);
        let e = cfg.preflight().expect_err("no model folder").to_string();
        assert!(e.contains("model.path"), "{e}");
    }
}
