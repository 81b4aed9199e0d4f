//! The bank of skill / mistake entries, its rendering and its pressure.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::config::ScaffoldConfig;
use super::error::ScaffoldError;
use super::mode::pressure;
use super::text::{unknown_word, word_count};
use crate::error::quote;
use crate::tokenizer::{Tokenizer, MISTAKE_MARKER, SKILL_MARKER};

/// What an entry teaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// Something to do; rendered `tip <text>`.
    Skill,
    /// Something to avoid; rendered `avoid <text>`.
    Mistake,
}

impl EntryKind {
    /// The marker word the rendered entry starts with (`tip` / `avoid`).
    pub fn marker(self) -> &'static str {
        match self {
            EntryKind::Skill => SKILL_MARKER,
            EntryKind::Mistake => MISTAKE_MARKER,
        }
    }
}

/// One natural-language entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// Unique in the bank's history; never reused.
    pub id: u64,
    /// Skill or mistake.
    pub kind: EntryKind,
    /// The task type it is shown for; `None` = every type (general).
    pub task_type: Option<String>,
    /// The words after the marker (normalised, vocabulary words).
    pub text: String,
    /// Evidence card ids the last add/update cited.
    pub cites: Vec<u64>,
    /// Bank version that added it.
    pub added_version: u64,
    /// Bank version that last changed its text (= `added_version` until updated).
    pub updated_version: u64,
}

impl Entry {
    /// `tip <text>` or `avoid <text>`.
    pub fn rendered(&self) -> String {
        format!("{} {}", self.kind.marker(), self.text)
    }

    /// Words of [`Entry::rendered`].
    pub fn words(&self) -> usize {
        1 + word_count(&self.text)
    }

    /// Whether it is shown in the scaffold of `task_type`.
    pub fn shown_for(&self, task_type: &str) -> bool {
        self.task_type.as_deref().is_none_or(|t| t == task_type)
    }
}

/// Whether entries of these two task types can appear in one rendered scaffold.
pub(crate) fn visible_together(a: Option<&str>, b: Option<&str>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a == b,
        _ => true,
    }
}

/// A rendered scaffold, ready to prepend to a training prompt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenderedScaffold {
    /// The entries, space separated (empty when nothing is shown).
    pub text: String,
    /// The bank version it was rendered from.
    pub version: u64,
    /// Words of `text`.
    pub words: usize,
}

impl RenderedScaffold {
    /// `"{text} {prompt}"`, or `prompt` unchanged when the scaffold is empty.
    pub fn prepend_to(&self, prompt: &str) -> String {
        if self.text.is_empty() {
            prompt.to_string()
        } else {
            format!("{} {prompt}", self.text)
        }
    }
}

/// The bounded bank of entries (SC-1..SC-4 in the module doc).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Bank {
    pub(crate) version: u64,
    pub(crate) next_id: u64,
    pub(crate) entries: Vec<Entry>,
}

impl Bank {
    /// An empty bank at version 0.
    pub fn new() -> Bank {
        Bank::default()
    }

    /// The version: 0 for a bank never changed, +1 for every change.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The entries, oldest first (ascending id).
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The entry `id`, if present.
    pub fn entry(&self, id: u64) -> Option<&Entry> {
        self.entries.iter().find(|e| e.id == id)
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Words of all rendered entries (the token estimate of the pressure).
    pub fn words(&self) -> usize {
        self.entries.iter().map(Entry::words).sum()
    }

    /// `max(len / max_entries, words / max_tokens)`; at 1 or above the bank is full.
    pub fn pressure(&self, cfg: &ScaffoldConfig) -> f64 {
        pressure(self.len(), self.words(), cfg)
    }

    /// The scaffold of `task_type`: general entries and that type's, skills before mistakes
    /// (each oldest first), cut at the first entry that would pass `max_words`.
    pub fn render(&self, task_type: &str, max_words: usize) -> RenderedScaffold {
        let mut shown: Vec<&Entry> = self
            .entries
            .iter()
            .filter(|e| e.shown_for(task_type))
            .collect();
        // Stable: keeps ascending id within a kind.
        shown.sort_by_key(|e| e.kind);
        let mut parts = Vec::new();
        let mut words = 0;
        for e in shown {
            if words + e.words() > max_words {
                break;
            }
            words += e.words();
            parts.push(e.rendered());
        }
        RenderedScaffold {
            text: parts.join(" "),
            version: self.version,
            words,
        }
    }

    /// Removes the newest entries (highest id) until the pressure is below 1; returns their ids,
    /// newest first. Bumps the version when it removed any.
    pub fn prune_newest(&mut self, cfg: &ScaffoldConfig) -> Vec<u64> {
        let mut removed = Vec::new();
        while self.pressure(cfg) >= 1.0 {
            // Entries are kept in ascending id order, so the newest is last.
            match self.entries.pop() {
                Some(e) => removed.push(e.id),
                None => break,
            }
        }
        if !removed.is_empty() {
            self.version += 1;
        }
        removed
    }

    /// Checks that every entry encodes with `vocab` (TK-3): a bank rendered into a prompt must
    /// consist of the env's words.
    pub fn check_vocabulary(&self, vocab: &Tokenizer) -> Result<(), ScaffoldError> {
        for e in &self.entries {
            if let Some(w) = unknown_word(&e.rendered(), vocab) {
                return Err(ScaffoldError::UnknownWord {
                    entry: e.id,
                    word: quote(w),
                });
            }
        }
        Ok(())
    }

    /// The structural invariants, for loading (SC-1..SC-3).
    pub(crate) fn validate(&self) -> Result<(), String> {
        let mut ids = BTreeSet::new();
        let mut prev: Option<u64> = None;
        for e in &self.entries {
            if !ids.insert(e.id) {
                return Err(format!("bank.entries: id {} appears twice", e.id));
            }
            if prev.is_some_and(|p| p > e.id) {
                return Err(format!(
                    "bank.entries: id {} comes after a larger id; entries are kept in id order",
                    e.id
                ));
            }
            prev = Some(e.id);
            if e.id >= self.next_id {
                return Err(format!(
                    "bank.entries: id {} is not below bank.next_id = {}",
                    e.id, self.next_id
                ));
            }
            if e.added_version == 0
                || e.added_version > e.updated_version
                || e.updated_version > self.version
            {
                return Err(format!(
                    "bank.entries: entry {} has added_version {} and updated_version {}; expected 1 <= added <= updated <= bank.version = {}",
                    e.id, e.added_version, e.updated_version, self.version
                ));
            }
            if e.text.trim().is_empty() || e.text != super::text::normalise(&e.text) {
                return Err(format!(
                    "bank.entries: entry {} has an empty or unnormalised text {:?}",
                    e.id,
                    quote(&e.text)
                ));
            }
            if e.task_type.as_deref() == Some("") {
                return Err(format!(
                    "bank.entries: entry {} has an empty task_type (use null for general)",
                    e.id
                ));
            }
        }
        Ok(())
    }
}
