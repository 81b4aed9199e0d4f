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
//! - LA-4 (Dr. MAS agent models): every model trains on every batch, restricted to its agents'
//!   turns, with its own optimizer and settings; their versions stay equal; checkpoint files of
//!   model k > 0 are named `agent-model-<k>.<file>`. The step reports the main model's
//!   statistics with the models' folded in as `keel_learner::step_metrics` says (SM-4).
//! - LA-5 (a non-finite update is one for all models or none): the main model steps first; when
//!   its update is refused (LR-2) no other model steps and the batch is refused as a whole. When
//!   only an agent model's update is refused, that model keeps its weights but counts the
//!   version (LR-6), and the step reports it (`Trained::refused_models`), so the versions never
//!   diverge (a diverged version would refuse every later batch as stale).
//! - LA-6 (panics): a panic in an update (SFT or RL) is caught and answered with
//!   `ActorError::LearnerPanicked`; the actor then refuses every message that reads or writes
//!   the model (its weights may be half updated), so no checkpoint is taken of them: the run
//!   ends non-zero naming the panic, and a new run resumes from the last committed checkpoint.
//! - SF-1: SFT step k trains on the same demonstrations whether the run took steps 0..k in one
//!   go or resumed from an SFT checkpoint at some step j < k: the demonstration order before the
//!   first step is replayed, and the optimizer state comes from the checkpoint, so an
//!   interrupted SFT ends bit-identical to an uninterrupted one.
//! - SF-2: a stop request ends SFT at the next step boundary, never inside a step.

use std::sync::Arc;

use actix::{Actor, Handler, Message, SyncContext};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use keel_learner::{Learner, LearnerConfig, ModelSpec, StepMetrics, TrainBatch};
use keel_store::{BatchKey, RunStore};

use crate::error::ActorError;
use crate::faults::{FaultPlan, FaultsSection};
use crate::learner_ranks::{RankCommand, RankLink};
use crate::seeds::mix_seed;
use crate::weights::{PublishedWeights, WeightsProbe};
use keel_learner::data_parallel::SharedGroup;
use keel_learner::hf::model::dtype_name;
use keel_learner::probe::{device_name, probe_logprobs};

/// Dr. MAS: one more model, serving some agents, with its own optimizer and settings.
#[derive(Debug, Clone)]
pub struct AgentModel {
    /// The agents whose turns it samples and trains on.
    pub agents: Vec<u32>,
    /// Its optimisation settings.
    pub cfg: LearnerConfig,
}

/// Builds the learner (the factory only makes an empty shell, so that it can be cheap).
#[derive(Message)]
#[rtype(result = "Result<(), ActorError>")]
pub struct InitLearner {
    /// The model (architecture, first weights, placement, heads).
    pub model: ModelSpec,
    /// The separate critic's first weights (`model.critic_path`); None = copy the policy.
    pub critic: Option<ModelSpec>,
    /// Optimisation settings.
    pub cfg: LearnerConfig,
    /// Dr. MAS: separate models per agent group; empty = one shared model for every agent.
    pub agent_models: Vec<AgentModel>,
    /// Run seed.
    pub seed: u64,
    /// Sampling temperature of the batches (MD-5).
    pub temperature: f64,
    /// Updates in the run (`run.steps`): the horizon of the learning-rate schedule (LS-1).
    pub lr_horizon: u64,
    /// Files every checkpoint carries beside the learner state, so that an export is a
    /// complete Hugging Face folder: `tokenizer.json`, `tokenizer_config.json`.
    pub tokenizer_files: Vec<(String, Vec<u8>)>,
    /// Faults to inject (testing aid; `FaultsSection::default()` is none).
    pub faults: FaultsSection,
}

/// The learner's first message for `cfg` (every learner rank builds the same one, LK-1).
pub fn init_message(
    cfg: &crate::config::TrainConfig,
    model: &crate::setup::ModelSetup,
    device: tch::Device,
) -> Result<InitLearner, ActorError> {
    Ok(InitLearner {
        model: model.spec.clone(),
        critic: cfg.critic_spec(device)?,
        cfg: cfg.learner_config(),
        agent_models: cfg
            .agent_models
            .iter()
            .map(|m| AgentModel {
                agents: m.agents.clone(),
                cfg: cfg.agent_learner_config(m),
            })
            .collect(),
        seed: cfg.run.seed,
        temperature: cfg.rollout.temperature,
        lr_horizon: cfg.run.steps,
        tokenizer_files: model.tokenizer_files.clone(),
        faults: cfg.faults.clone(),
    })
}

