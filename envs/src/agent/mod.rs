//! The `agent` env: trains an unchanged agent program written for the OpenAI API. keel starts
//! one agent process per episode with `OPENAI_BASE_URL` pointing at its gateway and an episode
//! key as `OPENAI_API_KEY`; every chat-completions call the agent makes becomes one turn of the
//! episode, sampled by the policy being trained, and the episode ends when the agent exits.
//!
//! The direction is the reverse of the other envs, in the same [`Env`] shape: `reset` starts the
//! agent and waits for its first call, whose messages are the first prompt (its last message is
//! the user's; the ones before are the preamble; its `tools` are rendered by the chat template);
//! `step_response` answers the pending call with the sampled text (tool calls parsed back, OAI-2)
//! and waits for the agent's next call, whose new messages are the observation.
//!
//! Invariants:
//! - AGT-1 (token-exact) A call must extend the episode's conversation: the previous call's
//!   messages, then the answer given (as the client echoes it back), then new messages, none of
//!   them the assistant's. Only the new messages are rendered (CC-2) after the sampled tokens,
//!   which are never re-tokenised; the episode's tokens are the ones sampled.
//! - AGT-2 A call that repeats the previous call's messages exactly, or sends the
//!   `Idempotency-Key` header of a call already answered in this episode, is a retry: it gets
//!   the stored answer again, never a second sample (after a restart too: the answers are
//!   in the journal, AJ-3).
//! - AGT-3 A call whose messages rewrite the history (drop or change messages, add assistant
//!   messages: a summarising, trimming or forking agent) starts a new segment of the episode
//!   (`StepOutcome::segment`): the trajectory so far ends, and the call's whole conversation
//!   (its assistant messages' tool calls included) is rendered as the next segment's prompt.
//!   Segments share the episode's reward and are trained as separate sequences (RB-4). A call
//!   that ends with an assistant message is answered 400 and fails the episode.
//! - AGT-4 The episode ends when the agent exits (a pulled agent, GTW-5: when it reports the
//!   end, or fails it). Its reward is the last one the agent posted to
//!   `/v1/keel/reward` (`env.agent.reward = "agent"`), or the row's verifier (or the dataset's
//!   reward service) applied to the last answer (`"verifier"`). An agent that exits before its
//!   first call, exits non-zero, exits without the reward it owes, or outlives
//!   `env.agent.timeout_s` (it is killed) fails its episode: counted, never trained.
//! - AGT-5 After `env.agent.max_calls` answers, further calls are answered 429 and the episode
//!   ends when the agent exits (EN-3: `max_turns` is `max_calls`).
//! - AGT-6 The task is the dataset row as JSON: `{"split", "index", "data_source", "prompt":
//!   [messages], "ground_truth", "extra_info"}`, in `KEEL_TASK` and on stdin (APR-1). The
//!   agent program decides what the model sees; the ground truth is there for its reward.
//! - AGT-7 A call's `max_tokens` (or `max_completion_tokens`) bounds its turn below
//!   `rollout.max_turn_tokens` (`finish_reason` "length" when reached); its `stop` sequences
//!   end the turn at the first one sampled. The tokens sampled up to and including the stop
//!   text are trained; the answer leaves the stop text and anything after it out, as the
//!   OpenAI API does, and the next call's conversation extends that answer.
//! - AGT-8 An episode whose first call is a text completion (`/v1/completions`, OAI-6) is a
//!   text episode: its prompt is the model's text as is (the agent applied its own template),
//!   every later call must be a text completion too (a chat call fails the episode with 400),
//!   and a call whose prompt starts with the last prompt and its answer continues the episode
//!   with the rest of the prompt encoded as is; any other prompt starts a new segment (AGT-3).
//!   The same prompt again is a retry (AGT-2).

pub mod gateway;
pub mod journal;
pub mod launch;
pub mod openai;

#[cfg(test)]
mod gateway_tests;

