//! Multi-turn episode sampling: the generator's inner loop, token-in / token-out.
//!
//! Invariants:
//! - RO-1: a trajectory's tokens are exactly the first prompt, the tokens sampled and the
//!   observation tokens, all rendered by the chat codec (CC-1..3, the layout SFT demonstrations
//!   use too, DT-1); history is never re-tokenised.
//! - RO-2: every sampled token has its behaviour log-prob recorded as the KV-cache sampler
//!   reports it, `log_softmax(logits / T)` over the full vocabulary (SP-1, what the learner
//!   recomputes, MD-5), and every turn records the policy version that sampled it.
//! - RO-3: sampling is a pure function of (weights, tasks, rng seed): each turn's draw is seeded
//!   by (rng seed, plan index, turn index) (SA-4) — not by the trajectory id, which carries the
//!   batch sequence number that a regenerated batch does not keep — and, with `batch_invariant`
//!   (SA-7), does not depend on which episodes share a decoding step, so the same inputs give
//!   the same trajectories however the env's timing interleaves them: sync-mode runs are
//!   reproducible across crashes.
//! - RO-4: episodes that failed in their env (ES-1, ES-2) are excluded from the batch and counted.
//! - RO-5 (RTPO): with `capture_boundaries` the exact token context and the env snapshot before
//!   every turn are recorded; a plan with a `start` continues from such a boundary: its context
//!   tokens are kept with mask 0, and its first sampled turn is the trajectory's `trained_turn`.
//! - RO-6 (PATS): a reset prompt is `scaffold + " " + prompt` when a renderer is set (DT-2);
//!   the tokens hold the exact rendered prompt and the trajectory records the scaffold version
//!   (0 = none).
//! - RO-7: each turn records the agent that produced it and the env's anchor key of the state it
//!   answered (EN-8); each turn is sampled by the model of its agent (`Policies`), anchor episodes
//!   by the reference model.
//! - RO-8 (streaming): each episode is its own state machine — env (reset/restore/step) →
//!   sampler → env … — with no barrier across episodes: an episode whose observation arrives is
//!   queued in its model's sampler at once and joins the next decoding step (SA-2), its action
//!   goes to its shard as soon as its turn is sampled, and a finished episode frees its slot at
//!   once. The batch lists trajectories in plan order, whatever order they finished in.
//! - RO-9 (dynamic sampling in the stream): with `reroll`, a group is judged the moment its last
//!   episode ends; an uninformative one (GN-5) is rolled out again at once — same task, fresh
//!   seeds from (rng seed, attempt, plan, turn) — while the other groups go on, up to
//!   `max_tries` attempts. The batch keeps each group's first informative attempt, or its first
//!   attempt if none became informative; the stats count every episode sampled.
//! - RO-10 (weights in flight, async): with `follow_weights`, newer published weights reach the
//!   samplers between decode steps and episodes in flight continue under them; each turn
//!   records the version of its first token and, per token, the versions that took over while
//!   it was sampled (RB-5 `version_changes`, from the samplers' marks: SA-8, VQ-4), so the
//!   learner's staleness check on a turn's oldest token (LA-2) is per token. The batch records the version it
//!   started with. The admission bound (AS-1) is taken on that start version, so no token of the
//!   batch can ever be older than the bound allows and no episode has to be restarted.
//! - RO-11 (context bound): no trajectory holds more than `model.context_len` tokens. An episode
//!   whose context cannot fit another turn (`tokens + max_turn_tokens + 8 > context_len`) ends
//!   truncated with reward 0, its turns trained as sampled and an observation past the bound
//!   cut off (it is mask-0 context after the last sampled token); one whose first prompt
//!   already leaves no room for a turn fails (RO-4: excluded and counted, with the lengths).
//! - RO-13 (interruptible evaluation): a rollout given a stop signal checks it before every
//!   decode step and ends with `ActorError::Interrupted` once a stop is requested, closing its
//!   episodes on their shards; nothing of it is kept.
//! - RO-12 (segments): a step whose outcome starts a new segment (`StepOutcome::segment`, an
//!   agent that rewrote its history, AGT-3) ends the trajectory so far; the episode goes on in
//!   a fresh one whose prompt is the segment's conversation rendered whole (CC-1), never the
//!   old tokens. RO-11 holds per segment (a segment prompt with no room fails the episode).
//!   The batch lists an episode's segments in order, one trajectory each, sharing its group and
//!   final reward; the first keeps the episode's id and every one records it (RB-4). Turn
//!   seeds count the episode's turns across segments (RO-3).