/// Makes this learner rank 0 of the learner ranks meeting at the rendezvous, under the
/// identity (the config hash, LK-4).
#[derive(Message)]
#[rtype(result = "Result<(), ActorError>")]
pub struct JoinRanks(pub keel_learner::collective::Rendezvous, pub String);

/// Supervised warm start on demonstrations `(tokens, loss mask)`: steps `first_step..end_step`
/// of one SFT run (SF-1, SF-2).
#[derive(Message)]
#[rtype(result = "Result<SftProgress, ActorError>")]
pub struct RunSft {
    /// The demonstrations.
    pub demos: Arc<Vec<(Vec<u32>, Vec<u8>)>>,
    /// The first step to take: earlier ones were taken before (a checkpoint holds them).
    pub first_step: u64,
    /// The step to stop before.
    pub end_step: u64,
    /// Demonstrations per step.
    pub batch_size: usize,
    /// Learning rate.
    pub lr: f64,
    /// Seed of the demonstration order.
    pub seed: u64,
    /// A stop request ends the run at the next step boundary (SF-2).
    pub stop: crate::process::StopSignal,
}

/// How far an SFT run got.
#[derive(Debug, Clone, Default)]
pub struct SftProgress {
    /// Steps taken in all (the next run starts here).
    pub steps_done: u64,
    /// The last step's statistics.
    pub last: StepMetrics,
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
    /// Mean trajectories per episode: above 1 when agents rewrite their history (RB-4).
    pub segments_per_episode: f64,
    /// Seconds the store took to return the batch.
    pub get_seconds: f64,
    /// Archived size of the batch.
    pub get_bytes: u64,
    /// The learning rate the update ran at.
    pub lr: f64,
    /// Agent models whose update was refused as non-finite, with what was non-finite (LA-5).
    pub refused_models: Vec<(usize, String)>,
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

/// ARMOR reference reset: copy the current policy into the reference; answers its weights.
#[derive(Message)]
#[rtype(result = "Result<Vec<u8>, ActorError>")]
pub struct ResetReference;

/// Installs policy weights (a checkpoint's `model.safetensors`) as the reference policy.
#[derive(Message)]
#[rtype(result = "Result<(), ActorError>")]
pub struct LoadReference(pub Vec<u8>);

/// The reference policy's weights (the current weights when none was taken yet, which is what
/// the first update would take).
#[derive(Message)]
#[rtype(result = "Result<Vec<u8>, ActorError>")]
pub struct ReferenceWeights;

/// The checkpoint file name of model `k`'s file `name` (model 0 keeps the plain names).
fn model_file(k: usize, name: &str) -> String {
    if k == 0 {
        name.to_string()
    } else {
        format!("agent-model-{k}.{name}")
    }
}

/// The learner actor. With Dr. MAS agent models it holds one `Learner` per model (index 0 is
/// the main one, serving every agent no other model lists); all step together on each batch,
/// so their policy versions stay equal (LA-4).
pub struct LearnerActor {
    store: RunStore,
    io: tokio::runtime::Handle,
    learners: Vec<Learner>,
    /// Tokenizer files added to every snapshot (`InitLearner::tokenizer_files`).
    tokenizer_files: Vec<(String, Vec<u8>)>,
    /// Agent filter of each learner (None for the main one without agent models).
    filters: Vec<Option<Vec<u32>>>,
    faults: FaultPlan,
    /// Set when an update panicked (LA-6): what it was doing, and the panic's message.
    panicked: Option<(&'static str, String)>,
    /// Learner ranks (LK-1): rank 0 broadcasts its calls through it, followers receive them.
    ranks: Option<RankLink>,
}

impl LearnerActor {
    /// An empty learner shell; send `InitLearner` first.
    pub fn new(store: RunStore, io: tokio::runtime::Handle) -> Self {
        Self {
            store,
            io,
            learners: Vec::new(),
            tokenizer_files: Vec::new(),
            filters: Vec::new(),
            faults: FaultPlan::default(),
            panicked: None,
            ranks: None,
        }
    }

