//! The environment interface every keel environment implements.
//!
//! An environment is a multi-turn text game: [`Env::reset`] draws a task from a seed and returns
//! the prompt; the agent then answers with actions, each answered by a [`StepOutcome`]. Two kinds
//! implement it: the built-in procedural environments (`calc`, `search-qa`, `household`, `shop`,
//! `sokoban`, `solver-verifier`, `search-team`) and [`crate::external::ExternalEnv`], a client of
//! an environment served over HTTP+JSON by another process.
//!
//! Invariants (every implementation upholds them; `suite_tests` checks the built-in ones):
//! - EN-1 `reset(seed)` is a pure function of `seed` and the config: same seed, same task, same
//!   starting anchor key. The `n` rollouts of one GRPO/GiGPO group reset with one seed and so start
//!   from the same state (group seeding).
//! - EN-2 `step` never panics, whatever the action text; an action that cannot be parsed or is
//!   not allowed in the current state is answered with `invalid_action = true`, reward 0, an
//!   observation starting `error`, and the episode continues.
//! - EN-3 An episode ends (`done = true`) after at most `max_turns()` steps.
//! - EN-4 Once done — and before the first `reset` — every `step` returns `done = true`,
//!   `invalid_action = true` and reward 0, and changes nothing.
//! - EN-5 Reward is 0 on every step except possibly the last, and lies in `[0, 1]`; `success()`
//!   is true exactly when the final reward was 1. The one exception is a dataset env scored by
//!   a user's reward service, whose finite rewards pass through unclamped (DS-5, RC-3).
//! - EN-6 Every string an environment emits (prompts, observations, oracle and admissible
//!   actions) consists of words of its `vocabulary()`.
//! - EN-7 `restore(snapshot())` at any turn boundary, into any instance of the same env, makes the
//!   continuation identical to the uninterrupted episode (observations, rewards, oracle).
//! - EN-8 Two states with equal `anchor_state()` are the same environment state up to the turn
//!   counter; `anchor_key` is a 64-bit FNV-1a hash of it (GiGPO step groups).
//! - EN-9 The oracle action is always among `admissible_actions()` while the episode runs.
//! - EN-10 `task_type()` is a pure function of the current task: known right after `reset`,
//!   unchanged by `step`, equal after a reset with the same seed (PATS groups its success-rate
//!   EMAs and scaffold entries by it, see [`crate::scaffold`]).

use serde::{Deserialize, Serialize};

use crate::error::EnvError;
use crate::snapshot::EnvSnapshot;

/// What the environment answers to one action.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepOutcome {
    /// Text shown to the agent next (may be empty on the final step).
    pub observation: String,
    /// Reward for this step.
    pub reward: f32,
    /// Whether the episode has ended.
    pub done: bool,
    /// Whether the action could not be parsed (or came after the end).
    pub invalid_action: bool,
    /// The agent that acts next (Dr. MAS multi-agent envs; always 0 in single-agent ones).
    #[serde(default)]
    pub agent_id: u32,
    /// Anchor key of the state after this step (EN-8).
    #[serde(default)]
    pub anchor_key: u64,
    /// The canonical text the key hashes ([`Env::anchor_state`]; GiGPO similarity groups).
    #[serde(default)]
    pub anchor_state: String,
    /// The observation as chat messages, when it is not one user message: a function's answer
    /// as a `tool` message (the dataset env, DS-8), every message an agent added since its
    /// last call (the `agent` env); when non-empty it stands for `observation` in the prompt.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<crate::dataset::PromptMessage>,
    /// The observation as raw text the tokenizer encodes as is, no chat template (the `agent`
    /// env's text completions, AGT-8: what a call's prompt adds after the last answer); when
    /// set it stands for `observation` and `messages`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The episode goes on in a new segment (the `agent` env, AGT-3: the agent rewrote its
    /// history): the trajectory so far ends here, and the next turn answers this whole
    /// conversation, rendered as a fresh prompt. It stands for `observation` and `messages`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment: Option<Segment>,
}

/// The conversation a new segment of an episode starts from ([`StepOutcome::segment`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    /// Every message of the conversation, in order (the last is the user's or a tool's).
    pub messages: Vec<crate::dataset::PromptMessage>,
    /// The OpenAI function tools the chat template renders into the prompt.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<serde_json::Value>,
    /// A text-completions segment's whole prompt, encoded raw (AGT-8); when set, `messages`
    /// and `tools` are empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

