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
use keel_store::{BatchKey, RolloutBatch, RunStore, Source};

use crate::env_shard::EnvShard;
use crate::error::ActorError;
use crate::rollout::{
    group_plans, reference_or_error, run_episodes, uninformative, BoundaryState, EpisodePlan,
    ModelSource, Reroll, RolloutSpec, RolloutStats, ScaffoldRenderer, TaskRef,
};
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

/// A sampled batch.
#[derive(Debug, Clone)]
pub struct Generated {
    /// Where the batch was stored (train only; not for RTPO trunks).
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
    /// Dynamic sampling: rollout passes made (1 = no re-roll).
    pub tries: usize,
    /// Dynamic sampling: groups still uninformative after the last try (0 without it).
    pub uniform_groups: usize,
    /// RTPO trunks: the most turns of a trunk (the number of branch depths).
    pub trunk_depth: Option<usize>,
    /// PATS: the rollout groups, for evidence cards.
    pub groups: Vec<GroupRecord>,
}

/// RTPO: the trunk of one task and the boundary before each of its turns (GN-6).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Trunk {
    /// The task.
    pub task_id: u64,
    /// Its env seed.
    pub task_seed: u64,
    /// Boundary k = the state before turn k.
    pub boundaries: Vec<BoundaryState>,
    /// The trunk's final reward.
    pub final_reward: f32,
}

/// The stored record of one trunk batch.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TrunkRecord {
    /// Format tag.
    pub format: String,
    /// Policy version that sampled the trunks.
    pub policy_version: u64,
    /// The trunks.
    pub trunks: Vec<Trunk>,
}

const TRUNK_FORMAT: &str = "keel.rtpo.trunks.v1";

impl TrunkRecord {
    /// The most turns of any trunk.
    pub fn depth(&self) -> usize {
        self.trunks
            .iter()
            .map(|t| t.boundaries.len())
            .max()
            .unwrap_or(0)
    }

    /// Parses and checks a stored record.
    pub fn from_bytes(key: &str, bytes: &[u8]) -> Result<Self, ActorError> {
        let r: TrunkRecord = serde_json::from_slice(bytes)
            .map_err(|e| ActorError::Resume(format!("RTPO trunk record {key}: {e}")))?;
        if r.format != TRUNK_FORMAT {
            return Err(ActorError::Resume(format!(
                "RTPO trunk record {key}: format {:?}, expected {TRUNK_FORMAT:?}",
                r.format
            )));
        }
        Ok(r)
    }
}

/// Group id of the siblings branched at `depth` from a task's trunk (unique per boundary).
pub fn sibling_group(task_id: u64, depth: usize) -> u64 {
    (task_id << 16) | depth as u64
}