use std::collections::HashMap;
use std::sync::mpsc::{RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::dataset::{Dataset, DatasetEnv, PromptMessage, RewardClient};
use crate::env::{
    outcome_of, Env, Resumed, ResumedNext, SampledTurn, Segment, StepOutcome, TurnLimits,
};
use crate::error::EnvError;
use crate::snapshot::EnvSnapshot;
use gateway::{CallLimits, Event, Gateway, HttpError, Mailbox, Reply, Served};
use journal::{Adoptable, EpisodeRecord, Journal, RecordStore, SaidRecord as Said};
use launch::{Agent, AgentProcess};
use openai::{Answer, InMessage, TokenLogprob};

/// `[env.agent]`: the agent program and the gateway's limits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    /// How episodes get their agent: `spawn` (keel starts `command` per episode) or `pull`
    /// (agents elsewhere take episodes from the gateway, GTW-5).
    pub launch: String,
    /// The agent program and its arguments, started once per episode (`launch = "spawn"`).
    pub command: Vec<String>,
    /// The environment variable holding the secret pulling agents send (`launch = "pull"`;
    /// at least 16 characters; kept out of config files).
    pub pool_key_env: String,
    /// Where the gateway listens (`host:port`; port 0 picks a free one).
    pub bind: String,
    /// Most answered calls per episode (AGT-5).
    pub max_calls: usize,
    /// Longest an episode's agent may run, seconds (AGT-4).
    pub timeout_s: f64,
    /// Largest request body, bytes (GTW-3).
    pub max_request_bytes: usize,
    /// Where the reward comes from: `agent` or `verifier` (AGT-4).
    pub reward: String,
    /// The run's sampling temperature and turn length (set by the runtime, not a key).
    #[serde(skip)]
    pub sampling: Sampling,
}

/// What the runtime samples with, which calls are checked against (GTW-3).
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    /// `rollout.temperature`.
    pub temperature: f64,
    /// `rollout.max_turn_tokens`.
    pub max_turn_tokens: usize,
    /// The model name `/v1/models` lists.
    pub model: String,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            temperature: 1.0,
            max_turn_tokens: 0,
            model: "keel-policy".into(),
        }
    }
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            launch: "spawn".into(),
            command: Vec::new(),
            pool_key_env: "KEEL_AGENT_POOL_KEY".into(),
            bind: "127.0.0.1:0".into(),
            max_calls: 16,
            timeout_s: 300.0,
            max_request_bytes: 4 << 20,
            reward: "agent".into(),
            sampling: Sampling::default(),
        }
    }
}

impl AgentConfig {
    /// Checks every key.
    pub fn validate(&self) -> Result<(), EnvError> {
        let bad = |field, value: String, expected| {
            Err(EnvError::InvalidConfig {
                env: "agent",
                field,
                value,
                expected,
            })
        };
        match self.launch.as_str() {
            "spawn" if self.command.first().is_none_or(String::is_empty) => {
                return bad(
                    "command",
                    format!("{:?}", self.command),
                    "the agent program and its arguments, e.g. [\"python3\", \"agent.py\"]",
                )
            }
            "pull" if !self.command.is_empty() => {
                return bad(
                    "command",
                    format!("{:?}", self.command),
                    "no command with launch = \"pull\" (agents elsewhere pull their episodes)",
                )
            }
            "spawn" | "pull" => {}
            other => return bad("launch", other.to_string(), "spawn or pull"),
        }
        if self.bind.parse::<std::net::SocketAddr>().is_err() {
            return bad("bind", self.bind.clone(), "host:port, e.g. 127.0.0.1:0");
        }
        if !(1..=4096).contains(&self.max_calls) {
            return bad(
                "max_calls",
                self.max_calls.to_string(),
                "an integer in 1..=4096",
            );
        }
        if !(self.timeout_s.is_finite() && self.timeout_s > 0.0) {
            return bad(
                "timeout_s",
                self.timeout_s.to_string(),
                "a positive number of seconds",
            );
        }
        if !(1024..=1 << 30).contains(&self.max_request_bytes) {
            return bad(
                "max_request_bytes",
                self.max_request_bytes.to_string(),
                "an integer in 1024..=1073741824",
            );
        }
        if !matches!(self.reward.as_str(), "agent" | "verifier") {
            return bad("reward", self.reward.clone(), "agent or verifier");
        }
        Ok(())
    }

    /// The pool key pulling agents send (GTW-5), read from `pool_key_env` with
    /// `launch = "pull"`.
    fn pool_key(&self) -> Result<Option<String>, EnvError> {
        if self.launch != "pull" {
            return Ok(None);
        }
        match std::env::var(&self.pool_key_env) {
            Ok(key) if key.len() >= 16 => Ok(Some(key)),
            _ => Err(EnvError::InvalidConfig {
                env: "agent",
                field: "pool_key_env",
                value: self.pool_key_env.clone(),
                expected: "the name of an environment variable set to a secret of at least 16 characters, which pulling agents send as their bearer token",
            }),
        }
    }

