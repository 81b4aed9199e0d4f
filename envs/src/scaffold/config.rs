//! [`ScaffoldConfig`]: the PATS constants, with the spec's defaults.

use serde::{Deserialize, Serialize};

use super::error::ScaffoldError;

/// PATS settings. The defaults are the algorithm spec's (§5).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScaffoldConfig {
    /// EMA weight of a step's success rate: `ema ← α·obs + (1−α)·ema` (0.1).
    pub alpha: f64,
    /// EMA at or above which a task type is reviewed in `REVISE` mode (0.3).
    pub revise_threshold: f64,
    /// EMA at or above which a task type is reviewed in `COMPRESS` mode (0.7).
    pub compress_threshold: f64,
    /// Entries at which the bank is full (pressure 1) (30).
    pub max_entries: usize,
    /// Rendered words (≈ tokens for keel's word-level tokenizer) at which the bank is full (2000).
    pub max_tokens: usize,
    /// Most words one rendered scaffold may have (entries past it are left out) (40).
    pub render_words: usize,
    /// Word-Jaccard at or above which a new text duplicates an entry (0.7).
    pub dedup_jaccard: f64,
    /// Most words of one entry's text, marker excluded (16).
    pub max_entry_words: usize,
    /// Mode decisions kept in the persisted history (32).
    pub history_len: usize,
    /// An HTTP reviewer (e.g. an LLM service, protocol in `HttpReviewer`); empty = the
    /// deterministic `RuleReviewer`.
    pub reviewer_url: String,
    /// Deadline of one HTTP review request, in milliseconds.
    pub reviewer_timeout_ms: u64,
}

impl Default for ScaffoldConfig {
    fn default() -> Self {
        ScaffoldConfig {
            alpha: 0.1,
            revise_threshold: 0.3,
            compress_threshold: 0.7,
            max_entries: 30,
            max_tokens: 2000,
            render_words: 40,
            dedup_jaccard: 0.7,
            max_entry_words: 16,
            history_len: 32,
            reviewer_url: String::new(),
            reviewer_timeout_ms: 30_000,
        }
    }
}

fn bad(field: &'static str, value: impl ToString, expected: &'static str) -> ScaffoldError {
    ScaffoldError::InvalidConfig {
        field,
        value: value.to_string(),
        expected,
    }
}

impl ScaffoldConfig {
    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), ScaffoldError> {
        if !(self.alpha > 0.0 && self.alpha <= 1.0) {
            return Err(bad("alpha", self.alpha, "a number in (0, 1]"));
        }
        if !(0.0..=1.0).contains(&self.revise_threshold) {
            return Err(bad(
                "revise_threshold",
                self.revise_threshold,
                "a number in [0, 1]",
            ));
        }
        if !(self.revise_threshold..=1.0).contains(&self.compress_threshold) {
            return Err(bad(
                "compress_threshold",
                self.compress_threshold,
                "a number in [revise_threshold, 1]",
            ));
        }
        if self.max_entries == 0 {
            return Err(bad("max_entries", 0, "a positive integer"));
        }
        if self.max_tokens == 0 {
            return Err(bad("max_tokens", 0, "a positive integer"));
        }
        if self.render_words == 0 {
            return Err(bad("render_words", 0, "a positive integer"));
        }
        if !(self.dedup_jaccard > 0.0 && self.dedup_jaccard <= 1.0) {
            return Err(bad(
                "dedup_jaccard",
                self.dedup_jaccard,
                "a number in (0, 1]",
            ));
        }
        if self.max_entry_words == 0 {
            return Err(bad("max_entry_words", 0, "a positive integer"));
        }
        let url = &self.reviewer_url;
        // The reviewer client has no TLS: an https:// URL would fail on every review.
        if !url.is_empty() && !url.starts_with("http://") {
            return Err(bad(
                "reviewer_url",
                crate::redact_url(url),
                "empty or an http:// URL (the reviewer client has no TLS; put an https service behind a local proxy)",
            ));
        }
        if self.reviewer_timeout_ms == 0 {
            return Err(bad("reviewer_timeout_ms", 0, "a positive integer"));
        }
        Ok(())
    }
}
