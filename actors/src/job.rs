//! A training job: claim a trainer life, start the roles, warm-start or resume, evaluate, run the
//! RL loop, evaluate again. `keel train` runs every role in this process ([`Role::Train`]);
//! `keel trainer` runs the controller and learner here and reaches generator ranks in other
//! processes through work orders in the run root ([`Role::Trainer`], `remote`).
//!
//! Invariants:
//! - JB-1: a run root holding a committed checkpoint is resumed from its newest verifiable one,
//!   never restarted from scratch; the SFT warm start runs only on a run root with no checkpoint.
//! - JB-2: the SFT result is committed as a checkpoint (step 0, tagged `sft` and `reference`)
//!   before any RL, so a crash during RL never repeats the warm start, and the pre-RL evaluation
//!   travels in every later checkpoint's metrics (`eval_success_before`). During SFT, checkpoints
//!   tagged `sft-partial` (every `sft.checkpoint_every` steps, and at a stop request) hold its
//!   progress; a run root whose head is one continues SFT from it (SF-1, SF-2).
//! - JB-3: all store I/O runs on a dedicated I/O runtime; the actix threads only wait on it.
//! - JB-4: a resume verifies every blob of the checkpoint it restores (CP-7); when the head fails
//!   it falls back to the newest verifiable ancestor, says so, and continues the branch from it.
//! - JB-5: `--from <ckpt>` starts a new branch whose first checkpoint's parent is `<ckpt>`; a
//!   branch that already has a head is resumed instead (JB-1), so a crashed branch run restarts
//!   with the same command.
//! - JB-6: a stop request (SIGTERM) ends the loop after the current update with a committed
//!   checkpoint (CT-5); the job then returns without the after-RL evaluation.
//! - JB-7: a corrupt batch found on resume is quarantined (QU-1) and counted; its range stays owed.
//! - JB-8: with `--reference CKPT` and a preset that needs a reference policy, the learner's
//!   reference (KL, ARMOR's mixture and anchor rollouts) is that checkpoint's policy.
//! - JB-9: before anything else the job claims the next trainer life of its branch and fences the
//!   head (LV-1, LV-3); every commit it makes expects the head generation it last saw, and checks
//!   that no newer life exists (LV-2). Two trainers on one branch can never both make progress.
//!   Its batches carry the life in their keys (ST-12); its end is recorded (LV-4).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use actix::{Addr, SyncArbiter};
use bytes::Bytes;
use keel_envs::{demonstrations, task_seed, Env, Split};
use keel_store::{
    CheckpointManifest, DataPosition, ExpectHead, LifeEnd, LifeRecord, NewCheckpoint, RunStore,
    StoreError,
};

use crate::config::TrainConfig;
use crate::controller::{Controller, ControllerSetup, LoopOutcome, ReadyBatch};
use crate::demo_tokens::{render_demonstration, SftSequence};
use crate::env_shard::EnvFactory;
use crate::error::ActorError;
use crate::eval::{self, EvalPlan};
use crate::events::{EventSink, TrainEvent};
use crate::frontier::{plan_resume, Frontier, ResumePlan};
use crate::jsonl::MetricsLog;
use crate::learner_actor::LoadReference;
use crate::learner_actor::{
    init_message, CurrentWeights, JoinRanks, LearnerActor, Restore, RunSft,
};
use crate::learner_ranks::{self, Followers};
use crate::method::{MethodIo, MethodRuntime, REFERENCE_RESET_TAG};
use crate::metrics::TrainMetrics;
use crate::process::{trainer_writer, Process, StopSignal};
use crate::remote::{GeneratorHandle, LifeKeys, StoreBoard};
use crate::setup::{LocalGenerators, ModelSetup};
use crate::stored_batches;
use crate::supervision::RestartBudget;
use crate::tracking::Trackers;
use crate::weights::Board;

pub use crate::setup::select_device;

/// Task ids of SFT demonstrations start here, apart from the RL task order.
const SFT_TASK_OFFSET: u64 = 1 << 32;
/// Batch sequence numbers of evaluations (never stored) start here.
pub const EVAL_BATCH_SEQ: u64 = 1 << 40;

/// Which roles this process runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Role {
    /// Every role in this process (`keel train`).
    #[default]
    Train,
    /// Controller + learner; generators are ranks in other processes (`keel trainer`).
    Trainer,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Train => "train",
            Role::Trainer => "trainer",
        }
    }
}

/// Knobs for tests and embedding (not part of the TOML schema).
#[derive(Clone, Default)]
pub struct JobOptions {
    /// Replaces the environment factory (e.g. with a fault-injecting env).
    pub env_factory: Option<EnvFactory>,
    /// The branch to train on (default `main`, or `from-<id>` with `from`).
    pub branch: Option<String>,
    /// Start a new branch from this checkpoint (JB-5).
    pub from: Option<String>,
    /// Record this checkpoint as the reference anchor (KL / ARMOR) instead of the inherited one.
    pub reference: Option<String>,
    /// Set to end the loop with a checkpoint (JB-6).
    pub stop: StopSignal,
    /// Which roles run here.
    pub role: Role,
}

