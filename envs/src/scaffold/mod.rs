//! PATS (Policy-Aware Training Scaffolding), the library half: a bounded bank of skill and
//! mistake entries rendered into the prompts of *training* rollouts, revised after every RL step
//! from the latest policy's rollout groups.
//!
//! Per step the caller (the generator/controller) hands [`ScaffoldController::observe_step`] one
//! [`GroupRecord`] per task (task id, [`crate::Env::task_type`], each rollout's reward, success
//! and turns). The controller
//! 1. turns each group into an [`EvidenceCard`] (id, step, task, per-rollout outcomes, actions,
//!    observations, whether successes contrast failures);
//! 2. updates each seen task type τ's success-rate EMA once:
//!    `ema_τ ← α·obs_τ + (1−α)·ema_τ` (α = 0.1, ema starts at 0), `obs_τ` = mean over this step's
//!    tasks of type τ of the group mean reward;
//! 3. per type τ (in sorted order) picks the [`Mode`] from `ema_τ` and the bank pressure
//!    `max(entries / 30, words / 2000)`: `FORCED_PRUNE` if pressure ≥ 1, else `COMPRESS` if
//!    ema ≥ 0.7, `REVISE` if ema ≥ 0.3, else `EXPAND` — each with a [`Budget`] of adds
//!    (skills / of which general / mistakes: 2/1/1, 1/1/1, 1/1/0 paired, 0/0/0);
//! 4. asks the [`Reviewer`] (default [`RuleReviewer`]; plug in an LLM one) for [`Edit`]s given a
//!    [`ReviewRequest`], validates and applies them with [`Bank::apply`], and after a
//!    `FORCED_PRUNE` review still at pressure ≥ 1 removes the newest entries
//!    ([`Bank::prune_newest`]);
//! 5. returns a [`StepReview`] (mode per type, applied/rejected edits, new version, pressure).
//!
//! Training rollouts of type τ then start from `controller.render(τ).prepend_to(prompt)`;
//! evaluation rollouts use the bare prompt. Entries render as `tip <words>` (skill) and
//! `avoid <words>` (mistake): the markers are the two words every [`crate::Tokenizer`] appends
//! ([`crate::tokenizer::SCAFFOLD_MARKERS`]), the other words are env words (actions and
//! observations, EN-6), so a rendered scaffold always encodes (TK-3).
//! The caller persists [`ScaffoldState::to_json_bytes`] (each bank version is immutable) and
//! resumes with [`ScaffoldState::from_json_bytes`] + [`ScaffoldController::from_state`].
//!
//! Invariants:
//! - SC-1 Bank versions only grow: a new bank is version 0 (renders empty text); every
//!   [`Bank::apply`] that applied an edit and every prune that removed an entry adds exactly 1.
//!   Entry ids are never reused; an entry records the version that added it and last updated it.
//! - SC-2 Every entry's rendered text encodes with the env tokenizer: `apply` rejects unknown
//!   words and special tokens, `from_state` checks a loaded bank ([`Bank::check_vocabulary`]).
//! - SC-3 [`Bank::apply`] applies an edit only if it is in scope (an add's type is `None` or
//!   the type under review; updates and deletes target an existing entry of that type or a
//!   general one), its text is 1..=`max_entry_words` vocabulary words, it cites at least one
//!   card and only cards of the request, it duplicates no entry shown together with it
//!   (word-Jaccard of the texts ≥ `dedup_jaccard`), and it fits the budget (`COMPRESS` adds
//!   need an applied update/delete each). Updates and deletes go first, then adds; every edit
//!   ends in exactly one of `applied` / `rejected`.
//! - SC-4 A review that starts at pressure ≥ 1 is `FORCED_PRUNE` and ends below 1, so the bank
//!   exceeds its limits by at most one review's adds (3 entries).
//! - SC-5 Each step updates the EMA of each type it saw exactly once; steps must increase
//!   (`StepNotIncreasing` otherwise, state untouched); unseen types keep their EMA.
//! - SC-6 [`Bank::render`] shows the general entries and the type's, skills before mistakes,
//!   oldest first, cut at entry granularity to the word budget; its `version` is the bank's.
//! - SC-7 [`ScaffoldState`] JSON carries `format = "keel.scaffold.v1"`; loading validates
//!   (format, ids, versions, EMAs in [0, 1], cites, history) and never panics.
//! - SC-8 The [`RuleReviewer`] is deterministic: the same request yields the same edits.

mod bank;
mod config;
mod controller;
mod edit;
mod error;
mod evidence;
mod http_reviewer;
mod mode;
mod reviewer;
mod state;
mod text;

#[cfg(test)]
mod tests;

pub use bank::{Bank, Entry, EntryKind, RenderedScaffold};
pub use config::ScaffoldConfig;
pub use controller::{ScaffoldController, StepReview, TypeReview};
pub use edit::{AppliedEdit, ApplyReport, Edit, RejectReason, RejectedEdit};
pub use error::ScaffoldError;
pub use evidence::{EpisodeRecord, EvidenceCard, GroupRecord, TurnRecord};
pub use http_reviewer::{parse_review_answer, HttpReviewer};
pub use mode::{ema_update, pressure, Budget, Mode};
pub use reviewer::{ReviewRequest, Reviewer, RuleReviewer};
pub use state::{ModeDecision, ScaffoldState, SCAFFOLD_FORMAT};
pub use text::word_jaccard;
