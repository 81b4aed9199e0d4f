//! The Llama / Qwen2 / Qwen3 decoder in tch, loaded from and saved to a Hugging Face folder,
//! with an LM head (policy) and/or a scalar value head (critic).
//!
//! Layout (as transformers): `embed_tokens` → per layer `x += o_proj(attn(rope(q), rope(k), v))`
//! on `input_layernorm(x)`, then `x += down(silu(gate(h)) · up(h))` on
//! `post_attention_layernorm(x)` → `norm` → `lm_head` (or the embedding when tied) and/or
//! `score` (value head, `[1, hidden]` + bias, as `*ForTokenClassification` with one label).
//!
//! Invariants:
//! - HM-1 (names): VarStore paths are the HF tensor names (`model.layers.0.self_attn.q_proj.weight`,
//!   `lm_head.weight`, `score.weight`); a tied LM head is the embedding and is not a variable.
//! - HM-2 (strict load): every tensor the architecture needs must be present with its exact
//!   shape; a tensor the model does not use is an error, except `lm_head.weight` of a model
//!   loaded without its LM head (critic from policy) or when tied, and `score.*` of a model
//!   loaded without a value head.
//! - HM-3 (init): a value head absent from the folder starts at zero (weight and bias), so a
//!   critic initialised from a policy predicts 0 everywhere; [`HfModel::random`] draws
//!   linear and embedding weights ~ N(0, initializer_range) from a ChaCha8 stream seeded with
//!   `seed` (norms 1, biases 0), independent of tch's global generator.
//! - HM-4 (alignment): `logits[b, t]` predicts `tokens[b, t+1]`
//!   and depends only on the prefix; with an attention mask, padded keys are never attended.
//! - HM-5 (precision): parameters live in `LoadOptions::kind` (f32 or bf16) on
//!   `LoadOptions::device`; attention runs through `scaled_dot_product_attention` with native
//!   GQA; logits keep the parameter kind (log-softmax is taken in f32 by `logprobs`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tch::{nn, Device, Kind, Tensor};

use super::config::HfConfig;
use super::error::HfError;
use super::layers::{apply_rope, attention, rms_norm, Linear, RopeTable};
use super::lora::{Adapter, LoraState};

/// Where the parameters live and which heads to build.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    /// CPU or CUDA device.
    pub device: Device,
    /// Parameter kind: `Kind::Float` or `Kind::BFloat16` (`Kind::Half` also works).
    pub kind: Kind,
    /// Build the LM head (a policy).
    pub lm_head: bool,
    /// Build the scalar value head (a critic, or a policy with a shared value head).
    pub value_head: bool,
}

/// The name configs and Hugging Face folders give `kind` (`float32`, `bfloat16`, `float16`):
/// the inverse of [`LoadOptions::placement`]'s dtype names. Models hold no other kinds.
pub fn dtype_name(kind: Kind) -> &'static str {
    match kind {
        Kind::BFloat16 => "bfloat16",
        Kind::Half => "float16",
        _ => "float32",
    }
}
impl LoadOptions {
    /// A policy (LM head only) on `device` in `kind`.
    pub fn policy(device: Device, kind: Kind) -> Self {
        LoadOptions {
            device,
            kind,
            lm_head: true,
            value_head: false,
        }
    }
    /// A critic (value head only) on `device` in `kind`.
    pub fn critic(device: Device, kind: Kind) -> Self {
        LoadOptions {
            device,
            kind,
            lm_head: false,
            value_head: true,
        }
    }

    /// Device and kind from config strings: `cpu`, `cuda` or `cuda:N`; `float32` / `f32` or
    /// `bfloat16` / `bf16`. `cuda` must be available (binaries need the no-as-needed link of
    /// libtorch_cuda, see build/torch_link.rs users).
    pub fn placement(device: &str, dtype: &str) -> Result<(Device, Kind), HfError> {
        let dev = match device {
            "cpu" => Device::Cpu,
            d if d == "cuda" || d.starts_with("cuda:") => {
                let i = d
                    .strip_prefix("cuda:")
                    .map_or(Ok(0), str::parse::<usize>)
                    .map_err(|e| {
                        HfError::input(format!("device `{d}`: {e} (use cpu, cuda or cuda:N)"))
                    })?;
                if i >= tch::Cuda::device_count() as usize {
                    return Err(HfError::input(format!(
                        "device `{d}`: no such CUDA device on this machine"
                    )));
                }
                Device::Cuda(i)
            }
            d => {
                return Err(HfError::input(format!(
                    "device `{d}`: use cpu, cuda or cuda:N"
                )))
            }
        };
        let kind = match dtype {
            "float32" | "f32" => Kind::Float,
            "bfloat16" | "bf16" => Kind::BFloat16,
            t => {
                return Err(HfError::input(format!(
                    "dtype `{t}`: use float32 or bfloat16"
                )))
            }
        };
        Ok((dev, kind))
    }
}

