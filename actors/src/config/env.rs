//! `[env]`: which environment, how hard, how its shard serves it, and the envs crate's own
//! config types as they are: `[env.external]` is `keel_envs::ExternalConfig`, `[env.dataset]`
//! (with `[env.dataset.reward]`) is `keel_envs::DatasetConfig`, `[env.agent]` is
//! `keel_envs::AgentConfig`.
//!
//! Invariants:
//! - CE-1: an error of the envs crate's own validation names its own key: a field `f` of the
//!   external config is `env.external.f`, of the dataset config `env.dataset.f` (its reward
//!   service's fields are `reward.f`), with no table of names in between.
//! - CE-2: the envs crate's types are used unchanged, so a key added there is a key here (CX-1
//!   then asks for its documentation row).

use serde::{Deserialize, Serialize};

use super::key::{at_least, ints, Key, Range, POSITIVE};
use super::ConfigError;

/// `[env]`: which environment, how hard, and how its steps behave (`keel env list`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EnvSection {
    /// Environment name (`keel env list`).
    pub name: String,
    /// The difficulty knob (sets the horizon); `n_ops` is accepted as an alias (calc).
    #[serde(alias = "n_ops")]
    pub difficulty: usize,
    /// Env calls each env shard serves at once (ES-3); 1 serves them one after another; 0 sizes
    /// it from the episodes in flight ([`super::TrainConfig::env_concurrency`]).
    pub concurrency: usize,
    /// Simulated step latency: `none`, `lognormal` or `pareto`.
    pub latency: String,
    /// Latency median (lognormal) or minimum (pareto) in milliseconds.
    pub latency_ms: f64,
    /// Latency shape: sigma (lognormal) or tail index alpha (pareto).
    pub latency_shape: f64,
    /// Longest simulated delay in milliseconds.
    pub latency_cap_ms: f64,
    /// `[env.external]`: the env server of `name = "external"`.
    pub external: keel_envs::ExternalConfig,
    /// `[env.dataset]`: the rows of `name = "dataset"` and their reward service; the tasks of
    /// `name = "agent"`.
    pub dataset: keel_envs::DatasetConfig,
    /// `[env.agent]`: the agent program of `name = "agent"` and its gateway.
    pub agent: keel_envs::AgentConfig,
}

impl Default for EnvSection {
    fn default() -> Self {
        Self {
            name: "calc".into(),
            difficulty: 2,
            concurrency: 0,
            latency: "none".into(),
            latency_ms: 20.0,
            latency_shape: 1.0,
            latency_cap_ms: 1_000.0,
            external: keel_envs::ExternalConfig::default(),
            dataset: keel_envs::DatasetConfig::default(),
            agent: keel_envs::AgentConfig::default(),
        }
    }
}

const NAME: Key = Key::with_also(
    "env.name",
    Range::Words(&[
        "calc",
        "search-qa",
        "household",
        "shop",
        "sokoban",
        "solver-verifier",
        "search-team",
        "external",
        "dataset",
        "agent",
    ]),
    "external, dataset and agent need [env.external], [env.dataset] or [env.agent] + [env.dataset]",
    "Environment name (`keel env list`).",
);
const DIFFICULTY: Key = Key::with_also(
    "env.difficulty",
    ints(1, 4),
    "1..=3 for search-qa, search-team",
    "The difficulty knob; sets the horizon. `n_ops` is an alias (calc: operations per task).",
);
/// `env.concurrency` (also capped by VB-1).
pub const CONCURRENCY: Key = Key::new("env.concurrency", ints(0, 1 << 16), "Env calls (reset/step, simulated latency included) each env shard serves at once; each shard runs on its own thread and its env calls on a blocking pool, so one slow call holds only its own episode. 0 (the default) = every episode in flight: rollout.tasks_per_batch x (rollout.group_size + anchor episodes) x the batches sampled at once (rollout.generators in async mode in one process, else 1), divided among rollout.env_shards. Set a number to bound what an env server or agent pool is asked to run at once.");
const LATENCY: Key = Key::new(
    "env.latency",
    Range::Words(&["none", "lognormal", "pareto"]),
    "Simulated long-tailed step latency (async-vs-sync benchmarks).",
);
const LATENCY_MS: Key = Key::new(
    "env.latency_ms",
    POSITIVE,
    "Latency median (lognormal) or minimum (pareto), milliseconds.",
);
const LATENCY_SHAPE: Key = Key::new(
    "env.latency_shape",
    POSITIVE,
    "Lognormal sigma or Pareto tail index alpha.",
);
const LATENCY_CAP_MS: Key = Key::new(
    "env.latency_cap_ms",
    POSITIVE,
    "Longest simulated delay, milliseconds.",
);

