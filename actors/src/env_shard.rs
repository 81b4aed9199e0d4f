//! The environment shard: an actor hosting many environment instances, one per live episode,
//! stepping them concurrently and optionally with simulated tool latency.
//!
//! Invariants:
//! - ES-1: a panicking environment never takes the shard's thread down: the panic is caught
//!   (SV-1), the episode that panicked is answered `EpisodeFailed`, and the shard stops so that
//!   its actix `Supervisor` restarts it with no live episodes.
//! - ES-2: after a restart, requests for episodes that lived in the old instance are answered
//!   `EpisodeLost`; the generator marks those episodes failed and never trains on them.
//! - ES-3: one request steps many episodes (one message per shard per turn); answers come back
//!   in request order. With `concurrency > 1` up to that many episodes step at once, so a
//!   request costs about its slowest episode, as with real concurrent tool calls.
//! - ES-4: an env that reports an error (`try_reset`/`try_step`, e.g. an external server gone
//!   after its retries) fails only that episode; the shard keeps serving without a restart.
//! - ES-5: with a latency model, each step of episode `e` at turn `t` first sleeps
//!   `latency.delay(e, t)` (LT-1), inside that episode's worker.

use std::collections::HashMap;
use std::sync::Arc;

use actix::{Actor, Context, Handler, Message, Supervised};
use keel_envs::{Env, EnvSnapshot, LatencyModel, StepOutcome};

use crate::supervision::{run_caught, RestartBudget};

/// Builds a fresh environment instance.
pub type EnvFactory = Arc<dyn Fn() -> Box<dyn Env> + Send + Sync>;

/// Why an episode could not be served.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EpisodeError {
    /// The environment panicked or failed while serving this episode.
    #[error("episode {0}: the environment failed: {1}")]
    Failed(u64, String),
    /// The episode lived in a shard instance that was restarted.
    #[error("episode {0} was lost when its env shard restarted")]
    Lost(u64),
}

/// Reset episodes: `(episode id, task seed)` each; answers each episode's start.
#[derive(Message)]
#[rtype(result = "Vec<Result<ResetOutcome, EpisodeError>>")]
pub struct ResetEpisodes(pub Vec<(u64, u64)>);

/// The start of an episode: its prompt and what the generator records about its first state.
#[derive(Debug, Clone, PartialEq)]
pub struct ResetOutcome {
    /// The prompt text.
    pub prompt: String,
    /// The task's type (EN-10; PATS keys its scaffold and success EMA by it).
    pub task_type: String,
    /// The agent that acts first.
    pub agent_id: u32,
    /// Anchor key of the first state (EN-8).
    pub anchor_key: u64,
}

/// Step episodes: `(episode id, action text)` each; finished episodes are dropped by the shard.
#[derive(Message)]
#[rtype(result = "Vec<Result<StepOutcome, EpisodeError>>")]
pub struct StepEpisodes(pub Vec<(u64, String)>);

/// Forget episodes (e.g. truncated by the generator).
#[derive(Message)]
#[rtype(result = "()")]
pub struct CloseEpisodes(pub Vec<u64>);

/// Snapshot live episodes at their current turn boundary (RTPO, EN-7).
#[derive(Message)]
#[rtype(result = "Vec<Result<EnvSnapshot, EpisodeError>>")]
pub struct SnapshotEpisodes(pub Vec<u64>);

/// Start episodes from snapshots: `(new episode id, snapshot)` each.
#[derive(Message)]
#[rtype(result = "Vec<Result<(), EpisodeError>>")]
pub struct RestoreEpisodes(pub Vec<(u64, EnvSnapshot)>);

/// How a shard steps its episodes.
#[derive(Debug, Clone, Default)]
pub struct ShardOptions {
    /// Episodes stepped at once (0 or 1: one after another).
    pub concurrency: usize,
    /// Simulated latency of each step (ES-5).
    pub latency: LatencyModel,
}

/// A live episode; its env is built lazily, inside the panic guard (a factory may panic).
struct Live {
    env: Option<Box<dyn Env>>,
    turn: u64,
}

impl Live {
    fn unborn() -> Live {
        Live { env: None, turn: 0 }
    }

    fn env(&mut self, factory: &EnvFactory) -> &mut Box<dyn Env> {
        self.env.get_or_insert_with(|| factory())
    }
}

/// An actor hosting environment instances.
pub struct EnvShard {
    factory: EnvFactory,
    episodes: HashMap<u64, Live>,
    budget: RestartBudget,
    options: ShardOptions,
}

impl EnvShard {
    /// A shard building its environments with `factory`, stepping one episode at a time.
    pub fn new(factory: EnvFactory, budget: RestartBudget) -> Self {
        Self::with_options(factory, budget, ShardOptions::default())
    }

