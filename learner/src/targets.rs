//! Per-batch training targets: scores, advantages, the ratio's denominator and reference
//! log-probs, computed once per `train_step` from a [`TrainBatch`] and a [`PresetConfig`].
//!
//! Segments (RB-4): every trajectory is trained as its own sequence. GRPO / Dr. GRPO count an
//! episode split into segments once in its group (`algo::grpo::episode_advantages`); the other
//! estimators see each segment as a trajectory with the episode's reward (GAE: the reward at
//! its last model token).
//!
//! Scores (layout C, one trajectory = one sample):
//! ```text
//! score_i   = R_i − c·#invalid turns_i + overlong(n_model_tokens_i)           (per trajectory)
//! score_i,k = R_i − c·[turn k invalid]                                        (GiGPO records)
//! step r_k  = turn reward_k − c·[invalid_k], and the last turn also gets
//!             R_i − Σ_k turn reward_k   (so a final-reward-only env credits its last step)
//! ```
//! Advantages dispatch on `AdvantageKind`; outcome advantages are broadcast over the mask, GiGPO
//! advantages over each turn's tokens, GAE is per token (reward on the last model token, KL in
//! reward subtracted per token when configured).
//!
//! Invariants:
//! - TG-1: advantages are 0 wherever the (possibly reduced) mask is 0.
//! - TG-2: only RTPO (to each trajectory's trained turn, BT-8), an agent filter (Dr. MAS
//!   per-agent models: to the turns of the model's agents) and the rollout correction's
//!   sequence rejection (RCO-*) reduce the mask.
//! - TG-3: reference and old log-probs are computed without gradient.

use tch::{Device, Kind, Tensor};

use crate::algo::dapo::{invalid_action_penalty, overlong_penalty};
use crate::algo::drmas::drmas_advantages;
use crate::algo::gae::{masked_whiten, try_gae};
use crate::algo::gigpo::{gigpo_advantages, similarity_groups, StepRecord};
use crate::algo::grpo::{episode_advantages, GRPO_EPS};
use crate::algo::kl::{kl_in_reward, KlEstimator};
use crate::algo::presets::{AdvantageKind, PresetConfig, RatioBase};
use crate::algo::rollout_correction::{correct, mismatch, CorrectionStats};
use crate::algo::rtpo::{branch_turn_mask, sibling_advantages};
use crate::algo::sao::{length_adaptive_lambda, response_spans};
use crate::batch_tensors::TrainBatch;
use crate::error::LearnerError;
use crate::hf::HfModel;
use crate::logprobs::token_logprobs;
use crate::model::policy_logits;

/// Everything the mini-batch steps read, on the model's device.
pub(crate) struct Targets {
    pub tokens: Tensor,
    pub mask: Tensor,
    pub behaviour_logp: Tensor,
    pub old_logp: Tensor,
    pub advantages: Tensor,
    pub ref_logp: Option<Tensor>,
    /// Rollout correction: the policy loss's importance weights (RCO-1), when on.
    pub is_weights: Option<Tensor>,
    /// Rollout correction statistics; None with `ratio_base = behaviour` (nothing recomputed).
    pub correction: Option<CorrectionStats>,
    pub turn_ids: Tensor,
    pub max_turns: i64,
    /// `[B]` f32: 1 for trajectories sampled by the anchor (reference) policy.
    pub anchor_rows: Tensor,
    /// Share of rows sampled by the policy (not anchors): ARMOR's automatic mixture ratio.
    pub policy_share: f64,
    /// Critic presets: (aligned old values, returns).
    pub critic: Option<(Tensor, Tensor)>,
    /// Token-mean KL(old ‖ ref) used by KL in reward, when on.
    pub kl_reward_mean: Option<f64>,
}

/// `v[b, t] ← values[b, t-1]`, `v[b, 0] = 0`: the value of the prefix before token t (MD-3).
pub(crate) fn align_values(values: &Tensor) -> Result<Tensor, LearnerError> {
    let size = values.size();
    let zeros = Tensor::f_zeros([size[0], 1], (values.kind(), values.device()))?;
    Ok(Tensor::f_cat(
        &[zeros, values.f_narrow(1, 0, size[1] - 1)?],
        1,
    )?)
}