    /// Joins every learner of this process to the learner ranks' group (LR-9, LK-1).
    pub(crate) fn join_ranks(&mut self, group: SharedGroup) -> Result<(), ActorError> {
        let whole = self.learner()?.optimizer_state_bytes();
        for l in &mut self.learners {
            l.join_ranks(group.clone())?;
        }
        let link = RankLink::new(group)?;
        let (rank, ranks) = self.learner()?.rank_place();
        let mib = |b: usize| b as f64 / 1048576.0;
        tracing::info!(
            rank,
            ranks,
            optimizer_mib = mib(self.learner()?.optimizer_state_bytes()),
            unsharded_optimizer_mib = mib(whole),
            peak_rss_mib = keel_learner::host_memory::peak_rss_mib().unwrap_or(0.0),
            "learner rank joined: this rank's optimizer shard (OP-7) and memory so far"
        );
        self.ranks = Some(link);
        Ok(())
    }

    /// Rank 0 tells the followers the call it is about to make (LK-1); alone, nothing.
    fn mirror(&self, cmd: impl FnOnce() -> RankCommand) -> Result<(), ActorError> {
        match &self.ranks {
            Some(link) if link.leads() => link.send(&cmd()),
            _ => Ok(()),
        }
    }

    /// The followers' end of the command stream, when this is one.
    pub(crate) fn follower_link(&self) -> Option<&RankLink> {
        self.ranks.as_ref().filter(|l| !l.leads())
    }

    /// Sets the main learner's learning rate to `lr` and scales the others by the same factor;
    /// weights, optimizer state and counters are untouched.
    pub(crate) fn set_lr(&mut self, lr: f64) -> Result<(), ActorError> {
        let factor = lr / self.learner()?.config().lr;
        if factor == 1.0 {
            return Ok(());
        }
        for l in &mut self.learners {
            let scaled = l.config().lr * factor;
            l.set_lr(scaled)?;
        }
        Ok(())
    }

    fn learner(&mut self) -> Result<&mut Learner, ActorError> {
        self.check_not_panicked()?;
        self.learners
            .first_mut()
            .ok_or_else(|| ActorError::Internal("learner used before InitLearner".into()))
    }