    /// Binds the gateway every episode of this config shares; it answers nothing until
    /// [`Gateway::serve`] (GTW-6).
    pub fn bind_gateway(&self) -> Result<Gateway, EnvError> {
        Gateway::bind(
            &self.bind,
            CallLimits {
                max_request_bytes: self.max_request_bytes,
                sampling: self.sampling.clone(),
                pool_key: self.pool_key()?,
            },
        )
    }

    /// The journal of `gateway` in `store` (AJ-1..4): an earlier process's records on the same
    /// bind are taken up with `launch = "pull"`, dropped otherwise.
    pub fn open_journal(
        &self,
        store: Arc<dyn RecordStore>,
        gateway: &Gateway,
    ) -> Result<Journal, EnvError> {
        Journal::open(
            store,
            &self.bind,
            gateway,
            self.launch == "pull",
            Duration::from_secs_f64(self.timeout_s),
        )
    }
}

impl Said {
    fn matches(&self, m: &InMessage) -> bool {
        match self {
            Said::Sent(s) => s.role == m.role && s.text() == m.text() && s.calls() == m.calls(),
            Said::Answered(a) => a.matches(m),
        }
    }
}

/// A call waiting for the policy's answer.
struct Pending {
    reply: SyncSender<Reply>,
    /// It asked for log-probs (OAI-5).
    logprobs: bool,
    /// Its `Idempotency-Key` (AGT-2).
    key: Option<String>,
    /// Its `max_tokens` and `stop` (AGT-7).
    limits: TurnLimits,
}

impl Pending {
    fn new(reply: SyncSender<Reply>, request: &openai::ChatRequest) -> Pending {
        Pending {
            reply,
            logprobs: request.logprobs == Some(true),
            key: request.idempotency_key.clone(),
            limits: TurnLimits {
                max_tokens: request.max_answer_tokens().map(|m| m as usize),
                // Checked by the gateway (GTW-3).
                stop: request.stop_sequences().unwrap_or_default(),
            },
        }
    }
}

/// One live episode.
struct Live {
    task_seed: u64,
    mailbox: Mailbox,
    agent: Agent,
    deadline: Instant,
    /// The call waiting for the policy's answer.
    pending: Option<Pending>,
    /// The answers given to calls that sent an `Idempotency-Key` (AGT-2).
    by_key: HashMap<String, Served>,
    tools_offered: bool,
    said: Vec<Said>,
    calls: usize,
    reward: Option<f32>,
    last_text: String,
    preamble: Vec<PromptMessage>,
    tools: Vec<serde_json::Value>,
    /// A text episode's transcript (AGT-8); `None` for a chat episode.
    text: Option<Transcript>,
}

impl Live {
    /// Answers a retry of the last call with its answer (AGT-2); false when none was given.
    fn resend_last(&self, reply: &SyncSender<Reply>) -> bool {
        let Some(Said::Answered(answer)) = self.said.last() else {
            return false;
        };
        let served = Served {
            call: self.calls - 1,
            answer: answer.clone(),
        };
        let _ = reply.send(Ok(served));
        true
    }

    /// Answers 429 once the episode's call budget is spent (AGT-5); false while it is not.
    fn refuse_over_budget(&self, max_calls: usize, reply: &SyncSender<Reply>) -> bool {
        if self.calls < max_calls {
            return false;
        }
        let m = format!("the episode's call budget is spent (env.agent.max_calls = {max_calls})");
        let _ = reply.send(Err(HttpError::new(429, m)));
        true
    }
}

/// A text episode's transcript (AGT-8).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Transcript {
    /// The last call's prompt.
    pub asked: String,
    /// That prompt and the answer given: what the next call's prompt extends.
    pub so_far: String,
}

/// How a call after the first goes on from the conversation so far.
enum WentOn {
    /// It extends it with these messages (AGT-1).
    Extended(Vec<PromptMessage>),
    /// It extends a text episode's transcript with this text (AGT-8).
    Continued(String),
    /// It rewrote it: a new segment (AGT-3).
    Rewritten(Segment),
}

