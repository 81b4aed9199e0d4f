//! Bank edits and their validation: [`Bank::apply`].

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::bank::{visible_together, Bank, Entry, EntryKind};
use super::config::ScaffoldConfig;
use super::reviewer::ReviewRequest;
use super::text::{normalise, unknown_word, word_count, word_jaccard};
use crate::error::quote;
use crate::tokenizer::Tokenizer;

/// One proposed change to the bank. In JSON: `{"op": "add", "kind": "skill", "task_type":
/// "clean", "text": "go to sinkbasin 1", "cites": [3, 7]}`, `{"op": "update", "id": 4, "text":
/// …, "cites": […]}`, `{"op": "delete", "id": 4}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Edit {
    /// A new entry; `task_type: None` makes it general (shown for every type).
    Add {
        /// Skill or mistake.
        kind: EntryKind,
        /// `None` (general) or the task type under review.
        #[serde(default)]
        task_type: Option<String>,
        /// The words after the marker; a leading marker of its own kind is dropped.
        text: String,
        /// Evidence card ids (at least one, all from the request).
        #[serde(default)]
        cites: Vec<u64>,
    },
    /// New text for an existing entry (same kind and task type).
    Update {
        /// The entry.
        id: u64,
        /// The new words after the marker.
        text: String,
        /// Evidence card ids (at least one, all from the request).
        #[serde(default)]
        cites: Vec<u64>,
    },
    /// Removes an entry.
    Delete {
        /// The entry.
        id: u64,
    },
}

/// Why an edit was not applied.
#[derive(Clone, Debug, PartialEq, Serialize, Error)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum RejectReason {
    /// Update/Delete of an id the bank does not hold.
    #[error("no entry {id}")]
    UnknownEntry {
        /// The id.
        id: u64,
    },
    /// The edit touches a task type other than the one under review.
    #[error("task type `{task_type}` is not the one under review (`{reviewing}`)")]
    WrongTaskType {
        /// The edit's (or its entry's) task type.
        task_type: String,
        /// The type under review.
        reviewing: String,
    },
    /// The text has no words.
    #[error("empty text")]
    EmptyText,
    /// The text is longer than `max_entry_words`.
    #[error("{words} words, more than max_entry_words = {max}")]
    TooLong {
        /// Its words.
        words: usize,
        /// The limit.
        max: usize,
    },
    /// A word the env's tokenizer cannot encode (TK-3), or a special token.
    #[error("word `{word}` is not in the env's vocabulary")]
    UnknownWord {
        /// The word (its first 40 characters).
        word: String,
    },
    /// Add/Update without evidence.
    #[error("cites no evidence card")]
    NoCites,
    /// A cited card is not among the request's cards.
    #[error("cites card {id}, which is not among this review's cards")]
    UnknownCard {
        /// The card id.
        id: u64,
    },
    /// The text nearly repeats an entry shown together with it.
    #[error("duplicates entry {of} (word-Jaccard {similarity:.2})")]
    Duplicate {
        /// The existing entry.
        of: u64,
        /// Word-Jaccard of the two texts.
        similarity: f64,
    },
    /// An update to the text the entry already has.
    #[error("the entry already has this text")]
    Unchanged,
    /// The mode's budget for this kind of add is used up.
    #[error("over the {mode_budget} budget of {limit}")]
    OverBudget {
        /// `skills`, `mistakes` or `general`.
        mode_budget: &'static str,
        /// The budget.
        limit: usize,
    },
    /// A `COMPRESS` add without an applied update or delete to pair with.
    #[error("an add in COMPRESS mode must pair with an applied update or delete")]
    Unpaired,
}

/// An applied edit and the entry it touched (the new id for an add).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AppliedEdit {
    /// The edit as proposed.
    pub edit: Edit,
    /// The entry added, updated or deleted.
    pub entry: u64,
}

/// A rejected edit and why.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RejectedEdit {
    /// The edit as proposed.
    pub edit: Edit,
    /// Why it was not applied.
    pub reason: RejectReason,
}

/// What [`Bank::apply`] did; every edit is in exactly one list, updates and deletes first.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ApplyReport {
    /// Applied edits, in the order applied.
    pub applied: Vec<AppliedEdit>,
    /// Rejected edits.
    pub rejected: Vec<RejectedEdit>,
    /// The bank version afterwards.
    pub version: u64,
}

/// The checks every edit of one review shares.
struct Checker<'a> {
    cfg: &'a ScaffoldConfig,
    reviewing: &'a str,
    cards: BTreeSet<u64>,
    vocab: &'a Tokenizer,
}

impl Checker<'_> {
    fn scope(&self, task_type: Option<&str>) -> Result<(), RejectReason> {
        match task_type {
            Some(t) if t != self.reviewing => Err(RejectReason::WrongTaskType {
                task_type: t.to_string(),
                reviewing: self.reviewing.to_string(),
            }),
            _ => Ok(()),
        }
    }

    fn text(&self, kind: EntryKind, text: &str) -> Result<String, RejectReason> {
        let mut text = normalise(text);
        if let Some(rest) = text.strip_prefix(kind.marker()) {
            if rest.is_empty() || rest.starts_with(' ') {
                text = rest.trim_start().to_string();
            }
        }
        if text.is_empty() {
            return Err(RejectReason::EmptyText);
        }
        let words = word_count(&text);
        if words > self.cfg.max_entry_words {
            return Err(RejectReason::TooLong {
                words,
                max: self.cfg.max_entry_words,
            });
        }
        if let Some(w) = unknown_word(&text, self.vocab) {
            return Err(RejectReason::UnknownWord { word: quote(w) });
        }
        Ok(text)
    }

    fn cites(&self, cites: &[u64]) -> Result<(), RejectReason> {
        if cites.is_empty() {
            return Err(RejectReason::NoCites);
        }
        match cites.iter().find(|c| !self.cards.contains(c)) {
            Some(&id) => Err(RejectReason::UnknownCard { id }),
            None => Ok(()),
        }
    }
}