pub(crate) struct Layer {
    pub(crate) in_norm: Tensor,
    pub(crate) q: Linear,
    pub(crate) k: Linear,
    pub(crate) v: Linear,
    pub(crate) o: Linear,
    pub(crate) q_norm: Option<Tensor>,
    pub(crate) k_norm: Option<Tensor>,
    pub(crate) post_norm: Tensor,
    pub(crate) gate: Linear,
    pub(crate) up: Linear,
    pub(crate) down: Linear,
}

/// A Hugging Face causal LM (and/or value model); owns its `VarStore`.
pub struct HfModel {
    pub(crate) cfg: HfConfig,
    pub(crate) opts: LoadOptions,
    vs: nn::VarStore,
    pub(crate) embed: Tensor,
    pub(crate) layers: Vec<Layer>,
    pub(crate) norm: Tensor,
    lm_head: Option<Tensor>,
    value: Option<Linear>,
    source_dir: Option<PathBuf>,
    /// LoRA adapters' settings, when the linear layers carry adapters (`hf::lora`).
    pub(crate) lora: Option<LoraState>,
    /// The seed of [`HfModel::random`] for a freshly initialised model (its weights' origin).
    init_seed: Option<u64>,
}

/// How a parameter is initialised when it is not read from a file.
#[derive(Clone, Copy, PartialEq)]
enum Init {
    Normal,
    Ones,
    Zeros,
}

/// Supplies each parameter by name, shape and default init.
type Source<'a> = dyn FnMut(&str, &[i64], Init) -> Result<Tensor, HfError> + 'a;

/// Creates each parameter as a variable, given its name, shape and default init.
type Param<'a> = dyn FnMut(&str, &[i64], Init) -> Result<Tensor, HfError> + 'a;

/// Causal self-attention without padding: the attention of [`HfModel::hidden`].
pub(crate) fn causal_attention(
    _layer: usize,
    q: Tensor,
    k: Tensor,
    v: Tensor,
) -> Result<Tensor, HfError> {
    attention(&q, &k, &v, None, true)
}

/// A linear layer's weight (and bias) named `{name}.weight` / `{name}.bias`.
fn linear(
    param: &mut Param<'_>,
    name: &str,
    out: i64,
    inp: i64,
    bias: bool,
) -> Result<Linear, HfError> {
    let w = param(&format!("{name}.weight"), &[out, inp], Init::Normal)?;
    let b = if bias {
        Some(param(&format!("{name}.bias"), &[out], Init::Zeros)?)
    } else {
        None
    };
    Ok(Linear::plain(w, b))
}

/// Decoder layer `l` of `cfg`, its parameters from `param` (HF names).
fn build_layer(cfg: &HfConfig, l: usize, param: &mut Param<'_>) -> Result<Layer, HfError> {
    let (h, i) = (cfg.hidden_size as i64, cfg.intermediate_size as i64);
    let d = cfg.head_dim as i64;
    let (q_out, kv_out) = (
        cfg.num_attention_heads as i64 * d,
        cfg.num_key_value_heads as i64 * d,
    );
    let p = format!("model.layers.{l}");
    let q = linear(
        param,
        &format!("{p}.self_attn.q_proj"),
        q_out,
        h,
        cfg.qkv_bias,
    )?;
    let k = linear(
        param,
        &format!("{p}.self_attn.k_proj"),
        kv_out,
        h,
        cfg.qkv_bias,
    )?;
    let vv = linear(
        param,
        &format!("{p}.self_attn.v_proj"),
        kv_out,
        h,
        cfg.qkv_bias,
    )?;
    let o = linear(
        param,
        &format!("{p}.self_attn.o_proj"),
        h,
        q_out,
        cfg.o_bias,
    )?;
    let gate = linear(param, &format!("{p}.mlp.gate_proj"), i, h, cfg.mlp_bias)?;
    let up = linear(param, &format!("{p}.mlp.up_proj"), i, h, cfg.mlp_bias)?;
    let down = linear(param, &format!("{p}.mlp.down_proj"), h, i, cfg.mlp_bias)?;
    let (q_norm, k_norm) = if cfg.qk_norm {
        (
            Some(param(
                &format!("{p}.self_attn.q_norm.weight"),
                &[d],
                Init::Ones,
            )?),
            Some(param(
                &format!("{p}.self_attn.k_norm.weight"),
                &[d],
                Init::Ones,
            )?),
        )
    } else {
        (None, None)
    };
    let in_norm = param(&format!("{p}.input_layernorm.weight"), &[h], Init::Ones)?;
    let post_norm = param(
        &format!("{p}.post_attention_layernorm.weight"),
        &[h],
        Init::Ones,
    )?;
    Ok(Layer {
        in_norm,
        q,
        k,
        v: vv,
        o,
        q_norm,
        k_norm,
        post_norm,
        gate,
        up,
        down,
    })
}

