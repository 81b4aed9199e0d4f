//! The HTTP side of the agent gateway: an OpenAI-compatible server whose every call belongs to
//! one live episode, named by the secret key the agent sends as its API key.
//!
//! Invariants:
//! - GTW-1 The server binds `env.agent.bind` (loopback unless configured) and answers
//!   `GET /v1/models`, `POST /v1/chat/completions`, `POST /v1/completions` (OAI-6),
//!   `POST /v1/keel/reward` and the pull routes
//!   of GTW-5; anything else is 404 with the list of routes.
//! - GTW-2 Every episode key is 128 random bits from the OS; a call whose `Authorization: Bearer`
//!   key names no live episode is 404 (401 without one), so an agent can never write into
//!   another episode, and a finished episode's key is dead.
//! - GTW-3 A body over `env.agent.max_request_bytes` is 413, read no further; malformed JSON or
//!   a request keel cannot serve as asked (another temperature than the run's, `n` > 1, more
//!   than four or empty stop sequences, `max_tokens = 0`, `top_logprobs`, a non-text content
//!   part) is 400 naming the field, and the episode goes on. `max_tokens` and `stop` are
//!   honoured (AGT-7).
//! - GTW-4 A valid call is handed to its episode and the HTTP thread waits for the answer; an
//!   episode that ends first answers 410, so no agent waits forever.
//! - GTW-5 With `env.agent.launch = "pull"`, agents elsewhere take episodes:
//!   `POST /v1/keel/episodes/next` with the pool key as bearer token answers the oldest episode
//!   not yet taken (`{"key", "task"}`; each is handed out once) or 204 after `wait_s`; the agent
//!   then calls with that key as any agent does and ends with `POST /v1/keel/episodes/end`
//!   (`{"reward"}` or `{"error"}`). Without a pool key (`launch = "spawn"`) pulls are 404.
//! - GTW-6 The gateway binds before it serves: a run's journal takes up its earlier process's
//!   episodes (AJ-3) between the two, so an agent that retries across a restart never meets a
//!   gateway that does not know its key yet; its connection waits in the queue instead.

use std::collections::HashMap;
use std::io::Read;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};

use rand::RngCore;
use serde_json::{json, Value};

use super::journal::key_digest;
use super::openai::{error_body, Answer, ChatRequest, TextRequest};
use super::Sampling;
use crate::error::EnvError;

/// What a call is answered with: the assistant's answer or an HTTP error.
pub type Reply = Result<Served, HttpError>;

/// An answer and the episode call it answers (0-based; names its tool-call ids, OAI-3).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Served {
    /// The episode's call number.
    pub call: usize,
    /// The answer.
    pub answer: Answer,
}

/// An HTTP error: status and message.
#[derive(Clone, Debug, PartialEq)]
pub struct HttpError {
    /// The status code.
    pub status: u16,
    /// What went wrong, for the agent.
    pub message: String,
}

impl HttpError {
    /// An error answer.
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        HttpError {
            status,
            message: message.into(),
        }
    }
}

/// What an agent sends its episode.
pub enum Event {
    /// A chat-completions call, answered through `reply`.
    Call {
        /// The request (boxed: it dwarfs a reward).
        request: Box<ChatRequest>,
        /// Where its answer goes.
        reply: SyncSender<Reply>,
    },
    /// The episode's reward, reported by the agent.
    Reward(f32),
    /// The agent closed its stderr: it is exiting (APR-3).
    Closed,
    /// A pulled agent reported its episode's end (GTW-5): `None`, or what went wrong.
    Ended(Option<String>),
}

/// The limits calls are checked against before they reach an episode (GTW-3).
#[derive(Clone, Debug)]
pub struct CallLimits {
    /// Largest request body.
    pub max_request_bytes: usize,
    /// The run's sampling: temperature, turn length, and the name `/v1/models` lists.
    pub sampling: Sampling,
    /// The secret agents must send to pull episodes (GTW-5); `None` serves no pulls.
    pub pool_key: Option<String>,
}

/// An episode waiting for a pulled agent (GTW-5).
struct Offer {
    key: String,
    task: Value,
}

/// Episodes offered to pulling agents, oldest first.
#[derive(Default)]
struct Offers {
    queue: Mutex<std::collections::VecDeque<Offer>>,
    ready: std::sync::Condvar,
}