/// The keys of `[env]` and its sub-tables.
pub const KEYS: &[Key] = &[
    NAME,
    DIFFICULTY,
    CONCURRENCY,
    LATENCY,
    LATENCY_MS,
    LATENCY_SHAPE,
    LATENCY_CAP_MS,
    Key::with_also("env.external.url", Range::Text("http://... or https://..."), "when env.name = external", "Base URL of an env server speaking keel's HTTP+JSON env protocol."),
    Key::new("env.external.timeout_ms", at_least(1), "External env: deadline of one request."),
    Key::new("env.external.retries", at_least(0), "External env: retries after a failed request (steps are idempotent per turn)."),
    Key::new("env.external.backoff_ms", at_least(0), "External env: wait before the first retry, doubling with each further retry."),
    Key::new("env.external.auth_env", Range::Text("an environment variable name, or empty"), "External env: the variable whose value is sent as `Authorization: Bearer <value>` with every request (the token never sits in a config file); a named variable that is unset is a config error."),
    Key::new("env.external.max_response_bytes", at_least(1), "External env: largest answer body accepted; a larger one fails its episode instead of being buffered."),
    Key::with_also("env.dataset.train_file", Range::Text("a .jsonl or .parquet file (local or s3://)"), "when env.name = dataset", "Dataset env: the training rows in verl's layout (`prompt` as chat messages or a string, `data_source`, `reward_model.ground_truth`, `extra_info`); training task i is row i of a seeded per-epoch order, so checkpoints' data frontier is the dataset position. An s3:// file's folder is synced into $KEEL_MODEL_CACHE first, like a model folder (`keel data check FILE` shows how rows will look)."),
    Key::with_also("env.dataset.eval_file", Range::Text("a .jsonl or .parquet file (local or s3://)"), "when env.name = dataset", "Dataset env: the held-out rows; eval task i is row i mod n, unshuffled."),
    Key::new("env.dataset.verifier", Range::Words(&["auto", "exact", "numeric", "choice", "gsm8k", "math"]), "Dataset env: how answers are scored; auto picks per row by `data_source`, as verl's default_compute_score does where keel ports verl's scorer: `openai/gsm8k` gsm8k (verl's strict `#### N`, compared as a string), `lighteval/MATH`, `DigitalLearningGmbH/MATH-lighteval` and `HuggingFaceH4/MATH-500` math (verl's last \\boxed{} with hendrycks_math normalisation); other math sources numeric (keel's lenient \\boxed{} / last-number extraction, also available by name), multiple-choice sources choice, others exact. The oracle and SFT demonstrations write answers in the verifier's form (`#### 72`, `\\boxed{72}`)."),
    Key::new("env.dataset.prompt_key", Range::Text("a dotted path"), "Dataset env: where a row's prompt is (default `prompt`; OpenRLHF-style JSONL: `input`)."),
    Key::new("env.dataset.answer_key", Range::Text("a dotted path"), "Dataset env: where a row's ground truth is (default `reward_model.ground_truth`; OpenRLHF-style JSONL: `label`); a string, a number or a list of accepted answers."),
    Key::new("env.dataset.shuffle", Range::Bool, "Dataset env: visit the training rows in a fresh seeded order each epoch (false: file order)."),
    Key::new("env.dataset.shuffle_seed", at_least(0), "Dataset env: the seed of that order."),
    Key::new("env.dataset.max_turns", ints(2, 64), "Dataset env: turns of a row that names tools (`tools` or `extra_info.tools`: calculator, search); rows without tools are single-turn."),
    Key::new("env.dataset.reward.url", Range::Text("http://... or https://..., or empty"), "Dataset env: a reward service scoring the model's final responses instead of the built-in verifiers: `POST /score` with batches of {data_source, prompt, response, ground_truth, extra_info} (verl's compute_score keywords; `response` is the whole decoded response, untrimmed, reasoning included: verl's solution_str) answered by one reward each, any finite number, passed through unclamped (verl's math_dapo -1 and format penalties keep their meaning); a non-finite reward or a failed request fails the episode, never becomes a reward. The oracle and SFT demonstrations are scored by the row's verifier, never sent. Asked `GET /health` at startup, so a service that is down or refuses its reward function stops the run before it starts. Reference server: envs/external/reward_server.py (calls a verl reward function file as verl does: by keyword, either verl signature, `--reward-kwargs JSON`)."),
    Key::new("env.dataset.reward.timeout_ms", at_least(1), "Reward service: deadline of one request."),
    Key::new("env.dataset.reward.retries", at_least(0), "Reward service: retries after a transport error or a 5xx answer (doubling backoff); a batch that still fails fails its episodes, it never becomes a reward."),
    Key::new("env.dataset.reward.batch", ints(1, 4096), "Reward service: most answers per /score request; answers of concurrent episodes are gathered."),
    Key::new("env.dataset.reward.batch_wait_ms", at_least(0), "Reward service: how long a batch waits for more answers after its first."),
    Key::new("env.dataset.reward.concurrency", ints(1, 256), "Reward service: most /score requests in flight."),
    Key::new("env.agent.launch", Range::Words(&["spawn", "pull"]), "Agent env: how an episode gets its agent: `spawn` (keel starts env.agent.command once per episode) or `pull` (agents on other hosts or in a sandbox pool take episodes from POST $GATEWAY/v1/keel/episodes/next with the pool key and end them with POST /v1/keel/episodes/end; docs/agents.md). An episode nobody pulls within env.agent.timeout_s fails."),
    Key::new("env.agent.pool_key_env", Range::Text("an environment variable name"), "Agent env, launch = pull: the environment variable of the `keel train` process that holds the secret (at least 16 characters) pulling agents send as their bearer token; the secret itself stays out of config files."),
    Key::with_also("env.agent.command", Range::Text("a list: program and arguments"), "when env.name = agent and env.agent.launch = spawn", "Agent env: the agent program, started once per episode with OPENAI_BASE_URL (keel's gateway, `/v1`), OPENAI_API_KEY (the episode's secret key) and KEEL_TASK (the dataset row as JSON: split, index, data_source, prompt, ground_truth, extra_info; also on stdin). Every chat-completions call it makes is one turn sampled by the policy being trained; the episode ends when it exits (docs/agents.md)."),
    Key::new("env.agent.bind", Range::Text("host:port"), "Agent env: where the gateway listens; port 0 picks a free port. Loopback unless you bind another address: agents on other hosts need one."),
    Key::new("env.agent.max_calls", ints(1, 4096), "Agent env: most answered calls per episode; later calls are answered 429 and the episode ends when the agent exits."),
    Key::new("env.agent.timeout_s", POSITIVE, "Agent env: longest an episode's agent may run, seconds; past it the agent is killed and the episode fails (never trained)."),
    Key::new("env.agent.max_request_bytes", ints(1024, 1 << 30), "Agent env: largest request body; a larger one is answered 413."),
    Key::new("env.agent.reward", Range::Words(&["agent", "verifier"]), "Agent env: where an episode's reward comes from: `agent` (the agent posts {\"reward\": x} to $OPENAI_BASE_URL/keel/reward before it exits) or `verifier` (the row's verifier, or env.dataset.reward.url, scores the last answer)."),
    Key::new("env.dataset.reward.auth_env", Range::Text("an environment variable name, or empty"), "Reward service: the variable whose value is sent as `Authorization: Bearer <value>`."),
];