/// Adds `t` under the dotted HF `name` (HM-1); `trainable` sets `requires_grad`, otherwise the
/// tensor's flag is left as it is (a shared base stays frozen).
fn add_var(vs: &nn::VarStore, name: &str, t: Tensor, trainable: bool) -> Tensor {
    let mut parts = name.split('.');
    let mut path = vs.root();
    let mut last = parts.next().unwrap_or(name);
    for next in parts {
        path = path.sub(last);
        last = next;
    }
    path.add(last, t, trainable)
}

/// A folder's tensors left after the model took its parameters must be ones it may ignore:
/// a tied or unused `lm_head`, or a `score` head a policy does not build (HM-2).
fn no_leftovers<'a>(
    names: impl Iterator<Item = &'a String>,
    cfg: &HfConfig,
    opts: LoadOptions,
) -> Result<(), HfError> {
    let ignorable = |n: &str| {
        (n == "lm_head.weight" && (!opts.lm_head || cfg.tie_word_embeddings))
            || (n.starts_with("score.") && !opts.value_head)
    };
    let mut extra: Vec<&String> = names.filter(|n| !ignorable(n)).collect();
    extra.sort();
    match extra.first() {
        Some(name) => Err(HfError::weights(
            name,
            "present in the folder but not a parameter of this architecture",
        )),
        None => Ok(()),
    }
}

impl HfModel {
    fn build(cfg: HfConfig, opts: LoadOptions, src: &mut Source<'_>) -> Result<Self, HfError> {
        Self::build_with(cfg, opts, src, true)
    }

    /// [`HfModel::build`]; `trainable = false` adds every parameter without touching its
    /// `requires_grad` (views on shared tensors).
    fn build_with(
        cfg: HfConfig,
        opts: LoadOptions,
        src: &mut Source<'_>,
        trainable: bool,
    ) -> Result<Self, HfError> {
        if !opts.lm_head && !opts.value_head {
            return Err(HfError::input(
                "a model needs an LM head, a value head or both",
            ));
        }
        let vs = nn::VarStore::new(opts.device);
        let mut param = |name: &str, shape: &[i64], init: Init| -> Result<Tensor, HfError> {
            let t = src(name, shape, init)?
                .f_to_device(opts.device)?
                .f_to_kind(opts.kind)?;
            Ok(add_var(&vs, name, t, trainable))
        };
        let (h, v) = (cfg.hidden_size as i64, cfg.vocab_size as i64);
        let layers = (0..cfg.num_hidden_layers)
            .map(|l| build_layer(&cfg, l, &mut param))
            .collect::<Result<Vec<_>, _>>()?;
        let embed = param("model.embed_tokens.weight", &[v, h], Init::Normal)?;
        let norm = param("model.norm.weight", &[h], Init::Ones)?;
        let lm_head = match (opts.lm_head, cfg.tie_word_embeddings) {
            (false, _) => None,
            (true, true) => Some(embed.shallow_clone()),
            (true, false) => Some(param("lm_head.weight", &[v, h], Init::Normal)?),
        };
        let value = if opts.value_head {
            Some(Linear::plain(
                param("score.weight", &[1, h], Init::Zeros)?,
                Some(param("score.bias", &[1], Init::Zeros)?),
            ))
        } else {
            None
        };
        Ok(HfModel {
            cfg,
            opts,
            vs,
            embed,
            layers,
            norm,
            lm_head,
            value,
            source_dir: None,
            lora: None,
            init_seed: None,
        })
    }

