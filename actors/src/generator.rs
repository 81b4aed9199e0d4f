//! The generator: a sync actor (own thread) that samples rollout batches with the newest
//! published weights and writes them to the store.
//!
//! Invariants:
//! - GN-1: before each batch the generator loads the newest weights on the board (WB-2) and
//!   records that version in the batch; every turn records the version it was queued under. In
//!   a sync run (and for evaluation) that is the batch's version throughout; an async training
//!   batch follows the board between decode steps (RO-10).
//! - GN-2: a training batch is durable (written with create-only semantics, ST-1) before the
//!   controller hears of it: the learner only ever trains on what the store holds.
//! - GN-3: the sampling RNG is seeded from (run seed, first task id, policy version), so a batch
//!   regenerated after a crash with the same weights is identical (RO-3).
//! - GN-4: a panic while sampling is caught (SV-1); the actor is replaced by a fresh one from the
//!   `SyncArbiter` factory and the controller retries the batch.
//! - GN-5 (dynamic sampling): once the policy version reaches the cold start, groups whose
//!   on-policy rewards are all equal are rolled out again — same task and seed, a fresh sampling
//!   seed — up to `max_tries` attempts in all, each the moment the group's last episode ends,
//!   in the same stream as the other groups (RO-9); a re-rolled group replaces the old one only
//!   when it became informative. The learner drops groups still uniform (DAPO filter). keel
//!   re-rolls the same task instead of drawing new ones so that the task accounting (DF-1)
//!   stays exact.
//! - GN-6 (RTPO): `Trunks` samples one episode per task recording every boundary (RO-5) and
//!   stores them create-only as one JSON record; `Branches` continues `group_size` siblings from
//!   each trunk's boundary at a depth (0 = before its last turn) with the current weights.
//! - GN-7 (ARMOR): with `anchor_episodes > 0` every task also gets that many episodes from the
//!   reference policy; a group keeps its first successful anchor episode only when its on-policy
//!   episodes are neither all right nor all wrong; other anchor episodes are dropped.
//! - GN-8 (PATS): training prompts carry the scaffold bank of the message, rendered per task
//!   type; evaluation never does.
//! - GN-9 (LoRA): a generator builds the frozen base once; each of its models (agent models,
//!   the reference) is a view sharing the base's tensors with its own adapters, so a LoRA job
//!   holds one copy of the base per generator however many models it samples from.

use std::sync::Arc;

use actix::{Actor, Addr, Handler, Message, SyncContext};
use keel_envs::scaffold::{Bank, GroupRecord};
use keel_learner::algo::presets::DynamicSampling;
use keel_learner::hf::{ChatCodec, HfModel};
use keel_learner::ModelSpec;
use keel_store::{BatchKey, RolloutBatch, RunStore};

use crate::env_shard::EnvShard;
use crate::error::ActorError;
use crate::method::{armor, pats, rtpo};
use crate::rollout::{
    group_plans, reference_or_error, run_episodes, BoundaryState, EpisodePlan, ModelSource, Reroll,
    RolloutExtras, RolloutSpec, RolloutStats, TaskRef,
};
use crate::seeds::mix_seed;
use crate::supervision::{run_caught, RestartBudget};
use crate::vllm::{EngineSettings, VllmClient, VllmEngine};
use crate::weights::{PublishedWeights, WeightBoard};

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
    /// The model (architecture, placement, heads); weights come from the board.
    pub model: ModelSpec,
    /// Renders episodes into tokens and sampled turns into actions (CC-1..4).
    pub codec: Arc<ChatCodec>,
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
    /// Episodes per task (RTPO: siblings per boundary).
    pub group_size: usize,
    /// Sampling temperature.
    pub temperature: f64,
    /// Most tokens per turn.
    pub max_turn_tokens: usize,
    /// Longest episode in tokens (`model.context_len`): an episode that cannot fit another
    /// turn ends truncated (RO-5).
    pub context_len: usize,
    /// ARMOR: episodes per task sampled from the reference policy (0 = none).
    pub anchor_episodes: usize,
    /// Dynamic sampling (DAPO, SAMPO, ARMOR): re-roll uninformative groups.
    pub dynamic_sampling: Option<DynamicSampling>,
    /// GiGPO with similarity groups: store each turn's anchor-state text.
    pub keep_anchor_states: bool,
    /// Dr. MAS: `agent_model[a]` = the model sampling agent `a`'s turns.
    pub agent_model: Vec<usize>,
    /// PATS: words of scaffold rendered before a prompt at most.
    pub scaffold_words: usize,
    /// SA-7: sample with fixed forward shapes (RO-3 under streaming).
    pub batch_invariant: bool,
    /// RO-10: training batches take newer weights between decode steps (async mode).
    pub follow_weights: bool,
    /// The process's stop signal: evaluations end at the next decode step once it is
    /// requested (RO-13).
    pub stop: crate::process::StopSignal,
    /// `faults.skip_weight_reload` (PV-2): keep the old tensors when a newer version is due.
    pub skip_weight_reload: bool,
    /// `rollout.backend = "vllm"`: sample on a vLLM server (None: the built-in sampler).
    pub engine: Option<EngineSettings>,
}

