//! Rollout batches: the unit of data that flows from generators to the learner.
//!
//! A [`RolloutBatch`] holds whole trajectories, token by token, exactly as sampled. It is stored
//! as an rkyv archive (see `frame`) so the learner reads it zero-copy through [`BatchBuf`].
//!
//! Invariants:
//! - RB-1: a batch that passes [`RolloutBatch::validate`] has, in every trajectory,
//!   `loss_mask.len() == behaviour_logprobs.len() == tokens.len()`, a `loss_mask` of only 0s and
//!   1s, a `behaviour_logprob` of exactly 0.0 wherever `loss_mask == 0` and a finite one
//!   elsewhere, finite rewards, and unique trajectory ids within the batch.
//! - RB-2: turns of a valid trajectory lie inside `tokens` (`start <= end <= tokens.len()`), are
//!   ordered and do not overlap (`turns[i].end <= turns[i + 1].start`), every token with
//!   `loss_mask == 1` lies inside some turn, and `trained_turn` (RTPO) names an existing turn.
//! - RB-5 (per-token versions): a turn's `version_changes` lie strictly inside it
//!   (`start < at < end`), in token order, each with a newer `policy_version` than the one
//!   before (the turn's own first). A token's version is [`Turn::version_at`]; the turn's
//!   `policy_version`, its first token's, is the oldest, so staleness per turn is staleness per
//!   token.
//! - RB-4 (segments): every `episode_id` names a trajectory of the batch whose own
//!   `trajectory_id` is that id (the episode's first segment), of the same group, task, source
//!   and final reward. A trajectory that is not split has `episode_id == trajectory_id`.
//! - RB-3: a [`BatchBuf`] only exists for bytes that passed bytecheck validation once, in
//!   [`BatchBuf::from_archive_bytes`]; [`BatchBuf::archived`] never validates again and never
//!   copies.

use rkyv::rancor;
use rkyv::util::AlignedVec;
use rkyv::{Archive, Deserialize, Serialize};

use crate::error::StoreError;

/// A set of trajectories produced by one generator, stored and trained on as a unit.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[rkyv(derive(Debug), compare(PartialEq))]
pub struct RolloutBatch {
    /// The run this batch belongs to.
    pub run_id: String,
    /// Per-run sequence number, assigned by the producer; names the stored object.
    pub batch_seq: u64,
    /// The generator that produced the batch.
    pub generator_id: u32,
    /// The policy version the generator held when it started this batch.
    pub policy_version: u64,
    /// Wall-clock creation time, milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// The trajectories, in production order.
    pub trajectories: Vec<Trajectory>,
}

/// One agent's episode on one task: the full token stream plus per-token training metadata.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[rkyv(derive(Debug), compare(PartialEq))]
pub struct Trajectory {
    /// Unique within the batch.
    pub trajectory_id: u64,
    /// Trajectories of one task sampled together share it (GRPO groups).
    pub group_id: u64,
    /// The task this trajectory attempted.
    pub task_id: u64,
    /// The episode this trajectory is a segment of: the `trajectory_id` of its first segment
    /// (RB-4). An agent that rewrites its history splits its episode into segments, trained as
    /// separate sequences that share the episode's reward; most episodes are one segment, whose
    /// `episode_id` is its own id.
    pub episode_id: u64,
    /// The environment that served the task.
    pub env_name: String,
    /// Which agent (in multi-agent environments) produced the trajectory.
    pub agent_id: u32,
    /// Prompt + every turn + every observation, exactly as sampled.
    pub tokens: Vec<u32>,
    /// 1 = sampled by the model, 0 = prompt / observation; same length as `tokens`.
    pub loss_mask: Vec<u8>,
    /// Log-prob of each sampled token under the sampling policy; 0.0 where `loss_mask == 0`.
    pub behaviour_logprobs: Vec<f32>,
    /// The model's turns, in order.
    pub turns: Vec<Turn>,
    /// The episode's final reward.
    pub final_reward: f32,
    /// Whether the trajectory came from the current policy or an anchor/reference source.
    pub source: Source,
    /// PATS: version of the scaffold bank rendered into the prompt (0 = no scaffold); the
    /// tokens hold the exact rendered prompt.
    pub scaffold_version: u64,
    /// RTPO: the only turn whose tokens are trained (the turn sampled at the branch boundary);
    /// `None` = every turn.
    pub trained_turn: Option<u32>,
}

