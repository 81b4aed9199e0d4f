//! keel's learner: the one model path (`hf`: Llama / Qwen2 / Qwen3 in tch, the built-in tiny
//! model being a tiny Llama configuration of it, `model`), the algorithm library (`algo`:
//! losses, advantage estimators, KL, critic schedule and the preset registry) and an AdamW whose
//! state can be saved and restored exactly.
//!
//! Data flow: a stored rollout batch → [`TrainBatch`] (padded tensors) → [`Learner::train_step`]
//! (advantages, losses, optimizer) → weights as safetensors under HF names for generators and
//! checkpoints. Generators sample with the KV-cache [`hf::Sampler`] on an [`hf::HfModel`]
//! loaded from those weights.
//!
//! **Architecture invariant:** the learner never talks to environments or generators; it only
//! reads batches and produces weights and state files.
#![deny(missing_docs)]

pub mod algo;

pub mod batch_tensors;
pub mod collective;
pub mod data_parallel;
pub mod error;
pub mod hf;
pub mod host_memory;
pub mod learner;
pub mod learner_config;
pub mod logprobs;
pub mod lr_schedule;
pub mod model;
pub mod optimizer;
pub mod probe;
pub mod step_metrics;
mod targets;
mod tensor_io;
mod value_model;

#[cfg(test)]
mod learner_tests;
#[cfg(test)]
mod lora_learner_tests;

pub use algo::aggregation::{agg_loss, masked_mean, AggMode};
pub use algo::gae::{gae, masked_whiten};
pub use algo::grpo::grpo_advantages;
pub use algo::presets::{Preset, PresetConfig};
pub use batch_tensors::{TrainBatch, TurnSpan};
pub use error::LearnerError;
pub use learner::Learner;
pub use learner_config::{Algo, LearnerConfig};
pub use logprobs::{token_entropy, token_logprobs};
pub use model::{
    model_from_checkpoint, policy_from_checkpoint, policy_logits, LoraBase, ModelSpec, TinyShape,
    WeightSource,
};
pub use optimizer::{AdamW, AdamWConfig};
pub use step_metrics::StepMetrics;

// Generators and the learner run inside actors on other threads: keep these types `Send`.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<hf::HfModel>();
    send::<Learner>();
    send::<TrainBatch>();
};
