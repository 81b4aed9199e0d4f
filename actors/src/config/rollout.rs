//! `[rollout]`: how generators sample: batch shape, temperature, actors, evaluation, and the
//! sampler's batch invariance.

use serde::{Deserialize, Serialize};

use super::key::{ints, Bound, Key, Range};
use super::{ConfigError, Mode};

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

/// `rollout.backend`: what samples the turns.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// The built-in KV-cache sampler (SA-1..7).
    Keel,
    /// One vLLM server per generator (`crate::vllm`).
    Vllm,
}

/// `[rollout.vllm]`: the vLLM server of each generator.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct VllmSection {
    /// The interpreter of an environment where vLLM is installed (keel starts the server).
    pub python: String,
    /// A running server to use instead (same host: it reads keel's weight folders).
    pub url: String,
    /// Longest wait for a started server's `/health`, in seconds.
    pub startup_timeout_s: u64,
}

impl Default for VllmSection {
    fn default() -> Self {
        Self {
            python: String::new(),
            url: String::new(),
            startup_timeout_s: 600,
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
    /// What samples the turns: the built-in sampler or a vLLM server.
    pub backend: Backend,
    /// The vLLM server (`backend = "vllm"`).
    pub vllm: VllmSection,
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
            backend: Backend::Keel,
            vllm: VllmSection::default(),
        }
    }
}

/// `rollout.tasks_per_batch` (also bounded with group_size, VB-1).
pub const TASKS_PER_BATCH: Key = Key::with_also(
    "rollout.tasks_per_batch",
    ints(1, 1 << 16),
    "x group_size <= 65536",
    "Distinct tasks per rollout batch.",
);
/// `rollout.group_size` (also bounded with tasks_per_batch, VB-1).
pub const GROUP_SIZE: Key = Key::with_also(
    "rollout.group_size",
    ints(1, 1 << 10),
    "x tasks_per_batch <= 65536",
    "Episodes per task (a GRPO group).",
);
const TEMPERATURE: Key = Key::new(
    "rollout.temperature",
    Range::Real {
        lo: Bound::Open(0.0),
        hi: Bound::Closed(10.0),
    },
    "Sampling temperature (1 = the policy itself).",
);
/// `rollout.max_turn_tokens` (also bounded by model.context_len).
pub const MAX_TURN_TOKENS: Key = Key::with_also(
    "rollout.max_turn_tokens",
    ints(1, 1 << 20),
    "(this + 3) x the env's turns + 16 <= model.context_len",
    "Most tokens the model may emit in one turn.",
);
const GENERATORS: Key = Key::new("rollout.generators", ints(1, 1 << 10), "Generator actors (keel train); with keel trainer, the generator ranks 0..N-1 it addresses work orders to (one keel generator --rank R process each).");
const ENV_SHARDS: Key = Key::new(
    "rollout.env_shards",
    ints(1, 1 << 10),
    "Environment-shard actors, each on its own thread; episode e lives on shard e mod env_shards.",
);
const EVAL_TASKS: Key = Key::new(
    "rollout.eval_tasks",
    ints(1, 1_000_000),
    "Held-out tasks per evaluation.",
);
const EVAL_SAMPLES: Key = Key::new("rollout.eval_samples", ints(0, 64), "k of avg@k: sampled episodes per held-out task besides the greedy pass@1 one (0 = greedy only).");

const VLLM_PYTHON: Key = Key::with_also("rollout.vllm.python", Range::Text("a path to a python interpreter"), "required with backend = vllm unless rollout.vllm.url is set", "The interpreter of an environment where vLLM 0.32 is installed (scripts/vllm_env.sh installs one and prints it); each generator starts `python -m vllm.entrypoints.openai.api_server` on a free loopback port and stops its process group with itself.");
const VLLM_URL: Key = Key::new("rollout.vllm.url", Range::Text("http://host:port, or empty"), "A running vLLM server (started with VLLM_SERVER_DEV_MODE=1, --logprobs-mode processed_logprobs, --enable-scale-out and --block-size 32) to sample on instead of starting one; it must read the weight folders keel writes (the same host). Empty: keel starts a server per generator.");
const VLLM_STARTUP: Key = Key::new(
    "rollout.vllm.startup_timeout_s",
    ints(1, 86_400),
    "Longest wait, in seconds, for a started vLLM server to answer /health; a server that exits or misses it fails the run with the end of its log.",
);

