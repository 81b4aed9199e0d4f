//! The policy: a small GPT-style decoder-only transformer with an optional scalar value head.
//!
//! Layout: token + learned position embeddings → `n_layer` pre-LayerNorm blocks (causal
//! multi-head self-attention, then a 4× MLP with exact GELU, each added to the residual stream)
//! → final LayerNorm → untied LM head (no bias); the value head is a `d_model → 1` linear layer
//! on the same final hidden state.
//!
//! Invariants:
//! - MD-1 (init): weights ~ N(0, 0.02); the residual output projections (`attn.proj.weight`,
//!   `mlp.proj.weight`) ~ N(0, 0.02/√(2·n_layer)); biases 0; LayerNorm weight 1, bias 0. Values
//!   come from a ChaCha8 stream seeded with `seed`, drawn on the CPU in creation order, so the
//!   same config and seed give bit-identical weights on every device.
//! - MD-2 (causality): `logits[b, t]` and `values[b, t]` depend only on `tokens[b, ..=t]`, so
//!   right padding never changes the outputs at real positions.
//! - MD-3 (alignment): `logits[b, t]` is the distribution of `tokens[b, t+1]`; `values[b, t]` is
//!   the value of the prefix `tokens[b, ..=t]`. Shifting to "per predicted token" is done by
//!   `logprobs` and by the learner, never here.
//! - MD-4 (names): variable names are the VarStore paths (`tok_emb.weight`,
//!   `blocks.0.attn.qkv.weight`, …); `to_safetensors` writes every variable under its name as
//!   F32 and `load_safetensors` accepts exactly that set (TI-2).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tch::{nn, Device, Kind, Tensor};

use crate::error::LearnerError;
use crate::tensor_io;

/// Shape of the policy network.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ModelConfig {
    /// Number of token ids (ids are `0..vocab_size`).
    pub vocab_size: usize,
    /// Maximum sequence length (number of learned positions).
    pub context_len: usize,
    /// Number of transformer blocks.
    pub n_layer: usize,
    /// Width of the residual stream.
    pub d_model: usize,
    /// Number of attention heads; must divide `d_model`.
    pub n_head: usize,
    /// Whether the model carries a scalar value head (required by PPO).
    pub value_head: bool,
}

impl ModelConfig {
    /// Checks that every size is positive and that `n_head` divides `d_model`.
    pub fn validate(&self) -> Result<(), LearnerError> {
        let sizes = [
            ("model.vocab_size", self.vocab_size),
            ("model.context_len", self.context_len),
            ("model.n_layer", self.n_layer),
            ("model.d_model", self.d_model),
            ("model.n_head", self.n_head),
        ];
        for (key, v) in sizes {
            if v == 0 {
                return Err(LearnerError::config(key, "must be > 0, got 0"));
            }
        }
        if self.d_model % self.n_head != 0 {
            return Err(LearnerError::config(
                "model.n_head",
                format!(
                    "must divide model.d_model ({}), got {}",
                    self.d_model, self.n_head
                ),
            ));
        }
        Ok(())
    }

    /// Number of scalar parameters, value head included when enabled.
    pub fn n_params(&self) -> usize {
        let (v, c, d) = (self.vocab_size, self.context_len, self.d_model);
        // ln1 2d, qkv 3d²+3d, attn proj d²+d, ln2 2d, mlp fc 4d²+4d, mlp proj 4d²+d.
        let block = 12 * d * d + 13 * d;
        let value = if self.value_head { d + 1 } else { 0 };
        v * d + c * d + self.n_layer * block + 2 * d + v * d + value
    }
}

/// One pre-LayerNorm transformer block's parameters (shallow clones of VarStore variables).
struct Block {
    ln1_w: Tensor,
    ln1_b: Tensor,
    qkv_w: Tensor,
    qkv_b: Tensor,
    attn_proj_w: Tensor,
    attn_proj_b: Tensor,
    ln2_w: Tensor,
    ln2_b: Tensor,
    fc_w: Tensor,
    fc_b: Tensor,
    mlp_proj_w: Tensor,
    mlp_proj_b: Tensor,
}

