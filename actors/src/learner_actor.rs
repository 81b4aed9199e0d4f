//! The learner actor: a sync actor (own thread) owning the policy, its optimizer and the policy
//! version. It trains only on batches it reads from the store.
//!
//! Invariants:
//! - LA-1: the learner reads every training batch from the store by key (GN-2); it never receives
//!   trajectories in a message, so the same code serves a learner on another machine.
//! - LA-2 (staleness, AS-1): before an update at version v, every turn of the batch must satisfy
//!   0 <= v - turn.policy_version <= bound; otherwise the batch is refused with `Stale` and the
//!   weights are untouched.
//! - LA-3: the policy version equals the number of RL updates applied; SFT does not change it.

use std::sync::Arc;

use actix::{Actor, Handler, Message, SyncContext};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use keel_learner::{Learner, LearnerConfig, ModelConfig, StepMetrics, TrainBatch};
use keel_store::{BatchKey, RunStore};

use crate::error::ActorError;
use crate::seeds::mix_seed;
use crate::weights::PublishedWeights;

/// Builds the learner (the factory only makes an empty shell, so that it can be cheap).
#[derive(Message)]
#[rtype(result = "Result<(), ActorError>")]
pub struct InitLearner {
    /// Model shape.
    pub model: ModelConfig,
    /// Optimisation settings.
    pub cfg: LearnerConfig,
    /// Torch device.
    pub device: tch::Device,
    /// Run seed.
    pub seed: u64,
}

/// Supervised warm start on demonstrations `(tokens, loss mask)`.
#[derive(Message)]
#[rtype(result = "Result<StepMetrics, ActorError>")]
pub struct RunSft {
    /// The demonstrations.
    pub demos: Arc<Vec<(Vec<u32>, Vec<u8>)>>,
    /// Optimizer steps.
    pub steps: u64,
    /// Demonstrations per step.
    pub batch_size: usize,
    /// Learning rate.
    pub lr: f64,
    /// Seed of the demonstration order.
    pub seed: u64,
}

/// Train on one stored batch.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<Trained, ActorError>")]
pub struct TrainOn {
    /// The batch.
    pub key: BatchKey,
    /// The staleness bound (LA-2).
    pub bound: u64,
}

/// The result of one update.
#[derive(Debug, Clone)]
pub struct Trained {
    /// The new policy version (LA-3).
    pub version: u64,
    /// Step metrics.
    pub metrics: StepMetrics,
    /// The new weights.
    pub weights: PublishedWeights,
    /// Policy-version lag of every trained turn.
    pub turn_lags: Vec<u64>,
    /// The batch's sequence number.
    pub batch_seq: u64,
    /// Task ids in the batch.
    pub task_ids: Vec<u64>,
    /// Success rate of the batch's episodes.
    pub success_rate: f64,
    /// Invalid actions per turn in the batch.
    pub invalid_rate: f64,
}

/// The current weights.
#[derive(Message)]
#[rtype(result = "Result<PublishedWeights, ActorError>")]
pub struct CurrentWeights;

/// Every file needed to restore the learner exactly.
#[derive(Message)]
#[rtype(result = "Result<Vec<(String, Vec<u8>)>, ActorError>")]
pub struct Snapshot;

/// Restore the learner from checkpoint files; answers the restored policy version.
#[derive(Message)]
#[rtype(result = "Result<u64, ActorError>")]
pub struct Restore(pub Vec<(String, Vec<u8>)>);

/// The learner actor.
pub struct LearnerActor {
    store: RunStore,
    io: tokio::runtime::Handle,
    learner: Option<Learner>,
}

impl LearnerActor {
    /// An empty learner shell; send `InitLearner` first.
    pub fn new(store: RunStore, io: tokio::runtime::Handle) -> Self {
        Self { store, io, learner: None }
    }

    fn learner(&mut self) -> Result<&mut Learner, ActorError> {
        self.learner.as_mut().ok_or_else(|| ActorError::Internal("learner used before InitLearner".into()))
    }
}

impl Actor for LearnerActor {
    type Context = SyncContext<Self>;
}

impl Handler<InitLearner> for LearnerActor {
    type Result = Result<(), ActorError>;

    fn handle(&mut self, msg: InitLearner, _ctx: &mut SyncContext<Self>) -> Self::Result {
        self.learner = Some(Learner::new(&msg.model, msg.cfg, msg.device, msg.seed)?);
        Ok(())
    }
}

