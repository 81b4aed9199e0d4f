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
//! - JB-4: a resume verifies every blob of the checkpoint it restores (CK-7); when the head fails
//!   it falls back to the newest verifiable ancestor, says so, and continues the branch from it.
//! - JB-5: `--from <ckpt>` starts a new branch whose first checkpoint's parent is `<ckpt>`; a
//!   branch that already has a head is resumed instead (JB-1), so a crashed branch run restarts
//!   with the same command.
//! - JB-6: a stop request (SIGTERM) ends the loop after the current update with a committed
//!   checkpoint (CT-5); the job then returns without the after-RL evaluation.
//! - JB-7: a corrupt batch found on resume is quarantined (QU-1) and counted; its range stays owed.
//! - JB-8: with `--reference CKPT` and a preset that needs a reference policy, the learner's
//!   reference (KL, ARMOR's mixture and anchor rollouts) is that checkpoint's policy.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use actix::{Addr, SyncArbiter};
use bytes::Bytes;
use keel_envs::{build_env, demonstrations, task_seed, tokenizer_for, Env, Split};
use keel_store::{CheckpointManifest, DataPosition, NewCheckpoint, RunStore, StoreError};

use crate::config::TrainConfig;
use crate::controller::methods::{PatsPointer, PatsRuntime, PATS_STATE, REFERENCE_RESET_TAG};
use crate::controller::{Controller, ControllerSetup, LoopOutcome, ReadyBatch};
use crate::demo_tokens::{render_demonstration, SftSequence};
use crate::env_shard::{EnvFactory, EnvShard, ShardOptions, ShardPool};
use crate::error::ActorError;
use crate::events::{EventSink, TrainEvent};
use crate::frontier::{plan_resume, FoundBatch, Frontier};
use crate::generator::{Generate, Generator, GeneratorSetup, Purpose};
use crate::jsonl::MetricsLog;
use crate::learner_actor::{CurrentWeights, InitLearner, LearnerActor, Restore, RunSft};
use crate::learner_actor::{LoadReference, ReferenceWeights};
use crate::metrics::TrainMetrics;
use crate::rollout::TaskRef;
use crate::supervision::RestartBudget;
use crate::tracking::Trackers;
use crate::weights::PublishedReference;
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
    /// The branch to train on (default `main`, or `from-<id>` with `from`).
    pub branch: Option<String>,
    /// Start a new branch from this checkpoint (JB-5).
    pub from: Option<String>,
    /// Record this checkpoint as the reference anchor (KL / ARMOR) instead of the inherited one.
    pub reference: Option<String>,
    /// Set to end the loop with a checkpoint (JB-6).
    pub stop: StopSignal,
}

/// A request to stop after the current update with a checkpoint (SIGTERM), shared by clones.
#[derive(Clone, Default, Debug)]
pub struct StopSignal(Arc<std::sync::atomic::AtomicBool>);

