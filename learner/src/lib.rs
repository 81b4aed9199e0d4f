//! keel's learner: a small decoder-only transformer in tch, the RL objectives (PPO, GRPO) and
//! an AdamW whose state can be saved and restored exactly.
//!
//! Data flow: a stored rollout batch → [`TrainBatch`] (padded tensors) → [`Learner::train_step`]
//! (advantages, losses, optimizer) → weights as safetensors for generators and checkpoints.
//! Generators use [`sample_next`] / [`greedy_next`] on a [`PolicyModel`] loaded from those
//! weights.
//!
//! **Architecture invariant:** the learner never talks to environments or generators; it only
//! reads batches and produces weights and state files.
#![deny(missing_docs)]

pub mod advantages;
pub mod batch_tensors;
pub mod error;
pub mod learner;
pub mod learner_config;
pub mod logprobs;
pub mod losses;
pub mod model;
pub mod optimizer;
pub mod sampler;
mod tensor_io;

#[cfg(test)]
mod learner_tests;

pub use advantages::{gae, grpo_advantages, masked_whiten};
pub use batch_tensors::TrainBatch;
pub use error::LearnerError;
pub use learner::{Learner, StepMetrics};
pub use learner_config::{Algo, LearnerConfig};
pub use logprobs::{token_entropy, token_logprobs};
pub use losses::{masked_mean, ppo_clip_loss, value_loss, PolicyLoss};
pub use model::{ModelConfig, PolicyModel};
pub use optimizer::{AdamW, AdamWConfig};
pub use sampler::{greedy_next, sample_next, NextTokenSample};

// Generators and the learner run inside actors on other threads: keep these types `Send`.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<PolicyModel>();
    send::<Learner>();
    send::<TrainBatch>();
};
