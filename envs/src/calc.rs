//! `calc`: tool-integrated arithmetic, the built-in multi-turn environment.
//!
//! The task is an expression of `n_ops` binary operations over operands 1..=9, evaluated left
//! to right without precedence: the prompt `task 3 + 4 * 5 - 2` means `((3 + 4) * 5) - 2`.
//! The agent acts in turns with whitespace-separated words:
//! - `calc A OP B` (A, B vocabulary integers, OP one of `+ - *`) calls the calculator; the
//!   observation is `result R`, or `error out of range` when R leaves `[-99, 999]` (still a
//!   valid action).
//! - `answer N` ends the episode with reward 1 if N is the expression's value, else 0; its
//!   observation is empty.
//! - Anything else is invalid: observation `error invalid action`, the episode continues.
//!
//! The env tracks `progress`, the number of leading operations computed through `calc`, and the
//! running value: a call `V OP X` where V is the running value and `OP X` the next pending
//! operation advances both. The oracle calls `calc {value} {op} {operand}` while operations are
//! pending and then answers `answer {value}`, solving every task in `n_ops + 1` turns.
//!
//! Invariants (beside EN-1..EN-6 of `env`):
//! - CAL-1 `max_turns = n_ops + 2`; the episode ends with reward 0 after that many turns without
//!   an answer. Invalid actions use up turns too.
//! - CAL-2 A number word is valid only in its canonical vocabulary spelling (`7`, not `07`,
//!   `+7` or `7.0`) and inside `[-99, 999]`.
//! - CAL-3 `progress` only grows, by one per correct pending `calc`, and never past `n_ops`;
//!   other valid calls leave the state unchanged apart from the turn count.
//! - CAL-4 Tasks come from `Expression::generate` (see its module for the range and
//!   train/eval-bucket invariants CAL-5, CAL-6).

pub(crate) mod expression;

use serde::{Deserialize, Serialize};

use crate::env::{outcome_of, Env, StepOutcome};
use crate::error::EnvError;
use crate::snapshot::EnvSnapshot;
use expression::{in_range, Expression, Op};

/// Smallest value the calculator, the vocabulary and every intermediate result can hold.
pub const MIN_VALUE: i64 = -99;
/// Largest value the calculator, the vocabulary and every intermediate result can hold.
pub const MAX_VALUE: i64 = 999;
/// Fewest operations a task can have.
pub const MIN_OPS: usize = 1;
/// Most operations a task can have.
pub const MAX_OPS: usize = 4;

const INVALID: &str = "error invalid action";
const KEYWORDS: [&str; 13] = [
    "task", "calc", "answer", "result", "error", "invalid", "action", "out", "of", "range", "+",
    "-", "*",
];

/// The words of `calc`: its keywords, then every integer in `[MIN_VALUE, MAX_VALUE]` (TK-1).
pub fn vocabulary() -> Vec<String> {
    KEYWORDS
        .iter()
        .map(|w| w.to_string())
        .chain((MIN_VALUE..=MAX_VALUE).map(|n| n.to_string()))
        .collect()
}
const OUT_OF_RANGE: &str = "error out of range";

/// Configuration of the `calc` environment.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct CalcConfig {
    /// Operations per task (the difficulty): 1..=4, default 2.
    pub n_ops: usize,
}

impl Default for CalcConfig {
    fn default() -> Self {
        CalcConfig { n_ops: 2 }
    }
}

impl CalcConfig {
    /// Checks that `n_ops` is in `1..=4`.
    pub fn validate(&self) -> Result<(), EnvError> {
        if (MIN_OPS..=MAX_OPS).contains(&self.n_ops) {
            Ok(())
        } else {
            Err(EnvError::InvalidConfig {
                env: "calc",
                field: "n_ops",
                value: self.n_ops.to_string(),
                expected: "an integer in 1..=4",
            })
        }
    }
}

/// The `calc` environment. Until the first `reset` it is terminal (EN-4).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CalcEnv {
    n_ops: usize,
    expr: Expression,
    progress: usize,
    value: i64,
    turns: usize,
    done: bool,
    solved: bool,
}

/// A parsed agent action.
enum Action {
    Calc(i64, Op, i64),
    Answer(i64),
}

impl CalcEnv {
    /// A new environment. `n_ops` outside `1..=4` is clamped into it; call
    /// [`CalcConfig::validate`] first to reject it instead (as [`crate::make_env`] does).
    pub fn new(cfg: CalcConfig) -> Self {
        let n_ops = cfg.n_ops.clamp(MIN_OPS, MAX_OPS);
        let expr = Expression::generate(n_ops, 0);
        CalcEnv {
            n_ops,
            value: expr.first(),
            expr,
            progress: 0,
            turns: 0,
            done: true,
            solved: false,
        }
    }