/// The policy network; owns its `VarStore`.
pub struct PolicyModel {
    cfg: ModelConfig,
    vs: nn::VarStore,
    tok_emb: Tensor,
    pos_emb: Tensor,
    blocks: Vec<Block>,
    lnf_w: Tensor,
    lnf_b: Tensor,
    lm_head: Tensor,
    value: Option<(Tensor, Tensor)>,
}

/// Creates variables in a fixed order from one seeded stream (MD-1).
struct Initialiser {
    rng: ChaCha8Rng,
}

impl Initialiser {
    fn normal(
        &mut self,
        p: &nn::Path,
        name: &str,
        shape: &[i64],
        std: f64,
    ) -> Result<Tensor, LearnerError> {
        let n: i64 = shape.iter().product();
        let mut values = Vec::with_capacity(n as usize);
        while values.len() < n as usize {
            // Box–Muller: u1 in (0, 1], u2 in [0, 1).
            let u1: f64 = 1.0 - self.rng.gen::<f64>();
            let u2: f64 = self.rng.gen::<f64>();
            let r = (-2.0 * u1.ln()).sqrt() * std;
            let theta = 2.0 * std::f64::consts::PI * u2;
            values.push((r * theta.cos()) as f32);
            values.push((r * theta.sin()) as f32);
        }
        values.truncate(n as usize);
        let t = Tensor::f_from_slice(&values)?.f_reshape(shape)?;
        Ok(p.f_var_copy(name, &t)?)
    }

    fn constant(
        p: &nn::Path,
        name: &str,
        shape: &[i64],
        value: f64,
    ) -> Result<Tensor, LearnerError> {
        let t = Tensor::f_full(shape, value, (Kind::Float, Device::Cpu))?;
        Ok(p.f_var_copy(name, &t)?)
    }
}