/// One model turn: a contiguous span of sampled tokens inside a trajectory.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[rkyv(derive(Debug), compare(PartialEq))]
pub struct Turn {
    /// Index in `tokens` of the turn's first model token.
    pub start: u32,
    /// Exclusive end of the turn's model tokens.
    pub end: u32,
    /// Policy version that sampled this turn.
    pub policy_version: u64,
    /// xxh3-64 digest of the weights that sampled this turn (every model's safetensors bytes,
    /// in model order, as published); 0 = unknown (weights not taken from a board).
    pub weights_digest: u64,
    /// Per-turn reward (0.0 when the environment gives only a final reward).
    pub reward: f32,
    /// The environment rejected the action produced in this turn.
    pub invalid_action: bool,
    /// The agent that produced the turn (multi-agent envs; 0 otherwise).
    pub agent_id: u32,
    /// The environment's anchor key of the state the turn answered (EN-8; GiGPO step groups).
    pub anchor_key: u64,
    /// The canonical text of that state (EN-8), kept only when GiGPO groups turns by text
    /// similarity (`learner.gigpo_similarity`); empty otherwise.
    pub anchor_state: String,
    /// Weight updates that landed while the turn was sampled (RB-5), in token order; empty
    /// when `policy_version` sampled every token of it.
    pub version_changes: Vec<VersionChange>,
}

/// A weight update inside a turn: the turn's tokens from `at` on were sampled by
/// `policy_version` (RB-5).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[rkyv(derive(Debug), compare(PartialEq))]
pub struct VersionChange {
    /// Index in `tokens` of the first token the new weights sampled.
    pub at: u32,
    /// The policy version of the new weights.
    pub policy_version: u64,
    /// Their digest, as [`Turn::weights_digest`].
    pub weights_digest: u64,
}

impl Turn {
    /// The policy version that sampled token `k` of the trajectory (a token of this turn).
    pub fn version_at(&self, k: u32) -> u64 {
        self.version_changes
            .iter()
            .take_while(|c| c.at <= k)
            .last()
            .map_or(self.policy_version, |c| c.policy_version)
    }
}

/// Where a trajectory came from.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[rkyv(derive(Debug), compare(PartialEq))]
pub enum Source {
    /// Sampled by the policy being trained.
    OnPolicy,
    /// Sampled by a fixed anchor policy (e.g. a reference model) for regularisation.
    Anchor,
}

fn invalid(reason: String) -> StoreError {
    StoreError::InvalidBatch { reason }
}

impl RolloutBatch {
    /// Checks RB-1 and RB-2; the error names the trajectory, the turn or the token at fault.
    pub fn validate(&self) -> Result<(), StoreError> {
        let mut ids = std::collections::HashSet::with_capacity(self.trajectories.len());
        for (i, t) in self.trajectories.iter().enumerate() {
            if !ids.insert(t.trajectory_id) {
                return Err(invalid(format!(
                    "trajectory id {} appears twice in batch {}",
                    t.trajectory_id, self.batch_seq
                )));
            }
            t.validate().map_err(|reason| {
                invalid(format!("trajectory {i} (id {}): {reason}", t.trajectory_id))
            })?;
        }
        self.validate_segments()
    }

    /// RB-4: every segment's episode is a first segment of the batch that agrees with it.
    fn validate_segments(&self) -> Result<(), StoreError> {
        let firsts: std::collections::HashMap<u64, &Trajectory> = self
            .trajectories
            .iter()
            .filter(|t| t.episode_id == t.trajectory_id)
            .map(|t| (t.trajectory_id, t))
            .collect();
        for t in &self.trajectories {
            let Some(first) = firsts.get(&t.episode_id) else {
                return Err(invalid(format!(
                    "trajectory {} is a segment of episode {}, which is not a first segment in batch {}",
                    t.trajectory_id, t.episode_id, self.batch_seq
                )));
            };
            let agrees = first.group_id == t.group_id
                && first.task_id == t.task_id
                && first.source == t.source
                && first.final_reward.to_bits() == t.final_reward.to_bits();
            if !agrees {
                return Err(invalid(format!(
                    "trajectory {} disagrees with its episode {} on group, task, source or reward",
                    t.trajectory_id, t.episode_id
                )));
            }
        }
        Ok(())
    }
}

