//! The environment shard: an actor on an arbiter (thread) of its own, hosting many environment
//! instances, one per live episode. Every request is one episode's and is answered, through the
//! requester's [`Reply`], as soon as that episode's work is done: episodes never wait for one
//! another.
//!
//! Invariants:
//! - ES-1: a panicking environment fails only its own episode: the panic is caught (SV-1), that
//!   instance is dropped and counted against the env-shard restart budget (SV-2), and every
//!   other episode of the shard goes on.
//! - ES-2: every request is answered exactly once. A request that can no longer be served (its
//!   episode is unknown, already finished or in flight, or the shard was stopped or restarted
//!   with the work pending) is answered `EpisodeError::Lost`; the generator marks the episode
//!   failed and never trains on it.
//! - ES-3: up to `concurrency` requests of one shard are served at once; the shard's own thread
//!   only dispatches, env calls run on the blocking pool, so a slow env call holds nothing but
//!   its own episode.
//! - ES-4: an env that reports an error (`try_reset`/`try_step_response`, e.g. an external
//!   server gone after its retries) fails only that episode; the shard keeps serving.
//! - ES-5: with a latency model, step `t` of episode `e` first waits `latency.delay(e, t)`
//!   (LT-1) on a timer, so simulated tool latency of many episodes overlaps.
//! - ES-6 (RTPO): with `snapshot` set, an answer whose episode goes on carries the env state at
//!   that turn boundary (EN-7), taken right after the reset, restore or step.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{
    Actor, ActorFutureExt, Addr, Arbiter, AsyncContext, Context, Handler, Message, Supervised,
    Supervisor, WrapFuture,
};
use keel_envs::{Env, EnvSnapshot, LatencyModel, StepOutcome, TurnLimits};
use tokio::sync::Semaphore;

use crate::supervision::{run_caught, RestartBudget};

/// Builds a fresh environment instance (an error fails the episode it was for, ES-4).
pub type EnvFactory = Arc<dyn Fn() -> Result<Box<dyn Env>, keel_envs::EnvError> + Send + Sync>;

/// Why an episode could not be served.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EpisodeError {
    /// The environment panicked or failed while serving this episode.
    #[error("episode {0}: the environment failed: {1}")]
    Failed(u64, String),
    /// The episode is not live on its shard (ES-2).
    #[error("episode {0} was lost by its env shard")]
    Lost(u64),
}

/// The start of an episode: its prompt and what the generator records about its first state.
#[derive(Debug, Clone, PartialEq)]
pub struct ResetOutcome {
    /// The messages before the prompt (a dataset row's system prompt; usually none).
    pub preamble: Vec<keel_envs::PromptMessage>,
    /// The prompt text.
    pub prompt: String,
    /// The task's function tools as OpenAI schemas, rendered by the chat template into the
    /// first prompt (`Env::tools`; a verl tool row's; usually none).
    pub tools: Vec<serde_json::Value>,
    /// The task's type (EN-10; PATS keys its scaffold and success EMA by it).
    pub task_type: String,
    /// The agent that acts first.
    pub agent_id: u32,
    /// Anchor key of the first state (EN-8).
    pub anchor_key: u64,
    /// The canonical text of the first state (EN-8).
    pub anchor_state: String,
    /// The env reads its turns' token log-probs (`Env::wants_token_logprobs`).
    pub token_logprobs: bool,
    /// What the first turn is asked to be (`Env::next_turn`).
    pub next_turn: TurnLimits,
    /// The prompt is raw text, encoded without the chat template (`Env::prompt_is_text`).
    pub text_prompt: bool,
    /// The env keeps the episode's record durable (`Env::journals`, AJ-1).
    pub journals: bool,
    /// The episode was taken up from an earlier process (`Env::take_resumed`, AJ-3).
    pub resumed: Option<keel_envs::Resumed>,
}

/// What to do with an episode.
#[derive(Debug, Clone, PartialEq)]
pub enum EnvOp {
    /// Start it from a task seed.
    Reset(u64),
    /// Start it from a snapshot (RTPO branches).
    Restore(EnvSnapshot),
    /// Apply a sampled turn (passed to `Env::try_step_turn`); a finished episode is dropped by
    /// the shard.
    Step(keel_envs::SampledTurn),
}

/// What an [`EnvOp`] produced.
#[derive(Debug, Clone, PartialEq)]
pub enum EnvReply {
    /// The episode was reset.
    Started(ResetOutcome),
    /// The episode was restored.
    Restored,
    /// The episode took a step; `next_turn` is what its next turn is asked to be
    /// (`Env::next_turn`, when it goes on).
    Stepped {
        /// The step's outcome.
        outcome: StepOutcome,
        /// `Env::next_turn` after the step.
        next_turn: TurnLimits,
    },
}