use actix::Addr;

use keel_learner::hf::{ChatCodec, HfModel};
use keel_store::{RolloutBatch, Source, Trajectory};

use crate::env_shard::EnvShard;
use crate::error::ActorError;

mod engine;
mod episode_record;
mod turn_sampler;

/// Most sequences one sampler decodes at once (its KV-cache slots); more requests queue
/// (continuous batching, SA-2).
const MAX_SAMPLER_SLOTS: usize = 256;

/// A task to roll out: its id in the run's task order and its env seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TaskRef {
    /// Index of the task in the run's task order (train) or eval set.
    pub task_id: u64,
    /// Seed the environment resets with.
    pub task_seed: u64,
}

/// RTPO: a recorded turn boundary to continue from (RO-5).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BoundaryState {
    /// The exact token context before the turn (prompt, earlier turns, observations).
    pub tokens: Vec<u32>,
    /// The environment at that boundary (EN-7).
    pub snapshot: keel_envs::EnvSnapshot,
    /// The agent that acts at the boundary.
    pub agent_id: u32,
    /// Anchor key of the state at the boundary.
    pub anchor_key: u64,
    /// The canonical text of that state.
    #[serde(default)]
    pub anchor_state: String,
    /// The task's type.
    pub task_type: String,
}

/// One episode to sample.
#[derive(Debug, Clone)]
pub struct EpisodePlan {
    /// The task.
    pub task: TaskRef,
    /// Its group (GRPO group; RTPO: the boundary's sibling set).
    pub group_id: u64,
    /// `OnPolicy` samples with the policy, `Anchor` with the reference model (ARMOR).
    pub source: Source,
    /// RTPO: continue from this boundary instead of resetting; its tokens are context (mask 0)
    /// and the first sampled turn is the trained one.
    pub start: Option<BoundaryState>,
}

/// `group_size` on-policy episodes then `anchors` reference episodes per task; group = task.
pub fn group_plans(tasks: &[TaskRef], group_size: usize, anchors: usize) -> Vec<EpisodePlan> {
    let mut plans = Vec::with_capacity(tasks.len() * (group_size + anchors));
    for task in tasks {
        for k in 0..group_size + anchors {
            plans.push(EpisodePlan {
                task: *task,
                group_id: task.task_id,
                source: if k < group_size {
                    Source::OnPolicy
                } else {
                    Source::Anchor
                },
                start: None,
            });
        }
    }
    plans
}

/// The models a rollout samples with.
pub struct Policies<'a> {
    /// The policy models: one shared, or one per agent group (Dr. MAS).
    pub models: Vec<&'a HfModel>,
    /// `agent_model[a]` = index into `models` of agent `a`'s model; agents beyond it use 0.
    pub agent_model: &'a [usize],
    /// The reference model for `Source::Anchor` episodes (ARMOR).
    pub reference: Option<&'a HfModel>,
}

impl<'a> Policies<'a> {
    /// One shared policy, no reference.
    pub fn single(model: &'a HfModel) -> Self {
        Policies {
            models: vec![model],
            agent_model: &[],
            reference: None,
        }
    }
}

/// The models a rollout samples with, as the engine sees them (RO-7, RO-10).
pub trait ModelSource {
    /// The policy models (one shared, or one per agent group).
    fn policy_models(&self) -> usize;
    /// `agent_model[a]` = index of agent `a`'s model; agents beyond it use 0.
    fn agent_model(&self) -> &[usize];
    /// Model `slot` (`policy_models()` = the reference).
    fn model(&self, slot: usize) -> Result<&HfModel, ActorError>;
    /// RO-10: loads newer published policy weights, if any, and answers their version. Called
    /// between decode steps; the default never changes the weights.
    fn refresh(&mut self) -> Result<Option<u64>, ActorError> {
        Ok(None)
    }
    /// `rollout.backend = "vllm"`: the server every turn is sampled on (None: the built-in
    /// sampler).
    fn engine(&self) -> Option<crate::vllm::VllmClient> {
        None
    }
    /// WB-5: the digest of the policy weights in force, recorded by every turn; 0 = unknown
    /// (weights not taken from a board).
    fn weights_digest(&self) -> u64 {
        0
    }
}

