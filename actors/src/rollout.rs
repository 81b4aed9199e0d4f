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

use std::sync::mpsc;
use std::time::{Duration, Instant};

use actix::Addr;

use keel_envs::{EnvSnapshot, StepOutcome};
use keel_learner::hf::{ChatCodec, Completion, GenRequest, HfModel, Sampler, SamplingParams};
use keel_store::{RolloutBatch, Source, Trajectory, Turn};

use crate::demo_tokens::scaffolded_prompt;
use crate::env_shard::{
    CloseEpisodes, EnvAnswer, EnvOp, EnvReply, EnvRequest, EnvShard, EpisodeError, Reply,
    ResetOutcome,
};
use crate::error::ActorError;
use crate::seeds::mix_seed;

/// Most sequences one sampler decodes at once (its KV-cache slots); more requests queue
/// (continuous batching, SA-2).
const MAX_SAMPLER_SLOTS: usize = 256;

/// A task to roll out: its id in the run's task order and its env seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

    /// Index of the model that samples a turn of `agent` in an episode of `source`
    /// (`models.len()` = the reference).
    fn slot(&self, source: Source, agent: u32) -> usize {
        match source {
            Source::Anchor => self.models.len(),
            Source::OnPolicy => self
                .agent_model
                .get(agent as usize)
                .copied()
                .filter(|&m| m < self.models.len())
                .unwrap_or(0),
        }
    }

    fn model(&self, slot: usize) -> Result<&'a HfModel, ActorError> {
        if slot < self.models.len() {
            Ok(self.models[slot])
        } else {
            self.reference.ok_or_else(|| {
                ActorError::Internal("an anchor episode needs the reference model".into())
            })
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
    /// The model's context length: episodes that would exceed it are truncated (reward 0).
    pub context_len: usize,
    /// Seed of the sampling RNG (RO-3).
    pub rng_seed: u64,
    /// First trajectory id (ids are `first_id + plan index`).
    pub first_id: u64,
    /// PATS: renders the scaffold put before each reset prompt (RO-6).
    pub scaffold: Option<std::sync::Arc<ScaffoldRenderer>>,
    /// RTPO: record the boundary state before every turn (RO-5).
    pub capture_boundaries: bool,
    /// SA-7: sample with fixed forward shapes, so that a trajectory does not depend on which
    /// episodes it shared the sampler with (RO-3 under streaming).
    pub batch_invariant: bool,
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
}

struct Episode {
    id: u64,
    shard: usize,
    traj: Trajectory,
    done: bool,
    failed: bool,
    success: bool,
    agent: u32,
    anchor: u64,
    task_type: String,
    boundaries: Vec<BoundaryState>,
    /// Where the turn being sampled or stepped starts.
    turn_start: usize,
    /// When the episode ended (RO-8).
    finished: Option<Instant>,
    /// The env ended the episode (so its shard already dropped it).
    env_ended: bool,
}

fn shard_of(episode: u64, n: usize) -> usize {
    (episode % n as u64) as usize
}

fn push_context(traj: &mut Trajectory, ids: &[u32]) {
    traj.loss_mask.extend(std::iter::repeat_n(0u8, ids.len()));
    traj.behaviour_logprobs
        .extend(std::iter::repeat_n(0f32, ids.len()));
    traj.tokens.extend_from_slice(ids);
}

/// How long the engine waits for an env answer before looking again (nothing else is to do
/// while it waits: every sampler is idle).
const ANSWER_POLL: Duration = Duration::from_millis(200);

/// One rollout in flight: the episodes, their samplers and the env answers coming back
/// (module doc, RO-8).
struct Engine<'a, 'p> {
    policies: &'a Policies<'p>,
    codec: &'a ChatCodec,
    shards: &'a [Addr<EnvShard>],
    spec: &'a RolloutSpec,
    episodes: Vec<Episode>,
    samplers: Vec<Option<Sampler>>,
    stats: RolloutStats,
    params: SamplingParams,
    answers: (mpsc::Sender<EnvAnswer>, mpsc::Receiver<EnvAnswer>),
    last_failure: Option<String>,
    /// Requests sent to shards and not answered yet.
    in_env: usize,
    started: Instant,
}

