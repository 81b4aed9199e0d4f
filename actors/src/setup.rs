//! What every role builds from the config: the model and its chat codec ([`ModelSetup`]), and
//! the generator side of a process — env shards and generator actors ([`LocalGenerators`]).
//! `keel train` builds both in one process; `keel trainer` builds the model only; each
//! `keel generator --rank R` builds one generator of its own.
//!
//! Invariant: SU-1: every role derives the model, tokenizer and codec from the same config in
//! the same way, so a generator process samples exactly what an in-process generator would.

use std::sync::Arc;

use actix::{Addr, SyncArbiter};
use keel_envs::tokenizer_for;
use keel_learner::hf::ChatCodec;
use keel_learner::ModelSpec;
use keel_store::RunStore;

use crate::config::TrainConfig;
use crate::env_shard::{EnvFactory, EnvShard, ShardOptions, ShardPool};
use crate::error::ActorError;
use crate::generator::{Generator, GeneratorSetup};
use crate::process::StopSignal;
use crate::supervision::RestartBudget;
use crate::vllm::EngineSettings;
use crate::weights::WeightBoard;

/// Restarts allowed per actor kind before the run fails.
pub const RESTART_BUDGET: u32 = 16;

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

/// The model of a run and how text becomes its tokens (SU-1).
pub struct ModelSetup {
    /// The env's tokenizer (the built-in model's vocabulary).
    pub tokenizer: Arc<keel_envs::Tokenizer>,
    /// Architecture, placement and heads.
    pub spec: ModelSpec,
    /// tokenizer.json + tokenizer_config.json, as checkpoints carry them.
    pub tokenizer_files: Vec<(String, Vec<u8>)>,
    /// The chat codec (CC-1..4).
    pub codec: Arc<ChatCodec>,
}

impl ModelSetup {
    /// Syncs `s3://` model folders (MC-1..3) and builds the model spec and codec; fails early on
    /// a bad env or an unreachable env server.
    pub async fn prepare(
        cfg: &TrainConfig,
        io: &tokio::runtime::Handle,
        device: tch::Device,
    ) -> Result<ModelSetup, ActorError> {
        sync_model(cfg, io).await?;
        let env_cfg = cfg.env_config();
        let tokenizer = Arc::new(tokenizer_for(&env_cfg)?);
        let spec = cfg.model_spec(&tokenizer, device)?;
        let tokenizer_files = cfg.tokenizer_files(&tokenizer)?;
        let codec = Arc::new(crate::parts::codec_from_files(
            &tokenizer_files,
            &cfg.model,
        )?);
        Ok(ModelSetup {
            tokenizer,
            spec,
            tokenizer_files,
            codec,
        })
    }
}

/// Env shards and generator actors in this process.
pub struct LocalGenerators {
    /// The generator actors.
    pub generators: Vec<Addr<Generator>>,
    /// The board they read weights from.
    pub board: WeightBoard,
    /// Restart budget of the env shards (SV-2).
    pub env_budget: RestartBudget,
    /// Restart budget of the generators (SV-2).
    pub gen_budget: RestartBudget,
    /// The shards; dropping it stops their arbiters.
    pub shards: ShardPool,
    /// The process's stop signal, given to every generator (RO-13).
    pub stop: StopSignal,
}

impl LocalGenerators {
    /// Starts `cfg.rollout.env_shards` shards and generators `first_id..first_id + count`,
    /// writing batches to `store` and reading weights from a fresh board.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        cfg: &TrainConfig,
        model: &ModelSetup,
        store: &RunStore,
        io: &tokio::runtime::Handle,
        env_factory: Option<EnvFactory>,
        ids: std::ops::Range<u32>,
        remote: bool,
        stop: &StopSignal,
    ) -> Result<LocalGenerators, ActorError> {
        let factory: EnvFactory = match env_factory {
            Some(f) => f,
            None => {
                // EX-4: one client per external server, shared by every episode.
                // AJ-1: an agent env records its calls in the run's store.
                let records = crate::agent_records::StoreRecords::new(store.clone(), io.clone());
                let builder =
                    keel_envs::EnvBuilder::recording(&cfg.env_config(), Some(Arc::new(records)))?;
                Arc::new(move || builder.build())
            }
        };
        let options = ShardOptions {
            // Batches sampled at once by these generators: in async mode each in-process
            // generator samples one; a generator process (remote) or a sync run, one.
            concurrency: cfg.env_concurrency(match (remote, cfg.run.mode) {
                (false, crate::config::Mode::Async) => cfg.rollout.generators,
                _ => 1,
            }),
            latency: cfg.env.latency_model()?,
        };
        let env_budget = RestartBudget::new("env_shard", RESTART_BUDGET);
        let gen_budget = RestartBudget::new("generator", RESTART_BUDGET);
        let shards = ShardPool::start(cfg.rollout.env_shards, factory, env_budget.clone(), options);
        let addrs: Vec<Addr<EnvShard>> = shards.addrs().to_vec();
        let board = WeightBoard::default();
        let generators = ids
            .map(|id| {
                let setup = generator_setup(
                    cfg,
                    model,
                    &addrs,
                    store,
                    io,
                    &board,
                    &gen_budget,
                    id,
                    remote,
                    stop,
                );
                SyncArbiter::start(1, move || Generator::new(setup.clone()))
            })
            .collect();
        Ok(LocalGenerators {
            generators,
            board,
            env_budget,
            gen_budget,
            shards,
            stop: stop.clone(),
        })
    }

    /// A generator actor like the others, writing batches to `store` (a new trainer life's
    /// writer tag, ST-12) and reading the same board.
    pub fn start_generator(
        &self,
        cfg: &TrainConfig,
        model: &ModelSetup,
        store: &RunStore,
        io: &tokio::runtime::Handle,
        id: u32,
    ) -> Addr<Generator> {
        let setup = generator_setup(
            cfg,
            model,
            self.shards.addrs(),
            store,
            io,
            &self.board,
            &self.gen_budget,
            id,
            true,
            &self.stop,
        );
        SyncArbiter::start(1, move || Generator::new(setup.clone()))
    }
}

