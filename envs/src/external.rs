//! [`ExternalEnv`]: an environment served by another process (or machine) over keel's HTTP+JSON
//! env protocol, so real benchmarks (ALFWorld, WebShop, a search engine) plug in without Rust.
//!
//! The protocol (full text in `envs/external/PROTOCOL.md`; reference server
//! `envs/external/reference_server.py`): `GET /info`, `POST /reset`, `/step`, `/snapshot`,
//! `/restore`, `/close`, JSON bodies. Every answer that changes the state carries a `view`
//! (agent id, anchor state, admissible and oracle actions, success, turns, done), which the
//! client caches so that the trait's queries cost no round trip.
//!
//! Invariants:
//! - EX-1 Every request has a deadline (`timeout_ms`) and is retried up to `retries` times with
//!   doubling backoff on transport errors and 5xx answers; 4xx answers are not retried
//!   (`http_json`, HJ-1).
//! - EX-2 Retrying a step is safe: each `/step` names its turn number and the server answers a
//!   repeated turn with the stored answer instead of stepping again.
//! - EX-4 One [`ExternalClient`] per server: its episodes share the connection pool (keep-alive;
//!   TLS for `https://`) and the `/info` answer; an optional bearer token comes from the
//!   environment variable `auth_env` names.
//! - EX-5 An answer larger than `max_response_bytes` is an error, never buffered whole.
//! - EX-6 `/info` is checked before use: a name of 1-64 characters, `max_turns` in
//!   `1..=10_000`, a vocabulary of `1..=100_000` words of 1-64 characters without spaces.
//! - EX-3 A server that stays unreachable makes `try_reset`/`try_step` return
//!   `EnvError::External`; the env shard fails that episode without restarting (ES-4). The
//!   infallible `reset`/`step` panic with the same message, which the shard's supervision
//!   (ES-1) turns into a failed episode.

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::env::{fnv1a64, Env, StepOutcome};
use crate::error::EnvError;
use crate::http_json::{Discipline, JsonClient};
use crate::snapshot::EnvSnapshot;

/// Where the external env server is and how patiently to talk to it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExternalConfig {
    /// Base URL, e.g. `http://127.0.0.1:8770`.
    pub url: String,
    /// Deadline of one request in milliseconds.
    pub timeout_ms: u64,
    /// Retries after the first attempt.
    pub retries: u32,
    /// First backoff in milliseconds (doubles per retry).
    pub backoff_ms: u64,
    /// Name of an environment variable whose value is sent as `Authorization: Bearer <value>`
    /// with every request (empty: no auth header). The token itself never sits in a config.
    #[serde(default)]
    pub auth_env: String,
    /// Largest answer body accepted, in bytes (EX-5).
    #[serde(default = "default_max_response_bytes")]
    pub max_response_bytes: u64,
}

fn default_max_response_bytes() -> u64 {
    4 << 20
}

impl Default for ExternalConfig {
    fn default() -> Self {
        ExternalConfig {
            url: String::new(),
            timeout_ms: 5_000,
            retries: 3,
            backoff_ms: 50,
            auth_env: String::new(),
            max_response_bytes: default_max_response_bytes(),
        }
    }
}

impl ExternalConfig {
    /// Checks the URL scheme and the timeout.
    pub fn validate(&self) -> Result<(), EnvError> {
        if !(self.url.starts_with("http://") || self.url.starts_with("https://")) {
            return Err(EnvError::InvalidConfig {
                env: "external",
                field: "url",
                value: crate::redact_url(&self.url),
                expected: "an http:// or https:// base URL of an env server",
            });
        }
        if self.max_response_bytes == 0 {
            return Err(EnvError::InvalidConfig {
                env: "external",
                field: "max_response_bytes",
                value: "0".into(),
                expected: "a positive number of bytes",
            });
        }
        if self.timeout_ms == 0 {
            return Err(EnvError::InvalidConfig {
                env: "external",
                field: "timeout_ms",
                value: "0".into(),
                expected: "a positive number of milliseconds",
            });
        }
        Ok(())
    }
}

/// Most turns an external env may declare per episode (EX-6).
const MAX_TURNS_LIMIT: usize = 10_000;
/// Most words an external env's vocabulary may have (EX-6).
const MAX_VOCABULARY: usize = 100_000;

/// What the server says about itself.
#[derive(Clone, Debug, Deserialize)]
struct Info {
    name: String,
    max_turns: usize,
    vocabulary: Vec<String>,
}

