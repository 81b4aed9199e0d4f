//! Rollout groups in, evidence cards out.

use serde::{Deserialize, Serialize};

use super::error::ScaffoldError;
use super::text::normalise;

/// One agent turn of a rollout.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TurnRecord {
    /// The decoded action text (the visible part of the chat codec's `response_text`, CC-3, AX-1).
    pub action: String,
    /// The environment's answer (may be empty on the last turn).
    pub observation: String,
    /// Whether the env rejected the action (`StepOutcome::invalid_action`).
    pub invalid: bool,
}

/// One rollout of a group.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EpisodeRecord {
    /// Final reward, in `[0, 1]` (EN-5).
    pub reward: f32,
    /// Whether the episode was solved.
    pub success: bool,
    /// The turns, in order.
    pub turns: Vec<TurnRecord>,
}

impl EpisodeRecord {
    /// Number of invalid turns.
    pub fn invalid_count(&self) -> usize {
        self.turns.iter().filter(|t| t.invalid).count()
    }
}

/// The rollout group of one task, sampled by the latest policy (with the scaffold).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GroupRecord {
    /// The task.
    pub task_id: u64,
    /// `Env::task_type` of the task.
    pub task_type: String,
    /// The group's rollouts (at least one).
    pub episodes: Vec<EpisodeRecord>,
}

impl GroupRecord {
    /// Mean final reward of the episodes (the success rate for binary rewards); 0 when empty.
    pub fn mean_reward(&self) -> f64 {
        if self.episodes.is_empty() {
            return 0.0;
        }
        self.episodes
            .iter()
            .map(|e| f64::from(e.reward))
            .sum::<f64>()
            / self.episodes.len() as f64
    }

    pub(crate) fn validate(&self) -> Result<(), ScaffoldError> {
        let bad = |reason: String| ScaffoldError::InvalidGroup {
            task_id: self.task_id,
            task_type: self.task_type.clone(),
            reason,
        };
        if self.task_type.trim().is_empty() {
            return Err(bad("empty task type".into()));
        }
        if self.episodes.is_empty() {
            return Err(bad("no episodes".into()));
        }
        for (i, e) in self.episodes.iter().enumerate() {
            if !(0.0..=1.0).contains(&e.reward) {
                return Err(bad(format!(
                    "episode {i} has reward {}, expected a number in [0, 1]",
                    e.reward
                )));
            }
        }
        Ok(())
    }
}

/// The summary of one rollout group the reviewer reads.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EvidenceCard {
    /// Unique over the run (edits cite it).
    pub id: u64,
    /// The RL step whose rollouts it summarises.
    pub step: u64,
    /// The task.
    pub task_id: u64,
    /// The task's type.
    pub task_type: String,
    /// The rollouts: outcome, actions and feedback per turn (texts normalised).
    pub episodes: Vec<EpisodeRecord>,
    /// Mean final reward of the group.
    pub mean_reward: f64,
    /// Solved rollouts.
    pub successes: usize,
    /// Whether the group holds both solved and unsolved rollouts (successes contrast failures).
    pub contrastive: bool,
}

impl EvidenceCard {
    /// The card `id` of `group` at `step`.
    pub fn from_group(id: u64, step: u64, group: &GroupRecord) -> EvidenceCard {
        let episodes: Vec<EpisodeRecord> = group
            .episodes
            .iter()
            .map(|e| EpisodeRecord {
                reward: e.reward,
                success: e.success,
                turns: e
                    .turns
                    .iter()
                    .map(|t| TurnRecord {
                        action: normalise(&t.action),
                        observation: normalise(&t.observation),
                        invalid: t.invalid,
                    })
                    .collect(),
            })
            .collect();
        let successes = episodes.iter().filter(|e| e.success).count();
        EvidenceCard {
            id,
            step,
            task_id: group.task_id,
            task_type: group.task_type.clone(),
            mean_reward: group.mean_reward(),
            contrastive: successes > 0 && successes < episodes.len(),
            successes,
            episodes,
        }
    }
}