/// The generator actor.
pub struct Generator {
    setup: GeneratorSetup,
    /// (version, models) of the loaded policy weights: model 0 and the agent models.
    models: Option<(u64, Vec<HfModel>)>,
    /// Board epoch of the loaded weights (WB-3).
    epoch: u64,
    /// (serial, model) of the loaded reference policy (WB-4).
    reference: Option<(u64, HfModel)>,
    /// The last trunk record read (RTPO), by key.
    trunks: Option<(String, Arc<TrunkRecord>)>,
    /// With LoRA: the frozen base, built once; every model of this generator (agent models,
    /// the reference) is a view on its tensors with its own adapters (GN-9).
    lora_base: std::cell::OnceCell<HfModel>,
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
                .is_none_or(|(v, m)| *v != published.version || m.len() != n);
        if stale {
            let mut models = match self.models.take() {
                Some((_, m)) if m.len() == n => m,
                _ => (0..n)
                    .map(|_| self.fresh_model())
                    .collect::<Result<Vec<_>, _>>()?,
            };
            for (k, m) in models.iter_mut().enumerate() {
                let bytes = published
                    .model(k)
                    .ok_or_else(|| ActorError::Internal(format!("agent model {k} missing")))?;
                m.load_safetensors(bytes)?;
            }
            self.models = Some((published.version, models));
            self.epoch = published.epoch;
        }
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
        let setup = self.setup.clone();
        let train = msg.purpose == Purpose::Train;
        let anchors = if train && msg.work == Work::Groups {
            setup.anchor_episodes
        } else {
            0
        };
        let version = self.load_weights(anchors > 0)?;
        let first_task = msg.tasks.first().map(|t| t.task_id).unwrap_or(0);
        let purpose_tag = match msg.purpose {
            Purpose::Train => 1,
            Purpose::Eval(Decoding::Greedy) => 2,
            Purpose::Eval(Decoding::Sampled { .. }) => 3,
        };
        let (plans, capture) = match (&msg.work, msg.purpose) {
            (_, Purpose::Eval(Decoding::Greedy)) => (group_plans(&msg.tasks, 1, 0), false),
            (_, Purpose::Eval(Decoding::Sampled { samples })) => {
                (group_plans(&msg.tasks, samples.max(1), 0), false)
            }
            (Work::Groups, Purpose::Train) => {
                (group_plans(&msg.tasks, setup.group_size, anchors), false)
            }
            (Work::Trunks { .. }, Purpose::Train) => (group_plans(&msg.tasks, 1, 0), true),
            (Work::Branches { key, depth }, Purpose::Train) => {
                (self.branch_plans(key, *depth)?, false)
            }
        };
        let scaffold: Option<Arc<ScaffoldRenderer>> = match (&msg.scaffold, train) {
            (Some(bank), true) => {
                let (bank, words) = (bank.clone(), setup.scaffold_words);
                Some(Arc::new(move |task_type: &str| {
                    let r = bank.render(task_type, words);
                    (r.text, r.version)
                }))
            }
            _ => None,
        };
        let dynamic = setup
            .dynamic_sampling
            .filter(|d| train && msg.work == Work::Groups && version >= d.cold_start_updates);
        let spec = RolloutSpec {
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
            scaffold,
            capture_boundaries: capture,
            keep_anchor_states: setup.keep_anchor_states,
            batch_invariant: setup.batch_invariant,
            // GN-5: re-rolls join the stream (RO-9).
            reroll: dynamic.map(|d| Reroll {
                max_tries: d.max_tries,
                anchors: anchors > 0,
            }),
            // RO-10: only training batches of an async run follow the board.
            follow_weights: setup.follow_weights && train,
        };
        let start = std::time::Instant::now();
        let Some((loaded, models)) = self.models.as_mut() else {
            return Err(ActorError::Internal("no weights loaded".into()));
        };
        let mut source = LiveModels {
            models,
            version: loaded,
            epoch: self.epoch,
            board: &setup.board,
            agent_model: &setup.agent_model,
            reference: self.reference.as_ref().map(|(_, m)| m),
        };
        let (mut batch, stats, extras) =
            run_episodes(&mut source, &setup.codec, &setup.shards, &spec)?;
        let task_types = extras.task_types.clone();
        let last_failure = extras.last_failure.clone();
        let tries = extras.passes.max(1);
        let uniform = extras.uniform_groups.clone();
        if anchors > 0 {
            filter_anchors(&mut batch);
        }
        let sample_seconds = start.elapsed().as_secs_f64();
        if train && batch.trajectories.is_empty() {
            // Every episode failed in its env (RO-4): nothing to store; the controller retries.
            return Err(ActorError::AllEpisodesFailed {
                batch_seq: msg.batch_seq,
                failed: stats.failed_episodes,
                last_failure: last_failure.unwrap_or_else(|| "unknown".into()),
            });
        }
        let groups = if train && msg.scaffold.is_some() {
            group_records(&batch, &task_types, &setup.codec)?
        } else {
            Vec::new()
        };
        let mut trunk_depth = None;
        let key = match (&msg.work, msg.purpose) {
            (_, Purpose::Eval(_)) => None,
            (Work::Trunks { key }, Purpose::Train) => {
                let record = TrunkRecord {
                    format: TRUNK_FORMAT.into(),
                    policy_version: version,
                    trunks: batch
                        .trajectories
                        .iter()
                        .zip(extras.boundaries)
                        .map(|(t, boundaries)| Trunk {
                            task_id: t.task_id,
                            task_seed: msg
                                .tasks
                                .iter()
                                .find(|x| x.task_id == t.task_id)
                                .map(|x| x.task_seed)
                                .unwrap_or_default(),
                            boundaries,
                            final_reward: t.final_reward,
                        })
                        .collect(),
                };
                trunk_depth = Some(record.depth());
                let bytes = serde_json::to_vec(&record)
                    .map_err(|e| ActorError::Internal(format!("trunk record: {e}")))?;
                // MS-4: the key carries the controller's life tag; create-only.
                setup
                    .io
                    .block_on(setup.store.create_object(key, bytes.into()))?;
                self.trunks = Some((key.clone(), Arc::new(record)));
                None
            }
            (_, Purpose::Train) => Some(setup.io.block_on(setup.store.put_batch(&batch))?),
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
            tries,
            // Only meaningful under dynamic sampling (GN-5); 0 otherwise.
            uniform_groups: if dynamic.is_some() { uniform.len() } else { 0 },
            trunk_depth,
            groups,
        })
    }

    /// RTPO siblings: `group_size` continuations of each trunk's boundary `depth` turns from its
    /// end (trunks with fewer turns sit this depth out).
    fn branch_plans(&mut self, key: &str, depth: usize) -> Result<Vec<EpisodePlan>, ActorError> {
        let record = self.trunk_record(key)?;
        let mut plans = Vec::new();
        for trunk in &record.trunks {
            let k = trunk.boundaries.len();
            if depth >= k {
                continue;
            }
            let boundary = &trunk.boundaries[k - 1 - depth];
            for _ in 0..self.setup.group_size {
                plans.push(EpisodePlan {
                    task: TaskRef {
                        task_id: trunk.task_id,
                        task_seed: trunk.task_seed,
                    },
                    group_id: sibling_group(trunk.task_id, depth),
                    source: Source::OnPolicy,
                    start: Some(boundary.clone()),
                });
            }
        }
        Ok(plans)
    }
}