/// Per-token log-probs of `model` on `tokens` at `temperature` (MD-5), without gradient (TG-3).
pub(crate) fn frozen_logp(
    model: &HfModel,
    tokens: &Tensor,
    temperature: f64,
) -> Result<Tensor, LearnerError> {
    let (logits, _) = tch::no_grad(|| policy_logits(model, tokens, temperature))?;
    Ok(token_logprobs(&logits, tokens).f_detach()?)
}

/// Per-trajectory scores (module doc).
fn scores(batch: &TrainBatch, p: &PresetConfig) -> Vec<f64> {
    (0..batch.len())
        .map(|i| {
            let mut s = f64::from(batch.final_rewards[i]);
            for t in &batch.turns[i] {
                s += invalid_action_penalty(t.invalid, p.invalid_action_penalty);
            }
            if let Some(o) = p.overlong {
                let len: usize = batch.turns[i].iter().map(|t| t.end - t.start).sum();
                s += overlong_penalty(len, o.max_len, o.buffer, o.factor);
            }
            s
        })
        .collect()
}

/// GiGPO's turn records; with `similarity`, step groups by text similarity of the stored
/// anchor states (`algo::gigpo::similarity_groups`) instead of the exact anchor keys.
fn gigpo_records(
    batch: &TrainBatch,
    p: &PresetConfig,
    similarity: Option<f64>,
) -> Result<Vec<StepRecord>, LearnerError> {
    let mut out = Vec::new();
    let mut texts: Vec<&str> = Vec::new();
    for i in 0..batch.len() {
        let r = f64::from(batch.final_rewards[i]);
        let spans = &batch.turns[i];
        let turn_total: f64 = spans.iter().map(|t| f64::from(t.reward)).sum();
        if similarity.is_some() && batch.anchor_states[i].len() != spans.len() {
            return Err(LearnerError::input(format!(
                "trajectory {i} has no stored anchor states, which GiGPO similarity groups \
                 (learner.gigpo_similarity) need: it was sampled without them"
            )));
        }
        if similarity.is_some() {
            texts.extend(batch.anchor_states[i].iter().map(String::as_str));
        }
        for (k, t) in spans.iter().enumerate() {
            let pen = invalid_action_penalty(t.invalid, p.invalid_action_penalty);
            let residual = if k + 1 == spans.len() {
                r - turn_total
            } else {
                0.0
            };
            out.push(StepRecord {
                uid: batch.group_ids[i],
                traj: i as u64,
                anchor: t.anchor,
                score: r + pen,
                step_reward: f64::from(t.reward) + residual + pen,
            });
        }
    }
    if let Some(threshold) = similarity {
        let uids: Vec<u64> = out.iter().map(|r| r.uid).collect();
        for (r, g) in out
            .iter_mut()
            .zip(similarity_groups(&uids, &texts, threshold))
        {
            r.anchor = g;
        }
    }
    Ok(out)
}

/// Per-trajectory values broadcast over `mask`.
fn broadcast(per_row: &[f64], mask: &Tensor) -> Result<Tensor, LearnerError> {
    let b = per_row.len() as i64;
    let a = Tensor::f_from_slice(per_row)?
        .f_to_kind(Kind::Float)?
        .f_to_device(mask.device())?
        .f_reshape([b, 1])?;
    Ok(a.f_mul(mask)?)
}

/// Per-turn values written over each turn's tokens.
fn per_turn(batch: &TrainBatch, values: &[f64], mask: &Tensor) -> Result<Tensor, LearnerError> {
    let size = mask.size();
    let t = size[1] as usize;
    let mut out = vec![0f32; batch.len() * t];
    let mut k = 0;
    for (i, spans) in batch.turns.iter().enumerate() {
        for s in spans {
            for j in s.start..s.end.min(t) {
                out[i * t + j] = values[k] as f32;
            }
            k += 1;
        }
    }
    Ok(Tensor::f_from_slice(&out)?
        .f_reshape([size[0], size[1]])?
        .f_to_device(mask.device())?
        .f_mul(mask)?)
}