/// What the agent did next.
enum Next {
    Call(Box<openai::ChatRequest>, SyncSender<Reply>),
    /// The agent ended: `Err` says why that is a failure.
    Ended(Result<(), String>),
}

/// The `agent` env (AGT-1..6).
pub struct AgentEnv {
    cfg: Arc<AgentConfig>,
    gateway: Arc<Gateway>,
    /// Where answered calls are recorded before they are answered (AJ-1); `None` records
    /// nothing (demonstrations, tests).
    journal: Option<Arc<Journal>>,
    tasks: DatasetEnv,
    live: Option<Live>,
    /// The runtime's record of the live episode as of its last answered call (AJ-1).
    record: Vec<u8>,
    /// The episode the last reset took up (AJ-3), until the runtime takes it.
    resumed: Option<Resumed>,
    done: bool,
    solved: bool,
}

impl AgentEnv {
    /// An env whose episodes run `cfg.command` against `gateway` on the rows of `data`.
    pub fn new(
        cfg: Arc<AgentConfig>,
        gateway: Arc<Gateway>,
        journal: Option<Arc<Journal>>,
        data: Arc<Dataset>,
        reward: Option<Arc<RewardClient>>,
    ) -> Self {
        AgentEnv {
            cfg,
            gateway,
            journal,
            tasks: DatasetEnv::new(data, reward),
            live: None,
            record: Vec::new(),
            resumed: None,
            done: true,
            solved: false,
        }
    }

    /// Ends the live episode: its key dies (GTW-2) and its record goes (AJ-2).
    fn retire(&mut self) -> Option<Live> {
        let live = self.live.take()?;
        if let Some(journal) = &self.journal {
            journal.forget(&live.mailbox.digest);
        }
        self.record.clear();
        Some(live)
    }

    /// Puts the live episode's record, its last answer included (AJ-1).
    fn put_record(&self) -> Result<(), EnvError> {
        let (Some(journal), Some(live)) = (&self.journal, &self.live) else {
            return Ok(());
        };
        let record = EpisodeRecord {
            task_seed: live.task_seed,
            said: live.said.clone(),
            by_key: live.by_key.clone(),
            calls: live.calls,
            reward: live.reward,
            last_text: live.last_text.clone(),
            preamble: live.preamble.clone(),
            tools: live.tools.clone(),
            text: live.text.clone(),
            tokens: self.record.clone(),
        };
        journal.put(&live.mailbox.digest, &record)
    }

    /// Ends the episode as failed, its agent killed (APR-2), and says why with the agent's
    /// last words.
    fn fail(&mut self, reason: String) -> EnvError {
        self.done = true;
        let tail = self
            .retire()
            .map(|l| l.agent.stderr_tail())
            .unwrap_or_default();
        let reason = match tail.is_empty() {
            true => reason,
            false => format!("{reason}; the agent's stderr ends: {tail}"),
        };
        EnvError::Agent { reason }
    }