    /// Loads `dir` (config.json + safetensors) with the heads and placement of `opts` (HM-2).
    pub fn load(dir: &Path, opts: LoadOptions) -> Result<Self, HfError> {
        let cfg = HfConfig::load(dir)?;
        let mut tensors: HashMap<String, Tensor> = super::weights::read_folder(dir)?;
        let mut src = |name: &str, shape: &[i64], _init: Init| -> Result<Tensor, HfError> {
            match tensors.remove(name) {
                Some(t) if t.size() == shape => Ok(t),
                Some(t) => Err(HfError::weights(
                    name,
                    format!("shape {:?} in the folder, expected {shape:?}", t.size()),
                )),
                // HM-3: a critic built from a policy folder starts its value head at zero.
                None if name.starts_with("score.") => {
                    Ok(Tensor::f_zeros(shape, (Kind::Float, Device::Cpu))?)
                }
                None => Err(HfError::weights(
                    name,
                    format!("missing from {}", dir.display()),
                )),
            }
        };
        let mut model = Self::build(cfg, opts, &mut src)?;
        no_leftovers(tensors.keys(), &model.cfg, opts)?;
        model.source_dir = Some(dir.to_path_buf());
        Ok(model)
    }

    /// Checks `dir` as [`HfModel::load`] would with `opts`, without loading a weight: its
    /// config.json (architecture, RoPE) and every parameter's name and shape in the safetensors
    /// headers. The config on success.
    pub fn check_folder(dir: &Path, opts: LoadOptions) -> Result<HfConfig, HfError> {
        let cfg = HfConfig::load(dir)?;
        let mut stored = super::weights::folder_shapes(dir)?;
        let mut src = |name: &str, shape: &[i64], _init: Init| -> Result<Tensor, HfError> {
            match stored.remove(name) {
                Some(s) if s == shape => {}
                Some(s) => {
                    return Err(HfError::weights(
                        name,
                        format!("shape {s:?} in the folder, expected {shape:?}"),
                    ))
                }
                None if name.starts_with("score.") => {}
                None => {
                    return Err(HfError::weights(
                        name,
                        format!("missing from {}", dir.display()),
                    ))
                }
            }
            // Nothing is allocated: the model built here only names its parameters.
            Ok(Tensor::f_zeros([0], (Kind::Float, Device::Cpu))?)
        };
        let cpu = LoadOptions {
            device: Device::Cpu,
            kind: Kind::Float,
            ..opts
        };
        Self::build(cfg.clone(), cpu, &mut src)?;
        no_leftovers(stored.keys(), &cfg, opts)?;
        Ok(cfg)
    }

    /// A freshly initialised model of `cfg` (HM-3).
    pub fn random(cfg: HfConfig, opts: LoadOptions, seed: u64) -> Result<Self, HfError> {
        let std = cfg
            .raw
            .get("initializer_range")
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(0.02);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut src = |_: &str, shape: &[i64], init: Init| -> Result<Tensor, HfError> {
            let opts = (Kind::Float, Device::Cpu);
            match init {
                Init::Ones => Ok(Tensor::f_ones(shape, opts)?),
                Init::Zeros => Ok(Tensor::f_zeros(shape, opts)?),
                Init::Normal => {
                    let n: i64 = shape.iter().product();
                    let mut values = Vec::with_capacity(n as usize + 1);
                    while values.len() < n as usize {
                        let u1: f64 = 1.0 - rng.gen::<f64>();
                        let u2: f64 = rng.gen::<f64>();
                        let r = (-2.0 * u1.ln()).sqrt() * std;
                        let th = 2.0 * std::f64::consts::PI * u2;
                        values.push((r * th.cos()) as f32);
                        values.push((r * th.sin()) as f32);
                    }
                    values.truncate(n as usize);
                    Ok(Tensor::f_from_slice(&values)?.f_reshape(shape)?)
                }
            }
        };
        let mut model = Self::build(cfg, opts, &mut src)?;
        model.init_seed = Some(seed);
        Ok(model)
    }

    /// The seed a freshly initialised model was drawn from ([`HfModel::random`]), if any.
    pub fn init_seed(&self) -> Option<u64> {
        self.init_seed
    }