/// `mask` restricted to the turns of `agents` (Dr. MAS: a model trains only its agents' turns).
fn agent_turn_mask(
    batch: &TrainBatch,
    agents: &[u32],
    mask: &Tensor,
) -> Result<Tensor, LearnerError> {
    let ones: Vec<f64> = batch
        .turns
        .iter()
        .flatten()
        .map(|t| f64::from(u8::from(agents.contains(&t.agent))))
        .collect();
    per_turn(batch, &ones, mask)
}

/// Computes the targets of `batch` (module doc); `value_model` is the model whose value head
/// gives the critic's values (GAE presets); `agent_filter` keeps only those agents' turns.
#[allow(clippy::too_many_arguments)]
pub(crate) fn compute(
    model: &HfModel,
    value_model: Option<&HfModel>,
    reference: Option<&HfModel>,
    batch: &TrainBatch,
    p: &PresetConfig,
    kl_beta: f64,
    agent_filter: Option<&[u32]>,
    temperature: f64,
) -> Result<Targets, LearnerError> {
    let dev: Device = model.device();
    let tokens = batch.tokens.f_to_device(dev)?;
    let mut mask = batch.loss_mask.f_to_device(dev)?.f_to_kind(Kind::Float)?;
    let behaviour_logp = batch
        .behaviour_logp
        .f_to_device(dev)?
        .f_to_kind(Kind::Float)?;
    let old_logp = match p.ratio_base {
        RatioBase::Behaviour => behaviour_logp.shallow_clone(),
        RatioBase::Recompute => frozen_logp(model, &tokens, temperature)?.f_mul(&mask)?,
    };
    let ref_logp = match reference {
        Some(r) => Some(frozen_logp(r, &tokens, temperature)?.f_mul(&mask)?),
        None => None,
    };
    let (is_weights, correction) = rollout_correction(p, &old_logp, &behaviour_logp, &mut mask);
    if let Some(agents) = agent_filter {
        mask = agent_turn_mask(batch, agents, &mask)?;
    }
    let kl = match (p.kl_reward, ref_logp.as_ref()) {
        (Some(k), Some(rl)) => Some((k.estimator, &old_logp, rl, kl_beta)),
        _ => None,
    };
    let (mut advantages, critic) =
        preset_advantages(batch, p, value_model, &tokens, &mut mask, kl)?;
    if p.whiten {
        advantages = masked_whiten(&advantages, &mask);
    }
    Ok(Targets {
        tokens,
        mask,
        behaviour_logp,
        old_logp,
        advantages,
        ref_logp,
        is_weights,
        correction,
        turn_ids: batch.turn_ids.f_to_device(dev)?,
        max_turns: batch.max_turns,
        anchor_rows: anchor_rows(batch, dev)?,
        policy_share: policy_share(batch),
        kl_reward_mean: critic.as_ref().and_then(|c| c.kl_reward_mean),
        critic: critic.map(|c| (c.values, c.returns)),
    })
}

/// The preset's advantages over `mask`'s tokens, and a critic preset's values and returns
/// (GAE, with the KL-in-reward term `kl` when on); RTPO keeps only each row's trained turn in
/// `mask`.
fn preset_advantages(
    batch: &TrainBatch,
    p: &PresetConfig,
    value_model: Option<&HfModel>,
    tokens: &Tensor,
    mask: &mut Tensor,
    kl: Option<(KlEstimator, &Tensor, &Tensor, f64)>,
) -> Result<(Tensor, Option<CriticTargets>), LearnerError> {
    let sc = scores(batch, p);
    let advantages = match p.advantage {
        AdvantageKind::Grpo => {
            let adv = episode_advantages(
                &sc,
                &batch.group_ids,
                &batch.episodes,
                p.normalize_std,
                GRPO_EPS,
            );
            broadcast(&adv, mask)?
        }
        AdvantageKind::DrMas => drmas_turn_advantages(batch, p, mask)?,
        AdvantageKind::Rtpo => {
            *mask = branch_turn_mask(mask, &trained_turn_spans(batch));
            broadcast(&sibling_advantages(&sc, &batch.group_ids, GRPO_EPS), mask)?
        }
        AdvantageKind::Gigpo {
            omega,
            step_gamma,
            norm,
            similarity,
        } => {
            let recs = gigpo_records(batch, p, similarity)?;
            let adv = gigpo_advantages(&recs, step_gamma, omega, norm, GRPO_EPS);
            per_turn(batch, &adv, mask)?
        }
        AdvantageKind::Gae | AdvantageKind::SaoGae { .. } => {
            let critic_model = value_model.ok_or_else(|| {
                LearnerError::config("model.value_head", "must be true for a critic preset")
            })?;
            let (advantages, critic) = critic_advantages(critic_model, tokens, mask, &sc, p, kl)?;
            return Ok((advantages, Some(critic)));
        }
    };
    Ok((advantages, None))
}

