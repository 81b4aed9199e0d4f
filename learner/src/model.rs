//! keel's one model path: every policy, reference policy, critic and generator model is an
//! [`HfModel`] (the Llama / Qwen2 / Qwen3 decoder of [`crate::hf`]). This module says where a
//! model comes from ([`ModelSpec`]: a Hugging Face folder, or the built-in tiny
//! Llama-shaped configuration made from `[model]` keys and the env's vocabulary, [`TinyShape`]) and moves
//! weights in and out of memory as safetensors under HF names: what the weight board,
//! checkpoints and exports carry.
//!
//! Invariants:
//! - MD-1 (tiny = Llama): [`TinyShape::hf_config`] is a Llama `config.json` that transformers
//!   loads; the quickstart's tiny model runs exactly the code a 7B run uses. (Llama rather than
//!   Qwen2: transformers 5 gives a `qwen2` folder its byte-level BPE tokenizer class whatever
//!   `tokenizer_config.json` says, which would mangle the word-level tokenizer of an export.)
//! - MD-2 (init): a model from a spec with [`WeightSource::Random`] is [`HfModel::random`]
//!   (HM-3): the same spec and seed give bit-identical weights on every device; a folder spec
//!   loads the folder's weights (a value head absent from it starts at zero).
//! - MD-3 (weights): [`HfModel::to_safetensors`] writes every variable under its HF name as F32
//!   (TI-1); [`HfModel::load_safetensors`] accepts exactly this model's names with matching
//!   shapes and checks the whole buffer before anything changes (TI-2).
//! - MD-4 (identity): two models are the same architecture iff their saved `config.json`
//!   values, heads and parameter kind are equal ([`ModelSpec::identity`]); `learner.json` records it and a
//!   restore refuses another (LR-5).
//! - MD-6 (LoRA): a spec with `lora` builds the base, then fresh adapters on it with the base
//!   frozen (LO-4). Its trained parameters — what `to_safetensors` writes, the weight board
//!   publishes, checkpoints store and the optimizer holds — are the adapters (and a value
//!   head); a blank model to load them into is the base itself with adapters. `learner.json`
//!   records the base's hash and origin ([`LoraBase`]); exports merge the adapters in.
//! - MD-5 (temperature): the learner's log-probs of a sequence sampled at temperature `T` are
//!   taken on `logits / T` ([`policy_logits`]), as verl does and as the sampler records them
//!   (SP-1), so the PPO ratio is 1 on-policy at any temperature.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use tch::{Device, Kind, Tensor};

use crate::error::LearnerError;
use crate::hf::{HfConfig, HfModel, LoadOptions, LoraConfig};
use crate::tensor_io;

/// The built-in tiny model's shape: `[model]` keys plus the env's vocabulary (MD-1).
#[derive(Clone, Debug, PartialEq)]
pub struct TinyShape {
    /// Number of token ids (the env's word-level vocabulary).
    pub vocab_size: usize,
    /// Longest sequence (`max_position_embeddings`).
    pub context_len: usize,
    /// Decoder layers.
    pub n_layer: usize,
    /// Residual width.
    pub d_model: usize,
    /// Attention heads (must divide `d_model`; as many key/value heads).
    pub n_head: usize,
    /// `bos_token_id` recorded in config.json.
    pub bos_token_id: u32,
    /// `eos_token_id`: the token that ends a turn.
    pub eos_token_id: u32,
    /// `pad_token_id`.
    pub pad_token_id: u32,
}

impl TinyShape {
    /// Checks that every size is positive and that `n_head` divides `d_model` into even heads.
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
        if self.d_model % self.n_head != 0 || (self.d_model / self.n_head) % 2 != 0 {
            return Err(LearnerError::config(
                "model.n_head",
                format!(
                    "must divide model.d_model ({}) into heads of even width, got {}",
                    self.d_model, self.n_head
                ),
            ));
        }
        Ok(())
    }

    /// The Llama config.json of this shape (MD-1): SwiGLU MLP of width 4·d, RoPE θ = 10⁴, no
    /// biases, untied LM head.
    pub fn hf_config(&self) -> Result<HfConfig, LearnerError> {
        self.validate()?;
        let v = json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.d_model,
            "intermediate_size": 4 * self.d_model,
            "num_hidden_layers": self.n_layer,
            "num_attention_heads": self.n_head,
            "num_key_value_heads": self.n_head,
            "max_position_embeddings": self.context_len,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "hidden_act": "silu",
            "initializer_range": 0.02,
            "tie_word_embeddings": false,
            "attention_bias": false,
            "mlp_bias": false,
            "attention_dropout": 0.0,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            "dtype": "float32",
        });
        Ok(HfConfig::from_value(v)?)
    }
}