    /// A model of `cfg` with every parameter zero: a target to load weights into.
    pub fn zeros(cfg: HfConfig, opts: LoadOptions) -> Result<Self, HfError> {
        let mut src = |_: &str, shape: &[i64], _: Init| -> Result<Tensor, HfError> {
            Ok(Tensor::f_zeros(shape, (Kind::Float, Device::Cpu))?)
        };
        Self::build(cfg, opts, &mut src)
    }

    /// The architecture.
    pub fn config(&self) -> &HfConfig {
        &self.cfg
    }
    /// Device and kind of the parameters, and the heads.
    pub fn options(&self) -> LoadOptions {
        self.opts
    }
    /// The device holding the parameters.
    pub fn device(&self) -> Device {
        self.opts.device
    }
    /// The variables (for optimizers and inspection), named as in HF files (HM-1).
    pub fn var_store(&self) -> &nn::VarStore {
        &self.vs
    }
    /// The folder this model was loaded from, if any (its tokenizer files are saved along).
    pub fn source_dir(&self) -> Option<&Path> {
        self.source_dir.as_deref()
    }

    /// Sets the folder whose tokenizer files are saved along with this model.
    pub fn set_source_dir(&mut self, dir: &Path) {
        self.source_dir = Some(dir.to_path_buf());
    }

    /// Runs every layer on `x` `[B, T, H]`, then the final norm; `attend(layer, q, k, v)` gets
    /// RoPE'd `q` `[B, Hq, T, D]`, `k`, `v` `[B, Hkv, T, D]` and returns `[B, Hq, T, D]`.
    pub(crate) fn run_layers(
        &self,
        mut x: Tensor,
        cos: &Tensor,
        sin: &Tensor,
        attend: &mut dyn FnMut(usize, Tensor, Tensor, Tensor) -> Result<Tensor, HfError>,
    ) -> Result<Tensor, HfError> {
        for l in 0..self.layers.len() {
            x = self.layer(l, &x, cos, sin, attend)?;
        }
        self.final_norm(&x)
    }

    /// The final RMSNorm of the residual stream.
    pub(crate) fn final_norm(&self, x: &Tensor) -> Result<Tensor, HfError> {
        rms_norm(x, &self.norm, self.cfg.rms_norm_eps)
    }

    /// Decoder layer `l` on the residual stream `x` `[B, T, H]` (see [`HfModel::run_layers`]).
    pub(crate) fn layer(
        &self,
        l: usize,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        attend: &mut dyn FnMut(usize, Tensor, Tensor, Tensor) -> Result<Tensor, HfError>,
    ) -> Result<Tensor, HfError> {
        let layer = &self.layers[l];
        let size = x.size();
        let (b, t) = (size[0], size[1]);
        let (hq, hkv, d) = (
            self.cfg.num_attention_heads as i64,
            self.cfg.num_key_value_heads as i64,
            self.cfg.head_dim as i64,
        );
        let eps = self.cfg.rms_norm_eps;
        let mode = self.adapter_mode();
        let h = rms_norm(x, &layer.in_norm, eps)?;
        let heads = |lin: &Linear, n: i64, norm: &Option<Tensor>| -> Result<Tensor, HfError> {
            let mut y = lin.forward_with(&h, mode)?.f_view([b, t, n, d])?;
            if let Some(w) = norm {
                y = rms_norm(&y, w, eps)?;
            }
            Ok(y.f_transpose(1, 2)?)
        };
        let q = apply_rope(&heads(&layer.q, hq, &layer.q_norm)?, cos, sin)?;
        let k = apply_rope(&heads(&layer.k, hkv, &layer.k_norm)?, cos, sin)?;
        let v = heads(&layer.v, hkv, &None)?;
        let y = attend(l, q, k, v)?
            .f_transpose(1, 2)?
            .f_reshape([b, t, hq * d])?;
        let x = x.f_add(&layer.o.forward_with(&y, mode)?)?;
        let h = rms_norm(&x, &layer.post_norm, eps)?;
        let m = layer
            .gate
            .forward_with(&h, mode)?
            .f_silu()?
            .f_mul(&layer.up.forward_with(&h, mode)?)?;
        Ok(x.f_add(&layer.down.forward_with(&m, mode)?)?)
    }

    /// Token embeddings of `tokens` `[B, T]` i64.
    pub(crate) fn embed(&self, tokens: &Tensor) -> Result<Tensor, HfError> {
        Ok(Tensor::f_embedding(&self.embed, tokens, -1, false, false)?)
    }

