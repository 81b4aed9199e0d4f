//! The client of a user's reward service (`env.dataset.reward.url`): the reward of a model response
//! that ends a dataset episode is asked over HTTP instead of computed by a built-in verifier.
//!
//! Protocol (the reference server is `envs/external/reward_server.py`, stdlib only, which calls
//! a verl reward function file exactly as verl does):
//! - `GET /health` → a JSON object: asked once when the client starts; a service that does not
//!   answer it with success, or answers `{"ok": false, "error": …}`, is a startup error naming
//!   the URL and the reason, before any episode runs.
//! - `POST /score` with `{"items": [{"data_source", "prompt", "response", "ground_truth",
//!   "extra_info"}, …]}` → `{"rewards": [r, …]}`, one finite number per item, in order. The
//!   fields are verl's `compute_score(data_source=, solution_str=, ground_truth=, extra_info=)`
//!   keywords, plus the prompt's messages; `response` is the whole decoded response (DS-5).
//!
//! Invariants:
//! - RC-1 Batching: scoring requests of concurrent episodes are gathered into one `/score`
//!   request of at most `batch` items; a batch is sent when full or `batch_wait_ms` after its
//!   first item arrived.
//! - RC-2 At most `concurrency` `/score` requests are in flight; items arriving meanwhile wait
//!   and form the next batches.
//! - RC-3 Requests follow HJ-1..3 (deadline, retries with backoff on transport errors and 5xx,
//!   bearer token from `auth_env`). A batch that still fails fails each of its episodes with
//!   `EnvError::RewardService` naming the service (ES-4: the shard keeps serving); an answer of
//!   the wrong length or with a non-finite reward fails them too. Every finite reward is passed
//!   through as it is — never clamped to `[0, 1]` (verl's `math_dapo` -1 and format penalties
//!   keep their meaning) — and a reward is never invented.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::error::EnvError;
use crate::http_json::{Discipline, JsonClient};

/// Where the reward service is and how to talk to it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RewardConfig {
    /// Base URL (empty: rewards come from the built-in verifiers).
    pub url: String,
    /// Deadline of one request in milliseconds.
    pub timeout_ms: u64,
    /// Retries after the first attempt.
    pub retries: u32,
    /// Most items per `/score` request (RC-1).
    pub batch: usize,
    /// How long a batch waits for more items after its first, in milliseconds (RC-1).
    pub batch_wait_ms: u64,
    /// Most `/score` requests in flight (RC-2).
    pub concurrency: usize,
    /// Environment variable holding a bearer token (empty: none).
    pub auth_env: String,
}

impl Default for RewardConfig {
    fn default() -> Self {
        RewardConfig {
            url: String::new(),
            timeout_ms: 30_000,
            retries: 3,
            batch: 32,
            batch_wait_ms: 5,
            concurrency: 4,
            auth_env: String::new(),
        }
    }
}

impl RewardConfig {
    /// Whether a service scores answers.
    pub fn enabled(&self) -> bool {
        !self.url.is_empty()
    }

    /// Checks the keys (when enabled).
    pub fn validate(&self) -> Result<(), EnvError> {
        if !self.enabled() {
            return Ok(());
        }
        let bad = |field, value: String, expected| {
            Err(EnvError::InvalidConfig {
                env: "dataset",
                field,
                value,
                expected,
            })
        };
        if !(self.url.starts_with("http://") || self.url.starts_with("https://")) {
            return bad(
                "reward.url",
                crate::redact_url(&self.url),
                "an http:// or https:// base URL of a reward service",
            );
        }
        if self.timeout_ms == 0 {
            return bad(
                "reward.timeout_ms",
                "0".into(),
                "a positive number of milliseconds",
            );
        }
        if !(1..=4096).contains(&self.batch) {
            return bad(
                "reward.batch",
                self.batch.to_string(),
                "an integer in 1..=4096",
            );
        }
        if !(1..=256).contains(&self.concurrency) {
            return bad(
                "reward.concurrency",
                self.concurrency.to_string(),
                "an integer in 1..=256",
            );
        }
        Ok(())
    }
}

/// One answer to score.
struct Job {
    item: Value,
    reply: Sender<Result<f32, String>>,
}

/// A running client: a batcher thread and `concurrency` sender threads, stopped when the last
/// handle is dropped.
pub struct RewardClient {
    url: String,
    jobs: Mutex<Sender<Job>>,
}

impl std::fmt::Debug for RewardClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RewardClient")
            .field("url", &self.url)
            .finish()
    }
}

#[derive(Deserialize)]
struct ScoreAnswer {
    rewards: Vec<f64>,
}

impl RewardClient {
    /// Checks the config, asks `/health` and starts the threads.
    pub fn connect(cfg: &RewardConfig) -> Result<Arc<RewardClient>, EnvError> {
        cfg.validate()?;
        let discipline = Discipline {
            timeout_ms: cfg.timeout_ms,
            retries: cfg.retries,
            backoff_ms: 50,
            max_response_bytes: 16 << 20,
        };
        let http = JsonClient::new(
            &cfg.url,
            discipline,
            &cfg.auth_env,
            "dataset",
            "reward.auth_env",
        )?;
        let url = crate::redact_url(&cfg.url);
        check_health(http.call::<Value>("health", None)).map_err(|reason| {
            EnvError::RewardService {
                url: url.clone(),
                reason,
            }
        })?;
        let (jobs, queue) = mpsc::channel::<Job>();
        let (batches, batch_queue) = mpsc::sync_channel::<Vec<Job>>(0);
        let batch_queue = Arc::new(Mutex::new(batch_queue));
        for _ in 0..cfg.concurrency {
            let (http, queue) = (http.clone(), batch_queue.clone());
            std::thread::spawn(move || send_batches(&http, &queue));
        }
        let (size, wait) = (cfg.batch, Duration::from_millis(cfg.batch_wait_ms));
        std::thread::spawn(move || gather(&queue, &batches, size, wait));
        Ok(Arc::new(RewardClient {
            url,
            jobs: Mutex::new(jobs),
        }))
    }