    /// LA-6: after a panic the weights may be half updated; nothing reads or writes them again.
    fn check_not_panicked(&self) -> Result<(), ActorError> {
        match &self.panicked {
            Some((during, message)) => Err(ActorError::LearnerPanicked {
                during,
                message: message.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Runs `work` (an update: SFT or RL) with its panics caught (LA-6).
    fn caught<T>(
        &mut self,
        during: &'static str,
        work: impl FnOnce(&mut Self) -> Result<T, ActorError>,
    ) -> Result<T, ActorError> {
        self.check_not_panicked()?;
        match crate::supervision::run_caught(|| work(self)) {
            Ok(result) => result,
            Err(message) => {
                tracing::error!(during, %message, "the learner panicked; it takes no more work");
                self.panicked = Some((during, message.clone()));
                Err(ActorError::LearnerPanicked { during, message })
            }
        }
    }

    /// The weights every generator needs: model 0 and the agent models.
    fn published(&self) -> Result<PublishedWeights, ActorError> {
        let Some(main) = self.learners.first() else {
            return Err(ActorError::Internal(
                "learner used before InitLearner".into(),
            ));
        };
        let extra = self.learners[1..]
            .iter()
            .map(|l| l.weights_safetensors())
            .collect::<Result<Vec<_>, _>>()?;
        let model = main.model();
        let probe = WeightsProbe {
            logp: self
                .learners
                .iter()
                .map(|l| probe_logprobs(l.model()))
                .collect::<Result<Vec<_>, _>>()?,
            device: device_name(model.device()),
            dtype: dtype_name(model.options().kind).into(),
        };
        Ok(PublishedWeights::new(
            main.policy_version(),
            main.weights_safetensors()?,
            extra,
            Some(probe),
        ))
    }
}

impl Actor for LearnerActor {
    type Context = SyncContext<Self>;
}

impl Handler<InitLearner> for LearnerActor {
    type Result = Result<(), ActorError>;

    fn handle(&mut self, msg: InitLearner, _ctx: &mut SyncContext<Self>) -> Self::Result {
        self.init(msg)
    }
}

impl LearnerActor {
    /// Builds the learners (every rank builds its own from the same config, LK-1).
    pub(crate) fn init(&mut self, msg: InitLearner) -> Result<(), ActorError> {
        self.learners.clear();
        self.filters.clear();
        let mut main = Learner::new(msg.model.build()?, msg.cfg, msg.seed)?;
        if let Some(critic) = &msg.critic {
            main.set_critic_model(critic.build_critic()?)?;
        }
        main.set_temperature(msg.temperature)?;
        main.set_lr_horizon(msg.lr_horizon);
        if !msg.agent_models.is_empty() {
            // Model 0 serves every agent not listed by another model.
            let listed: Vec<u32> = msg
                .agent_models
                .iter()
                .flat_map(|m| m.agents.clone())
                .collect();
            let mine: Vec<u32> = (0..64u32).filter(|a| !listed.contains(a)).collect();
            main.set_agent_filter(Some(mine.clone()));
            self.filters.push(Some(mine));
        } else {
            self.filters.push(None);
        }
        self.learners.push(main);
        for (k, m) in msg.agent_models.into_iter().enumerate() {
            // Each model starts from its own seed (different init), then SFT as the main one.
            let seed = crate::seeds::mix_seed(&[msg.seed, 0xa6e7, k as u64 + 1]);
            let mut l = Learner::new(msg.model.reseeded(seed).build()?, m.cfg, seed)?;
            l.set_temperature(msg.temperature)?;
            l.set_lr_horizon(msg.lr_horizon);
            l.set_agent_filter(Some(m.agents.clone()));
            self.filters.push(Some(m.agents));
            self.learners.push(l);
        }
        self.faults = FaultPlan::new(msg.faults);
        self.tokenizer_files = msg.tokenizer_files;
        Ok(())
    }
}

impl Handler<RunSft> for LearnerActor {
    type Result = Result<SftProgress, ActorError>;

    fn handle(&mut self, msg: RunSft, _ctx: &mut SyncContext<Self>) -> Self::Result {
        self.mirror(|| RankCommand::Sft {
            demos: msg.demos.as_ref().clone(),
            first_step: msg.first_step,
            end_step: msg.end_step,
            batch_size: msg.batch_size,
            lr: msg.lr,
            seed: msg.seed,
        })?;
        self.caught("fine-tuning on demonstrations", move |this| {
            this.run_sft(msg)
        })
    }
}

impl LearnerActor {
    /// SF-1: step k trains on the same demonstrations whether the run got there in one go or
    /// resumed: the order before `first_step` is replayed (no training), then steps run until
    /// `end_step` or a stop request at a step boundary (SF-2).
    pub(crate) fn run_sft(&mut self, msg: RunSft) -> Result<SftProgress, ActorError> {
        let device = self.learner()?.model().device();
        let mut order: Vec<usize> = Vec::new();
        let mut progress = SftProgress {
            steps_done: msg.first_step,
            last: StepMetrics::default(),
        };
        for step in 0..msg.end_step {
            let picked = sft_pick(&mut order, &msg, step);
            if step < msg.first_step {
                continue;
            }
            let stop = match &self.ranks {
                Some(link) => link.agree(msg.stop.requested())?, // LK-2
                None => msg.stop.requested(),
            };
            if stop {
                tracing::info!(step, "sft stopped on request");
                break;
            }
            let picked: Vec<(Vec<u32>, Vec<u8>)> =
                picked.into_iter().map(|i| msg.demos[i].clone()).collect();
            let batch = TrainBatch::from_sequences(&picked, device)?;
            // Every agent model learns the whole protocol; RL specialises them.
            for learner in &mut self.learners {
                progress.last = learner.sft_step(&batch, msg.lr)?;
            }
            progress.steps_done = step + 1;
            if step % 25 == 0 || step + 1 == msg.end_step {
                tracing::info!(step, loss = progress.last.loss, "sft");
            }
        }
        Ok(progress)
    }
}

/// The demonstrations SFT step `step` trains on: the next `batch_size` of a shuffled order,
/// refilled with a fresh shuffle (seeded by the run seed and the step) when it runs short.
fn sft_pick(order: &mut Vec<usize>, msg: &RunSft, step: u64) -> Vec<usize> {
    if order.len() < msg.batch_size {
        let mut fresh: Vec<usize> = (0..msg.demos.len()).collect();
        fresh.shuffle(&mut ChaCha8Rng::seed_from_u64(mix_seed(&[
            msg.seed, 0x5f7, step,
        ])));
        order.extend(fresh);
    }
    order.drain(..msg.batch_size.min(order.len())).collect()
}

impl Handler<TrainOn> for LearnerActor {
    type Result = Result<Trained, ActorError>;

    fn handle(&mut self, msg: TrainOn, _ctx: &mut SyncContext<Self>) -> Self::Result {
        self.mirror(|| RankCommand::TrainOn {
            key: msg.key.0.clone(),
            bound: msg.bound,
        })?;
        self.caught("updating the policy", move |this| this.train_on(msg))
    }
}

impl LearnerActor {
    pub(crate) fn train_on(&mut self, msg: TrainOn) -> Result<Trained, ActorError> {
        let fetch = std::time::Instant::now();
        let buf = self.io.block_on(self.store.get_batch(&msg.key))?;
        let get_seconds = fetch.elapsed().as_secs_f64();
        let get_bytes = buf.archive_len() as u64;
        let version = self.learner()?.policy_version();
        let injection = self.inject_faults(version)?;
        let batch = buf.archived();
        let books = BatchBooks::of(batch, version, msg.bound)?;
        let device = self.learner()?.model().device();
        let mut tensors = TrainBatch::from_archived(batch, device)?;
        let poisoned = match injection.nan_logprobs {
            true => Some(self.faults.poisoned_model()),
            false => None,
        };
        let lr = self.learner()?.config().lr;
        let (metrics, refused_models) = self.step_every_model(&mut tensors, version, poisoned)?;
        let weights = self.published()?;
        let n_episodes = books.episodes.max(1) as f64;
        Ok(Trained {
            version: weights.version,
            metrics,
            weights,
            batch_seq: books.batch_seq,
            success_rate: books.successes as f64 / n_episodes,
            invalid_rate: books.invalid as f64 / books.turns.max(1) as f64,
            episode_turns: books.turns as f64 / n_episodes,
            response_length: books.model_tokens as f64 / n_episodes,
            segments_per_episode: batch.trajectories.len() as f64 / n_episodes,
            turn_lags: books.turn_lags,
            task_ids: books.task_ids,
            trajectory_lags: books.trajectory_lags,
            token_lags: books.token_lags,
            get_seconds,
            get_bytes,
            lr,
            refused_models,
        })
    }

    /// FI-2: the faults planned before update `version + 1` (a panic, a blown-up learning
    /// rate); the NaN log-probs are the caller's to apply.
    fn inject_faults(&mut self, version: u64) -> Result<crate::faults::Injection, ActorError> {
        let injection = self.faults.before_update(version);
        if injection.panic {
            // FI-2: a testing aid standing for a bug in the loss code.
            panic!(
                "fault injection: the learner panicked before update {}",
                version + 1
            );
        }
        if let Some(lr) = injection.set_lr {
            tracing::warn!(lr, version, "fault injection: learning rate blown up");
            self.set_lr(lr)?;
        }
        Ok(injection)
    }

    /// One update of every model on `tensors` (LA-4): the main model's statistics folded with
    /// the others' (SM-4), and the agent models whose update was refused as non-finite. A
    /// refused update of the main model is refused for every model (LA-5). FI-2: the model
    /// `poisoned` names gets NaN behaviour log-probs, every other the batch's.
    fn step_every_model(
        &mut self,
        tensors: &mut TrainBatch,
        version: u64,
        poisoned: Option<usize>,
    ) -> Result<(StepMetrics, Vec<(usize, String)>), ActorError> {
        let clean_logp = tensors.behaviour_logp.shallow_clone();
        let nan = match poisoned {
            Some(model) => {
                tracing::warn!(version, model, "fault injection: NaN behaviour log-probs");
                Some(
                    clean_logp
                        .f_full_like(f64::NAN)
                        .map_err(keel_learner::LearnerError::from)?,
                )
            }
            None => None,
        };
        let logp_for = |k: usize| match (&nan, poisoned) {
            (Some(nan), Some(model)) if model == k => nan.shallow_clone(),
            _ => clean_logp.shallow_clone(),
        };
        tensors.behaviour_logp = logp_for(0);
        let mut metrics = self.learner()?.train_step(tensors)?;
        let mut refused_models = Vec::new();
        for (k, other) in self.learners.iter_mut().enumerate().skip(1) {
            tensors.behaviour_logp = logp_for(k);
            match other.train_step(tensors) {
                Ok(m) => metrics.merge_model(&m),
                Err(keel_learner::LearnerError::NonFinite { what }) => {
                    // LA-5, LR-6: its weights stay, its version moves with the others'.
                    other.count_refused_update();
                    tracing::warn!(version, model = k, %what, "an agent model's update was refused as non-finite");
                    refused_models.push((k, what));
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok((metrics, refused_models))
    }
}

/// What a batch says about itself before training on it: its turns' and trajectories' lags
/// behind the learner's version, its tasks, and its episodes' successes, turns and tokens.
struct BatchBooks {
    batch_seq: u64,
    turn_lags: Vec<u64>,
    task_ids: Vec<u64>,
    trajectory_lags: Vec<u64>,
    token_lags: Vec<(u64, u32)>,
    model_tokens: usize,
    successes: usize,
    turns: usize,
    invalid: usize,
    episodes: usize,
}

impl BatchBooks {
    /// The books of `batch` for a learner at `version`; a turn sampled by a newer policy, or
    /// lagging more than `bound` versions, is refused.
    fn of(
        batch: &keel_store::ArchivedRolloutBatch,
        version: u64,
        bound: u64,
    ) -> Result<Self, ActorError> {
        let batch_seq = batch.batch_seq.to_native();
        let mut books = BatchBooks {
            batch_seq,
            turn_lags: Vec::new(),
            task_ids: Vec::new(),
            trajectory_lags: Vec::new(),
            token_lags: Vec::new(),
            model_tokens: 0,
            successes: 0,
            turns: 0,
            invalid: 0,
            episodes: 0,
        };
        for traj in batch.trajectories.iter() {
            books.task_ids.push(traj.task_id.to_native());
            // RB-4: an episode is counted at its first segment.
            if traj.trajectory_id == traj.episode_id {
                books.episodes += 1;
                books.successes += usize::from(traj.final_reward.to_native() >= 1.0);
            }
            let oldest = traj
                .turns
                .iter()
                .map(|t| t.policy_version.to_native())
                .min()
                .unwrap_or(version);
            books.trajectory_lags.push(version.saturating_sub(oldest));
            for turn in traj.turns.iter() {
                let sampled = turn.policy_version.to_native();
                if sampled > version {
                    return Err(ActorError::Resume(format!(
                        "batch {batch_seq} was sampled by policy version {sampled}, newer than the learner's {version}"
                    )));
                }
                let lag = version - sampled;
                if lag > bound {
                    return Err(ActorError::Stale {
                        batch_seq,
                        lag,
                        bound,
                    });
                }
                books.turn_lags.push(lag);
                let n = turn.end.to_native().saturating_sub(turn.start.to_native());
                books.token_lags.push((lag, n));
                books.model_tokens += n as usize;
                books.turns += 1;
                books.invalid += usize::from(turn.invalid_action);
            }
        }
        books.task_ids.sort_unstable();
        books.task_ids.dedup();
        Ok(books)
    }
}

impl Handler<JoinRanks> for LearnerActor {
    type Result = Result<(), ActorError>;

    fn handle(&mut self, msg: JoinRanks, _ctx: &mut SyncContext<Self>) -> Self::Result {
        let group = crate::learner_ranks::join(&msg.0, &msg.1)?;
        self.join_ranks(group)
    }
}

impl Drop for LearnerActor {
    fn drop(&mut self) {
        // LK-3: the followers exit with rank 0's learner (a closed socket ends them too).
        let _ = self.mirror(|| RankCommand::Stop);
    }
}

impl Handler<CurrentWeights> for LearnerActor {
    type Result = Result<PublishedWeights, ActorError>;

    fn handle(&mut self, _msg: CurrentWeights, _ctx: &mut SyncContext<Self>) -> Self::Result {
        self.published()
    }
}

impl Handler<SetLearningRate> for LearnerActor {
    type Result = Result<(), ActorError>;

    fn handle(&mut self, msg: SetLearningRate, _ctx: &mut SyncContext<Self>) -> Self::Result {
        self.mirror(|| RankCommand::SetLr(msg.0))?;
        self.set_lr(msg.0)
    }
}

impl Handler<Snapshot> for LearnerActor {
    type Result = Result<Vec<(String, Vec<u8>)>, ActorError>;

    fn handle(&mut self, _msg: Snapshot, _ctx: &mut SyncContext<Self>) -> Self::Result {
        self.mirror(|| RankCommand::Snapshot)?;
        self.snapshot()
    }
}

impl LearnerActor {
    /// Every file of a checkpoint (a collective with ranks: optimizer shards are gathered).
    pub(crate) fn snapshot(&mut self) -> Result<Vec<(String, Vec<u8>)>, ActorError> {
        let mut files = Vec::new();
        for (k, l) in self.learners.iter_mut().enumerate() {
            files.extend(
                l.state_files()?
                    .into_iter()
                    .map(|(name, bytes)| (model_file(k, &name), bytes)),
            );
        }
        files.extend(self.tokenizer_files.iter().cloned());
        Ok(files)
    }
}

impl Handler<Restore> for LearnerActor {
    type Result = Result<u64, ActorError>;

    fn handle(&mut self, msg: Restore, _ctx: &mut SyncContext<Self>) -> Self::Result {
        self.mirror(|| RankCommand::Restore(msg.0.clone()))?;
        self.restore(msg)
    }
}

impl LearnerActor {
    /// Restores every model from a checkpoint's files; answers the policy version.
    pub(crate) fn restore(&mut self, msg: Restore) -> Result<u64, ActorError> {
        let n = self.learners.len();
        // Check that every model's files are there before anything changes.
        for k in 1..n {
            let prefix = model_file(k, "");
            if !msg.0.iter().any(|(name, _)| name.starts_with(&prefix)) {
                return Err(ActorError::Resume(format!(
                    "the checkpoint has no files of agent model {k} ({prefix}*), but the config has {} agent models",
                    n - 1
                )));
            }
        }
        for k in (0..n).rev() {
            let files: Vec<(String, Vec<u8>)> = msg
                .0
                .iter()
                .filter_map(|(name, bytes)| match k {
                    0 => (!name.starts_with("agent-model-")).then(|| (name.clone(), bytes.clone())),
                    _ => name
                        .strip_prefix(&model_file(k, ""))
                        .map(|rest| (rest.to_string(), bytes.clone())),
                })
                .collect();
            self.learners[k].restore(&files)?;
        }
        let version = self.learner()?.policy_version();
        if self.learners.iter().any(|l| l.policy_version() != version) {
            return Err(ActorError::Resume(
                "the agent models of the checkpoint are at different policy versions".into(),
            ));
        }
        Ok(version)
    }
}

impl Handler<ResetReference> for LearnerActor {
    type Result = Result<Vec<u8>, ActorError>;

    fn handle(&mut self, _msg: ResetReference, _ctx: &mut SyncContext<Self>) -> Self::Result {
        self.mirror(|| RankCommand::ResetReference)?;
        self.reset_reference()
    }
}

impl LearnerActor {
    /// ARMOR: the current policy becomes the reference; answers its weights.
    pub(crate) fn reset_reference(&mut self) -> Result<Vec<u8>, ActorError> {
        let learner = self.learner()?;
        let weights = learner.weights_safetensors()?;
        learner.set_reference(&weights)?;
        Ok(weights)
    }
}

impl Handler<ReferenceWeights> for LearnerActor {
    type Result = Result<Vec<u8>, ActorError>;

    fn handle(&mut self, _msg: ReferenceWeights, _ctx: &mut SyncContext<Self>) -> Self::Result {
        let learner = self.learner()?;
        match learner.reference() {
            Some(r) => Ok(r.to_safetensors()?),
            None => Ok(learner.weights_safetensors()?),
        }
    }
}

impl Handler<LoadReference> for LearnerActor {
    type Result = Result<(), ActorError>;

    fn handle(&mut self, msg: LoadReference, _ctx: &mut SyncContext<Self>) -> Self::Result {
        self.mirror(|| RankCommand::LoadReference(msg.0.clone()))?;
        self.load_reference(&msg.0)
    }
}

impl LearnerActor {
    /// Installs `weights` as the reference policy.
    pub(crate) fn load_reference(&mut self, weights: &[u8]) -> Result<(), ActorError> {
        Ok(self.learner()?.set_reference(weights)?)
    }
}