    /// Final hidden states `[B, T, H]` of unpadded (or right-padded) `tokens`, positions `0..T`.
    pub fn hidden(&self, tokens: &Tensor) -> Result<Tensor, HfError> {
        let (cos, sin) = self.causal_rope(tokens)?;
        self.run_layers(
            self.embed(&tokens.f_to_device(self.device())?)?,
            &cos,
            &sin,
            &mut causal_attention,
        )
    }

    /// RoPE tables for positions `0..T` of checked `tokens` `[B, T]`.
    pub(crate) fn causal_rope(&self, tokens: &Tensor) -> Result<(Tensor, Tensor), HfError> {
        let t = self.check_tokens(tokens)?;
        let rope = RopeTable::new(&self.cfg, t, self.device(), self.opts.kind)?;
        rope.prefix(t)
    }

    /// Final hidden states of a padded batch: `attention_mask` `[B, T]` (1 real, 0 padding;
    /// left or right). Positions count real tokens only, as transformers does.
    pub fn hidden_masked(
        &self,
        tokens: &Tensor,
        attention_mask: &Tensor,
    ) -> Result<Tensor, HfError> {
        let t = self.check_tokens(tokens)?;
        if attention_mask.size() != tokens.size() {
            return Err(HfError::input(format!(
                "attention_mask {:?} must match tokens {:?}",
                attention_mask.size(),
                tokens.size()
            )));
        }
        let dev = self.device();
        let valid = attention_mask.f_to_device(dev)?.f_ne(0)?;
        let positions = valid
            .f_to_kind(Kind::Int64)?
            .f_cumsum(1, Kind::Int64)?
            .f_sub_scalar(1)?
            .f_clamp_min(0)?;
        let rope = RopeTable::new(&self.cfg, t, dev, self.opts.kind)?;
        let (cos, sin) = rope.at(&positions)?;
        let causal = Tensor::f_ones([t, t], (Kind::Bool, dev))?.f_tril(0)?;
        let eye = Tensor::f_eye(t, (Kind::Bool, dev))?;
        // Padded queries attend to themselves only, so no row is fully masked (no NaN).
        let keys = valid.f_unsqueeze(1)?.f_logical_or(&eye.f_unsqueeze(0)?)?;
        let mask = causal
            .f_unsqueeze(0)?
            .f_logical_and(&keys)?
            .f_unsqueeze(1)?;
        let mut attend = |_: usize, q: Tensor, k: Tensor, v: Tensor| -> Result<Tensor, HfError> {
            attention(&q, &k, &v, Some(&mask), false)
        };
        self.run_layers(
            self.embed(&tokens.f_to_device(dev)?)?,
            &cos,
            &sin,
            &mut attend,
        )
    }

    /// LM logits `[B, T, V]` (parameter kind) of hidden states.
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor, HfError> {
        let head = self
            .lm_head
            .as_ref()
            .ok_or_else(|| HfError::input("this model has no LM head (loaded as a critic)"))?;
        Ok(hidden.f_linear(head, None::<Tensor>)?)
    }

    /// Values `[B, T]` (f32, whatever the parameter kind) of hidden states, or `None` without
    /// a value head.
    pub fn values(&self, hidden: &Tensor) -> Result<Option<Tensor>, HfError> {
        match &self.value {
            Some(head) => Ok(Some(
                head.forward(hidden)?
                    .f_squeeze_dim(-1)?
                    .f_to_kind(Kind::Float)?,
            )),
            None => Ok(None),
        }
    }

    /// Values `[B, T]` of `tokens` without running the LM head: a critic's forward.
    pub fn forward_values(&self, tokens: &Tensor) -> Result<Tensor, HfError> {
        let h = self.hidden(tokens)?;
        self.values(&h)?
            .ok_or_else(|| HfError::input("this model has no value head (loaded as a policy)"))
    }

    /// (logits `[B, T, V]`, values `[B, T]` when there is a value head).
    pub fn forward(&self, tokens: &Tensor) -> Result<(Tensor, Option<Tensor>), HfError> {
        let h = self.hidden(tokens)?;
        Ok((self.logits(&h)?, self.values(&h)?))
    }

