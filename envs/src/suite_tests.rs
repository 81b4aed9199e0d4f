//! The checks every built-in environment must pass, run over all of them and every difficulty:
//! EN-1..EN-9, the oracle solving 100% of held-out tasks, a random policy scoring near 0,
//! snapshot → restore → continue equal to the uninterrupted episode, malformed actions.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::demo::demonstrations;
use crate::env::Env;
use crate::evaluate::{evaluate, oracle_policy, random_policy};
use crate::registry::{build_env, EnvConfig, ENVS};
use crate::snapshot::EnvSnapshot;
use crate::split::{task_seed, Split};
use crate::tokenizer::Tokenizer;

/// Every (built-in env, difficulty).
fn all_configs() -> Vec<EnvConfig> {
    ENVS.iter()
        .filter(|e| e.max_difficulty > 0)
        .flat_map(|e| (1..=e.max_difficulty).map(move |d| EnvConfig::new(e.name, d)))
        .collect()
}

fn env(cfg: &EnvConfig) -> Box<dyn Env> {
    build_env(cfg).unwrap()
}

#[test]
fn oracle_solves_every_held_out_task() {
    for cfg in all_configs() {
        let mut e = env(&cfg);
        let r = evaluate(e.as_mut(), 150, &mut oracle_policy()).expect("oracle eval");
        assert_eq!(
            r.successes, r.episodes,
            "{} d{}: oracle {:?}",
            cfg.name, cfg.difficulty, r
        );
        assert_eq!(r.invalid_rate, 0.0, "{} d{}", cfg.name, cfg.difficulty);
        assert!(
            (r.mean_reward - 1.0).abs() < 1e-9,
            "{} d{}",
            cfg.name,
            cfg.difficulty
        );
    }
}

#[test]
fn random_admissible_policy_scores_near_zero() {
    let mut table = String::new();
    for cfg in all_configs() {
        let mut e = env(&cfg);
        let r = evaluate(e.as_mut(), 200, &mut random_policy(5)).expect("random eval");
        table.push_str(&format!(
            "{:<16} d{} random success {:.3}\n",
            cfg.name,
            cfg.difficulty,
            r.success_rate()
        ));
        assert!(
            r.success_rate() <= 0.15,
            "{} d{}: random {:?}",
            cfg.name,
            cfg.difficulty,
            r
        );
    }
    println!("{table}");
}

#[test]
fn en1_en4_reset_is_deterministic_and_terminal_before_reset() {
    for cfg in all_configs() {
        let mut fresh = env(&cfg);
        let out = fresh.step("anything");
        assert!(
            out.done && out.invalid_action && out.reward == 0.0,
            "{}",
            cfg.name
        );
        assert!(fresh.admissible_actions().is_empty());
        let (mut a, mut b) = (env(&cfg), env(&cfg));
        for i in 0..20 {
            let s = task_seed(Split::Eval, i);
            assert_eq!(a.reset(s), b.reset(s), "{}", cfg.name);
            assert_eq!(a.anchor_key(), b.anchor_key());
            assert_eq!(a.oracle_action(), b.oracle_action());
        }
    }
}

#[test]
fn en6_en9_every_emitted_word_is_in_the_vocabulary_and_oracle_is_admissible() {
    for cfg in all_configs() {
        let mut e = env(&cfg);
        let tok = Tokenizer::for_env(e.as_ref());
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for i in 0..40 {
            let split = if i % 2 == 0 {
                Split::Train
            } else {
                Split::Eval
            };
            let prompt = e.reset(task_seed(split, i));
            tok.encode(&prompt)
                .unwrap_or_else(|err| panic!("{} prompt {prompt:?}: {err}", cfg.name));
            for _ in 0..e.max_turns() {
                let adm = e.admissible_actions();
                let oracle = e.oracle_action();
                assert!(
                    adm.contains(&oracle),
                    "{} d{}: oracle {oracle:?} not in {adm:?}",
                    cfg.name,
                    cfg.difficulty
                );
                for a in &adm {
                    tok.encode(a)
                        .unwrap_or_else(|err| panic!("{} action {a:?}: {err}", cfg.name));
                }
                let action = if rng.gen_bool(0.6) {
                    oracle
                } else {
                    adm[rng.gen_range(0..adm.len())].clone()
                };
                let out = e.step(&action);
                tok.encode(&out.observation)
                    .unwrap_or_else(|err| panic!("{} obs {:?}: {err}", cfg.name, out.observation));
                assert!((0.0..=1.0).contains(&out.reward));
                if out.done {
                    assert_eq!(e.success(), out.reward == 1.0, "{} EN-5", cfg.name);
                    break;
                }
                assert_eq!(out.reward, 0.0, "{} EN-5", cfg.name);
            }
        }
    }
}

