//! The learner: one policy, one AdamW, and the RL / SFT update steps.
//!
//! `train_step`, for a batch of B trajectories:
//! ```text
//! GRPO: A[b, t] = grpo_advantages(final_rewards, group_ids)[b] · m[b, t]
//! PPO : r[b, last model token] = final_reward[b];  V = value head of the current weights
//!       (no grad), aligned so V[b, t] is the value of tokens[b, ..t];  (A, R) = GAE(r, V, m);
//!       A = masked_whiten(A, m)
//! for epoch in 1..=epochs, for each of min(minibatches, B) shuffled, near-equal minibatches:
//!   loss = ppo_clip(logp, behaviour_logp, A) − entropy_coef·H [+ value_coef·value_loss(V', V, R)]
//!   backward; clip the global grad norm; AdamW step
//! ```
//!
//! Invariants:
//! - LR-1 (off-policy ratio): the PPO ratio is always taken against the batch's behaviour
//!   log-probs — verl's bypass mode (§1.10) — in every epoch and minibatch. This corrects for
//!   generator staleness; behaviour log-probs must come from temperature-1 sampling (SM-1) for
//!   the ratio to start at 1 on-policy.
//! - LR-2 (skip on non-finite): a non-finite loss or gradient norm returns `NonFinite` before
//!   the optimizer is touched: that step's weights and optimizer state are unchanged (earlier
//!   minibatch steps of the same call stand).
//! - LR-3 (counters): `step()` counts RL optimizer steps (epochs × minibatches per successful
//!   `train_step`); `policy_version()` counts successful `train_step` calls (one published
//!   policy version each); SFT steps are counted separately; AdamW's own counter counts both.
//! - LR-4 (exact resume): the minibatch order depends only on (seed, step). `state_files` holds
//!   weights, optimizer state and counters, so `restore` followed by the same calls yields
//!   bit-identical weights to never stopping (same device, same thread count).
//! - LR-5 (config on restore): `restore` requires the checkpoint's model config to equal the
//!   running one; the running `LearnerConfig` is kept (the checkpoint's copy is informational).

use std::time::Instant;

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tch::{Device, Kind, Tensor};

use crate::advantages::{grpo_advantages, masked_whiten, try_gae};
use crate::batch_tensors::TrainBatch;
use crate::error::LearnerError;
use crate::learner_config::{Algo, LearnerConfig};
use crate::logprobs::{token_entropy, token_logprobs};
use crate::losses::{masked_mean, masked_mean_value, ppo_clip_loss, value_loss};
use crate::model::{ModelConfig, PolicyModel};
use crate::optimizer::{AdamW, AdamWConfig};

/// GRPO's denominator epsilon (verl: 1e-6).
const GRPO_EPS: f32 = 1e-6;

/// What one `train_step` / `sft_step` did; per-minibatch quantities are averaged.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct StepMetrics {
    /// Total loss that was minimised.
    pub loss: f64,
    /// Policy-gradient (PPO surrogate) part; 0 for SFT.
    pub pg_loss: f64,
    /// Value-loss part (before `value_coef`); 0 unless PPO.
    pub value_loss: f64,
    /// Fraction of tokens where the ratio clip was active.
    pub clip_frac: f64,
    /// k1 KL estimate between behaviour and current policy.
    pub approx_kl: f64,
    /// Token-mean entropy of the current policy on model tokens.
    pub entropy: f64,
    /// Pre-clip global gradient norm.
    pub grad_norm: f64,
    /// Model tokens in the batch.
    pub tokens: usize,
    /// `tokens / step_seconds`.
    pub tokens_per_s: f64,
    /// Mean outcome reward of the batch (0 for SFT).
    pub mean_reward: f64,
    /// Wall time of the whole call.
    pub step_seconds: f64,
}

/// The counters and configs stored in `learner.json`.
#[derive(serde::Serialize, serde::Deserialize)]
struct LearnerState {
    format: String,
    step: u64,
    sft_steps: u64,
    #[serde(default)]
    updates: u64,
    seed: u64,
    config: LearnerConfig,
    model: ModelConfig,
}

const STATE_FORMAT: &str = "keel.learner.v1";

/// Per-batch training targets, on the model's device.
struct Targets {
    tokens: Tensor,
    mask: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    /// PPO only: (aligned old values, returns).
    critic: Option<(Tensor, Tensor)>,
}

/// Policy + optimizer + counters.
pub struct Learner {
    model: PolicyModel,
    opt: AdamW,
    cfg: LearnerConfig,
    seed: u64,
    step: u64,
    sft_steps: u64,
    updates: u64,
}