impl Trajectory {
    /// The policy version of the oldest turn, or `None` when the trajectory has no turns.
    pub fn min_policy_version(&self) -> Option<u64> {
        self.turns.iter().map(|t| t.policy_version).min()
    }

    fn validate(&self) -> Result<(), String> {
        let n = self.tokens.len();
        if self.loss_mask.len() != n {
            return Err(format!(
                "loss_mask has {} entries, tokens has {n}",
                self.loss_mask.len()
            ));
        }
        if self.behaviour_logprobs.len() != n {
            return Err(format!(
                "behaviour_logprobs has {} entries, tokens has {n}",
                self.behaviour_logprobs.len()
            ));
        }
        if u32::try_from(n).is_err() {
            return Err(format!(
                "{n} tokens is more than a turn index (u32) can address"
            ));
        }
        if !self.final_reward.is_finite() {
            return Err(format!("final_reward is {}", self.final_reward));
        }
        let mut prev_end = 0u32;
        for (j, turn) in self.turns.iter().enumerate() {
            if turn.start > turn.end || turn.end as usize > n {
                return Err(format!(
                    "turn {j} spans {}..{}, outside the {n} tokens",
                    turn.start, turn.end
                ));
            }
            if turn.start < prev_end {
                return Err(format!(
                    "turn {j} starts at {} before the previous turn ends at {prev_end}",
                    turn.start
                ));
            }
            if !turn.reward.is_finite() {
                return Err(format!("turn {j} reward is {}", turn.reward));
            }
            check_version_changes(turn).map_err(|e| format!("turn {j}: {e}"))?;
            prev_end = turn.end;
        }
        if let Some(k) = self.trained_turn {
            if k as usize >= self.turns.len() {
                return Err(format!(
                    "trained_turn {k} but the trajectory has {} turns",
                    self.turns.len()
                ));
            }
        }
        let mut turns = self.turns.iter().peekable();
        for (k, (&mask, &lp)) in self
            .loss_mask
            .iter()
            .zip(&self.behaviour_logprobs)
            .enumerate()
        {
            match mask {
                0 if lp != 0.0 => {
                    return Err(format!(
                        "token {k} has loss_mask 0 but behaviour_logprob {lp}"
                    ))
                }
                0 => {}
                1 => {
                    if !lp.is_finite() {
                        return Err(format!("token {k} has behaviour_logprob {lp}"));
                    }
                    while turns.peek().is_some_and(|t| t.end as usize <= k) {
                        turns.next();
                    }
                    if turns.peek().is_none_or(|t| t.start as usize > k) {
                        return Err(format!("token {k} has loss_mask 1 but lies in no turn"));
                    }
                }
                other => return Err(format!("token {k} has loss_mask {other}, expected 0 or 1")),
            }
        }
        Ok(())
    }
}

/// RB-5 for one turn.
fn check_version_changes(turn: &Turn) -> Result<(), String> {
    let (mut at, mut version) = (turn.start, turn.policy_version);
    for c in &turn.version_changes {
        if c.at <= at || c.at >= turn.end {
            return Err(format!(
                "a version change at token {} is not inside {}..{} after the previous one",
                c.at, turn.start, turn.end
            ));
        }
        if c.policy_version <= version {
            return Err(format!(
                "version change to {} at token {} is not newer than {version}",
                c.policy_version, c.at
            ));
        }
        (at, version) = (c.at, c.policy_version);
    }
    Ok(())
}

impl ArchivedTrajectory {
    /// The policy version of the oldest turn, read zero-copy; `None` when there are no turns.
    pub fn min_policy_version(&self) -> Option<u64> {
        self.turns
            .iter()
            .map(|t| t.policy_version.to_native())
            .min()
    }
}

/// A validated, decompressed batch archive, read zero-copy.
///
/// Owns the aligned archive bytes; validation happened once when it was built (RB-3).
pub struct BatchBuf {
    bytes: AlignedVec,
}

