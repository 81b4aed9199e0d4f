//! The environment shard: an actor hosting many environment instances, one per live episode.
//!
//! Invariants:
//! - ES-1: a panicking environment never takes the shard's thread down: the panic is caught
//!   (SV-1), the episode that panicked is answered `EpisodeFailed`, and the shard stops so that
//!   its actix `Supervisor` restarts it with no live episodes.
//! - ES-2: after a restart, requests for episodes that lived in the old instance are answered
//!   `EpisodeLost`; the generator marks those episodes failed and never trains on them.
//! - ES-3: one request steps many episodes (one message per shard per turn), in request order.

use std::collections::HashMap;
use std::sync::Arc;

use actix::{Actor, Context, Handler, Message, Supervised};
use keel_envs::{Env, StepOutcome};

use crate::supervision::{run_caught, RestartBudget};

/// Builds a fresh environment instance.
pub type EnvFactory = Arc<dyn Fn() -> Box<dyn Env> + Send + Sync>;

/// Why an episode could not be served.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EpisodeError {
    /// The environment panicked while serving this episode.
    #[error("episode {0}: the environment panicked: {1}")]
    Failed(u64, String),
    /// The episode lived in a shard instance that was restarted.
    #[error("episode {0} was lost when its env shard restarted")]
    Lost(u64),
}

/// Reset episodes: `(episode id, task seed)` each; answers each episode's prompt text.
#[derive(Message)]
#[rtype(result = "Vec<Result<String, EpisodeError>>")]
pub struct ResetEpisodes(pub Vec<(u64, u64)>);

/// Step episodes: `(episode id, action text)` each; finished episodes are dropped by the shard.
#[derive(Message)]
#[rtype(result = "Vec<Result<StepOutcome, EpisodeError>>")]
pub struct StepEpisodes(pub Vec<(u64, String)>);

/// Forget episodes (e.g. truncated by the generator).
#[derive(Message)]
#[rtype(result = "()")]
pub struct CloseEpisodes(pub Vec<u64>);

/// An actor hosting environment instances.
pub struct EnvShard {
    factory: EnvFactory,
    episodes: HashMap<u64, Box<dyn Env>>,
    budget: RestartBudget,
}

impl EnvShard {
    /// A shard building its environments with `factory`.
    pub fn new(factory: EnvFactory, budget: RestartBudget) -> Self {
        Self { factory, episodes: HashMap::new(), budget }
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

impl Handler<ResetEpisodes> for EnvShard {
    type Result = Vec<Result<String, EpisodeError>>;

    fn handle(&mut self, msg: ResetEpisodes, ctx: &mut Context<Self>) -> Self::Result {
        let mut out = Vec::with_capacity(msg.0.len());
        let mut crashed = false;
        for (episode, task_seed) in msg.0 {
            if crashed {
                out.push(Err(EpisodeError::Lost(episode)));
                continue;
            }
            let factory = self.factory.clone();
            match run_caught(move || {
                let mut env = factory();
                let prompt = env.reset(task_seed);
                (env, prompt)
            }) {
                Ok((env, prompt)) => {
                    self.episodes.insert(episode, env);
                    out.push(Ok(prompt));
                }
                Err(msg) => {
                    tracing::error!(episode, panic = %msg, "environment panicked on reset");
                    out.push(Err(EpisodeError::Failed(episode, msg)));
                    crashed = true;
                }
            }
        }
        if crashed {
            actix::ActorContext::stop(ctx);
        }
        out
    }
}

impl Handler<StepEpisodes> for EnvShard {
    type Result = Vec<Result<StepOutcome, EpisodeError>>;

    fn handle(&mut self, msg: StepEpisodes, ctx: &mut Context<Self>) -> Self::Result {
        let mut out = Vec::with_capacity(msg.0.len());
        let mut crashed = false;
        for (episode, action) in msg.0 {
            if crashed {
                out.push(Err(EpisodeError::Lost(episode)));
                continue;
            }
            let Some(mut env) = self.episodes.remove(&episode) else {
                out.push(Err(EpisodeError::Lost(episode)));
                continue;
            };
            match run_caught(move || {
                let outcome = env.step(&action);
                (env, outcome)
            }) {
                Ok((env, outcome)) => {
                    if !outcome.done {
                        self.episodes.insert(episode, env);
                    }
                    out.push(Ok(outcome));
                }
                Err(msg) => {
                    tracing::error!(episode, panic = %msg, "environment panicked on step");
                    out.push(Err(EpisodeError::Failed(episode, msg)));
                    crashed = true;
                }
            }
        }
        if crashed {
            actix::ActorContext::stop(ctx);
        }
        out
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
