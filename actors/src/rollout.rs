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
//!   batch sequence number that a regenerated batch does not keep — so the same inputs give the
//!   same trajectories, which makes sync-mode runs reproducible across crashes.
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

use actix::Addr;
use futures::executor::block_on;

use keel_learner::hf::{ChatCodec, GenRequest, HfModel, Sampler, SamplingParams};
use keel_store::{RolloutBatch, Source, Trajectory, Turn};

use crate::demo_tokens::scaffolded_prompt;
use crate::env_shard::{
    CloseEpisodes, EnvShard, EpisodeError, ResetEpisodes, RestoreEpisodes, SnapshotEpisodes,
    StepEpisodes,
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
    }
}

/// What a rollout produced, beyond the batch.
#[derive(Debug, Clone, Default)]
pub struct RolloutExtras {
    /// Task type of each trajectory of the batch, in order.
    pub task_types: Vec<String>,
    /// RTPO: per trajectory, the boundary before each of its turns (when captured).
    pub boundaries: Vec<Vec<BoundaryState>>,
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

/// One episode's answer from its shard: `(episode index, answer)`.
type ShardAnswer<R> = (usize, Result<R, EpisodeError>);

/// Sends one message per shard carrying the requests of the episodes on that shard; answers in
/// request order (ES-3).
fn per_shard<Q, M, R>(
    shards: &[Addr<EnvShard>],
    episodes: &[Episode],
    which: &[usize],
    request: impl Fn(usize) -> Q,
    message: impl Fn(Vec<Q>) -> M,
) -> Result<Vec<ShardAnswer<R>>, ActorError>
where
    M: actix::Message<Result = Vec<Result<R, EpisodeError>>> + Send + 'static,
    M::Result: Send,
    EnvShard: actix::Handler<M>,
    R: 'static,
{
    let mut out = Vec::with_capacity(which.len());
    for (s, shard) in shards.iter().enumerate() {
        let mine: Vec<usize> = which
            .iter()
            .copied()
            .filter(|&i| episodes[i].shard == s)
            .collect();
        if mine.is_empty() {
            continue;
        }
        let answers = block_on(shard.send(message(mine.iter().map(|&i| request(i)).collect())))
            .map_err(|e| ActorError::Mailbox(format!("env shard {s}: {e}")))?;
        if answers.len() != mine.len() {
            return Err(ActorError::Internal(format!(
                "env shard {s} answered {} of {} requests",
                answers.len(),
                mine.len()
            )));
        }
        out.extend(mine.into_iter().zip(answers));
    }
    Ok(out)
}

/// Samples every planned episode against the env shards (module doc, RO-1..RO-6).
pub fn run_episodes(
    policies: &Policies<'_>,
    codec: &ChatCodec,
    shards: &[Addr<EnvShard>],
    spec: &RolloutSpec,
) -> Result<(RolloutBatch, RolloutStats, RolloutExtras), ActorError> {
    if shards.is_empty() {
        return Err(ActorError::Internal("no env shards".into()));
    }
    let mut samplers: Vec<Option<Sampler>> = Vec::new();
    let mut stats = RolloutStats::default();
    let mut episodes: Vec<Episode> = spec
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
            }
        })
        .collect();

    // Start every episode: reset (with the scaffold before the prompt) or restore a boundary.
    let fresh: Vec<usize> = (0..episodes.len())
        .filter(|&i| spec.plans[i].start.is_none())
        .collect();
    let resets = per_shard(
        shards,
        &episodes,
        &fresh,
        |i| (episodes[i].id, spec.plans[i].task.task_seed),
        ResetEpisodes,
    )?;
    for (i, answer) in resets {
        let ep = &mut episodes[i];
        match answer {
            Ok(start) => {
                let (scaffold, version) = match &spec.scaffold {
                    Some(render) => render(&start.task_type),
                    None => (String::new(), 0),
                };
                let ids = codec.prompt(&scaffolded_prompt(&scaffold, &start.prompt))?;
                stats.prompt_tokens += ids.len();
                if !scaffold.is_empty() {
                    stats.scaffold_tokens += codec.count(&scaffold)?;
                    ep.traj.scaffold_version = version;
                }
                push_context(&mut ep.traj, &ids);
                ep.agent = start.agent_id;
                ep.anchor = start.anchor_key;
                ep.task_type = start.task_type;
            }
            Err(e) => fail(ep, &e),
        }
    }
    let resumed: Vec<usize> = (0..episodes.len())
        .filter(|&i| spec.plans[i].start.is_some())
        .collect();
    let restores = per_shard(
        shards,
        &episodes,
        &resumed,
        |i| {
            let snap = spec.plans[i]
                .start
                .as_ref()
                .map(|b| b.snapshot.clone())
                .unwrap_or_else(|| keel_envs::EnvSnapshot {
                    env: String::new(),
                    state: serde_json::Value::Null,
                });
            (episodes[i].id, snap)
        },
        RestoreEpisodes,
    )?;
    for (i, answer) in restores {
        let ep = &mut episodes[i];
        match (answer, &spec.plans[i].start) {
            (Ok(()), Some(b)) => {
                push_context(&mut ep.traj, &b.tokens);
                ep.agent = b.agent_id;
                ep.anchor = b.anchor_key;
                ep.task_type = b.task_type.clone();
            }
            (Err(e), _) => fail(ep, &e),
            (Ok(()), None) => fail(ep, &EpisodeError::Lost(ep.id)),
        }
    }

    loop {
        // Truncate episodes that could not fit another turn and its observation.
        for ep in episodes.iter_mut().filter(|e| !e.done) {
            if ep.traj.tokens.len() + spec.max_turn_tokens + 8 > spec.context_len {
                ep.done = true;
            }
        }
        let active: Vec<usize> = (0..episodes.len()).filter(|&i| !episodes[i].done).collect();
        if active.is_empty() {
            break;
        }
        if spec.capture_boundaries {
            capture(shards, &mut episodes, &active)?;
        }
        let starts: Vec<usize> = active
            .iter()
            .map(|&i| episodes[i].traj.tokens.len())
            .collect();
        // Sample one agent turn for every active episode, batched per model (KV-cache sampler).
        let mut slots: Vec<usize> = active
            .iter()
            .map(|&i| policies.slot(episodes[i].traj.source, episodes[i].agent))
            .collect();
        slots.sort_unstable();
        slots.dedup();
        for slot in slots {
            let model = policies.model(slot)?;
            let sampling: Vec<usize> = active
                .iter()
                .copied()
                .filter(|&i| policies.slot(episodes[i].traj.source, episodes[i].agent) == slot)
                .collect();
            if samplers.len() <= slot {
                samplers.resize_with(slot + 1, || None);
            }
            let sampler = match &mut samplers[slot] {
                Some(s) => s,
                empty => empty.insert(Sampler::new(
                    model,
                    spec.plans.len().clamp(1, MAX_SAMPLER_SLOTS),
                    spec.context_len,
                )?),
            };
            let params = SamplingParams {
                temperature: if spec.greedy { 0.0 } else { spec.temperature },
                max_new_tokens: spec.max_turn_tokens,
                stop_token_ids: vec![codec.end_of_turn()],
                ..SamplingParams::default()
            };
            let requests = sampling
                .iter()
                .map(|&i| {
                    let t = &episodes[i].traj;
                    GenRequest {
                        prompt: t.tokens.clone(),
                        params: params.clone(),
                        seed: mix_seed(&[spec.rng_seed, i as u64, t.turns.len() as u64]),
                    }
                })
                .collect();
            let completions = sampler.generate(model, requests)?;
            for (&i, c) in sampling.iter().zip(completions) {
                let t = &mut episodes[i].traj;
                stats.sampled_tokens += c.tokens.len();
                t.loss_mask.extend(std::iter::repeat_n(1u8, c.tokens.len()));
                t.tokens.extend(c.tokens);
                t.behaviour_logprobs.extend(c.logprobs);
            }
        }
        // Send the actions to the shards, one message per shard. A turn that does not decode
        // is an empty (invalid) action, never an error.
        let actions: std::collections::HashMap<usize, String> = active
            .iter()
            .zip(&starts)
            .map(|(&i, &start)| {
                let ids = &episodes[i].traj.tokens[start..];
                (i, codec.action_text(ids).unwrap_or_default())
            })
            .collect();
        let steps = per_shard(
            shards,
            &episodes,
            &active,
            |i| (episodes[i].id, actions.get(&i).cloned().unwrap_or_default()),
            StepEpisodes,
        )?;
        let mut outcomes: Vec<Option<Result<keel_envs::StepOutcome, EpisodeError>>> =
            vec![None; episodes.len()];
        for (i, answer) in steps {
            outcomes[i] = Some(answer);
        }
        for (&i, &start) in active.iter().zip(&starts) {
            let ep = &mut episodes[i];
            let end = ep.traj.tokens.len();
            match outcomes[i].take() {
                Some(Ok(outcome)) => {
                    stats.turns += 1;
                    stats.invalid_turns += usize::from(outcome.invalid_action);
                    ep.traj.turns.push(Turn {
                        start: start as u32,
                        end: end as u32,
                        policy_version: spec.policy_version,
                        reward: outcome.reward,
                        invalid_action: outcome.invalid_action,
                        agent_id: ep.agent,
                        anchor_key: ep.anchor,
                    });
                    ep.agent = outcome.agent_id;
                    ep.anchor = outcome.anchor_key;
                    if outcome.done {
                        ep.done = true;
                        ep.traj.final_reward = outcome.reward;
                        ep.success = outcome.reward >= 1.0;
                    } else {
                        let ids = codec.observation(&outcome.observation)?;
                        push_context(&mut ep.traj, &ids);
                    }
                }
                Some(Err(e)) => fail(ep, &e),
                None => fail(ep, &EpisodeError::Lost(ep.id)),
            }
        }
    }
    // An episode whose trained (branched) turn never happened cannot be trained.
    for ep in episodes.iter_mut() {
        if ep.traj.trained_turn.is_some() && ep.traj.turns.is_empty() && !ep.failed {
            fail(
                ep,
                &EpisodeError::Failed(ep.id, "no room for the branched turn".into()),
            );
        }
    }
    let open: Vec<u64> = episodes
        .iter()
        .filter(|e| !e.done || e.failed)
        .map(|e| e.id)
        .collect();
    if !open.is_empty() {
        for shard in shards {
            shard.do_send(CloseEpisodes(open.clone()));
        }
    }

    let mut trajectories = Vec::with_capacity(episodes.len());
    let mut extras = RolloutExtras::default();
    for ep in episodes {
        if ep.failed {
            stats.failed_episodes += 1;
            continue;
        }
        stats.episodes += 1;
        stats.successes += usize::from(ep.success);
        stats.reward_sum += f64::from(ep.traj.final_reward);
        extras.task_types.push(ep.task_type);
        if spec.capture_boundaries {
            extras.boundaries.push(ep.boundaries);
        }
        trajectories.push(ep.traj);
    }
    let batch = RolloutBatch {
        run_id: spec.run_id.clone(),
        batch_seq: spec.batch_seq,
        generator_id: spec.generator_id,
        policy_version: spec.policy_version,
        created_unix_ms: unix_ms(),
        trajectories,
    };
    Ok((batch, stats, extras))
}

/// Records the boundary state of every active episode before its next turn (RO-5).
fn capture(
    shards: &[Addr<EnvShard>],
    episodes: &mut [Episode],
    active: &[usize],
) -> Result<(), ActorError> {
    let snaps = per_shard(
        shards,
        episodes,
        active,
        |i| episodes[i].id,
        SnapshotEpisodes,
    )?;
    for (i, answer) in snaps {
        let ep = &mut episodes[i];
        match answer {
            Ok(snapshot) => ep.boundaries.push(BoundaryState {
                tokens: ep.traj.tokens.clone(),
                snapshot,
                agent_id: ep.agent,
                anchor_key: ep.anchor,
                task_type: ep.task_type.clone(),
            }),
            Err(e) => fail(ep, &e),
        }
    }
    Ok(())
}

fn fail(ep: &mut Episode, e: &EpisodeError) {
    tracing::warn!(episode = ep.id, error = %e, "episode failed; excluded from the batch");
    ep.failed = true;
    ep.done = true;
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
