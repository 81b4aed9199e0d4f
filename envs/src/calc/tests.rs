//! Tests of the `calc` environment, named after the invariants they check.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::split::{task_seed, Split};
use crate::tokenizer::Tokenizer;

fn env(n_ops: usize) -> CalcEnv {
    CalcEnv::new(CalcConfig { n_ops })
}

/// Runs the oracle to the end; returns (success, turns).
fn run_oracle(env: &mut CalcEnv, seed: u64) -> (bool, usize) {
    env.reset(seed);
    let mut turns = 0;
    loop {
        let out = env.step(&env.oracle_action());
        turns += 1;
        assert!(!out.invalid_action);
        if out.done {
            assert_eq!(out.reward, if env.success() { 1.0 } else { 0.0 });
            return (env.success(), turns);
        }
        assert_eq!(out.reward, 0.0);
    }
}

#[test]
fn config_validation() {
    assert_eq!(CalcConfig::default(), CalcConfig { n_ops: 2 });
    for n in 1..=4 {
        assert!(CalcConfig { n_ops: n }.validate().is_ok());
    }
    for n in [0, 5, usize::MAX] {
        assert!(matches!(
            CalcConfig { n_ops: n }.validate(),
            Err(EnvError::InvalidConfig { field: "n_ops", .. })
        ));
    }
    assert_eq!(env(0).max_turns(), 3);
    assert_eq!(env(99).max_turns(), 6);
}

#[test]
fn oracle_solves_every_eval_task_in_n_ops_plus_one_turns() {
    for n_ops in 1..=4 {
        let mut e = env(n_ops);
        for i in 0..500 {
            let (ok, turns) = run_oracle(&mut e, task_seed(Split::Eval, i));
            assert!(ok, "n_ops {n_ops} eval task {i} not solved");
            assert_eq!(turns, n_ops + 1);
        }
    }
}

#[test]
fn oracle_solves_train_tasks() {
    let mut e = env(3);
    for i in 0..500 {
        assert!(run_oracle(&mut e, task_seed(Split::Train, i)).0);
    }
}

#[test]
fn random_policy_scores_near_zero() {
    let tok = Tokenizer::calc();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut e = env(2);
    let episodes = 1_000;
    let mut solved = 0;
    for i in 0..episodes {
        e.reset(task_seed(Split::Eval, i));
        loop {
            let len = rng.gen_range(0..=6);
            let ids: Vec<u32> = (0..len)
                .map(|_| rng.gen_range(4..tok.vocab_size() as u32))
                .collect();
            if e.step(&tok.decode(&ids)).done {
                break;
            }
        }
        solved += e.success() as usize;
    }
    assert!(
        solved * 20 < episodes as usize,
        "random policy solved {solved}/{episodes}"
    );
}

#[test]
fn en1_same_seed_same_prompt() {
    let mut a = env(3);
    let mut b = env(3);
    for i in 0..200 {
        let s = task_seed(Split::Train, i);
        assert_eq!(a.reset(s), b.reset(s));
        assert_eq!(a.answer(), b.answer());
    }
    let prompts: std::collections::HashSet<String> = (0..200)
        .map(|i| a.reset(task_seed(Split::Train, i)))
        .collect();
    assert!(
        prompts.len() > 150,
        "prompts barely vary: {}",
        prompts.len()
    );
}

#[test]
fn en2_malformed_actions_are_invalid_and_never_panic() {
    let garbage: String = (0..10_000)
        .map(|i| char::from(b'!' + (i % 90) as u8))
        .collect();
    let cases = [
        "",
        "   ",
        "calc",
        "calc 1 + ",
        "calc 1 +",
        "answer",
        "answer x",
        "answer 1 2",
        "calc 1 / 2",
        "calc 1 + 2 3",
        "calc + 1 2",
        "CALC 1 + 2",
        "answer 1000",
        "answer -100",
        "answer 07",
        "answer +7",
        "answer 7.0",
        "answer -0",
        "calc 99999999999999999999 + 1",
        "ответ 5",
        "calc １ + 2",
        "answer 5\u{0}",
        "result 3",
        "<eot>",
        "task 1 + 2",
        garbage.as_str(),
    ];
    let mut e = env(4);
    for case in cases {
        e.reset(task_seed(Split::Train, 1));
        let out = e.step(case);
        assert!(out.invalid_action, "{case:?} was accepted");
        assert_eq!(out.observation, "error invalid action");
        assert_eq!(out.reward, 0.0);
        assert!(!out.done);
    }
}