impl Bank {
    /// The first entry (other than `except`) that can render together with an entry of
    /// `task_type` and whose text has word-Jaccard ≥ `threshold` with `text`.
    pub fn find_duplicate(
        &self,
        text: &str,
        task_type: Option<&str>,
        except: Option<u64>,
        threshold: f64,
    ) -> Option<(u64, f64)> {
        self.entries
            .iter()
            .filter(|e| Some(e.id) != except)
            .filter(|e| visible_together(e.task_type.as_deref(), task_type))
            .map(|e| (e.id, word_jaccard(text, &e.text)))
            .find(|&(_, j)| j >= threshold)
    }

    fn position(&self, id: u64, ck: &Checker<'_>) -> Result<usize, RejectReason> {
        let i = self
            .entries
            .iter()
            .position(|e| e.id == id)
            .ok_or(RejectReason::UnknownEntry { id })?;
        ck.scope(self.entries[i].task_type.as_deref())?;
        Ok(i)
    }

    fn try_delete(&mut self, id: u64, ck: &Checker<'_>) -> Result<u64, RejectReason> {
        let i = self.position(id, ck)?;
        self.entries.remove(i);
        Ok(id)
    }

    fn try_update(
        &mut self,
        (id, text, cites): (u64, &str, &[u64]),
        ck: &Checker<'_>,
        version: u64,
    ) -> Result<u64, RejectReason> {
        let i = self.position(id, ck)?;
        let e = &self.entries[i];
        let text = ck.text(e.kind, text)?;
        ck.cites(cites)?;
        if text == e.text {
            return Err(RejectReason::Unchanged);
        }
        if let Some((of, similarity)) = self.find_duplicate(
            &text,
            e.task_type.as_deref(),
            Some(id),
            ck.cfg.dedup_jaccard,
        ) {
            return Err(RejectReason::Duplicate { of, similarity });
        }
        let e = &mut self.entries[i];
        e.text = text;
        e.cites = cites.to_vec();
        e.updated_version = version;
        Ok(id)
    }

    /// Validates `edits` — proposed for `request` (its task type, budget, cards and config) —
    /// against the scope, the text rules, `vocab`, the cited cards, duplicates and the budget,
    /// and applies the valid ones: updates and deletes in order first, then adds in order.
    /// Bumps the version by one when anything was applied (SC-1, SC-3).
    pub fn apply(
        &mut self,
        request: &ReviewRequest,
        edits: &[Edit],
        vocab: &Tokenizer,
    ) -> ApplyReport {
        let ck = Checker {
            cfg: &request.config,
            reviewing: &request.task_type,
            cards: request.cards.iter().map(|c| c.id).collect(),
            vocab,
        };
        let version = self.version + 1;
        let mut report = ApplyReport::default();
        let mut record = |edit: &Edit, result: Result<u64, RejectReason>| match result {
            Ok(entry) => report.applied.push(AppliedEdit {
                edit: edit.clone(),
                entry,
            }),
            Err(reason) => report.rejected.push(RejectedEdit {
                edit: edit.clone(),
                reason,
            }),
        };
        let mut modified = 0;
        for edit in edits {
            let result = match edit {
                Edit::Add { .. } => continue,
                Edit::Delete { id } => self.try_delete(*id, &ck),
                Edit::Update { id, text, cites } => {
                    self.try_update((*id, text, cites), &ck, version)
                }
            };
            modified += usize::from(result.is_ok());
            record(edit, result);
        }
        let budget = request.budget;
        let (mut skills, mut mistakes, mut general, mut adds) = (0, 0, 0, 0);
        for edit in edits {
            let Edit::Add {
                kind,
                task_type,
                text,
                cites,
            } = edit
            else {
                continue;
            };
            let result = (|| {
                if task_type.as_deref() == Some("") {
                    return Err(RejectReason::WrongTaskType {
                        task_type: String::new(),
                        reviewing: ck.reviewing.to_string(),
                    });
                }
                ck.scope(task_type.as_deref())?;
                let text = ck.text(*kind, text)?;
                ck.cites(cites)?;
                if let Some((of, similarity)) =
                    self.find_duplicate(&text, task_type.as_deref(), None, ck.cfg.dedup_jaccard)
                {
                    return Err(RejectReason::Duplicate { of, similarity });
                }
                let (used, limit, name) = match kind {
                    EntryKind::Skill => (&mut skills, budget.skills, "skills"),
                    EntryKind::Mistake => (&mut mistakes, budget.mistakes, "mistakes"),
                };
                if *used >= limit {
                    return Err(RejectReason::OverBudget {
                        mode_budget: name,
                        limit,
                    });
                }
                if task_type.is_none() && general >= budget.general {
                    return Err(RejectReason::OverBudget {
                        mode_budget: "general",
                        limit: budget.general,
                    });
                }
                if budget.paired_adds && adds >= modified {
                    return Err(RejectReason::Unpaired);
                }
                *used += 1;
                general += usize::from(task_type.is_none());
                adds += 1;
                let id = self.next_id;
                self.next_id += 1;
                self.entries.push(Entry {
                    id,
                    kind: *kind,
                    task_type: task_type.clone(),
                    text,
                    cites: cites.clone(),
                    added_version: version,
                    updated_version: version,
                });
                Ok(id)
            })();
            record(edit, result);
        }
        if !report.applied.is_empty() {
            self.version = version;
        }
        report.version = self.version;
        report
    }
}