/// `v[b, t] ← values[b, t-1]`, `v[b, 0] = 0`: the value of the prefix before token t (MD-3).
fn align_values(values: &Tensor) -> Result<Tensor, LearnerError> {
    let size = values.size();
    let zeros = Tensor::f_zeros([size[0], 1], (values.kind(), values.device()))?;
    Ok(Tensor::f_cat(&[zeros, values.f_narrow(1, 0, size[1] - 1)?], 1)?)
}

impl Learner {
    /// A fresh learner; PPO requires a value head.
    pub fn new(model_cfg: &ModelConfig, cfg: LearnerConfig, device: Device, seed: u64) -> Result<Self, LearnerError> {
        cfg.validate()?;
        model_cfg.validate()?;
        if cfg.algo == Algo::Ppo && !model_cfg.value_head {
            return Err(LearnerError::config(
                "model.value_head",
                "must be true when learner.algo = \"ppo\" (the critic is the policy's value head)",
            ));
        }
        let model = PolicyModel::new(model_cfg, device, seed)?;
        let opt = AdamW::new(
            model.var_store(),
            AdamWConfig { lr: cfg.lr, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: cfg.weight_decay },
        );
        Ok(Learner { model, opt, cfg, seed, step: 0, sft_steps: 0, updates: 0 })
    }

    /// The policy being trained.
    pub fn model(&self) -> &PolicyModel {
        &self.model
    }

    /// The running configuration.
    pub fn config(&self) -> &LearnerConfig {
        &self.cfg
    }

    /// RL optimizer steps taken (LR-3).
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Completed `train_step` calls: the policy version of the current weights (LR-3).
    pub fn policy_version(&self) -> u64 {
        self.updates
    }

    /// SFT optimizer steps taken (LR-3).
    pub fn sft_steps(&self) -> u64 {
        self.sft_steps
    }

    fn check_batch(&self, batch: &TrainBatch) -> Result<(), LearnerError> {
        let size = batch.tokens.size();
        if size.len() != 2 || batch.loss_mask.size() != size || batch.behaviour_logp.size() != size {
            return Err(LearnerError::input(format!(
                "tokens, loss_mask and behaviour_logp must share one [B, T] shape, got {:?}, {:?}, {:?}",
                size,
                batch.loss_mask.size(),
                batch.behaviour_logp.size()
            )));
        }
        let b = size[0] as usize;
        if batch.final_rewards.len() != b || batch.group_ids.len() != b {
            return Err(LearnerError::input(format!(
                "{b} trajectories but {} rewards and {} group ids",
                batch.final_rewards.len(),
                batch.group_ids.len()
            )));
        }
        if batch.n_tokens == 0 {
            return Err(LearnerError::input("the batch has no model tokens (loss_mask is all 0)"));
        }
        Ok(())
    }

    fn targets(&self, batch: &TrainBatch) -> Result<Targets, LearnerError> {
        let dev = self.model.device();
        let tokens = batch.tokens.f_to_device(dev)?;
        let mask = batch.loss_mask.f_to_device(dev)?.f_to_kind(Kind::Float)?;
        let old_logp = batch.behaviour_logp.f_to_device(dev)?.f_to_kind(Kind::Float)?;
        let b = batch.len() as i64;
        match self.cfg.algo {
            Algo::Grpo => {
                let a = grpo_advantages(&batch.final_rewards, &batch.group_ids, self.cfg.grpo_normalize_std, GRPO_EPS);
                let advantages = Tensor::f_from_slice(&a)?.f_to_device(dev)?.f_reshape([b, 1])?.f_mul(&mask)?;
                Ok(Targets { tokens, mask, old_logp, advantages, critic: None })
            }
            Algo::Ppo => {
                let values = tch::no_grad(|| self.model.try_forward(&tokens))?
                    .1
                    .ok_or_else(|| LearnerError::config("model.value_head", "must be true for PPO"))?;
                let values = align_values(&values.f_detach()?)?;
                // Outcome reward on each trajectory's last model token.
                let t = mask.size()[1];
                let positions = Tensor::f_arange(t, (Kind::Float, dev))?.f_add_scalar(1.0)?;
                let last = mask.f_mul(&positions)?.f_argmax(1, true)?;
                let r = Tensor::f_from_slice(&batch.final_rewards)?.f_to_device(dev)?.f_reshape([b, 1])?;
                let rewards = mask.f_zeros_like()?.f_scatter(1, &last, &r)?;
                let (adv, returns) = try_gae(&rewards, &values, &mask, self.cfg.gamma, self.cfg.lam)?;
                let advantages = masked_whiten(&adv, &mask);
                Ok(Targets { tokens, mask, old_logp, advantages, critic: Some((values, returns)) })
            }
        }
    }