/// The checkpoint a job starts from, with its verified blobs.
struct StartPoint {
    manifest: CheckpointManifest,
    files: Vec<(String, Bytes)>,
}

/// What a finished job reports.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct JobOutcome {
    /// Held-out success after the warm start, before RL.
    pub eval_before: f64,
    /// Held-out success after RL.
    pub eval_after: f64,
    /// Final policy version.
    pub final_step: u64,
    /// Checkpoint the run resumed from.
    pub resumed_from: Option<String>,
    /// Last committed checkpoint.
    pub last_checkpoint: Option<String>,
    /// Stored batches reused on resume.
    pub reused_batches: usize,
    /// Batches dropped (on resume or for staleness).
    pub dropped_batches: u64,
    /// The branch the run ended on (where its last checkpoint is).
    pub branch: String,
    /// Checkpoints that failed verification on resume (JB-4), newest first.
    pub skipped_checkpoints: Vec<String>,
    /// Corrupt batches quarantined on resume (JB-7).
    pub quarantined_batches: u64,
    /// The loop ended on a stop request (JB-6); no after-RL evaluation was run.
    pub stopped: bool,
    /// Env-shard restarts after panics (SV-1).
    pub env_shard_restarts: u32,
    /// Generator restarts after panics (SV-1).
    pub generator_restarts: u32,
    /// The trainer life this job ran as (JB-9).
    pub life: u64,
}

/// What every part of a job shares.
struct Job {
    cfg: Arc<TrainConfig>,
    /// The branch's store; batches written here carry the life's tag (ST-12).
    store: RunStore,
    io: tokio::runtime::Handle,
    metrics: TrainMetrics,
    events: EventSink,
    options: JobOptions,
    device: tch::Device,
    life: u64,
    /// The branch's store without a writer tag: where the life was claimed (LV-2).
    lives: RunStore,
    /// The head generation after the fence (LV-3).
    head_generation: Option<u64>,
}

/// Runs a training job to completion (or resumes one): every role in this process, or the
/// trainer of separate generator processes (`options.role`).
pub fn run_job(
    cfg: TrainConfig,
    store: RunStore,
    metrics: TrainMetrics,
    events: EventSink,
    options: JobOptions,
) -> Result<JobOutcome, ActorError> {
    cfg.validate()?;
    let device = Process::torch(&cfg)?;
    let process = Process::start()?;
    let io = process.io();
    let branch = match (&options.branch, &options.from) {
        (Some(b), _) => b.clone(),
        (None, Some(from)) => format!("from-{from}"),
        (None, None) => keel_store::DEFAULT_BRANCH.to_string(),
    };
    let lives = store
        .on_branch(&branch)?
        .with_multipart_threshold(cfg.run.checkpoint_multipart_bytes);
    // JB-9: claim the next life and fence the head before reading anything.
    let record =
        LifeRecord::for_this_process(options.role.name(), &cfg.config_hash(), &cfg.to_toml());
    let (life, head_generation) = io.block_on(async {
        let life = lives.claim_life(record).await?;
        let fenced = lives.fence_head().await?;
        Ok::<_, StoreError>((life, fenced))
    })?;
    tracing::info!(life = life.life, branch = %branch, role = options.role.name(), "claimed trainer life");
    let store = lives.clone().with_writer(&trainer_writer(life.life))?;
    let (start, skipped) = io.block_on(find_start(&store, options.from.as_deref()))?;
    let latest = start.as_ref().map(|s| s.manifest.clone());
    let log = Arc::new(Mutex::new(MetricsLog::open(
        store.clone(),
        io.clone(),
        life.life,
        latest.as_ref().map(|m| m.step),
        std::time::Duration::from_millis(cfg.run.metrics_log_flush_ms),
    )?));
    let trackers = Arc::new(Trackers::start(
        crate::tracking::from_config(&cfg, &store, &io, &branch),
        metrics.tracking_dropped.clone(),
    ));
    // TR-3: the log as this life continues it (JL-2), so that trackers log no step twice.
    match io.block_on(crate::jsonl::read_events(&store)) {
        Ok(history) => trackers.replay(&history, &branch),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the metrics log; trackers may log resumed steps again")
        }
    }
    let sink: EventSink = {
        let (log, trackers) = (log.clone(), trackers.clone());
        Arc::new(move |ev: &TrainEvent| {
            if let Ok(v) = serde_json::to_value(ev) {
                if let Ok(mut l) = log.lock() {
                    l.append(&v);
                }
                trackers.offer(&v);
            }
            events(ev)
        })
    };
    let job = Job {
        cfg: Arc::new(cfg),
        store,
        io: io.clone(),
        metrics,
        events: sink,
        options,
        device,
        life: life.life,
        lives: lives.clone(),
        head_generation,
    };
    let result = process
        .run_actors(run_roles(job, start))
        .map(|mut outcome| {
            if outcome.branch.is_empty() {
                outcome.branch = branch; // the loop did not run
            }
            outcome.skipped_checkpoints = skipped;
            outcome.life = life.life;
            outcome
        });
    // HL-2 (keel-store health): once the store has failed, these last writes get a short
    // attempt each instead of a whole retry budget.
    if let Ok(log) = Arc::try_unwrap(log) {
        if let Ok(log) = log.into_inner() {
            log.flush();
        }
    }
    if let Ok(trackers) = Arc::try_unwrap(trackers) {
        trackers.finish();
    }
    io.block_on(record_end(&lives, life.life, &result));
    process.end();
    result
}

