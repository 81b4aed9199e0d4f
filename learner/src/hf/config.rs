//! `config.json` of a Hugging Face Llama / Qwen2 / Qwen3 causal LM, parsed into what keel's
//! decoder needs.
//!
//! Invariants:
//! - HC-1: only architectures keel runs exactly are accepted (`llama`, `qwen2`, `qwen3`, SiLU
//!   MLP, full attention, RoPE types `default` / `linear` / `llama3`); anything else (sliding
//!   windows, partial rotary, YaRN, …) is a [`HfError::Config`] naming the key, never a model
//!   that silently computes something else.
//! - HC-2: both RoPE layouts are read: transformers ≥ 5 `rope_parameters`, and the older
//!   `rope_theta` + `rope_scaling` (`type` or `rope_type`).
//! - HC-3: the parsed JSON is kept verbatim in [`HfConfig::raw`], so a saved checkpoint's
//!   config.json carries every field of the original (only `dtype`/`torch_dtype` is updated).

use std::path::Path;

use serde_json::Value;

use super::error::HfError;

/// Which decoder family the config describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// `LlamaForCausalLM`: optional attention/MLP biases.
    Llama,
    /// `Qwen2ForCausalLM`: q/k/v projections carry a bias.
    Qwen2,
    /// `Qwen3ForCausalLM`: RMSNorm on every query and key head (q_norm, k_norm).
    Qwen3,
}

/// How rotary frequencies are derived from `rope_theta` (HC-1).
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// `inv_freq[i] = theta^(-2i/d)`.
    Default,
    /// Positions divided by `factor` (inv_freq / factor).
    Linear {
        /// The scaling factor.
        factor: f64,
    },
    /// Llama 3.1 wavelength-dependent scaling.
    Llama3 {
        /// The scaling factor for low frequencies.
        factor: f64,
        /// `low_freq_factor`.
        low_freq_factor: f64,
        /// `high_freq_factor`.
        high_freq_factor: f64,
        /// `original_max_position_embeddings`.
        original_max_position_embeddings: f64,
    },
}

/// The architecture hyper-parameters of a Llama / Qwen2 / Qwen3 model.
#[derive(Clone, Debug)]
pub struct HfConfig {
    /// The decoder family.
    pub arch: Arch,
    /// Rows of the embedding and LM head.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the SwiGLU MLP.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (GQA when fewer than the query heads).
    pub num_key_value_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// RoPE frequency scaling.
    pub rope_scaling: RopeScaling,
    /// Longest position the model was built for.
    pub max_position_embeddings: usize,
    /// Whether `lm_head` shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Whether q/k/v projections have a bias.
    pub qkv_bias: bool,
    /// Whether the output projection has a bias.
    pub o_bias: bool,
    /// Whether the MLP projections have biases.
    pub mlp_bias: bool,
    /// Whether queries and keys are RMS-normalised per head (Qwen3).
    pub qk_norm: bool,
    /// End-of-sequence ids (`eos_token_id`, one id or a list).
    pub eos_token_ids: Vec<u32>,
    /// The parsed config.json, verbatim (HC-3).
    pub raw: Value,
}

fn usize_of(v: &Value, key: &str) -> Result<Option<usize>, HfError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x.as_u64().map(|n| Some(n as usize)).ok_or_else(|| {
            HfError::config(key, format!("expected a non-negative integer, got {x}"))
        }),
    }
}

fn req_usize(v: &Value, key: &str) -> Result<usize, HfError> {
    match usize_of(v, key)? {
        Some(0) => Err(HfError::config(key, "must be > 0")),
        Some(n) => Ok(n),
        None => Err(HfError::config(key, "missing")),
    }
}

fn f64_of(v: &Value, key: &str) -> Result<Option<f64>, HfError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_f64()
            .map(Some)
            .ok_or_else(|| HfError::config(key, format!("expected a number, got {x}"))),
    }
}

fn bool_of(v: &Value, key: &str, default: bool) -> Result<bool, HfError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(x) => x
            .as_bool()
            .ok_or_else(|| HfError::config(key, format!("expected true/false, got {x}"))),
    }
}