/// Why a batch is sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Purpose {
    /// A training batch, written to the store.
    Train,
    /// Held-out evaluation (`crate::eval`): nothing written, no scaffold.
    Eval(Decoding),
}

/// How an evaluation decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Decoding {
    /// One greedy episode per task (pass@1).
    Greedy,
    /// `samples` episodes per task at the rollout temperature (avg@k).
    Sampled {
        /// Episodes per task (k).
        samples: usize,
    },
}

/// What kind of training batch to sample.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Work {
    /// `group_size` episodes per task (+ ARMOR anchors), re-rolled under dynamic sampling.
    Groups,
    /// RTPO: one trunk episode per task; its boundary states are stored at `key` (GN-6).
    Trunks {
        /// Store key (under the run's state prefix) of the trunk record.
        key: String,
    },
    /// RTPO: `group_size` siblings from each trunk's boundary `depth` turns from its end.
    Branches {
        /// The trunk record.
        key: String,
        /// 0 = the last turn's boundary.
        depth: usize,
    },
}

/// Sample one batch. It is also the body of a remote work order (`crate::remote::WorkOrder`,
/// flattened): its field names and order are that stored format.
#[derive(Message, Debug, Clone, serde::Serialize, serde::Deserialize)]
#[rtype(result = "Result<Generated, ActorError>")]
pub struct Generate {
    /// Batch sequence number.
    pub batch_seq: u64,
    /// The tasks.
    pub tasks: Vec<TaskRef>,
    /// Train or eval.
    pub purpose: Purpose,
    /// What to sample (train only).
    pub work: Work,
    /// PATS: the scaffold bank to render into training prompts.
    pub scaffold: Option<Arc<Bank>>,
}

impl Generate {
    /// Plain groups of the given purpose, no scaffold.
    pub fn groups(batch_seq: u64, tasks: Vec<TaskRef>, purpose: Purpose) -> Self {
        Generate {
            batch_seq,
            tasks,
            purpose,
            work: Work::Groups,
            scaffold: None,
        }
    }
}

/// A sampled batch. It is also what a remote generator answers (`crate::remote::Outcome::Done`);
/// results stored before it carried `batch_seq` and `tasks` lack them, and the trainer takes
/// them from its order (`crate::remote::answering`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Generated {
    /// Where the batch was stored (train only; not for RTPO trunks).
    #[serde(default, with = "crate::remote::batch_key")]
    pub key: Option<BatchKey>,
    /// Its sequence number.
    #[serde(default)]
    pub batch_seq: u64,
    /// The policy version it was sampled with.
    pub policy_version: u64,
    /// Its statistics.
    pub stats: RolloutStats,
    /// Its tasks.
    #[serde(default)]
    pub tasks: Vec<TaskRef>,
    /// Seconds spent sampling (store write excluded).
    pub sample_seconds: f64,
    /// Seconds the store took to write the batch (train only).
    pub put_seconds: f64,
    /// Dynamic sampling: rollout passes made (1 = no re-roll).
    pub tries: usize,
    /// Dynamic sampling: groups still uninformative after the last try (0 without it).
    pub uniform_groups: usize,
    /// RTPO trunks: the most turns of a trunk (the number of branch depths).
    pub trunk_depth: Option<usize>,
    /// PATS: the rollout groups, for evidence cards.
    pub groups: Vec<GroupRecord>,
}

