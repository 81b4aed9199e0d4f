//! The runtime parts a run is built from its configuration: the env config handed to
//! `keel_envs`, local folders of `s3://` models and dataset files, the model specs of the
//! policy and the critic, LoRA, the tokenizer files every checkpoint carries and the chat codec
//! every role renders with, and the preflight of a model folder. The configuration itself
//! (schema, defaults, validation) is `crate::config`; this module only reads it.
//!
//! Invariants:
//! - PT-1: an `s3://` model folder or dataset file maps to one local folder under
//!   `$KEEL_MODEL_CACHE` (default `~/.cache/keel/models`), named from the URL alone, so every
//!   process of a run finds the same synced copy (MC-1..3).

use keel_learner::{ModelSpec, TinyShape};

use crate::config::{ConfigError, EnvSection, ModelSection, TrainConfig};

impl TrainConfig {
    /// The env to build (`keel_envs::make_env`): the external server, dataset or agent section
    /// of the selected env, dataset files mapped to their local copies, and for the agent
    /// gateway the sampling its calls are checked against (GTW-3).
    pub fn env_config(&self) -> keel_envs::EnvConfig {
        let env = &self.env;
        let external = (env.name == "external").then(|| env.external.clone());
        let with_rows = env.name == "dataset" || env.name == "agent";
        let dataset = with_rows.then(|| keel_envs::DatasetConfig {
            train_file: dataset_file(&env.dataset.train_file.to_string_lossy()),
            eval_file: dataset_file(&env.dataset.eval_file.to_string_lossy()),
            ..env.dataset.clone()
        });
        let agent = (env.name == "agent").then(|| keel_envs::AgentConfig {
            sampling: keel_envs::agent::Sampling {
                temperature: self.rollout.temperature,
                max_turn_tokens: self.rollout.max_turn_tokens,
                model: self.run.name.clone(),
            },
            ..env.agent.clone()
        });
        keel_envs::EnvConfig {
            name: env.name.clone(),
            difficulty: env.difficulty,
            external,
            dataset,
            agent,
        }
    }
}

impl EnvSection {
    /// The `s3://` dataset files, each with the local folder its own folder syncs into.
    pub fn remote_dataset_files(&self) -> Vec<(String, std::path::PathBuf)> {
        if self.name != "dataset" && self.name != "agent" {
            return Vec::new();
        }
        let mut folders: Vec<(String, std::path::PathBuf)> = Vec::new();
        for file in [&self.dataset.train_file, &self.dataset.eval_file] {
            let file = file.to_string_lossy();
            if let Some((folder, _)) = split_s3_file(&file) {
                if let Some(dir) = local_model_dir(folder) {
                    if !folders.iter().any(|(f, _)| f == folder) {
                        folders.push((folder.to_string(), dir));
                    }
                }
            }
        }
        folders
    }
}

impl TrainConfig {
    /// The built-in tiny model's shape over `tokenizer`'s vocabulary (MD-1).
    pub fn tiny_shape(&self, tokenizer: &keel_envs::Tokenizer) -> TinyShape {
        let sp = tokenizer.special();
        TinyShape {
            vocab_size: tokenizer.vocab_size(),
            context_len: self.model.context_len,
            n_layer: self.model.n_layer,
            d_model: self.model.d_model,
            n_head: self.model.n_head,
            bos_token_id: sp.bos,
            eos_token_id: sp.eot,
            pad_token_id: sp.pad,
        }
    }

    /// The tokenizer files every checkpoint carries: the model folder's (`model.path`), or the
    /// env's word-level vocabulary as `tokenizer.json` + `tokenizer_config.json` with keel's
    /// chat template (TK-5) for the built-in model.
    pub fn tokenizer_files(
        &self,
        tokenizer: &keel_envs::Tokenizer,
    ) -> Result<Vec<(String, Vec<u8>)>, keel_learner::hf::HfError> {
        use keel_learner::hf::tokenizer::{folder_files, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE};
        if let Some(dir) = self.model_dir() {
            return folder_files(&dir);
        }
        Ok(vec![
            (
                TOKENIZER_FILE.to_string(),
                tokenizer.hf_tokenizer_json().into_bytes(),
            ),
            (
                TOKENIZER_CONFIG_FILE.to_string(),
                tokenizer
                    .hf_tokenizer_config_json(self.model.context_len)
                    .into_bytes(),
            ),
        ])
    }

    /// The chat codec every role renders episodes with (CC-1..4), over the tokenizer files.
    pub fn chat_codec(
        &self,
        tokenizer: &keel_envs::Tokenizer,
    ) -> Result<keel_learner::hf::ChatCodec, keel_learner::hf::HfError> {
        codec_from_files(&self.tokenizer_files(tokenizer)?, &self.model)
    }

