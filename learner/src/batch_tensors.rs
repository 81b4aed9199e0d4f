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
//! - BT-4: `n_tokens = Σ loss_mask`; `final_rewards[i]` and `group_ids[i]` belong to row `i`.

use tch::{Device, Kind, Tensor};

use crate::error::LearnerError;

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
    /// Number of mask-1 tokens (BT-4).
    pub n_tokens: usize,
}

/// One trajectory in native form, before padding.
pub(crate) struct Row {
    pub tokens: Vec<u32>,
    pub mask: Vec<u8>,
    pub logp: Vec<f32>,
    pub reward: f32,
    pub group: u64,
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

    /// SFT batch from `(tokens, loss_mask)` pairs: behaviour log-probs and rewards 0, each
    /// sequence its own group (`group_ids[i] = i`).
    pub fn from_sequences(seqs: &[(Vec<u32>, Vec<u8>)], device: Device) -> Result<Self, LearnerError> {
        let rows = seqs
            .iter()
            .enumerate()
            .map(|(i, (tokens, mask))| Row {
                tokens: tokens.clone(),
                mask: mask.clone(),
                logp: vec![0.0; tokens.len()],
                reward: 0.0,
                group: i as u64,
            })
            .collect();
        Self::from_rows(rows, device)
    }

    /// Validates (BT-2, BT-3) and pads (BT-1) native rows.
    pub(crate) fn from_rows(rows: Vec<Row>, device: Device) -> Result<Self, LearnerError> {
        if rows.is_empty() {
            return Err(LearnerError::input("a training batch needs at least one trajectory"));
        }
        for (i, r) in rows.iter().enumerate() {
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
                return Err(LearnerError::input(format!("trajectory {i}: loss_mask[{t}] = {} (must be 0 or 1)", r.mask[t])));
            }
            if r.mask[0] != 0 {
                return Err(LearnerError::input(format!(
                    "trajectory {i}: loss_mask[0] is 1, but the first token has no prediction to train (it must be a prompt token)"
                )));
            }
            if let Some(t) = (0..r.tokens.len()).find(|&t| r.mask[t] == 1 && !r.logp[t].is_finite()) {
                return Err(LearnerError::input(format!("trajectory {i}: behaviour log-prob at token {t} is {}", r.logp[t])));
            }
        }
        let b = rows.len();
        let t = rows.iter().map(|r| r.tokens.len()).max().unwrap_or(0);
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
        let to_dev = |x: Tensor| -> Result<Tensor, LearnerError> { Ok(x.f_reshape(shape)?.f_to_device(device)?) };
        Ok(TrainBatch {
            tokens: to_dev(Tensor::f_from_slice(&tokens)?)?,
            loss_mask: to_dev(Tensor::f_from_slice(&mask)?)?,
            behaviour_logp: to_dev(Tensor::f_from_slice(&logp)?.f_to_kind(Kind::Float)?)?,
            final_rewards: rows.iter().map(|r| r.reward).collect(),
            group_ids: rows.iter().map(|r| r.group).collect(),
            n_tokens,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pads_right_and_counts_tokens() {
        let b = TrainBatch::from_sequences(&[(vec![1, 5, 6], vec![0, 1, 1]), (vec![1, 7], vec![0, 1])], Device::Cpu)
            .expect("batch");
        assert_eq!(b.tokens.size(), vec![2, 3]);
        assert_eq!(Vec::<Vec<i64>>::try_from(&b.tokens).expect("tokens"), vec![vec![1, 5, 6], vec![1, 7, 0]]);
        assert_eq!(Vec::<Vec<f32>>::try_from(&b.loss_mask).expect("mask"), vec![vec![0., 1., 1.], vec![0., 1., 0.]]);
        assert_eq!(b.n_tokens, 3);
        assert_eq!(b.group_ids, vec![0, 1]);
    }

    #[test]
    fn rejects_bad_rows() {
        let e = TrainBatch::from_sequences(&[(vec![1, 2], vec![1, 1])], Device::Cpu).err().expect("mask[0]");
        assert!(e.to_string().contains("loss_mask[0]"), "{e}");
        assert!(TrainBatch::from_sequences(&[(vec![1, 2], vec![0])], Device::Cpu).is_err());
        assert!(TrainBatch::from_sequences(&[], Device::Cpu).is_err());
        assert!(TrainBatch::from_sequences(&[(vec![1, 2], vec![0, 2])], Device::Cpu).is_err());
    }
}