pub use crate::method::rtpo::{sibling_group, Trunk, TrunkRecord};

/// Policy weights a generator holds, checked against their provenance probe (PV-1).
struct Loaded {
    /// Their policy version.
    version: u64,
    /// Their digest (WB-5), recorded by every turn sampled with them.
    digest: u64,
    /// Model 0 and the agent models.
    models: Vec<HfModel>,
}

/// Loads `weights` into `models` (model order) and checks the probe (PV-1); with `skip`
/// (`faults.skip_weight_reload`, PV-2) the tensors stay as they are.
fn load_checked(
    models: &mut [HfModel],
    weights: &PublishedWeights,
    skip: bool,
) -> Result<(), ActorError> {
    if !skip {
        for (k, m) in models.iter_mut().enumerate() {
            let bytes = weights
                .model(k)
                .ok_or_else(|| ActorError::Internal(format!("agent model {k} missing")))?;
            m.load_safetensors(bytes)?;
        }
    }
    crate::provenance::verify(models, weights, "keel")
}

/// The generator actor.
pub struct Generator {
    setup: GeneratorSetup,
    /// The loaded policy weights: model 0 and the agent models.
    models: Option<Loaded>,
    /// Board epoch of the loaded weights (WB-3).
    epoch: u64,
    /// (serial, model) of the loaded reference policy (WB-4).
    reference: Option<(u64, HfModel)>,
    /// The last trunk record read (RTPO), by key.
    trunks: Option<(String, Arc<TrunkRecord>)>,
    /// With LoRA: the frozen base, built once; every model of this generator (agent models,
    /// the reference) is a view on its tensors with its own adapters (GN-9).
    lora_base: std::cell::OnceCell<HfModel>,
    /// `rollout.backend = "vllm"`: the engine serving the loaded weights (started with the
    /// first ones; dropped when its server died, and started again by the next batch).
    engine: Option<VllmEngine>,
}

impl Generator {
    /// A fresh generator (no weights loaded yet).
    pub fn new(setup: GeneratorSetup) -> Self {
        Self {
            setup,
            models: None,
            epoch: 0,
            reference: None,
            trunks: None,
            lora_base: std::cell::OnceCell::new(),
            engine: None,
        }
    }

    /// A model to load published weights into (GN-9: with LoRA, a view on the one base).
    fn fresh_model(&self) -> Result<HfModel, ActorError> {
        if self.setup.model.lora.is_none() {
            return Ok(self.setup.model.blank()?);
        }
        let base = match self.lora_base.get() {
            Some(b) => b,
            None => {
                let built = self.setup.model.build()?;
                self.lora_base.get_or_init(|| built)
            }
        };
        Ok(base.adapter_view(true)?)
    }

    /// Loads the newest weights on the board (GN-1) and, when needed, the reference (WB-4).
    fn load_weights(&mut self, want_reference: bool) -> Result<u64, ActorError> {
        let Some(published) = self.setup.board.latest() else {
            return Err(ActorError::Internal("no weights published yet".into()));
        };
        let n = 1 + published.extra_models.len();
        let stale = self.epoch != published.epoch
            || self
                .models
                .as_ref()
                .is_none_or(|l| l.version != published.version || l.models.len() != n);
        if stale {
            let (mut models, skip) = match self.models.take() {
                Some(l) if l.models.len() == n => (l.models, self.setup.skip_weight_reload),
                _ => (
                    (0..n)
                        .map(|_| self.fresh_model())
                        .collect::<Result<Vec<_>, _>>()?,
                    false,
                ),
            };
            load_checked(&mut models, &published, skip)?;
            self.models = Some(Loaded {
                version: published.version,
                digest: published.digest,
                models,
            });
            self.epoch = published.epoch;
        }
        self.sync_engine(&published, stale)?;
        if want_reference {
            let Some(r) = self.setup.board.reference() else {
                return Err(ActorError::Internal(
                    "anchor episodes need a published reference policy".into(),
                ));
            };
            if self
                .reference
                .as_ref()
                .is_none_or(|(serial, _)| *serial != r.serial)
            {
                let mut m = match self.reference.take() {
                    Some((_, m)) => m,
                    None => self.fresh_model()?,
                };
                m.load_safetensors(&r.safetensors)?;
                self.reference = Some((r.serial, m));
            }
        }
        Ok(published.version)
    }