/// Where a model's first weights come from.
#[derive(Clone, Debug, PartialEq)]
pub enum WeightSource {
    /// Fresh initialisation seeded by `seed` (MD-2).
    Random {
        /// The init seed.
        seed: u64,
    },
    /// The safetensors of a Hugging Face folder.
    Folder(PathBuf),
}

/// Everything needed to build a model: architecture, first weights, placement and heads.
#[derive(Clone, Debug)]
pub struct ModelSpec {
    /// The architecture (config.json).
    pub config: HfConfig,
    /// The first weights.
    pub weights: WeightSource,
    /// CPU or CUDA.
    pub device: Device,
    /// Parameter kind (f32 or bf16).
    pub kind: Kind,
    /// Whether the model carries the scalar value head (`score`, a critic on the policy trunk).
    pub value_head: bool,
    /// LoRA adapters on the frozen base (`[model.lora]`, MD-6), or full fine-tuning.
    pub lora: Option<LoraConfig>,
}

impl ModelSpec {
    /// The built-in tiny model, initialised from `seed`, f32.
    pub fn tiny(
        shape: &TinyShape,
        device: Device,
        seed: u64,
        value_head: bool,
    ) -> Result<Self, LearnerError> {
        Ok(ModelSpec {
            config: shape.hf_config()?,
            weights: WeightSource::Random { seed },
            device,
            kind: Kind::Float,
            value_head,
            lora: None,
        })
    }

    /// A Hugging Face folder (config.json + safetensors), checked now (HC-1).
    pub fn folder(
        dir: &Path,
        device: Device,
        kind: Kind,
        value_head: bool,
    ) -> Result<Self, LearnerError> {
        Ok(ModelSpec {
            config: HfConfig::load(dir)?,
            weights: WeightSource::Folder(dir.to_path_buf()),
            device,
            kind,
            value_head,
            lora: None,
        })
    }

    /// The same model initialised from `seed` instead (a folder's weights are kept): Dr. MAS
    /// agent models start from their own seeds.
    pub fn reseeded(&self, seed: u64) -> ModelSpec {
        let weights = match &self.weights {
            WeightSource::Random { .. } => WeightSource::Random { seed },
            folder @ WeightSource::Folder(_) => folder.clone(),
        };
        ModelSpec {
            weights,
            ..self.clone()
        }
    }

    /// Heads and placement as [`LoadOptions`].
    pub fn options(&self) -> LoadOptions {
        LoadOptions {
            device: self.device,
            kind: self.kind,
            lm_head: true,
            value_head: self.value_head,
        }
    }

    /// The model with its first weights (MD-2), with fresh adapters on the frozen base when
    /// the spec has LoRA (MD-6).
    pub fn build(&self) -> Result<HfModel, LearnerError> {
        let base = match &self.weights {
            WeightSource::Random { seed } => {
                HfModel::random(self.config.clone(), self.options(), *seed)?
            }
            WeightSource::Folder(dir) => HfModel::load(dir, self.options())?,
        };
        Ok(match &self.lora {
            Some(cfg) => base.with_lora(cfg)?,
            None => base,
        })
    }

    /// The separate critic of this spec: its trunk and a `score` head (read from the folder
    /// when there, else zero, HM-3), no LM head.
    pub fn build_critic(&self) -> Result<HfModel, LearnerError> {
        let opts = LoadOptions::critic(self.device, self.kind);
        Ok(match &self.weights {
            WeightSource::Random { seed } => HfModel::random(self.config.clone(), opts, *seed)?,
            WeightSource::Folder(dir) => HfModel::load(dir, opts)?,
        })
    }

    /// A model to load published weights into: this architecture with zero weights, or with
    /// LoRA the base's weights and adapters (published weights are the adapters, MD-6).
    pub fn blank(&self) -> Result<HfModel, LearnerError> {
        if self.lora.is_some() {
            return self.build();
        }
        Ok(HfModel::zeros(self.config.clone(), self.options())?)
    }