/// The answer to one request.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvAnswer {
    /// The episode.
    pub episode: u64,
    /// Its outcome.
    pub result: Result<EnvReply, EpisodeError>,
    /// ES-6: the state after the op, when asked for and the episode goes on.
    pub snapshot: Option<EnvSnapshot>,
}

type ReplyFn = Box<dyn FnOnce(EnvAnswer) + Send>;

/// Where an answer goes; answers `Lost` when dropped unanswered (ES-2).
pub struct Reply {
    episode: u64,
    send: Option<ReplyFn>,
}

impl Reply {
    /// A reply that calls `send` with the answer.
    pub fn new(episode: u64, send: impl FnOnce(EnvAnswer) + Send + 'static) -> Self {
        Reply {
            episode,
            send: Some(Box::new(send)),
        }
    }

    /// A reply into a channel.
    pub fn to_channel(episode: u64, tx: std::sync::mpsc::Sender<EnvAnswer>) -> Self {
        Reply::new(episode, move |a| {
            // The requester may have gone (e.g. a rollout ended with an error): nothing to do.
            let _ = tx.send(a);
        })
    }

    fn answer(mut self, result: Result<EnvReply, EpisodeError>, snapshot: Option<EnvSnapshot>) {
        if let Some(send) = self.send.take() {
            send(EnvAnswer {
                episode: self.episode,
                result,
                snapshot,
            });
        }
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if let Some(send) = self.send.take() {
            send(EnvAnswer {
                episode: self.episode,
                result: Err(EpisodeError::Lost(self.episode)),
                snapshot: None,
            });
        }
    }
}

/// One episode's request.
#[derive(Message)]
#[rtype(result = "()")]
pub struct EnvRequest {
    /// The episode (unique within the shard).
    pub episode: u64,
    /// What to do.
    pub op: EnvOp,
    /// ES-6: also snapshot the state after the op.
    pub snapshot: bool,
    /// Where the answer goes.
    pub reply: Reply,
}

/// Forget episodes (e.g. truncated by the generator).
#[derive(Message)]
#[rtype(result = "()")]
pub struct CloseEpisodes(pub Vec<u64>);

/// How a shard serves its episodes.
#[derive(Debug, Clone)]
pub struct ShardOptions {
    /// Requests served at once (ES-3; at least 1).
    pub concurrency: usize,
    /// Simulated latency of each step (ES-5).
    pub latency: LatencyModel,
}

impl Default for ShardOptions {
    fn default() -> Self {
        ShardOptions {
            concurrency: 1,
            latency: LatencyModel::None,
        }
    }
}

/// A live episode's env and its turn counter.
struct Live {
    env: Box<dyn Env>,
    turn: u64,
}

/// An actor hosting environment instances.
pub struct EnvShard {
    factory: EnvFactory,
    episodes: HashMap<u64, Live>,
    budget: RestartBudget,
    options: ShardOptions,
    permits: Arc<Semaphore>,
}

impl EnvShard {
    /// A shard building its environments with `factory`, serving one request at a time.
    pub fn new(factory: EnvFactory, budget: RestartBudget) -> Self {
        Self::with_options(factory, budget, ShardOptions::default())
    }

    /// A shard with explicit serving options (ES-3, ES-5).
    pub fn with_options(factory: EnvFactory, budget: RestartBudget, options: ShardOptions) -> Self {
        Self {
            factory,
            episodes: HashMap::new(),
            budget,
            permits: Arc::new(Semaphore::new(options.concurrency.max(1))),
            options,
        }
    }
}

/// Env shards, each supervised on an arbiter (thread) of its own that no other actor shares;
/// the arbiters stop when the pool is dropped.
pub struct ShardPool {
    addrs: Vec<Addr<EnvShard>>,
    arbiters: Vec<Arbiter>,
}

impl ShardPool {
    /// Starts `n` shards (inside a running actix system).
    pub fn start(
        n: usize,
        factory: EnvFactory,
        budget: RestartBudget,
        options: ShardOptions,
    ) -> ShardPool {
        let mut pool = ShardPool {
            addrs: Vec::with_capacity(n),
            arbiters: Vec::with_capacity(n),
        };
        for _ in 0..n {
            let arbiter = Arbiter::new();
            let (f, b, o) = (factory.clone(), budget.clone(), options.clone());
            let addr = Supervisor::start_in_arbiter(&arbiter.handle(), move |_| {
                EnvShard::with_options(f, b, o)
            });
            pool.addrs.push(addr);
            pool.arbiters.push(arbiter);
        }
        pool
    }

    /// The shards' addresses.
    pub fn addrs(&self) -> &[Addr<EnvShard>] {
        &self.addrs
    }
}

impl Drop for ShardPool {
    fn drop(&mut self) {
        for a in &self.arbiters {
            a.stop();
        }
    }
}