/// LV-4: how this life ended (nothing for a superseded life: the branch is another's now).
async fn record_end(lives: &RunStore, life: u64, result: &Result<JobOutcome, ActorError>) {
    let end = match result {
        Ok(o) if o.stopped => LifeEnd::new(life, false, "stopped (SIGTERM) after a checkpoint"),
        Ok(_) => LifeEnd::new(life, true, "finished the run"),
        Err(ActorError::Store(StoreError::Superseded { .. })) => return,
        Err(e) => LifeEnd::new(life, false, &format!("failed: {e}")),
    };
    if let Err(e) = lives.end_life(&end).await {
        tracing::warn!(life, error = %e, "could not record the end of this trainer life");
    }
}

async fn spawn_io<T: Send + 'static>(
    io: &tokio::runtime::Handle,
    fut: impl std::future::Future<Output = Result<T, keel_store::StoreError>> + Send + 'static,
) -> Result<T, ActorError> {
    io.spawn(fut)
        .await
        .map_err(|e| ActorError::Internal(format!("I/O task: {e}")))?
        .map_err(ActorError::from)
}

async fn ask<M, A>(addr: &Addr<A>, msg: M) -> Result<M::Result, ActorError>
where
    A: actix::Actor + actix::Handler<M>,
    A::Context: actix::dev::ToEnvelope<A, M>,
    M: actix::Message + Send + 'static,
    M::Result: Send,
{
    addr.send(msg)
        .await
        .map_err(|e| ActorError::Mailbox(e.to_string()))
}

/// The generators of a job: actors here (`keel train`), or ranks in other processes.
enum Generators {
    Local(LocalGenerators),
    Remote {
        board: Arc<StoreBoard>,
        handles: Vec<Arc<dyn GeneratorHandle>>,
    },
}

impl Generators {
    fn start(job: &Job, model: &ModelSetup) -> Result<Generators, ActorError> {
        let cfg = &job.cfg;
        let n = cfg.rollout.generators;
        match job.options.role {
            Role::Train => Ok(Generators::Local(LocalGenerators::start(
                cfg,
                model,
                &job.store,
                &job.io,
                job.options.env_factory.clone(),
                0..n as u32,
                false,
                &job.options.stop,
            )?)),
            Role::Trainer => {
                // SB-3: an admitted order is at most `bound` versions behind (AS-1).
                let keep = cfg.staleness_bound() + 2;
                let board = StoreBoard::start(
                    job.lives.clone(),
                    &job.io,
                    job.life,
                    keep,
                    job.metrics.clone(),
                );
                let keys = LifeKeys::new(&job.lives, job.life);
                let handles = crate::remote::handle::remote_ranks(
                    n,
                    &keys,
                    &job.lives,
                    &job.io,
                    &board,
                    &cfg.distributed,
                    &job.metrics,
                );
                let lives = job.lives.clone();
                let life = job.life;
                job.io.spawn(async move {
                    match lives.prune_older_lives_weights(life).await {
                        Ok(n) if n > 0 => {
                            tracing::info!(objects = n, "pruned weights of earlier trainer lives")
                        }
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!(error = %e, "could not prune weights of earlier lives")
                        }
                    }
                });
                Ok(Generators::Remote { board, handles })
            }
        }
    }

    fn board(&self) -> Arc<dyn Board> {
        match self {
            Generators::Local(l) => Arc::new(l.board.clone()),
            Generators::Remote { board, .. } => board.clone(),
        }
    }

    fn handles(&self) -> Vec<Arc<dyn GeneratorHandle>> {
        match self {
            Generators::Local(l) => l
                .generators
                .iter()
                .map(|g| Arc::new(g.clone()) as Arc<dyn GeneratorHandle>)
                .collect(),
            Generators::Remote { handles, .. } => handles.clone(),
        }
    }

    fn budgets(&self) -> Vec<RestartBudget> {
        match self {
            Generators::Local(l) => vec![l.env_budget.clone(), l.gen_budget.clone()],
            Generators::Remote { .. } => Vec::new(),
        }
    }
}

/// Where RL starts: the restored or warm-started learner's version, frontier and lineage.
struct RlStart {
    version: u64,
    frontier: Frontier,
    /// The data position of the checkpoint resumed from (default on a fresh start): which stored
    /// batches the resume reads (DF-4).
    resumed_data: DataPosition,
    parent: Option<String>,
    reference: Option<String>,
    method_state: BTreeMap<String, String>,
    carried: BTreeMap<String, f64>,
    eval_before: f64,
    resumed_from: Option<String>,
    /// The head generation after the SFT root commit (LV-3).
    head_generation: Option<u64>,
}