impl<'a, 'p> Engine<'a, 'p> {
    fn new(
        policies: &'a Policies<'p>,
        codec: &'a ChatCodec,
        shards: &'a [Addr<EnvShard>],
        spec: &'a RolloutSpec,
    ) -> Self {
        let episodes = spec
            .plans
            .iter()
            .enumerate()
            .map(|(k, plan)| {
                let id = spec.first_id + k as u64;
                Episode {
                    id,
                    shard: shard_of(id, shards.len()),
                    traj: Trajectory {
                        trajectory_id: id,
                        group_id: plan.group_id,
                        task_id: plan.task.task_id,
                        env_name: spec.env_name.clone(),
                        agent_id: 0,
                        tokens: Vec::new(),
                        loss_mask: Vec::new(),
                        behaviour_logprobs: Vec::new(),
                        turns: Vec::new(),
                        final_reward: 0.0,
                        source: plan.source,
                        scaffold_version: 0,
                        trained_turn: plan.start.as_ref().map(|_| 0),
                    },
                    done: false,
                    failed: false,
                    success: false,
                    agent: 0,
                    anchor: 0,
                    task_type: String::new(),
                    boundaries: Vec::new(),
                    turn_start: 0,
                    finished: None,
                    env_ended: false,
                }
            })
            .collect();
        Engine {
            policies,
            codec,
            shards,
            spec,
            episodes,
            samplers: Vec::new(),
            stats: RolloutStats::default(),
            params: SamplingParams {
                temperature: if spec.greedy { 0.0 } else { spec.temperature },
                max_new_tokens: spec.max_turn_tokens,
                stop_token_ids: vec![codec.end_of_turn()],
                ..SamplingParams::default()
            },
            answers: mpsc::channel(),
            last_failure: None,
            in_env: 0,
            started: Instant::now(),
        }
    }

    /// Sends one episode's request to its shard; the answer comes back on the channel.
    fn to_env(&mut self, i: usize, op: EnvOp) {
        let ep = &self.episodes[i];
        self.shards[ep.shard].do_send(EnvRequest {
            episode: ep.id,
            op,
            snapshot: self.spec.capture_boundaries,
            reply: Reply::to_channel(ep.id, self.answers.0.clone()),
        });
        self.in_env += 1;
    }

    /// Runs every episode to its end: no episode waits for another (RO-8).
    fn run(&mut self) -> Result<(), ActorError> {
        for i in 0..self.episodes.len() {
            let op = match &self.spec.plans[i].start {
                None => EnvOp::Reset(self.spec.plans[i].task.task_seed),
                Some(b) => EnvOp::Restore(b.snapshot.clone()),
            };
            self.to_env(i, op);
        }
        loop {
            while let Ok(answer) = self.answers.1.try_recv() {
                self.on_answer(answer)?;
            }
            let busy: Vec<usize> = (0..self.samplers.len())
                .filter(|&s| self.samplers[s].as_ref().is_some_and(|x| !x.is_idle()))
                .collect();
            if busy.is_empty() {
                if self.in_env == 0 {
                    return Ok(());
                }
                // Every sampler is idle: wait for the env.
                if let Ok(answer) = self.answers.1.recv_timeout(ANSWER_POLL) {
                    self.on_answer(answer)?;
                }
                continue;
            }
            for slot in busy {
                let model = self.policies.model(slot)?;
                let Some(sampler) = self.samplers[slot].as_mut() else {
                    continue;
                };
                for (i, completion) in sampler.step(model)? {
                    self.on_completion(i, completion);
                }
            }
        }
    }

    /// A sampled turn: record it and send its action to the env. A turn that does not decode
    /// is an empty (invalid) action, never an error.
    fn on_completion(&mut self, i: usize, c: Completion) {
        let t = &mut self.episodes[i].traj;
        self.stats.sampled_tokens += c.tokens.len();
        t.loss_mask.extend(std::iter::repeat_n(1u8, c.tokens.len()));
        t.tokens.extend(c.tokens);
        t.behaviour_logprobs.extend(c.logprobs);
        let start = self.episodes[i].turn_start;
        let action = self
            .codec
            .action_text(&self.episodes[i].traj.tokens[start..])
            .unwrap_or_default();
        self.to_env(i, EnvOp::Step(action));
    }