impl BatchBuf {
    /// Validates `bytes` as an archived [`RolloutBatch`] (bytecheck) and takes ownership.
    pub fn from_archive_bytes(bytes: AlignedVec) -> Result<BatchBuf, StoreError> {
        rkyv::access::<ArchivedRolloutBatch, rancor::Error>(&bytes)
            .map_err(|e| StoreError::InvalidArchive(e.to_string()))?;
        Ok(BatchBuf { bytes })
    }

    /// The archived batch, without copying or re-validating.
    pub fn archived(&self) -> &ArchivedRolloutBatch {
        // SAFETY: `self.bytes` passed `rkyv::access::<ArchivedRolloutBatch, _>` (bytecheck) in
        // `from_archive_bytes`, the only constructor, and is never mutated afterwards (RB-3).
        unsafe { rkyv::access_unchecked::<ArchivedRolloutBatch>(&self.bytes) }
    }

    /// Deserializes the whole batch into owned Rust values (for tests and tools).
    pub fn to_owned(&self) -> Result<RolloutBatch, StoreError> {
        rkyv::deserialize::<RolloutBatch, rancor::Error>(self.archived())
            .map_err(|e| StoreError::InvalidArchive(e.to_string()))
    }

    /// The size of the decompressed archive in bytes.
    pub fn archive_len(&self) -> usize {
        self.bytes.len()
    }
}