async fn run_roles(job: Job, start: Option<StartPoint>) -> Result<JobOutcome, ActorError> {
    let model = ModelSetup::prepare(&job.cfg, &job.io, job.device).await?;
    // LK-3: the followers live as long as this run's learner.
    let (learner, mut followers) = start_learner(&job, &model).await?;
    let result = run_with_learner(job, &model, learner, start).await;
    match (result, followers.as_mut()) {
        (Err(e), Some(followers)) => Err(followers.blame(e)),
        (result, _) => result,
    }
}

/// The run on a started learner (and its ranks): warm start or restore, RL, the last evaluation.
async fn run_with_learner(
    job: Job,
    model: &ModelSetup,
    learner: Addr<LearnerActor>,
    start: Option<StartPoint>,
) -> Result<JobOutcome, ActorError> {
    let cfg = job.cfg.clone();
    let generators = Generators::start(&job, model)?;
    let (board, handles) = (generators.board(), generators.handles());
    let warm = match start {
        // SF-1: a run stopped or killed during SFT continues it from its last SFT checkpoint.
        Some(start) if start.manifest.tags.iter().any(|t| t == SFT_PARTIAL_TAG) => {
            let resume = sft_resume(&job, &learner, start).await?;
            warm_start(&job, model, &learner, &board, &handles, Some(resume)).await?
        }
        Some(start) => WarmStart::Ready(Box::new(restore(&job, &learner, start).await?)),
        None => warm_start(&job, model, &learner, &board, &handles, None).await?,
    };
    let mut rl = match warm {
        WarmStart::Ready(rl) => *rl,
        WarmStart::Stopped { checkpoint } => {
            // SF-2, JB-6, RO-13: stopped during SFT or the evaluation before RL, with what
            // was committed.
            return Ok(JobOutcome {
                eval_before: f64::NAN,
                eval_after: f64::NAN,
                last_checkpoint: checkpoint,
                stopped: true,
                ..JobOutcome::default()
            });
        }
    };
    board.publish(ask(&learner, CurrentWeights).await??);
    if let (Some(id), true) = (&job.options.reference, cfg.learner.keeps_reference()) {
        // JB-8: `--reference CKPT` makes that checkpoint's policy the reference (KL, ARMOR).
        let (s, id) = (job.store.clone(), id.clone());
        let weights = spawn_io(&job.io, async move {
            let manifest = s.checkpoint(&id).await?;
            s.read_checkpoint_file(&manifest, "model.safetensors").await
        })
        .await?;
        ask(&learner, LoadReference(weights.to_vec())).await??;
    }
    // The method's runtime, started from what the checkpoint's method_state names (MR-1: ARMOR
    // publishes the reference for its anchors, WB-4; PATS loads its bank, MS-2; RTPO its tree).
    let mut method = crate::method::select(&cfg);
    let method_io = method_io(&job, &learner, &board);
    method
        .start(&method_io, model, &rl.method_state, rl.version)
        .await?;
    let (reuse, dropped_on_resume, quarantined) =
        plan_reuse(&job, &mut rl, method.as_ref()).await?;
    let mut outcome = JobOutcome {
        eval_before: rl.eval_before,
        resumed_from: rl.resumed_from.clone(),
        reused_batches: reuse.len(),
        quarantined_batches: quarantined,
        ..JobOutcome::default()
    };
    let dropped_count = dropped_on_resume.len() as u64;
    let (tx, rx) = tokio::sync::oneshot::channel::<Result<LoopOutcome, ActorError>>();
    let setup = ControllerSetup {
        cfg: cfg.clone(),
        store: job.store.clone(),
        io: job.io.clone(),
        metrics: job.metrics.clone(),
        board: board.clone(),
        generators: handles.clone(),
        learner: learner.clone(),
        budgets: generators.budgets(),
        events: job.events.clone(),
        version: rl.version,
        frontier: rl.frontier,
        reuse,
        parent_checkpoint: rl.parent,
        reference: rl.reference,
        carried_metrics: rl.carried,
        dropped_on_resume,
        stop: job.options.stop.clone(),
        method_state: rl.method_state,
        method,
        life: (job.life, job.lives.clone()),
        head_generation: rl.head_generation,
        done: tx,
    };
    actix::Actor::start(Controller::new(setup));
    let loop_outcome = rx
        .await
        .map_err(|_| ActorError::Internal("controller stopped without an answer".into()))??;
    outcome.final_step = loop_outcome.version;
    outcome.last_checkpoint = loop_outcome.last_checkpoint;
    outcome.dropped_batches = loop_outcome.dropped_batches + dropped_count;
    outcome.branch = loop_outcome.branch;
    if loop_outcome.stopped {
        outcome.stopped = true;
        outcome.eval_after = f64::NAN;
        return Ok(outcome);
    }
    let after = evaluate(
        &handles,
        &cfg,
        loop_outcome.version,
        "after_rl",
        &job.events,
    )
    .await;
    outcome.eval_after = match after {
        // RO-13: the run's last checkpoint is committed; only the evaluation is lost.
        Err(ActorError::Interrupted) => {
            outcome.stopped = true;
            return Ok(outcome);
        }
        other => other?,
    };
    job.metrics.eval_success.set(outcome.eval_after);
    if let Generators::Local(local) = &generators {
        outcome.env_shard_restarts = local.env_budget.used();
        outcome.generator_restarts = local.gen_budget.used();
    }
    drop(generators);
    Ok(outcome)
}