    /// Waits for the agent's next call or its exit, absorbing rewards (AGT-4).
    fn next(&mut self) -> Result<Next, EnvError> {
        let timeout_s = self.cfg.timeout_s;
        loop {
            let Some(live) = self.live.as_mut() else {
                return Err(self.fail("no episode is running".into()));
            };
            if let Some(end) = live.agent.ended() {
                // What the agent sent before it exited still counts.
                while let Ok(event) = live.mailbox.events.try_recv() {
                    match event {
                        Event::Reward(r) => live.reward = Some(r),
                        Event::Call { request, reply } => return Ok(Next::Call(request, reply)),
                        Event::Closed | Event::Ended(_) => {}
                    }
                }
                return Ok(Next::Ended(end));
            }
            let left = live.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.fail(format!(
                    "the agent ran past env.agent.timeout_s = {timeout_s} s and was killed"
                )));
            }
            match live.mailbox.events.recv_timeout(left.min(POLL)) {
                Ok(Event::Reward(r)) => live.reward = Some(r),
                Ok(Event::Call { request, reply }) => return Ok(Next::Call(request, reply)),
                Ok(Event::Closed) => live.agent.wait_for_exit(CLOSE_TO_EXIT),
                Ok(Event::Ended(error)) => live.agent.report_end(error),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(self.fail("the gateway stopped".into()))
                }
            }
        }
    }

    fn live(&mut self) -> Result<&mut Live, EnvError> {
        match self.live.as_mut() {
            Some(live) => Ok(live),
            None => Err(EnvError::Agent {
                reason: "no episode is running".into(),
            }),
        }
    }

    /// Starts the agent of task `task_seed` and waits for its first call (AGT-6, AGT-1).
    fn start(&mut self, task_seed: u64) -> Result<String, EnvError> {
        self.retire();
        self.resumed = None;
        self.tasks.reset(task_seed);
        if let Some(taken) = self.journal.as_ref().and_then(|j| j.adopt(task_seed)) {
            return self.take_up(taken);
        }
        let task = self.task_json(task_seed);
        let mailbox = self.gateway.open();
        let agent = match self.cfg.launch.as_str() {
            "pull" => {
                self.gateway.offer(&mailbox, &task);
                Agent::Pulled(None)
            }
            _ => Agent::Process(AgentProcess::spawn(
                &self.cfg.command,
                self.gateway.base_url(),
                &mailbox.key,
                &task,
                mailbox.notify.clone(),
            )?),
        };
        self.live = Some(Live {
            task_seed,
            mailbox,
            agent,
            deadline: Instant::now() + Duration::from_secs_f64(self.cfg.timeout_s),
            pending: None,
            by_key: HashMap::new(),
            tools_offered: false,
            said: Vec::new(),
            calls: 0,
            reward: None,
            last_text: String::new(),
            preamble: Vec::new(),
            tools: Vec::new(),
            text: None,
        });
        self.done = false;
        self.solved = false;
        match self.next()? {
            Next::Ended(end) => {
                let how = end.err().unwrap_or_else(|| "ended".into());
                Err(self.fail(format!("the agent {how} before its first call")))
            }
            Next::Call(request, reply) => self.first_call(*request, reply),
        }
    }

    /// Continues an episode an earlier process recorded (AJ-3): waits for its agent's next
    /// call (a retry gets the recorded answer) or its end.
    fn take_up(&mut self, taken: Adoptable) -> Result<String, EnvError> {
        let Adoptable { record, mailbox } = taken;
        self.live = Some(Live {
            task_seed: record.task_seed,
            mailbox,
            agent: Agent::Pulled(None),
            deadline: Instant::now() + Duration::from_secs_f64(self.cfg.timeout_s),
            pending: None,
            by_key: record.by_key,
            tools_offered: !record.tools.is_empty(),
            said: record.said,
            calls: record.calls,
            reward: record.reward,
            last_text: record.last_text,
            preamble: record.preamble,
            tools: record.tools,
            text: record.text,
        });
        self.record = record.tokens;
        (self.done, self.solved) = (false, false);
        let recorded = self.record.clone();
        loop {
            match self.next()? {
                Next::Ended(end) => {
                    let out = self.finish(end)?;
                    self.resumed = Some(Resumed {
                        record: recorded,
                        next: ResumedNext::Ended(out.reward),
                    });
                    return Ok(String::new());
                }
                Next::Call(request, reply) => {
                    let whole = Segment {
                        messages: request.messages.iter().map(prompt_message).collect(),
                        tools: request.tools.clone().unwrap_or_default(),
                        text: request.prompt.clone(),
                    };
                    if self.next_call(*request, reply)?.is_some() {
                        self.resumed = Some(Resumed {
                            record: recorded,
                            next: ResumedNext::Segment(whole),
                        });
                        return Ok(String::new());
                    }
                }
            }
        }
    }

    /// The first call: its last message is the prompt, the ones before the preamble (AGT-1).
    fn first_call(
        &mut self,
        request: openai::ChatRequest,
        reply: SyncSender<Reply>,
    ) -> Result<String, EnvError> {
        if let Some(prompt) = request.prompt.clone() {
            // AGT-8: a text episode; its prompt is the model's text as is.
            let live = self.live()?;
            live.pending = Some(Pending::new(reply, &request));
            live.text = Some(Transcript {
                asked: prompt.clone(),
                so_far: prompt.clone(),
            });
            return Ok(prompt);
        }
        if request.messages.last().map(|m| m.role.as_str()) != Some("user") {
            let m = "the first call of an episode must end with a user message";
            let _ = reply.send(Err(HttpError::new(400, m)));
            return Err(self.fail(m.into()));
        }
        let mut preamble: Vec<PromptMessage> =
            request.messages.iter().map(prompt_message).collect();
        let prompt = preamble.pop().map(|m| m.content).unwrap_or_default();
        let live = self.live()?;
        live.pending = Some(Pending::new(reply, &request));
        live.tools_offered = request.tools.as_ref().is_some_and(|t| !t.is_empty());
        live.tools = request.tools.unwrap_or_default();
        live.preamble = preamble;
        live.said = request.messages.into_iter().map(Said::Sent).collect();
        Ok(prompt)
    }

    /// Answers the pending call with the sampled turn (OAI-2, OAI-5) and waits for what the
    /// agent does next: its next call's new messages, or its exit (AGT-1..5).
    fn answer(&mut self, turn: &SampledTurn) -> Result<StepOutcome, EnvError> {
        if self.done {
            return Ok(outcome_of(self, String::new(), 0.0, true, true));
        }
        if !turn.record.is_empty() {
            self.record = turn.record.clone();
        }
        let live = self.live()?;
        let pending = live.pending.take();
        let stops = pending
            .as_ref()
            .map(|p| &p.limits.stop[..])
            .unwrap_or_default();
        let (text, stopped) = openai::cut_at_stop(&turn.text, stops);
        let mut answer = Answer::from_text(text, live.tools_offered);
        answer.prompt_tokens = turn.prompt_tokens;
        answer.completion_tokens = turn.completion_tokens;
        answer.truncated = turn.truncated && !stopped;
        let mut reply = None;
        if let Some(pending) = pending {
            if pending.logprobs {
                answer.logprobs = Some(
                    turn.tokens
                        .iter()
                        .map(|t| TokenLogprob {
                            token: t.text.clone(),
                            logprob: t.logprob,
                        })
                        .collect(),
                );
            }
            let served = Served {
                call: live.calls,
                answer: answer.clone(),
            };
            if let Some(key) = pending.key {
                live.by_key.insert(key, served.clone());
            }
            reply = Some((pending.reply, served));
        }
        live.calls += 1;
        live.last_text = text.to_string();
        if let Some(t) = live.text.as_mut() {
            t.so_far.push_str(text);
        }
        live.said.push(Said::Answered(answer));
        if let Some((reply, served)) = reply {
            // AJ-1: recorded before it is answered.
            if let Err(e) = self.put_record() {
                let _ = reply.send(Err(HttpError::new(503, e.to_string())));
                return Err(self.fail(e.to_string()));
            }
            // An agent that gave up on the call is seen when it exits or calls again.
            let _ = reply.send(Ok(served));
        }
        loop {
            match self.next()? {
                Next::Ended(end) => return self.finish(end),
                Next::Call(request, reply) => {
                    if let Some(went_on) = self.next_call(*request, reply)? {
                        let mut out = outcome_of(self, String::new(), 0.0, false, false);
                        match went_on {
                            WentOn::Extended(messages) => out.messages = messages,
                            WentOn::Continued(text) => out.text = Some(text),
                            WentOn::Rewritten(segment) => out.segment = Some(segment),
                        }
                        return Ok(out);
                    }
                }
            }
        }
    }

    /// A call after the first: its new messages (AGT-1) or its rewritten conversation (AGT-3),
    /// or `None` when it was answered here (a retry, AGT-2; over the budget, AGT-5).
    fn next_call(
        &mut self,
        request: openai::ChatRequest,
        reply: SyncSender<Reply>,
    ) -> Result<Option<WentOn>, EnvError> {
        let max_calls = self.cfg.max_calls;
        let live = self.live()?;
        if let Some(served) = request
            .idempotency_key
            .as_ref()
            .and_then(|k| live.by_key.get(k))
        {
            let _ = reply.send(Ok(served.clone()));
            return Ok(None);
        }
        if live.text.is_some() != request.prompt.is_some() {
            let m = "an episode's calls are all chat completions or all text completions (/v1/completions)";
            let _ = reply.send(Err(HttpError::new(400, m)));
            live.agent.wait_for_exit(EXIT_GRACE);
            return Err(self.fail(format!("the agent mixed call kinds: {m}")));
        }
        if let Some(prompt) = request.prompt.clone() {
            return self.next_text_call(request, prompt, reply);
        }
        let pending = Pending::new(reply, &request);
        let (messages, reply) = (request.messages, pending.reply.clone());
        let said = live.said.len();
        let extends = messages.len() >= said - 1
            && live.said.iter().zip(&messages).all(|(s, m)| s.matches(m));
        if extends && messages.len() == said - 1 && live.resend_last(&reply) {
            return Ok(None);
        }
        if messages.last().is_none_or(|m| m.role == "assistant") {
            let m = "a call must end with a user or tool message";
            let _ = reply.send(Err(HttpError::new(400, m)));
            live.agent.wait_for_exit(EXIT_GRACE);
            return Err(self.fail(format!("the agent sent a call that does not: {m}")));
        }
        if live.refuse_over_budget(max_calls, &reply) {
            return Ok(None);
        }
        live.pending = Some(pending);
        let new = messages.get(said..).unwrap_or_default();
        if extends && !new.iter().any(|m| m.role == "assistant") {
            let observation = new.iter().map(prompt_message).collect();
            live.said
                .extend(messages.into_iter().skip(said).map(Said::Sent));
            return Ok(Some(WentOn::Extended(observation)));
        }
        // AGT-3: a rewritten history goes on in a new segment.
        let segment = Segment {
            messages: messages.iter().map(prompt_message).collect(),
            tools: request.tools.unwrap_or_default(),
            text: None,
        };
        live.tools_offered = !segment.tools.is_empty();
        live.tools = segment.tools.clone();
        live.said = messages.into_iter().map(Said::Sent).collect();
        Ok(Some(WentOn::Rewritten(segment)))
    }

    /// A text episode's call after its first (AGT-8): a retry of the last prompt gets its
    /// answer; a prompt that extends the transcript continues it; any other starts a segment.
    fn next_text_call(
        &mut self,
        request: openai::ChatRequest,
        prompt: String,
        reply: SyncSender<Reply>,
    ) -> Result<Option<WentOn>, EnvError> {
        let max_calls = self.cfg.max_calls;
        let live = self.live()?;
        let retry = live.text.as_ref().is_some_and(|t| t.asked == prompt);
        if (retry && live.resend_last(&reply)) || live.refuse_over_budget(max_calls, &reply) {
            return Ok(None);
        }
        live.pending = Some(Pending::new(reply, &request));
        let Some(transcript) = live.text.as_mut() else {
            return Err(self.fail("a text call reached a chat episode".into()));
        };
        let went_on = match prompt.strip_prefix(transcript.so_far.as_str()) {
            Some(rest) => WentOn::Continued(rest.to_string()),
            None => WentOn::Rewritten(Segment {
                messages: Vec::new(),
                tools: Vec::new(),
                text: Some(prompt.clone()),
            }),
        };
        *transcript = Transcript {
            asked: prompt.clone(),
            so_far: prompt,
        };
        Ok(Some(went_on))
    }

    /// The agent exited: the episode's reward (AGT-4).
    fn finish(&mut self, end: Result<(), String>) -> Result<StepOutcome, EnvError> {
        let live = self.live()?;
        let (reward, last) = (live.reward, live.last_text.clone());
        if let Err(how) = end {
            return Err(self.fail(format!("the agent {how}")));
        }
        let reward = match self.cfg.reward.as_str() {
            "verifier" => self.tasks.score_final(&last)?,
            _ => match reward {
                Some(r) => r,
                None => {
                    return Err(self.fail(
                        "the agent exited without posting its reward to /v1/keel/reward (env.agent.reward = \"agent\")".into(),
                    ))
                }
            },
        };
        self.done = true;
        self.solved = reward >= 1.0;
        self.retire();
        Ok(outcome_of(self, String::new(), reward, true, false))
    }

    /// The task the agent is given (AGT-6).
    fn task_json(&self, task_seed: u64) -> String {
        let (split, index) = crate::split::task_index(task_seed);
        let row = self.tasks.current_row();
        json!({
            "split": format!("{split:?}").to_lowercase(),
            "index": index,
            "data_source": row.data_source,
            "prompt": row.messages,
            "ground_truth": row.ground_truth,
            "extra_info": row.extra_info,
        })
        .to_string()
    }
}

