//! Generation of `calc` tasks: left-to-right arithmetic expressions over single digits.
//!
//! `generate(n_ops, seed)` seeds a ChaCha8 generator with the task seed, draws the first operand
//! from 1..=9, then for each operation draws an operator from `+ - *` and an operand from 1..=9,
//! redrawing that step while the new running value falls outside `[MIN_VALUE, MAX_VALUE]`.
//! The whole expression is then redrawn (same generator) until its bucket matches the seed's
//! split: fingerprint ≡ 0 (mod 10) is the eval-only bucket.
//!
//! Invariants:
//! - CAL-5 Every intermediate value (hence the answer) lies in `[MIN_VALUE, MAX_VALUE]`.
//! - CAL-6 Expressions of train seeds are never in the eval bucket; expressions of eval seeds
//!   always are (barring 1000 misses in a row, probability 0.9^1000). So the two expression
//!   sets are disjoint, at the cost of eval covering a tenth of the space: 17 distinct
//!   expressions (of 243) at `n_ops = 1`, about 650 at `n_ops = 2`, thousands beyond.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{MAX_VALUE, MIN_VALUE};
use crate::split::{mix64, Split};

/// Redraws of the whole expression before the split bucket is given up on (see CAL-6).
const MAX_REDRAWS: usize = 1000;
/// `1 / EVAL_BUCKETS` of the expression space is eval-only.
const EVAL_BUCKETS: u64 = 10;

/// A binary operator of the calculator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) enum Op {
    Add,
    Sub,
    Mul,
}

impl Op {
    const ALL: [Op; 3] = [Op::Add, Op::Sub, Op::Mul];

    pub(crate) fn symbol(self) -> &'static str {
        match self {
            Op::Add => "+",
            Op::Sub => "-",
            Op::Mul => "*",
        }
    }

    pub(crate) fn parse(word: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|op| op.symbol() == word)
    }

    /// `a op b`, or `None` on i64 overflow (impossible for vocabulary operands).
    pub(crate) fn apply(self, a: i64, b: i64) -> Option<i64> {
        match self {
            Op::Add => a.checked_add(b),
            Op::Sub => a.checked_sub(b),
            Op::Mul => a.checked_mul(b),
        }
    }

    fn code(self) -> u64 {
        match self {
            Op::Add => 1,
            Op::Sub => 2,
            Op::Mul => 3,
        }
    }
}

/// Whether `v` is a value the calculator (and the vocabulary) can express.
pub(crate) fn in_range(v: i64) -> bool {
    (MIN_VALUE..=MAX_VALUE).contains(&v)
}

/// `first op₁ x₁ op₂ x₂ …`, evaluated left to right.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Expression {
    first: i64,
    steps: Vec<(Op, i64)>,
}

impl Expression {
    /// The task of `seed` with `n_ops` operations (CAL-5, CAL-6).
    pub(crate) fn generate(n_ops: usize, seed: u64) -> Expression {
        let want_eval = Split::of_seed(seed) == Split::Eval;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut expr = Expression::draw(n_ops, &mut rng);
        for _ in 1..MAX_REDRAWS {
            if expr.in_eval_bucket() == want_eval {
                break;
            }
            expr = Expression::draw(n_ops, &mut rng);
        }
        expr
    }

    fn draw(n_ops: usize, rng: &mut ChaCha8Rng) -> Expression {
        let first = rng.gen_range(1..=9);
        let mut value = first;
        let mut steps = Vec::with_capacity(n_ops);
        while steps.len() < n_ops {
            let op = Op::ALL[rng.gen_range(0..Op::ALL.len())];
            let x = rng.gen_range(1..=9);
            // Some step is always in range (`- 1` unless at MIN_VALUE, where `+ 1` works).
            if let Some(next) = op.apply(value, x).filter(|&v| in_range(v)) {
                value = next;
                steps.push((op, x));
            }
        }
        Expression { first, steps }
    }

    /// Number of operations.
    pub(crate) fn len(&self) -> usize {
        self.steps.len()
    }

    pub(crate) fn first(&self) -> i64 {
        self.first
    }

    /// The `i`-th operation, if any.
    pub(crate) fn step(&self, i: usize) -> Option<(Op, i64)> {
        self.steps.get(i).copied()
    }

    /// The value, evaluated left to right.
    pub(crate) fn value(&self) -> i64 {
        self.steps
            .iter()
            .fold(self.first, |v, &(op, x)| op.apply(v, x).unwrap_or(v))
    }

    /// `task 3 + 4 * 5 - 2`.
    pub(crate) fn prompt(&self) -> String {
        let mut text = format!("task {}", self.first);
        for (op, x) in &self.steps {
            text.push_str(&format!(" {} {}", op.symbol(), x));
        }
        text
    }

    /// A stable hash of the expression (independent of std's hasher).
    pub(crate) fn fingerprint(&self) -> u64 {
        let words = std::iter::once(self.steps.len() as u64)
            .chain(std::iter::once(self.first as u64))
            .chain(self.steps.iter().flat_map(|&(op, x)| [op.code(), x as u64]));
        words.fold(0, |h, w| mix64(h ^ w))
    }

    // `u64::is_multiple_of` needs Rust 1.87; the workspace supports 1.85.
    #[allow(clippy::manual_is_multiple_of)]
    pub(crate) fn in_eval_bucket(&self) -> bool {
        self.fingerprint() % EVAL_BUCKETS == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::split::task_seed;
    use std::collections::HashSet;

    #[test]
    fn left_to_right_value_and_prompt() {
        let e = Expression {
            first: 3,
            steps: vec![(Op::Add, 4), (Op::Mul, 5), (Op::Sub, 2)],
        };
        assert_eq!(e.value(), 33);
        assert_eq!(e.prompt(), "task 3 + 4 * 5 - 2");
    }

    #[test]
    fn ex1_intermediates_stay_in_range() {
        for n_ops in 1..=4 {
            for i in 0..2_000 {
                let e = Expression::generate(n_ops, task_seed(Split::Train, i));
                assert_eq!(e.steps.len(), n_ops);
                assert!((1..=9).contains(&e.first));
                let mut v = e.first;
                for &(op, x) in &e.steps {
                    assert!((1..=9).contains(&x));
                    v = op.apply(v, x).unwrap();
                    assert!(in_range(v), "{} leaves the range", e.prompt());
                }
            }
        }
    }

    #[test]
    fn ex2_train_and_eval_expressions_are_disjoint() {
        for n_ops in 1..=4 {
            let mut train = HashSet::new();
            let mut eval = HashSet::new();
            for i in 0..3_000 {
                let t = Expression::generate(n_ops, task_seed(Split::Train, i));
                let e = Expression::generate(n_ops, task_seed(Split::Eval, i));
                assert!(!t.in_eval_bucket());
                assert!(e.in_eval_bucket());
                train.insert(t.prompt());
                eval.insert(e.prompt());
            }
            assert!(train.is_disjoint(&eval));
            assert!(
                eval.len() >= 15,
                "n_ops {n_ops}: only {} eval expressions",
                eval.len()
            );
        }
    }
}