    fn on_answer(&mut self, answer: EnvAnswer) -> Result<(), ActorError> {
        self.in_env = self.in_env.saturating_sub(1);
        let Some(i) = answer
            .episode
            .checked_sub(self.spec.first_id)
            .map(|k| k as usize)
            .filter(|&k| k < self.episodes.len())
        else {
            return Err(ActorError::Internal(format!(
                "an env shard answered for unknown episode {}",
                answer.episode
            )));
        };
        match answer.result {
            Ok(EnvReply::Started(start)) => self.started_episode(i, start)?,
            Ok(EnvReply::Restored) => {
                let plan = &self.spec.plans[i];
                let ep = &mut self.episodes[i];
                match &plan.start {
                    Some(b) => {
                        push_context(&mut ep.traj, &b.tokens);
                        ep.agent = b.agent_id;
                        ep.anchor = b.anchor_key;
                        ep.task_type = b.task_type.clone();
                    }
                    None => {
                        let lost = EpisodeError::Lost(ep.id);
                        self.fail(i, &lost);
                        return Ok(());
                    }
                }
            }
            Ok(EnvReply::Stepped(outcome)) => {
                if !self.stepped(i, outcome)? {
                    return Ok(());
                }
            }
            Err(e) => {
                self.fail(i, &e);
                return Ok(());
            }
        }
        self.next_turn(i, answer.snapshot)
    }

    fn started_episode(&mut self, i: usize, start: ResetOutcome) -> Result<(), ActorError> {
        let (scaffold, version) = match &self.spec.scaffold {
            Some(render) => render(&start.task_type),
            None => (String::new(), 0),
        };
        let ids = self
            .codec
            .prompt(&scaffolded_prompt(&scaffold, &start.prompt))?;
        self.stats.prompt_tokens += ids.len();
        let ep = &mut self.episodes[i];
        if !scaffold.is_empty() {
            self.stats.scaffold_tokens += self.codec.count(&scaffold)?;
            ep.traj.scaffold_version = version;
        }
        push_context(&mut ep.traj, &ids);
        ep.agent = start.agent_id;
        ep.anchor = start.anchor_key;
        ep.task_type = start.task_type;
        Ok(())
    }

    /// Records a stepped turn; false when the episode ended.
    fn stepped(&mut self, i: usize, outcome: StepOutcome) -> Result<bool, ActorError> {
        let version = self.spec.policy_version;
        let ep = &mut self.episodes[i];
        self.stats.turns += 1;
        self.stats.invalid_turns += usize::from(outcome.invalid_action);
        ep.traj.turns.push(Turn {
            start: ep.turn_start as u32,
            end: ep.traj.tokens.len() as u32,
            policy_version: version,
            reward: outcome.reward,
            invalid_action: outcome.invalid_action,
            agent_id: ep.agent,
            anchor_key: ep.anchor,
        });
        ep.agent = outcome.agent_id;
        ep.anchor = outcome.anchor_key;
        if outcome.done {
            ep.done = true;
            ep.env_ended = true;
            ep.finished = Some(Instant::now());
            ep.traj.final_reward = outcome.reward;
            ep.success = outcome.reward >= 1.0;
            return Ok(false);
        }
        let ids = self.codec.observation(&outcome.observation)?;
        push_context(&mut ep.traj, &ids);
        Ok(true)
    }