impl PolicyModel {
    /// Builds a model with deterministic explicit initialisation (MD-1).
    pub fn new(cfg: &ModelConfig, device: Device, seed: u64) -> Result<Self, LearnerError> {
        cfg.validate()?;
        let vs = nn::VarStore::new(device);
        let root = vs.root();
        let mut init = Initialiser {
            rng: ChaCha8Rng::seed_from_u64(seed),
        };
        let (v, c, d) = (
            cfg.vocab_size as i64,
            cfg.context_len as i64,
            cfg.d_model as i64,
        );
        let std = 0.02;
        let resid_std = 0.02 / (2.0 * cfg.n_layer as f64).sqrt();
        let tok_emb = init.normal(&root.sub("tok_emb"), "weight", &[v, d], std)?;
        let pos_emb = init.normal(&root.sub("pos_emb"), "weight", &[c, d], std)?;
        let mut blocks = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            let b = root.sub("blocks").sub(i);
            let (ln1, attn, ln2, mlp) = (b.sub("ln1"), b.sub("attn"), b.sub("ln2"), b.sub("mlp"));
            let (qkv, attn_proj) = (attn.sub("qkv"), attn.sub("proj"));
            let (fc, mlp_proj) = (mlp.sub("fc"), mlp.sub("proj"));
            blocks.push(Block {
                ln1_w: Initialiser::constant(&ln1, "weight", &[d], 1.0)?,
                ln1_b: Initialiser::constant(&ln1, "bias", &[d], 0.0)?,
                qkv_w: init.normal(&qkv, "weight", &[3 * d, d], std)?,
                qkv_b: Initialiser::constant(&qkv, "bias", &[3 * d], 0.0)?,
                attn_proj_w: init.normal(&attn_proj, "weight", &[d, d], resid_std)?,
                attn_proj_b: Initialiser::constant(&attn_proj, "bias", &[d], 0.0)?,
                ln2_w: Initialiser::constant(&ln2, "weight", &[d], 1.0)?,
                ln2_b: Initialiser::constant(&ln2, "bias", &[d], 0.0)?,
                fc_w: init.normal(&fc, "weight", &[4 * d, d], std)?,
                fc_b: Initialiser::constant(&fc, "bias", &[4 * d], 0.0)?,
                mlp_proj_w: init.normal(&mlp_proj, "weight", &[d, 4 * d], resid_std)?,
                mlp_proj_b: Initialiser::constant(&mlp_proj, "bias", &[d], 0.0)?,
            });
        }
        let lnf = root.sub("ln_f");
        let lnf_w = Initialiser::constant(&lnf, "weight", &[d], 1.0)?;
        let lnf_b = Initialiser::constant(&lnf, "bias", &[d], 0.0)?;
        let lm_head = init.normal(&root.sub("lm_head"), "weight", &[v, d], std)?;
        let value = if cfg.value_head {
            let p = root.sub("value_head");
            Some((
                init.normal(&p, "weight", &[1, d], std)?,
                Initialiser::constant(&p, "bias", &[1], 0.0)?,
            ))
        } else {
            None
        };
        Ok(PolicyModel {
            cfg: cfg.clone(),
            vs,
            tok_emb,
            pos_emb,
            blocks,
            lnf_w,
            lnf_b,
            lm_head,
            value,
        })
    }

    /// The model's shape.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The device holding the weights.
    pub fn device(&self) -> Device {
        self.vs.device()
    }

    /// The variables (for optimizers and inspection).
    pub fn var_store(&self) -> &nn::VarStore {
        &self.vs
    }

    /// Runs the network: `tokens` `[B, T]` i64 → (logits `[B, T, V]`, values `[B, T]` when the
    /// model has a value head). See MD-2 and MD-3 for what each position means.
    ///
    /// # Panics
    /// When [`PolicyModel::try_forward`] fails (bad shape, dtype or token id, or a libtorch
    /// error); use that method for input you did not validate yourself.
    pub fn forward(&self, tokens: &Tensor) -> (Tensor, Option<Tensor>) {
        match self.try_forward(tokens) {
            Ok(out) => out,
            Err(e) => panic!("PolicyModel::forward: {e}"),
        }
    }

    /// Like [`PolicyModel::forward`], but checks `tokens` (2-D, i64, `1 ≤ T ≤ context_len`,
    /// ids in `0..vocab_size`) and returns errors instead of panicking.
    pub fn try_forward(&self, tokens: &Tensor) -> Result<(Tensor, Option<Tensor>), LearnerError> {
        let size = tokens.size();
        if size.len() != 2 || size[0] == 0 || size[1] == 0 {
            return Err(LearnerError::input(format!(
                "tokens must be a non-empty [B, T] tensor, got shape {size:?}"
            )));
        }
        if tokens.kind() != Kind::Int64 {
            return Err(LearnerError::input(format!(
                "tokens must be Int64, got {:?}",
                tokens.kind()
            )));
        }
        if size[1] as usize > self.cfg.context_len {
            return Err(LearnerError::input(format!(
                "sequence length {} exceeds model.context_len {}",
                size[1], self.cfg.context_len
            )));
        }
        let lo = i64::try_from(tokens.f_min()?)?;
        let hi = i64::try_from(tokens.f_max()?)?;
        if lo < 0 || hi >= self.cfg.vocab_size as i64 {
            return Err(LearnerError::input(format!(
                "token ids must be in 0..{} (model.vocab_size), got range {lo}..={hi}",
                self.cfg.vocab_size
            )));
        }
        self.forward_checked(tokens.f_to_device(self.device())?, size[0], size[1])
    }

    fn forward_checked(
        &self,
        tokens: Tensor,
        b: i64,
        t: i64,
    ) -> Result<(Tensor, Option<Tensor>), LearnerError> {
        let d = self.cfg.d_model as i64;
        let nh = self.cfg.n_head as i64;
        let eps = 1e-5;
        let pos = Tensor::f_arange(t, (Kind::Int64, self.device()))?;
        let mut x = Tensor::f_embedding(&self.tok_emb, &tokens, -1, false, false)?
            .f_add(&Tensor::f_embedding(&self.pos_emb, &pos, -1, false, false)?)?;
        for blk in &self.blocks {
            let h = x.f_layer_norm([d], Some(&blk.ln1_w), Some(&blk.ln1_b), eps, true)?;
            let qkv = h.f_linear(&blk.qkv_w, Some(&blk.qkv_b))?.f_split(d, -1)?;
            let heads = |x: &Tensor| -> Result<Tensor, LearnerError> {
                Ok(x.f_reshape([b, t, nh, d / nh])?.f_transpose(1, 2)?)
            };
            let (q, k, v) = (heads(&qkv[0])?, heads(&qkv[1])?, heads(&qkv[2])?);
            let y = Tensor::f_scaled_dot_product_attention(
                &q,
                &k,
                &v,
                None::<Tensor>,
                0.0,
                true,
                None,
                false,
            )?
            .f_transpose(1, 2)?
            .f_contiguous()?
            .f_reshape([b, t, d])?;
            x = x.f_add(&y.f_linear(&blk.attn_proj_w, Some(&blk.attn_proj_b))?)?;
            let h = x.f_layer_norm([d], Some(&blk.ln2_w), Some(&blk.ln2_b), eps, true)?;
            let m = h
                .f_linear(&blk.fc_w, Some(&blk.fc_b))?
                .f_gelu("none")?
                .f_linear(&blk.mlp_proj_w, Some(&blk.mlp_proj_b))?;
            x = x.f_add(&m)?;
        }
        let x = x.f_layer_norm([d], Some(&self.lnf_w), Some(&self.lnf_b), eps, true)?;
        let logits = x.f_linear(&self.lm_head, None::<Tensor>)?;
        let values = match &self.value {
            Some((w, bias)) => Some(x.f_linear(w, Some(bias))?.f_squeeze_dim(-1)?),
            None => None,
        };
        Ok((logits, values))
    }

    /// Variables sorted by name (the order used for files and the optimizer).
    pub(crate) fn named_variables(&self) -> Vec<(String, Tensor)> {
        let mut vars: Vec<(String, Tensor)> = self.vs.variables().into_iter().collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        vars
    }

    /// All variables as an in-memory safetensors buffer, F32, under their VarStore names (MD-4).
    pub fn to_safetensors(&self) -> Result<Vec<u8>, LearnerError> {
        tensor_io::encode(&self.named_variables(), None)
    }

    /// Checks a buffer against this model's variables without changing anything.
    pub(crate) fn decode_weights(&self, bytes: &[u8]) -> Result<Vec<Tensor>, LearnerError> {
        let expected: Vec<(String, Vec<i64>)> = self
            .named_variables()
            .into_iter()
            .map(|(n, t)| (n, t.size()))
            .collect();
        Ok(tensor_io::decode_checked(bytes, &expected, "model")?.tensors)
    }

    /// Copies already-checked values (from `decode_weights`) into the variables.
    pub(crate) fn commit_weights(&mut self, values: &[Tensor]) -> Result<(), LearnerError> {
        let targets: Vec<Tensor> = self.named_variables().into_iter().map(|(_, t)| t).collect();
        tensor_io::commit(&targets, values)
    }

    /// Replaces every variable with the buffer's values. The buffer must hold exactly this
    /// model's names with matching shapes, as F32; otherwise nothing is changed and the error
    /// names the first offending tensor.
    pub fn load_safetensors(&mut self, bytes: &[u8]) -> Result<(), LearnerError> {
        let values = self.decode_weights(bytes)?;
        self.commit_weights(&values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny(value_head: bool) -> ModelConfig {
        ModelConfig {
            vocab_size: 11,
            context_len: 16,
            n_layer: 2,
            d_model: 16,
            n_head: 4,
            value_head,
        }
    }

    fn weights(m: &PolicyModel) -> Vec<(String, Vec<f32>)> {
        m.named_variables()
            .into_iter()
            .map(|(n, t)| {
                (
                    n,
                    Vec::<f32>::try_from(&t.flatten(0, -1)).expect("f32 weights"),
                )
            })
            .collect()
    }

    #[test]
    fn config_validation_names_the_key() {
        let mut c = tiny(false);
        c.n_head = 3;
        let e = c.validate().expect_err("3 does not divide 16").to_string();
        assert_eq!(e, "model.n_head must divide model.d_model (16), got 3");
        c.n_head = 4;
        c.vocab_size = 0;
        assert_eq!(
            c.validate().expect_err("zero vocab").to_string(),
            "model.vocab_size must be > 0, got 0"
        );
    }

    #[test]
    fn n_params_counts_every_variable() {
        tch::set_num_threads(1);
        for vh in [false, true] {
            let m = PolicyModel::new(&tiny(vh), Device::Cpu, 0).expect("model");
            let n: usize = m.named_variables().iter().map(|(_, t)| t.numel()).sum();
            assert_eq!(n, m.config().n_params());
        }
    }

    #[test]
    fn md1_init_is_deterministic_per_seed() {
        tch::set_num_threads(1);
        let a = weights(&PolicyModel::new(&tiny(true), Device::Cpu, 7).expect("a"));
        let b = weights(&PolicyModel::new(&tiny(true), Device::Cpu, 7).expect("b"));
        let c = weights(&PolicyModel::new(&tiny(true), Device::Cpu, 8).expect("c"));
        assert_eq!(a, b);
        assert_ne!(a, c);
        let get = |name: &str| {
            a.iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
                .expect(name)
        };
        assert!(get("blocks.0.ln1.weight").iter().all(|&x| x == 1.0));
        assert!(get("blocks.1.mlp.fc.bias").iter().all(|&x| x == 0.0));
        let std = |v: &[f32]| {
            let m = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
            (v.iter().map(|&x| (x as f64 - m).powi(2)).sum::<f64>() / v.len() as f64).sqrt()
        };
        let s = std(&get("blocks.0.mlp.fc.weight"));
        assert!((s - 0.02).abs() < 0.002, "fc std {s}");
        let s = std(&get("blocks.0.mlp.proj.weight"));
        assert!((s - 0.01).abs() < 0.001, "residual proj std {s}");
    }

    #[test]
    fn md2_forward_shapes_and_causality() {
        tch::set_num_threads(1);
        let m = PolicyModel::new(&tiny(true), Device::Cpu, 1).expect("model");
        let toks = Tensor::from_slice(&[1i64, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2]).view([2, 6]);
        let (logits, values) = m.forward(&toks);
        assert_eq!(logits.size(), vec![2, 6, 11]);
        assert_eq!(values.expect("value head").size(), vec![2, 6]);
        let changed = toks.copy();
        let _ = changed.get(0).get(4).fill_(3);
        let (logits2, _) = m.forward(&changed);
        let before = logits.narrow(1, 0, 4);
        let before2 = logits2.narrow(1, 0, 4);
        let diff = f64::try_from((before - before2).abs().max()).expect("scalar");
        assert!(diff < 1e-6, "earlier logits changed by {diff}");
        let later = f64::try_from((logits.get(0).get(4) - logits2.get(0).get(4)).abs().max())
            .expect("scalar");
        assert!(later > 0.0, "the changed position must see its own token");
    }

    #[test]
    fn forward_rejects_bad_tokens() {
        tch::set_num_threads(1);
        let m = PolicyModel::new(&tiny(false), Device::Cpu, 1).expect("model");
        let e = m
            .try_forward(&Tensor::from_slice(&[1i64, 11]).view([1, 2]))
            .expect_err("id 11");
        assert!(e.to_string().contains("0..11"), "{e}");
        let long = Tensor::zeros([1, 17], (Kind::Int64, Device::Cpu));
        assert!(m.try_forward(&long).is_err());
    }

    #[test]
    fn md4_safetensors_round_trip_and_mismatch() {
        tch::set_num_threads(1);
        let a = PolicyModel::new(&tiny(true), Device::Cpu, 3).expect("a");
        let mut b = PolicyModel::new(&tiny(true), Device::Cpu, 4).expect("b");
        let bytes = a.to_safetensors().expect("save");
        b.load_safetensors(&bytes).expect("load");
        assert_eq!(weights(&a), weights(&b));
        assert_eq!(b.to_safetensors().expect("save b"), bytes);
        // A model without the value head lacks two tensors.
        let mut c = PolicyModel::new(&tiny(false), Device::Cpu, 4).expect("c");
        let before = weights(&c);
        let e = c
            .load_safetensors(&bytes)
            .expect_err("extra tensors")
            .to_string();
        assert!(e.contains("value_head"), "{e}");
        assert_eq!(before, weights(&c), "a failed load changes nothing");
        let e = b
            .load_safetensors(&c.to_safetensors().expect("save c"))
            .expect_err("missing");
        assert!(e.to_string().contains("missing"), "{e}");
        let mut wide = tiny(true);
        wide.vocab_size = 12;
        let e = PolicyModel::new(&wide, Device::Cpu, 0)
            .expect("wide")
            .load_safetensors(&bytes)
            .expect_err("shape");
        assert!(e.to_string().contains("shape"), "{e}");
    }
}