/// Index of the model that samples a turn of `agent` in an episode of `source`
/// (`policy_models()` = the reference).
pub fn model_slot(models: &dyn ModelSource, source: Source, agent: u32) -> usize {
    let n = models.policy_models();
    match source {
        Source::Anchor => n,
        Source::OnPolicy => models
            .agent_model()
            .get(agent as usize)
            .copied()
            .filter(|&m| m < n)
            .unwrap_or(0),
    }
}

/// The reference model, or the error an anchor episode without one is.
pub fn reference_or_error(reference: Option<&HfModel>) -> Result<&HfModel, ActorError> {
    reference
        .ok_or_else(|| ActorError::Internal("an anchor episode needs the reference model".into()))
}

impl ModelSource for Policies<'_> {
    fn policy_models(&self) -> usize {
        self.models.len()
    }

    fn agent_model(&self) -> &[usize] {
        self.agent_model
    }

    fn model(&self, slot: usize) -> Result<&HfModel, ActorError> {
        match self.models.get(slot) {
            Some(m) => Ok(*m),
            None => reference_or_error(self.reference),
        }
    }
}

/// Renders the PATS scaffold for a task type: `(text, bank version)`; empty text = none.
pub type ScaffoldRenderer = dyn Fn(&str) -> (String, u64) + Send + Sync;

/// What to sample.
#[derive(Clone)]
pub struct RolloutSpec {
    /// Run name recorded in the batch.
    pub run_id: String,
    /// Sequence number of the batch.
    pub batch_seq: u64,
    /// Which generator samples it.
    pub generator_id: u32,
    /// Version of the weights in use.
    pub policy_version: u64,
    /// Environment name recorded per trajectory.
    pub env_name: String,
    /// The episodes.
    pub plans: Vec<EpisodePlan>,
    /// Sampling temperature.
    pub temperature: f64,
    /// Greedy decoding instead of sampling.
    pub greedy: bool,
    /// Most tokens per agent turn.
    pub max_turn_tokens: usize,
    /// `model.context_len`: episodes that would exceed it are truncated (reward 0, RO-11).
    pub context_len: usize,
    /// Seed of the sampling RNG (RO-3).
    pub rng_seed: u64,
    /// First trajectory id (ids are `first_id + plan index`).
    pub first_id: u64,
    /// PATS: renders the scaffold put before each reset prompt (RO-6).
    pub scaffold: Option<std::sync::Arc<ScaffoldRenderer>>,
    /// RTPO: record the boundary state before every turn (RO-5).
    pub capture_boundaries: bool,
    /// GiGPO similarity groups: store each turn's anchor-state text in the batch.
    pub keep_anchor_states: bool,
    /// SA-7: sample with fixed forward shapes, so that a trajectory does not depend on which
    /// episodes it shared the sampler with (RO-3 under streaming).
    pub batch_invariant: bool,
    /// Dynamic sampling: re-roll uninformative groups in the stream (RO-9).
    pub reroll: Option<Reroll>,
    /// RO-10: take newer weights between decode steps (async training batches).
    pub follow_weights: bool,
    /// RO-13: a stop request ends the rollout between decode steps (evaluations; a training
    /// batch always completes, so its tasks are accounted as today).
    pub stop: Option<crate::process::StopSignal>,
}

/// RO-9: how uninformative groups are rolled out again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reroll {
    /// Attempts per group in all (0 = until informative).
    pub max_tries: usize,
    /// ARMOR: a group without a successful anchor episode is uninformative too.
    pub anchors: bool,
}