/// With a recomputed π_old: the rollout correction's IS weights and statistics (which may drop
/// tokens from `mask`), or the engine/trainer mismatch alone without a correction; nothing with
/// the behaviour policy as π_old.
fn rollout_correction(
    p: &PresetConfig,
    old_logp: &Tensor,
    behaviour_logp: &Tensor,
    mask: &mut Tensor,
) -> (Option<Tensor>, Option<CorrectionStats>) {
    match (p.ratio_base, &p.rollout_correction) {
        (RatioBase::Behaviour, _) => (None, None),
        (RatioBase::Recompute, None) => {
            let stats = CorrectionStats {
                mismatch: mismatch(old_logp, behaviour_logp, mask),
                ..CorrectionStats::default()
            };
            (None, Some(stats))
        }
        (RatioBase::Recompute, Some(cfg)) => {
            let c = correct(old_logp, behaviour_logp, mask, cfg);
            *mask = c.mask;
            (c.weights, Some(c.stats))
        }
    }
}

/// Dr. MAS's advantages (layout P records): one record per agent turn, scored R − that turn's
/// invalid-action penalty, normalised within (group, agent); spread over each turn's tokens.
fn drmas_turn_advantages(
    batch: &TrainBatch,
    p: &PresetConfig,
    mask: &Tensor,
) -> Result<Tensor, LearnerError> {
    let (mut scores, mut uids, mut agents) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..batch.len() {
        for t in &batch.turns[i] {
            scores.push(
                f64::from(batch.final_rewards[i])
                    + invalid_action_penalty(t.invalid, p.invalid_action_penalty),
            );
            uids.push(batch.group_ids[i]);
            agents.push(t.agent);
        }
    }
    let adv = drmas_advantages(&scores, &uids, &agents, p.normalize_std, GRPO_EPS);
    per_turn(batch, &adv, mask)
}

/// RTPO: each row's trained turn (the branch point) as its token span; None where the row has
/// no such turn.
fn trained_turn_spans(batch: &TrainBatch) -> Vec<Option<(usize, usize)>> {
    batch
        .turns
        .iter()
        .zip(&batch.trained_turns)
        .map(|(s, k)| s.get(k.unwrap_or(0)).map(|t| (t.start, t.end)))
        .collect()
}

/// What GAE gives a critic preset besides its advantages: the critic's values and returns, and
/// the KL subtracted in the reward when that is on.
struct CriticTargets {
    values: Tensor,
    returns: Tensor,
    kl_reward_mean: Option<f64>,
}

