//! The environment interface every keel environment implements.
//!
//! An environment is a multi-turn text game: [`Env::reset`] draws a task from a seed and returns
//! the prompt; the agent then answers with actions, each answered by a [`StepOutcome`].
//!
//! Invariants (every implementation upholds them; `calc` tests them):
//! - EN-1 `reset(seed)` is a pure function of `seed` and the config: same seed, same task.
//! - EN-2 `step` never panics, whatever the action text; an action that cannot be parsed is
//!   answered with `invalid_action = true`, reward 0, and the episode continues.
//! - EN-3 An episode ends (`done = true`) after at most `max_turns()` steps.
//! - EN-4 Once done — and before the first `reset` — every `step` returns `done = true`,
//!   `invalid_action = true` and reward 0, and changes nothing.
//! - EN-5 Reward is 0 on every step except possibly the last; `success()` is true exactly when
//!   the final reward was 1.
//! - EN-6 Every string an environment emits (prompts, observations, oracle actions) consists of
//!   words of its tokenizer's vocabulary.

/// What the environment answers to one action.
#[derive(Clone, Debug, PartialEq)]
pub struct StepOutcome {
    /// Text shown to the agent next (may be empty on the final step).
    pub observation: String,
    /// Reward for this step.
    pub reward: f32,
    /// Whether the episode has ended.
    pub done: bool,
    /// Whether the action could not be parsed (or came after the end).
    pub invalid_action: bool,
}

/// A multi-turn text environment.
pub trait Env: Send {
    /// Short registry name, e.g. `"calc"`.
    fn name(&self) -> &'static str;
    /// Starts a new episode for the task drawn from `task_seed`; returns the prompt text.
    fn reset(&mut self, task_seed: u64) -> String;
    /// Applies one agent action (see EN-2, EN-4).
    fn step(&mut self, action: &str) -> StepOutcome;
    /// The oracle's next action, computed from the current state.
    fn oracle_action(&self) -> String;
    /// The most agent turns an episode can last.
    fn max_turns(&self) -> usize;
    /// Whether the current episode was solved (final reward 1).
    fn success(&self) -> bool;
}