impl Handler<RunSft> for LearnerActor {
    type Result = Result<StepMetrics, ActorError>;

    fn handle(&mut self, msg: RunSft, _ctx: &mut SyncContext<Self>) -> Self::Result {
        let learner = self.learner()?;
        let device = learner.model().device();
        let mut order: Vec<usize> = Vec::new();
        let mut last = StepMetrics::default();
        for step in 0..msg.steps {
            if order.len() < msg.batch_size {
                let mut fresh: Vec<usize> = (0..msg.demos.len()).collect();
                fresh.shuffle(&mut ChaCha8Rng::seed_from_u64(mix_seed(&[msg.seed, 0x5f7, step])));
                order.extend(fresh);
            }
            let picked: Vec<(Vec<u32>, Vec<u8>)> =
                order.drain(..msg.batch_size.min(order.len())).map(|i| msg.demos[i].clone()).collect();
            let batch = TrainBatch::from_sequences(&picked, device)?;
            last = learner.sft_step(&batch, msg.lr)?;
            if step % 25 == 0 || step + 1 == msg.steps {
                tracing::info!(step, loss = last.loss, "sft");
            }
        }
        Ok(last)
    }
}

impl Handler<TrainOn> for LearnerActor {
    type Result = Result<Trained, ActorError>;

    fn handle(&mut self, msg: TrainOn, _ctx: &mut SyncContext<Self>) -> Self::Result {
        let buf = self.io.block_on(self.store.get_batch(&msg.key))?;
        let batch = buf.archived();
        let learner = self.learner()?;
        let version = learner.policy_version();
        let batch_seq = batch.batch_seq.to_native();
        let mut turn_lags = Vec::new();
        let mut task_ids = Vec::new();
        let (mut successes, mut turns, mut invalid) = (0usize, 0usize, 0usize);
        for traj in batch.trajectories.iter() {
            task_ids.push(traj.task_id.to_native());
            successes += usize::from(traj.final_reward.to_native() >= 1.0);
            for turn in traj.turns.iter() {
                let sampled = turn.policy_version.to_native();
                if sampled > version {
                    return Err(ActorError::Resume(format!(
                        "batch {batch_seq} was sampled by policy version {sampled}, newer than the learner's {version}"
                    )));
                }
                let lag = version - sampled;
                if lag > msg.bound {
                    return Err(ActorError::Stale { batch_seq, lag, bound: msg.bound });
                }
                turn_lags.push(lag);
                turns += 1;
                invalid += usize::from(turn.invalid_action);
            }
        }
        task_ids.sort_unstable();
        task_ids.dedup();
        let n_traj = batch.trajectories.len().max(1);
        let device = learner.model().device();
        let tensors = TrainBatch::from_archived(batch, device)?;
        let metrics = learner.train_step(&tensors)?;
        let weights = PublishedWeights { version: learner.policy_version(), safetensors: Arc::new(learner.weights_safetensors()?) };
        Ok(Trained {
            version: learner.policy_version(),
            metrics,
            weights,
            turn_lags,
            batch_seq,
            task_ids,
            success_rate: successes as f64 / n_traj as f64,
            invalid_rate: invalid as f64 / turns.max(1) as f64,
        })
    }
}

impl Handler<CurrentWeights> for LearnerActor {
    type Result = Result<PublishedWeights, ActorError>;

    fn handle(&mut self, _msg: CurrentWeights, _ctx: &mut SyncContext<Self>) -> Self::Result {
        let learner = self.learner()?;
        Ok(PublishedWeights { version: learner.policy_version(), safetensors: Arc::new(learner.weights_safetensors()?) })
    }
}

impl Handler<Snapshot> for LearnerActor {
    type Result = Result<Vec<(String, Vec<u8>)>, ActorError>;

    fn handle(&mut self, _msg: Snapshot, _ctx: &mut SyncContext<Self>) -> Self::Result {
        Ok(self.learner()?.state_files()?)
    }
}

impl Handler<Restore> for LearnerActor {
    type Result = Result<u64, ActorError>;

    fn handle(&mut self, msg: Restore, _ctx: &mut SyncContext<Self>) -> Self::Result {
        let learner = self.learner()?;
        learner.restore(&msg.0)?;
        Ok(learner.policy_version())
    }
}