    /// `rollout.backend = "vllm"`: starts the engine with the loaded weights, or swaps a newer
    /// version into it (VE-1, VE-2).
    fn sync_engine(&mut self, published: &PublishedWeights, stale: bool) -> Result<(), ActorError> {
        let (Some(settings), Some(loaded)) = (&self.setup.engine, &self.models) else {
            return Ok(());
        };
        let model = loaded
            .models
            .first()
            .ok_or_else(|| ActorError::Internal("no policy model loaded".into()))?;
        match self.engine.as_mut() {
            None => self.engine = Some(VllmEngine::start(settings.clone(), model, published)?),
            Some(engine) if stale => engine.load(model, published)?,
            Some(_) => {}
        }
        Ok(())
    }

    /// A failed batch whose engine server died: the server counts against the generators'
    /// restart budget and is started again with the next batch, which the controller reissues;
    /// past the budget the run ends with the engine's error.
    fn engine_failed(&mut self, e: ActorError) -> ActorError {
        if !matches!(e, ActorError::Engine(_))
            || !self.engine.as_mut().is_some_and(VllmEngine::server_exited)
        {
            return e;
        }
        self.engine = None;
        if self.setup.budget.exhausted() {
            return ActorError::Engine(format!(
                "the vLLM server died and the generator restart budget ({}) is spent: {e}",
                self.setup.budget.max_restarts()
            ));
        }
        let used = self.setup.budget.record_restart();
        tracing::warn!(generator = self.setup.id, restarts = used, error = %e, "the vLLM server died; it restarts with the batch's tasks");
        ActorError::EngineRestarted(e.to_string())
    }

    fn trunk_record(&mut self, key: &str) -> Result<Arc<TrunkRecord>, ActorError> {
        if let Some((k, r)) = &self.trunks {
            if k == key {
                return Ok(r.clone());
            }
        }
        let bytes = self.setup.io.block_on(self.setup.store.get_object(key))?;
        let record = Arc::new(TrunkRecord::from_bytes(key, &bytes)?);
        self.trunks = Some((key.to_string(), record.clone()));
        Ok(record)
    }

    fn generate(&mut self, msg: &Generate) -> Result<Generated, ActorError> {
        let train = msg.purpose == Purpose::Train;
        let anchors = if train && msg.work == Work::Groups {
            self.setup.anchor_episodes
        } else {
            0
        };
        let version = match self.load_weights(anchors > 0) {
            Ok(v) => v,
            Err(e) => return Err(self.engine_failed(e)),
        };
        let dynamic = self
            .setup
            .dynamic_sampling
            .filter(|d| train && msg.work == Work::Groups && version >= d.cold_start_updates);
        let spec = self.spec(msg, version, anchors, dynamic)?;
        let start = std::time::Instant::now();
        let (mut batch, stats, extras) = match self.sample(&spec) {
            Ok(sampled) => sampled,
            Err(e) => return Err(self.engine_failed(e)),
        };
        if anchors > 0 {
            armor::filter_anchors(&mut batch);
        }
        let sample_seconds = start.elapsed().as_secs_f64();
        if train && batch.trajectories.is_empty() {
            // Every episode failed in its env (RO-4): nothing to store; the controller retries.
            return Err(ActorError::AllEpisodesFailed {
                batch_seq: msg.batch_seq,
                failed: stats.failed_episodes,
                last_failure: extras.last_failure.unwrap_or_else(|| "unknown".into()),
            });
        }
        let groups = if train && msg.scaffold.is_some() {
            pats::group_records(&batch, &extras.task_types, &self.setup.codec)?
        } else {
            Vec::new()
        };
        let (key, trunk_depth) = self.store_output(msg, version, &batch, extras.boundaries)?;
        let put_seconds = start.elapsed().as_secs_f64() - sample_seconds;
        Ok(Generated {
            key,
            batch_seq: msg.batch_seq,
            policy_version: version,
            stats,
            tasks: msg.tasks.clone(),
            sample_seconds,
            put_seconds,
            tries: extras.passes.max(1),
            // Only meaningful under dynamic sampling (GN-5); 0 otherwise.
            uniform_groups: if dynamic.is_some() {
                extras.uniform_groups.len()
            } else {
                0
            },
            trunk_depth,
            groups,
        })
    }