/// How long an agent told that its episode failed (409) may take to exit on its own (APR-2).
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// How long an agent that closed its stderr is given to be reaped before polling resumes.
const CLOSE_TO_EXIT: Duration = Duration::from_millis(100);

/// How often a waiting episode looks at its agent process.
const POLL: Duration = Duration::from_millis(50);

/// An agent's message as the chat template renders it: `developer` is `system`, an assistant
/// message's tool calls are kept with their arguments as JSON objects (OAI-1: content parts
/// that are not text were refused by the gateway).
fn prompt_message(m: &InMessage) -> PromptMessage {
    let role = match m.role.as_str() {
        "developer" => "system".to_string(),
        r => r.to_string(),
    };
    let tool_calls = m
        .calls()
        .into_iter()
        .map(|(name, arguments)| {
            json!({"type": "function", "function": {"name": name, "arguments": arguments}})
        })
        .collect();
    PromptMessage {
        role,
        content: m.text().unwrap_or_default(),
        tool_calls,
    }
}

impl Env for AgentEnv {
    fn name(&self) -> &str {
        "agent"
    }

    fn reset(&mut self, task_seed: u64) -> String {
        self.try_reset(task_seed).unwrap_or_else(|e| panic!("{e}"))
    }

    fn try_reset(&mut self, task_seed: u64) -> Result<String, EnvError> {
        self.start(task_seed)
    }