    /// The local folder of `model.path`: the path itself, or for `s3://…` its cache folder
    /// under `$KEEL_MODEL_CACHE` (default `~/.cache/keel/models`), which the job syncs first
    /// (MC-1..3); `None` for the built-in model.
    pub fn model_dir(&self) -> Option<std::path::PathBuf> {
        local_model_dir(&self.model.path)
    }

    /// The local folder of `model.critic_path`, like [`TrainConfig::model_dir`]; `None` when
    /// the critic starts from the policy.
    pub fn critic_dir(&self) -> Option<std::path::PathBuf> {
        local_model_dir(&self.model.critic_path)
    }

    /// The LoRA adapters of `[model.lora]` (seeded by the run seed), or None for full
    /// fine-tuning (`rank = 0`).
    pub fn lora_config(&self) -> Option<keel_learner::hf::LoraConfig> {
        let l = &self.model.lora;
        (l.rank > 0).then(|| keel_learner::hf::LoraConfig {
            rank: l.rank,
            alpha: l.alpha,
            dropout: l.dropout,
            target_modules: l.target_modules.clone(),
            seed: self.run.seed,
        })
    }

    /// The separate critic's first weights (`model.critic_path`), or None to copy the policy.
    pub fn critic_spec(
        &self,
        device: tch::Device,
    ) -> Result<Option<ModelSpec>, keel_learner::LearnerError> {
        let Some(dir) = self.critic_dir() else {
            return Ok(None);
        };
        let kind = self
            .model
            .kind()
            .map_err(|e| config_error("model.dtype", e))?;
        Ok(Some(ModelSpec::folder(&dir, device, kind, true)?))
    }

    /// The model every role builds (policy, reference, generators): the folder of
    /// `model.path`, else the tiny model over `tokenizer`'s vocabulary initialised from the run
    /// seed; with a value head when the preset needs a critic. A folder must hold
    /// `model.context_len` positions.
    pub fn model_spec(
        &self,
        tokenizer: &keel_envs::Tokenizer,
        device: tch::Device,
    ) -> Result<ModelSpec, keel_learner::LearnerError> {
        let value_head = self.learner.resolve().policy_value_head();
        let kind = self
            .model
            .kind()
            .map_err(|e| config_error("model.dtype", e))?;
        let Some(dir) = self.model_dir() else {
            let shape = self.tiny_shape(tokenizer);
            let spec = ModelSpec::tiny(&shape, device, self.run.seed, value_head)?;
            return Ok(ModelSpec {
                kind,
                lora: self.lora_config(),
                ..spec
            });
        };
        let spec = ModelSpec {
            lora: self.lora_config(),
            ..ModelSpec::folder(&dir, device, kind, value_head)?
        };
        let positions = spec.config.max_position_embeddings;
        if self.model.context_len > positions {
            return Err(keel_learner::LearnerError::InvalidConfig {
                key: "model.context_len".into(),
                reason: format!(
                    "{} exceeds the {positions} positions of {}",
                    self.model.context_len,
                    dir.display()
                ),
            });
        }
        Ok(spec)
    }

    /// Everything about a local model folder that a run would refuse, checked without loading
    /// a weight and before anything is written (`keel train` before it opens the run root,
    /// `keel data check --model`): config.json (architecture, RoPE), the weights' names and
    /// shapes, `model.context_len` against its positions, the tokenizer and the chat template
    /// (CC-4, CC-5), and the same for `model.critic_path`. A folder still to be synced from
    /// s3:// is checked when the run loads it. Returns the policy folder's config.
    pub fn preflight(
        &self,
    ) -> Result<Option<keel_learner::hf::HfConfig>, keel_learner::LearnerError> {
        use keel_learner::hf::{HfModel, LoadOptions};
        if self.rollout.backend == crate::config::rollout::Backend::Vllm
            && self.model.path.is_empty()
        {
            return Err(keel_learner::LearnerError::InvalidConfig {
                key: "rollout.backend".into(),
                reason: "\"vllm\" needs a model folder (model.path or --model): the server loads its architecture and tokenizer from it".into(),
            });
        }
        let value_head = self.learner.resolve().policy_value_head();
        let local =
            |d: Option<std::path::PathBuf>| d.filter(|_| !self.model.path.starts_with("s3://"));
        let Some(dir) = local(self.model_dir()) else {
            return Ok(None);
        };
        let mut opts = LoadOptions::policy(tch::Device::Cpu, tch::Kind::Float);
        opts.value_head = value_head;
        let cfg = HfModel::check_folder(&dir, opts)?;
        if let Some(memory) = crate::footprint::machine_memory() {
            let shape = crate::footprint::ModelShape::of_folder(&cfg);
            crate::footprint::check_memory(self, &shape, memory).map_err(|e| {
                keel_learner::LearnerError::InvalidConfig {
                    key: "model.path".into(),
                    reason: format!("{}: {e}", dir.display()),
                }
            })?;
        }
        if self.model.context_len > cfg.max_position_embeddings {
            return Err(keel_learner::LearnerError::InvalidConfig {
                key: "model.context_len".into(),
                reason: format!(
                    "{} exceeds the {} positions of {}",
                    self.model.context_len,
                    cfg.max_position_embeddings,
                    dir.display()
                ),
            });
        }
        codec_from_files(
            &keel_learner::hf::tokenizer::folder_files(&dir)?,
            &self.model,
        )?;
        if let Some(critic) = self
            .critic_dir()
            .filter(|_| !self.model.critic_path.starts_with("s3://"))
        {
            HfModel::check_folder(
                &critic,
                LoadOptions::critic(tch::Device::Cpu, tch::Kind::Float),
            )?;
        }
        Ok(Some(cfg))
    }
}