/// The cached per-state answers of the server.
#[derive(Clone, Debug, Default, Deserialize)]
struct View {
    #[serde(default)]
    agent_id: u32,
    #[serde(default)]
    anchor_state: String,
    #[serde(default)]
    admissible_actions: Vec<String>,
    #[serde(default)]
    oracle_action: String,
    #[serde(default)]
    success: bool,
    #[serde(default)]
    turns: u64,
    #[serde(default = "yes")]
    done: bool,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
struct Outcome {
    observation: String,
    reward: f32,
    done: bool,
    invalid_action: bool,
}

/// EX-6: what `/info` says must be usable: a name, a horizon and a vocabulary of sane sizes
/// (the tokenizer and every episode's turn budget are built from them).
fn check_info(info: &Info) -> Result<(), String> {
    let bad = |what: String| Err(what);
    if info.name.is_empty() || info.name.len() > 64 || info.name.chars().any(char::is_whitespace) {
        return bad(format!(
            "name {:?} must be 1-64 characters without spaces",
            info.name
        ));
    }
    if info.max_turns == 0 || info.max_turns > MAX_TURNS_LIMIT {
        return bad(format!(
            "max_turns {} must be in 1..={MAX_TURNS_LIMIT}",
            info.max_turns
        ));
    }
    if info.vocabulary.is_empty() || info.vocabulary.len() > MAX_VOCABULARY {
        return bad(format!(
            "the vocabulary has {} words; it must have 1..={MAX_VOCABULARY}",
            info.vocabulary.len()
        ));
    }
    if let Some(w) = info
        .vocabulary
        .iter()
        .find(|w| w.is_empty() || w.len() > 64 || w.chars().any(char::is_whitespace))
    {
        return bad(format!(
            "vocabulary word {w:?} must be 1-64 characters without spaces"
        ));
    }
    Ok(())
}

/// Decodes one answer of the protocol as the client reads it (`path`: `info`, `reset`, `step`,
/// `snapshot` or `restore`): `/info` is checked (EX-6) and made into the tokenizer a run builds
/// from it. The entry of the `env_answer` fuzz target (`keel-integration`'s `fuzz`).
pub fn decode_answer(path: &str, text: &str) -> Result<(), String> {
    let bad = |e: serde_json::Error| format!("{path}: bad JSON answer ({e})");
    match path {
        "info" => {
            let info: Info = serde_json::from_str(text).map_err(bad)?;
            check_info(&info)?;
            let tokenizer = crate::Tokenizer::from_words(&info.vocabulary);
            tokenizer
                .encode(&info.vocabulary.join(" "))
                .map_err(|e| e.to_string())?;
        }
        "reset" => {
            let a: ResetAnswer = serde_json::from_str(text).map_err(bad)?;
            fnv1a64(a.view.anchor_state.as_bytes());
        }
        "step" => {
            let a: StepAnswer = serde_json::from_str(text).map_err(bad)?;
            fnv1a64(a.view.anchor_state.as_bytes());
        }
        "snapshot" => {
            serde_json::from_str::<SnapshotAnswer>(text).map_err(bad)?;
        }
        "restore" => {
            serde_json::from_str::<RestoreAnswer>(text).map_err(bad)?;
        }
        other => return Err(format!("the protocol has no answer to {other:?}")),
    }
    Ok(())
}

/// A connection pool to one env server and what its `/info` said (EX-4): cloned into every
/// episode's [`ExternalEnv`], so episodes share connections and `/info` is asked once.
#[derive(Clone)]
pub struct ExternalClient {
    url: Arc<str>,
    http: JsonClient,
    info: Arc<Info>,
}

impl ExternalClient {
    /// Checks the config, connects and reads `/info`.
    pub fn connect(cfg: ExternalConfig) -> Result<Self, EnvError> {
        cfg.validate()?;
        let discipline = Discipline {
            timeout_ms: cfg.timeout_ms,
            retries: cfg.retries,
            backoff_ms: cfg.backoff_ms,
            max_response_bytes: cfg.max_response_bytes,
        };
        let http = JsonClient::new(&cfg.url, discipline, &cfg.auth_env, "external", "auth_env")?;
        let mut client = ExternalClient {
            url: cfg.url.as_str().into(),
            http,
            info: Arc::new(Info {
                name: String::new(),
                max_turns: 0,
                vocabulary: vec![],
            }),
        };
        let info: Info = client.call("info", None)?;
        check_info(&info).map_err(|what| client.err(format!("info: {what}")))?;
        client.info = Arc::new(info);
        Ok(client)
    }

    /// A fresh episode on this server (no request until its reset).
    pub fn env(&self) -> ExternalEnv {
        ExternalEnv {
            client: self.clone(),
            session: None,
            view: View {
                done: true,
                ..View::default()
            },
        }
    }

    fn err(&self, reason: String) -> EnvError {
        EnvError::External {
            url: crate::redact_url(&self.url),
            reason,
        }
    }

    /// One request with deadline and retries (EX-1).
    fn call<T: DeserializeOwned>(&self, path: &str, body: Option<Value>) -> Result<T, EnvError> {
        self.http.call(path, body.as_ref()).map_err(|r| self.err(r))
    }
}

/// A client of one environment instance (one episode) on an external server.
pub struct ExternalEnv {
    client: ExternalClient,
    session: Option<String>,
    view: View,
}

impl ExternalEnv {
    /// Connects and reads `/info` (one client for this env alone; a shard shares one
    /// [`ExternalClient`] between its episodes instead).
    pub fn connect(cfg: ExternalConfig) -> Result<Self, EnvError> {
        Ok(ExternalClient::connect(cfg)?.env())
    }

    fn call<T: DeserializeOwned>(&self, path: &str, body: Option<Value>) -> Result<T, EnvError> {
        self.client.call(path, body)
    }