    /// The value of the current task's expression.
    pub fn answer(&self) -> i64 {
        self.expr.value()
    }

    fn calc(&mut self, a: i64, op: Op, b: i64) -> String {
        let Some(result) = op.apply(a, b).filter(|&r| in_range(r)) else {
            return OUT_OF_RANGE.to_string();
        };
        if a == self.value && self.expr.step(self.progress) == Some((op, b)) {
            self.progress += 1;
            self.value = result;
        }
        format!("result {result}")
    }
}

impl Env for CalcEnv {
    fn name(&self) -> &'static str {
        "calc"
    }

    /// The expression's number of operations: `ops-1` .. `ops-4`.
    fn task_type(&self) -> String {
        format!("ops-{}", self.expr.len())
    }

    fn reset(&mut self, task_seed: u64) -> String {
        self.expr = Expression::generate(self.n_ops, task_seed);
        self.value = self.expr.first();
        self.progress = 0;
        self.turns = 0;
        self.done = false;
        self.solved = false;
        self.expr.prompt()
    }

    fn step(&mut self, action: &str) -> StepOutcome {
        if self.done {
            return outcome_of(self, INVALID.to_string(), 0.0, true, true);
        }
        self.turns += 1;
        let (observation, reward, invalid) = match parse_action(action) {
            None => (INVALID.to_string(), 0.0, true),
            Some(Action::Calc(a, op, b)) => (self.calc(a, op, b), 0.0, false),
            Some(Action::Answer(n)) => {
                self.done = true;
                self.solved = n == self.answer();
                (String::new(), if self.solved { 1.0 } else { 0.0 }, false)
            }
        };
        if self.turns >= self.max_turns() {
            self.done = true;
        }
        outcome_of(self, observation, reward, self.done, invalid)
    }

    fn oracle_action(&self) -> String {
        match self.expr.step(self.progress) {
            Some((op, x)) => format!("calc {} {} {}", self.value, op.symbol(), x),
            None => format!("answer {}", self.value),
        }
    }

    fn max_turns(&self) -> usize {
        self.n_ops + 2
    }

    fn success(&self) -> bool {
        self.solved
    }

    fn vocabulary(&self) -> Vec<String> {
        vocabulary()
    }

    fn admissible_actions(&self) -> Vec<String> {
        if self.done {
            return Vec::new();
        }
        // The running value and the task's operands, combined with every operator and digit,
        // and answers with each of them: a finite slice of the open action space.
        let mut known = vec![self.value, self.expr.first()];
        known.extend((0..self.expr.len()).filter_map(|i| self.expr.step(i).map(|s| s.1)));
        known.sort_unstable();
        known.dedup();
        let mut out = Vec::new();
        for &a in &known {
            for op in ["+", "-", "*"] {
                for b in 1..=9 {
                    out.push(format!("calc {a} {op} {b}"));
                }
            }
        }
        out.extend(known.iter().map(|a| format!("answer {a}")));
        out
    }

    fn anchor_state(&self) -> String {
        format!(
            "calc {} progress {} value {} done {}",
            self.expr.prompt(),
            self.progress,
            self.value,
            self.done
        )
    }

    fn snapshot(&self) -> Result<EnvSnapshot, EnvError> {
        EnvSnapshot::of("calc", self)
    }

    fn restore(&mut self, snapshot: &EnvSnapshot) -> Result<(), EnvError> {
        *self = snapshot.decode("calc")?;
        Ok(())
    }
}

pub(crate) fn parse_calc_call(text: &str) -> Option<(i64, expression::Op, i64)> {
    match parse_action(text)? {
        Action::Calc(a, op, b) => Some((a, op, b)),
        Action::Answer(_) => None,
    }
}

fn parse_action(text: &str) -> Option<Action> {
    let mut words = text.split_whitespace();
    let action = match words.next()? {
        "calc" => {
            let a = parse_number(words.next()?)?;
            let op = Op::parse(words.next()?)?;
            let b = parse_number(words.next()?)?;
            Action::Calc(a, op, b)
        }
        "answer" => Action::Answer(parse_number(words.next()?)?),
        _ => return None,
    };
    words.next().is_none().then_some(action)
}

/// A vocabulary integer in its canonical spelling (CAL-2).
pub(crate) fn parse_number(word: &str) -> Option<i64> {
    if word.len() > 4 {
        return None;
    }
    let n: i64 = word.parse().ok()?;
    (in_range(n) && n.to_string() == word).then_some(n)
}

#[cfg(test)]
mod tests;