/// The learner actor, initialised from the config, and the learner ranks it leads (LK-1):
/// started here on this machine unless a launcher started them (`WORLD_SIZE`).
async fn start_learner(
    job: &Job,
    model: &ModelSetup,
) -> Result<(Addr<LearnerActor>, Option<Followers>), ActorError> {
    let cfg = &job.cfg;
    let learner = {
        let (s, io) = (job.store.clone(), job.io.clone());
        SyncArbiter::start(1, move || LearnerActor::new(s.clone(), io.clone()))
    };
    ask(&learner, init_message(cfg, model, job.device)?).await??;
    if cfg.learner.ranks == 1 {
        return Ok((learner, None));
    }
    learner_ranks::check_device(job.device)?;
    let followers = match learner_ranks::launched_externally() {
        true => None,
        false => Some(Followers::spawn(
            cfg.learner.ranks,
            job.store.root_url(),
            job.store.branch(),
        )?),
    };
    let at = learner_ranks::rendezvous(cfg, 0, job.device)?;
    tracing::info!(ranks = at.world, host = %at.host, port = at.port, "learner rank 0: waiting for the other ranks");
    let joined = ask(&learner, JoinRanks(at, cfg.config_hash())).await?;
    match (joined, followers) {
        (Err(e), Some(mut followers)) => Err(followers.blame(e)),
        (joined, followers) => joined.map(|()| (learner, followers)),
    }
}

/// Restores the learner from the start checkpoint (JB-1, JB-4, JB-5).
async fn restore(
    job: &Job,
    learner: &Addr<LearnerActor>,
    StartPoint { manifest, files }: StartPoint,
) -> Result<RlStart, ActorError> {
    let files = files.into_iter().map(|(n, b)| (n, b.to_vec())).collect();
    let version = ask(learner, Restore(files)).await??;
    if version != manifest.policy_version {
        return Err(ActorError::Resume(format!(
            "checkpoint {} says policy version {} but its learner state is at {version}",
            manifest.id, manifest.policy_version
        )));
    }
    if manifest.config_hash != job.cfg.config_hash() {
        tracing::warn!(checkpoint = %manifest.id, "resuming under a config that differs from the checkpoint's");
    }
    let eval_before = manifest
        .metrics
        .get("eval_success_before")
        .copied()
        .unwrap_or(f64::NAN);
    // MS-3: a checkpoint taken at an ARMOR reference reset is itself the reference of what
    // follows it (its manifest names the reference before the reset).
    let reset_here = manifest.tags.iter().any(|t| t == REFERENCE_RESET_TAG);
    let reference = job
        .options
        .reference
        .clone()
        .or_else(|| reset_here.then(|| manifest.id.clone()))
        .or_else(|| manifest.reference.clone())
        .or_else(|| Some(manifest.id.clone()));
    Ok(RlStart {
        version,
        frontier: Frontier {
            next_task: manifest.data.next_task_index,
            pending: manifest.data.pending_tasks.clone(),
            next_batch_seq: manifest.data.next_batch_seq,
        },
        resumed_data: manifest.data.clone(),
        parent: Some(manifest.id.clone()),
        reference,
        method_state: manifest.data.method_state.clone(),
        carried: BTreeMap::from([("eval_success_before".to_string(), eval_before)]),
        eval_before,
        resumed_from: Some(manifest.id),
        // `--from` starts a branch with no head yet; a resumed branch's head was fenced.
        head_generation: job.head_generation,
    })
}

/// The SFT warm start on a run root with no checkpoint (JB-2): demonstrations (PATS: the seed
/// bank and scaffolded ones), SFT, the pre-RL evaluation and the root checkpoint.
async fn warm_start(
    job: &Job,
    model: &ModelSetup,
    learner: &Addr<LearnerActor>,
    board: &Arc<dyn Board>,
    generators: &[Arc<dyn GeneratorHandle>],
    resume: Option<SftResume>,
) -> Result<WarmStart, ActorError> {
    let cfg = &job.cfg;
    let demos = make_demos(cfg, &model.tokenizer, &model.codec)?;
    let mut data = DataPosition::default();
    // The method's SFT sequences (PATS, PS-1/2: the seed bank, which the root checkpoint names
    // so that every life of the run starts RL from it).
    let demos: Demos = crate::method::select(cfg)
        .sft_demos(
            &method_io(job, learner, board),
            model,
            demos,
            &mut data.method_state,
        )
        .await?;
    let sft = run_sft(job, learner, Arc::new(demos), resume).await?;
    if sft.stopped {
        return Ok(WarmStart::Stopped {
            checkpoint: sft.parent,
        });
    }
    (job.events)(&TrainEvent::SftDone {
        steps: cfg.sft.steps,
        loss: sft.loss,
    });
    board.publish(ask(learner, CurrentWeights).await??);
    let eval_before = match evaluate(generators, cfg, 0, "before_rl", &job.events).await {
        // RO-13: a stop during the evaluation before RL ends the job with what is committed.
        Err(ActorError::Interrupted) => {
            return Ok(WarmStart::Stopped {
                checkpoint: sft.parent,
            })
        }
        other => other?,
    };
    job.metrics.eval_success.set(eval_before);
    let carried = BTreeMap::from([("eval_success_before".to_string(), eval_before)]);
    let files = ask(learner, crate::learner_actor::Snapshot).await??;
    let method_state = data.method_state.clone();
    let ckpt = NewCheckpoint {
        parent: sft.parent,
        step: 0,
        policy_version: 0,
        config_hash: cfg.config_hash(),
        reference: None,
        tags: vec![
            "sft".into(),
            "reference".into(),
            crate::guard::HEALTHY_TAG.into(),
        ],
        data,
        metrics: carried.clone(),
        files: files
            .into_iter()
            .map(|(n, b)| (n, Bytes::from(b)))
            .collect(),
    };
    let manifest = commit_sft(job, ckpt, sft.generation).await?;
    Ok(WarmStart::Ready(Box::new(RlStart {
        version: 0,
        frontier: Frontier::default(),
        resumed_data: DataPosition::default(),
        parent: Some(manifest.id.clone()),
        reference: Some(manifest.id),
        method_state,
        carried,
        eval_before,
        resumed_from: None,
        head_generation: Some(sft.generation.map_or(1, |g| g + 1)),
    })))
}

