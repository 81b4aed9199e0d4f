//! The error type of [`crate::scaffold`]. Every message names what is wrong and what to do.

use thiserror::Error;

/// Everything that can fail in the scaffold library. Edits a reviewer proposes are never errors:
/// invalid ones are rejected with a [`crate::scaffold::RejectReason`] instead.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ScaffoldError {
    /// A [`crate::scaffold::ScaffoldConfig`] value is out of range.
    #[error(
        "invalid scaffold config: {field} = {value}, expected {expected}; fix the `{field}` key"
    )]
    InvalidConfig {
        /// The offending key.
        field: &'static str,
        /// The offending value, as text.
        value: String,
        /// What the key accepts.
        expected: &'static str,
    },
    /// A rollout group handed to `observe_step` is malformed.
    #[error("scaffold: rollout group of task {task_id} (type `{task_type}`): {reason}")]
    InvalidGroup {
        /// The group's task id.
        task_id: u64,
        /// The group's task type.
        task_type: String,
        /// What is wrong.
        reason: String,
    },
    /// `observe_step` was called with a step not after the last observed one.
    #[error("scaffold: step {step} was observed after step {last}; steps must increase (each step updates the EMAs once)")]
    StepNotIncreasing {
        /// The step passed.
        step: u64,
        /// The last step observed.
        last: u64,
    },
    /// Persisted scaffold state could not be read or is inconsistent.
    #[error("invalid scaffold state: {reason}")]
    InvalidState {
        /// What is wrong, naming the field.
        reason: String,
    },
    /// A bank entry holds a word the env's tokenizer does not know (TK-3).
    #[error("scaffold entry {entry} holds `{word}`, which is not in this env's tokenizer vocabulary; the bank belongs to another env")]
    UnknownWord {
        /// The entry id.
        entry: u64,
        /// The word (its first 40 characters).
        word: String,
    },
    /// A reviewer failed (e.g. an LLM reviewer's request); the controller records it and goes on.
    #[error("scaffold reviewer `{reviewer}` failed: {reason}")]
    Reviewer {
        /// The reviewer's name.
        reviewer: String,
        /// What failed.
        reason: String,
    },
}