/// GAE over the critic's values: the outcome score on each row's last loss token, minus the
/// KL-in-reward term when `kl` = (estimator, old log-probs, reference log-probs, β) is given;
/// SAO-GAE uses a length-adaptive λ for the advantages and λ = 1 for the returns.
fn critic_advantages(
    critic_model: &HfModel,
    tokens: &Tensor,
    mask: &Tensor,
    scores: &[f64],
    p: &PresetConfig,
    kl: Option<(KlEstimator, &Tensor, &Tensor, f64)>,
) -> Result<(Tensor, CriticTargets), LearnerError> {
    let dev = mask.device();
    let values = tch::no_grad(|| critic_model.forward_values(tokens))?;
    let values = align_values(&values.f_detach()?)?;
    let t = mask.size()[1];
    let positions = Tensor::f_arange(t, (Kind::Float, dev))?.f_add_scalar(1.0)?;
    let last = mask.f_mul(&positions)?.f_argmax(1, true)?;
    let r = Tensor::f_from_slice(scores)?
        .f_to_kind(Kind::Float)?
        .f_to_device(dev)?
        .f_reshape([scores.len() as i64, 1])?;
    let mut rewards = mask.f_zeros_like()?.f_scatter(1, &last, &r)?.f_mul(mask)?;
    let mut kl_reward_mean = None;
    if let Some((estimator, old_logp, ref_logp, beta)) = kl {
        let (shaped, kl) = kl_in_reward(&rewards, old_logp, ref_logp, mask, beta, estimator);
        rewards = shaped;
        kl_reward_mean = Some(kl);
    }
    let (advantages, returns) = match p.advantage {
        AdvantageKind::SaoGae { alpha } => {
            let lams: Vec<f64> = response_spans(mask)
                .into_iter()
                .map(|l| length_adaptive_lambda(l, alpha))
                .collect();
            let (adv, _) = try_gae(&rewards, &values, mask, p.gamma, &lams)?;
            let (_, returns) = try_gae(&rewards, &values, mask, p.gamma, &[1.0])?;
            (adv, returns)
        }
        _ => try_gae(&rewards, &values, mask, p.gamma, &[p.lam])?,
    };
    Ok((
        advantages,
        CriticTargets {
            values,
            returns,
            kl_reward_mean,
        },
    ))
}

/// 1 for each anchor (reference-sampled, ARMOR) row, 0 for the others, on `dev`.
fn anchor_rows(batch: &TrainBatch, dev: Device) -> Result<Tensor, LearnerError> {
    let rows: Vec<f32> = batch
        .anchors
        .iter()
        .map(|&a| f32::from(u8::from(a)))
        .collect();
    Ok(Tensor::f_from_slice(&rows)?.f_to_device(dev)?)
}

