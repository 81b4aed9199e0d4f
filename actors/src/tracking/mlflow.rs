//! `[tracking] mlflow_url = "http://…"`: one MLflow run per keel run and branch, through the
//! tracking server's REST API (`/api/2.0/mlflow/...`).
//!
//! The run is found by its tag `keel.run_key` = `<run root>#<branch>` (created with the
//! flattened config as params and `keel.preset`, `keel.env`, `keel.branch` tags when missing).
//! Step metrics (`train/<field>`, `rollout/*`) and `eval/success` are logged with their step
//! and a timestamp through `runs/log-batch`, at most [`BATCH_METRICS`] a request; checkpoint
//! ids and their lineage become tags (`keel.checkpoint.<step>`, `keel.checkpoint.<step>.parent`,
//! `keel.last_checkpoint`), a rewind tags the old run
//! and moves to the new branch's run (tag `keel.rewound_from`).
//!
//! Invariants:
//! - ML-1 (no duplicate steps): when the run already exists, the highest step of its
//!   `rollout/success` history is read first and no point at or before it is logged again.
//! - ML-2 (bounded, retried): a request is tried [`ATTEMPTS`] times with doubling backoff; a
//!   batch that still fails is dropped and its events counted (TR-1). A server that cannot be
//!   reached is left alone for a few seconds; at most [`MAX_PENDING`] metrics wait for it,
//!   older ones are dropped first. At the end the run is marked `FINISHED`, and no
//!   request starts later than [`FINISH_WITHIN`] after the job ended: a server that is down
//!   delays the end of a job by at most that and one request's timeout.
//! - ML-3 (no duplicates from retries): before a batch of metrics is sent again, the run is
//!   asked whether the batch's first point is already there (an attempt whose answer was lost,
//!   e.g. to a timeout, may have landed); if so it is not sent again.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::events::TrainEvent;

use super::Tracker;

/// Metrics per `runs/log-batch` request (MLflow's limit is 1000).
pub const BATCH_METRICS: usize = 500;
/// Attempts per request (ML-2).
pub const ATTEMPTS: u32 = 4;
/// Metrics kept while the server cannot be reached (ML-2).
pub const MAX_PENDING: usize = 20_000;
/// Longest wait before buffered metrics are sent.
const FLUSH_AFTER: Duration = Duration::from_secs(2);
/// No request for this long after the server could not be reached (ML-2).
const QUIET_AFTER_FAILURE: Duration = Duration::from_secs(5);
/// Longest time [`Tracker::finish`] spends delivering what is left (ML-2).
pub const FINISH_WITHIN: Duration = Duration::from_secs(15);
/// Longest time one HTTP request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Why an MLflow request did not go through.
#[derive(Debug, thiserror::Error)]
pub enum MlflowError {
    /// The server answered with a client error (not retried).
    #[error("{path}: HTTP {status}: {body}")]
    Refused {
        /// The REST path.
        path: String,
        /// The HTTP status.
        status: u16,
        /// The start of the answer.
        body: String,
    },
    /// No attempt got an answer the server meant (connection errors, 5xx, 429).
    #[error("{path}: failed after {attempts} attempts (last error: {last})")]
    Unreachable {
        /// The REST path.
        path: String,
        /// Attempts made.
        attempts: u32,
        /// The last attempt's error.
        last: String,
    },
    /// The job is ending and the finish deadline has passed (ML-2).
    #[error("{path}: not sent, the job is ending")]
    Ending {
        /// The REST path.
        path: String,
    },
    /// The answer is not what the REST API documents.
    #[error("{path}: unexpected answer: {what}")]
    BadAnswer {
        /// The REST path.
        path: String,
        /// What is wrong with it.
        what: String,
    },
}

/// What identifies and describes the keel run.
#[derive(Clone, Debug)]
pub struct RunIdentity {
    /// Where the run lives (its run root URL).
    pub root: String,
    /// `run.name`.
    pub name: String,
    /// `learner.algo`.
    pub preset: String,
    /// `env.name`.
    pub env: String,
    /// The effective config flattened to `section.key` = value.
    pub params: Vec<(String, String)>,
}