/// Longest a pull waits for an episode, seconds (GTW-5).
const MAX_PULL_WAIT_S: f64 = 60.0;

type Episodes = Mutex<HashMap<String, SyncSender<Event>>>;

/// The server; dropping it stops the accept loop.
pub struct Gateway {
    server: Arc<tiny_http::Server>,
    episodes: Arc<Episodes>,
    offers: Arc<Offers>,
    limits: Arc<CallLimits>,
    /// Set once the accept loop runs (GTW-6).
    serving: std::sync::Once,
    base_url: String,
}

/// One live episode's side of the gateway; dropping it retires its key (GTW-2).
pub struct Mailbox {
    /// The episode's secret key; empty for an episode taken up from the journal, whose agent
    /// already has it (AJ-3).
    pub key: String,
    /// The key's SHA-256: what the gateway knows the episode by (AJ-2).
    pub digest: String,
    /// Its calls and rewards.
    pub events: Receiver<Event>,
    /// A sender into `events`, for the agent process's watcher (APR-3).
    pub notify: SyncSender<Event>,
    episodes: Arc<Episodes>,
}

impl Drop for Mailbox {
    fn drop(&mut self) {
        lock(&self.episodes).remove(&self.digest);
    }
}

fn lock(m: &Episodes) -> std::sync::MutexGuard<'_, HashMap<String, SyncSender<Event>>> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Gateway {
    /// Binds `bind` and starts serving (GTW-1): [`Gateway::bind`] then [`Gateway::serve`], for
    /// tests that have no journal to take up first.
    #[cfg(test)]
    pub fn start(bind: &str, limits: CallLimits) -> Result<Gateway, EnvError> {
        let gateway = Gateway::bind(bind, limits)?;
        gateway.serve()?;
        Ok(gateway)
    }

    /// Binds `bind` without answering anything yet (GTW-6): connections wait in the server's
    /// queue until [`Gateway::serve`], so keys taken up from the journal are live before any
    /// call is looked up.
    pub fn bind(bind: &str, limits: CallLimits) -> Result<Gateway, EnvError> {
        let server = tiny_http::Server::http(bind).map_err(|e| EnvError::Agent {
            reason: format!("cannot bind the gateway to {bind} (env.agent.bind): {e}"),
        })?;
        let port = server
            .server_addr()
            .to_ip()
            .map(|a| a.port())
            .unwrap_or_default();
        let host = bind.rsplit_once(':').map(|(h, _)| h).unwrap_or("127.0.0.1");
        let host = if host == "0.0.0.0" { "127.0.0.1" } else { host };
        Ok(Gateway {
            server: Arc::new(server),
            episodes: Arc::default(),
            offers: Arc::default(),
            limits: Arc::new(limits),
            serving: std::sync::Once::new(),
            base_url: format!("http://{host}:{port}/v1"),
        })
    }

    /// Starts answering calls (GTW-6); a second call does nothing.
    pub fn serve(&self) -> Result<(), EnvError> {
        let mut started = Ok(());
        self.serving.call_once(|| {
            let (s, e, o, l) = (
                self.server.clone(),
                self.episodes.clone(),
                self.offers.clone(),
                self.limits.clone(),
            );
            started = std::thread::Builder::new()
                .name("keel-gateway".into())
                .spawn(move || accept(&s, &e, &o, &l))
                .map(drop)
                .map_err(|e| EnvError::Agent {
                    reason: format!("cannot start the gateway thread: {e}"),
                });
        });
        started
    }

    /// The base URL agents are given (`OPENAI_BASE_URL`).
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// A new episode with a fresh secret key (GTW-2).
    pub fn open(&self) -> Mailbox {
        let mut bytes = [0u8; 16];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        let key: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let key = format!("keel-{key}");
        let mut mailbox = self.reopen(&key_digest(&key));
        mailbox.key = key;
        mailbox
    }

    /// The episode whose key has SHA-256 `digest`, live again (AJ-3).
    pub fn reopen(&self, digest: &str) -> Mailbox {
        let (tx, rx) = mpsc::sync_channel(16);
        lock(&self.episodes).insert(digest.to_string(), tx.clone());
        Mailbox {
            key: String::new(),
            digest: digest.to_string(),
            events: rx,
            notify: tx,
            episodes: self.episodes.clone(),
        }
    }
}