impl std::fmt::Debug for BatchBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let a = self.archived();
        f.debug_struct("BatchBuf")
            .field("run_id", &a.run_id.as_str())
            .field("batch_seq", &a.batch_seq.to_native())
            .field("trajectories", &a.trajectories.len())
            .field("archive_len", &self.bytes.len())
            .finish()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A small but complete batch: two trajectories, prompts, observations and several turns.
    pub(crate) fn sample_batch(batch_seq: u64) -> RolloutBatch {
        let traj = |id: u64, source: Source| {
            // prompt (3) | turn 0 (2) | observation (2) | turn 1 (3)
            let tokens = vec![101, 102, 103, 7, 8, 900, 901, 9, 10, 11];
            let loss_mask = vec![0, 0, 0, 1, 1, 0, 0, 1, 1, 1];
            let behaviour_logprobs = loss_mask
                .iter()
                .enumerate()
                .map(|(i, &m)| {
                    if m == 1 {
                        -0.125 * (i as f32 + id as f32)
                    } else {
                        0.0
                    }
                })
                .collect();
            Trajectory {
                trajectory_id: id,
                episode_id: id,
                group_id: 42,
                task_id: 7 + id,
                env_name: "gridworld".into(),
                agent_id: 0,
                tokens,
                loss_mask,
                behaviour_logprobs,
                turns: vec![
                    Turn {
                        start: 3,
                        end: 5,
                        policy_version: 4,
                        weights_digest: 0x5eed,
                        reward: 0.0,
                        invalid_action: false,
                        agent_id: 0,
                        anchor_key: 11,
                        anchor_state: "at door 1".into(),
                        version_changes: Vec::new(),
                    },
                    Turn {
                        start: 7,
                        end: 10,
                        policy_version: 5,
                        weights_digest: 0x5eed,
                        reward: 0.5,
                        invalid_action: true,
                        agent_id: 1,
                        anchor_key: 12,
                        anchor_state: String::new(),
                        version_changes: vec![VersionChange {
                            at: 8,
                            policy_version: 6,
                            weights_digest: 0x6eed,
                        }],
                    },
                ],
                final_reward: 1.0 + id as f32,
                source,
                scaffold_version: id,
                trained_turn: Some(1),
            }
        };
        RolloutBatch {
            run_id: "run-α".into(),
            batch_seq,
            generator_id: 3,
            policy_version: 5,
            created_unix_ms: 1_700_000_000_123,
            trajectories: vec![traj(1, Source::OnPolicy), traj(2, Source::Anchor)],
        }
    }

    fn reason(b: &RolloutBatch) -> String {
        match b.validate() {
            Err(StoreError::InvalidBatch { reason }) => reason,
            other => panic!("expected InvalidBatch, got {other:?}"),
        }
    }

    #[test]
    fn bt1_bt2_sample_batch_is_valid() {
        sample_batch(0).validate().expect("sample batch is valid");
        assert_eq!(
            sample_batch(0).trajectories[0].min_policy_version(),
            Some(4)
        );
    }

    #[test]
    fn rb5_versions_per_token_and_bad_changes() {
        let b = sample_batch(0);
        let turn = &b.trajectories[0].turns[1];
        let versions: Vec<u64> = (7..10).map(|k| turn.version_at(k)).collect();
        assert_eq!(versions, [5, 6, 6]);
        let bad = |change: VersionChange| {
            let mut b = sample_batch(0);
            b.trajectories[0].turns[1].version_changes.push(change);
            reason(&b)
        };
        let change = |at, policy_version| VersionChange {
            at,
            policy_version,
            weights_digest: 1,
        };
        assert!(
            bad(change(9, 6)).contains("not newer than 6"),
            "same version"
        );
        assert!(bad(change(8, 7)).contains("not inside"), "same token");
        assert!(
            bad(change(10, 7)).contains("not inside 7..10"),
            "at the end"
        );
        let mut b = sample_batch(0);
        b.trajectories[0].turns[1].version_changes[0].at = 7;
        assert!(reason(&b).contains("turn 1"), "at the turn's first token");
    }

    #[test]
    fn bt1_length_and_value_rules() {
        let mut b = sample_batch(0);
        b.trajectories[0].loss_mask.pop();
        assert!(
            reason(&b).contains("loss_mask has 9 entries"),
            "{}",
            reason(&b)
        );

        let mut b = sample_batch(0);
        b.trajectories[1].behaviour_logprobs[0] = -1.0;
        assert!(
            reason(&b).contains("token 0 has loss_mask 0"),
            "{}",
            reason(&b)
        );

        let mut b = sample_batch(0);
        b.trajectories[0].loss_mask[0] = 2;
        assert!(reason(&b).contains("expected 0 or 1"), "{}", reason(&b));

        let mut b = sample_batch(0);
        b.trajectories[0].behaviour_logprobs[3] = f32::NAN;
        assert!(reason(&b).contains("token 3"), "{}", reason(&b));

        let mut b = sample_batch(0);
        b.trajectories[1].trajectory_id = 1;
        assert!(reason(&b).contains("appears twice"), "{}", reason(&b));
    }

    #[test]
    fn rb4_segments_name_a_first_segment_that_agrees() {
        let mut b = sample_batch(0);
        let mut second = b.trajectories[0].clone();
        second.trajectory_id = 9;
        b.trajectories.push(second);
        b.validate().expect("a second segment of episode 1");
        let mut orphan = b.clone();
        orphan.trajectories[2].episode_id = 7;
        assert!(
            reason(&orphan).contains("not a first segment"),
            "{}",
            reason(&orphan)
        );
        let mut chained = b.clone();
        chained.trajectories[2].episode_id = 2;
        assert!(
            reason(&chained).contains("disagrees"),
            "{}",
            reason(&chained)
        );
        let mut other_reward = b;
        other_reward.trajectories[2].final_reward = 0.0;
        assert!(
            reason(&other_reward).contains("disagrees"),
            "{}",
            reason(&other_reward)
        );
    }

    #[test]
    fn bt2_turn_rules() {
        let mut b = sample_batch(0);
        b.trajectories[0].turns[1].end = 11;
        assert!(
            reason(&b).contains("outside the 10 tokens"),
            "{}",
            reason(&b)
        );

        let mut b = sample_batch(0);
        b.trajectories[0].turns[1].start = 4;
        assert!(
            reason(&b).contains("before the previous turn"),
            "{}",
            reason(&b)
        );

        let mut b = sample_batch(0);
        b.trajectories[0].loss_mask[5] = 1;
        b.trajectories[0].behaviour_logprobs[5] = -0.5;
        assert!(
            reason(&b).contains("token 5 has loss_mask 1 but lies in no turn"),
            "{}",
            reason(&b)
        );
    }

    #[test]
    fn bt3_buf_rejects_garbage_archives() {
        let mut bytes = AlignedVec::<16>::new();
        bytes.extend_from_slice(&[0xff; 64]);
        assert!(matches!(
            BatchBuf::from_archive_bytes(bytes),
            Err(StoreError::InvalidArchive(_))
        ));
        assert!(matches!(
            BatchBuf::from_archive_bytes(AlignedVec::new()),
            Err(StoreError::InvalidArchive(_))
        ));
    }
}