impl Actor for EnvShard {
    type Context = Context<Self>;
}

impl Supervised for EnvShard {
    fn restarting(&mut self, _ctx: &mut Context<Self>) {
        self.episodes.clear();
    }
}

/// What a served request hands back to the actor: the env (when the episode goes on), the
/// answer, a snapshot, and whether the env panicked.
type Served = (
    Option<Live>,
    Result<EnvReply, EpisodeError>,
    Option<EnvSnapshot>,
    bool,
);

/// Runs `op` on the episode's env.
fn apply(live: &mut Live, op: EnvOp) -> Result<EnvReply, keel_envs::EnvError> {
    match op {
        EnvOp::Reset(seed) => live.env.try_reset(seed).map(|prompt| {
            EnvReply::Started(ResetOutcome {
                preamble: live.env.preamble(),
                prompt,
                tools: live.env.tools(),
                task_type: live.env.task_type(),
                agent_id: live.env.agent_id(),
                anchor_key: live.env.anchor_key(),
                anchor_state: live.env.anchor_state(),
                token_logprobs: live.env.wants_token_logprobs(),
                next_turn: live.env.next_turn(),
                text_prompt: live.env.prompt_is_text(),
                journals: live.env.journals(),
                resumed: live.env.take_resumed(),
            })
        }),
        EnvOp::Restore(snap) => live.env.restore(&snap).map(|()| EnvReply::Restored),
        EnvOp::Step(turn) => {
            live.turn += 1;
            live.env
                .try_step_turn(&turn)
                .map(|outcome| EnvReply::Stepped {
                    next_turn: match outcome.done {
                        true => TurnLimits::default(),
                        false => live.env.next_turn(),
                    },
                    outcome,
                })
        }
    }
}

/// Runs `op` on the episode's env (building it for a reset or restore), catching panics (ES-1).
fn serve(
    episode: u64,
    live: Option<Live>,
    op: EnvOp,
    snapshot: bool,
    factory: &EnvFactory,
) -> Served {
    let caught = run_caught(move || {
        let mut live = match (live, &op) {
            (Some(l), EnvOp::Step(_)) => l,
            (_, EnvOp::Step(_)) => return (None, Err(EpisodeError::Lost(episode)), None),
            _ => match factory() {
                Ok(env) => Live { env, turn: 0 },
                Err(e) => {
                    let why = format!("building the env: {e}");
                    return (None, Err(EpisodeError::Failed(episode, why)), None);
                }
            },
        };
        let reply = apply(&mut live, op);
        let reply = match reply {
            Ok(r) => r,
            Err(e) => {
                return (
                    None,
                    Err(EpisodeError::Failed(episode, e.to_string())),
                    None,
                )
            }
        };
        let goes_on = !matches!(&reply, EnvReply::Stepped { outcome, .. } if outcome.done);
        if !goes_on {
            return (None, Ok(reply), None);
        }
        let snap = if snapshot {
            match live.env.snapshot() {
                Ok(s) => Some(s),
                Err(e) => {
                    return (
                        None,
                        Err(EpisodeError::Failed(episode, e.to_string())),
                        None,
                    )
                }
            }
        } else {
            None
        };
        (Some(live), Ok(reply), snap)
    });
    match caught {
        Ok((live, reply, snap)) => (live, reply, snap, false),
        Err(panic) => {
            tracing::error!(episode, panic = %panic, "environment panicked");
            (None, Err(EpisodeError::Failed(episode, panic)), None, true)
        }
    }
}

impl Handler<EnvRequest> for EnvShard {
    type Result = ();

    fn handle(&mut self, msg: EnvRequest, ctx: &mut Context<Self>) {
        let EnvRequest {
            episode,
            op,
            snapshot,
            reply,
        } = msg;
        let live = match &op {
            EnvOp::Step(_) => match self.episodes.remove(&episode) {
                Some(l) => Some(l),
                None => return reply.answer(Err(EpisodeError::Lost(episode)), None),
            },
            _ => None,
        };
        let delay = match (&op, &live) {
            (EnvOp::Step(_), Some(l)) => self.options.latency.delay(episode, l.turn + 1),
            _ => Duration::ZERO,
        };
        let (permits, factory) = (self.permits.clone(), self.factory.clone());
        let work = async move {
            // The semaphore is never closed; a failed acquire only means "no limit".
            let _permit = permits.acquire_owned().await.ok();
            if !delay.is_zero() {
                actix::clock::sleep(delay).await;
            }
            tokio::task::spawn_blocking(move || serve(episode, live, op, snapshot, &factory))
                .await
                .unwrap_or_else(|e| {
                    let why = format!("env call did not complete: {e}");
                    (None, Err(EpisodeError::Failed(episode, why)), None, true)
                })
        };
        ctx.spawn(
            work.into_actor(self)
                .map(move |(live, result, snap, panicked), shard, _ctx| {
                    if panicked {
                        shard.budget.record_restart();
                    }
                    if let Some(live) = live {
                        shard.episodes.insert(episode, live);
                    }
                    reply.answer(result, snap);
                }),
        );
    }
}

