//! A whole training job in one process: start the actors, warm-start or resume, evaluate, run the
//! RL loop, evaluate again.
//!
//! Invariants:
//! - JB-1: a run root holding a committed checkpoint is resumed from its newest verifiable one,
//!   never restarted from scratch; the SFT warm start runs only on a run root with no checkpoint.
//! - JB-2: the SFT result is committed as a checkpoint (step 0, tagged `sft` and `reference`)
//!   before any RL, so a crash during RL never repeats the warm start, and the pre-RL evaluation
//!   travels in every later checkpoint's metrics (`eval_success_before`).
//! - JB-3: all store I/O runs on a dedicated I/O runtime; the actix threads only wait on it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use actix::{Addr, Supervisor, SyncArbiter};
use bytes::Bytes;
use keel_envs::{demonstrations, make_env, task_seed, Env, Split, Tokenizer};
use keel_store::{CheckpointManifest, DataPosition, NewCheckpoint, RunStore};

use crate::config::TrainConfig;
use crate::controller::{Controller, ControllerSetup, LoopOutcome, ReadyBatch};
use crate::env_shard::{EnvFactory, EnvShard};
use crate::error::ActorError;
use crate::events::{EventSink, TrainEvent};
use crate::frontier::{plan_resume, FoundBatch, Frontier};
use crate::generator::{Generate, Generator, GeneratorSetup, Purpose};
use crate::jsonl::MetricsLog;
use crate::learner_actor::{CurrentWeights, InitLearner, LearnerActor, Restore, RunSft};
use crate::metrics::TrainMetrics;
use crate::rollout::TaskRef;
use crate::supervision::RestartBudget;
use crate::weights::WeightBoard;

/// Task ids of SFT demonstrations start here, apart from the RL task order.
const SFT_TASK_OFFSET: u64 = 1 << 32;
/// Batch sequence numbers of evaluations (never stored) start here.
const EVAL_BATCH_SEQ: u64 = 1 << 40;
/// Restarts allowed per actor kind before the run fails.
const RESTART_BUDGET: u32 = 16;

/// Knobs for tests and embedding (not part of the TOML schema).
#[derive(Clone, Default)]
pub struct JobOptions {
    /// Replaces the environment factory (e.g. with a fault-injecting env).
    pub env_factory: Option<EnvFactory>,
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
}

/// Picks the torch device for `run.device`.
pub fn select_device(name: &str) -> Result<tch::Device, ActorError> {
    match name {
        "cpu" => Ok(tch::Device::Cpu),
        "cuda" if tch::Cuda::is_available() => Ok(tch::Device::Cuda(0)),
        "cuda" => Err(ActorError::Resume("run.device = \"cuda\" but no CUDA device is available".into())),
        _ => Ok(tch::Device::cuda_if_available()),
    }
}

/// Runs a training job to completion (or resumes one) in this process.
pub fn run_job(
    cfg: TrainConfig,
    store: RunStore,
    metrics: TrainMetrics,
    events: EventSink,
    options: JobOptions,
) -> Result<JobOutcome, ActorError> {
    cfg.validate()?;
    if cfg.run.threads > 0 {
        tch::set_num_threads(cfg.run.threads as i32);
    }
    let device = select_device(&cfg.run.device)?;
    let io_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("keel-io")
        .enable_all()
        .build()
        .map_err(|e| ActorError::Internal(format!("cannot start the I/O runtime: {e}")))?;
    let io = io_runtime.handle().clone();
    let latest = io.block_on(store.latest_checkpoint())?;
    let log = Arc::new(Mutex::new(MetricsLog::open(store.clone(), io.clone(), latest.as_ref().map(|m| m.step))));
    let sink: EventSink = {
        let log = log.clone();
        Arc::new(move |ev: &TrainEvent| {
            if let (Ok(mut l), Ok(v)) = (log.lock(), serde_json::to_value(ev)) {
                l.append(&v);
            }
            events(ev)
        })
    };
    let cfg = Arc::new(cfg);
    let system = actix::System::new();
    let result = system.block_on(run_in_system(cfg, store, io.clone(), metrics, sink, options, latest, device));
    actix::System::current().stop();
    drop(system);
    if let Ok(log) = Arc::try_unwrap(log) {
        if let Ok(log) = log.into_inner() {
            log.flush();
        }
    }
    io_runtime.shutdown_timeout(std::time::Duration::from_secs(10));
    result
}