/// Aggregate statistics of one rollout.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RolloutStats {
    /// Episodes completed (failed ones excluded).
    pub episodes: usize,
    /// Episodes that ended with success.
    pub successes: usize,
    /// Episodes lost to an environment failure (RO-4).
    pub failed_episodes: usize,
    /// Agent turns taken.
    pub turns: usize,
    /// Turns whose action was invalid.
    pub invalid_turns: usize,
    /// Tokens sampled from the model.
    pub sampled_tokens: usize,
    /// Sum of final rewards.
    pub reward_sum: f64,
    /// Prompt tokens of reset episodes (scaffold included).
    pub prompt_tokens: usize,
    /// Of those, scaffold tokens (PATS).
    pub scaffold_tokens: usize,
    /// Sampler decode steps.
    #[serde(default)]
    pub decode_steps: u64,
    /// Of those, steps with at least 90% of the sampler's slots busy.
    #[serde(default)]
    pub busy_decode_steps: u64,
    /// RO-10: newer weight versions taken while the rollout ran.
    #[serde(default)]
    pub weight_updates: u64,
    /// vLLM: turns aborted by a weight swap and resubmitted with their partial tokens (VQ-2).
    #[serde(default)]
    pub resubmitted_requests: u64,
    /// Agent episodes taken up from an earlier process's journal (AJ-3).
    #[serde(default)]
    pub resumed_episodes: u64,
}

impl RolloutStats {
    /// Success rate over completed episodes.
    pub fn success_rate(&self) -> f64 {
        if self.episodes == 0 {
            0.0
        } else {
            self.successes as f64 / self.episodes as f64
        }
    }

    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &RolloutStats) {
        self.episodes += other.episodes;
        self.successes += other.successes;
        self.failed_episodes += other.failed_episodes;
        self.turns += other.turns;
        self.invalid_turns += other.invalid_turns;
        self.sampled_tokens += other.sampled_tokens;
        self.reward_sum += other.reward_sum;
        self.prompt_tokens += other.prompt_tokens;
        self.scaffold_tokens += other.scaffold_tokens;
        self.decode_steps += other.decode_steps;
        self.busy_decode_steps += other.busy_decode_steps;
        self.weight_updates += other.weight_updates;
        self.resumed_episodes += other.resumed_episodes;
        self.resubmitted_requests += other.resubmitted_requests;
    }

    /// Fraction of decode steps with at least 90% of the slots busy (None before any step).
    pub fn sampler_utilization(&self) -> Option<f64> {
        (self.decode_steps > 0).then(|| self.busy_decode_steps as f64 / self.decode_steps as f64)
    }
}

/// What a rollout produced, beyond the batch.
#[derive(Debug, Clone, Default)]
pub struct RolloutExtras {
    /// Task type of each trajectory of the batch, in order.
    pub task_types: Vec<String>,
    /// RTPO: per trajectory, the boundary before each of its turns (when captured).
    pub boundaries: Vec<Vec<BoundaryState>>,
    /// Per trajectory, seconds from the rollout's start to the episode's end (RO-8).
    pub finished_seconds: Vec<f64>,
    /// The last episode failure (RO-4), in words.
    pub last_failure: Option<String>,
    /// RO-9: most attempts any group took (0 without dynamic sampling).
    pub passes: usize,
    /// RO-9: groups still uninformative after their last attempt.
    pub uniform_groups: Vec<u64>,
}

/// Whether a group's trajectories teach nothing (GN-5): all on-policy final rewards equal, or
/// (ARMOR, `anchors`) no successful anchor episode.
pub fn uninformative<'t>(group: impl Iterator<Item = &'t Trajectory>, anchors: bool) -> bool {
    let (mut rewards, mut anchor_ok) = (Vec::new(), false);
    for t in group {
        match t.source {
            Source::OnPolicy => rewards.push(t.final_reward),
            Source::Anchor => anchor_ok |= t.final_reward >= 1.0,
        }
    }
    rewards.windows(2).all(|w| w[0] == w[1]) || (anchors && !anchor_ok)
}

/// Samples every planned episode against the env shards (module doc, RO-1..RO-8).
pub fn run_episodes(
    policies: &mut dyn ModelSource,
    codec: &ChatCodec,
    shards: &[Addr<EnvShard>],
    spec: &RolloutSpec,
) -> Result<(RolloutBatch, RolloutStats, RolloutExtras), ActorError> {
    if shards.is_empty() {
        return Err(ActorError::Internal("no env shards".into()));
    }
    let mut engine = engine::Engine::new(policies, codec, shards, spec);
    engine.run()?;
    Ok(engine.finish())
}

/// Milliseconds since the Unix epoch: the process's one wall clock.
pub use crate::process::unix_ms;
