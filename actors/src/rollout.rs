//! Multi-turn episode sampling: the generator's inner loop, token-in / token-out.
//!
//! Invariants:
//! - RO-1: a trajectory's tokens are exactly the tokens sampled plus the observation tokens
//!   appended by the env; history is never re-tokenised (the layout of `keel_envs::demo`).
//! - RO-2: every sampled token has its behaviour log-prob recorded under the distribution it was
//!   sampled from, and every turn records the policy version that sampled it.
//! - RO-3: sampling is a pure function of (weights, tasks, rng seed): the same inputs give the same
//!   trajectories, which makes sync-mode runs reproducible across crashes.
//! - RO-4: episodes that failed in their env (ES-1, ES-2) are excluded from the batch and counted.

use actix::Addr;
use futures::executor::block_on;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use keel_envs::demo::{render_observation, render_prompt};
use keel_envs::Tokenizer;
use keel_learner::sampler::{greedy_next, sample_next};
use keel_learner::PolicyModel;
use keel_store::{RolloutBatch, Source, Trajectory, Turn};

use crate::env_shard::{EnvShard, EpisodeError, ResetEpisodes, StepEpisodes};
use crate::error::ActorError;

/// A task to roll out: its id in the run's task order and its env seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskRef {
    /// Index of the task in the run's task order (train) or eval set.
    pub task_id: u64,
    /// Seed the environment resets with.
    pub task_seed: u64,
}

/// What to sample.
#[derive(Debug, Clone)]
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
    /// Tasks; each is rolled out `group_size` times.
    pub tasks: Vec<TaskRef>,
    /// Episodes per task.
    pub group_size: usize,
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
}

struct Episode {
    id: u64,
    shard: usize,
    traj: Trajectory,
    done: bool,
    failed: bool,
    success: bool,
}

fn shard_of(episode: u64, n: usize) -> usize {
    (episode % n as u64) as usize
}

/// Samples `spec.tasks × spec.group_size` episodes with `model` against the env shards.
pub fn run_episodes(
    model: &PolicyModel,
    tokenizer: &Tokenizer,
    shards: &[Addr<EnvShard>],
    spec: &RolloutSpec,
) -> Result<(RolloutBatch, RolloutStats), ActorError> {
    if shards.is_empty() {
        return Err(ActorError::Internal("no env shards".into()));
    }
    let sp = tokenizer.special();
    let banned = [sp.pad, sp.bos, sp.agent];
    let mut rng = ChaCha8Rng::seed_from_u64(spec.rng_seed);
    let mut episodes: Vec<Episode> = Vec::new();
    for (t, task) in spec.tasks.iter().enumerate() {
        for g in 0..spec.group_size {
            let id = spec.batch_seq * 1_000_000 + (t * spec.group_size + g) as u64;
            episodes.push(Episode {
                id,
                shard: shard_of(id, shards.len()),
                traj: Trajectory {
                    trajectory_id: id,
                    group_id: task.task_id,
                    task_id: task.task_id,
                    env_name: spec.env_name.clone(),
                    agent_id: 0,
                    tokens: Vec::new(),
                    loss_mask: Vec::new(),
                    behaviour_logprobs: Vec::new(),
                    turns: Vec::new(),
                    final_reward: 0.0,
                    source: Source::OnPolicy,
                },
                done: false,
                failed: false,
                success: false,
            });
        }
    }

    // Reset every episode, one message per shard.
    for (s, shard) in shards.iter().enumerate() {
        let reqs: Vec<(usize, (u64, u64))> = episodes
            .iter()
            .enumerate()
            .filter(|(_, e)| e.shard == s)
            .map(|(i, e)| (i, (e.id, spec.tasks[i / spec.group_size].task_seed)))
            .collect();
        if reqs.is_empty() {
            continue;
        }
        let answers = block_on(shard.send(ResetEpisodes(reqs.iter().map(|r| r.1).collect())))
            .map_err(|e| ActorError::Mailbox(format!("env shard {s}: {e}")))?;
        for ((i, _), answer) in reqs.iter().zip(answers) {
            let ep = &mut episodes[*i];
            match answer {
                Ok(prompt) => {
                    let ids = render_prompt(tokenizer, &prompt)?;
                    ep.traj
                        .loss_mask
                        .extend(std::iter::repeat_n(0u8, ids.len()));
                    ep.traj
                        .behaviour_logprobs
                        .extend(std::iter::repeat_n(0f32, ids.len()));
                    ep.traj.tokens.extend(ids);
                }
                Err(e) => fail(ep, &e),
            }
        }
    }

    let mut stats = RolloutStats::default();
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
        // Sample one agent turn for every active episode, token by token, batched.
        let starts: Vec<usize> = active
            .iter()
            .map(|&i| episodes[i].traj.tokens.len())
            .collect();
        let mut sampling: Vec<usize> = active.clone();
        for _ in 0..spec.max_turn_tokens {
            if sampling.is_empty() {
                break;
            }
            let contexts: Vec<&[u32]> = sampling
                .iter()
                .map(|&i| episodes[i].traj.tokens.as_slice())
                .collect();
            let next = if spec.greedy {
                greedy_next(model, &contexts, &banned)?
            } else {
                sample_next(model, &contexts, spec.temperature, &banned, &mut rng)?
            };
            let mut still = Vec::with_capacity(sampling.len());
            for (&i, s) in sampling.iter().zip(next) {
                let t = &mut episodes[i].traj;
                t.tokens.push(s.token);
                t.loss_mask.push(1);
                t.behaviour_logprobs.push(s.logprob);
                stats.sampled_tokens += 1;
                if s.token != sp.eot {
                    still.push(i);
                }
            }
            sampling = still;
        }
        // Send the actions to the shards, one message per shard.
        let mut outcomes = vec![None; episodes.len()];
        for (s, shard) in shards.iter().enumerate() {
            let reqs: Vec<(usize, (u64, String))> = active
                .iter()
                .zip(&starts)
                .filter(|(&i, _)| episodes[i].shard == s)
                .map(|(&i, &start)| {
                    let action = tokenizer.decode_action(&episodes[i].traj.tokens[start..]);
                    (i, (episodes[i].id, action))
                })
                .collect();
            if reqs.is_empty() {
                continue;
            }
            let answers =
                block_on(shard.send(StepEpisodes(reqs.iter().map(|r| r.1.clone()).collect())))
                    .map_err(|e| ActorError::Mailbox(format!("env shard {s}: {e}")))?;
            for ((i, _), answer) in reqs.into_iter().zip(answers) {
                outcomes[i] = Some(answer);
            }
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
                    });
                    if outcome.done {
                        ep.done = true;
                        ep.traj.final_reward = outcome.reward;
                        ep.success = outcome.reward >= 1.0;
                    } else {
                        let ids = render_observation(tokenizer, &outcome.observation)?;
                        ep.traj
                            .loss_mask
                            .extend(std::iter::repeat_n(0u8, ids.len()));
                        ep.traj
                            .behaviour_logprobs
                            .extend(std::iter::repeat_n(0f32, ids.len()));
                        ep.traj.tokens.extend(ids);
                    }
                }
                Some(Err(e)) => fail(ep, &e),
                None => fail(ep, &EpisodeError::Lost(ep.id)),
            }
        }
    }

    let mut trajectories = Vec::with_capacity(episodes.len());
    for ep in episodes {
        if ep.failed {
            stats.failed_episodes += 1;
            continue;
        }
        stats.episodes += 1;
        stats.successes += usize::from(ep.success);
        stats.reward_sum += f64::from(ep.traj.final_reward);
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
    Ok((batch, stats))
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