    /// The episodes to sample: `(plans, capture boundaries)` for the message's work.
    fn plans(
        &mut self,
        msg: &Generate,
        anchors: usize,
    ) -> Result<(Vec<EpisodePlan>, bool), ActorError> {
        Ok(match (&msg.work, msg.purpose) {
            (_, Purpose::Eval(Decoding::Greedy)) => (group_plans(&msg.tasks, 1, 0), false),
            (_, Purpose::Eval(Decoding::Sampled { samples })) => {
                (group_plans(&msg.tasks, samples.max(1), 0), false)
            }
            (Work::Groups, Purpose::Train) => (
                group_plans(&msg.tasks, self.setup.group_size, anchors),
                false,
            ),
            (Work::Trunks { .. }, Purpose::Train) => (group_plans(&msg.tasks, 1, 0), true),
            (Work::Branches { key, depth }, Purpose::Train) => {
                let record = self.trunk_record(key)?;
                (
                    rtpo::branch_plans(&record, *depth, self.setup.group_size),
                    false,
                )
            }
        })
    }

    /// What one batch samples (GN-3: seeded by run seed, purpose, first task and version).
    fn spec(
        &mut self,
        msg: &Generate,
        version: u64,
        anchors: usize,
        dynamic: Option<DynamicSampling>,
    ) -> Result<RolloutSpec, ActorError> {
        let train = msg.purpose == Purpose::Train;
        let (plans, capture) = self.plans(msg, anchors)?;
        let first_task = msg.tasks.first().map(|t| t.task_id).unwrap_or(0);
        let purpose_tag = match msg.purpose {
            Purpose::Train => 1,
            Purpose::Eval(Decoding::Greedy) => 2,
            Purpose::Eval(Decoding::Sampled { .. }) => 3,
        };
        let setup = &self.setup;
        Ok(RolloutSpec {
            run_id: setup.run_id.clone(),
            batch_seq: msg.batch_seq,
            generator_id: setup.id,
            policy_version: version,
            env_name: setup.env_name.clone(),
            plans,
            temperature: setup.temperature,
            greedy: msg.purpose == Purpose::Eval(Decoding::Greedy),
            max_turn_tokens: setup.max_turn_tokens,
            context_len: setup.context_len,
            rng_seed: mix_seed(&[setup.seed, purpose_tag, first_task, version]),
            first_id: msg.batch_seq * 1_000_000,
            // GN-8: training prompts only.
            scaffold: match (&msg.scaffold, train) {
                (Some(bank), true) => Some(pats::renderer(bank.clone(), setup.scaffold_words)),
                _ => None,
            },
            capture_boundaries: capture,
            keep_anchor_states: setup.keep_anchor_states,
            batch_invariant: setup.batch_invariant,
            stop: (!train).then(|| setup.stop.clone()),
            // GN-5: re-rolls join the stream (RO-9).
            reroll: dynamic.map(|d| Reroll {
                max_tries: d.max_tries,
                anchors: anchors > 0,
            }),
            // RO-10: only training batches of an async run follow the board.
            follow_weights: setup.follow_weights && train,
        })
    }