impl StepOutcome {
    /// The messages the observation adds to the conversation: [`StepOutcome::messages`], or
    /// the one `observation` as a user message.
    pub fn observation_messages(&self) -> Vec<crate::dataset::PromptMessage> {
        if !self.messages.is_empty() {
            return self.messages.clone();
        }
        vec![crate::dataset::PromptMessage {
            tool_calls: Vec::new(),
            role: "user".into(),
            content: self.observation.clone(),
        }]
    }
}

/// One sampled turn as the rollout engine hands it to its env: the raw decoded text and, for
/// envs that ask ([`Env::wants_token_logprobs`]), each content token's text and log-prob.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SampledTurn {
    /// The turn's raw decoded text (what [`Env::try_step_response`] receives).
    pub text: String,
    /// The content tokens (the stop token excluded) with their log-probs under the sampling
    /// distribution at `rollout.temperature`, the ones the learner recomputes; empty unless the
    /// env asked.
    pub tokens: Vec<SampledToken>,
    /// Tokens of the episode before this turn (the prompt the policy saw).
    pub prompt_tokens: usize,
    /// Tokens sampled in this turn, the stop token included.
    pub completion_tokens: usize,
    /// The turn ended at its token limit (`rollout.max_turn_tokens`, or the smaller
    /// [`TurnLimits::max_tokens`]), not at a stop token.
    pub truncated: bool,
    /// The runtime's record of the whole episode so far, this turn included (every segment's
    /// tokens, log-probs and per-token policy versions), for envs that keep it durable
    /// ([`Env::journals`]); empty otherwise. Opaque to envs.
    pub record: Vec<u8>,
}

/// What the env asks of its next sampled turn beyond the run's settings (the `agent` env: a
/// call's own `max_tokens` and `stop`). The default asks nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TurnLimits {
    /// Most tokens of the turn; the run's `rollout.max_turn_tokens` still bounds it.
    pub max_tokens: Option<usize>,
    /// Strings that end the turn once its decoded text contains one (the tokens sampled up to
    /// then are kept and trained; the env decides what text its caller sees).
    pub stop: Vec<String>,
}

/// One sampled token: its text alone and its log-probability.
#[derive(Clone, Debug, PartialEq)]
pub struct SampledToken {
    /// The token decoded alone (a piece of a multi-byte character decodes lossily).
    pub text: String,
    /// Its log-probability.
    pub logprob: f32,
}

impl From<&str> for SampledTurn {
    fn from(text: &str) -> Self {
        SampledTurn {
            text: text.into(),
            ..SampledTurn::default()
        }
    }
}

impl From<String> for SampledTurn {
    fn from(text: String) -> Self {
        SampledTurn {
            text,
            ..SampledTurn::default()
        }
    }
}