impl Gateway {
    /// Offers the episode of `mailbox` with `task` to the next agent that pulls (GTW-5).
    pub fn offer(&self, mailbox: &Mailbox, task: &str) {
        let task = serde_json::from_str(task).unwrap_or(Value::String(task.into()));
        let mut queue = self.offers.queue.lock().unwrap_or_else(|e| e.into_inner());
        queue.push_back(Offer {
            key: mailbox.key.clone(),
            task,
        });
        self.offers.ready.notify_one();
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.server.unblock();
    }
}

fn accept(
    server: &tiny_http::Server,
    episodes: &Arc<Episodes>,
    offers: &Arc<Offers>,
    limits: &Arc<CallLimits>,
) {
    for request in server.incoming_requests() {
        let (episodes, offers, limits) = (episodes.clone(), offers.clone(), limits.clone());
        // One thread per call: a call waits on its episode's sampling (GTW-4).
        let _ = std::thread::Builder::new()
            .name("keel-gateway-call".into())
            .spawn(move || serve(request, &episodes, &offers, &limits));
    }
}

fn serve(
    mut request: tiny_http::Request,
    episodes: &Episodes,
    offers: &Offers,
    limits: &CallLimits,
) {
    let path = request.url().split('?').next().unwrap_or("").to_string();
    let answer = match (request.method(), path.as_str()) {
        (tiny_http::Method::Get, "/v1/models") => Ok(Body::Json(json!({
            "object": "list",
            "data": [{"id": limits.sampling.model, "object": "model", "created": 0, "owned_by": "keel"}],
        }))),
        (tiny_http::Method::Post, "/v1/chat/completions") => {
            chat(&mut request, episodes, limits)
        }
        (tiny_http::Method::Post, "/v1/completions") => text(&mut request, episodes, limits),
        (tiny_http::Method::Post, "/v1/keel/reward") => reward(&mut request, episodes, limits),
        (tiny_http::Method::Post, "/v1/keel/episodes/next") => {
            pull(&mut request, episodes, offers, limits)
        }
        (tiny_http::Method::Post, "/v1/keel/episodes/end") => end(&mut request, episodes, limits),
        _ => Err(HttpError::new(
            404,
            format!("no route {path}; the gateway serves GET /v1/models, POST /v1/chat/completions, POST /v1/completions, POST /v1/keel/reward, POST /v1/keel/episodes/next and POST /v1/keel/episodes/end"),
        )),
    };
    respond(request, answer);
}

enum Body {
    Json(Value),
    Events(String),
    NoContent,
}

fn respond(request: tiny_http::Request, answer: Result<Body, HttpError>) {
    let (status, body, kind) = match answer {
        Ok(Body::Json(v)) => (200, v.to_string(), "application/json"),
        Ok(Body::Events(s)) => (200, s, "text/event-stream"),
        Ok(Body::NoContent) => (204, String::new(), "application/json"),
        Err(e) => (
            e.status,
            error_body(&e.message, "invalid_request_error").to_string(),
            "application/json",
        ),
    };
    let header = tiny_http::Header::from_bytes(&b"Content-Type"[..], kind.as_bytes())
        .expect("a static header is valid");
    let response = tiny_http::Response::from_string(body)
        .with_status_code(status)
        .with_header(header);
    // The agent may have gone; nothing to do about a failed write.
    let _ = request.respond(response);
}

/// The value of header `name`, if sent.
fn header(request: &tiny_http::Request, name: &'static str) -> Option<String> {
    request
        .headers()
        .iter()
        .find(|h| h.field.equiv(name))
        .map(|h| h.value.as_str().to_string())
}

/// The `Authorization` header's token (`Bearer ` stripped).
fn bearer(request: &tiny_http::Request) -> Option<String> {
    let auth = header(request, "Authorization")?;
    Some(
        auth.strip_prefix("Bearer ")
            .unwrap_or(&auth)
            .trim()
            .to_string(),
    )
}

