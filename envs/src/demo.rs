//! Oracle demonstrations for the SFT warm start, as text episodes.
//!
//! A demonstration is the env's prompt and, per turn, the action taken and the observation the
//! env answered (none after the last turn). The runtime renders it into model tokens with the
//! same chat codec its generators use (`keel_learner::hf::ChatCodec`): the prompt with the
//! chat template, each action as its tokens plus the end-of-turn token (trained), each
//! observation as the template's next user turn (not trained).
//!
//! With probability `noise`, a turn's oracle action is replaced by a plausible mistake: one
//! integer word of it shifted by a nonzero amount (±1..=5 for a `calc` operand, ±1..=3 for an
//! answer), or, in one mistake out of ten, an invalid action (the oracle action minus its last
//! word). Where that leaves the env's vocabulary (or the oracle action has no number), the
//! mistake is a random admissible action other than the oracle's (one in ten: invalid). The
//! environment answers the mistake for real and the oracle continues from there.
//!
//! Invariants:
//! - DM-1 Every turn but the last has an observation; the last has none (episodes always end
//!   on an agent turn).
//! - DM-2 Demonstrations are a pure function of (environment config, task seeds, noise,
//!   rng seed); the `i`-th uses its own random stream `i`, so it does not depend on the others.
//! - DM-3 With `noise = 0` every demonstration is the oracle's and succeeds.
//! - DM-4 `success` is the environment's verdict at the end of the episode.
//! - DM-5 Sharing the work over several env instances changes nothing but the wall time: the
//!   result is the one a single instance gives, in task-seed order (by DM-2).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::calc::{MAX_VALUE, MIN_VALUE};
use crate::env::Env;
use crate::error::EnvError;
use crate::tokenizer::Tokenizer;

/// Share of mistakes that are invalid actions rather than shifted numbers.
const INVALID_SHARE: f64 = 0.1;

/// One demonstrated turn.
#[derive(Clone, Debug, PartialEq)]
pub struct DemoTurn {
    /// The action taken.
    pub action: String,
    /// The env's answer; `None` after the last turn (DM-1).
    pub observation: Option<String>,
    /// The observation as the chat messages it adds (`StepOutcome::observation_messages`);
    /// empty after the last turn.
    pub messages: Vec<crate::dataset::PromptMessage>,
}

/// One demonstrated episode (text; the runtime renders it into tokens).
#[derive(Clone, Debug, PartialEq)]
pub struct Demonstration {
    /// The messages before the prompt ([`Env::preamble`]; usually none).
    pub preamble: Vec<crate::dataset::PromptMessage>,
    /// The env's first prompt.
    pub prompt: String,
    /// The task's function tools ([`Env::tools`]; usually none), rendered with the prompt.
    pub tools: Vec<serde_json::Value>,
    /// The turns in order.
    pub turns: Vec<DemoTurn>,
    /// Whether the episode was solved.
    pub success: bool,
}