/// The keys of `[rollout]`.
pub const KEYS: &[Key] = &[
    TASKS_PER_BATCH,
    GROUP_SIZE,
    TEMPERATURE,
    MAX_TURN_TOKENS,
    GENERATORS,
    ENV_SHARDS,
    EVAL_TASKS,
    EVAL_SAMPLES,
    Key::new("rollout.inflight_updates", Range::Bool, "Async mode: a newly published policy version reaches the samplers between decode steps and the episodes in flight continue under it (each turn records the version it was queued under, never newer than its oldest token; the batch's start version is what admission bounds, so no token exceeds run.staleness_bound and nothing is restarted). false: a batch is sampled with the version it started with."),
    Key::new("rollout.backend", Range::Words(&["keel", "vllm"]), "What samples the turns: keel's built-in KV-cache sampler, or one vLLM server per generator driven token-in/token-out (keel renders and tokenises; the engine's log-probs are the behaviour log-probs; every policy version is written as a Hugging Face folder, swapped in with the prefix cache reset, and checked against the learner's probe before a token is sampled). vllm needs a model folder (model.path), one policy model and no ARMOR anchors; batch_invariant does not apply to it."),
    VLLM_PYTHON,
    VLLM_URL,
    VLLM_STARTUP,
    Key::new("rollout.batch_invariant", Range::Words(&["auto", "on", "off"]), "Give every sampler forward a shape that depends only on the sequence's own length (each turn prefilled alone, padded to a power-of-two length bucket; decode in 8-row groups per length bucket), so an episode's tokens and log-probs do not depend on which episodes share the sampler or when their observations arrived: streamed runs and crash resumes stay bit-reproducible on CPU. Costs about 1.5x the sampling time at SmolLM2-135M shapes (BENCHMARKS.md). auto = on in sync mode, off in async mode (whose batches depend on timing anyway, through the weight version each starts with); GPU kernels are not bit-deterministic across shapes, so off is the throughput choice there."),
];

impl RolloutSection {
    /// Checks every key of `[rollout]` on its own.
    pub fn validate(&self) -> Result<(), ConfigError> {
        TASKS_PER_BATCH.check_int(self.tasks_per_batch as u64)?;
        GROUP_SIZE.check_int(self.group_size as u64)?;
        MAX_TURN_TOKENS.check_int(self.max_turn_tokens as u64)?;
        GENERATORS.check_int(self.generators as u64)?;
        ENV_SHARDS.check_int(self.env_shards as u64)?;
        EVAL_TASKS.check_int(self.eval_tasks as u64)?;
        EVAL_SAMPLES.check_int(self.eval_samples as u64)?;
        VLLM_STARTUP.check_int(self.vllm.startup_timeout_s)?;
        if self.backend == Backend::Vllm {
            if self.vllm.url.is_empty() && self.vllm.python.is_empty() {
                return Err(VLLM_PYTHON.error("backend = \"vllm\" needs the interpreter of an environment with vLLM (scripts/vllm_env.sh prints one) or rollout.vllm.url".into()));
            }
            let url = &self.vllm.url;
            if !(url.is_empty() || url.starts_with("http://") || url.starts_with("https://")) {
                return Err(
                    VLLM_URL.error(format!("must be http://host:port, got {:?}", self.vllm.url))
                );
            }
        }
        TEMPERATURE.check_real(self.temperature)
    }

    /// Whether the sampler decodes with fixed shapes in `mode` (SA-7).
    pub fn batch_invariant(&self, mode: Mode) -> bool {
        match self.batch_invariant {
            BatchInvariance::On => true,
            BatchInvariance::Off => false,
            BatchInvariance::Auto => mode == Mode::Sync,
        }
    }
}

/// `rollout.backend = "vllm"` against the other sections: one policy model, no ARMOR anchors
/// (one server serves one model). That it needs a model folder is the preflight's check
/// (`--model` may set it after the file is read).
pub fn validate_backend(cfg: &super::TrainConfig) -> Result<(), ConfigError> {
    if cfg.rollout.backend != Backend::Vllm {
        return Ok(());
    }
    let refuse = |reason: &str| {
        Err(ConfigError::OutOfRange {
            key: "rollout.backend".into(),
            reason: format!("\"vllm\" {reason}"),
        })
    };
    if !cfg.agent_models.is_empty() {
        return refuse("serves one policy model; [[agent_models]] need the built-in sampler");
    }
    if cfg.learner.algo == keel_learner::Algo::Armor {
        return refuse("serves the policy only; ARMOR's anchor episodes sample the reference model and need the built-in sampler");
    }
    Ok(())
}
