//! Errors of the Hugging Face model layer.
//!
//! Invariants:
//! - HE-1: every fallible function under `hf` returns [`HfError`]; nothing read from a model
//!   folder (config, weights, tokenizer, chat template) is `unwrap()`ed.
//! - HE-2: each message names the file, config key or tensor at fault and what was expected.

use std::path::PathBuf;

use crate::error::LearnerError;

/// Everything loading, running, sampling or saving a Hugging Face model can fail with.
#[derive(Debug, thiserror::Error)]
pub enum HfError {
    /// An error reported by libtorch (through tch).
    #[error("torch: {0}")]
    Tch(#[from] tch::TchError),
    /// An error from the rest of the learner crate.
    #[error(transparent)]
    Learner(#[from] LearnerError),
    /// A file of the model folder could not be read or written.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error (in the message; not a separate source, so error chains say it once).
        error: std::io::Error,
    },
    /// A JSON file (config.json, the shard index, tokenizer_config.json) is malformed.
    #[error("{}: {source}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The parse error.
        source: serde_json::Error,
    },
    /// A config.json value is missing, malformed or describes something keel does not support.
    #[error("config.json `{key}`: {reason}")]
    Config {
        /// The config key, e.g. `rope_scaling.rope_type`.
        key: String,
        /// What is wrong and what is supported.
        reason: String,
    },
    /// A weight file is malformed, or a tensor is missing, unexpected or has the wrong shape.
    #[error("weights `{name}`: {reason}")]
    Weights {
        /// The tensor (HF name) or file.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// tokenizer.json or the chat template could not be loaded or applied.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A request, prompt or tensor argument is invalid.
    #[error("invalid input: {0}")]
    Input(String),
}

impl HfError {
    pub(crate) fn config(key: &str, reason: impl Into<String>) -> Self {
        HfError::Config {
            key: key.to_string(),
            reason: reason.into(),
        }
    }
    pub(crate) fn weights(name: &str, reason: impl Into<String>) -> Self {
        HfError::Weights {
            name: name.to_string(),
            reason: reason.into(),
        }
    }
    pub(crate) fn input(reason: impl Into<String>) -> Self {
        HfError::Input(reason.into())
    }
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        HfError::Io {
            path: path.into(),
            error: source,
        }
    }
}

impl From<safetensors::SafeTensorError> for HfError {
    fn from(e: safetensors::SafeTensorError) -> Self {
        HfError::weights("safetensors", e.to_string())
    }
}