    /// One RL update on `batch` (module doc; LR-1 … LR-3).
    pub fn train_step(&mut self, batch: &TrainBatch) -> Result<StepMetrics, LearnerError> {
        let start = Instant::now();
        self.check_batch(batch)?;
        let tg = self.targets(batch)?;
        let b = batch.len();
        let n_mb = self.cfg.minibatches.min(b);
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(self.step);
        let mut sum = StepMetrics::default();
        let mut n = 0.0;
        for _ in 0..self.cfg.epochs {
            let mut order: Vec<i64> = (0..b as i64).collect();
            if n_mb > 1 {
                order.shuffle(&mut rng);
            }
            for k in 0..n_mb {
                let chunk = &order[k * b / n_mb..(k + 1) * b / n_mb];
                let m = self.minibatch_step(&tg, chunk)?;
                for (acc, x) in [
                    (&mut sum.loss, m.loss),
                    (&mut sum.pg_loss, m.pg_loss),
                    (&mut sum.value_loss, m.value_loss),
                    (&mut sum.clip_frac, m.clip_frac),
                    (&mut sum.approx_kl, m.approx_kl),
                    (&mut sum.entropy, m.entropy),
                    (&mut sum.grad_norm, m.grad_norm),
                ] {
                    *acc += x;
                }
                n += 1.0;
            }
        }
        for acc in [
            &mut sum.loss,
            &mut sum.pg_loss,
            &mut sum.value_loss,
            &mut sum.clip_frac,
            &mut sum.approx_kl,
            &mut sum.entropy,
            &mut sum.grad_norm,
        ] {
            *acc /= n;
        }
        sum.tokens = batch.n_tokens;
        sum.mean_reward = batch.final_rewards.iter().map(|&r| f64::from(r)).sum::<f64>() / b as f64;
        sum.step_seconds = start.elapsed().as_secs_f64();
        sum.tokens_per_s = sum.tokens as f64 / sum.step_seconds.max(1e-9);
        self.updates += 1;
        Ok(sum)
    }

    fn minibatch_step(&mut self, tg: &Targets, rows: &[i64]) -> Result<StepMetrics, LearnerError> {
        let idx = Tensor::f_from_slice(rows)?.f_to_device(self.model.device())?;
        let pick = |t: &Tensor| t.f_index_select(0, &idx);
        let (tokens, mask, old_logp, adv) = (pick(&tg.tokens)?, pick(&tg.mask)?, pick(&tg.old_logp)?, pick(&tg.advantages)?);
        self.opt.set_lr(self.cfg.lr);
        self.opt.zero_grad();
        let (logits, values) = self.model.try_forward(&tokens)?;
        let logp = token_logprobs(&logits, &tokens);
        let pg = ppo_clip_loss(&logp, &old_logp, &adv, &mask, self.cfg.clip_low, self.cfg.clip_high);
        let mut loss = pg.loss.shallow_clone();
        let entropy = if self.cfg.entropy_coef > 0.0 {
            let h = masked_mean(&token_entropy(&logits), &mask);
            loss = loss.f_sub(&h.f_mul_scalar(self.cfg.entropy_coef)?)?;
            h.f_double_value(&[])?
        } else {
            tch::no_grad(|| masked_mean_value(&token_entropy(&logits.detach()), &mask))
        };
        let mut vf = 0.0;
        if let (Some((old_v, returns)), Some(values)) = (&tg.critic, values) {
            let v = align_values(&values)?;
            let vl = value_loss(&v, &pick(old_v)?, &pick(returns)?, &mask, self.cfg.value_clip);
            vf = vl.f_double_value(&[])?;
            loss = loss.f_add(&vl.f_mul_scalar(self.cfg.value_coef)?)?;
        }
        let loss_value = loss.f_double_value(&[])?;
        if !loss_value.is_finite() {
            return Err(LearnerError::NonFinite { what: "loss".into() });
        }
        let grad_norm = self.backward_and_step(&loss)?;
        self.step += 1;
        Ok(StepMetrics {
            loss: loss_value,
            pg_loss: pg.loss.f_double_value(&[])?,
            value_loss: vf,
            clip_frac: pg.clip_frac,
            approx_kl: pg.approx_kl,
            entropy,
            grad_norm,
            ..StepMetrics::default()
        })
    }