/// The share of rows the policy sampled (not anchors); 1 without anchors.
fn policy_share(batch: &TrainBatch) -> f64 {
    if batch.anchors.is_empty() {
        return 1.0;
    }
    batch.anchors.iter().filter(|&&a| !a).count() as f64 / batch.anchors.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::presets::Preset;
    use crate::batch_tensors::{Row, RowTurn};
    use crate::model::test_models::tiny;

    fn model() -> HfModel {
        tiny(12, false, 3)
    }

    fn turn(start: usize, end: usize, agent: u32, invalid: bool) -> RowTurn {
        RowTurn {
            start,
            end,
            reward: 0.0,
            invalid,
            agent,
            anchor: Some(start as u64),
        }
    }

    /// Two-agent trajectories: prompt `1 2`, agent 0's turn (2 tokens), observation `9`, agent
    /// 1's turn (1 token). Group 5: rewards 1, 0, 0; agent 1's turn of row 2 is invalid.
    fn two_agent_batch(trained: Option<usize>) -> TrainBatch {
        let rows = [(1.0f32, false), (0.0, false), (0.0, true)]
            .iter()
            .map(|&(reward, invalid)| {
                let tokens = vec![1, 2, 3, 4, 9, 5];
                let mask = vec![0, 0, 1, 1, 0, 1];
                let logp = vec![0.0, 0.0, -1.0, -1.0, 0.0, -1.0];
                let mut r = Row::new(tokens, mask, logp, reward, 5);
                r.turns = vec![turn(2, 4, 0, false), turn(5, 6, 1, invalid)];
                r.trained_turn = trained;
                r
            })
            .collect();
        TrainBatch::from_rows(rows, Device::Cpu).expect("batch")
    }

    fn row(t: &Tensor, i: i64) -> Vec<f32> {
        Vec::<f32>::try_from(&t.get(i)).expect("row")
    }

    #[test]
    fn gigpo_similarity_groups_by_the_stored_texts_and_needs_them() {
        let mut b = two_agent_batch(None);
        let p = Preset::Sampo.config();
        // Exact keys: every row's turn k answered the same state (keys 2 and 5).
        let exact = gigpo_records(&b, &p, None).expect("records");
        assert_eq!(
            exact.iter().map(|r| r.anchor).collect::<Vec<_>>(),
            [2, 5, 2, 5, 2, 5]
        );
        let err = gigpo_records(&b, &p, Some(0.9)).expect_err("no texts stored");
        assert!(
            err.to_string().contains("learner.gigpo_similarity"),
            "{err}"
        );
        b.anchor_states = [
            ["at fridge 1", "x"],
            ["at fridge 2", "y"],
            ["at sink 9", "z"],
        ]
        .iter()
        .map(|t| t.iter().map(|s| s.to_string()).collect())
        .collect();
        // difflib ratios: fridge 1 ~ fridge 2 0.909, sink vs fridge 0.5, letters 0.
        let at = |th: f64| -> Vec<u64> {
            gigpo_records(&b, &p, Some(th))
                .expect("records")
                .iter()
                .map(|r| r.anchor)
                .collect()
        };
        assert_eq!(at(0.9), [0, 1, 0, 3, 4, 5]);
        assert_eq!(at(0.5), [0, 1, 0, 3, 0, 5]);
        assert_eq!(at(0.95), [0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn tg2_agent_filter_keeps_only_that_agents_turns() {
        let (m, b) = (model(), two_agent_batch(None));
        let p = Preset::DrMas.config();
        let tg = compute(&m, None, None, &b, &p, 0.0, Some(&[1]), 1.0).expect("targets");
        assert_eq!(row(&tg.mask, 0), vec![0., 0., 0., 0., 0., 1.]);
        let all = compute(&m, None, None, &b, &p, 0.0, None, 1.0).expect("targets");
        assert_eq!(row(&all.mask, 0), vec![0., 0., 1., 1., 0., 1.]);
    }

    #[test]
    fn dm_records_are_turns_normalised_per_agent() {
        // Agent 0's records score [1, 0, 0]; agent 1's [1, 0, -0.1] (the invalid penalty).
        let (m, b) = (model(), two_agent_batch(None));
        let p = Preset::DrMas.config();
        let tg = compute(&m, None, None, &b, &p, 0.0, None, 1.0).expect("targets");
        let a0 = drmas_advantages(&[1.0, 0.0, 0.0], &[5, 5, 5], &[0, 0, 0], true, GRPO_EPS);
        let a1 = drmas_advantages(&[1.0, 0.0, -0.1], &[5, 5, 5], &[1, 1, 1], true, GRPO_EPS);
        for i in 0..3 {
            let r = row(&tg.advantages, i as i64);
            assert!((f64::from(r[2]) - a0[i]).abs() < 1e-5, "{r:?} vs {a0:?}");
            assert!((f64::from(r[5]) - a1[i]).abs() < 1e-5, "{r:?} vs {a1:?}");
        }
        // The invalid record of agent 1 pulls only agent 1's statistics.
        assert!((a0[1] - a0[2]).abs() < 1e-12 && a1[2] < a1[1]);
    }

    #[test]
    fn tg2_rtpo_trains_only_the_named_turn() {
        let m = model();
        let p = Preset::Rtpo.config();
        let second = compute(
            &m,
            None,
            None,
            &two_agent_batch(Some(1)),
            &p,
            0.0,
            None,
            1.0,
        )
        .expect("tg");
        assert_eq!(row(&second.mask, 0), vec![0., 0., 0., 0., 0., 1.]);
        let first = compute(
            &m,
            None,
            None,
            &two_agent_batch(Some(0)),
            &p,
            0.0,
            None,
            1.0,
        )
        .expect("tg");
        assert_eq!(row(&first.mask, 0), vec![0., 0., 1., 1., 0., 0.]);
        // Advantages are zero wherever the reduced mask is (TG-1).
        let a = row(&first.advantages, 0);
        assert_eq!((a[4], a[5]), (0.0, 0.0));
    }
}