#[test]
fn valid_but_useless_actions_keep_state() {
    let mut e = env(2);
    e.reset(task_seed(Split::Train, 3));
    let oracle = e.oracle_action();
    let out = e.step("calc 999 * 9");
    assert_eq!(out.observation, "error out of range");
    assert!(!out.invalid_action && !out.done);
    let out = e.step("calc -99 - 1");
    assert_eq!(out.observation, "error out of range");
    let out = e.step("calc 999 + 1");
    assert_eq!(out.observation, "error out of range");
    assert_eq!(e.oracle_action(), oracle);
    // The last allowed turn is used up by a (correct) calc: the episode ends unsolved.
    let out = e.step(&oracle);
    assert!(out.observation.starts_with("result "));
    assert!(out.done && !e.success() && out.reward == 0.0);
}

#[test]
fn ce3_progress_needs_the_running_value_and_the_pending_op() {
    let mut e = env(2);
    e.reset(task_seed(Split::Train, 0));
    let first = e.expr.first();
    let (op, x) = e.expr.step(0).unwrap();
    let wrong_a = if first == 1 { 2 } else { first - 1 };
    e.step(&format!("calc {wrong_a} {} {x}", op.symbol()));
    assert_eq!(e.progress, 0);
    e.step(&format!("calc {first}   {}\t{x} ", op.symbol()));
    assert_eq!(e.progress, 1);
    assert_eq!(e.value, op.apply(first, x).unwrap());
    assert!(e.step(&e.oracle_action()).observation.starts_with("result"));
    assert_eq!(e.progress, 2);
    assert_eq!(e.oracle_action(), format!("answer {}", e.answer()));
}

#[test]
fn answering_directly_is_allowed() {
    let mut e = env(3);
    e.reset(task_seed(Split::Eval, 5));
    let out = e.step(&format!("answer {}", e.answer()));
    assert!(out.done && out.reward == 1.0 && e.success() && out.observation.is_empty());
    let mut e = env(3);
    e.reset(task_seed(Split::Eval, 5));
    let out = e.step(&format!("answer {}", e.answer() + 1));
    assert!(out.done && out.reward == 0.0 && !e.success());
}

#[test]
fn ce1_turn_limit_ends_the_episode() {
    for n_ops in 1..=4 {
        let mut e = env(n_ops);
        e.reset(task_seed(Split::Train, 9));
        for t in 1..=n_ops + 2 {
            let out = e.step("nonsense");
            assert_eq!(out.done, t == n_ops + 2);
            assert_eq!(out.reward, 0.0);
        }
        assert!(!e.success());
    }
}

#[test]
fn en4_steps_after_done_and_before_reset_are_inert() {
    let mut e = env(2);
    let out = e.step("answer 1");
    assert!(out.done && out.invalid_action && out.reward == 0.0);
    e.reset(task_seed(Split::Eval, 0));
    e.step(&format!("answer {}", e.answer()));
    assert!(e.success());
    let out = e.step(&format!("answer {}", e.answer()));
    assert!(out.done && out.invalid_action && out.reward == 0.0);
    assert!(
        e.success(),
        "a step after the end must not change the result"
    );
}

#[test]
fn en6_everything_the_env_emits_encodes() {
    let tok = Tokenizer::calc();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for n_ops in 1..=4 {
        let mut e = env(n_ops);
        for i in 0..300 {
            let split = if i % 2 == 0 {
                Split::Train
            } else {
                Split::Eval
            };
            let prompt = e.reset(task_seed(split, i));
            tok.encode(&prompt).unwrap();
            loop {
                let oracle = e.oracle_action();
                tok.encode(&oracle).unwrap();
                // Mix oracle actions with random calls over the whole vocabulary range.
                let action = if rng.gen_bool(0.5) {
                    oracle
                } else {
                    let a = rng.gen_range(MIN_VALUE..=MAX_VALUE);
                    let b = rng.gen_range(MIN_VALUE..=MAX_VALUE);
                    let op = ["+", "-", "*"][rng.gen_range(0..3)];
                    format!("calc {a} {op} {b}")
                };
                let out = e.step(&action);
                tok.encode(&out.observation).unwrap();
                if out.done {
                    break;
                }
            }
        }
    }
    tok.encode(INVALID).unwrap();
    tok.encode(OUT_OF_RANGE).unwrap();
}
