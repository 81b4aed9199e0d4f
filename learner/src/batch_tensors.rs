//! `TrainBatch`: a rollout batch (or SFT sequences) as padded device tensors.
//!
//! Invariants:
//! - BT-1: row `i` is trajectory `i` of the source, in order; `tokens` is right-padded with 0
//!   to the longest trajectory; padding has mask 0 and behaviour log-prob 0.
//! - BT-2: `loss_mask[b, t] = 1` exactly where token `t` was sampled by the model; it is aligned
//!   with `token_logprobs` (LP-1), so `loss_mask[b, 0]` must be 0 — a batch violating it is
//!   rejected, never silently fixed.
//! - BT-3: every trajectory is non-empty, its mask and behaviour log-probs have its token count,
//!   mask values are 0 or 1, and behaviour log-probs are finite where the mask is 1.
//! - BT-4: `n_tokens = Σ loss_mask`; `final_rewards[i]` (finite) and `group_ids[i]` belong to
//!   row `i`; so does `episodes[i]`, the episode row i is a segment of (RB-4: the stored
//!   `episode_id`; a row built without one, SFT or tests, is its own episode, `episodes[i] = i`).
//! - BT-5: `from_archived` reads the archive zero-copy and copies each value exactly once, into
//!   the padded host buffers; every trajectory is used, whatever its `source` (anchor
//!   trajectories are trained on like on-policy ones and flagged in `anchors`).
//! - BT-6 (turns): `turns[i]` are trajectory i's model turns in order, each inside the
//!   trajectory; without stored turns they are the maximal runs of mask-1 tokens (layout C).
//!   `turn_ids[b, t]` is the index of the turn holding token t (the last turn starting at or
//!   before t for a mask-1 token outside every turn; 0 elsewhere, where it is never read).
//! - BT-7 (anchor state): `TurnSpan::anchor` is the environment's anchor key stored with the
//!   turn (EN-8); for rows without stored turns (SFT, tests) it hashes the tokens between the
//!   previous turn's end (0 for the first turn) and the turn's start — the observation the turn
//!   answered, or the prompt. Identical environment states in one group share a key (GiGPO).
//! - BT-8 (RTPO): `trained_turns[i]`, when set, names an existing turn of row i.
//! - BT-9 (size): a batch whose padded shape `B × T` exceeds [`MAX_PADDED_ELEMENTS`] is refused
//!   before anything is allocated: many short rows and one very long one (a writer's bug) would
//!   otherwise ask for more memory than exists and abort the learner.

use std::hash::{Hash, Hasher};

use keel_store::ArchivedRolloutBatch;
use tch::{Device, Kind, Tensor};

use crate::error::LearnerError;

/// Most elements (`B × T`) a padded batch may have (BT-9): 2^28, 1 GiB per f32 tensor.
pub const MAX_PADDED_ELEMENTS: usize = 1 << 28;

/// A batch ready for the learner.
pub struct TrainBatch {
    /// `[B, T]` i64 token ids, right-padded with 0.
    pub tokens: Tensor,
    /// `[B, T]` f32, 1 on model-sampled tokens (BT-2).
    pub loss_mask: Tensor,
    /// `[B, T]` f32 log-probs of the sampling policy, 0 where the mask is 0.
    pub behaviour_logp: Tensor,
    /// One outcome reward per trajectory.
    pub final_rewards: Vec<f32>,
    /// One GRPO group id per trajectory.
    pub group_ids: Vec<u64>,
    /// The episode each trajectory is a segment of (BT-4, RB-4).
    pub episodes: Vec<u64>,
    /// Number of mask-1 tokens (BT-4).
    pub n_tokens: usize,
    /// Each trajectory's model turns (BT-6, BT-7).
    pub turns: Vec<Vec<TurnSpan>>,
    /// `[B, T]` i64 turn index of each token (BT-6).
    pub turn_ids: Tensor,
    /// Largest number of turns of a trajectory (≥ 1).
    pub max_turns: i64,
    /// Agent id of each trajectory (Dr. MAS).
    pub agent_ids: Vec<u32>,
    /// Whether each trajectory was sampled by an anchor/reference policy (ARMOR).
    pub anchors: Vec<bool>,
    /// Task id of each trajectory.
    pub task_ids: Vec<u64>,
    /// RTPO: the index (into `turns[i]`) of the only turn to train, `None` = all (BT-8).
    pub trained_turns: Vec<Option<usize>>,
    /// Each trajectory's stored anchor-state texts, one per turn, or none when the batch
    /// was sampled without them (GiGPO similarity groups need them).
    pub anchor_states: Vec<Vec<String>>,
}