impl StopSignal {
    /// Asks the job to stop.
    pub fn request(&self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether a stop was asked for.
    pub fn requested(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
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
    /// The branch trained on.
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
}

/// Picks the torch device for `run.device`.
pub fn select_device(name: &str) -> Result<tch::Device, ActorError> {
    match name {
        "cpu" => Ok(tch::Device::Cpu),
        "cuda" if tch::Cuda::is_available() => Ok(tch::Device::Cuda(0)),
        "cuda" => Err(ActorError::Resume(
            "run.device = \"cuda\" but no CUDA device is available".into(),
        )),
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
    let branch = match (&options.branch, &options.from) {
        (Some(b), _) => b.clone(),
        (None, Some(from)) => format!("from-{from}"),
        (None, None) => keel_store::DEFAULT_BRANCH.to_string(),
    };
    let store = store
        .on_branch(&branch)?
        .with_multipart_threshold(cfg.run.checkpoint_multipart_bytes);
    let (start, skipped) = io.block_on(find_start(&store, options.from.as_deref()))?;
    let latest = start.as_ref().map(|s| s.manifest.clone());
    let log = Arc::new(Mutex::new(MetricsLog::open(
        store.clone(),
        io.clone(),
        latest.as_ref().map(|m| m.step),
    )));
    let trackers = Arc::new(Trackers::start(
        crate::tracking::from_config(&cfg, &store, &io, &branch),
        metrics.tracking_dropped.clone(),
    ));
    if let Ok(l) = log.lock() {
        trackers.replay(&l.events(), &branch);
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
    let cfg = Arc::new(cfg);
    let system = actix::System::new();
    let result = system
        .block_on(run_in_system(
            cfg,
            store,
            io.clone(),
            metrics,
            sink,
            options,
            start,
            device,
        ))
        .map(|mut outcome| {
            outcome.branch = branch;
            outcome.skipped_checkpoints = skipped;
            outcome
        });
    actix::System::current().stop();
    drop(system);
    if let Ok(log) = Arc::try_unwrap(log) {
        if let Ok(log) = log.into_inner() {
            log.flush();
        }
    }
    if let Ok(trackers) = Arc::try_unwrap(trackers) {
        trackers.finish();
    }
    io_runtime.shutdown_timeout(std::time::Duration::from_secs(10));
    result
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

#[allow(clippy::too_many_arguments)]
async fn run_in_system(
    cfg: Arc<TrainConfig>,
    store: RunStore,
    io: tokio::runtime::Handle,
    metrics: TrainMetrics,
    events: EventSink,
    options: JobOptions,
    start: Option<StartPoint>,
    device: tch::Device,
) -> Result<JobOutcome, ActorError> {
    let env_cfg = cfg.env.env_config();
    // The env's declared vocabulary is the model's (fails early on a bad env or an unreachable server).
    let tokenizer = Arc::new(tokenizer_for(&env_cfg)?);
    sync_model(&cfg, &io).await?;
    let model_spec = cfg.model_spec(&tokenizer, device)?;
    let tokenizer_files = cfg.tokenizer_files(&tokenizer)?;
    let codec = Arc::new(crate::config::codec_from_files(&tokenizer_files)?);
    let factory: EnvFactory = match options.env_factory {
        Some(f) => f,
        None => {
            // EX-4: one client per external server, shared by every episode.
            let builder = keel_envs::EnvBuilder::new(&env_cfg)?;
            Arc::new(move || builder.build())
        }
    };
    let shard_options = ShardOptions {
        concurrency: cfg.env.concurrency,
        latency: cfg.env.latency_model()?,
    };
    let env_budget = RestartBudget::new("env_shard", RESTART_BUDGET);
    let gen_budget = RestartBudget::new("generator", RESTART_BUDGET);
    let shard_pool = ShardPool::start(
        cfg.rollout.env_shards,
        factory,
        env_budget.clone(),
        shard_options,
    );
    let shards: Vec<Addr<EnvShard>> = shard_pool.addrs().to_vec();

    let learner = {
        let (s, io) = (store.clone(), io.clone());
        SyncArbiter::start(1, move || LearnerActor::new(s.clone(), io.clone()))
    };
    ask(
        &learner,
        InitLearner {
            model: model_spec.clone(),
            critic: cfg.critic_spec(device)?,
            cfg: cfg.learner.clone(),
            agent_models: cfg
                .agent_models
                .iter()
                .map(|m| crate::learner_actor::AgentModel {
                    agents: m.agents.clone(),
                    cfg: cfg.agent_learner_config(m),
                })
                .collect(),
            seed: cfg.run.seed,
            temperature: cfg.rollout.temperature,
            lr_horizon: cfg.run.steps,
            tokenizer_files,
            faults: cfg.faults.clone(),
        },
    )
    .await??;

    let board = WeightBoard::default();
    let generators: Vec<Addr<Generator>> = (0..cfg.rollout.generators)
        .map(|i| {
            let setup = GeneratorSetup {
                id: i as u32,
                run_id: cfg.run.name.clone(),
                seed: cfg.run.seed,
                env_name: cfg.env.name.clone(),
                model: model_spec.clone(),
                codec: codec.clone(),
                shards: shards.clone(),
                store: store.clone(),
                io: io.clone(),
                board: board.clone(),
                budget: gen_budget.clone(),
                group_size: cfg.rollout.group_size,
                temperature: cfg.rollout.temperature,
                max_turn_tokens: cfg.rollout.max_turn_tokens,
                anchor_episodes: if cfg.learner.algo == keel_learner::Algo::Armor {
                    cfg.armor.anchor_episodes
                } else {
                    0
                },
                dynamic_sampling: cfg.learner.resolve().dynamic_sampling,
                agent_model: cfg.agent_model_map(),
                scaffold_words: cfg.pats.render_words,
                batch_invariant: cfg.rollout.batch_invariant(cfg.run.mode),
                follow_weights: cfg.run.mode == crate::config::Mode::Async
                    && cfg.rollout.inflight_updates,
            };
            SyncArbiter::start(1, move || Generator::new(setup.clone()))
        })
        .collect();

    let mut outcome = JobOutcome::default();
    let mut carried = BTreeMap::new();
    let mut method_state = BTreeMap::new();
    let (version, saved_frontier, parent, reference) = match start {
        Some(StartPoint { manifest, files }) => {
            method_state = manifest.data.method_state.clone();
            let files = files.into_iter().map(|(n, b)| (n, b.to_vec())).collect();
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
            outcome.eval_before = manifest
                .metrics
                .get("eval_success_before")
                .copied()
                .unwrap_or(f64::NAN);
            carried.insert("eval_success_before".to_string(), outcome.eval_before);
            outcome.resumed_from = Some(manifest.id.clone());
            let frontier = Frontier {
                next_task: manifest.data.next_task_index,
                pending: manifest.data.pending_tasks.clone(),
                next_batch_seq: manifest.data.next_batch_seq,
            };
            // MS-3: a checkpoint taken at an ARMOR reference reset is itself the reference of
            // what follows it (its manifest names the reference before the reset).
            let reset_here = manifest.tags.iter().any(|t| t == REFERENCE_RESET_TAG);
            let reference = options
                .reference
                .clone()
                .or_else(|| reset_here.then(|| manifest.id.clone()))
                .or_else(|| manifest.reference.clone())
                .or_else(|| Some(manifest.id.clone()));
            (version, frontier, Some(manifest.id), reference)
        }
        None => {
            let demos = make_demos(&cfg, &tokenizer, &codec)?;
            let mut data = DataPosition::default();
            let demos: Demos = match cfg.learner.algo {
                keel_learner::Algo::Pats => {
                    // PS-1/2: seed bank + scaffold-conditioned SFT; the SFT checkpoint names
                    // the seed bank, so every life of the run starts RL from it.
                    let mut pats =
                        pats_runtime(&cfg, &store, &io, &tokenizer, &method_state).await?;
                    let demos =
                        crate::pats_seed::seed_scaffold(&cfg, &codec, demos, &mut pats.controller)?;
                    let version = pats.controller.bank().version();
                    let key = store.state_key(&format!(
                        "pats/scaffold-{version:06}-{}.json",
                        crate::controller::methods::life_tag()
                    ));
                    let bytes = pats
                        .controller
                        .state()
                        .to_json_bytes()
                        .map_err(|e| ActorError::Internal(format!("PATS seed state: {e}")))?;
                    let (s, k) = (store.clone(), key.clone());
                    spawn_io(&io, async move { s.create_object(&k, bytes.into()).await }).await?;
                    let pointer = PatsPointer { key, version };
                    data.method_state.insert(
                        PATS_STATE.to_string(),
                        serde_json::to_string(&pointer).unwrap_or_default(),
                    );
                    method_state = data.method_state.clone();
                    demos
                }
                _ => demos.into_iter().map(|(_, _, bare)| bare).collect(),
            };
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
            events(&TrainEvent::SftDone {
                steps: cfg.sft.steps,
                loss: sft.loss,
            });
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
            let s = store.clone();
            let manifest = spawn_io(&io, async move { s.commit_checkpoint(ckpt).await }).await?;
            metrics.checkpoints.inc();
            events(&TrainEvent::Checkpoint {
                id: manifest.id.clone(),
                step: 0,
                parent: manifest.parent.clone(),
            });
            (
                0,
                Frontier::default(),
                Some(manifest.id.clone()),
                Some(manifest.id),
            )
        }
    };
    board.publish(ask(&learner, CurrentWeights).await??);
    if let (Some(id), true) = (&options.reference, cfg.learner.resolve().needs_reference()) {
        // JB-8: `--reference CKPT` makes that checkpoint's policy the reference (KL, ARMOR).
        let (s, id) = (store.clone(), id.clone());
        let weights = spawn_io(&io, async move {
            let manifest = s.checkpoint(&id).await?;
            s.read_checkpoint_file(&manifest, "model.safetensors").await
        })
        .await?;
        ask(&learner, LoadReference(weights.to_vec())).await??;
    }
    if cfg.learner.algo == keel_learner::Algo::Armor {
        // WB-4: anchor episodes sample from the reference the learner holds (restored with the
        // checkpoint, or the current weights at the RL start).
        board.publish_reference(PublishedReference {
            copied_at: version,
            serial: 0,
            safetensors: Arc::new(ask(&learner, ReferenceWeights).await??),
        });
    }
    let pats = match cfg.learner.algo {
        keel_learner::Algo::Pats => {
            Some(pats_runtime(&cfg, &store, &io, &tokenizer, &method_state).await?)
        }
        _ => None,
    };

    // Account for every batch already in the store (DF-2).
    let (found, quarantined) = find_batches(&store, &io, &metrics).await?;
    outcome.quarantined_batches = quarantined;
    let bound = cfg.staleness_bound();
    let plan = plan_resume(
        &saved_frontier,
        version,
        bound,
        cfg.rollout.tasks_per_batch as u64,
        found.clone(),
    );
    let mut plan = plan;
    let mut not_reused: Vec<u64> = Vec::new();
    let regenerate = matches!(
        cfg.learner.algo,
        keel_learner::Algo::Rtpo | keel_learner::Algo::Pats
    );
    if regenerate && !plan.reuse.is_empty() {
        // MS-1: sibling batches lost with a crash are branched again from the stored trunk;
        // MS-2: a PATS review needs a batch's rollout groups (with their task types), which the
        // stored batch does not carry. So stored batches are not reused; the frontier stays the
        // checkpoint's.
        let reused: Vec<_> = plan.reuse.drain(..).collect();
        not_reused = reused.iter().map(|b| b.batch_seq).collect();
        plan.dropped.extend(reused);
        plan.frontier = Frontier {
            next_batch_seq: plan.frontier.next_batch_seq,
            ..saved_frontier.clone()
        };
    }
    for d in &plan.dropped {
        metrics.batches_dropped.inc();
        let reason = if not_reused.contains(&d.batch_seq) {
            format!(
                "{} samples it again after a resume instead of reusing stored batches",
                cfg.learner.algo.name()
            )
        } else {
            format!(
                "sampled by version {} which the restored version {version} cannot use",
                d.policy_version
            )
        };
        events(&TrainEvent::Dropped {
            batch_seq: d.batch_seq,
            reason,
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
        .map(|b| ReadyBatch::plain(store.batch_key(b.batch_seq), b.batch_seq, b.first_task))
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
        budgets: vec![env_budget.clone(), gen_budget.clone()],
        events: events.clone(),
        version,
        frontier: plan.frontier,
        reuse,
        parent_checkpoint: parent,
        reference,
        carried_metrics: carried,
        dropped_on_resume: plan.dropped.iter().map(|d| d.batch_seq).collect(),
        stop: options.stop.clone(),
        method_state,
        pats,
        done: tx,
    };
    actix::Actor::start(Controller::new(setup));
    let loop_outcome = rx
        .await
        .map_err(|_| ActorError::Internal("controller stopped without an answer".into()))??;
    outcome.final_step = loop_outcome.version;
    outcome.last_checkpoint = loop_outcome.last_checkpoint;
    outcome.dropped_batches = loop_outcome.dropped_batches + plan.dropped.len() as u64;
    if loop_outcome.stopped {
        outcome.stopped = true;
        outcome.eval_after = f64::NAN;
        return Ok(outcome);
    }

    outcome.eval_after = evaluate(
        &generators[0],
        &cfg,
        loop_outcome.version,
        "after_rl",
        &events,
    )
    .await?;
    metrics.eval_success.set(outcome.eval_after);
    outcome.env_shard_restarts = env_budget.used();
    outcome.generator_restarts = gen_budget.used();
    drop(shard_pool);
    Ok(outcome)
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
    let mut env: Box<dyn Env> = build_env(&cfg.env.env_config())?;
    let seeds: Vec<u64> = (0..cfg.sft.demos as u64)
        .map(|i| task_seed(Split::Train, SFT_TASK_OFFSET + i))
        .collect();
    let demos = demonstrations(env.as_mut(), tokenizer, &seeds, cfg.sft.noise, cfg.run.seed)?;
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

/// Syncs the `s3://` model folders (policy, critic) into their local caches (MC-1..3) before
/// anything loads them.
async fn sync_model(cfg: &TrainConfig, io: &tokio::runtime::Handle) -> Result<(), ActorError> {
    for (path, dir) in [
        (&cfg.model.path, cfg.model_dir()),
        (&cfg.model.critic_path, cfg.critic_dir()),
    ] {
        if let (true, Some(dir)) = (path.starts_with("s3://"), dir) {
            sync_folder(path, dir, io).await?;
        }
    }
    Ok(())
}

/// Syncs one `s3://` folder `path` into `dir` (MC-1..3).
async fn sync_folder(
    path: &str,
    dir: std::path::PathBuf,
    io: &tokio::runtime::Handle,
) -> Result<(), ActorError> {
    let source = RunStore::open(path)?;
    let into = dir.clone();
    let report = spawn_io(io, async move {
        keel_store::sync_model_folder(&source, &into).await
    })
    .await?;
    tracing::info!(
        model = %path,
        cache = %dir.display(),
        downloaded = report.downloaded.len(),
        cached = report.cached.len(),
        "model folder synced"
    );
    Ok(())
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

async fn find_batches(
    store: &RunStore,
    io: &tokio::runtime::Handle,
    metrics: &TrainMetrics,
) -> Result<(Vec<FoundBatch>, u64), ActorError> {
    let s = store.clone();
    let keys = spawn_io(io, async move { s.list_batches().await }).await?;
    let mut found = Vec::with_capacity(keys.len());
    let mut quarantined = 0;
    for key in keys {
        let s = store.clone();
        let k = key.clone();
        let buf = match spawn_io(io, async move { s.get_batch(&k).await }).await {
            Ok(buf) => buf,
            Err(ActorError::Store(e @ StoreError::CorruptBatch { .. })) => {
                let (s, k, reason) = (store.clone(), key.clone(), e.to_string());
                spawn_io(io, async move { s.quarantine_batch(&k, &reason).await }).await?;
                metrics.store_quarantined.inc_for("batch", 1);
                quarantined += 1;
                eprintln!("warning: {e}; moved it to quarantine/, its tasks are regenerated");
                continue;
            }
            Err(e) => return Err(e),
        };
        let b = buf.archived();
        let first_task = b.trajectories.iter().map(|t| t.task_id.to_native()).min();
        let oldest = b
            .trajectories
            .iter()
            .flat_map(|t| t.turns.iter())
            .map(|t| t.policy_version.to_native())
            .min();
        if let Some(first_task) = first_task {
            found.push(FoundBatch {
                batch_seq: b.batch_seq.to_native(),
                first_task,
                policy_version: oldest.unwrap_or(b.policy_version.to_native()),
            });
        }
    }
    Ok((found, quarantined))
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
        .map(|i| TaskRef {
            task_id: i,
            task_seed: task_seed(Split::Eval, i),
        })
        .collect();
    let msg = Generate::groups(EVAL_BATCH_SEQ + version, tasks, Purpose::Eval);
    let generated = ask(generator, msg).await??;
    let success = generated.stats.success_rate();
    events(&TrainEvent::Eval {
        phase: phase.into(),
        version,
        success,
        episodes: generated.stats.episodes,
    });
    Ok(success)
}

/// PATS (MS-2): a fresh scaffold, or the one named by the checkpoint resumed from.
async fn pats_runtime(
    cfg: &TrainConfig,
    store: &RunStore,
    io: &tokio::runtime::Handle,
    tokenizer: &keel_envs::Tokenizer,
    method_state: &BTreeMap<String, String>,
) -> Result<PatsRuntime, ActorError> {
    use keel_envs::scaffold::{
        HttpReviewer, Reviewer, RuleReviewer, ScaffoldController, ScaffoldState,
    };
    let bad =
        |e: keel_envs::scaffold::ScaffoldError| ActorError::Resume(format!("PATS scaffold: {e}"));
    let reviewer = || -> Box<dyn Reviewer> {
        match cfg.pats.reviewer_url.as_str() {
            "" => Box::new(RuleReviewer::default()),
            url => Box::new(HttpReviewer::new(url, cfg.pats.reviewer_timeout_ms)),
        }
    };
    let (controller, pointer) = match method_state.get(PATS_STATE) {
        Some(text) => {
            let pointer: PatsPointer = serde_json::from_str(text).map_err(|e| {
                ActorError::Resume(format!("method_state.pats is not a scaffold pointer: {e}"))
            })?;
            let (s, key) = (store.clone(), pointer.key.clone());
            let bytes = spawn_io(io, async move { s.get_object(&key).await }).await?;
            let state = ScaffoldState::from_json_bytes(&bytes).map_err(bad)?;
            let c = ScaffoldController::from_state(
                cfg.pats.clone(),
                tokenizer.clone(),
                reviewer(),
                state,
            )
            .map_err(bad)?;
            (c, Some(pointer))
        }
        None => (
            ScaffoldController::new(cfg.pats.clone(), tokenizer.clone(), reviewer())
                .map_err(bad)?,
            None,
        ),
    };
    Ok(PatsRuntime {
        bank: Arc::new(controller.bank().clone()),
        controller,
        pointer,
    })
}