    /// The episode's observation is in: truncate it if another turn cannot fit, else record the
    /// boundary (RO-5) and queue its next turn in its model's sampler.
    fn next_turn(&mut self, i: usize, snapshot: Option<EnvSnapshot>) -> Result<(), ActorError> {
        let spec = self.spec;
        let ep = &mut self.episodes[i];
        if ep.traj.tokens.len() + spec.max_turn_tokens + 8 > spec.context_len {
            ep.done = true;
            ep.finished = Some(Instant::now());
            return Ok(());
        }
        if spec.capture_boundaries {
            let Some(snapshot) = snapshot else {
                let e = EpisodeError::Failed(ep.id, "the shard sent no boundary snapshot".into());
                self.fail(i, &e);
                return Ok(());
            };
            ep.boundaries.push(BoundaryState {
                tokens: ep.traj.tokens.clone(),
                snapshot,
                agent_id: ep.agent,
                anchor_key: ep.anchor,
                task_type: ep.task_type.clone(),
            });
        }
        ep.turn_start = ep.traj.tokens.len();
        let slot = self.policies.slot(ep.traj.source, ep.agent);
        let request = GenRequest {
            prompt: ep.traj.tokens.clone(),
            params: self.params.clone(),
            seed: mix_seed(&[spec.rng_seed, i as u64, ep.traj.turns.len() as u64]),
        };
        let model = self.policies.model(slot)?;
        if self.samplers.len() <= slot {
            self.samplers.resize_with(slot + 1, || None);
        }
        let sampler = match &mut self.samplers[slot] {
            Some(s) => s,
            empty => {
                let mut s = Sampler::new(
                    model,
                    spec.plans.len().clamp(1, MAX_SAMPLER_SLOTS),
                    spec.context_len,
                )?;
                s.set_batch_invariant(spec.batch_invariant);
                empty.insert(s)
            }
        };
        sampler.submit(model, i, request)?;
        Ok(())
    }

    fn fail(&mut self, i: usize, e: &EpisodeError) {
        let ep = &mut self.episodes[i];
        tracing::warn!(episode = ep.id, error = %e, "episode failed; excluded from the batch");
        self.last_failure = Some(e.to_string());
        ep.failed = true;
        ep.done = true;
        ep.finished = Some(Instant::now());
    }

    /// The batch, in plan order, whatever order the episodes finished in.
    fn finish(mut self) -> (RolloutBatch, RolloutStats, RolloutExtras) {
        // An episode whose trained (branched) turn never happened cannot be trained.
        for i in 0..self.episodes.len() {
            let ep = &self.episodes[i];
            if ep.traj.trained_turn.is_some() && ep.traj.turns.is_empty() && !ep.failed {
                let e = EpisodeError::Failed(ep.id, "no room for the branched turn".into());
                self.fail(i, &e);
            }
        }
        // Truncated and failed episodes may still be live on their shards.
        let open: Vec<u64> = self
            .episodes
            .iter()
            .filter(|e| !e.env_ended)
            .map(|e| e.id)
            .collect();
        if !open.is_empty() {
            for shard in self.shards {
                shard.do_send(CloseEpisodes(open.clone()));
            }
        }
        let mut stats = self.stats;
        for sampler in self.samplers.iter().flatten() {
            stats.decode_steps += sampler.stats().decode_steps;
            stats.busy_decode_steps += sampler.stats().busy_decode_steps;
        }
        let mut trajectories = Vec::with_capacity(self.episodes.len());
        let mut extras = RolloutExtras {
            last_failure: self.last_failure,
            ..RolloutExtras::default()
        };
        for ep in self.episodes {
            if ep.failed {
                stats.failed_episodes += 1;
                continue;
            }
            stats.episodes += 1;
            stats.successes += usize::from(ep.success);
            stats.reward_sum += f64::from(ep.traj.final_reward);
            extras.task_types.push(ep.task_type);
            extras.finished_seconds.push(
                ep.finished
                    .map_or(0.0, |t| t.duration_since(self.started).as_secs_f64()),
            );
            if self.spec.capture_boundaries {
                extras.boundaries.push(ep.boundaries);
            }
            trajectories.push(ep.traj);
        }
        let batch = RolloutBatch {
            run_id: self.spec.run_id.clone(),
            batch_seq: self.spec.batch_seq,
            generator_id: self.spec.generator_id,
            policy_version: self.spec.policy_version,
            created_unix_ms: unix_ms(),
            trajectories,
        };
        (batch, stats, extras)
    }
}

/// Samples every planned episode against the env shards (module doc, RO-1..RO-8).
pub fn run_episodes(
    policies: &Policies<'_>,
    codec: &ChatCodec,
    shards: &[Addr<EnvShard>],
    spec: &RolloutSpec,
) -> Result<(RolloutBatch, RolloutStats, RolloutExtras), ActorError> {
    if shards.is_empty() {
        return Err(ActorError::Internal("no env shards".into()));
    }
    let mut engine = Engine::new(policies, codec, shards, spec);
    engine.run()?;
    Ok(engine.finish())
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