    /// The reward of one final answer (blocks until its batch is answered; RC-3).
    pub fn score(
        &self,
        data_source: &str,
        prompt: &[super::PromptMessage],
        response: &str,
        ground_truth: &Value,
        extra_info: &Value,
    ) -> Result<f32, EnvError> {
        let item = json!({
            "data_source": data_source,
            "prompt": prompt,
            "response": response,
            "ground_truth": ground_truth,
            "extra_info": extra_info,
        });
        let (reply, answer) = mpsc::channel();
        let sent = match self.jobs.lock() {
            Ok(jobs) => jobs.send(Job { item, reply }).is_ok(),
            Err(_) => false,
        };
        let result = if sent {
            answer
                .recv()
                .unwrap_or_else(|_| Err("the reward client stopped".into()))
        } else {
            Err("the reward client stopped".into())
        };
        result.map_err(|reason| EnvError::RewardService {
            url: self.url.clone(),
            reason,
        })
    }
}

/// RC-1: collects jobs into batches and hands each to a free sender (blocking while all
/// `concurrency` senders are busy, RC-2).
fn gather(
    queue: &Receiver<Job>,
    batches: &mpsc::SyncSender<Vec<Job>>,
    size: usize,
    wait: Duration,
) {
    while let Ok(first) = queue.recv() {
        let deadline = Instant::now() + wait;
        let mut batch = vec![first];
        while batch.len() < size {
            let left = deadline.saturating_duration_since(Instant::now());
            match queue.recv_timeout(left) {
                Ok(job) => batch.push(job),
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        if batches.send(batch).is_err() {
            return;
        }
    }
}

/// One sender: posts batches and answers their jobs (RC-3).
fn send_batches(http: &JsonClient, queue: &Mutex<Receiver<Vec<Job>>>) {
    loop {
        let batch = match queue.lock() {
            Ok(q) => match q.recv() {
                Ok(b) => b,
                Err(_) => return,
            },
            Err(_) => return,
        };
        let items: Vec<&Value> = batch.iter().map(|j| &j.item).collect();
        let answer = http
            .call::<ScoreAnswer>("score", Some(&json!({ "items": items })))
            .and_then(|a| check_rewards(a.rewards, batch.len()));
        match answer {
            Ok(rewards) => {
                for (job, r) in batch.into_iter().zip(rewards) {
                    let _ = job.reply.send(Ok(r));
                }
            }
            Err(reason) => {
                for job in batch {
                    let _ = job.reply.send(Err(reason.clone()));
                }
            }
        }
    }
}

/// The `/health` answer: an error unless it succeeded without `"ok": false`.
fn check_health(answer: Result<Value, String>) -> Result<(), String> {
    match answer {
        Err(reason) => Err(format!("GET /health failed: {reason}")),
        Ok(body) if body.get("ok") == Some(&Value::Bool(false)) => Err(format!(
            "GET /health says it cannot score: {}",
            body.get("error").unwrap_or(&body)
        )),
        Ok(_) => Ok(()),
    }
}

/// RC-3: one reward per item, each finite (as `f32` too); any finite value passes through.
fn check_rewards(rewards: Vec<f64>, items: usize) -> Result<Vec<f32>, String> {
    if rewards.len() != items {
        return Err(format!(
            "score: {} rewards for {items} items",
            rewards.len()
        ));
    }
    let rewards: Vec<f32> = rewards.into_iter().map(|r| r as f32).collect();
    if let Some((i, r)) = rewards.iter().enumerate().find(|(_, r)| !r.is_finite()) {
        return Err(format!(
            "score: reward {r} of item {i} is not a finite number"
        ));
    }
    Ok(rewards)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rc3_finite_rewards_pass_through_unclamped_and_non_finite_ones_fail() {
        assert_eq!(
            check_rewards(vec![-1.0, 0.5, 2.0, -0.25], 4),
            Ok(vec![-1.0, 0.5, 2.0, -0.25])
        );
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1e300] {
            let err = check_rewards(vec![1.0, bad], 2).unwrap_err();
            assert!(err.contains("of item 1 is not a finite number"), "{err}");
        }
        assert_eq!(
            check_rewards(vec![1.0], 2).unwrap_err(),
            "score: 1 rewards for 2 items"
        );
    }

    #[test]
    fn rc3_health_must_succeed_without_ok_false() {
        assert_eq!(check_health(Ok(json!({"ok": true}))), Ok(()));
        assert_eq!(check_health(Ok(json!({}))), Ok(()));
        assert_eq!(
            check_health(Ok(json!({"ok": false, "error": "refused"}))).unwrap_err(),
            "GET /health says it cannot score: \"refused\""
        );
        assert_eq!(
            check_health(Err("health: HTTP 503: {}".into())).unwrap_err(),
            "GET /health failed: health: HTTP 503: {}"
        );
    }
}
