//! The forward pass of a training step, with optional activation checkpointing.
//!
//! Without checkpointing, [`HfModel::train_pass`] is [`HfModel::hidden`] and
//! [`TrainPass::backward`] is `loss.backward()`. With it, the decoder layers run without
//! autograd and keep only each layer's input `[B, T, H]`; the final norm runs on a leaf copy of
//! the last residual stream, so the loss's graph stops there. `backward` then walks the layers
//! from the top: it recomputes layer `l` from its saved input (a fresh leaf), backpropagates
//! the gradient arriving at its output (`Σ y·g` has gradient `g` with respect to `y`), and
//! hands the input's gradient to the layer below; the embedding comes last. Peak activation
//! memory is one layer's intermediate tensors plus `L` residual streams, instead of every
//! layer's intermediates, for about one extra forward pass of compute.
//!
//! Invariants:
//! - AC-1 (same gradients): with or without checkpointing, the parameter gradients after
//!   `backward` are the same (the recomputed forward is the same arithmetic; only the order in
//!   which contributions are added can differ), and the loss and heads' outputs are identical.
//! - AC-2 (one pass): a `TrainPass` is consumed by `backward`, which must follow the backward
//!   of every loss built on its hidden states (it backpropagates through the layers once).

use tch::{Kind, Tensor};

use super::error::HfError;
use super::model::{causal_attention, HfModel};

/// Hidden states of a training forward and what its backward needs.
pub struct TrainPass {
    /// Final hidden states `[B, T, H]`: feed them to [`HfModel::logits`] / [`HfModel::values`].
    pub hidden: Tensor,
    recompute: Option<Recompute>,
}

/// What checkpointing saved: the tokens, each layer's input and the leaf the top starts from.
struct Recompute {
    tokens: Tensor,
    inputs: Vec<Tensor>,
    top: Tensor,
    cos: Tensor,
    sin: Tensor,
}

impl HfModel {
    /// The forward pass of a training step on unpadded (or right-padded) `tokens` `[B, T]`;
    /// `checkpoint` recomputes layer activations in the backward pass (module doc).
    pub fn train_pass(&self, tokens: &Tensor, checkpoint: bool) -> Result<TrainPass, HfError> {
        if !checkpoint {
            // LO-5: LoRA dropout applies in this forward only.
            self.set_training(true);
            let hidden = self.hidden(tokens);
            self.set_training(false);
            return Ok(TrainPass {
                hidden: hidden?,
                recompute: None,
            });
        }
        if self.lora().is_some_and(|l| l.dropout > 0.0) {
            return Err(super::lora::bad_key(
                "model.lora.dropout",
                "must be 0 with learner.activation_checkpointing = true (recomputed layers would draw other dropout masks)",
            ));
        }
        let (cos, sin) = self.causal_rope(tokens)?;
        let tokens = tokens.f_to_device(self.device())?;
        let mut inputs = Vec::with_capacity(self.layers.len());
        let last = tch::no_grad(|| -> Result<Tensor, HfError> {
            let mut x = self.embed(&tokens)?;
            for l in 0..self.layers.len() {
                let y = self.layer(l, &x, &cos, &sin, &mut causal_attention)?;
                inputs.push(x);
                x = y;
            }
            Ok(x)
        })?;
        let top = last.f_detach()?.f_requires_grad_(true)?;
        Ok(TrainPass {
            hidden: self.final_norm(&top)?,
            recompute: Some(Recompute {
                tokens,
                inputs,
                top,
                cos,
                sin,
            }),
        })
    }
}

impl TrainPass {
    /// Backpropagates `loss` (a scalar built on `self.hidden`) into `model`'s parameters
    /// (AC-1, AC-2).
    pub fn backward(self, loss: &Tensor, model: &HfModel) -> Result<(), HfError> {
        loss.f_backward()?;
        let Some(r) = self.recompute else {
            return Ok(());
        };
        let mut grad = r.top.grad();
        if !grad.defined() {
            return Ok(());
        }
        for (l, input) in r.inputs.iter().enumerate().rev() {
            let x = input.f_detach()?.f_requires_grad_(true)?;
            let y = model.layer(l, &x, &r.cos, &r.sin, &mut causal_attention)?;
            pull(&y, &grad)?;
            grad = x.grad();
        }
        pull(&model.embed(&r.tokens)?, &grad)
    }
}

/// Backpropagates the gradient `grad` arriving at `y` into `y`'s graph.
fn pull(y: &Tensor, grad: &Tensor) -> Result<(), HfError> {
    Ok(y.f_mul(grad)?.f_sum(Kind::Float)?.f_backward()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_models::tiny;

    /// Every parameter gradient of `model` after `loss_of(pass)` and its backward.
    fn grads(model: &HfModel, tokens: &Tensor, checkpoint: bool) -> (f64, Vec<(String, Tensor)>) {
        for (_, p) in model.named_parameters() {
            let mut g = p.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
        let pass = model.train_pass(tokens, checkpoint).expect("pass");
        let logits = model.logits(&pass.hidden).expect("logits");
        let values = model.values(&pass.hidden).expect("values").expect("head");
        let lp = crate::token_logprobs(&logits, tokens);
        let loss = lp.mean(Kind::Float) + values.square().mean(Kind::Float);
        let v = loss.double_value(&[]);
        pass.backward(&loss, model).expect("backward");
        let out = model
            .named_parameters()
            .into_iter()
            .map(|(n, p)| (n, p.grad().copy()))
            .collect();
        (v, out)
    }

    #[test]
    fn ac1_checkpointed_gradients_equal_the_plain_ones() {
        tch::set_num_threads(1);
        let model = tiny(12, true, 4);
        // A non-zero value head, so the values carry gradient into the trunk.
        tch::no_grad(|| {
            for (n, p) in model.named_parameters() {
                if n == "score.weight" {
                    let _ = p.shallow_clone().fill_(0.05);
                }
            }
        });
        let tokens = Tensor::from_slice(&[1i64, 4, 5, 6, 7, 3, 2, 1, 9, 9, 8, 2]).view([2, 6]);
        let (plain_loss, plain) = grads(&model, &tokens, false);
        let (ckpt_loss, ckpt) = grads(&model, &tokens, true);
        assert_eq!(plain_loss, ckpt_loss, "the forward is the same arithmetic");
        for ((n, a), (_, b)) in plain.iter().zip(&ckpt) {
            assert!(a.defined() && b.defined(), "{n} got no gradient");
            let scale = a.abs().max().double_value(&[]).max(1e-12);
            let diff = (a - b).abs().max().double_value(&[]);
            assert!(diff <= 1e-5 * scale, "{n}: {diff} vs {scale}");
        }
    }
}