/// A multi-turn text environment.
pub trait Env: Send {
    /// Registry name, e.g. `"calc"`.
    fn name(&self) -> &str;
    /// Starts a new episode for the task drawn from `task_seed`; returns the prompt text.
    fn reset(&mut self, task_seed: u64) -> String;
    /// Applies one agent action (see EN-2, EN-4).
    fn step(&mut self, action: &str) -> StepOutcome;
    /// The oracle's next action, computed from the current state (EN-9).
    fn oracle_action(&self) -> String;
    /// The most agent turns an episode can last (a function of the difficulty).
    fn max_turns(&self) -> usize;
    /// Whether the current episode was solved (final reward 1).
    fn success(&self) -> bool;
    /// Every word the env can emit or accept, in a fixed order (the tokenizer is built from it).
    fn vocabulary(&self) -> Vec<String>;
    /// The valid actions in the current state (a finite, representative list where the action
    /// space is open, e.g. numbers); empty once the episode is done.
    fn admissible_actions(&self) -> Vec<String>;
    /// The kind of the current task, e.g. `"clean"` in `household` (EN-10); envs without natural
    /// task types (and [`crate::external::ExternalEnv`]) use their name.
    fn task_type(&self) -> String {
        self.name().to_string()
    }
    /// The messages that come before the prompt in the chat of the current task (a system
    /// prompt, few-shot turns: a dataset row's earlier messages); empty for the built-in envs.
    fn preamble(&self) -> Vec<crate::dataset::PromptMessage> {
        Vec::new()
    }
    /// The function tools of the current task as OpenAI function schemas, which the chat
    /// template renders into the first prompt (a verl tool row's `calc_gsm8k_reward`); empty
    /// for the built-in envs.
    fn tools(&self) -> Vec<serde_json::Value> {
        Vec::new()
    }
    /// The agent that acts next (0 in single-agent envs).
    fn agent_id(&self) -> u32 {
        0
    }
    /// Canonical text of the current state without the turn counter (EN-8).
    fn anchor_state(&self) -> String;
    /// FNV-1a hash of [`Env::anchor_state`].
    fn anchor_key(&self) -> u64 {
        fnv1a64(self.anchor_state().as_bytes())
    }
    /// The complete state at this turn boundary, serializable (EN-7).
    fn snapshot(&self) -> Result<EnvSnapshot, EnvError>;
    /// Replaces the state with a snapshot taken from this kind of env (EN-7).
    fn restore(&mut self, snapshot: &EnvSnapshot) -> Result<(), EnvError>;
    /// [`Env::reset`] for envs that can fail (remote ones); built-ins never do.
    fn try_reset(&mut self, task_seed: u64) -> Result<String, EnvError> {
        Ok(self.reset(task_seed))
    }
    /// [`Env::step`] for envs that can fail (remote ones); built-ins never do.
    fn try_step(&mut self, action: &str) -> Result<StepOutcome, EnvError> {
        Ok(self.step(action))
    }
    /// Applies a model's sampled response: the raw decoded text of its turn (special tokens
    /// dropped, untrimmed, reasoning such as `<think>…</think>` included — verl's
    /// `solution_str`). Envs read its [`crate::action::visible`] text unless they override this
    /// (the dataset env sends the raw text to a reward service). Keel's own actions (oracle,
    /// demonstrations) go through [`Env::step`].
    fn step_response(&mut self, response: &str) -> StepOutcome {
        self.step(crate::action::visible(response))
    }
    /// [`Env::step_response`] for envs that can fail (remote ones, reward services).
    fn try_step_response(&mut self, response: &str) -> Result<StepOutcome, EnvError> {
        self.try_step(crate::action::visible(response))
    }
    /// A sampled turn with what the sampler knows of it; envs that only read text take
    /// [`Env::try_step_response`] of its text. This is what the rollout engine calls.
    fn try_step_turn(&mut self, turn: &SampledTurn) -> Result<StepOutcome, EnvError> {
        self.try_step_response(&turn.text)
    }
    /// Whether [`SampledTurn::tokens`] should be filled for this episode (asked right after
    /// `reset`; decoding every token alone costs, and only the `agent` env returns log-probs to
    /// its callers).
    fn wants_token_logprobs(&self) -> bool {
        false
    }
    /// What the next turn is asked to be (asked after `reset` and after every step that does
    /// not end the episode).
    fn next_turn(&self) -> TurnLimits {
        TurnLimits::default()
    }
    /// Whether the prompt `reset` returned is raw text the model continues, encoded without the
    /// chat template (an agent calling `/v1/completions`, AGT-8). Asked right after `reset`.
    fn prompt_is_text(&self) -> bool {
        false
    }
    /// Whether [`SampledTurn::record`] should be filled for this episode: the env keeps the
    /// runtime's record of the episode durable before it answers (the `agent` env's journal,
    /// AJ-1). Asked right after `reset`.
    fn journals(&self) -> bool {
        false
    }
    /// The episode `reset` took up from an earlier process instead of starting it (AJ-3), once,
    /// right after `reset`.
    fn take_resumed(&mut self) -> Option<Resumed> {
        None
    }
}

/// An episode an env took up from an earlier process's record (AJ-3): the runtime's record of
/// its tokens so far, and how it goes on.
#[derive(Clone, Debug, PartialEq)]
pub struct Resumed {
    /// [`SampledTurn::record`] as it was with the episode's last answered call.
    pub record: Vec<u8>,
    /// How the episode goes on.
    pub next: ResumedNext,
}

/// How a taken-up episode goes on.
#[derive(Clone, Debug, PartialEq)]
pub enum ResumedNext {
    /// Its agent called again: a new segment from the call's whole conversation.
    Segment(Segment),
    /// Its agent ended the episode with this reward: the recorded segments are the episode.
    Ended(f32),
}

/// 64-bit FNV-1a: a stable hash for anchor keys (EN-8).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Builds a [`StepOutcome`] for `env` after its state changed: fills the next agent and anchor.
pub(crate) fn outcome_of(
    env: &dyn Env,
    observation: String,
    reward: f32,
    done: bool,
    invalid_action: bool,
) -> StepOutcome {
    let anchor_state = env.anchor_state();
    StepOutcome {
        observation,
        reward,
        done,
        invalid_action,
        agent_id: env.agent_id(),
        anchor_key: fnv1a64(anchor_state.as_bytes()),
        anchor_state,
        messages: Vec::new(),
        text: None,
        segment: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_is_the_reference_hash() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