/// The tag of a checkpoint taken during SFT (SF-1): its `sft_steps` metric says how far SFT got.
pub const SFT_PARTIAL_TAG: &str = "sft-partial";

/// What the warm start ended with.
enum WarmStart {
    /// SFT is done and its checkpoint committed: RL starts.
    Ready(Box<RlStart>),
    /// A stop request ended SFT (SF-2) or the evaluation before RL (RO-13) early.
    Stopped {
        /// The SFT checkpoint committed by then, if any.
        checkpoint: Option<String>,
    },
}

/// An SFT run continued from an `sft-partial` checkpoint (SF-1).
struct SftResume {
    steps_done: u64,
    checkpoint: String,
}

/// How SFT ended: the loss, the newest SFT checkpoint and the head generation after it.
struct SftDone {
    loss: f64,
    parent: Option<String>,
    generation: Option<u64>,
    stopped: bool,
}

/// Restores the learner from an `sft-partial` checkpoint (model and optimizer state, SF-1).
async fn sft_resume(
    job: &Job,
    learner: &Addr<LearnerActor>,
    StartPoint { manifest, files }: StartPoint,
) -> Result<SftResume, ActorError> {
    let files = files.into_iter().map(|(n, b)| (n, b.to_vec())).collect();
    ask(learner, Restore(files)).await??;
    let steps_done = manifest.metrics.get("sft_steps").copied().unwrap_or(0.0) as u64;
    tracing::info!(checkpoint = %manifest.id, steps_done, "continuing SFT from its checkpoint");
    (job.events)(&TrainEvent::Resumed {
        checkpoint: manifest.id.clone(),
        step: 0,
        reused_batches: 0,
        dropped_batches: 0,
    });
    Ok(SftResume {
        steps_done,
        checkpoint: manifest.id,
    })
}

/// SFT in chunks of `sft.checkpoint_every` steps, each followed by an `sft-partial` checkpoint,
/// and one at a stop request (SF-1, SF-2).
async fn run_sft(
    job: &Job,
    learner: &Addr<LearnerActor>,
    demos: Arc<Vec<(Vec<u32>, Vec<u8>)>>,
    resume: Option<SftResume>,
) -> Result<SftDone, ActorError> {
    let cfg = &job.cfg;
    let mut done = SftDone {
        loss: f64::NAN,
        generation: resume.as_ref().and(job.head_generation),
        parent: resume.as_ref().map(|r| r.checkpoint.clone()),
        stopped: false,
    };
    let mut step = resume.map_or(0, |r| r.steps_done);
    let every = match cfg.sft.checkpoint_every {
        0 => cfg.sft.steps,
        n => n,
    };
    while step < cfg.sft.steps && !done.stopped {
        let end = ((step / every + 1) * every).min(cfg.sft.steps);
        let msg = RunSft {
            demos: demos.clone(),
            first_step: step,
            end_step: end,
            batch_size: cfg.sft.batch_size,
            lr: cfg.sft.lr,
            seed: cfg.run.seed,
            stop: job.options.stop.clone(),
        };
        let progress = ask(learner, msg).await??;
        (step, done.loss) = (progress.steps_done, progress.last.loss);
        done.stopped = step < end;
        if step < cfg.sft.steps && (done.stopped || cfg.sft.checkpoint_every > 0) {
            let files = ask(learner, crate::learner_actor::Snapshot).await??;
            let ckpt = NewCheckpoint {
                parent: done.parent.clone(),
                step: 0,
                policy_version: 0,
                config_hash: cfg.config_hash(),
                reference: None,
                tags: vec![SFT_PARTIAL_TAG.into()],
                data: DataPosition::default(),
                metrics: BTreeMap::from([("sft_steps".to_string(), step as f64)]),
                files: files
                    .into_iter()
                    .map(|(n, b)| (n, Bytes::from(b)))
                    .collect(),
            };
            let manifest = commit_sft(job, ckpt, done.generation).await?;
            done.parent = Some(manifest.id);
            done.generation = Some(done.generation.map_or(1, |g| g + 1));
        }
    }
    Ok(done)
}