async fn spawn_io<T: Send + 'static>(
    io: &tokio::runtime::Handle,
    fut: impl std::future::Future<Output = Result<T, keel_store::StoreError>> + Send + 'static,
) -> Result<T, ActorError> {
    io.spawn(fut).await.map_err(|e| ActorError::Internal(format!("I/O task: {e}")))?.map_err(ActorError::from)
}

async fn ask<M, A>(addr: &Addr<A>, msg: M) -> Result<M::Result, ActorError>
where
    A: actix::Actor + actix::Handler<M>,
    A::Context: actix::dev::ToEnvelope<A, M>,
    M: actix::Message + Send + 'static,
    M::Result: Send,
{
    addr.send(msg).await.map_err(|e| ActorError::Mailbox(e.to_string()))
}

#[allow(clippy::too_many_arguments)]
async fn run_in_system(
    cfg: Arc<TrainConfig>,
    store: RunStore,
    io: tokio::runtime::Handle,
    metrics: TrainMetrics,
    events: EventSink,
    options: JobOptions,
    latest: Option<CheckpointManifest>,
    device: tch::Device,
) -> Result<JobOutcome, ActorError> {
    let tokenizer = Arc::new(Tokenizer::calc());
    let model_cfg = cfg.model_config(tokenizer.vocab_size());
    let (env_name, n_ops) = (cfg.env.name.clone(), cfg.env.n_ops);
    make_env(&env_name, n_ops)?; // fail early on a bad env name
    let factory: EnvFactory = match options.env_factory {
        Some(f) => f,
        None => Arc::new(move || make_env(&env_name, n_ops).unwrap_or_else(|e| panic!("env factory: {e}"))),
    };
    let env_budget = RestartBudget::new("env_shard", RESTART_BUDGET);
    let gen_budget = RestartBudget::new("generator", RESTART_BUDGET);
    let shards: Vec<Addr<EnvShard>> = (0..cfg.rollout.env_shards)
        .map(|_| {
            let (f, b) = (factory.clone(), env_budget.clone());
            Supervisor::start(move |_| EnvShard::new(f, b))
        })
        .collect();

    let learner = {
        let (s, io) = (store.clone(), io.clone());
        SyncArbiter::start(1, move || LearnerActor::new(s.clone(), io.clone()))
    };
    ask(&learner, InitLearner { model: model_cfg.clone(), cfg: cfg.learner.clone(), device, seed: cfg.run.seed }).await??;

    let board = WeightBoard::default();
    let generators: Vec<Addr<Generator>> = (0..cfg.rollout.generators)
        .map(|i| {
            let setup = GeneratorSetup {
                id: i as u32,
                run_id: cfg.run.name.clone(),
                seed: cfg.run.seed,
                env_name: cfg.env.name.clone(),
                model: model_cfg.clone(),
                device,
                tokenizer: tokenizer.clone(),
                shards: shards.clone(),
                store: store.clone(),
                io: io.clone(),
                board: board.clone(),
                budget: gen_budget.clone(),
                group_size: cfg.rollout.group_size,
                temperature: cfg.rollout.temperature,
                max_turn_tokens: cfg.rollout.max_turn_tokens,
            };
            SyncArbiter::start(1, move || Generator::new(setup.clone()))
        })
        .collect();

    let mut outcome = JobOutcome::default();
    let mut carried = BTreeMap::new();
    let (version, saved_frontier, parent, reference) = match latest {
        Some(manifest) => {
            let mut files = Vec::new();
            for f in &manifest.files {
                let (s, m, name) = (store.clone(), manifest.clone(), f.name.clone());
                let bytes: Bytes = spawn_io(&io, async move { s.read_checkpoint_file(&m, &name).await }).await?;
                files.push((f.name.clone(), bytes.to_vec()));
            }
            let version = ask(&learner, Restore(files)).await??;
            if version != manifest.policy_version {
                return Err(ActorError::Resume(format!(
                    "checkpoint {} says policy version {} but its learner state is at {version}",
                    manifest.id, manifest.policy_version
                )));
            }
            if manifest.config_hash != cfg.config_hash() {
                tracing::warn!(checkpoint = %manifest.id, "resuming under a config that differs from the checkpoint's");
            }
            outcome.eval_before = manifest.metrics.get("eval_success_before").copied().unwrap_or(f64::NAN);
            carried.insert("eval_success_before".to_string(), outcome.eval_before);
            outcome.resumed_from = Some(manifest.id.clone());
            let frontier = Frontier {
                next_task: manifest.data.next_task_index,
                pending: manifest.data.pending_tasks.clone(),
                next_batch_seq: manifest.data.next_batch_seq,
            };
            let reference = manifest.reference.clone().or_else(|| Some(manifest.id.clone()));
            (version, frontier, Some(manifest.id), reference)
        }
        None => {
            let demos = make_demos(&cfg, &tokenizer)?;
            let sft = ask(
                &learner,
                RunSft {
                    demos: Arc::new(demos),
                    steps: cfg.sft.steps,
                    batch_size: cfg.sft.batch_size,
                    lr: cfg.sft.lr,
                    seed: cfg.run.seed,
                },
            )
            .await??;
            events(&TrainEvent::SftDone { steps: cfg.sft.steps, loss: sft.loss });
            board.publish(ask(&learner, CurrentWeights).await??);
            outcome.eval_before = evaluate(&generators[0], &cfg, 0, "before_rl", &events).await?;
            metrics.eval_success.set(outcome.eval_before);
            carried.insert("eval_success_before".to_string(), outcome.eval_before);
            let files = ask(&learner, crate::learner_actor::Snapshot).await??;
            let ckpt = NewCheckpoint {
                parent: None,
                step: 0,
                policy_version: 0,
                config_hash: cfg.config_hash(),
                reference: None,
                tags: vec!["sft".into(), "reference".into()],
                data: DataPosition::default(),
                metrics: carried.clone(),
                files: files.into_iter().map(|(n, b)| (n, Bytes::from(b))).collect(),
            };
            let s = store.clone();
            let manifest = spawn_io(&io, async move { s.commit_checkpoint(ckpt).await }).await?;
            metrics.checkpoints.inc();
            events(&TrainEvent::Checkpoint { id: manifest.id.clone(), step: 0 });
            (0, Frontier::default(), Some(manifest.id.clone()), Some(manifest.id))
        }
    };
    board.publish(ask(&learner, CurrentWeights).await??);

    // Account for every batch already in the store (DF-2).
    let found = find_batches(&store, &io).await?;
    let bound = cfg.staleness_bound();
    let plan = plan_resume(&saved_frontier, version, bound, cfg.rollout.tasks_per_batch as u64, found.clone());
    for d in &plan.dropped {
        metrics.batches_dropped.inc();
        events(&TrainEvent::Dropped {
            batch_seq: d.batch_seq,
            reason: format!("sampled by version {} which the restored version {version} cannot use", d.policy_version),
        });
    }
    if let Some(id) = &outcome.resumed_from {
        events(&TrainEvent::Resumed {
            checkpoint: id.clone(),
            step: version,
            reused_batches: plan.reuse.len(),
            dropped_batches: plan.dropped.len(),
        });
    }
    outcome.reused_batches = plan.reuse.len();
    let reuse = plan
        .reuse
        .iter()
        .map(|b| ReadyBatch { key: store.batch_key(b.batch_seq), batch_seq: b.batch_seq, first_task: b.first_task })
        .collect();

    let (tx, rx) = tokio::sync::oneshot::channel::<Result<LoopOutcome, ActorError>>();
    let setup = ControllerSetup {
        cfg: cfg.clone(),
        store: store.clone(),
        io: io.clone(),
        metrics: metrics.clone(),
        board: board.clone(),
        generators: generators.clone(),
        learner: learner.clone(),
        budgets: vec![env_budget, gen_budget],
        events: events.clone(),
        version,
        frontier: plan.frontier,
        reuse,
        parent_checkpoint: parent,
        reference,
        carried_metrics: carried,
        done: tx,
    };
    actix::Actor::start(Controller::new(setup));
    let loop_outcome = rx.await.map_err(|_| ActorError::Internal("controller stopped without an answer".into()))??;
    outcome.final_step = loop_outcome.version;
    outcome.last_checkpoint = loop_outcome.last_checkpoint;
    outcome.dropped_batches = loop_outcome.dropped_batches + plan.dropped.len() as u64;

    outcome.eval_after = evaluate(&generators[0], &cfg, loop_outcome.version, "after_rl", &events).await?;
    metrics.eval_success.set(outcome.eval_after);
    Ok(outcome)
}