/// The key an error of the envs crate's validation names (CE-1).
pub fn key_of(name: &str, e: &keel_envs::EnvError) -> String {
    match e {
        keel_envs::EnvError::UnknownEnv { .. } => NAME.name.into(),
        keel_envs::EnvError::InvalidConfig {
            env: sub @ ("external" | "dataset" | "agent"),
            field,
            ..
        } => format!("env.{sub}.{field}"),
        keel_envs::EnvError::Dataset { .. } if name == "dataset" || name == "agent" => {
            "env.dataset".into()
        }
        _ if name == "external" => "env.external".into(),
        _ => DIFFICULTY.name.into(),
    }
}

impl EnvSection {
    /// Checks `[env]`'s own keys and, through the envs crate, the selected env's config.
    pub fn validate(&self, env_config: &keel_envs::EnvConfig) -> Result<(), ConfigError> {
        env_config.validate().map_err(|e| ConfigError::OutOfRange {
            key: key_of(&self.name, &e),
            reason: e.to_string(),
        })?;
        CONCURRENCY.check_int(self.concurrency as u64)?;
        LATENCY_MS.check_real(self.latency_ms)?;
        LATENCY_SHAPE.check_real(self.latency_shape)?;
        LATENCY_CAP_MS.check_real(self.latency_cap_ms)?;
        self.latency_model().map(|_| ())
    }

    /// The simulated latency of each step.
    pub fn latency_model(&self) -> Result<keel_envs::LatencyModel, ConfigError> {
        let (ms, shape, cap_ms) = (self.latency_ms, self.latency_shape, self.latency_cap_ms);
        let model = match self.latency.as_str() {
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
                LATENCY.check_word(other)?;
                keel_envs::LatencyModel::None
            }
        };
        model
            .validate()
            .map_err(|e| LATENCY_MS.error(e.to_string()))?;
        Ok(model)
    }
}