/// Reads `rope_theta` and the scaling from either layout (HC-2).
fn parse_rope(v: &Value) -> Result<(f64, RopeScaling), HfError> {
    let (params, prefix) = match v.get("rope_parameters") {
        Some(p @ Value::Object(_)) => (Some(p), "rope_parameters"),
        _ => match v.get("rope_scaling") {
            Some(p @ Value::Object(_)) => (Some(p), "rope_scaling"),
            _ => (None, "rope_scaling"),
        },
    };
    let theta = params
        .map(|p| f64_of(p, "rope_theta"))
        .transpose()?
        .flatten()
        .or(f64_of(v, "rope_theta")?)
        .unwrap_or(10_000.0);
    if let Some(f) = f64_of(v, "partial_rotary_factor")? {
        if f != 1.0 {
            return Err(HfError::config(
                "partial_rotary_factor",
                format!("only 1.0 is supported, got {f}"),
            ));
        }
    }
    let Some(p) = params else {
        return Ok((theta, RopeScaling::Default));
    };
    let kind = p
        .get("rope_type")
        .or_else(|| p.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let need = |key: &str| -> Result<f64, HfError> {
        f64_of(p, key)?.ok_or_else(|| HfError::config(&format!("{prefix}.{key}"), "missing"))
    };
    let scaling = match kind {
        "default" => RopeScaling::Default,
        "linear" => RopeScaling::Linear {
            factor: need("factor")?,
        },
        "llama3" => RopeScaling::Llama3 {
            factor: need("factor")?,
            low_freq_factor: need("low_freq_factor")?,
            high_freq_factor: need("high_freq_factor")?,
            original_max_position_embeddings: need("original_max_position_embeddings")?,
        },
        other => {
            return Err(HfError::config(
                &format!("{prefix}.rope_type"),
                format!("`{other}` is not supported (supported: default, linear, llama3)"),
            ))
        }
    };
    Ok((theta, scaling))
}

fn eos_ids(v: &Value) -> Result<Vec<u32>, HfError> {
    let bad = |x: &Value| {
        HfError::config(
            "eos_token_id",
            format!("expected an id or a list of ids, got {x}"),
        )
    };
    match v.get("eos_token_id") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(xs)) => xs
            .iter()
            .map(|x| x.as_u64().map(|n| n as u32).ok_or_else(|| bad(x)))
            .collect(),
        Some(x) => Ok(vec![x.as_u64().ok_or_else(|| bad(x))? as u32]),
    }
}

impl HfConfig {
    /// Parses a config.json value (HC-1, HC-2).
    pub fn from_value(v: Value) -> Result<Self, HfError> {
        let model_type = v.get("model_type").and_then(Value::as_str).unwrap_or("");
        let arch = match model_type {
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            other => {
                return Err(HfError::config(
                    "model_type",
                    format!("`{other}` is not supported (supported: llama, qwen2, qwen3)"),
                ))
            }
        };
        let act = v
            .get("hidden_act")
            .and_then(Value::as_str)
            .unwrap_or("silu");
        if act != "silu" {
            return Err(HfError::config(
                "hidden_act",
                format!("only silu is supported, got {act}"),
            ));
        }
        if bool_of(&v, "use_sliding_window", false)? {
            return Err(HfError::config(
                "use_sliding_window",
                "sliding-window attention is not supported",
            ));
        }
        let hidden_size = req_usize(&v, "hidden_size")?;
        let num_attention_heads = req_usize(&v, "num_attention_heads")?;
        let num_key_value_heads =
            usize_of(&v, "num_key_value_heads")?.unwrap_or(num_attention_heads);
        if num_key_value_heads == 0 || num_attention_heads % num_key_value_heads != 0 {
            return Err(HfError::config(
                "num_key_value_heads",
                format!("must divide num_attention_heads ({num_attention_heads}), got {num_key_value_heads}"),
            ));
        }
        let default_head_dim = if arch == Arch::Qwen3 {
            128
        } else {
            hidden_size / num_attention_heads
        };
        let head_dim = usize_of(&v, "head_dim")?.unwrap_or(default_head_dim);
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(HfError::config(
                "head_dim",
                format!("must be even and > 0, got {head_dim}"),
            ));
        }
        let (rope_theta, rope_scaling) = parse_rope(&v)?;
        let attention_bias = bool_of(&v, "attention_bias", false)?;
        let (qkv_bias, o_bias, mlp_bias) = match arch {
            Arch::Llama => (
                attention_bias,
                attention_bias,
                bool_of(&v, "mlp_bias", false)?,
            ),
            Arch::Qwen2 => (true, false, false),
            Arch::Qwen3 => (attention_bias, attention_bias, false),
        };
        Ok(HfConfig {
            arch,
            vocab_size: req_usize(&v, "vocab_size")?,
            hidden_size,
            intermediate_size: req_usize(&v, "intermediate_size")?,
            num_hidden_layers: req_usize(&v, "num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: f64_of(&v, "rms_norm_eps")?.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            max_position_embeddings: usize_of(&v, "max_position_embeddings")?.unwrap_or(4096),
            tie_word_embeddings: bool_of(&v, "tie_word_embeddings", false)?,
            qkv_bias,
            o_bias,
            mlp_bias,
            qk_norm: arch == Arch::Qwen3,
            eos_token_ids: eos_ids(&v)?,
            raw: v,
        })
    }