/// The episode the call's key names (GTW-2).
fn episode_of(
    request: &tiny_http::Request,
    episodes: &Episodes,
) -> Result<SyncSender<Event>, HttpError> {
    let key = bearer(request).ok_or_else(|| {
        HttpError::new(
            401,
            "no Authorization header: send the episode's key as the API key (OPENAI_API_KEY)",
        )
    })?;
    lock(episodes)
        .get(&key_digest(&key))
        .cloned()
        .ok_or_else(|| {
            HttpError::new(
                404,
                "no live episode has this key: the episode is unknown or already finished",
            )
        })
}

/// The episode a call names (GTW-2), then its body (GTW-3): a bad key is refused before the
/// body is read.
fn episode_and_body(
    request: &mut tiny_http::Request,
    episodes: &Episodes,
    limits: &CallLimits,
) -> Result<(SyncSender<Event>, Value), HttpError> {
    let episode = episode_of(request, episodes)?;
    Ok((episode, body(request, limits)?))
}

/// The body, refused past the limit without reading further (GTW-3).
fn body(request: &mut tiny_http::Request, limits: &CallLimits) -> Result<Value, HttpError> {
    let max = limits.max_request_bytes;
    let too_big = || {
        HttpError::new(
            413,
            format!("request body over {max} bytes (env.agent.max_request_bytes)"),
        )
    };
    if request.body_length().is_some_and(|n| n > max) {
        return Err(too_big());
    }
    let mut bytes = Vec::new();
    request
        .as_reader()
        .take(max as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| HttpError::new(400, format!("cannot read the request body: {e}")))?;
    if bytes.len() > max {
        return Err(too_big());
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| HttpError::new(400, format!("the request body is not JSON: {e}")))
}

fn chat(
    request: &mut tiny_http::Request,
    episodes: &Episodes,
    limits: &CallLimits,
) -> Result<Body, HttpError> {
    let (episode, value) = episode_and_body(request, episodes, limits)?;
    let call: ChatRequest = serde_json::from_value(value)
        .map_err(|e| HttpError::new(400, format!("not a chat-completions request: {e}")))?;
    let (stream, model) = (call.stream, call.model.clone());
    let answer = answered(request, &episode, call, limits)?;
    let created = unix_secs();
    let id = format!("chatcmpl-{}", answer.call);
    Ok(match stream {
        true => Body::Events(answer.answer.sse(&id, &model, created, answer.call)),
        false => Body::Json(answer.answer.completion(&id, &model, created, answer.call)),
    })
}

/// `POST /v1/completions` (OAI-6): a text completion, a turn of a text episode (AGT-8).
fn text(
    request: &mut tiny_http::Request,
    episodes: &Episodes,
    limits: &CallLimits,
) -> Result<Body, HttpError> {
    let (episode, value) = episode_and_body(request, episodes, limits)?;
    let call: TextRequest = serde_json::from_value(value)
        .map_err(|e| HttpError::new(400, format!("not a completions request: {e}")))?;
    let call = call.into_call().map_err(|e| HttpError::new(400, e))?;
    let (stream, model) = (call.stream, call.model.clone());
    let answer = answered(request, &episode, call, limits)?;
    let (created, id) = (unix_secs(), format!("cmpl-{}", answer.call));
    Ok(match stream {
        true => Body::Events(answer.answer.text_sse(&id, &model, created)),
        false => Body::Json(answer.answer.text_completion(&id, &model, created)),
    })
}

/// Checks `call` (GTW-3), hands it to its episode and waits for the answer (GTW-4).
fn answered(
    request: &tiny_http::Request,
    episode: &SyncSender<Event>,
    mut call: ChatRequest,
    limits: &CallLimits,
) -> Result<Served, HttpError> {
    call.idempotency_key = header(request, "Idempotency-Key");
    check_call(&call, limits)?;
    let (tx, rx) = mpsc::sync_channel(1);
    episode
        .send(Event::Call {
            request: Box::new(call),
            reply: tx,
        })
        .map_err(|_| ended())?;
    rx.recv().map_err(|_| ended())?
}

/// Seconds since the Unix epoch (the `created` field of answers).
fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

fn ended() -> HttpError {
    HttpError::new(410, "the episode ended before this call was answered")
}