    /// Keel's own actions (oracle, demonstrations) answer the call as a model's would.
    fn step(&mut self, action: &str) -> StepOutcome {
        self.try_step(action).unwrap_or_else(|e| panic!("{e}"))
    }

    fn try_step(&mut self, action: &str) -> Result<StepOutcome, EnvError> {
        self.answer(&SampledTurn::from(action))
    }

    fn step_response(&mut self, response: &str) -> StepOutcome {
        self.try_step_response(response)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn try_step_response(&mut self, response: &str) -> Result<StepOutcome, EnvError> {
        self.answer(&SampledTurn::from(response))
    }

    fn try_step_turn(&mut self, turn: &SampledTurn) -> Result<StepOutcome, EnvError> {
        self.answer(turn)
    }

    /// Asked once, after the first call (OAI-5): decoding every token alone is paid only by
    /// episodes whose agent asks for log-probs.
    fn wants_token_logprobs(&self) -> bool {
        self.live
            .as_ref()
            .and_then(|l| l.pending.as_ref())
            .is_some_and(|p| p.logprobs)
    }

    fn journals(&self) -> bool {
        self.journal.is_some()
    }

    fn prompt_is_text(&self) -> bool {
        self.live.as_ref().is_some_and(|l| l.text.is_some())
    }

    fn take_resumed(&mut self) -> Option<Resumed> {
        self.resumed.take()
    }

    /// The pending call's `max_tokens` and `stop` (AGT-7).
    fn next_turn(&self) -> TurnLimits {
        self.live
            .as_ref()
            .and_then(|l| l.pending.as_ref())
            .map(|p| p.limits.clone())
            .unwrap_or_default()
    }

    /// The row's answer (demonstrations of an agent's episodes come from its own data).
    fn oracle_action(&self) -> String {
        self.tasks.current_row().oracle.clone()
    }

    fn max_turns(&self) -> usize {
        self.cfg.max_calls
    }

    fn success(&self) -> bool {
        self.solved
    }

    fn vocabulary(&self) -> Vec<String> {
        self.tasks.vocabulary()
    }

    fn admissible_actions(&self) -> Vec<String> {
        Vec::new()
    }

    fn task_type(&self) -> String {
        self.tasks.task_type()
    }

    fn preamble(&self) -> Vec<PromptMessage> {
        self.live
            .as_ref()
            .map(|l| l.preamble.clone())
            .unwrap_or_default()
    }

    fn tools(&self) -> Vec<serde_json::Value> {
        self.live
            .as_ref()
            .map(|l| l.tools.clone())
            .unwrap_or_default()
    }

    fn anchor_state(&self) -> String {
        let calls = self.live.as_ref().map(|l| l.calls).unwrap_or_default();
        format!("agent call {calls}")
    }

    /// An agent process cannot be captured: RTPO's boundary restores are refused.
    fn snapshot(&self) -> Result<EnvSnapshot, EnvError> {
        Err(EnvError::Snapshot {
            env: "agent".into(),
            reason: "an agent program's state cannot be captured (RTPO needs env snapshots)".into(),
        })
    }

    fn restore(&mut self, _snapshot: &EnvSnapshot) -> Result<(), EnvError> {
        self.snapshot().map(|_| ())
    }
}

impl Drop for AgentEnv {
    /// An episode the runtime dropped (closed, truncated, the run stopped) is over (AJ-2).
    fn drop(&mut self) {
        self.retire();
    }
}