    /// Checks `tokens` is a non-empty `[B, T]` i64 tensor of in-vocabulary ids; returns `T`.
    fn check_tokens(&self, tokens: &Tensor) -> Result<i64, HfError> {
        let size = tokens.size();
        if size.len() != 2 || size[0] == 0 || size[1] == 0 || tokens.kind() != Kind::Int64 {
            return Err(HfError::input(format!(
                "tokens must be a non-empty [B, T] Int64 tensor, got {:?} {size:?}",
                tokens.kind()
            )));
        }
        let (lo, hi) = (
            tokens.f_min()?.int64_value(&[]),
            tokens.f_max()?.int64_value(&[]),
        );
        if lo < 0 || hi >= self.cfg.vocab_size as i64 {
            return Err(HfError::input(format!(
                "token ids must be in 0..{}, got {lo}..={hi}",
                self.cfg.vocab_size
            )));
        }
        Ok(size[1])
    }

    /// Linear module `m` (index into `hf::lora::LINEAR_MODULES`) of layer `l`.
    pub(crate) fn linear(&self, l: usize, m: usize) -> &Linear {
        let layer = &self.layers[l];
        [
            &layer.q,
            &layer.k,
            &layer.v,
            &layer.o,
            &layer.gate,
            &layer.up,
            &layer.down,
        ][m]
    }

    /// Mutable [`HfModel::linear`].
    pub(crate) fn linear_mut(&mut self, l: usize, m: usize) -> &mut Linear {
        let layer = &mut self.layers[l];
        match m {
            0 => &mut layer.q,
            1 => &mut layer.k,
            2 => &mut layer.v,
            3 => &mut layer.o,
            4 => &mut layer.gate,
            5 => &mut layer.up,
            _ => &mut layer.down,
        }
    }

    /// Adds an adapter tensor to the variables under `name`.
    pub(crate) fn add_adapter_var(&self, name: &str, t: Tensor, trainable: bool) -> Tensor {
        add_var(&self.vs, name, t, trainable)
    }

    /// A model on the same base tensors as this one (shared storage, nothing trainable), with
    /// its own copy of the value head and of each adapter; `zero_adapters` starts them at 0.
    pub(crate) fn share_base(&self, zero_adapters: bool) -> Result<HfModel, HfError> {
        let mine: HashMap<String, Tensor> = self.named_parameters().into_iter().collect();
        let mut src = |name: &str, _: &[i64], _: Init| -> Result<Tensor, HfError> {
            let t = mine
                .get(name)
                .ok_or_else(|| HfError::weights(name, "missing from the shared model"))?;
            Ok(if name.starts_with("score.") {
                t.f_detach()?.copy()
            } else {
                t.shallow_clone()
            })
        };
        let mut view = Self::build_with(self.cfg.clone(), self.opts, &mut src, false)?;
        view.source_dir = self.source_dir.clone();
        view.init_seed = self.init_seed;
        for l in 0..self.layers.len() {
            for m in 0..super::lora::LINEAR_MODULES.len() {
                let Some(ad) = &self.linear(l, m).lora else {
                    continue;
                };
                let name = format!("model.layers.{l}.{}", super::lora::LINEAR_MODULES[m]);
                let copy = |t: &Tensor| -> Result<Tensor, HfError> {
                    let mut c = t.f_detach()?.copy();
                    Ok(if zero_adapters { c.f_zero_()? } else { c })
                };
                let (a, b) = (copy(&ad.a)?, copy(&ad.b)?);
                let a = add_var(&view.vs, &format!("{name}.lora_A.weight"), a, false);
                let b = add_var(&view.vs, &format!("{name}.lora_B.weight"), b, false);
                view.linear_mut(l, m).lora = Some(Adapter { a, b });
            }
        }
        Ok(view)
    }

    /// A standalone model without adapters: every parameter copied, except those in
    /// `replace` (HF name → value) which are taken from there.
    pub(crate) fn plain_copy(&self, replace: &HashMap<String, Tensor>) -> Result<HfModel, HfError> {
        let mine: HashMap<String, Tensor> = self.named_parameters().into_iter().collect();
        let mut src = |name: &str, _: &[i64], _: Init| -> Result<Tensor, HfError> {
            let t = replace
                .get(name)
                .or_else(|| mine.get(name))
                .ok_or_else(|| HfError::weights(name, "missing from the copied model"))?;
            Ok(t.f_detach()?.copy())
        };
        let mut copy = Self::build(self.cfg.clone(), self.opts, &mut src)?;
        copy.source_dir = self.source_dir.clone();
        copy.init_seed = self.init_seed;
        Ok(copy)
    }

    /// Variables sorted by HF name.
    pub fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut vars: Vec<(String, Tensor)> = self.vs.variables().into_iter().collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        vars
    }
}
