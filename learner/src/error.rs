//! The learner's error type.
//!
//! Invariants:
//! - LE-1: every fallible public function of this crate returns `LearnerError`; nothing that a
//!   config, a stored batch or a checkpoint file can break is `unwrap()`ed.
//! - LE-2: each message names the offending key, tensor or file and says what was expected.

/// Everything the learner can fail with.
#[derive(Debug, thiserror::Error)]
pub enum LearnerError {
    /// An error reported by libtorch (through tch).
    #[error("torch: {0}")]
    Tch(#[from] tch::TchError),
    /// A safetensors buffer could not be written or parsed.
    #[error("safetensors: {0}")]
    Safetensors(#[from] safetensors::SafeTensorError),
    /// A JSON state file could not be written or parsed.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    /// The Hugging Face model layer failed (config.json, weights, tokenizer, forward).
    #[error(transparent)]
    Hf(Box<crate::hf::HfError>),
    /// A collective between learner ranks failed (a peer died or hung, a mismatched rank).
    #[error(transparent)]
    Collective(#[from] crate::collective::CollectiveError),
    /// A configuration value is out of range; `key` is the config key, e.g. `learner.lr`.
    #[error("{key} {reason}")]
    InvalidConfig {
        /// The config key, e.g. `learner.lr` or `model.n_head`.
        key: String,
        /// What is wrong, including the offending value.
        reason: String,
    },
    /// A batch, a sampling context or a tensor argument has the wrong shape or content.
    #[error("invalid input: {reason}")]
    InvalidInput {
        /// What is wrong and what was expected.
        reason: String,
    },
    /// A loss or gradient norm was NaN or infinite; the optimizer step was skipped.
    #[error("non-finite {what}: the optimizer step was skipped and the weights were left unchanged; lower the learning rate or inspect the batch")]
    NonFinite {
        /// Which quantity, e.g. `loss` or `gradient norm`.
        what: String,
    },
    /// A stored tensor or state file does not match what this model or optimizer expects.
    #[error("`{name}`: {reason}")]
    Mismatch {
        /// The tensor or file name.
        name: String,
        /// What differs (missing, unexpected, shape, dtype, ...).
        reason: String,
    },
}

impl From<crate::hf::HfError> for LearnerError {
    fn from(e: crate::hf::HfError) -> Self {
        LearnerError::Hf(Box::new(e))
    }
}

impl LearnerError {
    /// Shorthand for [`LearnerError::InvalidConfig`].
    pub(crate) fn config(key: &str, reason: impl Into<String>) -> Self {
        LearnerError::InvalidConfig {
            key: key.to_string(),
            reason: reason.into(),
        }
    }

    /// Shorthand for [`LearnerError::InvalidInput`].
    pub(crate) fn input(reason: impl Into<String>) -> Self {
        LearnerError::InvalidInput {
            reason: reason.into(),
        }
    }

    /// Shorthand for [`LearnerError::Mismatch`].
    pub(crate) fn mismatch(name: &str, reason: impl Into<String>) -> Self {
        LearnerError::Mismatch {
            name: name.to_string(),
            reason: reason.into(),
        }
    }
}