    /// What identifies the architecture (MD-4): the saved config.json, the heads and the
    /// parameter kind (a bf16 run's optimizer holds f32 masters an f32 run does not have).
    pub fn identity(model: &HfModel) -> Value {
        let o = model.options();
        let mut id = json!({
            "config": model.saved_config(),
            "value_head": o.value_head,
            "dtype": format!("{:?}", o.kind),
        });
        if let Some(lora) = model.lora() {
            id["lora"] = json!(lora);
        }
        id
    }
}

/// Where a LoRA run's frozen base comes from and what it is (MD-6): recorded in `learner.json`
/// so that a checkpoint of adapters names the one base they apply to.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LoraBase {
    /// `sha256:<hex>` of the base's parameters (LO-4).
    pub hash: String,
    /// The folder the base was loaded from, if any.
    pub folder: Option<PathBuf>,
    /// The init seed of a freshly initialised base (the built-in tiny model), if any.
    pub seed: Option<u64>,
}

impl LoraBase {
    /// The base of `model`, or None without adapters.
    pub fn of(model: &HfModel) -> Result<Option<LoraBase>, LearnerError> {
        Ok(model.base_hash()?.map(|hash| LoraBase {
            hash,
            folder: model.source_dir().map(Path::to_path_buf),
            seed: model.init_seed(),
        }))
    }
}

/// The model stored in a checkpoint, CPU, with its stored heads: `learner.json` names the
/// architecture (MD-4) and `model.safetensors` holds its trained weights. A LoRA checkpoint's
/// base is loaded from `base_dir`, else from the recorded folder or seed, and must have the
/// recorded hash (MD-6); the model keeps its adapters.
pub fn model_from_checkpoint(
    learner_json: &[u8],
    weights: &[u8],
    base_dir: Option<&Path>,
) -> Result<HfModel, LearnerError> {
    let state: Value = serde_json::from_slice(learner_json)?;
    let model = &state["model"];
    let config = HfConfig::from_value(model["config"].clone()).map_err(|e| {
        LearnerError::mismatch("learner.json", format!("model.config is not usable: {e}"))
    })?;
    let mut stored = LoadOptions::policy(Device::Cpu, Kind::Float);
    stored.value_head = model["value_head"].as_bool().unwrap_or(false);
    let lora = match model.get("lora") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            serde_json::from_value::<LoraConfig>(v.clone()).map_err(|e| {
                LearnerError::mismatch("learner.json", format!("model.lora is not usable: {e}"))
            })?,
        ),
    };
    let Some(lora) = lora else {
        let mut full = HfModel::zeros(config, stored)?;
        full.load_safetensors(weights)?;
        return Ok(full);
    };
    let base: LoraBase = serde_json::from_value(state["lora_base"].clone()).map_err(|e| {
        LearnerError::mismatch(
            "learner.json",
            format!("a LoRA checkpoint must record its base (lora_base): {e}"),
        )
    })?;
    if model["dtype"].as_str() == Some("BFloat16") {
        stored.kind = Kind::BFloat16;
    }
    let folder = base_dir.map(Path::to_path_buf).or(base.folder.clone());
    let plain = match (&folder, base.seed) {
        (Some(dir), _) => HfModel::load(dir, stored)?,
        (None, Some(seed)) => HfModel::random(config, stored, seed)?,
        (None, None) => {
            return Err(LearnerError::mismatch(
                "learner.json",
                "lora_base names neither a folder nor a seed; pass the base model's folder",
            ))
        }
    };
    let mut adapted = plain.with_lora(&lora)?;
    let hash = adapted.base_hash()?.unwrap_or_default();
    if hash != base.hash {
        return Err(LearnerError::mismatch(
            "lora_base",
            format!(
                "the base model{} is {hash}, but the adapters were trained on {}; pass the base they were trained on",
                folder.map(|d| format!(" at {}", d.display())).unwrap_or_default(),
                base.hash
            ),
        ));
    }
    adapted.load_safetensors(weights)?;
    Ok(adapted)
}