/// The sampling parameters a call may ask for (GTW-3).
fn check_call(call: &ChatRequest, limits: &CallLimits) -> Result<(), HttpError> {
    let bad = |m: String| Err(HttpError::new(400, m));
    if let Some(t) = call.temperature {
        if (t - limits.sampling.temperature).abs() > 1e-6 {
            return bad(format!("temperature = {t}: keel samples at the run's rollout.temperature = {} (the learner's log-probs assume it); omit temperature or send that value", limits.sampling.temperature));
        }
    }
    if call.top_logprobs.is_some_and(|k| k > 0) {
        return bad("top_logprobs is not served: keel keeps the sampled token's log-prob only (logprobs: true returns it)".into());
    }
    if call.n.is_some_and(|n| n != 1) {
        return bad("n > 1 is not served: one answer per call".into());
    }
    call.stop_sequences().map_err(|e| HttpError::new(400, e))?;
    if call.max_answer_tokens() == Some(0) {
        return bad("max_tokens must be at least 1".into());
    }
    for m in &call.messages {
        m.text().map_err(|e| HttpError::new(400, e))?;
    }
    if call.messages.is_empty() && call.prompt.is_none() {
        return bad("messages is empty".into());
    }
    Ok(())
}

fn reward(
    request: &mut tiny_http::Request,
    episodes: &Episodes,
    limits: &CallLimits,
) -> Result<Body, HttpError> {
    let (episode, value) = episode_and_body(request, episodes, limits)?;
    let reward = value
        .get("reward")
        .and_then(Value::as_f64)
        .filter(|r| r.is_finite())
        .ok_or_else(|| HttpError::new(400, "expected {\"reward\": <finite number>}"))?;
    episode
        .send(Event::Reward(reward as f32))
        .map_err(|_| ended())?;
    Ok(Body::Json(json!({"ok": true})))
}

/// `POST /v1/keel/episodes/next` (GTW-5): the oldest episode no agent has pulled yet, waiting
/// up to `wait_s` (default 20, at most 60) seconds for one; 204 when none came.
fn pull(
    request: &mut tiny_http::Request,
    episodes: &Episodes,
    offers: &Offers,
    limits: &CallLimits,
) -> Result<Body, HttpError> {
    let Some(pool_key) = &limits.pool_key else {
        return Err(HttpError::new(
            404,
            "this gateway starts its agents itself (env.agent.launch = \"spawn\"): no episodes to pull",
        ));
    };
    if bearer(request).as_deref() != Some(pool_key.as_str()) {
        return Err(HttpError::new(
            401,
            "pulling episodes needs the pool key (the variable env.agent.pool_key_env names) as the bearer token",
        ));
    }
    let wait_s = match request.body_length() {
        Some(0) => None,
        _ => body(request, limits)?.get("wait_s").and_then(Value::as_f64),
    }
    .unwrap_or(20.0)
    .clamp(0.0, MAX_PULL_WAIT_S);
    let until = std::time::Instant::now() + std::time::Duration::from_secs_f64(wait_s);
    let mut queue = offers.queue.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        // An offer whose episode ended unpulled (its key retired) is skipped.
        while let Some(offer) = queue.pop_front() {
            if lock(episodes).contains_key(&key_digest(&offer.key)) {
                return Ok(Body::Json(json!({"key": offer.key, "task": offer.task})));
            }
        }
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Ok(Body::NoContent);
        }
        queue = offers
            .ready
            .wait_timeout(queue, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// `POST /v1/keel/episodes/end` (GTW-5): a pulled agent's episode is over, as
/// `{"reward": r}` (optional; as `/v1/keel/reward`) or `{"error": "why"}` (it failed).
fn end(
    request: &mut tiny_http::Request,
    episodes: &Episodes,
    limits: &CallLimits,
) -> Result<Body, HttpError> {
    let (episode, value) = episode_and_body(request, episodes, limits)?;
    if let Some(r) = value.get("reward") {
        let r = r
            .as_f64()
            .filter(|r| r.is_finite())
            .ok_or_else(|| HttpError::new(400, "reward must be a finite number"))?;
        episode.send(Event::Reward(r as f32)).map_err(|_| ended())?;
    }
    let error = value.get("error").map(|e| match e {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    });
    episode.send(Event::Ended(error)).map_err(|_| ended())?;
    Ok(Body::Json(json!({"ok": true})))
}
