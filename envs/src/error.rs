//! The one error type of `keel-envs`.
//!
//! Every message says what went wrong and what to do about it; tests pin the texts.

use thiserror::Error;

/// Longest prefix of a user-supplied word quoted back in an error message.
const QUOTE_LIMIT: usize = 40;

/// Everything that can fail in `keel-envs`.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum EnvError {
    /// A configuration value is outside its allowed range.
    #[error("invalid {env} config: {field} = {value}, expected {expected}; fix the `{field}` key")]
    InvalidConfig {
        /// The environment whose config is wrong.
        env: &'static str,
        /// The offending key.
        field: &'static str,
        /// The offending value, as text.
        value: String,
        /// What the key accepts.
        expected: &'static str,
    },
    /// A word of the text to encode is not in the tokenizer vocabulary.
    #[error(
        "word `{word}` is not in the tokenizer vocabulary; only environment text can be encoded"
    )]
    UnknownWord {
        /// The word (its first 40 characters).
        word: String,
    },
    /// No environment has the requested name.
    #[error("unknown environment `{name}`; known environments: {known}")]
    UnknownEnv {
        /// The requested name (its first 40 characters).
        name: String,
        /// The known names, comma separated.
        known: String,
    },
    /// A snapshot could not be taken or restored.
    #[error("cannot restore a {env} snapshot: {reason}")]
    Snapshot {
        /// The env restoring (or taking) it.
        env: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An external environment server failed (after the configured retries).
    #[error("external env at {url}: {reason}; check that the server is running and speaks keel's env protocol (envs/external/PROTOCOL.md)")]
    External {
        /// The server's base URL.
        url: String,
        /// What failed.
        reason: String,
    },
    /// A dataset file or one of its rows is unusable (DR-3: file, 1-based row, field).
    #[error("{}", dataset_message(file, *row, field, reason))]
    Dataset {
        /// The file.
        file: String,
        /// The 1-based row (JSONL line) number; 0 for the whole file.
        row: usize,
        /// The dotted path of the field (empty for the whole row or file).
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// An agent episode of the `agent` env failed (AGT-4), or its gateway could not start.
    #[error("agent env: {reason}")]
    Agent {
        /// What failed.
        reason: String,
    },
    /// The reward service of a dataset env failed (after the configured retries).
    #[error("reward service at {url} (env.dataset.reward.url): {reason}; check that it is running and answers GET /health and POST /score (reference: envs/external/reward_server.py)")]
    RewardService {
        /// The service's base URL (credentials redacted).
        url: String,
        /// What failed.
        reason: String,
    },
    /// Demonstrations were asked of no env instance.
    #[error("demonstrations need at least one env instance")]
    NoEnvInstance,
    /// The demonstration noise probability is not in `[0, 1]`.
    #[error("demonstration noise = {noise}, expected a probability in [0, 1]")]
    InvalidNoise {
        /// The offending probability.
        noise: f64,
    },
}

fn dataset_message(file: &str, row: usize, field: &str, reason: &str) -> String {
    match (row, field) {
        (0, _) => format!("dataset {file}: {reason}"),
        (_, "") => format!("dataset {file}, row {row}: {reason}"),
        _ => format!("dataset {file}, row {row}, field `{field}`: {reason}"),
    }
}

/// The first [`QUOTE_LIMIT`] characters of `text`, with `…` when cut, for quoting in errors.
pub(crate) fn quote(text: &str) -> String {
    let mut chars = text.chars();
    let head: String = chars.by_ref().take(QUOTE_LIMIT).collect();
    if chars.next().is_some() {
        format!("{head}…")
    } else {
        head
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_pinned() {
        let e = EnvError::InvalidConfig {
            env: "calc",
            field: "n_ops",
            value: "7".into(),
            expected: "an integer in 1..=4",
        };
        assert_eq!(
            e.to_string(),
            "invalid calc config: n_ops = 7, expected an integer in 1..=4; fix the `n_ops` key"
        );
        let e = EnvError::UnknownWord { word: "foo".into() };
        assert_eq!(
            e.to_string(),
            "word `foo` is not in the tokenizer vocabulary; only environment text can be encoded"
        );
        let e = EnvError::UnknownEnv {
            name: "maze".into(),
            known: "calc".into(),
        };
        assert_eq!(
            e.to_string(),
            "unknown environment `maze`; known environments: calc"
        );
        let e = EnvError::InvalidNoise { noise: 1.5 };
        assert_eq!(
            e.to_string(),
            "demonstration noise = 1.5, expected a probability in [0, 1]"
        );
    }

    #[test]
    fn quote_cuts_long_text() {
        assert_eq!(quote("abc"), "abc");
        let long = "x".repeat(100);
        assert_eq!(quote(&long).chars().count(), QUOTE_LIMIT + 1);
    }
}