    /// A shard with explicit stepping options (ES-3, ES-5).
    pub fn with_options(factory: EnvFactory, budget: RestartBudget, options: ShardOptions) -> Self {
        Self {
            factory,
            episodes: HashMap::new(),
            budget,
            options,
        }
    }
}

impl Actor for EnvShard {
    type Context = Context<Self>;
}

impl Supervised for EnvShard {
    fn restarting(&mut self, _ctx: &mut Context<Self>) {
        self.budget.record_restart();
        self.episodes.clear();
    }
}

/// One unit of work: an episode, its env (if live) and what to do with it.
type Job<A> = (u64, Option<Live>, A);
/// What a job produced: the env back (unless it panicked) and the answer.
type Done<R> = (u64, Option<Live>, Result<R, EpisodeError>, bool);

/// Runs `work` over every job, up to `concurrency` at once, catching panics per episode (ES-1).
fn run_jobs<A: Send, R: Send>(
    jobs: Vec<Job<A>>,
    concurrency: usize,
    work: &(dyn Fn(u64, &mut Live, A) -> Result<R, String> + Sync),
) -> Vec<Done<R>> {
    let one = |(episode, live, arg): Job<A>| -> Done<R> {
        let Some(mut live) = live else {
            return (episode, None, Err(EpisodeError::Lost(episode)), false);
        };
        match run_caught(move || {
            let r = work(episode, &mut live, arg);
            (live, r)
        }) {
            Ok((live, Ok(r))) => (episode, Some(live), Ok(r), false),
            Ok((_, Err(e))) => (episode, None, Err(EpisodeError::Failed(episode, e)), false),
            Err(panic) => {
                tracing::error!(episode, panic = %panic, "environment panicked");
                (
                    episode,
                    None,
                    Err(EpisodeError::Failed(episode, panic)),
                    true,
                )
            }
        }
    };
    let workers = concurrency.max(1).min(jobs.len().max(1));
    if workers <= 1 {
        return jobs.into_iter().map(one).collect();
    }
    // Deal the jobs round-robin to `workers` scoped threads, then restore request order.
    let mut lanes: Vec<Vec<(usize, Job<A>)>> = (0..workers).map(|_| Vec::new()).collect();
    for (i, job) in jobs.into_iter().enumerate() {
        lanes[i % workers].push((i, job));
    }
    let mut done: Vec<(usize, Done<R>)> = std::thread::scope(|s| {
        let handles: Vec<_> = lanes
            .into_iter()
            .map(|lane| {
                s.spawn(move || {
                    lane.into_iter()
                        .map(|(i, job)| (i, one(job)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    });
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, d)| d).collect()
}

impl EnvShard {
    /// Puts envs back, answers in order, and stops the shard after a panic (ES-1).
    fn settle<R>(
        &mut self,
        done: Vec<Done<R>>,
        keep: impl Fn(&R) -> bool,
        ctx: &mut Context<Self>,
    ) -> Vec<Result<R, EpisodeError>> {
        let crashed = done.iter().any(|d| d.3);
        let out = done
            .into_iter()
            .map(|(episode, live, answer, _)| {
                if let (Some(live), Ok(r)) = (live, &answer) {
                    if keep(r) {
                        self.episodes.insert(episode, live);
                    }
                }
                answer
            })
            .collect();
        if crashed {
            actix::ActorContext::stop(ctx);
        }
        out
    }
}

impl Handler<ResetEpisodes> for EnvShard {
    type Result = Vec<Result<ResetOutcome, EpisodeError>>;

    fn handle(&mut self, msg: ResetEpisodes, ctx: &mut Context<Self>) -> Self::Result {
        let factory = self.factory.clone();
        let jobs: Vec<Job<u64>> = msg
            .0
            .into_iter()
            .map(|(e, seed)| (e, Some(Live::unborn()), seed))
            .collect();
        let done = run_jobs(jobs, self.options.concurrency, &|_, live, seed| {
            let env = live.env(&factory);
            let prompt = env.try_reset(seed).map_err(|e| e.to_string())?;
            Ok(ResetOutcome {
                prompt,
                task_type: env.task_type(),
                agent_id: env.agent_id(),
                anchor_key: env.anchor_key(),
            })
        });
        self.settle(done, |_| true, ctx)
    }
}

impl Handler<StepEpisodes> for EnvShard {
    type Result = Vec<Result<StepOutcome, EpisodeError>>;

    fn handle(&mut self, msg: StepEpisodes, ctx: &mut Context<Self>) -> Self::Result {
        let jobs: Vec<Job<String>> = msg
            .0
            .into_iter()
            .map(|(e, action)| (e, self.episodes.remove(&e), action))
            .collect();
        let latency = self.options.latency.clone();
        let factory = self.factory.clone();
        let done = run_jobs(jobs, self.options.concurrency, &|episode, live, action| {
            live.turn += 1;
            if !latency.is_none() {
                std::thread::sleep(latency.delay(episode, live.turn));
            }
            live.env(&factory)
                .try_step(&action)
                .map_err(|e| e.to_string())
        });
        self.settle(done, |outcome: &StepOutcome| !outcome.done, ctx)
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

impl Handler<SnapshotEpisodes> for EnvShard {
    type Result = Vec<Result<EnvSnapshot, EpisodeError>>;

    fn handle(&mut self, msg: SnapshotEpisodes, _ctx: &mut Context<Self>) -> Self::Result {
        msg.0
            .into_iter()
            .map(|e| match self.episodes.get(&e) {
                None => Err(EpisodeError::Lost(e)),
                Some(Live { env: Some(env), .. }) => env
                    .snapshot()
                    .map_err(|err| EpisodeError::Failed(e, err.to_string())),
                Some(_) => Err(EpisodeError::Lost(e)),
            })
            .collect()
    }
}

impl Handler<RestoreEpisodes> for EnvShard {
    type Result = Vec<Result<(), EpisodeError>>;

    fn handle(&mut self, msg: RestoreEpisodes, ctx: &mut Context<Self>) -> Self::Result {
        let factory = self.factory.clone();
        let jobs: Vec<Job<EnvSnapshot>> = msg
            .0
            .into_iter()
            .map(|(e, snap)| (e, Some(Live::unborn()), snap))
            .collect();
        let done = run_jobs(jobs, self.options.concurrency, &|_, live, snap| {
            live.env(&factory).restore(&snap).map_err(|e| e.to_string())
        });
        self.settle(done, |_| true, ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn calc() -> EnvFactory {
        Arc::new(|| keel_envs::make_env("calc", 3).expect("calc"))
    }

    #[test]
    fn snapshot_then_restore_continues_like_the_original_episode() {
        let system = actix::System::new();
        system.block_on(async {
            let shard = EnvShard::new(calc(), RestartBudget::new("env_shard", 1)).start();
            let seed = keel_envs::task_seed(keel_envs::Split::Eval, 4);
            let prompt = shard
                .send(ResetEpisodes(vec![(1, seed)]))
                .await
                .expect("mailbox")
                .remove(0)
                .expect("reset");
            assert!(prompt.prompt.starts_with("task"));
            shard
                .send(StepEpisodes(vec![(1, "calc 1 + 1".into())]))
                .await
                .expect("mailbox");
            let snap = shard
                .send(SnapshotEpisodes(vec![1, 9]))
                .await
                .expect("mailbox");
            assert_eq!(snap[1], Err(EpisodeError::Lost(9)));
            let snap = snap[0].clone().expect("snapshot");
            let restored = shard
                .send(RestoreEpisodes(vec![(2, snap)]))
                .await
                .expect("mailbox");
            assert_eq!(restored, vec![Ok(())]);
            for action in ["calc 2 * 3", "answer 6"] {
                let outs = shard
                    .send(StepEpisodes(vec![(1, action.into()), (2, action.into())]))
                    .await
                    .expect("mailbox");
                assert_eq!(outs[0], outs[1], "{action}");
            }
            // Both ended and were dropped by the shard.
            let outs = shard
                .send(StepEpisodes(vec![
                    (1, "answer 1".into()),
                    (2, "answer 1".into()),
                ]))
                .await
                .expect("mailbox");
            assert_eq!(
                outs,
                vec![Err(EpisodeError::Lost(1)), Err(EpisodeError::Lost(2))]
            );
        });
    }

    #[test]
    fn concurrent_steps_answer_in_request_order() {
        let system = actix::System::new();
        system.block_on(async {
            let options = ShardOptions {
                concurrency: 4,
                latency: LatencyModel::None,
            };
            let shard =
                EnvShard::with_options(calc(), RestartBudget::new("env_shard", 1), options).start();
            let ids: Vec<u64> = (0..10).collect();
            let prompts = shard
                .send(ResetEpisodes(ids.iter().map(|&e| (e, e * 7)).collect()))
                .await
                .expect("mailbox");
            let mut reference = keel_envs::make_env("calc", 3).expect("calc");
            for (&e, p) in ids.iter().zip(&prompts) {
                assert_eq!(p.as_ref().expect("reset").prompt, reference.reset(e * 7));
            }
        });
    }
}
