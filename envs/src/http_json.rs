//! One JSON-over-HTTP client with keel's request discipline, shared by the clients of external
//! env servers ([`crate::external`]) and of reward services ([`crate::dataset::reward`]).
//!
//! Invariants:
//! - HJ-1 Every request has a deadline (`timeout_ms`) and is retried up to `retries` times with
//!   doubling backoff on transport errors and 5xx answers; 4xx answers are not retried.
//! - HJ-2 An answer larger than `max_response_bytes` is an error, never buffered whole.
//! - HJ-3 An optional bearer token comes from the environment variable `auth_env` names (never
//!   from a config file); naming an unset variable is a config error.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::EnvError;

/// How patiently to talk to one server.
#[derive(Clone, Debug)]
pub(crate) struct Discipline {
    pub timeout_ms: u64,
    pub retries: u32,
    pub backoff_ms: u64,
    pub max_response_bytes: u64,
}

/// A connection pool to one base URL (keep-alive; TLS for `https://`).
#[derive(Clone)]
pub(crate) struct JsonClient {
    base: String,
    agent: ureq::Agent,
    auth: Option<String>,
    discipline: Discipline,
}

impl JsonClient {
    /// A client of `base`; `env` and `field` name the config section of `auth_env` (HJ-3).
    pub(crate) fn new(
        base: &str,
        discipline: Discipline,
        auth_env: &str,
        env: &'static str,
        field: &'static str,
    ) -> Result<Self, EnvError> {
        let auth = if auth_env.is_empty() {
            None
        } else {
            let token = std::env::var(auth_env).map_err(|_| EnvError::InvalidConfig {
                env,
                field,
                value: auth_env.to_string(),
                expected: "the name of a set environment variable holding the bearer token",
            })?;
            Some(format!("Bearer {token}"))
        };
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_millis(discipline.timeout_ms)))
            .http_status_as_error(false)
            .build()
            .into();
        Ok(JsonClient {
            base: base.trim_end_matches('/').to_string(),
            agent,
            auth,
            discipline,
        })
    }

    fn url(&self, path: &str) -> String {
        format!("{}/{path}", self.base)
    }

    /// One attempt, no answer read: for best-effort notices (an env session's `/close`).
    pub(crate) fn post_once(&self, path: &str, body: &Value) {
        let req = self.agent.post(&self.url(path));
        let req = match &self.auth {
            Some(auth) => req.header("Authorization", auth),
            None => req,
        };
        let _ = req.send_json(body);
    }

    /// `GET` (no body) or `POST` (a JSON body) with deadline and retries (HJ-1, HJ-2); the
    /// error is the reason, for the caller to wrap with its server's name.
    pub(crate) fn call<T: DeserializeOwned>(
        &self,
        path: &str,
        body: Option<&Value>,
    ) -> Result<T, String> {
        let url = self.url(path);
        let d = &self.discipline;
        let mut backoff = Duration::from_millis(d.backoff_ms);
        let mut last = String::new();
        for attempt in 0..=d.retries {
            if attempt > 0 {
                std::thread::sleep(backoff);
                backoff *= 2;
            }
            let sent = match (body, &self.auth) {
                (Some(b), Some(auth)) => self
                    .agent
                    .post(&url)
                    .header("Authorization", auth)
                    .send_json(b),
                (Some(b), None) => self.agent.post(&url).send_json(b),
                (None, Some(auth)) => self.agent.get(&url).header("Authorization", auth).call(),
                (None, None) => self.agent.get(&url).call(),
            };
            let mut resp = match sent {
                Ok(r) => r,
                Err(e) => {
                    last = format!("{path}: {e}");
                    continue;
                }
            };
            let status = resp.status().as_u16();
            let limit = d.max_response_bytes;
            let text = match resp.body_mut().with_config().limit(limit).read_to_string() {
                Ok(t) => t,
                Err(ureq::Error::BodyExceedsLimit(_)) => {
                    return Err(format!(
                        "{path}: the answer is larger than max_response_bytes ({limit})"
                    ))
                }
                Err(e) => {
                    last = format!("{path}: reading the answer: {e}");
                    continue;
                }
            };
            if status >= 500 {
                last = format!("{path}: HTTP {status}: {text}");
                continue;
            }
            if status >= 400 {
                return Err(format!("{path}: HTTP {status}: {text}"));
            }
            return serde_json::from_str(&text)
                .map_err(|e| format!("{path}: bad JSON answer ({e})"));
        }
        Err(format!("{last} (after {} retries)", d.retries))
    }
}
