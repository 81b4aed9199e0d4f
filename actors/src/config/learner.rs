//! `[learner]`: the RL algorithm preset and its optimisation keys — the learner crate's own
//! `LearnerConfig`, validated by it (its errors name `learner.<key>`) — and what each preset
//! needs of the rest of the config (LoRA, a critic folder, sync mode).

use keel_learner::Algo;

use super::key::{at_least, Key, Range, POSITIVE, UNIT, UNIT_OPEN_LOW};
use super::{ConfigError, Mode, TrainConfig};

/// The keys of `[learner]` that the default config writes (optional overrides are listed in
/// `learner.algo`'s doc).
pub const KEYS: &[Key] = &[
    Key::new("learner.algo", Range::Words(&["ppo", "grpo", "dr_grpo", "gspo", "dapo", "sampo", "sao", "armor", "so_ppo", "so_grpo", "rtpo", "dr_mas", "pats"]), "The RL algorithm preset; its hyper-parameters are shown by keel algo show NAME and overridden by optional learner keys (weight_decay, clip_low, clip_high, dual_clip, loss_agg, kl_coef, gigpo_similarity (SAMPO: GiGPO step groups by SequenceMatcher ratio >= this, 0.95 in ARL-Arena), ...; policy_loss = ppo | gspo | reinforce picks the loss, rollout_is_threshold the REINFORCE truncation, 2.0 as in verl, 0 for none; with ratio_base = recompute, rollout_is = token | sequence adds truncated importance weights against the rollout log-probs (the engine/trainer mismatch, verl rollout_is) and rollout_rs = sequence | geometric rejects sequences outside [1/rollout_rs_threshold, rollout_rs_threshold]; metrics rollout_logp_mismatch, rollout_is_truncated_frac, rollout_rs_rejected_frac)."),
    Key::new("learner.lr", UNIT_OPEN_LOW, "AdamW learning rate."),
    Key::new("learner.max_grad_norm", POSITIVE, "Global gradient-norm clip."),
    Key::new("learner.max_tokens_per_microbatch", at_least(0), "Most padded tokens (rows x length) in one forward/backward of an actor update; gradients accumulate over such micro-batches under the mini-batch's global denominators, then one optimizer step. 0 = the whole mini-batch at once. Not with seq_mask_delta."),
    Key::new("learner.ranks", at_least(1), "Data-parallel learner ranks over PyTorch's c10d (Gloo on CPU): keel train / keel trainer is rank 0 and starts ranks 1..N-1 as keel learner --rank R processes on this machine (a launcher that sets WORLD_SIZE starts them itself). Each rank trains its share of every mini-batch under the global loss denominators; gradients are summed, AdamW's state is sharded (1/N per rank) and checkpointed per rank; a resume may use another N. Not with seq_mask_delta."),
    Key::new("learner.reduce_dtype", Range::Words(&["f32", "bf16"]), "learner.ranks > 1: the element type gradients are summed in over the ranks. f32 (default) gives the one-rank update up to float reassociation; bf16 sends half the bytes and rounds each rank's gradient and the sum to bf16 (master weights and AdamW moments stay f32)."),
    Key::new("learner.activation_checkpointing", Range::Bool, "Recompute each decoder layer's activations in the backward pass instead of keeping them: activation memory of one layer plus one residual stream per layer, for about one extra forward pass. Same gradients."),
    Key::new("learner.lr_warmup_steps", at_least(0), "Learning-rate warm-up in updates: update u < W runs at lr * u / W (0 at the first, as verl and transformers); the preset's default is 0 (armor: 10, as its scripts)."),
    Key::new("learner.lr_schedule", Range::Words(&["constant", "cosine"]), "Learning rate after the warm-up: constant, or half a cosine down to lr_min_ratio * lr at run.steps."),
    Key::new("learner.lr_min_ratio", UNIT, "Floor of the cosine schedule as a fraction of learner.lr."),
    Key::new("learner.epochs", at_least(1), "Passes over each batch."),
    Key::new("learner.minibatches", at_least(1), "Optimizer steps per pass."),
    Key::new("learner.reference_kl", Range::Bool, "Keep a frozen reference policy (the weights at the first update) and report kl_ref (k3 KL to it) for presets without one; one extra forward pass per micro-batch, the loss is unchanged. keel arena sets it so every method's drift is comparable."),
];

/// A learner-crate error as a config error naming its key.
pub fn config_error(at: &str, e: keel_learner::LearnerError) -> ConfigError {
    match e {
        keel_learner::LearnerError::InvalidConfig { key, reason } => {
            ConfigError::OutOfRange { key, reason }
        }
        other => ConfigError::OutOfRange {
            key: at.into(),
            reason: other.to_string(),
        },
    }
}

/// Checks `[learner]` (with `[armor.loss]`) through the learner crate, then what the preset
/// needs of the rest of the config.
pub fn validate(cfg: &TrainConfig) -> Result<(), ConfigError> {
    cfg.learner_config()
        .validate()
        .map_err(|e| config_error("learner", e))?;
    if cfg.learner.algo == Algo::Rtpo && cfg.run.mode != Mode::Sync {
        return Err(ConfigError::OutOfRange {
            key: "run.mode".into(),
            reason: "must be sync when learner.algo = \"rtpo\" (siblings are continued with the current weights)".into(),
        });
    }
    validate_lora(cfg)?;
    validate_critic_path(cfg)
}

/// `[model.lora]` through the learner crate's `LoraConfig`, and what LoRA excludes.
fn validate_lora(cfg: &TrainConfig) -> Result<(), ConfigError> {
    let Some(lora) = cfg.lora_config() else {
        return Ok(());
    };
    lora.validate().map_err(|e| match e {
        keel_learner::hf::HfError::Learner(e) => config_error("model.lora", e),
        other => ConfigError::OutOfRange {
            key: "model.lora".into(),
            reason: other.to_string(),
        },
    })?;
    let resolved = cfg.learner.resolve();
    if resolved.needs_critic() && !resolved.policy_value_head() {
        return Err(ConfigError::OutOfRange {
            key: "model.lora.rank".into(),
            reason: format!(
                "LoRA needs a critic-free preset or learner.critic_model = \"shared\" (a separate critic would be a full copy of the model), but learner.algo = {:?} has a separate critic",
                cfg.learner.algo.name()
            ),
        });
    }
    if lora.dropout > 0.0 && cfg.learner.activation_checkpointing {
        return Err(ConfigError::OutOfRange {
            key: "model.lora.dropout".into(),
            reason: "must be 0 with learner.activation_checkpointing = true (recomputed layers would draw other dropout masks)".into(),
        });
    }
    Ok(())
}

/// `model.critic_path` needs a preset with a separate critic.
fn validate_critic_path(cfg: &TrainConfig) -> Result<(), ConfigError> {
    if cfg.model.critic_path.is_empty() {
        return Ok(());
    }
    let resolved = cfg.learner.resolve();
    if resolved.needs_critic() && !resolved.policy_value_head() {
        return Ok(());
    }
    Err(ConfigError::OutOfRange {
        key: "model.critic_path".into(),
        reason: format!(
            "needs a separate critic, but learner.algo = {:?} has {} critic",
            cfg.learner.algo.name(),
            if resolved.needs_critic() {
                "a shared (set learner.critic_model = \"separate\")"
            } else {
                "no"
            }
        ),
    })
}
