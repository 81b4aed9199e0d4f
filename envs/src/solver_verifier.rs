//! `solver-verifier`: two-agent tool-integrated math for Dr. MAS (a solver proposes, a verifier
//! accepts or sends back, bounded loops).
//!
//! The task is a `calc` expression (`task 3 + 4 * 5 solver turn`). Agent 0, the solver, acts with
//! `calc A OP B` (the calculator answers `result R` and the solver keeps the turn) and
//! `propose N` (the turn passes: `proposal N verifier turn`). Agent 1, the verifier, may also
//! `calc`, and ends its turn with `accept` (the episode ends: reward 1 iff the proposal is the
//! expression's value) or `reject` (`rejected solver turn`). After [`MAX_LOOPS`] rejections the
//! episode ends, judged on the last proposal.
//!
//! The difficulty (1..=4) is the number of operations; `max_turns = n_ops + 2 + 2·MAX_LOOPS`.
//!
//! Invariants (beside EN-1..EN-9):
//! - VR-1 Every turn is tagged with the agent who takes it ([`Env::agent_id`] before the step;
//!   `StepOutcome::agent_id` is the next one); invalid actions keep the turn with the same agent.
//! - VR-2 The oracle solver computes with `calc` and proposes the value; the oracle verifier
//!   accepts exactly the correct proposals, so the oracle pair succeeds in `n_ops + 2` turns and
//!   recovers from any wrong proposal while loops remain.

use serde::{Deserialize, Serialize};

use crate::calc::expression::{in_range, Expression};
use crate::calc::{parse_calc_call, parse_number, MAX_OPS, MIN_OPS};
use crate::env::{outcome_of, Env, StepOutcome};
use crate::error::EnvError;
use crate::lexicon::WordList;
use crate::search_qa::INVALID;
use crate::snapshot::EnvSnapshot;

/// Rejections before the episode ends.
pub const MAX_LOOPS: usize = 2;
/// Agent id of the solver.
pub const SOLVER: u32 = 0;
/// Agent id of the verifier.
pub const VERIFIER: u32 = 1;

/// The `solver-verifier` environment. Until the first `reset` it is terminal (EN-4).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SolverVerifierEnv {
    n_ops: usize,
    expr: Expression,
    progress: usize,
    value: i64,
    agent: u32,
    proposal: Option<i64>,
    loops: usize,
    turns: usize,
    done: bool,
    solved: bool,
}

/// The words of `solver-verifier` (TK-1): `calc`'s, then the protocol words.
pub fn vocabulary() -> Vec<String> {
    let mut w = WordList::default();
    w.extend(crate::calc::vocabulary());
    w.extend_text(["propose accept reject proposal solver verifier turn rejected"]);
    w.into_vec()
}

impl SolverVerifierEnv {
    /// A new env with `n_ops` operations per task (clamped to 1..=4).
    pub fn new(n_ops: usize) -> Self {
        let n_ops = n_ops.clamp(MIN_OPS, MAX_OPS);
        let expr = Expression::generate(n_ops, 0);
        SolverVerifierEnv {
            n_ops,
            value: expr.first(),
            expr,
            progress: 0,
            agent: SOLVER,
            proposal: None,
            loops: 0,
            turns: 0,
            done: true,
            solved: false,
        }
    }

    fn calc(&mut self, a: i64, op: crate::calc::expression::Op, b: i64) -> String {
        let Some(r) = op.apply(a, b).filter(|&r| in_range(r)) else {
            return "error out of range".into();
        };
        if self.agent == SOLVER && a == self.value && self.expr.step(self.progress) == Some((op, b))
        {
            self.progress += 1;
            self.value = r;
        }
        format!("result {r}")
    }

    fn apply(&mut self, action: &str) -> Option<(String, f32)> {
        if let Some((a, op, b)) = parse_calc_call(action) {
            return Some((self.calc(a, op, b), 0.0));
        }
        let words: Vec<&str> = action.split_whitespace().collect();
        match (self.agent, &words[..]) {
            (SOLVER, ["propose", n]) => {
                let n = parse_number(n)?;
                self.proposal = Some(n);
                self.agent = VERIFIER;
                Some((format!("proposal {n} verifier turn"), 0.0))
            }
            (VERIFIER, ["accept"]) => Some(self.finish()),
            (VERIFIER, ["reject"]) => {
                self.loops += 1;
                if self.loops >= MAX_LOOPS {
                    return Some(self.finish());
                }
                self.agent = SOLVER;
                Some(("rejected solver turn".into(), 0.0))
            }
            _ => None,
        }
    }

    fn finish(&mut self) -> (String, f32) {
        self.done = true;
        self.solved = self.proposal == Some(self.expr.value());
        (String::new(), if self.solved { 1.0 } else { 0.0 })
    }
}

impl Env for SolverVerifierEnv {
    fn name(&self) -> &str {
        "solver-verifier"
    }

    /// The expression's number of operations: `ops-1` .. `ops-4`.
    fn task_type(&self) -> String {
        format!("ops-{}", self.expr.len())
    }

    fn reset(&mut self, task_seed: u64) -> String {
        *self = SolverVerifierEnv::new(self.n_ops);
        self.expr = Expression::generate(self.n_ops, task_seed);
        self.value = self.expr.first();
        self.done = false;
        format!("{} solver turn", self.expr.prompt())
    }

    fn step(&mut self, action: &str) -> StepOutcome {
        if self.done {
            return outcome_of(self, INVALID.into(), 0.0, true, true);
        }
        self.turns += 1;
        let (obs, reward, invalid) = match self.apply(action) {
            Some((obs, r)) => (obs, r, false),
            None => (INVALID.to_string(), 0.0, true),
        };
        if self.turns >= self.max_turns() {
            self.done = true;
        }
        outcome_of(self, obs, reward, self.done, invalid)
    }

    fn oracle_action(&self) -> String {
        match self.agent {
            SOLVER => match self.expr.step(self.progress) {
                Some((op, x)) => format!("calc {} {} {}", self.value, op.symbol(), x),
                None => format!("propose {}", self.value),
            },
            _ if self.proposal == Some(self.expr.value()) => "accept".into(),
            _ => "reject".into(),
        }
    }

    fn max_turns(&self) -> usize {
        self.n_ops + 2 + 2 * MAX_LOOPS
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
        let mut known = vec![self.value, self.expr.first()];
        known.extend(self.proposal);
        known.sort_unstable();
        known.dedup();
        let mut out: Vec<String> = known
            .iter()
            .flat_map(|a| {
                ["+", "-", "*"]
                    .into_iter()
                    .flat_map(move |op| (1..=9).map(move |b| format!("calc {a} {op} {b}")))
            })
            .collect();
        match self.agent {
            SOLVER => out.extend(known.iter().map(|v| format!("propose {v}"))),
            _ => out.extend(["accept".to_string(), "reject".to_string()]),
        }
        out
    }

    fn agent_id(&self) -> u32 {
        self.agent
    }

    fn anchor_state(&self) -> String {
        format!(
            "{} agent {} progress {} value {} proposal {:?} loops {} done {}",
            self.expr.prompt(),
            self.agent,
            self.progress,
            self.value,
            self.proposal,
            self.loops,
            self.done
        )
    }

    fn snapshot(&self) -> Result<EnvSnapshot, EnvError> {
        EnvSnapshot::of("solver-verifier", self)
    }

    fn restore(&mut self, snapshot: &EnvSnapshot) -> Result<(), EnvError> {
        *self = snapshot.decode("solver-verifier")?;
        Ok(())
    }
}