/// One model turn of a trajectory.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TurnSpan {
    /// First model token (index into the trajectory's tokens).
    pub start: usize,
    /// Exclusive end.
    pub end: usize,
    /// Per-turn reward (0 when the environment gives only a final reward).
    pub reward: f32,
    /// The environment rejected this turn's action.
    pub invalid: bool,
    /// Anchor key of the state the turn answered (BT-7).
    pub anchor: u64,
    /// The agent that produced the turn (Dr. MAS; 0 in single-agent envs).
    pub agent: u32,
}

/// A stored turn in native form.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct RowTurn {
    pub start: usize,
    pub end: usize,
    pub reward: f32,
    pub invalid: bool,
    pub agent: u32,
    /// The env's anchor key; `None` = hash the tokens before the turn (BT-7).
    pub anchor: Option<u64>,
}

/// One trajectory in native form, before padding.
pub(crate) struct Row {
    pub tokens: Vec<u32>,
    pub mask: Vec<u8>,
    pub logp: Vec<f32>,
    pub reward: f32,
    pub group: u64,
    /// The stored episode id (RB-4); `None` = its own episode (BT-4).
    pub episode: Option<u64>,
    /// Stored turns; empty = derive from the mask (BT-6).
    pub turns: Vec<RowTurn>,
    pub agent: u32,
    pub anchor: bool,
    pub task: u64,
    pub trained_turn: Option<usize>,
    /// Stored anchor-state texts, one per stored turn, or empty.
    pub anchor_states: Vec<String>,
}

impl Row {
    /// A row without stored turns, agent 0, on-policy, task = group.
    pub(crate) fn new(
        tokens: Vec<u32>,
        mask: Vec<u8>,
        logp: Vec<f32>,
        reward: f32,
        group: u64,
    ) -> Self {
        Row {
            tokens,
            mask,
            logp,
            reward,
            group,
            episode: None,
            turns: Vec::new(),
            agent: 0,
            anchor: false,
            anchor_states: Vec::new(),
            task: group,
            trained_turn: None,
        }
    }
}