/// One demonstration per task seed (DM-1..DM-5); `noise` is the per-turn mistake probability;
/// `tokenizer` is the env's vocabulary, which mistakes stay inside. The work is shared out over
/// `envs` (instances of one env config), one thread each: demonstration `i` runs on instance
/// `i mod envs.len()`, so an env whose episodes wait on something (an agent program, a server)
/// demonstrates `envs.len()` tasks at once.
pub fn demonstrations(
    envs: &mut [&mut dyn Env],
    tokenizer: &Tokenizer,
    task_seeds: &[u64],
    noise: f64,
    rng_seed: u64,
) -> Result<Vec<Demonstration>, EnvError> {
    if !(0.0..=1.0).contains(&noise) {
        return Err(EnvError::InvalidNoise { noise });
    }
    if envs.is_empty() && !task_seeds.is_empty() {
        return Err(EnvError::NoEnvInstance);
    }
    let workers = envs.len().max(1);
    let mut slots: Vec<Option<Result<Demonstration, EnvError>>> = std::iter::repeat_with(|| None)
        .take(task_seeds.len())
        .collect();
    let demonstrate_share = |w: usize, env: &mut dyn Env| {
        let mut done = Vec::new();
        for i in (w..task_seeds.len()).step_by(workers) {
            let mut rng = ChaCha8Rng::seed_from_u64(rng_seed);
            rng.set_stream(i as u64);
            let demo = demonstrate(env, tokenizer, task_seeds[i], noise, &mut rng);
            let failed = demo.is_err();
            done.push((i, demo));
            if failed {
                break;
            }
        }
        done
    };
    let shares: Vec<Vec<(usize, Result<Demonstration, EnvError>)>> = match envs {
        [env] => vec![demonstrate_share(0, &mut **env)],
        _ => std::thread::scope(|scope| {
            let handles: Vec<_> = envs
                .iter_mut()
                .enumerate()
                .map(|(w, env)| {
                    let share = &demonstrate_share;
                    scope.spawn(move || share(w, &mut **env))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        }),
    };
    for (i, demo) in shares.into_iter().flatten() {
        slots[i] = Some(demo);
    }
    // A share stops at its first error, so the first slot in seed order that is not a
    // demonstration holds an error: collecting stops there.
    slots.into_iter().flatten().collect()
}

fn demonstrate(
    env: &mut dyn Env,
    tokenizer: &Tokenizer,
    task_seed: u64,
    noise: f64,
    rng: &mut ChaCha8Rng,
) -> Result<Demonstration, EnvError> {
    let prompt = env.try_reset(task_seed)?;
    if env.prompt_is_text() {
        return Err(EnvError::Agent {
            reason: "the agent calls /v1/completions: a text episode has no chat turns to demonstrate (set sft.steps = 0, or demonstrate with a chat agent)".into(),
        });
    }
    let preamble = env.preamble();
    let tools = env.tools();
    let mut turns = Vec::new();
    // An env honouring EN-3 is done within max_turns; the bound guards against one that isn't.
    for _ in 0..env.max_turns() {
        let oracle = env.oracle_action();
        let action = if rng.gen_bool(noise) {
            plausible_mistake(env, tokenizer, &oracle, rng)
        } else {
            oracle
        };
        let out = env.try_step(&action)?;
        if out.segment.is_some() {
            return Err(EnvError::Agent {
                reason: "the agent rewrote its history during a demonstration (a segmented episode is not one demonstration sequence)".into(),
            });
        }
        let done = out.done;
        turns.push(DemoTurn {
            action,
            messages: match done {
                true => Vec::new(),
                false => out.observation_messages(),
            },
            observation: (!done).then_some(out.observation),
        });
        if done {
            break;
        }
    }
    Ok(Demonstration {
        preamble,
        prompt,
        tools,
        turns,
        success: env.success(),
    })
}

/// A mistake for `env`: the numeric/invalid [`mistake`] when it stays inside the vocabulary and
/// differs from the oracle, else (in one case of ten an invalid action) a random admissible
/// action other than the oracle's.
fn plausible_mistake(
    env: &dyn Env,
    tokenizer: &Tokenizer,
    oracle: &str,
    rng: &mut ChaCha8Rng,
) -> String {
    let numeric = oracle.split_whitespace().any(|w| w.parse::<i64>().is_ok());
    if numeric {
        let m = mistake(oracle, rng);
        if m != oracle && tokenizer.encode(&m).is_ok() {
            return m;
        }
    }
    let others: Vec<String> = env
        .admissible_actions()
        .into_iter()
        .filter(|a| a != oracle)
        .collect();
    if others.is_empty() || rng.gen_bool(INVALID_SHARE) {
        let mut words: Vec<&str> = oracle.split_whitespace().collect();
        words.pop();
        return words.join(" ");
    }
    others[rng.gen_range(0..others.len())].clone()
}

/// A plausible mistake derived from the oracle's action (see the module doc).
fn mistake(oracle: &str, rng: &mut ChaCha8Rng) -> String {
    let mut words: Vec<String> = oracle.split_whitespace().map(str::to_string).collect();
    let numbers: Vec<usize> = (0..words.len())
        .filter(|&i| words[i].parse::<i64>().is_ok())
        .collect();
    if numbers.is_empty() || rng.gen_bool(INVALID_SHARE) {
        words.pop();
        return words.join(" ");
    }
    let at = numbers[rng.gen_range(0..numbers.len())];
    let max_shift = if words.first().map(String::as_str) == Some("answer") {
        3
    } else {
        5
    };
    let shift = rng.gen_range(1..=max_shift) * if rng.gen_bool(0.5) { 1 } else { -1 };
    let n = words[at].parse::<i64>().unwrap_or(0);
    let shifted = if (MIN_VALUE..=MAX_VALUE).contains(&(n + shift)) {
        n + shift
    } else {
        n - shift
    };
    words[at] = shifted.to_string();
    words.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calc::{CalcConfig, CalcEnv};
    use crate::split::{task_seed, Split};

    fn seeds(n: u64) -> Vec<u64> {
        (0..n).map(|i| task_seed(Split::Train, i)).collect()
    }

    /// Checks DM-1 and DM-4 by replaying the demonstration in the env; returns its turns.
    fn check_replay(env: &mut CalcEnv, seed: u64, d: &Demonstration) -> usize {
        assert_eq!(env.reset(seed), d.prompt);
        for (k, turn) in d.turns.iter().enumerate() {
            let out = env.step(&turn.action);
            let last = k + 1 == d.turns.len();
            assert_eq!(out.done, last, "turn {k}");
            assert_eq!(
                turn.observation.as_deref(),
                (!last).then_some(&out.observation[..])
            );
        }
        assert_eq!(env.success(), d.success);
        d.turns.len()
    }

    #[test]
    fn dm3_noiseless_demonstrations_succeed_and_replay() {
        let tok = Tokenizer::calc();
        for n_ops in 1..=4 {
            let mut env = CalcEnv::new(CalcConfig { n_ops });
            let seeds = seeds(100);
            let demos = demonstrations(&mut [&mut env], &tok, &seeds, 0.0, 1).unwrap();
            assert_eq!(demos.len(), seeds.len());
            for (d, &seed) in demos.iter().zip(&seeds) {
                assert!(d.success);
                assert_eq!(check_replay(&mut env, seed, d), n_ops + 1);
            }
        }
    }

    #[test]
    fn noisy_demonstrations_sometimes_fail_and_replay() {
        let tok = Tokenizer::calc();
        let mut env = CalcEnv::new(CalcConfig { n_ops: 2 });
        let seeds = seeds(300);
        let demos = demonstrations(&mut [&mut env], &tok, &seeds, 0.3, 2).unwrap();
        let solved = demos.iter().filter(|d| d.success).count();
        assert!(solved > 60 && solved < 270, "solved {solved}/300");
        for (d, &seed) in demos.iter().zip(&seeds) {
            check_replay(&mut env, seed, d);
        }
        let all_noise = demonstrations(&mut [&mut env], &tok, &seeds, 1.0, 2).unwrap();
        assert!(all_noise.iter().all(|d| !d.success));
    }

    #[test]
    fn dm2_deterministic_and_independent_per_task() {
        let tok = Tokenizer::calc();
        let mut env = CalcEnv::new(CalcConfig { n_ops: 3 });
        let seeds = seeds(50);
        let a = demonstrations(&mut [&mut env], &tok, &seeds, 0.3, 9).unwrap();
        let b = demonstrations(&mut [&mut env], &tok, &seeds, 0.3, 9).unwrap();
        assert_eq!(a, b);
        let prefix = demonstrations(&mut [&mut env], &tok, &seeds[..10], 0.3, 9).unwrap();
        assert_eq!(&a[..10], &prefix[..]);
        let c = demonstrations(&mut [&mut env], &tok, &seeds, 0.3, 10).unwrap();
        assert_ne!(a, c);
    }

    #[test]
    fn dm5_sharing_over_instances_changes_nothing() {
        let tok = Tokenizer::calc();
        let seeds = seeds(23);
        let mut one = CalcEnv::new(CalcConfig { n_ops: 3 });
        let alone = demonstrations(&mut [&mut one], &tok, &seeds, 0.3, 9).unwrap();
        let mut envs: Vec<CalcEnv> = (0..4)
            .map(|_| CalcEnv::new(CalcConfig { n_ops: 3 }))
            .collect();
        let mut refs: Vec<&mut dyn Env> = envs.iter_mut().map(|e| e as &mut dyn Env).collect();
        let shared = demonstrations(&mut refs, &tok, &seeds, 0.3, 9).unwrap();
        assert_eq!(alone, shared);
        assert!(matches!(
            demonstrations(&mut [], &tok, &seeds, 0.3, 9),
            Err(EnvError::NoEnvInstance)
        ));
    }

    #[test]
    fn mistakes_are_plausible() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let (mut invalid, mut shifted) = (0, 0);
        for _ in 0..1_000 {
            let m = mistake("calc 999 * 9", &mut rng);
            assert_ne!(m, "calc 999 * 9");
            match m.split_whitespace().collect::<Vec<_>>()[..] {
                ["calc", a, "*", b] => {
                    let (a, b): (i64, i64) = (a.parse().unwrap(), b.parse().unwrap());
                    assert!((a == 999) != (b == 9));
                    assert!((994..=999).contains(&a) && (4..=14).contains(&b));
                    shifted += 1;
                }
                ["calc", "999", "*"] => invalid += 1,
                _ => panic!("unexpected mistake {m:?}"),
            }
            let m = mistake("answer -99", &mut rng);
            assert!(
                m == "answer"
                    || ["-98", "-97", "-96"]
                        .iter()
                        .any(|n| m == format!("answer {n}"))
            );
        }
        assert!(invalid > 50 && shifted > 800);
    }

    #[test]
    fn noise_must_be_a_probability() {
        let tok = Tokenizer::calc();
        let mut env = CalcEnv::new(CalcConfig::default());
        for noise in [-0.1, 1.1, f64::NAN] {
            assert!(matches!(
                demonstrations(&mut [&mut env], &tok, &[1], noise, 0),
                Err(EnvError::InvalidNoise { .. })
            ));
        }
    }
}