impl Handler<CloseEpisodes> for EnvShard {
    type Result = ();

    fn handle(&mut self, msg: CloseEpisodes, _ctx: &mut Context<Self>) {
        for episode in msg.0 {
            self.episodes.remove(&episode);
        }
    }
}

/// Sends one request and waits for its answer (for callers in async code; the rollout engine
/// streams answers through a channel instead).
pub async fn request(shard: &Addr<EnvShard>, episode: u64, op: EnvOp, snapshot: bool) -> EnvAnswer {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let reply = Reply::new(episode, move |a| {
        let _ = tx.send(a);
    });
    shard.do_send(EnvRequest {
        episode,
        op,
        snapshot,
        reply,
    });
    rx.await.unwrap_or(EnvAnswer {
        episode,
        result: Err(EpisodeError::Lost(episode)),
        snapshot: None,
    })
}

/// Sends many requests at once and returns their answers in request order, with the instant
/// each arrived.
pub async fn request_all(
    shard: &Addr<EnvShard>,
    requests: Vec<(u64, EnvOp)>,
) -> Vec<(EnvAnswer, Instant)> {
    let asks = requests.into_iter().map(|(episode, op)| async move {
        let a = request(shard, episode, op, false).await;
        (a, Instant::now())
    });
    futures::future::join_all(asks).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn calc() -> EnvFactory {
        Arc::new(|| keel_envs::make_env("calc", 3))
    }

    fn stepped(a: &EnvAnswer) -> StepOutcome {
        match &a.result {
            Ok(EnvReply::Stepped { outcome, .. }) => outcome.clone(),
            other => panic!("expected a step outcome, got {other:?}"),
        }
    }

    #[test]
    fn snapshot_then_restore_continues_like_the_original_episode() {
        let system = actix::System::new();
        system.block_on(async {
            let shard = EnvShard::new(calc(), RestartBudget::new("env_shard", 1)).start();
            let seed = keel_envs::task_seed(keel_envs::Split::Eval, 4);
            let started = request(&shard, 1, EnvOp::Reset(seed), false).await;
            match started.result {
                Ok(EnvReply::Started(s)) => assert!(s.prompt.starts_with("task")),
                other => panic!("reset: {other:?}"),
            }
            let a = request(&shard, 1, EnvOp::Step("calc 1 + 1".into()), true).await;
            let snap = a.snapshot.clone().expect("ES-6 snapshot");
            let lost = request(&shard, 9, EnvOp::Step("calc 1 + 1".into()), true).await;
            assert_eq!(lost.result, Err(EpisodeError::Lost(9)));
            let restored = request(&shard, 2, EnvOp::Restore(snap), false).await;
            assert_eq!(restored.result, Ok(EnvReply::Restored));
            for action in ["calc 2 * 3", "answer 6"] {
                let x = request(&shard, 1, EnvOp::Step(action.into()), false).await;
                let y = request(&shard, 2, EnvOp::Step(action.into()), false).await;
                assert_eq!(stepped(&x), stepped(&y), "{action}");
            }
            // Both ended and were dropped by the shard.
            for e in [1, 2] {
                let a = request(&shard, e, EnvOp::Step("answer 1".into()), false).await;
                assert_eq!(a.result, Err(EpisodeError::Lost(e)));
            }
        });
    }

    #[test]
    fn es2_a_dropped_reply_answers_lost() {
        let (tx, rx) = std::sync::mpsc::channel();
        drop(Reply::to_channel(5, tx));
        let a = rx.recv().expect("answered on drop");
        assert_eq!(a.result, Err(EpisodeError::Lost(5)));
    }

    #[test]
    fn concurrent_resets_answer_every_episode() {
        let system = actix::System::new();
        system.block_on(async {
            let options = ShardOptions {
                concurrency: 4,
                latency: LatencyModel::None,
            };
            let shard =
                EnvShard::with_options(calc(), RestartBudget::new("env_shard", 1), options).start();
            let ids: Vec<u64> = (0..10).collect();
            let answers = request_all(
                &shard,
                ids.iter().map(|&e| (e, EnvOp::Reset(e * 7))).collect(),
            )
            .await;
            let mut reference = keel_envs::make_env("calc", 3).expect("calc");
            for (&e, (a, _)) in ids.iter().zip(&answers) {
                assert_eq!(a.episode, e);
                match &a.result {
                    Ok(EnvReply::Started(s)) => assert_eq!(s.prompt, reference.reset(e * 7)),
                    other => panic!("reset: {other:?}"),
                }
            }
        });
    }
}