/// Commits an SFT checkpoint expecting the head at `generation` (`None`: no head yet), as the
/// newest life only (LV-2, LV-3).
async fn commit_sft(
    job: &Job,
    ckpt: NewCheckpoint,
    generation: Option<u64>,
) -> Result<CheckpointManifest, ActorError> {
    let (s, lives, life) = (job.store.clone(), job.lives.clone(), job.life);
    let manifest = spawn_io(&job.io, async move {
        lives.check_life(life).await?;
        let branch = s.branch().to_string();
        s.commit_checkpoint_on(&branch, ckpt, ExpectHead::Generation(generation))
            .await
    })
    .await?;
    job.metrics.checkpoints.inc();
    (job.events)(&TrainEvent::Checkpoint {
        id: manifest.id.clone(),
        step: 0,
        parent: manifest.parent.clone(),
    });
    Ok(manifest)
}

/// DF-2: accounts for every batch already in the store and picks those the loop trains first.
/// Returns them, the batch seqs dropped (recorded in the first checkpoint, CT-6) and how many
/// corrupt batches were quarantined (JB-7); `rl.frontier` becomes the plan's.
async fn plan_reuse(
    job: &Job,
    rl: &mut RlStart,
    method: &dyn MethodRuntime,
) -> Result<(Vec<ReadyBatch>, Vec<u64>, u64), ActorError> {
    let cfg = &job.cfg;
    let (store, data) = (job.store.clone(), rl.resumed_data.clone());
    let scan = spawn_io(
        &job.io,
        async move { stored_batches::scan(&store, &data).await },
    )
    .await?;
    for (key, reason) in &scan.quarantined {
        job.metrics.store_quarantined.inc_for("batch", 1);
        eprintln!("warning: {reason}; moved {key} to quarantine/, its tasks are regenerated");
    }
    tracing::info!(
        listed = scan.listed,
        read = scan.read,
        "resume: read the stored batches the checkpoint's index names (DF-4)"
    );
    let quarantined = scan.quarantined.len() as u64;
    let found = scan.found;
    let mut plan = plan_resume(
        &rl.frontier,
        rl.version,
        cfg.staleness_bound(),
        cfg.rollout.tasks_per_batch as u64,
        found,
    );
    let not_reused = if method.reuses_stored_batches() {
        Vec::new()
    } else {
        sample_again(&mut plan, &rl.frontier)
    };
    let version = rl.version;
    report_dropped(job, &plan, &not_reused, version);
    if let Some(id) = &rl.resumed_from {
        (job.events)(&TrainEvent::Resumed {
            checkpoint: id.clone(),
            step: version,
            reused_batches: plan.reuse.len(),
            dropped_batches: plan.dropped.len(),
        });
    }
    rl.frontier = plan.frontier;
    let reuse = plan
        .reuse
        .iter()
        .map(|b| {
            ReadyBatch::plain(
                keel_store::BatchKey(b.key.clone()),
                b.batch_seq,
                b.first_task,
            )
        })
        .collect();
    Ok((
        reuse,
        plan.dropped.iter().map(|d| d.batch_seq).collect(),
        quarantined,
    ))
}

/// A method that samples its ranges again after a resume (MS-1: sibling batches lost with a
/// crash are branched again from the stored trunk; MS-2: a PATS review needs a batch's rollout
/// groups, which the stored batch does not carry) reuses no stored batch; the frontier stays the
/// checkpoint's. Answers the seqs of the batches not reused.
fn sample_again(plan: &mut ResumePlan, saved: &Frontier) -> Vec<u64> {
    let reused: Vec<_> = plan.reuse.drain(..).collect();
    if reused.is_empty() {
        return Vec::new();
    }
    let not_reused = reused.iter().map(|b| b.batch_seq).collect();
    plan.dropped.extend(reused);
    plan.frontier = Frontier {
        next_batch_seq: plan.frontier.next_batch_seq,
        ..saved.clone()
    };
    not_reused
}

/// A `Dropped` event for every batch the resume does not train on (DF-2).
fn report_dropped(job: &Job, plan: &ResumePlan, not_reused: &[u64], version: u64) {
    for d in &plan.dropped {
        job.metrics.batches_dropped.inc();
        let reason = if not_reused.contains(&d.batch_seq) {
            format!(
                "{} samples it again after a resume instead of reusing stored batches",
                job.cfg.learner.algo.name()
            )
        } else {
            format!(
                "sampled by versions {}..={} which the restored version {version} cannot use",
                d.oldest_version, d.newest_version
            )
        };
        (job.events)(&TrainEvent::Dropped {
            batch_seq: d.batch_seq,
            reason,
        });
    }
}

/// SFT demonstrations: `(tokens, loss mask)` each.
type Demos = Vec<SftSequence>;