fn make_demos(cfg: &TrainConfig, tokenizer: &Tokenizer) -> Result<Vec<(Vec<u32>, Vec<u8>)>, ActorError> {
    if cfg.sft.steps == 0 {
        return Ok(Vec::new());
    }
    let mut env: Box<dyn Env> = make_env(&cfg.env.name, cfg.env.n_ops)?;
    let seeds: Vec<u64> = (0..cfg.sft.demos as u64).map(|i| task_seed(Split::Train, SFT_TASK_OFFSET + i)).collect();
    let demos = demonstrations(env.as_mut(), tokenizer, &seeds, cfg.sft.noise, cfg.run.seed)?;
    Ok(demos.into_iter().map(|d| (d.tokens, d.loss_mask)).collect())
}

async fn find_batches(store: &RunStore, io: &tokio::runtime::Handle) -> Result<Vec<FoundBatch>, ActorError> {
    let s = store.clone();
    let keys = spawn_io(io, async move { s.list_batches().await }).await?;
    let mut found = Vec::with_capacity(keys.len());
    for key in keys {
        let s = store.clone();
        let k = key.clone();
        let buf = match spawn_io(io, async move { s.get_batch(&k).await }).await {
            Ok(buf) => buf,
            Err(e) => {
                tracing::warn!(key = %key, error = %e, "ignoring an unreadable batch at resume; its tasks are regenerated");
                continue;
            }
        };
        let b = buf.archived();
        let first_task = b.trajectories.iter().map(|t| t.task_id.to_native()).min();
        let oldest = b.trajectories.iter().flat_map(|t| t.turns.iter()).map(|t| t.policy_version.to_native()).min();
        if let Some(first_task) = first_task {
            found.push(FoundBatch {
                batch_seq: b.batch_seq.to_native(),
                first_task,
                policy_version: oldest.unwrap_or(b.policy_version.to_native()),
            });
        }
    }
    Ok(found)
}

/// Held-out evaluation: one sampled episode per eval task with the published weights.
async fn evaluate(
    generator: &Addr<Generator>,
    cfg: &TrainConfig,
    version: u64,
    phase: &str,
    events: &EventSink,
) -> Result<f64, ActorError> {
    let tasks: Vec<TaskRef> = (0..cfg.rollout.eval_tasks as u64)
        .map(|i| TaskRef { task_id: i, task_seed: task_seed(Split::Eval, i) })
        .collect();
    let msg = Generate { batch_seq: EVAL_BATCH_SEQ + version, tasks, purpose: Purpose::Eval };
    let generated = ask(generator, msg).await??;
    let success = generated.stats.success_rate();
    events(&TrainEvent::Eval { phase: phase.into(), version, success, episodes: generated.stats.episodes });
    Ok(success)
}