#[test]
fn en7_snapshot_restore_continue_equals_uninterrupted() {
    for cfg in all_configs() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        for i in 0..15 {
            let seed = task_seed(Split::Eval, i);
            let mut a = env(&cfg);
            a.reset(seed);
            let cut = rng.gen_range(0..a.max_turns());
            let mut actions = Vec::new();
            let mut stepped = 0;
            let mut snap = None;
            let mut reference = Vec::new();
            for t in 0..a.max_turns() {
                if t == cut {
                    snap =
                        Some(EnvSnapshot::from_bytes(&a.snapshot().unwrap().to_bytes()).unwrap());
                }
                let adm = a.admissible_actions();
                let action = if adm.is_empty() || rng.gen_bool(0.5) {
                    a.oracle_action()
                } else {
                    adm[rng.gen_range(0..adm.len())].clone()
                };
                actions.push(action.clone());
                let out = a.step(&action);
                if t >= cut {
                    reference.push((out, a.oracle_action(), a.anchor_key()));
                }
                stepped += 1;
                if out_done(&reference, t >= cut) || a.admissible_actions().is_empty() {
                    break;
                }
            }
            let Some(snap) = snap else { continue };
            let mut b = env(&cfg);
            b.reset(task_seed(Split::Train, 99)); // a different task, overwritten by restore
            b.restore(&snap).unwrap();
            let resumed: Vec<_> = actions[cut..stepped]
                .iter()
                .map(|act| {
                    let out = b.step(act);
                    (out, b.oracle_action(), b.anchor_key())
                })
                .collect();
            assert_eq!(
                resumed, reference,
                "{} d{} task {i} cut {cut}",
                cfg.name, cfg.difficulty
            );
            assert_eq!(a.success(), b.success());
        }
    }
}

fn out_done(reference: &[(crate::StepOutcome, String, u64)], after_cut: bool) -> bool {
    after_cut && reference.last().is_some_and(|r| r.0.done)
}

#[test]
fn en2_malformed_actions_never_crash_and_are_flagged() {
    let junk = [
        "",
        "   ",
        "\u{0}",
        "ünïcødé ✓",
        "go to",
        "take",
        "put put put",
        "search",
        "answer",
        "click item 1000",
        "select size huge",
        "calc 1 / 0",
        "propose 9999999999999999999999",
        "route nowhere",
        "up up",
        "<eot> <agent>",
        &"x ".repeat(5000),
    ];
    for cfg in all_configs() {
        let mut e = env(&cfg);
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let vocab = e.vocabulary();
        for i in 0..10 {
            e.reset(task_seed(Split::Train, i));
            for j in 0..e.max_turns() {
                let action = if j % 2 == 0 {
                    junk[rng.gen_range(0..junk.len())].to_string()
                } else {
                    (0..rng.gen_range(0..5))
                        .map(|_| vocab[rng.gen_range(0..vocab.len())].clone())
                        .collect::<Vec<_>>()
                        .join(" ")
                };
                let out = e.step(&action);
                if out.invalid_action {
                    assert!(
                        out.observation.starts_with("error") || out.done,
                        "{}: {:?}",
                        cfg.name,
                        out.observation
                    );
                    assert_eq!(out.reward, 0.0);
                }
                if out.done {
                    break;
                }
            }
        }
    }
}

#[test]
fn en8_anchor_keys_group_identical_states() {
    // The group of one task starts from one anchor, and differs across tasks.
    for cfg in all_configs() {
        let mut e = env(&cfg);
        let mut keys = std::collections::HashSet::new();
        for i in 0..30 {
            e.reset(task_seed(Split::Train, i));
            keys.insert(e.anchor_key());
        }
        assert!(
            keys.len() >= 25,
            "{} d{}: {} distinct anchors of 30 tasks",
            cfg.name,
            cfg.difficulty,
            keys.len()
        );
    }
}

#[test]
fn demonstrations_stay_in_the_vocabulary_and_end_on_a_turn_for_every_env() {
    for cfg in all_configs().into_iter().filter(|c| c.difficulty == 2) {
        let mut e = env(&cfg);
        let tok = Tokenizer::for_env(e.as_ref());
        let seeds: Vec<u64> = (0..100).map(|i| task_seed(Split::Train, i)).collect();
        let clean = demonstrations(&mut [e.as_mut()], &tok, &seeds, 0.0, 1).unwrap();
        assert!(clean.iter().all(|d| d.success), "{}", cfg.name);
        let noisy = demonstrations(&mut [e.as_mut()], &tok, &seeds, 0.5, 1).unwrap();
        let ok = noisy.iter().filter(|d| d.success).count();
        assert!(ok < 100, "{}: noise 0.5 never failed", cfg.name);
        for d in &noisy {
            let (last, earlier) = d.turns.split_last().expect("at least one turn");
            assert!(last.observation.is_none(), "{}: DM-1", cfg.name);
            assert!(
                earlier.iter().all(|t| t.observation.is_some()),
                "{}",
                cfg.name
            );
            tok.encode(&d.prompt).expect("prompt in the vocabulary");
            for t in &d.turns {
                tok.encode(&t.action).expect("action in the vocabulary");
                if let Some(o) = &t.observation {
                    tok.encode(o).expect("observation in the vocabulary");
                }
            }
        }
    }
}

#[test]
fn multi_agent_envs_tag_turns_with_agents() {
    let mut e = env(&EnvConfig::new("solver-verifier", 2));
    e.reset(task_seed(Split::Eval, 0));
    let mut agents = vec![e.agent_id()];
    while !e.admissible_actions().is_empty() {
        let out = e.step(&e.oracle_action());
        agents.push(out.agent_id);
    }
    assert_eq!(agents, vec![0, 0, 0, 1, 1]);
    let mut e = env(&EnvConfig::new("search-team", 2));
    e.reset(task_seed(Split::Train, 3));
    let mut agents = vec![e.agent_id()];
    while !e.admissible_actions().is_empty() {
        agents.push(e.step(&e.oracle_action()).agent_id);
    }
    assert_eq!(agents[0], 0);
    assert!(agents.contains(&1) && agents.contains(&2), "{agents:?}");
}
