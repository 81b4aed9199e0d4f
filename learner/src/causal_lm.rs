//! The one interface the learner and the generator need from a policy network, implemented by
//! the embedded tiny transformer ([`PolicyModel`]) and by Hugging Face models ([`HfModel`]).
//!
//! Invariants:
//! - CL-1: `lm_forward(tokens)` returns logits `[B, T, V]` aligned as MD-3/HM-4 (position `t`
//!   predicts token `t + 1`), so [`crate::token_logprobs`] applies to either model unchanged.

use tch::{nn, Device, Tensor};

use crate::hf::{HfError, HfModel};
use crate::model::PolicyModel;

/// A causal language model with an optional value head.
pub trait CausalLm {
    /// (logits `[B, T, V]`, values `[B, T]` when the model has a value head) of unpadded or
    /// right-padded `tokens` `[B, T]` i64 (CL-1).
    fn lm_forward(&self, tokens: &Tensor) -> Result<(Tensor, Option<Tensor>), HfError>;
    /// The device holding the parameters.
    fn lm_device(&self) -> Device;
    /// Number of token ids.
    fn lm_vocab_size(&self) -> usize;
    /// The trainable variables.
    fn lm_var_store(&self) -> &nn::VarStore;
}

impl CausalLm for PolicyModel {
    fn lm_forward(&self, tokens: &Tensor) -> Result<(Tensor, Option<Tensor>), HfError> {
        Ok(self.try_forward(tokens)?)
    }
    fn lm_device(&self) -> Device {
        self.device()
    }
    fn lm_vocab_size(&self) -> usize {
        self.config().vocab_size
    }
    fn lm_var_store(&self) -> &nn::VarStore {
        self.var_store()
    }
}

impl CausalLm for HfModel {
    fn lm_forward(&self, tokens: &Tensor) -> Result<(Tensor, Option<Tensor>), HfError> {
        self.forward(tokens)
    }
    fn lm_device(&self) -> Device {
        self.device()
    }
    fn lm_vocab_size(&self) -> usize {
        self.config().vocab_size
    }
    fn lm_var_store(&self) -> &nn::VarStore {
        self.var_store()
    }
}