    /// Samples `spec` with the loaded models.
    fn sample(
        &mut self,
        spec: &RolloutSpec,
    ) -> Result<(RolloutBatch, RolloutStats, RolloutExtras), ActorError> {
        let Some(loaded) = self.models.as_mut() else {
            return Err(ActorError::Internal("no weights loaded".into()));
        };
        let mut source = LiveModels {
            loaded,
            engine: self.engine.as_mut(),
            skip_reload: self.setup.skip_weight_reload,
            epoch: self.epoch,
            board: &self.setup.board,
            agent_model: &self.setup.agent_model,
            reference: self.reference.as_ref().map(|(_, m)| m),
        };
        run_episodes(&mut source, &self.setup.codec, &self.setup.shards, spec)
    }

    /// Stores a training batch (GN-2) or, for RTPO's trunks, the trunk record (GN-6; create-only
    /// under the controller's life-tagged key, MS-4). Answers the batch key and the trunks'
    /// depth; evaluation stores nothing.
    fn store_output(
        &mut self,
        msg: &Generate,
        version: u64,
        batch: &RolloutBatch,
        boundaries: Vec<Vec<BoundaryState>>,
    ) -> Result<(Option<BatchKey>, Option<usize>), ActorError> {
        let setup = &self.setup;
        match (&msg.work, msg.purpose) {
            (_, Purpose::Eval(_)) => Ok((None, None)),
            (Work::Trunks { key }, Purpose::Train) => {
                let record = TrunkRecord::of_batch(batch, boundaries, &msg.tasks, version);
                let depth = record.depth();
                let bytes = serde_json::to_vec(&record)
                    .map_err(|e| ActorError::Internal(format!("trunk record: {e}")))?;
                setup
                    .io
                    .block_on(setup.store.create_object(key, bytes.into()))?;
                self.trunks = Some((key.clone(), Arc::new(record)));
                Ok((None, Some(depth)))
            }
            (_, Purpose::Train) => {
                Ok((Some(setup.io.block_on(setup.store.put_batch(batch))?), None))
            }
        }
    }
}

/// The generator's loaded models during a rollout; with `follow_weights` they take newer
/// versions of the same board epoch between decode steps (RO-10).
struct LiveModels<'a> {
    /// The weights loaded (kept up to date for the generator's next batch).
    loaded: &'a mut Loaded,
    /// The vLLM engine serving them (`rollout.backend = "vllm"`).
    engine: Option<&'a mut VllmEngine>,
    /// `faults.skip_weight_reload` (PV-2).
    skip_reload: bool,
    epoch: u64,
    board: &'a WeightBoard,
    agent_model: &'a [usize],
    reference: Option<&'a HfModel>,
}

impl ModelSource for LiveModels<'_> {
    fn policy_models(&self) -> usize {
        self.loaded.models.len()
    }

    fn agent_model(&self) -> &[usize] {
        self.agent_model
    }

    fn model(&self, slot: usize) -> Result<&HfModel, ActorError> {
        match self.loaded.models.get(slot) {
            Some(m) => Ok(m),
            None => reference_or_error(self.reference),
        }
    }

    fn weights_digest(&self) -> u64 {
        self.loaded.digest
    }

    fn engine(&self) -> Option<VllmClient> {
        self.engine.as_ref().map(|e| e.client())
    }

    fn refresh(&mut self) -> Result<Option<u64>, ActorError> {
        let Some(p) = self.board.latest() else {
            return Ok(None);
        };
        // A rewind's weights (new epoch) or another model layout wait for the next batch.
        if p.epoch != self.epoch
            || p.version <= self.loaded.version
            || p.extra_models.len() + 1 != self.loaded.models.len()
        {
            return Ok(None);
        }
        load_checked(&mut self.loaded.models, &p, self.skip_reload)?;
        if let (Some(engine), Some(model)) = (self.engine.as_mut(), self.loaded.models.first()) {
            engine.load(model, &p)?;
        }
        self.loaded.version = p.version;
        self.loaded.digest = p.digest;
        Ok(Some(p.version))
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