/// The maximal runs of mask-1 tokens as `[start, end)`.
fn mask_runs(mask: &[u8]) -> Vec<(usize, usize)> {
    let mut runs = Vec::new();
    let mut start = None;
    for (t, &m) in mask.iter().enumerate() {
        match (m == 1, start) {
            (true, None) => start = Some(t),
            (false, Some(s)) => {
                runs.push((s, t));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        runs.push((s, mask.len()));
    }
    runs
}

/// Turn spans of a validated row (BT-6, BT-7).
fn row_turns(i: usize, r: &Row) -> Result<Vec<TurnSpan>, LearnerError> {
    let raw: Vec<RowTurn> = if r.turns.is_empty() {
        mask_runs(&r.mask)
            .into_iter()
            .map(|(start, end)| RowTurn {
                start,
                end,
                reward: 0.0,
                invalid: false,
                agent: r.agent,
                anchor: None,
            })
            .collect()
    } else {
        r.turns.clone()
    };
    let mut prev_end = 0;
    let mut out = Vec::with_capacity(raw.len());
    for (k, turn) in raw.into_iter().enumerate() {
        let RowTurn {
            start,
            end,
            reward,
            invalid,
            agent,
            anchor,
        } = turn;
        if start >= end || end > r.tokens.len() || start < prev_end {
            return Err(LearnerError::input(format!(
                "trajectory {i}: turn {k} spans [{start}, {end}), which is empty, out of order or beyond its {} tokens",
                r.tokens.len()
            )));
        }
        if !reward.is_finite() {
            return Err(LearnerError::input(format!(
                "trajectory {i}: turn {k} reward is {reward}"
            )));
        }
        let anchor = anchor.unwrap_or_else(|| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            r.tokens[prev_end..start].hash(&mut h);
            h.finish()
        });
        out.push(TurnSpan {
            start,
            end,
            reward,
            invalid,
            anchor,
            agent,
        });
        prev_end = end;
    }
    if !r.anchor_states.is_empty() && r.anchor_states.len() != out.len() {
        return Err(LearnerError::input(format!(
            "trajectory {i}: {} anchor states for {} turns",
            r.anchor_states.len(),
            out.len()
        )));
    }
    if let Some(k) = r.trained_turn {
        if k >= out.len() {
            return Err(LearnerError::input(format!(
                "trajectory {i}: trained turn {k} but it has {} turns",
                out.len()
            )));
        }
    }
    Ok(out)
}

impl TrainBatch {
    /// Number of trajectories.
    pub fn len(&self) -> usize {
        self.final_rewards.len()
    }

    /// Whether the batch holds no trajectory (never true for a constructed batch).
    pub fn is_empty(&self) -> bool {
        self.final_rewards.is_empty()
    }

    /// The sub-batch of rows `rows` (in that order), e.g. the groups kept by dynamic sampling.
    pub fn select_rows(&self, rows: &[usize]) -> Result<TrainBatch, LearnerError> {
        if rows.is_empty() || rows.iter().any(|&r| r >= self.len()) {
            return Err(LearnerError::input(format!(
                "select_rows: {rows:?} is empty or beyond {} rows",
                self.len()
            )));
        }
        let idx: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
        let idx = Tensor::f_from_slice(&idx)?.f_to_device(self.tokens.device())?;
        let pick = |t: &Tensor| t.f_index_select(0, &idx);
        let loss_mask = pick(&self.loss_mask)?;
        let n_tokens = f64::try_from(loss_mask.f_sum(Kind::Double)?)? as usize;
        let turns: Vec<Vec<TurnSpan>> = rows.iter().map(|&r| self.turns[r].clone()).collect();
        Ok(TrainBatch {
            tokens: pick(&self.tokens)?,
            loss_mask,
            behaviour_logp: pick(&self.behaviour_logp)?,
            final_rewards: rows.iter().map(|&r| self.final_rewards[r]).collect(),
            group_ids: rows.iter().map(|&r| self.group_ids[r]).collect(),
            episodes: rows.iter().map(|&r| self.episodes[r]).collect(),
            n_tokens,
            turn_ids: pick(&self.turn_ids)?,
            max_turns: turns.iter().map(|s| s.len()).max().unwrap_or(1).max(1) as i64,
            turns,
            agent_ids: rows.iter().map(|&r| self.agent_ids[r]).collect(),
            anchors: rows.iter().map(|&r| self.anchors[r]).collect(),
            task_ids: rows.iter().map(|&r| self.task_ids[r]).collect(),
            trained_turns: rows.iter().map(|&r| self.trained_turns[r]).collect(),
            anchor_states: rows
                .iter()
                .map(|&r| self.anchor_states[r].clone())
                .collect(),
        })
    }

    /// Training batch from a stored rollout batch, read through its archived form (BT-5).
    pub fn from_archived(
        batch: &ArchivedRolloutBatch,
        device: Device,
    ) -> Result<Self, LearnerError> {
        let rows = batch
            .trajectories
            .iter()
            .map(|t| Row {
                tokens: t.tokens.iter().map(|x| x.to_native()).collect(),
                mask: t.loss_mask.as_slice().to_vec(),
                logp: t.behaviour_logprobs.iter().map(|x| x.to_native()).collect(),
                reward: t.final_reward.to_native(),
                group: t.group_id.to_native(),
                episode: Some(t.episode_id.to_native()),
                turns: t
                    .turns
                    .iter()
                    .map(|u| RowTurn {
                        start: u.start.to_native() as usize,
                        end: u.end.to_native() as usize,
                        reward: u.reward.to_native(),
                        invalid: u.invalid_action,
                        agent: u.agent_id.to_native(),
                        anchor: Some(u.anchor_key.to_native()),
                    })
                    .collect(),
                agent: t.agent_id.to_native(),
                anchor: matches!(t.source, keel_store::ArchivedSource::Anchor),
                task: t.task_id.to_native(),
                trained_turn: t.trained_turn.as_ref().map(|k| k.to_native() as usize),
                anchor_states: if t.turns.iter().all(|u| u.anchor_state.is_empty()) {
                    Vec::new()
                } else {
                    t.turns.iter().map(|u| u.anchor_state.to_string()).collect()
                },
            })
            .collect();
        Self::from_rows(rows, device).map_err(|e| match e {
            LearnerError::InvalidInput { reason } => LearnerError::input(format!(
                "rollout batch {} of run {}: {reason}",
                batch.batch_seq.to_native(),
                batch.run_id.as_str()
            )),
            other => other,
        })
    }

    /// SFT batch from `(tokens, loss_mask)` pairs: behaviour log-probs and rewards 0, each
    /// sequence its own group (`group_ids[i] = i`).
    pub fn from_sequences(
        seqs: &[(Vec<u32>, Vec<u8>)],
        device: Device,
    ) -> Result<Self, LearnerError> {
        let rows = seqs
            .iter()
            .enumerate()
            .map(|(i, (tokens, mask))| {
                Row::new(
                    tokens.clone(),
                    mask.clone(),
                    vec![0.0; tokens.len()],
                    0.0,
                    i as u64,
                )
            })
            .collect();
        Self::from_rows(rows, device)
    }

    /// Validates (BT-2, BT-3) and pads (BT-1) native rows.
    pub(crate) fn from_rows(rows: Vec<Row>, device: Device) -> Result<Self, LearnerError> {
        if rows.is_empty() {
            return Err(LearnerError::input(
                "a training batch needs at least one trajectory",
            ));
        }
        for (i, r) in rows.iter().enumerate() {
            check_row(i, r)?;
        }
        let turns = rows
            .iter()
            .enumerate()
            .map(|(i, r)| row_turns(i, r))
            .collect::<Result<Vec<_>, _>>()?;
        let b = rows.len();
        let t = rows.iter().map(|r| r.tokens.len()).max().unwrap_or(0);
        if b.checked_mul(t).is_none_or(|n| n > MAX_PADDED_ELEMENTS) {
            return Err(LearnerError::input(format!(
                "{b} trajectories padded to {t} tokens are more than {MAX_PADDED_ELEMENTS} elements; split the batch"
            )));
        }
        let turn_ids = turn_ids(&rows, &turns, t);
        let max_turns = turns.iter().map(|s| s.len()).max().unwrap_or(1).max(1) as i64;
        let mut tokens = vec![0i64; b * t];
        let mut mask = vec![0f32; b * t];
        let mut logp = vec![0f32; b * t];
        let mut n_tokens = 0;
        for (i, r) in rows.iter().enumerate() {
            for j in 0..r.tokens.len() {
                tokens[i * t + j] = i64::from(r.tokens[j]);
                if r.mask[j] == 1 {
                    mask[i * t + j] = 1.0;
                    logp[i * t + j] = r.logp[j];
                    n_tokens += 1;
                }
            }
        }
        let shape = [b as i64, t as i64];
        let to_dev = |x: Tensor| -> Result<Tensor, LearnerError> {
            Ok(x.f_reshape(shape)?.f_to_device(device)?)
        };
        Ok(TrainBatch {
            tokens: to_dev(Tensor::f_from_slice(&tokens)?)?,
            loss_mask: to_dev(Tensor::f_from_slice(&mask)?)?,
            behaviour_logp: to_dev(Tensor::f_from_slice(&logp)?.f_to_kind(Kind::Float)?)?,
            turn_ids: to_dev(Tensor::f_from_slice(&turn_ids)?)?,
            final_rewards: rows.iter().map(|r| r.reward).collect(),
            group_ids: rows.iter().map(|r| r.group).collect(),
            episodes: (0..rows.len() as u64)
                .zip(&rows)
                .map(|(i, r)| r.episode.unwrap_or(i))
                .collect(),
            n_tokens,
            turns,
            max_turns,
            agent_ids: rows.iter().map(|r| r.agent).collect(),
            anchors: rows.iter().map(|r| r.anchor).collect(),
            task_ids: rows.iter().map(|r| r.task).collect(),
            trained_turns: rows.iter().map(|r| r.trained_turn).collect(),
            anchor_states: rows.into_iter().map(|r| r.anchor_states).collect(),
        })
    }
}

/// BT-2, BT-3: row `i` has tokens, one mask entry and one log-prob per token, a 0/1 mask that
/// does not train the first token, a finite reward and a finite log-prob on every loss token.
fn check_row(i: usize, r: &Row) -> Result<(), LearnerError> {
    if r.tokens.is_empty() {
        return Err(LearnerError::input(format!("trajectory {i} has no tokens")));
    }
    if r.mask.len() != r.tokens.len() || r.logp.len() != r.tokens.len() {
        return Err(LearnerError::input(format!(
            "trajectory {i}: {} tokens but {} loss-mask entries and {} behaviour log-probs",
            r.tokens.len(),
            r.mask.len(),
            r.logp.len()
        )));
    }
    if let Some(t) = r.mask.iter().position(|&m| m > 1) {
        return Err(LearnerError::input(format!(
            "trajectory {i}: loss_mask[{t}] = {} (must be 0 or 1)",
            r.mask[t]
        )));
    }
    if r.mask[0] != 0 {
        return Err(LearnerError::input(format!(
            "trajectory {i}: loss_mask[0] is 1, but the first token has no prediction to train (it must be a prompt token)"
        )));
    }
    if !r.reward.is_finite() {
        return Err(LearnerError::input(format!(
            "trajectory {i}: final reward is {}",
            r.reward
        )));
    }
    if let Some(t) = (0..r.tokens.len()).find(|&t| r.mask[t] == 1 && !r.logp[t].is_finite()) {
        return Err(LearnerError::input(format!(
            "trajectory {i}: behaviour log-prob at token {t} is {}",
            r.logp[t]
        )));
    }
    Ok(())
}

/// Each padded position's turn index (`[B × t]`, row-major): the last turn starting at or
/// before it; 0 on padding.
fn turn_ids(rows: &[Row], turns: &[Vec<TurnSpan>], t: usize) -> Vec<i64> {
    let mut turn_ids = vec![0i64; rows.len() * t];
    for (i, spans) in turns.iter().enumerate() {
        let mut k = 0usize;
        for j in 0..rows[i].tokens.len() {
            while k + 1 < spans.len() && spans[k + 1].start <= j {
                k += 1;
            }
            turn_ids[i * t + j] = k as i64;
        }
    }
    turn_ids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bt9_a_batch_too_large_once_padded_is_refused_before_allocating() {
        // 5,000 two-token rows and one of 60,000 tokens: 3·10^8 padded elements.
        let mut rows: Vec<Row> = (0..5000)
            .map(|i| Row::new(vec![1, 2], vec![0, 1], vec![0.0, -0.5], 0.0, i))
            .collect();
        let n = 60_000;
        let mut mask = vec![1u8; n];
        mask[0] = 0;
        rows.push(Row::new(vec![3; n], mask, vec![-0.1; n], 0.0, 9));
        match TrainBatch::from_rows(rows, Device::Cpu) {
            Err(LearnerError::InvalidInput { reason }) => {
                assert!(
                    reason.contains("5001 trajectories padded to 60000 tokens"),
                    "{reason}"
                )
            }
            Err(e) => panic!("wrong error: {e}"),
            Ok(_) => panic!("a 3e8-element batch was accepted"),
        }
    }

    #[test]
    fn pads_right_and_counts_tokens() {
        let b = TrainBatch::from_sequences(
            &[(vec![1, 5, 6], vec![0, 1, 1]), (vec![1, 7], vec![0, 1])],
            Device::Cpu,
        )
        .expect("batch");
        assert_eq!(b.tokens.size(), vec![2, 3]);
        assert_eq!(
            Vec::<Vec<i64>>::try_from(&b.tokens).expect("tokens"),
            vec![vec![1, 5, 6], vec![1, 7, 0]]
        );
        assert_eq!(
            Vec::<Vec<f32>>::try_from(&b.loss_mask).expect("mask"),
            vec![vec![0., 1., 1.], vec![0., 1., 0.]]
        );
        assert_eq!(b.n_tokens, 3);
        assert_eq!(b.group_ids, vec![0, 1]);
    }

    fn trajectory(id: u64, tokens: Vec<u32>, mask: Vec<u8>, reward: f32) -> keel_store::Trajectory {
        let logp = mask
            .iter()
            .map(|&m| if m == 1 { -0.5 } else { 0.0 })
            .collect();
        let start = mask.iter().position(|&m| m == 1).unwrap_or(0) as u32;
        keel_store::Trajectory {
            trajectory_id: id,
            episode_id: id,
            group_id: 40 + id / 2,
            task_id: id / 2,
            env_name: "test".into(),
            agent_id: 0,
            turns: vec![keel_store::Turn {
                start,
                end: tokens.len() as u32,
                policy_version: 1,
                weights_digest: 0,
                reward: 0.0,
                invalid_action: false,
                agent_id: 0,
                anchor_key: 0,
                anchor_state: String::new(),
                version_changes: Vec::new(),
            }],
            tokens,
            loss_mask: mask,
            behaviour_logprobs: logp,
            final_reward: reward,
            source: keel_store::Source::OnPolicy,
            scaffold_version: 0,
            trained_turn: None,
        }
    }

    #[test]
    fn bt5_reads_an_archived_rollout_batch() {
        let batch = keel_store::RolloutBatch {
            run_id: "r".into(),
            batch_seq: 3,
            generator_id: 0,
            policy_version: 1,
            created_unix_ms: 0,
            trajectories: vec![
                trajectory(0, vec![1, 4, 5, 6], vec![0, 1, 1, 1], 1.0),
                trajectory(1, vec![1, 4, 7], vec![0, 1, 1], 0.0),
            ],
        };
        let frame = keel_store::frame::encode_batch(&batch, 1).expect("encode");
        let buf = keel_store::frame::decode_batch(&frame).expect("decode");
        let b = TrainBatch::from_archived(buf.archived(), Device::Cpu).expect("train batch");
        assert_eq!(
            Vec::<Vec<i64>>::try_from(&b.tokens).expect("tokens"),
            vec![vec![1, 4, 5, 6], vec![1, 4, 7, 0]]
        );
        assert_eq!(
            Vec::<Vec<f32>>::try_from(&b.behaviour_logp).expect("logp"),
            vec![vec![0.0, -0.5, -0.5, -0.5], vec![0.0, -0.5, -0.5, 0.0]]
        );
        assert_eq!(
            (b.final_rewards.clone(), b.group_ids.clone(), b.n_tokens),
            (vec![1.0, 0.0], vec![40, 40], 5)
        );
        // A batch whose first token is model-sampled is rejected, naming the batch (BT-2).
        let bad = keel_store::RolloutBatch {
            trajectories: vec![trajectory(0, vec![1, 4], vec![1, 1], 1.0)],
            ..batch
        };
        let buf = keel_store::frame::decode_batch(
            &keel_store::frame::encode_batch(&bad, 1).expect("encode"),
        )
        .expect("decode");
        let Err(e) = TrainBatch::from_archived(buf.archived(), Device::Cpu) else {
            panic!("mask[0] = 1 accepted")
        };
        assert!(e.to_string().contains("rollout batch 3 of run r"), "{e}");
    }

    #[test]
    fn rejects_bad_rows() {
        let Err(e) = TrainBatch::from_sequences(&[(vec![1, 2], vec![1, 1])], Device::Cpu) else {
            panic!("mask[0] = 1 accepted")
        };
        assert!(e.to_string().contains("loss_mask[0]"), "{e}");
        assert!(TrainBatch::from_sequences(&[(vec![1, 2], vec![0])], Device::Cpu).is_err());
        assert!(TrainBatch::from_sequences(&[], Device::Cpu).is_err());
        assert!(TrainBatch::from_sequences(&[(vec![1, 2], vec![0, 2])], Device::Cpu).is_err());
    }

    #[test]
    fn bt6_bt7_turns_from_mask_runs_and_anchor_keys() {
        // prompt 1 2 | turn 3 4 | obs 9 | turn 5 ; and a second row with the same prompt.
        let b = TrainBatch::from_sequences(
            &[
                (vec![1, 2, 3, 4, 9, 5], vec![0, 0, 1, 1, 0, 1]),
                (vec![1, 2, 6], vec![0, 0, 1]),
            ],
            Device::Cpu,
        )
        .expect("batch");
        let spans: Vec<(usize, usize)> = b.turns[0].iter().map(|s| (s.start, s.end)).collect();
        assert_eq!(spans, vec![(2, 4), (5, 6)]);
        assert_eq!(
            Vec::<Vec<i64>>::try_from(&b.turn_ids).expect("ids"),
            vec![vec![0, 0, 0, 0, 0, 1], vec![0, 0, 0, 0, 0, 0]]
        );
        assert_eq!(b.max_turns, 2);
        assert_eq!(
            b.turns[0][0].anchor, b.turns[1][0].anchor,
            "same prompt, same anchor state"
        );
        assert_ne!(b.turns[0][0].anchor, b.turns[0][1].anchor);
        let sub = b.select_rows(&[1]).expect("sub");
        assert_eq!((sub.len(), sub.n_tokens, sub.max_turns), (1, 1, 1));
        assert!(b.select_rows(&[2]).is_err());
    }

    #[test]
    fn bt6_rejects_bad_stored_turns() {
        let mut r = Row::new(vec![1, 2, 3], vec![0, 1, 1], vec![0.0, -0.1, -0.1], 1.0, 0);
        let turn = RowTurn {
            start: 1,
            end: 4,
            reward: 0.0,
            invalid: false,
            agent: 0,
            anchor: Some(9),
        };
        r.turns = vec![turn];
        let Err(e) = TrainBatch::from_rows(vec![r], Device::Cpu) else {
            panic!("turn beyond the tokens accepted")
        };
        assert!(e.to_string().contains("turn 0 spans [1, 4)"), "{e}");
        let mut r = Row::new(vec![1, 2, 3], vec![0, 1, 1], vec![0.0, -0.1, -0.1], 1.0, 0);
        r.turns = vec![RowTurn { end: 3, ..turn }];
        r.trained_turn = Some(1);
        let Err(e) = TrainBatch::from_rows(vec![r], Device::Cpu) else {
            panic!("trained turn beyond the turns accepted")
        };
        assert!(e.to_string().contains("trained turn 1"), "{e}");
    }
}
