//! The generator: a sync actor (own thread) that samples rollout batches with the newest
//! published weights and writes them to the store.
//!
//! Invariants:
//! - GN-1: before each batch the generator loads the newest weights on the board (WB-2); the
//!   whole batch is sampled with one version, recorded in the batch and in every turn.
//! - GN-2: a training batch is durable (written with create-only semantics, ST-1) before the
//!   controller hears of it: the learner only ever trains on what the store holds.
//! - GN-3: the sampling RNG is seeded from (run seed, first task id, policy version), so a batch
//!   regenerated after a crash with the same weights is identical (RO-3).
//! - GN-4: a panic while sampling is caught (SV-1); the actor is replaced by a fresh one from the
//!   `SyncArbiter` factory and the controller retries the batch.

use std::sync::Arc;

use actix::{Actor, Addr, Handler, Message, SyncContext};
use keel_envs::Tokenizer;
use keel_learner::{ModelConfig, PolicyModel};
use keel_store::{BatchKey, RunStore};

use crate::env_shard::EnvShard;
use crate::error::ActorError;
use crate::rollout::{run_episodes, RolloutSpec, RolloutStats, TaskRef};
use crate::seeds::mix_seed;
use crate::supervision::{run_caught, RestartBudget};
use crate::weights::WeightBoard;

/// Everything a generator needs; cloned into each instance the factory builds.
#[derive(Clone)]
pub struct GeneratorSetup {
    /// Generator index.
    pub id: u32,
    /// Run name.
    pub run_id: String,
    /// Run seed.
    pub seed: u64,
    /// Env name.
    pub env_name: String,
    /// Model shape.
    pub model: ModelConfig,
    /// Torch device.
    pub device: tch::Device,
    /// Tokenizer of the env.
    pub tokenizer: Arc<Tokenizer>,
    /// Env shards to step episodes on.
    pub shards: Vec<Addr<EnvShard>>,
    /// Where batches go.
    pub store: RunStore,
    /// Runtime for store I/O.
    pub io: tokio::runtime::Handle,
    /// Where weights come from.
    pub board: WeightBoard,
    /// Restart budget of generators.
    pub budget: RestartBudget,
    /// Episodes per task.
    pub group_size: usize,
    /// Sampling temperature.
    pub temperature: f64,
    /// Most tokens per turn.
    pub max_turn_tokens: usize,
}

/// Why a batch is sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// A training batch: `group_size` episodes per task, written to the store.
    Train,
    /// Held-out evaluation: one sampled episode per task, nothing written.
    Eval,
}

/// Sample one batch.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<Generated, ActorError>")]
pub struct Generate {
    /// Batch sequence number.
    pub batch_seq: u64,
    /// The tasks.
    pub tasks: Vec<TaskRef>,
    /// Train or eval.
    pub purpose: Purpose,
}

/// A sampled batch.
#[derive(Debug, Clone)]
pub struct Generated {
    /// Where the batch was stored (train only).
    pub key: Option<BatchKey>,
    /// Its sequence number.
    pub batch_seq: u64,
    /// The policy version it was sampled with.
    pub policy_version: u64,
    /// Its statistics.
    pub stats: RolloutStats,
    /// Its tasks.
    pub tasks: Vec<TaskRef>,
    /// Seconds spent sampling (store write excluded).
    pub sample_seconds: f64,
    /// Seconds the store took to write the batch (train only).
    pub put_seconds: f64,
}

/// The generator actor.
pub struct Generator {
    setup: GeneratorSetup,
    model: Option<(u64, PolicyModel)>,
    /// Board epoch of the loaded weights (WB-3).
    epoch: u64,
}

impl Generator {
    /// A fresh generator (no weights loaded yet).
    pub fn new(setup: GeneratorSetup) -> Self {
        Self {
            setup,
            model: None,
            epoch: 0,
        }
    }

    fn current_model(&mut self) -> Result<&(u64, PolicyModel), ActorError> {
        let Some(published) = self.setup.board.latest() else {
            return Err(ActorError::Internal("no weights published yet".into()));
        };
        let stale = self.epoch != published.epoch
            || self
                .model
                .as_ref()
                .is_none_or(|(v, _)| *v != published.version);
        if stale {
            let mut model = match self.model.take() {
                Some((_, m)) => m,
                None => PolicyModel::new(&self.setup.model, self.setup.device, self.setup.seed)?,
            };
            model.load_safetensors(&published.safetensors)?;
            self.model = Some((published.version, model));
            self.epoch = published.epoch;
        }
        self.model
            .as_ref()
            .ok_or_else(|| ActorError::Internal("model missing".into()))
    }

    fn generate(&mut self, msg: &Generate) -> Result<Generated, ActorError> {
        let setup = self.setup.clone();
        let (version, model) = self.current_model()?;
        let version = *version;
        let first_task = msg.tasks.first().map(|t| t.task_id).unwrap_or(0);
        let (group_size, purpose_tag) = match msg.purpose {
            Purpose::Train => (setup.group_size, 1),
            Purpose::Eval => (1, 2),
        };
        let spec = RolloutSpec {
            run_id: setup.run_id.clone(),
            batch_seq: msg.batch_seq,
            generator_id: setup.id,
            policy_version: version,
            env_name: setup.env_name.clone(),
            tasks: msg.tasks.clone(),
            group_size,
            temperature: setup.temperature,
            greedy: false,
            max_turn_tokens: setup.max_turn_tokens,
            context_len: setup.model.context_len,
            rng_seed: mix_seed(&[setup.seed, purpose_tag, first_task, version]),
        };
        let start = std::time::Instant::now();
        let (batch, stats) = run_episodes(model, &setup.tokenizer, &setup.shards, &spec)?;
        let sample_seconds = start.elapsed().as_secs_f64();
        if msg.purpose == Purpose::Train && batch.trajectories.is_empty() {
            // Every episode failed in its env (RO-4): nothing to store; the controller retries.
            return Err(ActorError::AllEpisodesFailed {
                batch_seq: msg.batch_seq,
                failed: stats.failed_episodes,
            });
        }
        let key = match msg.purpose {
            Purpose::Train => Some(setup.io.block_on(setup.store.put_batch(&batch))?),
            Purpose::Eval => None,
        };
        let put_seconds = start.elapsed().as_secs_f64() - sample_seconds;
        Ok(Generated {
            key,
            batch_seq: msg.batch_seq,
            policy_version: version,
            stats,
            tasks: msg.tasks.clone(),
            sample_seconds,
            put_seconds,
        })
    }
}

impl Actor for Generator {
    type Context = SyncContext<Self>;
}

impl Handler<Generate> for Generator {
    type Result = Result<Generated, ActorError>;

    fn handle(&mut self, msg: Generate, ctx: &mut SyncContext<Self>) -> Self::Result {
        match run_caught(|| self.generate(&msg)) {
            Ok(result) => result,
            Err(panic) => {
                tracing::error!(generator = self.setup.id, panic = %panic, "generator panicked");
                self.setup.budget.record_restart();
                actix::ActorContext::stop(ctx);
                Err(ActorError::GeneratorPanicked(panic))
            }
        }
    }
}