/// One metric point.
#[derive(Clone, Debug)]
struct Point {
    key: String,
    value: f64,
    step: u64,
    timestamp_ms: u64,
    /// Events this point stands for when it is dropped (1 for the first point of an event).
    events: u64,
}

/// Logs to an MLflow tracking server.
pub struct MlflowTracker {
    url: String,
    experiment: String,
    id: RunIdentity,
    agent: ureq::Agent,
    branch: String,
    run_id: Option<String>,
    logged_through: Option<u64>,
    pending: Vec<Point>,
    tags: Vec<(String, String)>,
    last_send: Instant,
    /// No request before this instant after a server failure (ML-2).
    quiet_until: Instant,
    steps_since_send: u64,
    flush_every: u64,
    dropped: u64,
    /// No request or retry starts after this instant (set by `finish`, ML-2).
    deadline: Option<Instant>,
}

use crate::process::unix_ms as now_ms;

/// MLflow's limits on a param value and on keys.
fn clip(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

impl MlflowTracker {
    /// A tracker for `id` on `branch`; nothing is sent until the first event.
    /// Sends every `flush_every` steps (or after 2 s, or at a checkpoint).
    pub fn new(
        url: &str,
        experiment: &str,
        id: RunIdentity,
        branch: &str,
        flush_every: u64,
    ) -> Self {
        Self::with_timeout(url, experiment, id, branch, flush_every, REQUEST_TIMEOUT)
    }

    fn with_timeout(
        url: &str,
        experiment: &str,
        id: RunIdentity,
        branch: &str,
        flush_every: u64,
        timeout: Duration,
    ) -> Self {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(false)
            .build()
            .into();
        MlflowTracker {
            url: url.trim_end_matches('/').to_string(),
            experiment: if experiment.is_empty() {
                "keel".into()
            } else {
                experiment.into()
            },
            id,
            agent,
            branch: branch.into(),
            run_id: None,
            logged_through: None,
            pending: Vec::new(),
            tags: Vec::new(),
            last_send: Instant::now(),
            quiet_until: Instant::now(),
            steps_since_send: 0,
            flush_every: flush_every.max(1),
            dropped: 0,
            deadline: None,
        }
    }

    /// One REST call with retries (ML-2); `None` body = GET with `query`.
    fn call(
        &self,
        path: &str,
        body: Option<&Value>,
        query: &[(&str, &str)],
    ) -> Result<Value, MlflowError> {
        self.call_unless(path, body, query, &|| false)
    }

    /// [`Self::call`], asking `landed` before every retry whether the previous attempt took
    /// effect although its answer was lost (a timeout under load); then it is not sent again
    /// (ML-3).
    fn call_unless(
        &self,
        path: &str,
        body: Option<&Value>,
        query: &[(&str, &str)],
        landed: &dyn Fn() -> bool,
    ) -> Result<Value, MlflowError> {
        let url = format!("{}/api/2.0/mlflow/{path}", self.url);
        let mut backoff = Duration::from_millis(200);
        let mut last = String::new();
        for attempt in 0..ATTEMPTS {
            if self.deadline.is_some_and(|d| {
                Instant::now() + if attempt > 0 { backoff } else { Duration::ZERO } >= d
            }) {
                return Err(MlflowError::Ending { path: path.into() });
            }
            if attempt > 0 {
                std::thread::sleep(backoff);
                backoff *= 2;
                if landed() {
                    return Ok(Value::Null);
                }
            }
            let sent = match body {
                Some(b) => self.agent.post(&url).send_json(b),
                None => {
                    let mut req = self.agent.get(&url);
                    for (k, v) in query {
                        req = req.query(*k, *v);
                    }
                    req.call()
                }
            };
            let mut resp = match sent {
                Ok(r) => r,
                Err(e) => {
                    last = e.to_string();
                    continue;
                }
            };
            let status = resp.status().as_u16();
            let text = resp.body_mut().read_to_string().unwrap_or_default();
            if status >= 500 || status == 429 {
                last = format!("HTTP {status}: {}", clip(&text, 300));
                continue;
            }
            if status >= 400 {
                return Err(MlflowError::Refused {
                    path: path.into(),
                    status,
                    body: clip(&text, 300),
                });
            }
            return serde_json::from_str(&text).map_err(|e| MlflowError::BadAnswer {
                path: path.into(),
                what: format!("not JSON ({e})"),
            });
        }
        Err(MlflowError::Unreachable {
            path: path.into(),
            attempts: ATTEMPTS,
            last,
        })
    }

    /// The experiment's id; a missing experiment (HTTP 404) is created.
    fn experiment_id(&self) -> Result<String, MlflowError> {
        let found = self.call(
            "experiments/get-by-name",
            None,
            &[("experiment_name", &self.experiment)],
        );
        match found {
            Ok(v) => {
                if let Some(id) = v["experiment"]["experiment_id"].as_str() {
                    return Ok(id.to_string());
                }
            }
            Err(MlflowError::Refused { status: 404, .. }) => {}
            Err(e) => return Err(e),
        }
        let v = self.call(
            "experiments/create",
            Some(&json!({"name": self.experiment})),
            &[],
        )?;
        v["experiment_id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| MlflowError::BadAnswer {
                path: "experiments/create".into(),
                what: "no experiment_id".into(),
            })
    }

    fn run_key(&self) -> String {
        format!("{}#{}", self.id.root, self.branch)
    }

    /// Finds or creates the branch's run; for an existing one, reads how far it got (ML-1).
    fn connect(&mut self) -> Result<String, MlflowError> {
        if let Some(id) = &self.run_id {
            return Ok(id.clone());
        }
        let exp = self.experiment_id()?;
        let key = self.run_key().replace('\'', "");
        let search = json!({
            "experiment_ids": [exp],
            "filter": format!("tags.`keel.run_key` = '{key}'"),
            "max_results": 1,
        });
        let found = self.call("runs/search", Some(&search), &[])?;
        if let Some(id) = found["runs"][0]["info"]["run_id"].as_str() {
            let history = self.call(
                "metrics/get-history",
                None,
                &[("run_id", id), ("metric_key", "rollout/success")],
            )?;
            self.logged_through = history["metrics"]
                .as_array()
                .and_then(|m| m.iter().filter_map(|p| p["step"].as_u64()).max());
            let through = self.logged_through;
            self.pending.retain(|p| through.is_none_or(|w| p.step > w));
            self.run_id = Some(id.to_string());
            return Ok(id.to_string());
        }
        let tags = [
            ("keel.run_key", key.as_str()),
            ("keel.branch", self.branch.as_str()),
            ("keel.preset", self.id.preset.as_str()),
            ("keel.env", self.id.env.as_str()),
            ("keel.run_root", self.id.root.as_str()),
        ];
        let created = self.call(
            "runs/create",
            Some(&json!({
                "experiment_id": exp,
                "run_name": format!("{}/{}", self.id.name, self.branch),
                "start_time": now_ms(),
                "tags": tags.iter().map(|(k, v)| json!({"key": k, "value": v})).collect::<Vec<_>>(),
            })),
            &[],
        )?;
        let id = created["run"]["info"]["run_id"]
            .as_str()
            .ok_or_else(|| MlflowError::BadAnswer {
                path: "runs/create".into(),
                what: "no run_id".into(),
            })?
            .to_string();
        for chunk in self.id.params.chunks(100) {
            let params: Vec<Value> = chunk
                .iter()
                .map(|(k, v)| json!({"key": clip(k, 250), "value": clip(v, 6000)}))
                .collect();
            self.call(
                "runs/log-batch",
                Some(&json!({"run_id": id, "params": params})),
                &[],
            )?;
        }
        self.run_id = Some(id.clone());
        Ok(id)
    }

    /// Sends pending metrics and tags; on failure keeps them (bounded, ML-2).
    fn send(&mut self) {
        self.last_send = Instant::now();
        self.steps_since_send = 0;
        if self.pending.is_empty() && self.tags.is_empty() {
            return;
        }
        if Instant::now() < self.quiet_until {
            self.bound_pending();
            return;
        }
        let run_id = match self.connect() {
            Ok(id) => id,
            Err(e) => {
                tracing::warn!(error = %e, "mlflow: cannot reach the run; keeping points for later");
                self.quiet_until = Instant::now() + QUIET_AFTER_FAILURE;
                self.bound_pending();
                return;
            }
        };
        // One value per key, the newest (MLflow refuses a batch that repeats a key).
        let mut newest: Vec<(String, String)> = Vec::new();
        for (k, v) in std::mem::take(&mut self.tags) {
            newest.retain(|(n, _)| n != &k);
            newest.push((k, v));
        }
        let tags: Vec<Value> = newest
            .into_iter()
            .map(|(k, v)| json!({"key": k, "value": v}))
            .collect();
        if !tags.is_empty() {
            if let Err(e) = self.call(
                "runs/log-batch",
                Some(&json!({"run_id": run_id, "tags": tags})),
                &[],
            ) {
                tracing::warn!(error = %e, "mlflow: tags dropped");
                self.dropped += tags.len() as u64;
            }
        }
        let points = std::mem::take(&mut self.pending);
        for chunk in points.chunks(BATCH_METRICS) {
            let metrics: Vec<Value> = chunk
                .iter()
                .map(|p| json!({"key": p.key, "value": p.value, "timestamp": p.timestamp_ms, "step": p.step}))
                .collect();
            let body = json!({"run_id": run_id, "metrics": metrics});
            // A batch is one transaction on the server: its first point tells whether it landed.
            let landed = || self.has_point(&run_id, &chunk[0]);
            if let Err(e) = self.call_unless("runs/log-batch", Some(&body), &[], &landed) {
                tracing::warn!(error = %e, "mlflow: a batch of metrics was dropped");
                self.dropped += chunk.iter().map(|p| p.events).sum::<u64>();
            }
        }
    }

    /// Whether run `run_id` already holds `p` (same key, step and timestamp), asked once.
    fn has_point(&self, run_id: &str, p: &Point) -> bool {
        let url = format!("{}/api/2.0/mlflow/metrics/get-history", self.url);
        let answer = self
            .agent
            .get(&url)
            .query("run_id", run_id)
            .query("metric_key", &p.key)
            .call()
            .ok()
            .filter(|r| r.status().is_success())
            .and_then(|mut r| r.body_mut().read_json::<Value>().ok());
        answer.is_some_and(|h| {
            h["metrics"].as_array().is_some_and(|ms| {
                // int64 fields may come as JSON strings (protobuf's JSON mapping).
                let int = |v: &Value| v.as_u64().or_else(|| v.as_str()?.parse().ok());
                ms.iter().any(|m| {
                    int(&m["step"]) == Some(p.step) && int(&m["timestamp"]) == Some(p.timestamp_ms)
                })
            })
        })
    }

    /// Drops the oldest points beyond [`MAX_PENDING`] (ML-2).
    fn bound_pending(&mut self) {
        if self.pending.len() > MAX_PENDING {
            let extra = self.pending.len() - MAX_PENDING;
            self.dropped += self.pending.drain(..extra).map(|p| p.events).sum::<u64>();
        }
    }

    fn point(&mut self, step: u64, values: Vec<(String, f64)>) {
        if self.logged_through.is_some_and(|w| step <= w) {
            return;
        }
        let ts = now_ms();
        for (k, (key, value)) in values.into_iter().enumerate() {
            if value.is_finite() {
                self.pending.push(Point {
                    key,
                    value,
                    step,
                    timestamp_ms: ts,
                    events: u64::from(k == 0),
                });
            }
        }
    }
}