/// A config error as the learner's error type (the key and reason are kept).
fn config_error(key: &str, e: ConfigError) -> keel_learner::LearnerError {
    keel_learner::LearnerError::InvalidConfig {
        key: key.into(),
        reason: match e {
            ConfigError::OutOfRange { reason, .. } => reason,
            other => other.to_string(),
        },
    }
}

/// `s3://bucket/dir/train.parquet` as (`s3://bucket/dir`, `train.parquet`).
fn split_s3_file(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix("s3://")?;
    let cut = rest.rfind('/')?;
    Some((&path[..5 + cut], &rest[cut + 1..]))
}

/// The local path of a dataset file: the path itself, or for `s3://…/FILE` the file in the
/// cache folder its folder syncs into (see [`local_model_dir`]).
fn dataset_file(path: &str) -> std::path::PathBuf {
    match split_s3_file(path).and_then(|(folder, name)| Some(local_model_dir(folder)?.join(name))) {
        Some(local) => local,
        None => std::path::PathBuf::from(path),
    }
}

/// The local folder of a model path: the path itself, or for `s3://…` its cache folder under
/// `$KEEL_MODEL_CACHE` (default `~/.cache/keel/models`); `None` for an empty path.
fn local_model_dir(path: &str) -> Option<std::path::PathBuf> {
    if path.is_empty() {
        return None;
    }
    let Some(rest) = path.strip_prefix("s3://") else {
        return Some(std::path::PathBuf::from(path));
    };
    let root = std::env::var_os("KEEL_MODEL_CACHE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_else(|| ".".into());
            std::path::Path::new(&home).join(".cache/keel/models")
        });
    let name: String = rest
        .trim_end_matches('/')
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '-' | '_' => c,
            _ => '_',
        })
        .collect();
    Some(root.join(format!("s3_{name}")))
}

/// A chat codec from `tokenizer.json` + `tokenizer_config.json` contents (a checkpoint's
/// files, or the built-in model's), rendering with `model`'s template kwargs and check.
pub fn codec_from_files(
    files: &[(String, Vec<u8>)],
    model: &ModelSection,
) -> Result<keel_learner::hf::ChatCodec, keel_learner::hf::HfError> {
    use keel_learner::hf::tokenizer::{TOKENIZER_CONFIG_FILE, TOKENIZER_FILE};
    use keel_learner::hf::{ChatCodec, HfError, HfTokenizer};
    let text = |name: &str| -> Result<&str, HfError> {
        let bytes = files
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, b)| b.as_slice())
            .ok_or_else(|| HfError::Tokenizer(format!("{name} is missing")))?;
        std::str::from_utf8(bytes).map_err(|e| HfError::Tokenizer(format!("{name}: {e}")))
    };
    let tok = HfTokenizer::from_json(text(TOKENIZER_FILE)?, text(TOKENIZER_CONFIG_FILE)?)?
        .with_template_kwargs(model.chat_template_kwargs.clone());
    let name = if model.path.is_empty() {
        "the built-in model"
    } else {
        model.path.as_str()
    };
    ChatCodec::new(tok, model.chat_template_check).map_err(|e| match e {
        HfError::Tokenizer(reason) => HfError::Tokenizer(format!("{name}: {reason}")),
        other => other,
    })
}