#[allow(clippy::too_many_arguments)]
fn generator_setup(
    cfg: &TrainConfig,
    model: &ModelSetup,
    shards: &[Addr<EnvShard>],
    store: &RunStore,
    io: &tokio::runtime::Handle,
    board: &WeightBoard,
    budget: &RestartBudget,
    id: u32,
    remote: bool,
    stop: &StopSignal,
) -> GeneratorSetup {
    // What the method asks of every generator (anchors, re-rolls, agent models, scaffold).
    let sampling = crate::method::select(cfg).sampling(cfg);
    let engine = engine_settings(cfg, model, id);
    GeneratorSetup {
        id,
        run_id: cfg.run.name.clone(),
        seed: cfg.run.seed,
        env_name: cfg.env.name.clone(),
        model: model.spec.clone(),
        codec: model.codec.clone(),
        shards: shards.to_vec(),
        store: store.clone(),
        io: io.clone(),
        board: board.clone(),
        budget: budget.clone(),
        group_size: cfg.rollout.group_size,
        temperature: cfg.rollout.temperature,
        max_turn_tokens: cfg.rollout.max_turn_tokens,
        context_len: cfg.model.context_len,
        anchor_episodes: sampling.anchor_episodes,
        dynamic_sampling: sampling.dynamic_sampling,
        keep_anchor_states: sampling.keep_anchor_states,
        agent_model: sampling.agent_model,
        scaffold_words: sampling.scaffold_words,
        batch_invariant: cfg.rollout.batch_invariant(cfg.run.mode),
        // RO-10 follows the in-process board; a generator process samples an order with the
        // weights the order names (RM-2).
        follow_weights: !remote
            && cfg.run.mode == crate::config::Mode::Async
            && cfg.rollout.inflight_updates,
        stop: stop.clone(),
        // With an engine, the fault is the engine's (its settings); the keel model loads.
        skip_weight_reload: cfg.faults.skip_weight_reload && engine.is_none(),
        engine,
    }
}

/// `rollout.backend = "vllm"`: how generator `id` reaches its server (None: the built-in
/// sampler).
fn engine_settings(cfg: &TrainConfig, model: &ModelSetup, id: u32) -> Option<EngineSettings> {
    if cfg.rollout.backend != crate::config::rollout::Backend::Vllm {
        return None;
    }
    let v = &cfg.rollout.vllm;
    Some(EngineSettings {
        python: v.python.clone().into(),
        url: v.url.clone(),
        startup_timeout: std::time::Duration::from_secs(v.startup_timeout_s),
        workdir: std::env::temp_dir().join(format!(
            "keel-vllm-{}-g{id}-{}",
            cfg.run.name,
            std::process::id()
        )),
        max_model_len: cfg.model.context_len,
        skip_reload: cfg.faults.skip_weight_reload,
        skip_cache_reset: cfg.faults.skip_prefix_cache_reset,
        tokenizer_files: Arc::new(model.tokenizer_files.clone()),
    })
}

/// Syncs the `s3://` model folders (policy, critic) and dataset folders into their local caches
/// (MC-1..3) before anything loads them.
async fn sync_model(cfg: &TrainConfig, io: &tokio::runtime::Handle) -> Result<(), ActorError> {
    let mut folders: Vec<(&str, String, Option<std::path::PathBuf>)> = vec![
        ("model", cfg.model.path.clone(), cfg.model_dir()),
        ("critic", cfg.model.critic_path.clone(), cfg.critic_dir()),
    ];
    folders.extend(
        cfg.env
            .remote_dataset_files()
            .into_iter()
            .map(|(f, d)| ("dataset", f, Some(d))),
    );
    for (kind, path, dir) in folders {
        if let (true, Some(dir)) = (path.starts_with("s3://"), dir) {
            let source = RunStore::open(&path)?;
            let into = dir.clone();
            let report = io
                .spawn(async move { keel_store::sync_model_folder(&source, &into).await })
                .await
                .map_err(|e| ActorError::Internal(format!("I/O task: {e}")))??;
            tracing::info!(
                kind,
                source = %path,
                cache = %dir.display(),
                downloaded = report.downloaded.len(),
                cached = report.cached.len(),
                "folder synced"
            );
        }
    }
    Ok(())
}
