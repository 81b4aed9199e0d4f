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
use crate::faults::{FaultPlan, FaultsSection};
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
    /// Faults to inject (testing aid; `FaultsSection::default()` is none).
    pub faults: FaultsSection,
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
    /// Policy-version lag of every trained trajectory (its oldest turn).
    pub trajectory_lags: Vec<u64>,
    /// `(lag, model tokens)` per trained turn, for the per-token staleness histogram.
    pub token_lags: Vec<(u64, u32)>,
    /// Mean agent turns per episode.
    pub episode_turns: f64,
    /// Mean model tokens per episode.
    pub response_length: f64,
    /// Seconds the store took to return the batch.
    pub get_seconds: f64,
    /// Archived size of the batch.
    pub get_bytes: u64,
    /// The learning rate the update ran at.
    pub lr: f64,
}

/// Sets the learning rate of the following updates (collapse guard: rewind with a lower rate).
#[derive(Message)]
#[rtype(result = "Result<(), ActorError>")]
pub struct SetLearningRate(pub f64);

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
    /// What `InitLearner` said, to rebuild the learner at another learning rate.
    init: Option<(ModelConfig, tch::Device, u64)>,
    faults: FaultPlan,
}

impl LearnerActor {
    /// An empty learner shell; send `InitLearner` first.
    pub fn new(store: RunStore, io: tokio::runtime::Handle) -> Self {
        Self {
            store,
            io,
            learner: None,
            init: None,
            faults: FaultPlan::default(),
        }
    }

    /// Rebuilds the learner at learning rate `lr` with the same weights, optimizer state and
    /// counters (the learner's config is fixed at construction; a rewind is rare).
    fn set_lr(&mut self, lr: f64) -> Result<(), ActorError> {
        let Some((model, device, seed)) = self.init.clone() else {
            return Err(ActorError::Internal(
                "learner used before InitLearner".into(),
            ));
        };
        let learner = self.learner()?;
        if learner.config().lr == lr {
            return Ok(());
        }
        let files = learner.state_files()?;
        let mut cfg = learner.config().clone();
        cfg.lr = lr;
        let mut fresh = Learner::new(&model, cfg, device, seed)?;
        fresh.restore(&files)?;
        self.learner = Some(fresh);
        Ok(())
    }

    fn learner(&mut self) -> Result<&mut Learner, ActorError> {
        self.learner
            .as_mut()
            .ok_or_else(|| ActorError::Internal("learner used before InitLearner".into()))
    }
}

impl Actor for LearnerActor {
    type Context = SyncContext<Self>;
}

impl Handler<InitLearner> for LearnerActor {
    type Result = Result<(), ActorError>;

    fn handle(&mut self, msg: InitLearner, _ctx: &mut SyncContext<Self>) -> Self::Result {
        self.learner = Some(Learner::new(&msg.model, msg.cfg, msg.device, msg.seed)?);
        self.init = Some((msg.model, msg.device, msg.seed));
        self.faults = FaultPlan::new(msg.faults);
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
                fresh.shuffle(&mut ChaCha8Rng::seed_from_u64(mix_seed(&[
                    msg.seed, 0x5f7, step,
                ])));
                order.extend(fresh);
            }
            let picked: Vec<(Vec<u32>, Vec<u8>)> = order
                .drain(..msg.batch_size.min(order.len()))
                .map(|i| msg.demos[i].clone())
                .collect();
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
        let fetch = std::time::Instant::now();
        let buf = self.io.block_on(self.store.get_batch(&msg.key))?;
        let get_seconds = fetch.elapsed().as_secs_f64();
        let get_bytes = buf.archive_len() as u64;
        let version = self.learner()?.policy_version();
        let injection = self.faults.before_update(version);
        if let Some(lr) = injection.set_lr {
            tracing::warn!(lr, version, "fault injection: learning rate blown up");
            self.set_lr(lr)?;
        }
        let batch = buf.archived();
        let learner = self.learner()?;
        let batch_seq = batch.batch_seq.to_native();
        let mut turn_lags = Vec::new();
        let mut task_ids = Vec::new();
        let mut trajectory_lags = Vec::new();
        let mut token_lags = Vec::new();
        let mut model_tokens = 0usize;
        let (mut successes, mut turns, mut invalid) = (0usize, 0usize, 0usize);
        for traj in batch.trajectories.iter() {
            task_ids.push(traj.task_id.to_native());
            successes += usize::from(traj.final_reward.to_native() >= 1.0);
            let oldest = traj
                .turns
                .iter()
                .map(|t| t.policy_version.to_native())
                .min()
                .unwrap_or(version);
            trajectory_lags.push(version.saturating_sub(oldest));
            for turn in traj.turns.iter() {
                let sampled = turn.policy_version.to_native();
                if sampled > version {
                    return Err(ActorError::Resume(format!(
                        "batch {batch_seq} was sampled by policy version {sampled}, newer than the learner's {version}"
                    )));
                }
                let lag = version - sampled;
                if lag > msg.bound {
                    return Err(ActorError::Stale {
                        batch_seq,
                        lag,
                        bound: msg.bound,
                    });
                }
                turn_lags.push(lag);
                let n = turn.end.to_native().saturating_sub(turn.start.to_native());
                token_lags.push((lag, n));
                model_tokens += n as usize;
                turns += 1;
                invalid += usize::from(turn.invalid_action);
            }
        }
        task_ids.sort_unstable();
        task_ids.dedup();
        let n_traj = batch.trajectories.len().max(1);
        let device = learner.model().device();
        let mut tensors = TrainBatch::from_archived(batch, device)?;
        if injection.nan_logprobs {
            tracing::warn!(version, "fault injection: NaN behaviour log-probs");
            tensors.behaviour_logp = tensors
                .behaviour_logp
                .f_full_like(f64::NAN)
                .map_err(keel_learner::LearnerError::from)?;
        }
        let lr = learner.config().lr;
        let metrics = learner.train_step(&tensors)?;
        let weights = PublishedWeights {
            version: learner.policy_version(),
            safetensors: Arc::new(learner.weights_safetensors()?),
            epoch: 0,
        };
        Ok(Trained {
            version: learner.policy_version(),
            metrics,
            weights,
            turn_lags,
            batch_seq,
            task_ids,
            success_rate: successes as f64 / n_traj as f64,
            invalid_rate: invalid as f64 / turns.max(1) as f64,
            trajectory_lags,
            token_lags,
            episode_turns: turns as f64 / n_traj as f64,
            response_length: model_tokens as f64 / n_traj as f64,
            get_seconds,
            get_bytes,
            lr,
        })
    }
}

impl Handler<CurrentWeights> for LearnerActor {
    type Result = Result<PublishedWeights, ActorError>;

    fn handle(&mut self, _msg: CurrentWeights, _ctx: &mut SyncContext<Self>) -> Self::Result {
        let learner = self.learner()?;
        Ok(PublishedWeights {
            version: learner.policy_version(),
            safetensors: Arc::new(learner.weights_safetensors()?),
            epoch: 0,
        })
    }
}

impl Handler<SetLearningRate> for LearnerActor {
    type Result = Result<(), ActorError>;

    fn handle(&mut self, msg: SetLearningRate, _ctx: &mut SyncContext<Self>) -> Self::Result {
        self.set_lr(msg.0)
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