/// The generator's loaded models during a rollout; with `follow_weights` they take newer
/// versions of the same board epoch between decode steps (RO-10).
struct LiveModels<'a> {
    models: &'a mut Vec<HfModel>,
    /// The version loaded (kept up to date for the generator's next batch).
    version: &'a mut u64,
    epoch: u64,
    board: &'a WeightBoard,
    agent_model: &'a [usize],
    reference: Option<&'a HfModel>,
}

impl ModelSource for LiveModels<'_> {
    fn policy_models(&self) -> usize {
        self.models.len()
    }

    fn agent_model(&self) -> &[usize] {
        self.agent_model
    }

    fn model(&self, slot: usize) -> Result<&HfModel, ActorError> {
        match self.models.get(slot) {
            Some(m) => Ok(m),
            None => reference_or_error(self.reference),
        }
    }

    fn refresh(&mut self) -> Result<Option<u64>, ActorError> {
        let Some(p) = self.board.latest() else {
            return Ok(None);
        };
        // A rewind's weights (new epoch) or another model layout wait for the next batch.
        if p.epoch != self.epoch
            || p.version <= *self.version
            || p.extra_models.len() + 1 != self.models.len()
        {
            return Ok(None);
        }
        for (k, m) in self.models.iter_mut().enumerate() {
            let bytes = p
                .model(k)
                .ok_or_else(|| ActorError::Internal(format!("agent model {k} missing")))?;
            m.load_safetensors(bytes)?;
        }
        *self.version = p.version;
        Ok(Some(p.version))
    }
}

/// ARMOR's group construction (spec §4.2, GN-7): a group keeps its first successful anchor
/// episode when its on-policy episodes are neither all right nor all wrong; every other anchor
/// episode is dropped.
fn filter_anchors(batch: &mut RolloutBatch) {
    let mut groups: std::collections::BTreeMap<u64, Vec<&keel_store::Trajectory>> =
        Default::default();
    for t in &batch.trajectories {
        groups.entry(t.group_id).or_default().push(t);
    }
    let informative: Vec<u64> = groups
        .into_iter()
        .filter(|(_, ts)| !uninformative(ts.iter().copied(), false))
        .map(|(g, _)| g)
        .collect();
    let mut taken = std::collections::BTreeSet::new();
    batch.trajectories.retain(|t| {
        t.source == Source::OnPolicy
            || (t.final_reward >= 1.0
                && informative.contains(&t.group_id)
                && taken.insert(t.group_id))
    });
}

/// PATS evidence: each group's episodes as decoded actions and observations.
fn group_records(
    batch: &RolloutBatch,
    task_types: &[String],
    codec: &ChatCodec,
) -> Result<Vec<GroupRecord>, ActorError> {
    let mut groups: Vec<GroupRecord> = Vec::new();
    for (t, ty) in batch.trajectories.iter().zip(task_types) {
        let spans: Vec<(usize, usize, bool)> = t
            .turns
            .iter()
            .map(|u| (u.start as usize, u.end as usize, u.invalid_action))
            .collect();
        let episode = crate::pats_seed::episode_record(&t.tokens, &spans, t.final_reward, codec)?;
        match groups.iter_mut().find(|g| g.task_id == t.task_id) {
            Some(g) => g.episodes.push(episode),
            None => groups.push(GroupRecord {
                task_id: t.task_id,
                task_type: ty.clone(),
                episodes: vec![episode],
            }),
        }
    }
    Ok(groups)
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
