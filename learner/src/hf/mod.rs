//! Hugging Face Llama / Qwen2 / Qwen3 models in tch: load a local model folder, run it as a
//! policy or a critic, sample from it with a KV cache, and save it back in a folder that
//! transformers loads directly.
//!
//! Data flow: folder → [`HfConfig`] + [`weights`] → [`HfModel`] (forward → logits `[B, T, V]`,
//! the learner's [`crate::token_logprobs`] applies) → [`Sampler`] (generation with exact
//! log-probs, [`logprob_mismatch`] checks them) → [`HfModel::save_pretrained`].
//!
//! Module map: `config` (config.json), `weights` (safetensors files), `layers` (RMSNorm, RoPE),
//! `model` (the decoder and heads), `train_pass` (training forward, activation checkpointing),
//! `checkpoint` (saving), `kv_cache`, `sampling` (token
//! choice), `sampler` (the engine), `tokenizer` (tokenizer.json + chat template), `mismatch`.

pub mod chat_codec;
pub mod checkpoint;
pub mod config;
pub mod error;
pub mod kv_cache;
pub mod layers;
pub mod lora;
pub mod mismatch;
pub mod model;
pub mod sampler;
pub(crate) mod sampling;
pub mod tokenizer;
pub mod train_pass;
pub mod weights;

pub use chat_codec::{ChatCodec, TemplateCheck};
pub use config::{Arch, HfConfig, RopeScaling};
pub use error::HfError;
pub use lora::LoraConfig;
pub use mismatch::{logprob_mismatch, LogprobMismatch, SampledSequence};
pub use model::{HfModel, LoadOptions};
pub use sampler::{Completion, FinishReason, GenRequest, Sampler, SamplerStats, SamplingParams};
pub use tokenizer::{ChatMessage, HfTokenizer};
pub use train_pass::TrainPass;

#[cfg(test)]
mod tests;
