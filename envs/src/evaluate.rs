//! Policy evaluation on held-out tasks: the oracle, a random policy, or any closure (a model),
//! with the success rate's 95% Wilson confidence interval.
//!
//! Invariants:
//! - EE-1 Evaluation uses eval-split seeds `task_seed(Eval, 0..n)` only, one episode per task.
//! - EE-2 The random policy picks uniformly among `admissible_actions()` with its own seeded
//!   generator: a pure function of (env, seeds, rng seed).
//! - EE-3 Episodes are bounded by `max_turns()` even for an env that never says done.
//! - An env that fails (an external server gone) ends the evaluation with its error
//!   (`try_reset`/`try_step`), never a panic.
//!
//! Model policies are evaluated by `keel_actors::eval` (the generator's engine); this module
//! runs the oracle and the random policy.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::env::Env;
use crate::error::EnvError;
use crate::split::{task_seed, Split};

/// What an acting policy sees: the prompt and every (action, observation) so far.
#[derive(Clone, Debug, Default)]
pub struct Transcript {
    /// The prompt of the episode.
    pub prompt: String,
    /// Turns taken: the action text and the observation that answered it.
    pub turns: Vec<(String, String)>,
}

/// The result of one episode.
#[derive(Clone, Debug, PartialEq)]
pub struct EpisodeResult {
    /// Whether the env reported success.
    pub success: bool,
    /// Sum of rewards.
    pub reward: f64,
    /// Turns taken.
    pub turns: usize,
    /// Turns whose action was invalid.
    pub invalid: usize,
}

/// Aggregate of an evaluation.
#[derive(Clone, Debug, PartialEq)]
pub struct EvalReport {
    /// Episodes run.
    pub episodes: usize,
    /// Successful episodes.
    pub successes: usize,
    /// Mean episode reward.
    pub mean_reward: f64,
    /// Share of invalid turns.
    pub invalid_rate: f64,
}

impl EvalReport {
    /// Success rate.
    pub fn success_rate(&self) -> f64 {
        self.successes as f64 / self.episodes.max(1) as f64
    }

    /// 95% Wilson score interval of the success rate.
    pub fn ci95(&self) -> (f64, f64) {
        wilson(self.successes, self.episodes)
    }
}

/// The 95% Wilson score interval for `k` successes in `n` trials (`(0, 1)` for `n = 0`).
pub fn wilson(k: usize, n: usize) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let (z, n_f) = (1.959_963_984_540_054_f64, n as f64);
    let p = k as f64 / n_f;
    let denom = 1.0 + z * z / n_f;
    let centre = (p + z * z / (2.0 * n_f)) / denom;
    let half = z * (p * (1.0 - p) / n_f + z * z / (4.0 * n_f * n_f)).sqrt() / denom;
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

/// Runs one episode of task `seed` with `act` choosing each action (EE-3).
pub fn run_episode(
    env: &mut dyn Env,
    seed: u64,
    act: &mut dyn FnMut(&dyn Env, &Transcript) -> String,
) -> Result<EpisodeResult, EnvError> {
    let mut transcript = Transcript {
        prompt: env.try_reset(seed)?,
        turns: Vec::new(),
    };
    let mut result = EpisodeResult {
        success: false,
        reward: 0.0,
        turns: 0,
        invalid: 0,
    };
    for _ in 0..env.max_turns() {
        let action = act(&*env, &transcript);
        let out = env.try_step(&action)?;
        result.turns += 1;
        result.reward += f64::from(out.reward);
        result.invalid += usize::from(out.invalid_action);
        transcript.turns.push((action, out.observation));
        if out.done {
            break;
        }
    }
    result.success = env.success();
    Ok(result)
}

/// Evaluates `act` on the first `n` held-out tasks (EE-1).
pub fn evaluate(
    env: &mut dyn Env,
    n: usize,
    act: &mut dyn FnMut(&dyn Env, &Transcript) -> String,
) -> Result<EvalReport, EnvError> {
    let mut report = EvalReport {
        episodes: 0,
        successes: 0,
        mean_reward: 0.0,
        invalid_rate: 0.0,
    };
    let (mut turns, mut invalid) = (0usize, 0usize);
    for i in 0..n as u64 {
        let r = run_episode(env, task_seed(Split::Eval, i), act)?;
        report.episodes += 1;
        report.successes += usize::from(r.success);
        report.mean_reward += r.reward;
        turns += r.turns;
        invalid += r.invalid;
    }
    report.mean_reward /= n.max(1) as f64;
    report.invalid_rate = invalid as f64 / turns.max(1) as f64;
    Ok(report)
}

/// The oracle as a policy.
pub fn oracle_policy() -> impl FnMut(&dyn Env, &Transcript) -> String {
    |env: &dyn Env, _: &Transcript| env.oracle_action()
}

/// A uniformly random admissible action (EE-2).
pub fn random_policy(seed: u64) -> impl FnMut(&dyn Env, &Transcript) -> String {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    move |env: &dyn Env, _: &Transcript| {
        let actions = env.admissible_actions();
        if actions.is_empty() {
            return String::new();
        }
        actions[rng.gen_range(0..actions.len())].clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wilson_matches_reference_values() {
        let (lo, hi) = wilson(50, 100);
        assert!(
            (lo - 0.4038).abs() < 1e-3 && (hi - 0.5962).abs() < 1e-3,
            "{lo} {hi}"
        );
        let (lo, hi) = wilson(100, 100);
        assert!((lo - 0.963).abs() < 1e-3 && hi == 1.0);
        assert_eq!(wilson(0, 0), (0.0, 1.0));
    }
}