    /// Reads and parses `dir/config.json`.
    pub fn load(dir: &Path) -> Result<Self, HfError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| HfError::io(&path, e))?;
        let v: Value =
            serde_json::from_str(&text).map_err(|source| HfError::Json { path, source })?;
        Self::from_value(v)
    }

    /// Number of scalar parameters of the causal LM (lm_head counted once when tied).
    pub fn n_params(&self) -> usize {
        let (h, i, v) = (self.hidden_size, self.intermediate_size, self.vocab_size);
        let (q, kv) = (
            self.num_attention_heads * self.head_dim,
            self.num_key_value_heads * self.head_dim,
        );
        let mut layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h;
        if self.qkv_bias {
            layer += q + 2 * kv;
        }
        if self.o_bias {
            layer += h;
        }
        if self.mlp_bias {
            layer += 2 * i + h;
        }
        if self.qk_norm {
            layer += 2 * self.head_dim;
        }
        let head = if self.tie_word_embeddings { 0 } else { v * h };
        v * h + self.num_hidden_layers * layer + h + head
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base(model_type: &str) -> Value {
        json!({"model_type": model_type, "vocab_size": 32, "hidden_size": 16, "intermediate_size": 24,
               "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2})
    }

    #[test]
    fn hc2_reads_both_rope_layouts() {
        let mut v = base("llama");
        v["rope_parameters"] =
            json!({"rope_theta": 500000.0, "rope_type": "linear", "factor": 2.0});
        let c = HfConfig::from_value(v).expect("v5 layout");
        assert_eq!(
            (c.rope_theta, c.rope_scaling),
            (500000.0, RopeScaling::Linear { factor: 2.0 })
        );
        let mut v = base("llama");
        v["rope_theta"] = json!(1000.0);
        v["rope_scaling"] = json!({"type": "linear", "factor": 4.0});
        let c = HfConfig::from_value(v).expect("v4 layout");
        assert_eq!(
            (c.rope_theta, c.rope_scaling),
            (1000.0, RopeScaling::Linear { factor: 4.0 })
        );
    }

    #[test]
    fn hc1_rejects_what_keel_cannot_run() {
        let mut v = base("qwen2");
        v["rope_scaling"] = json!({"rope_type": "yarn", "factor": 4.0});
        let e = HfConfig::from_value(v).expect_err("yarn").to_string();
        assert_eq!(e, "config.json `rope_scaling.rope_type`: `yarn` is not supported (supported: default, linear, llama3)");
        let e = HfConfig::from_value(base("gpt2"))
            .expect_err("gpt2")
            .to_string();
        assert!(e.contains("`model_type`"), "{e}");
        let mut v = base("qwen2");
        v["num_key_value_heads"] = json!(3);
        assert!(HfConfig::from_value(v).is_err());
    }

    #[test]
    fn arch_defaults() {
        let q2 = HfConfig::from_value(base("qwen2")).expect("qwen2");
        assert!(q2.qkv_bias && !q2.o_bias && !q2.qk_norm && q2.head_dim == 4);
        let q3 = HfConfig::from_value(base("qwen3")).expect("qwen3");
        assert!(!q3.qkv_bias && q3.qk_norm && q3.head_dim == 128);
        let mut v = base("llama");
        v["eos_token_id"] = json!([5, 7]);
        assert_eq!(
            HfConfig::from_value(v).expect("llama").eos_token_ids,
            vec![5, 7]
        );
    }
}
