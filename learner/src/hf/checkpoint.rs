//! Saving an [`HfModel`] as a folder that `transformers` loads directly (no merge step).
//!
//! Invariants:
//! - HS-1: the folder holds `config.json` (the original fields, HC-3, with `dtype` set to the
//!   parameter kind and `architectures` set to `*ForCausalLM`, or `*ForTokenClassification`
//!   with one label for a critic), the weights (HW-2) under HF names (HM-1; a tied LM head is
//!   not written, as transformers does), and the tokenizer files of the source folder.
//! - HS-2: saving then loading with the same options gives bit-identical parameters.
//! - HS-3: a model with LoRA adapters saves as the plain model with the adapters merged
//!   (`HfModel::merged`); [`HfModel::save_peft`] writes the unmerged adapters in PEFT's format
//!   (`adapter_config.json` + `adapter_model.safetensors`) instead.
//! - HS-4: [`HfModel::save_untied`] writes a tied model with its head as its own tensor and
//!   `tie_word_embeddings = false`; loaded back it gives the same logits.

use std::path::Path;

use serde_json::{json, Value};

use super::config::Arch;
use super::error::HfError;
use super::model::{dtype_name, HfModel};

/// Files copied verbatim from the source folder when present.
pub const TOKENIZER_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "tokenizer.model",
];

/// PEFT's adapter config file.
pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";
/// PEFT's adapter weights file.
pub const ADAPTER_WEIGHTS_FILE: &str = "adapter_model.safetensors";

/// Default shard size: transformers' `max_shard_size` default is 5 GB.
pub const DEFAULT_MAX_SHARD_BYTES: usize = 5_000_000_000;

impl HfModel {
    /// The config.json to save (HS-1).
    pub fn saved_config(&self) -> Value {
        let mut v = self.cfg.raw.clone();
        let prefix = match self.cfg.arch {
            Arch::Llama => "Llama",
            Arch::Qwen2 => "Qwen2",
            Arch::Qwen3 => "Qwen3",
        };
        if let Value::Object(map) = &mut v {
            map.insert("dtype".into(), json!(dtype_name(self.opts.kind)));
            if map.contains_key("torch_dtype") {
                map.insert("torch_dtype".into(), json!(dtype_name(self.opts.kind)));
            }
            if self.opts.lm_head {
                map.insert(
                    "architectures".into(),
                    json!([format!("{prefix}ForCausalLM")]),
                );
            } else {
                map.insert(
                    "architectures".into(),
                    json!([format!("{prefix}ForTokenClassification")]),
                );
                map.insert("id2label".into(), json!({"0": "LABEL_0"}));
                map.insert("label2id".into(), json!({"LABEL_0": 0}));
            }
        }
        v
    }

    /// Writes the model into `dir` (created if needed) as a transformers folder (HS-1).
    pub fn save_pretrained(&self, dir: &Path) -> Result<(), HfError> {
        self.save_pretrained_sharded(dir, DEFAULT_MAX_SHARD_BYTES)
    }

    /// Like [`HfModel::save_pretrained`] with shards of at most `max_shard_bytes`.
    pub fn save_pretrained_sharded(
        &self,
        dir: &Path,
        max_shard_bytes: usize,
    ) -> Result<(), HfError> {
        self.write_folder(dir, max_shard_bytes, false)
    }

    /// HS-4: like [`HfModel::save_pretrained`], with a tied LM head written as a tensor of its
    /// own (`lm_head.weight`, a copy of the embedding) and `tie_word_embeddings = false`: the
    /// folder an inference engine reloads (vLLM on CPU applies only part of a reload of a tied
    /// model). The logits are the same.
    pub fn save_untied(&self, dir: &Path) -> Result<(), HfError> {
        self.write_folder(dir, DEFAULT_MAX_SHARD_BYTES, true)
    }

    fn write_folder(&self, dir: &Path, max_shard_bytes: usize, untie: bool) -> Result<(), HfError> {
        if self.lora.is_some() {
            // HS-3: a LoRA model is saved merged, as a plain folder.
            return self.merged()?.write_folder(dir, max_shard_bytes, untie);
        }
        std::fs::create_dir_all(dir).map_err(|e| HfError::io(dir, e))?;
        let mut tensors = self.named_parameters();
        let mut config = self.saved_config();
        if untie && self.cfg.tie_word_embeddings && self.opts.lm_head {
            let embed = tensors
                .iter()
                .find(|(n, _)| n == "model.embed_tokens.weight")
                .map(|(_, t)| t.shallow_clone())
                .ok_or_else(|| HfError::input("a tied model without model.embed_tokens.weight"))?;
            tensors.push(("lm_head.weight".into(), embed));
            if let Value::Object(map) = &mut config {
                map.insert("tie_word_embeddings".into(), json!(false));
            }
        }
        super::weights::write_folder(dir, &tensors, max_shard_bytes)?;
        let path = dir.join("config.json");
        let text = serde_json::to_string_pretty(&config).map_err(|source| HfError::Json {
            path: path.clone(),
            source,
        })?;
        std::fs::write(&path, text).map_err(|e| HfError::io(&path, e))?;
        self.copy_tokenizer_files(dir)
    }

    /// Writes the adapters into `dir` in PEFT's format (HS-3): `adapter_config.json` naming
    /// `base` as the base model, `adapter_model.safetensors` (the adapters in their kind under
    /// `base_model.model.<name>`), and the source folder's tokenizer files.
    pub fn save_peft(&self, dir: &Path, base: &str) -> Result<(), HfError> {
        let Some(cfg) = self.lora() else {
            return Err(HfError::input(
                "a PEFT export needs a model with LoRA adapters",
            ));
        };
        std::fs::create_dir_all(dir).map_err(|e| HfError::io(dir, e))?;
        let tensors = self.peft_tensors();
        super::weights::write_tensors(&dir.join(ADAPTER_WEIGHTS_FILE), &tensors)?;
        let path = dir.join(ADAPTER_CONFIG_FILE);
        let config = cfg.peft_config(base, &self.adapted_modules());
        let text = serde_json::to_string_pretty(&config).map_err(|source| HfError::Json {
            path: path.clone(),
            source,
        })?;
        std::fs::write(&path, text).map_err(|e| HfError::io(&path, e))?;
        self.copy_tokenizer_files(dir)
    }

    /// Copies the source folder's tokenizer files into `dir` (when there is a source).
    fn copy_tokenizer_files(&self, dir: &Path) -> Result<(), HfError> {
        if let Some(src) = self.source_dir() {
            for name in TOKENIZER_FILES {
                let from = src.join(name);
                if from.exists() && src != dir {
                    std::fs::copy(&from, dir.join(name)).map_err(|e| HfError::io(&from, e))?;
                }
            }
        }
        Ok(())
    }
}