/// The SFT demonstrations that fit the context: task seed, text, tokens (DT-1).
fn make_demos(
    cfg: &TrainConfig,
    tokenizer: &keel_envs::Tokenizer,
    codec: &keel_learner::hf::ChatCodec,
) -> Result<Vec<(u64, keel_envs::Demonstration, SftSequence)>, ActorError> {
    if cfg.sft.steps == 0 {
        return Ok(Vec::new());
    }
    let seeds: Vec<u64> = (0..cfg.sft.demos as u64)
        .map(|i| task_seed(Split::Train, SFT_TASK_OFFSET + i))
        .collect();
    // As many instances as the rollout runs env calls at once: an env whose episodes wait on
    // something (an agent program, a server) is demonstrated as concurrently as it is sampled.
    let workers = (cfg.env_concurrency(1) * cfg.rollout.env_shards).clamp(1, seeds.len().max(1));
    let builder = keel_envs::EnvBuilder::new(&cfg.env_config())?;
    let mut envs: Vec<Box<dyn Env>> = (0..workers)
        .map(|_| builder.build())
        .collect::<Result<_, _>>()?;
    let mut refs: Vec<&mut dyn Env> = Vec::with_capacity(workers);
    for env in &mut envs {
        refs.push(env.as_mut());
    }
    tracing::info!(demos = seeds.len(), workers, env = %cfg.env.name, "SFT: demonstrating");
    let demos = demonstrations(&mut refs, tokenizer, &seeds, cfg.sft.noise, cfg.run.seed)?;
    // A demonstration longer than the model's context cannot be trained on: leave it out.
    let total = demos.len();
    let mut fit = Vec::with_capacity(total);
    for (seed, d) in seeds.into_iter().zip(demos) {
        let rendered = render_demonstration(codec, &d, "")?;
        if rendered.0.len() <= cfg.model.context_len {
            fit.push((seed, d, rendered));
        }
    }
    if fit.len() < total {
        tracing::warn!(
            kept = fit.len(),
            total,
            context_len = cfg.model.context_len,
            "SFT: demonstrations longer than model.context_len are left out"
        );
    }
    if fit.is_empty() {
        return Err(crate::config::ConfigError::OutOfRange {
            key: "model.context_len".into(),
            reason: format!(
                "no SFT demonstration of env {} fits in {} tokens: raise it",
                cfg.env.name, cfg.model.context_len
            ),
        }
        .into());
    }
    Ok(fit)
}

/// Where the job starts: this branch's newest verifiable checkpoint (JB-1, JB-4), else the
/// `--from` checkpoint (JB-5), else nothing (SFT warm start). Also the ids skipped on the way.
async fn find_start(
    store: &RunStore,
    from: Option<&str>,
) -> Result<(Option<StartPoint>, Vec<String>), ActorError> {
    if let Some(rp) = store.resume_point().await? {
        let skipped: Vec<String> = rp.skipped.iter().map(|s| s.id.clone()).collect();
        for s in &rp.skipped {
            eprintln!(
                "warning: checkpoint {} failed verification ({}); resuming from its newest verifiable ancestor {}",
                s.id, s.reason, rp.manifest.id
            );
        }
        if let Some(from) = from {
            if from != rp.manifest.id {
                tracing::warn!(branch = store.branch(), from, "the branch already has checkpoints; resuming it (--from only starts a new branch)");
            }
        }
        return Ok((
            Some(StartPoint {
                manifest: rp.manifest,
                files: rp.files,
            }),
            skipped,
        ));
    }
    let Some(from) = from else {
        return Ok((None, Vec::new()));
    };
    let manifest = store.checkpoint(from).await.map_err(|e| match e {
        StoreError::NotFound { .. } => ActorError::Resume(format!(
            "--from {from}: no such checkpoint in {}; see `keel ckpt list`",
            store.root_url()
        )),
        e => e.into(),
    })?;
    let files = store.verify_checkpoint(&manifest).await?;
    tracing::info!(
        from,
        branch = store.branch(),
        "starting a new branch from a checkpoint"
    );
    Ok((Some(StartPoint { manifest, files }), Vec::new()))
}

/// Held-out evaluation of the published weights (`crate::eval`, EV-4..6): pass@1 (greedy) and
/// avg@k (sampled); returns pass@1, the run's eval success.
async fn evaluate(
    generators: &[Arc<dyn GeneratorHandle>],
    cfg: &TrainConfig,
    version: u64,
    phase: &str,
    events: &EventSink,
) -> Result<f64, ActorError> {
    let plan = EvalPlan::of(cfg, EVAL_BATCH_SEQ + 2 * version);
    let report = eval::evaluate(generators, &plan).await?;
    events(&TrainEvent::Eval {
        phase: phase.into(),
        version,
        success: report.pass_at_1(),
        episodes: report.tasks,
        decoding: "greedy".into(),
        avg_at_k: report.avg_at_k(),
        samples: report.samples,
        temperature: report.temperature,
    });
    Ok(report.pass_at_1())
}

/// What the method's hooks may reach at the RL start and the warm start (MR-3: this life's tag).
fn method_io(job: &Job, learner: &Addr<LearnerActor>, board: &Arc<dyn Board>) -> MethodIo {
    MethodIo {
        cfg: job.cfg.clone(),
        store: job.store.clone(),
        io: job.io.clone(),
        learner: learner.clone(),
        board: board.clone(),
        life_tag: crate::process::life_tag(),
    }
}