impl Tracker for MlflowTracker {
    fn name(&self) -> &'static str {
        "mlflow"
    }

    fn handle(&mut self, ev: &TrainEvent) {
        if let Some((step, values)) = super::step_values(ev) {
            self.point(step, values);
            self.steps_since_send += 1;
        }
        if let Some((version, values)) = super::eval_values(ev) {
            self.point(version, values);
        }
        match ev {
            TrainEvent::Checkpoint { id, step, parent } => {
                self.tags
                    .push((format!("keel.checkpoint.{step:010}"), id.clone()));
                // Lineage: the checkpoint this one continues, as its manifest records it.
                if let Some(parent) = parent {
                    self.tags
                        .push((format!("keel.checkpoint.{step:010}.parent"), parent.clone()));
                }
                self.tags.push(("keel.last_checkpoint".into(), id.clone()));
                self.send();
            }
            TrainEvent::Rewind {
                from_step,
                to_checkpoint,
                branch,
                ..
            } => {
                self.tags
                    .push(("keel.rewound_to_branch".into(), branch.clone()));
                self.send();
                let old = std::mem::replace(&mut self.branch, branch.clone());
                self.run_id = None;
                self.logged_through = None;
                self.tags.push((
                    "keel.rewound_from".into(),
                    format!("{old}@{from_step} -> {to_checkpoint}"),
                ));
            }
            _ => {}
        }
        if self.pending.len() >= BATCH_METRICS
            || self.steps_since_send >= self.flush_every
            || self.last_send.elapsed() >= FLUSH_AFTER
        {
            self.send();
        }
    }

    fn take_dropped(&mut self) -> u64 {
        std::mem::take(&mut self.dropped)
    }

    fn finish(&mut self) -> u64 {
        self.quiet_until = Instant::now();
        self.deadline = Some(Instant::now() + FINISH_WITHIN);
        self.send();
        self.dropped += self.pending.drain(..).map(|p| p.events).sum::<u64>();
        if let Some(id) = &self.run_id {
            let body = json!({"run_id": id, "status": "FINISHED", "end_time": now_ms()});
            if let Err(e) = self.call("runs/update", Some(&body), &[]) {
                tracing::warn!(error = %e, "mlflow: could not mark the run finished");
            }
        }
        std::mem::take(&mut self.dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::sync::{Arc, Mutex};

    /// An HTTP server on loopback (a thread per connection) that stores the first
    /// `runs/log-batch` but answers it only after `delay` (a lost answer), answers
    /// `metrics/get-history` from what it stored, and counts the log-batch requests it got.
    /// What the server saw: log-batch requests and the metrics they carried.
    type Seen = Arc<Mutex<(usize, Vec<Value>)>>;

    fn slow_first_batch(delay: Duration) -> (String, Seen) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let state = Arc::new(Mutex::new((0usize, Vec::new())));
        let seen = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().take(8).flatten() {
                let seen = seen.clone();
                // One thread per connection: the history is answered while a batch sleeps.
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                    let mut line = String::new();
                    let _ = reader.read_line(&mut line);
                    let mut length = 0;
                    loop {
                        let mut h = String::new();
                        if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                            break;
                        }
                        if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap_or(0);
                        }
                    }
                    let mut body = vec![0; length];
                    let _ = reader.read_exact(&mut body);
                    let answer = if line.contains("runs/log-batch") {
                        let first = {
                            let mut s = seen.lock().expect("lock");
                            s.0 += 1;
                            if let Ok(v) = serde_json::from_slice::<Value>(&body) {
                                s.1.extend(v["metrics"].as_array().cloned().unwrap_or_default());
                            }
                            s.0 == 1
                        };
                        if first {
                            std::thread::sleep(delay);
                        }
                        "{}".to_string()
                    } else {
                        json!({"metrics": seen.lock().expect("lock").1.clone()}).to_string()
                    };
                    let mut out = stream;
                    let _ = write!(
                    out,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                    answer.len()
                );
                });
            }
        });
        (url, state)
    }

    #[test]
    fn ml3_a_batch_whose_answer_was_lost_is_not_sent_again() {
        let (url, state) = slow_first_batch(Duration::from_millis(600));
        let id = RunIdentity {
            root: "r".into(),
            name: "n".into(),
            preset: "grpo".into(),
            env: "calc".into(),
            params: vec![],
        };
        let mut t =
            MlflowTracker::with_timeout(&url, "", id, "main", 1, Duration::from_millis(200));
        t.run_id = Some("run".into());
        t.point(
            3,
            vec![("rollout/success".into(), 0.5), ("train/loss".into(), 1.0)],
        );
        t.send();
        let (batches, stored) = {
            let s = state.lock().expect("lock");
            (s.0, s.1.len())
        };
        assert_eq!(batches, 1, "the batch that landed was sent again");
        assert_eq!(stored, 2);
        assert_eq!(t.take_dropped(), 0);
    }
}