    fn session_value(&self) -> Value {
        self.session.clone().map_or(Value::Null, Value::String)
    }
}

impl Drop for ExternalEnv {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            // Best effort, one attempt: the server forgets idle sessions on its own.
            self.client
                .http
                .post_once("close", &json!({ "session": s }));
        }
    }
}

#[derive(Deserialize)]
struct ResetAnswer {
    session: String,
    prompt: String,
    view: View,
}

#[derive(Deserialize)]
struct StepAnswer {
    outcome: Outcome,
    view: View,
}

#[derive(Deserialize)]
struct SnapshotAnswer {
    state: Value,
}

#[derive(Deserialize)]
struct RestoreAnswer {
    session: String,
    view: View,
}

impl Env for ExternalEnv {
    fn name(&self) -> &str {
        &self.client.info.name
    }

    // keel calls `try_reset` / `try_step` on every env (env shards ES-4, SFT demonstrations,
    // PATS seeding, `keel env eval|play`); these two exist for the trait's other users and name
    // the failure if one of them calls them.
    fn reset(&mut self, task_seed: u64) -> String {
        self.try_reset(task_seed).unwrap_or_else(|e| panic!("{e}"))
    }

    fn step(&mut self, action: &str) -> StepOutcome {
        self.try_step(action).unwrap_or_else(|e| panic!("{e}"))
    }

    fn try_reset(&mut self, task_seed: u64) -> Result<String, EnvError> {
        let a: ResetAnswer = self.call(
            "reset",
            Some(json!({ "session": self.session_value(), "seed": task_seed })),
        )?;
        self.session = Some(a.session);
        self.view = a.view;
        Ok(a.prompt)
    }

    fn try_step(&mut self, action: &str) -> Result<StepOutcome, EnvError> {
        if self.session.is_none() || self.view.done {
            return Ok(StepOutcome {
                observation: "error invalid action".into(),
                reward: 0.0,
                done: true,
                invalid_action: true,
                agent_id: self.view.agent_id,
                anchor_key: self.anchor_key(),
                anchor_state: self.anchor_state(),
                messages: Vec::new(),
                text: None,
                segment: None,
            });
        }
        let turn = self.view.turns + 1;
        let a: StepAnswer = self.call(
            "step",
            Some(json!({ "session": self.session_value(), "turn": turn, "action": action })),
        )?;
        self.view = a.view;
        Ok(StepOutcome {
            observation: a.outcome.observation,
            reward: a.outcome.reward,
            done: a.outcome.done,
            invalid_action: a.outcome.invalid_action,
            agent_id: self.view.agent_id,
            anchor_key: fnv1a64(self.view.anchor_state.as_bytes()),
            anchor_state: self.view.anchor_state.clone(),
            messages: Vec::new(),
            text: None,
            segment: None,
        })
    }

    fn oracle_action(&self) -> String {
        self.view.oracle_action.clone()
    }

    fn max_turns(&self) -> usize {
        self.client.info.max_turns
    }

    fn success(&self) -> bool {
        self.view.success
    }

    fn vocabulary(&self) -> Vec<String> {
        self.client.info.vocabulary.clone()
    }

    fn admissible_actions(&self) -> Vec<String> {
        if self.view.done {
            return Vec::new();
        }
        self.view.admissible_actions.clone()
    }

    fn agent_id(&self) -> u32 {
        self.view.agent_id
    }

    fn anchor_state(&self) -> String {
        self.view.anchor_state.clone()
    }

    fn snapshot(&self) -> Result<EnvSnapshot, EnvError> {
        let a: SnapshotAnswer =
            self.call("snapshot", Some(json!({ "session": self.session_value() })))?;
        Ok(EnvSnapshot {
            env: self.client.info.name.clone(),
            state: a.state,
        })
    }

    fn restore(&mut self, snapshot: &EnvSnapshot) -> Result<(), EnvError> {
        if snapshot.env != self.client.info.name {
            return Err(EnvError::Snapshot {
                env: self.client.info.name.clone(),
                reason: format!("the snapshot was taken from `{}`", snapshot.env),
            });
        }
        let a: RestoreAnswer = self.call(
            "restore",
            Some(json!({ "session": self.session_value(), "state": snapshot.state })),
        )?;
        self.session = Some(a.session);
        self.view = a.view;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreachable_server_is_a_clear_error_after_retries() {
        // Port 9 (discard) on loopback: nothing listens in the test environment.
        let cfg = ExternalConfig {
            url: "http://127.0.0.1:9".into(),
            timeout_ms: 200,
            retries: 1,
            backoff_ms: 1,
            ..ExternalConfig::default()
        };
        let err = ExternalEnv::connect(cfg).err().unwrap().to_string();
        assert!(
            err.starts_with("external env at http://127.0.0.1:9: info:"),
            "{err}"
        );
        assert!(err.contains("after 1 retries"), "{err}");
        let bad = ExternalConfig {
            url: "ftp://x".into(),
            ..ExternalConfig::default()
        };
        assert!(matches!(
            ExternalEnv::connect(bad),
            Err(EnvError::InvalidConfig { field: "url", .. })
        ));
    }
}
