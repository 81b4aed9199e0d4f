//! keel against a real external env process: the Python reference server
//! (`envs/external/reference_server.py`) on a free loopback port, driven through `ExternalEnv`
//! and through an env shard (EX-1..EX-3, ES-3, ES-4, EN-2, EN-7).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use actix::{Actor, Supervisor};
use keel_actors::env_shard::{
    EnvFactory, EnvShard, EpisodeError, ResetEpisodes, ShardOptions, StepEpisodes,
};
use keel_actors::supervision::RestartBudget;
use keel_envs::evaluate::{evaluate, oracle_policy};
use keel_envs::{build_env, Env, EnvConfig, ExternalConfig, ExternalEnv, LatencyModel, Tokenizer};

/// The reference server as a child process, killed on drop.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../envs/external/reference_server.py"
        );
        let mut child = Command::new("python3")
            .arg(script)
            .args(["--port", "0"])
            .args(extra)
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 must be installed to run the external-env tests");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("server banner");
        let port = line
            .trim()
            .strip_prefix("listening on ")
            .expect("`listening on PORT`")
            .to_string();
        Server {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    fn config(&self) -> ExternalConfig {
        ExternalConfig {
            url: self.url.clone(),
            timeout_ms: 2_000,
            retries: 3,
            backoff_ms: 5,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn oracle_vocabulary_and_malformed_actions_over_http() {
    let server = Server::start(&[]);
    let mut env = ExternalEnv::connect(server.config()).expect("connect");
    assert_eq!(env.name(), "guess");
    assert_eq!(env.max_turns(), 7);
    let tok = Tokenizer::for_env(&env);
    let report = evaluate(&mut env, 30, &mut oracle_policy());
    assert_eq!(report.successes, 30, "{report:?}");
    let prompt = env.reset(5);
    tok.encode(&prompt).expect("prompt in the vocabulary");
    // Six malformed actions of the seven turns: each is invalid, none ends the episode.
    for junk in [
        "",
        "guess 0",
        "guess 65",
        "guess 007",
        "ünï ✓",
        &"x".repeat(10_000),
    ] {
        let out = env.step(junk);
        assert!(
            out.invalid_action && out.observation.starts_with("error") && !out.done,
            "{:?}: {out:?}",
            &junk[..junk.len().min(20)]
        );
    }
    assert!(env.admissible_actions().contains(&env.oracle_action()));
}

#[test]
fn snapshot_restore_continue_equals_uninterrupted_over_http() {
    let server = Server::start(&[]);
    let mut a = ExternalEnv::connect(server.config()).expect("connect");
    a.reset(42);
    a.step("guess 3");
    let snap = a.snapshot().expect("snapshot");
    let mut b = ExternalEnv::connect(server.config()).expect("connect");
    b.restore(&snap).expect("restore");
    assert_eq!(a.anchor_key(), b.anchor_key());
    for _ in 0..6 {
        let act = a.oracle_action();
        assert_eq!(act, b.oracle_action());
        let (oa, ob) = (a.step(&act), b.step(&act));
        assert_eq!(oa, ob);
        if oa.done {
            break;
        }
    }
    assert!(a.success() && b.success());
    let wrong = keel_envs::EnvSnapshot {
        env: "calc".into(),
        state: snap.state.clone(),
    };
    assert!(b.restore(&wrong).is_err());
}

#[test]
fn retries_make_a_flaky_server_transparent() {
    // Every third request fails with 503; retries (EX-1) and idempotent steps (EX-2) hide it.
    let server = Server::start(&["--flaky", "3"]);
    let mut env = ExternalEnv::connect(server.config()).expect("connect despite 503s");
    let report = evaluate(&mut env, 20, &mut oracle_policy());
    assert_eq!(report.successes, 20, "{report:?}");
}

#[test]
fn external_env_in_a_builtin_registry_config() {
    let server = Server::start(&[]);
    let cfg = EnvConfig {
        name: "external".into(),
        difficulty: 1,
        external: Some(server.config()),
    };
    let env = build_env(&cfg).expect("build");
    assert_eq!(
        keel_envs::tokenizer_for(&cfg)
            .expect("tokenizer")
            .vocab_size(),
        // The special tokens, the env's words, then the two PATS scaffold markers.
        4 + env.vocabulary().len() + keel_envs::tokenizer::SCAFFOLD_MARKERS.len()
    );
}

/// Binary search over the shard's answers: the shard hosts many remote episodes at once.
#[test]
fn env_shard_drives_the_server_concurrently_and_survives_its_death() {
    let server = Server::start(&[]);
    let cfg = server.config();
    let factory: EnvFactory = Arc::new(move || {
        Box::new(ExternalEnv::connect(cfg.clone()).expect("connect")) as Box<dyn Env>
    });
    let system = actix::System::new();
    system.block_on(async move {
        let budget = RestartBudget::new("env_shard", 4);
        let options = ShardOptions {
            concurrency: 8,
            latency: LatencyModel::Lognormal {
                median_ms: 5.0,
                sigma: 1.0,
                cap_ms: 50.0,
            },
        };
        let (f, b) = (factory.clone(), budget.clone());
        let shard = Supervisor::start(move |_| {
            EnvShard::with_options(f.clone(), b.clone(), options.clone())
        });
        let n = 16u64;
        let prompts = shard
            .send(ResetEpisodes((0..n).map(|e| (e, 100 + e)).collect()))
            .await
            .expect("mailbox");
        assert!(prompts
            .iter()
            .all(|p| p.as_ref().is_ok_and(|t| t.prompt.starts_with("task guess"))));
        let mut bounds: Vec<(u32, u32)> = vec![(1, 64); n as usize];
        let mut solved = 0;
        let mut live: Vec<u64> = (0..n).collect();
        for _ in 0..7 {
            let guesses: Vec<(u64, String)> = live
                .iter()
                .map(|&e| {
                    let (lo, hi) = bounds[e as usize];
                    (e, format!("guess {}", (lo + hi) / 2))
                })
                .collect();
            let outs = shard
                .send(StepEpisodes(guesses.clone()))
                .await
                .expect("mailbox");
            let mut next = Vec::new();
            for ((e, _), out) in guesses.iter().zip(outs) {
                let out = out.expect("served");
                let (lo, hi) = bounds[*e as usize];
                let mid = (lo + hi) / 2;
                match out.observation.as_str() {
                    _ if out.done => solved += usize::from(out.reward == 1.0),
                    "higher" => {
                        bounds[*e as usize] = (mid + 1, hi);
                        next.push(*e);
                    }
                    "lower" => {
                        bounds[*e as usize] = (lo, mid - 1);
                        next.push(*e);
                    }
                    other => panic!("unexpected observation {other:?}"),
                }
            }
            live = next;
            if live.is_empty() {
                break;
            }
        }
        assert_eq!(solved, n as usize);
        // Kill the server mid-episode: those episodes fail (ES-4), the shard keeps serving.
        let prompts = shard
            .send(ResetEpisodes(vec![(100, 1), (101, 2)]))
            .await
            .expect("mailbox");
        assert!(prompts.iter().all(Result::is_ok));
        drop(server);
        let outs = shard
            .send(StepEpisodes(vec![
                (100, "guess 32".into()),
                (101, "guess 32".into()),
            ]))
            .await
            .expect("mailbox");
        for out in outs {
            match out {
                Err(EpisodeError::Failed(_, msg)) => {
                    assert!(msg.contains("external env at"), "{msg}")
                }
                other => panic!("expected a failed episode, got {other:?}"),
            }
        }
        assert_eq!(budget.used(), 0, "an env error is not a restart");
        let again = shard
            .send(StepEpisodes(vec![(7, "guess 1".into())]))
            .await
            .expect("the shard still serves");
        assert_eq!(again, vec![Err(EpisodeError::Lost(7))]);
    });
}

#[test]
fn latency_model_makes_a_shard_step_cost_its_slowest_episode() {
    let factory: EnvFactory = Arc::new(|| keel_envs::make_env("calc", 1).expect("calc"));
    let system = actix::System::new();
    system.block_on(async move {
        let latency = LatencyModel::Pareto {
            scale_ms: 20.0,
            alpha: 1.2,
            cap_ms: 200.0,
        };
        let slowest = (0..32u64)
            .map(|e| latency.delay(e, 1))
            .max()
            .expect("episodes");
        let options = ShardOptions {
            concurrency: 32,
            latency,
        };
        let shard =
            EnvShard::with_options(factory, RestartBudget::new("env_shard", 1), options).start();
        shard
            .send(ResetEpisodes((0..32).map(|e| (e, e)).collect()))
            .await
            .expect("mailbox");
        let t = std::time::Instant::now();
        let outs = shard
            .send(StepEpisodes(
                (0..32).map(|e| (e, "answer 1".into())).collect(),
            ))
            .await
            .expect("mailbox");
        let took = t.elapsed();
        assert_eq!(outs.len(), 32);
        assert!(took >= slowest, "{took:?} < slowest {slowest:?}");
        assert!(
            took < slowest * 3 + std::time::Duration::from_millis(200),
            "not concurrent: {took:?} vs slowest {slowest:?}"
        );
    });
}
