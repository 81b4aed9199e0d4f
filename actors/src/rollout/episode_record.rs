//! The runtime's record of an agent episode, which its env journals before answering a call
//! (AJ-1 in keel_envs::agent::journal), and the episode taken up from it after a restart (AJ-3).
//!
//! Invariants:
//! - JR-1 A record is a framed, checksummed rollout batch (FR-1..4) holding the episode's
//!   segments in order, the last with the turn just sampled; its ids are 0..n within the record.
//!   Every token is as sampled, with its log-prob and policy version (RB-5).
//! - JR-2 A record is taken up only when no token of it is newer than the policy version this
//!   process samples with: a resume that went back past a recorded call (its checkpoint is
//!   older) drops the episode, which is never trained on the calls of a lost timeline.
//! - JR-3 Taken-up segments keep their tokens, masks, log-probs and turns; their identity
//!   (ids, group, task, source) is the new episode's.

use keel_store::frame::{decode_batch, encode_batch};
use keel_store::{RolloutBatch, Trajectory, Turn};

/// The record of an episode whose segments are `segments`, then `current` with `turn` (JR-1).
pub(super) fn encode(
    segments: &[Trajectory],
    current: &Trajectory,
    turn: Turn,
    policy_version: u64,
) -> Result<Vec<u8>, String> {
    let mut last = current.clone();
    last.turns.push(turn);
    let mut trajectories: Vec<Trajectory> = segments.to_vec();
    trajectories.push(last);
    for (k, t) in trajectories.iter_mut().enumerate() {
        (t.trajectory_id, t.episode_id) = (k as u64, 0);
    }
    let batch = RolloutBatch {
        run_id: String::new(),
        batch_seq: 0,
        generator_id: 0,
        policy_version,
        created_unix_ms: crate::process::unix_ms(),
        trajectories,
    };
    encode_batch(&batch, 1).map_err(|e| e.to_string())
}

/// The segments of a record, as segments of the episode `fresh` (JR-2, JR-3).
pub(super) fn decode(
    record: &[u8],
    fresh: &Trajectory,
    policy_version: u64,
) -> Result<Vec<Trajectory>, String> {
    let batch = decode_batch(record)
        .and_then(|b| b.to_owned())
        .map_err(|e| format!("its journal record does not decode: {e}"))?;
    let newest = batch
        .trajectories
        .iter()
        .flat_map(|t| &t.turns)
        .flat_map(|turn| {
            std::iter::once(turn.policy_version)
                .chain(turn.version_changes.iter().map(|c| c.policy_version))
        })
        .max()
        .unwrap_or(0);
    if newest > policy_version {
        return Err(format!(
            "its recorded calls were sampled by policy version {newest}, newer than the {policy_version} this process resumed from (JR-2): dropped"
        ));
    }
    Ok(batch
        .trajectories
        .into_iter()
        .map(|t| Trajectory {
            tokens: t.tokens,
            loss_mask: t.loss_mask,
            behaviour_logprobs: t.behaviour_logprobs,
            turns: t.turns,
            ..fresh.clone()
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_store::{Source, VersionChange};

    fn traj(tokens: Vec<u32>, mask: Vec<u8>) -> Trajectory {
        Trajectory {
            trajectory_id: 7,
            group_id: 3,
            task_id: 11,
            episode_id: 7,
            env_name: "agent".into(),
            agent_id: 0,
            behaviour_logprobs: mask.iter().map(|&m| -0.5 * f32::from(m)).collect(),
            tokens,
            loss_mask: mask,
            turns: Vec::new(),
            final_reward: 0.0,
            source: Source::OnPolicy,
            scaffold_version: 0,
            trained_turn: None,
        }
    }

    fn turn(start: u32, end: u32, version: u64) -> Turn {
        Turn {
            start,
            end,
            policy_version: version,
            weights_digest: 9,
            reward: 0.0,
            invalid_action: false,
            agent_id: 0,
            anchor_key: 0,
            anchor_state: String::new(),
            version_changes: Vec::new(),
        }
    }

    /// JR-1, JR-3: what was recorded comes back token for token, under the new identity.
    #[test]
    fn jr1_a_record_round_trips_under_the_new_episode() {
        let mut first = traj(vec![1, 2, 3, 4], vec![0, 0, 1, 1]);
        first.turns.push(turn(2, 4, 1));
        let current = traj(vec![5, 6, 7, 8, 9], vec![0, 0, 1, 1, 1]);
        let mut sampled = turn(2, 5, 1);
        sampled.version_changes.push(VersionChange {
            at: 4,
            policy_version: 2,
            weights_digest: 5,
        });
        let record =
            encode(std::slice::from_ref(&first), &current, sampled.clone(), 2).expect("encode");
        let mut fresh = traj(Vec::new(), Vec::new());
        (fresh.trajectory_id, fresh.group_id, fresh.task_id) = (40, 41, 42);
        let back = decode(&record, &fresh, 2).expect("decode");
        assert_eq!(back.len(), 2);
        assert_eq!(back[0].tokens, first.tokens);
        assert_eq!(back[0].turns, first.turns);
        assert_eq!(back[1].tokens, current.tokens);
        assert_eq!(back[1].behaviour_logprobs, current.behaviour_logprobs);
        assert_eq!(back[1].turns, vec![sampled]);
        assert!(back
            .iter()
            .all(|t| (t.trajectory_id, t.group_id, t.task_id) == (40, 41, 42)));
    }

    /// JR-2: a token newer than the resumed policy drops the record; a corrupt one is refused.
    #[test]
    fn jr2_a_record_from_a_lost_timeline_or_corrupt_is_refused() {
        let current = traj(vec![5, 6, 7], vec![0, 1, 1]);
        let record = encode(&[], &current, turn(1, 3, 4), 4).expect("encode");
        let fresh = traj(Vec::new(), Vec::new());
        let err = decode(&record, &fresh, 3).expect_err("newer than the policy");
        assert!(err.contains("policy version 4"), "{err}");
        assert!(decode(&record, &fresh, 4).is_ok());
        let mut bad = record.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0xff;
        let err = decode(&bad, &fresh, 4).expect_err("corrupt");
        assert!(err.contains("does not decode"), "{err}");
    }
}
