//! `[pats]`: PATS's scaffold bank, the envs crate's own `ScaffoldConfig` (used when
//! `learner.algo = "pats"`); an error of its validation names `pats.<field>`.

use super::key::{at_least, Key, Range, UNIT, UNIT_OPEN_LOW};
use super::ConfigError;

/// The keys of `[pats]`.
pub const KEYS: &[Key] = &[
    Key::new("pats.alpha", UNIT_OPEN_LOW, "PATS: weight of a step's success rate in each task type's EMA."),
    Key::with_also("pats.revise_threshold", UNIT, "<= pats.compress_threshold", "PATS: EMA at or above which a task type's scaffold is revised rather than expanded."),
    Key::with_also("pats.compress_threshold", UNIT, ">= pats.revise_threshold", "PATS: EMA at or above which a task type's scaffold is compressed."),
    Key::new("pats.max_entries", at_least(1), "PATS: entries at which the bank is full (pressure 1: forced prune)."),
    Key::new("pats.max_tokens", at_least(1), "PATS: rendered words at which the bank is full."),
    Key::new("pats.render_words", at_least(1), "PATS: most scaffold words put before one training prompt."),
    Key::new("pats.dedup_jaccard", UNIT_OPEN_LOW, "PATS: word-Jaccard at or above which a proposed entry duplicates an existing one."),
    Key::new("pats.max_entry_words", at_least(1), "PATS: most words of one entry."),
    Key::new("pats.history_len", at_least(1), "PATS: review decisions kept in the persisted scaffold state."),
    Key::new("pats.reviewer_url", Range::Text("empty or http://..."), "PATS: an HTTP reviewer (e.g. an LLM service) that answers each review request with edits (protocol: envs/src/scaffold/http_reviewer.rs); empty = the deterministic rule reviewer. Edits are validated either way."),
    Key::new("pats.reviewer_timeout_ms", at_least(1), "PATS: deadline of one HTTP review; a failed review leaves the bank unchanged and training goes on."),
];

/// Checks `[pats]` through the envs crate's own validation; the error names its key.
pub fn validate(pats: &keel_envs::scaffold::ScaffoldConfig) -> Result<(), ConfigError> {
    pats.validate().map_err(|e| {
        let key = match &e {
            keel_envs::scaffold::ScaffoldError::InvalidConfig { field, .. } => {
                format!("pats.{field}")
            }
            _ => "pats".to_string(),
        };
        ConfigError::OutOfRange {
            key,
            reason: e.to_string(),
        }
    })
}