/// The policy (LM head only, CPU, adapters merged) stored in a checkpoint (see
/// [`model_from_checkpoint`]); a value head in the file is checked, then left out.
pub fn policy_from_checkpoint(
    learner_json: &[u8],
    weights: &[u8],
    base_dir: Option<&Path>,
) -> Result<HfModel, LearnerError> {
    let stored = model_from_checkpoint(learner_json, weights, base_dir)?;
    let full = match stored.lora() {
        Some(_) => stored.merged()?,
        None => stored,
    };
    let opts = full.options();
    if !opts.value_head {
        return Ok(full);
    }
    let policy = LoadOptions {
        value_head: false,
        ..opts
    };
    let mut lm = HfModel::zeros(full.config().clone(), policy)?;
    let by_name: std::collections::HashMap<String, Tensor> =
        full.named_parameters().into_iter().collect();
    let values = lm
        .named_parameters()
        .iter()
        .map(|(n, _)| {
            by_name
                .get(n)
                .map(Tensor::detach)
                .ok_or_else(|| LearnerError::mismatch(n, "missing from the checkpoint's model"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    lm.commit_weights(&values)?;
    if let Some(dir) = full.source_dir() {
        lm.set_source_dir(dir);
    }
    Ok(lm)
}

/// `(logits / temperature, values)` of `tokens` (MD-5): the division is done in f32, as the
/// sampler does it (SP-1); at temperature 1 the logits keep the parameter kind. The values are
/// never scaled.
pub fn policy_logits(
    model: &HfModel,
    tokens: &Tensor,
    temperature: f64,
) -> Result<(Tensor, Option<Tensor>), LearnerError> {
    if !(temperature.is_finite() && temperature > 0.0) {
        return Err(LearnerError::config(
            "rollout.temperature",
            format!("must be finite and > 0, got {temperature}"),
        ));
    }
    let (logits, values) = model.forward(tokens)?;
    Ok((scale_logits(logits, temperature)?, values))
}

/// `logits / temperature` in f32 (MD-5); at temperature 1 the logits keep their kind.
pub(crate) fn scale_logits(logits: Tensor, temperature: f64) -> Result<Tensor, LearnerError> {
    Ok(if temperature == 1.0 {
        logits
    } else {
        logits.f_to_kind(Kind::Float)?.f_div_scalar(temperature)?
    })
}

impl HfModel {
    /// The trained variables (all of them, or with LoRA the adapters and value head, MD-6) as
    /// an in-memory safetensors buffer, F32, under their HF names (MD-3).
    pub fn to_safetensors(&self) -> Result<Vec<u8>, LearnerError> {
        tensor_io::encode(&self.trained_parameters(), None)
    }

    /// Checks a buffer against this model's trained variables without changing anything
    /// (TI-2).
    pub(crate) fn decode_weights(&self, bytes: &[u8]) -> Result<Vec<Tensor>, LearnerError> {
        let expected: Vec<(String, Vec<i64>)> = self
            .trained_parameters()
            .into_iter()
            .map(|(n, t)| (n, t.size()))
            .collect();
        Ok(tensor_io::decode_checked(bytes, &expected, "model")?.tensors)
    }

    /// Copies already-checked values (from `decode_weights`) into the variables.
    pub(crate) fn commit_weights(&mut self, values: &[Tensor]) -> Result<(), LearnerError> {
        let targets: Vec<Tensor> = self
            .trained_parameters()
            .into_iter()
            .map(|(_, t)| t)
            .collect();
        tensor_io::commit(&targets, values)
    }

    /// Replaces every variable with the buffer's values; on any mismatch nothing changes and
    /// the error names the first offending tensor (MD-3).
    pub fn load_safetensors(&mut self, bytes: &[u8]) -> Result<(), LearnerError> {
        let values = self.decode_weights(bytes)?;
        self.commit_weights(&values)
    }

    /// An independent copy (same architecture, placement, heads and weights); with LoRA, a
    /// frozen view on the same base tensors with its own copy of the adapters (MD-6).
    pub fn try_clone(&self) -> Result<HfModel, LearnerError> {
        if self.lora().is_some() {
            return Ok(self.adapter_view(true)?);
        }
        let mut copy = HfModel::zeros(self.config().clone(), self.options())?;
        let values: Vec<Tensor> = self
            .named_parameters()
            .into_iter()
            .map(|(_, t)| t.detach())
            .collect();
        copy.commit_weights(&values)?;
        Ok(copy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> TinyShape {
        TinyShape {
            vocab_size: 11,
            context_len: 16,
            n_layer: 2,
            d_model: 16,
            n_head: 2,
            bos_token_id: 1,
            eos_token_id: 2,
            pad_token_id: 0,
        }
    }

    fn weights(m: &HfModel) -> Vec<(String, Vec<f32>)> {
        m.named_parameters()
            .into_iter()
            .map(|(n, t)| {
                let flat = t.flatten(0, -1);
                (n, Vec::<f32>::try_from(&flat).expect("f32"))
            })
            .collect()
    }

    #[test]
    fn md1_tiny_shape_is_a_llama_config_and_names_bad_keys() {
        let c = shape().hf_config().expect("config");
        assert_eq!(c.arch, crate::hf::Arch::Llama);
        assert_eq!(
            (c.vocab_size, c.head_dim, c.eos_token_ids.clone()),
            (11, 8, vec![2])
        );
        let bad = TinyShape {
            n_head: 3,
            ..shape()
        };
        let e = bad.hf_config().expect_err("3 heads").to_string();
        assert!(e.starts_with("model.n_head"), "{e}");
        let zero = TinyShape {
            n_layer: 0,
            ..shape()
        };
        assert!(zero
            .validate()
            .expect_err("0")
            .to_string()
            .contains("model.n_layer"));
    }

    #[test]
    fn md2_random_init_is_deterministic_per_seed() {
        let a = ModelSpec::tiny(&shape(), Device::Cpu, 3, true).expect("spec");
        let b = ModelSpec::tiny(&shape(), Device::Cpu, 4, true).expect("spec");
        let (ma, mb) = (a.build().expect("a"), b.build().expect("b"));
        assert_eq!(weights(&ma), weights(&a.build().expect("a again")));
        assert_ne!(weights(&ma), weights(&mb));
        // The value head starts at zero (HM-3) and is named as transformers names it.
        assert!(weights(&ma)
            .iter()
            .any(|(n, v)| n == "score.weight" && v.iter().all(|&x| x == 0.0)));
    }

    #[test]
    fn md3_safetensors_round_trip_clone_and_mismatch() {
        let spec = ModelSpec::tiny(&shape(), Device::Cpu, 5, false).expect("spec");
        let m = spec.build().expect("model");
        let bytes = m.to_safetensors().expect("bytes");
        let mut blank = spec.blank().expect("blank");
        blank.load_safetensors(&bytes).expect("load");
        assert_eq!(weights(&blank), weights(&m));
        assert_eq!(weights(&m.try_clone().expect("clone")), weights(&m));
        let other = ModelSpec::tiny(
            &TinyShape {
                d_model: 32,
                ..shape()
            },
            Device::Cpu,
            5,
            false,
        )
        .expect("spec");
        let mut o = other.blank().expect("other");
        let before = weights(&o);
        let e = o.load_safetensors(&bytes).expect_err("shape").to_string();
        assert!(
            e.contains("shape [11, 16] in the model file, expected [11, 32]"),
            "{e}"
        );
        assert_eq!(weights(&o), before, "nothing changed");
    }

    #[test]
    fn md5_temperature_scales_logits_not_values() {
        let spec = ModelSpec::tiny(&shape(), Device::Cpu, 6, true).expect("spec");
        let m = spec.build().expect("model");
        let tokens = Tensor::from_slice(&[1i64, 4, 5, 6]).reshape([1, 4]);
        let (l1, v1) = policy_logits(&m, &tokens, 1.0).expect("t1");
        let (l7, v7) = policy_logits(&m, &tokens, 0.7).expect("t0.7");
        let diff = (l1 / 0.7 - l7).abs().max().double_value(&[]);
        assert!(diff < 1e-5, "{diff}");
        let vd = (v1.expect("v") - v7.expect("v"))
            .abs()
            .max()
            .double_value(&[]);
        assert_eq!(vd, 0.0);
    }
}

/// Tiny models for the crate's unit tests.
#[cfg(test)]
pub(crate) mod test_models {
    use super::*;

    /// The spec of a tiny Llama-shaped model over `vocab` ids (2 layers, width 32, 4 heads),
    /// CPU f32.
    pub(crate) fn tiny_spec(vocab: usize, value_head: bool, seed: u64) -> ModelSpec {
        let shape = TinyShape {
            vocab_size: vocab,
            context_len: 32,
            n_layer: 2,
            d_model: 32,
            n_head: 4,
            bos_token_id: 1,
            eos_token_id: 2,
            pad_token_id: 0,
        };
        ModelSpec::tiny(&shape, Device::Cpu, seed, value_head).expect("tiny spec")
    }

    /// [`tiny_spec`], built.
    pub(crate) fn tiny(vocab: usize, value_head: bool, seed: u64) -> HfModel {
        tiny_spec(vocab, value_head, seed)
            .build()
            .expect("tiny model")
    }
}