    /// Backward, clip, and step unless the gradient norm is non-finite (LR-2).
    fn backward_and_step(&mut self, loss: &Tensor) -> Result<f64, LearnerError> {
        loss.f_backward()?;
        let grad_norm = self.opt.clip_grad_norm(self.cfg.max_grad_norm);
        if !grad_norm.is_finite() {
            self.opt.zero_grad();
            return Err(LearnerError::NonFinite { what: "gradient norm".into() });
        }
        self.opt.step();
        Ok(grad_norm)
    }

    /// Supervised fine-tuning: token-mean cross-entropy on mask-1 tokens, one AdamW step at `lr`
    /// (not counted in `step()`, LR-3).
    pub fn sft_step(&mut self, batch: &TrainBatch, lr: f64) -> Result<StepMetrics, LearnerError> {
        let start = Instant::now();
        if !(lr > 0.0 && lr <= 1.0) {
            return Err(LearnerError::config("sft.lr", format!("must be in (0, 1], got {lr}")));
        }
        self.check_batch(batch)?;
        let dev = self.model.device();
        let tokens = batch.tokens.f_to_device(dev)?;
        let mask = batch.loss_mask.f_to_device(dev)?.f_to_kind(Kind::Float)?;
        self.opt.set_lr(lr);
        self.opt.zero_grad();
        let (logits, _) = self.model.try_forward(&tokens)?;
        let loss = masked_mean(&token_logprobs(&logits, &tokens), &mask).f_neg()?;
        let loss_value = loss.f_double_value(&[])?;
        if !loss_value.is_finite() {
            return Err(LearnerError::NonFinite { what: "loss".into() });
        }
        let entropy = tch::no_grad(|| masked_mean_value(&token_entropy(&logits.detach()), &mask));
        let grad_norm = self.backward_and_step(&loss)?;
        self.sft_steps += 1;
        let step_seconds = start.elapsed().as_secs_f64();
        Ok(StepMetrics {
            loss: loss_value,
            entropy,
            grad_norm,
            tokens: batch.n_tokens,
            tokens_per_s: batch.n_tokens as f64 / step_seconds.max(1e-9),
            step_seconds,
            ..StepMetrics::default()
        })
    }

    /// The policy weights as safetensors (what generators load).
    pub fn weights_safetensors(&self) -> Result<Vec<u8>, LearnerError> {
        self.model.to_safetensors()
    }

    /// Everything `restore` needs (LR-4): `model.safetensors`, `optimizer.safetensors`,
    /// `learner.json`.
    pub fn state_files(&self) -> Result<Vec<(String, Vec<u8>)>, LearnerError> {
        let state = LearnerState {
            format: STATE_FORMAT.to_string(),
            step: self.step,
            sft_steps: self.sft_steps,
            updates: self.updates,
            seed: self.seed,
            config: self.cfg.clone(),
            model: self.model.config().clone(),
        };
        Ok(vec![
            ("model.safetensors".to_string(), self.model.to_safetensors()?),
            ("optimizer.safetensors".to_string(), self.opt.to_safetensors()?),
            ("learner.json".to_string(), serde_json::to_vec_pretty(&state)?),
        ])
    }

    /// Restores weights, optimizer state and counters from `state_files` output (LR-4, LR-5).
    /// Everything is checked before anything changes.
    pub fn restore(&mut self, files: &[(String, Vec<u8>)]) -> Result<(), LearnerError> {
        let get = |name: &str| {
            files
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, b)| b.as_slice())
                .ok_or_else(|| LearnerError::mismatch(name, "missing from the learner checkpoint"))
        };
        let state: LearnerState = serde_json::from_slice(get("learner.json")?)?;
        if state.format != STATE_FORMAT {
            return Err(LearnerError::mismatch(
                "learner.json",
                format!("format {:?}, expected {STATE_FORMAT:?}", state.format),
            ));
        }
        if &state.model != self.model.config() {
            return Err(LearnerError::mismatch(
                "learner.json",
                format!("checkpoint model config {:?} differs from the running {:?}", state.model, self.model.config()),
            ));
        }
        let weights = self.model.decode_weights(get("model.safetensors")?)?;
        let (moments, opt_steps) = self.opt.decode_state(get("optimizer.safetensors")?)?;
        self.model.commit_weights(&weights)?;
        self.opt.commit_state(&moments, opt_steps)?;
        self.step = state.step;
        self.sft_steps = state.sft_steps;
        self.updates = state.updates;
        self.seed = state.seed;
        Ok(())
    }
}
