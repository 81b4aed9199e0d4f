//! keel against a real external env process: the Python reference server
//! (`envs/external/reference_server.py`) on a free loopback port, driven through `ExternalEnv`
//! and through an env shard (EX-1..EX-3, ES-3, ES-4, EN-2, EN-7).

use std::process::Command;
use std::sync::Arc;

use actix::{Actor, Supervisor};
use keel_actors::env_shard::{
    request_all, EnvAnswer, EnvFactory, EnvOp, EnvReply, EnvShard, EpisodeError, ShardOptions,
};
use keel_actors::supervision::RestartBudget;
use keel_envs::evaluate::{evaluate, oracle_policy};
use keel_envs::{build_env, Env, EnvConfig, ExternalConfig, ExternalEnv, LatencyModel, Tokenizer};
use keel_integration::PythonServer;

/// The reference server as a child process, killed on drop.
struct Server(PythonServer);

impl std::ops::Deref for Server {
    type Target = PythonServer;

    fn deref(&self) -> &PythonServer {
        &self.0
    }
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        Server(PythonServer::start("reference_server.py", extra))
    }

    fn config(&self) -> ExternalConfig {
        ExternalConfig {
            url: self.url.clone(),
            timeout_ms: 2_000,
            retries: 3,
            backoff_ms: 5,
            ..ExternalConfig::default()
        }
    }
}

#[test]
fn oracle_vocabulary_and_malformed_actions_over_http() {
    let server = Server::start(&[]);
    let mut env = ExternalEnv::connect(server.config()).expect("connect");
    assert_eq!(env.name(), "guess");
    assert_eq!(env.max_turns(), 7);
    let tok = Tokenizer::for_env(&env);
    let report = evaluate(&mut env, 30, &mut oracle_policy()).expect("oracle eval");
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
    let report = evaluate(&mut env, 20, &mut oracle_policy()).expect("oracle eval");
    assert_eq!(report.successes, 20, "{report:?}");
}

#[test]
fn external_env_in_a_builtin_registry_config() {
    let server = Server::start(&[]);
    let cfg = EnvConfig {
        name: "external".into(),
        difficulty: 1,
        external: Some(server.config()),
        ..EnvConfig::default()
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

/// EX-4/EX-5: a bearer token from the environment opens a server that requires one; no token
/// is a clear 401, and an answer over `max_response_bytes` is refused.
#[test]
fn bearer_token_from_the_environment_and_the_response_size_limit() {
    let server = Server::start(&["--auth-token", "s3cret"]);
    let refused = ExternalEnv::connect(server.config())
        .err()
        .expect("no token, no entry");
    assert!(refused.to_string().contains("HTTP 401"), "{refused}");
    // A variable name unique to this test (nextest runs each test in its own process).
    std::env::set_var("KEEL_TEST_ENV_TOKEN_EX4", "s3cret");
    let cfg = ExternalConfig {
        auth_env: "KEEL_TEST_ENV_TOKEN_EX4".into(),
        ..server.config()
    };
    let client = keel_envs::ExternalClient::connect(cfg.clone()).expect("token accepted");
    let (mut a, mut b) = (client.env(), client.env());
    assert!(a.try_reset(3).expect("reset a").starts_with("task guess"));
    assert!(b.try_reset(4).is_ok());
    let unset = ExternalConfig {
        auth_env: "KEEL_TEST_ENV_TOKEN_UNSET".into(),
        ..server.config()
    };
    let err = ExternalEnv::connect(unset).err().expect("unset variable");
    assert!(err.to_string().contains("auth_env"), "{err}");
    let tiny = ExternalConfig {
        max_response_bytes: 64,
        ..cfg
    };
    let err = ExternalEnv::connect(tiny).err().expect("a large /info");
    assert!(
        err.to_string()
            .contains("larger than max_response_bytes (64)"),
        "{err}"
    );
}

/// EX-6: an `/info` answer keel cannot use is refused with the field it got wrong.
#[test]
fn an_unusable_info_answer_is_refused() {
    for (turns, expected) in [
        ("0", "max_turns 0 must be in 1..=10000"),
        ("20000", "max_turns 20000"),
    ] {
        let server = Server::start(&["--info-max-turns", turns]);
        let err = ExternalEnv::connect(server.config())
            .err()
            .expect("refused");
        assert!(err.to_string().contains(expected), "{err}");
    }
}

/// Runs the tiny GRPO job on `server` with `sft_steps` of SFT warm start (0: none), which must
/// fail; returns its error with the cause chain.
fn failed_job(server: &Server, sft_steps: u64) -> String {
    let toml = keel_integration::MethodRun::new("grpo")
        .toml()
        .replace(
            "name = \"calc\"",
            &format!(
                "name = \"external\"\nexternal = {{ url = \"{}\", retries = 1, timeout_ms = 2000 }}",
                server.url
            ),
        )
        .replace("[sft]\nsteps = 120", &format!("[sft]\nsteps = {sft_steps}"));
    let cfg = keel_actors::TrainConfig::from_toml(&toml).expect("config");
    assert_eq!(cfg.sft.steps, sft_steps, "the SFT warm start as asked");
    let dir = tempfile::tempdir().expect("tempdir");
    let store = keel_store::RunStore::open(dir.path().to_str().expect("utf8")).expect("store");
    let metrics = keel_actors::TrainMetrics::new("external-fail").expect("metrics");
    let err = keel_actors::run_job(
        cfg,
        store,
        metrics,
        keel_actors::events::no_events(),
        keel_actors::JobOptions::default(),
    )
    .expect_err("the run must end");
    format!("{err:#}")
}

/// CT-8: a server that answers `/info` but fails every `/reset` ends the run with an error that
/// names the env and the failure, instead of retrying the batch for ever.
#[test]
fn an_env_that_fails_every_reset_ends_the_run_with_its_failure() {
    let server = Server::start(&["--fail-resets"]);
    let t = std::time::Instant::now();
    let msg = failed_job(&server, 0);
    assert!(
        msg.contains("env `external` failed every episode of 3 training batches in a row")
            && msg.contains("injected failure (--fail-resets)"),
        "{msg}"
    );
    assert!(
        t.elapsed() < std::time::Duration::from_secs(60),
        "took {:?}",
        t.elapsed()
    );
}

/// A server that answers `/info` but fails its resets, reached from the SFT warm start's
/// demonstrations and from `keel env eval --policy oracle`: an error naming the failure, never a
/// panic (before, both panicked inside `ExternalEnv::reset`).
#[test]
fn a_failing_server_in_sft_demonstrations_and_oracle_eval_is_an_error_not_a_panic() {
    let server = Server::start(&["--fail-resets"]);
    let msg = failed_job(&server, 120);
    assert!(msg.contains("injected failure (--fail-resets)"), "{msg}");

    let out = Command::new(keel_integration::keel_bin())
        .args([
            "env",
            "eval",
            "external",
            "--policy",
            "oracle",
            "--episodes",
            "3",
        ])
        .args(["--url", &server.url])
        .output()
        .expect("keel env eval");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("evaluating the oracle policy") && text.contains("injected failure"),
        "{text}"
    );
    assert!(!text.contains("panicked"), "{text}");
}

/// Binary search over the shard's answers: the shard hosts many remote episodes at once.
#[test]
fn env_shard_drives_the_server_concurrently_and_survives_its_death() {
    let server = Server::start(&[]);
    let cfg = server.config();
    let factory: EnvFactory =
        Arc::new(move || Ok(Box::new(ExternalEnv::connect(cfg.clone())?) as Box<dyn Env>));
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
        let prompts =
            request_all(&shard, (0..n).map(|e| (e, EnvOp::Reset(100 + e))).collect()).await;
        assert!(prompts.iter().all(|(a, _)| matches!(
            &a.result,
            Ok(EnvReply::Started(t)) if t.prompt.starts_with("task guess")
        )));
        let mut bounds: Vec<(u32, u32)> = vec![(1, 64); n as usize];
        let mut solved = 0;
        let mut live: Vec<u64> = (0..n).collect();
        for _ in 0..7 {
            let guesses: Vec<(u64, EnvOp)> = live
                .iter()
                .map(|&e| {
                    let (lo, hi) = bounds[e as usize];
                    (e, EnvOp::Step(format!("guess {}", (lo + hi) / 2).into()))
                })
                .collect();
            let outs = request_all(&shard, guesses.clone()).await;
            let mut next = Vec::new();
            for ((e, _), (out, _)) in guesses.iter().zip(outs) {
                let out = stepped(out);
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
        let prompts =
            request_all(&shard, vec![(100, EnvOp::Reset(1)), (101, EnvOp::Reset(2))]).await;
        assert!(prompts.iter().all(|(a, _)| a.result.is_ok()));
        drop(server);
        let guess = || EnvOp::Step("guess 32".into());
        let outs = request_all(&shard, vec![(100, guess()), (101, guess())]).await;
        for (out, _) in outs {
            match out.result {
                Err(EpisodeError::Failed(_, msg)) => {
                    assert!(msg.contains("external env at"), "{msg}")
                }
                other => panic!("expected a failed episode, got {other:?}"),
            }
        }
        assert_eq!(budget.used(), 0, "an env error is not a restart");
        let again = request_all(&shard, vec![(7, EnvOp::Step("guess 1".into()))]).await;
        assert_eq!(
            again[0].0.result,
            Err(EpisodeError::Lost(7)),
            "the shard still serves"
        );
    });
}

#[test]
fn latency_overlaps_and_each_episode_is_answered_when_its_own_step_is_done() {
    let factory: EnvFactory = Arc::new(|| keel_envs::make_env("calc", 1));
    let system = actix::System::new();
    system.block_on(async move {
        let latency = LatencyModel::Pareto {
            scale_ms: 20.0,
            alpha: 1.2,
            cap_ms: 400.0,
        };
        let delays: Vec<std::time::Duration> = (0..32u64).map(|e| latency.delay(e, 1)).collect();
        let slowest = delays.iter().max().copied().expect("episodes");
        let options = ShardOptions {
            concurrency: 32,
            latency,
        };
        let shard =
            EnvShard::with_options(factory, RestartBudget::new("env_shard", 1), options).start();
        request_all(&shard, (0..32).map(|e| (e, EnvOp::Reset(e))).collect()).await;
        let t = std::time::Instant::now();
        let outs = request_all(
            &shard,
            (0..32)
                .map(|e| (e, EnvOp::Step("answer 1".into())))
                .collect(),
        )
        .await;
        let took = t.elapsed();
        assert_eq!(outs.len(), 32);
        assert!(took >= slowest, "{took:?} < slowest {slowest:?}");
        assert!(
            took < slowest * 3 + std::time::Duration::from_millis(200),
            "not concurrent: {took:?} vs slowest {slowest:?}"
        );
        // ES-3/ES-5: a fast episode is answered long before the slowest one.
        let fastest = (0..32).min_by_key(|&e| delays[e]).expect("episodes");
        let fast_at = outs[fastest].1.duration_since(t);
        assert!(
            fast_at + std::time::Duration::from_millis(100) < slowest,
            "the fastest episode ({:?} of latency) waited {fast_at:?}, the slowest is {slowest:?}",
            delays[fastest]
        );
    });
}

fn stepped(a: EnvAnswer) -> keel_envs::StepOutcome {
    match a.result {
        Ok(EnvReply::Stepped { outcome, .. }) => outcome,
        other => panic!("expected a served step, got {other:?}"),
    }
}

/// SIGTERM is honoured within `run.sigterm_grace_s` while an external env hangs: the server
/// stops answering `/step` mid-run (each call would block for 2 minutes of timeouts and
/// retries), and `keel train` still commits its stop checkpoint and exits 0 in time.
#[test]
fn sigterm_is_honoured_while_the_external_env_hangs() {
    let server = Server::start(&["--hang-steps-after", "200"]);
    let toml = keel_integration::MethodRun {
        steps: 1000,
        ..keel_integration::MethodRun::new("grpo")
    }
    .toml()
    .replace(
        "name = \"calc\"",
        &format!(
            "name = \"external\"\nexternal = {{ url = \"{}\", retries = 3, timeout_ms = 30000 }}",
            server.url
        ),
    )
    .replace("[sft]\nsteps = 120", "[sft]\nsteps = 0")
    .replace("threads = 1", "threads = 1\nsigterm_grace_s = 10");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("hang.toml");
    std::fs::write(&config, toml).expect("config");
    let root = dir.path().join("run");
    let summary = root.with_extension("json");
    let log = keel_integration::train_log(&root);
    let mut child = keel_integration::spawn_train(&config, &root, &[]);
    // Past the evaluation and a few RL batches: the server has stopped answering by now.
    std::thread::sleep(std::time::Duration::from_secs(10));
    assert!(
        child.try_wait().expect("wait").is_none(),
        "the run ended early: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let sent = std::time::Instant::now();
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(kill.success());
    let status = child.wait().expect("wait");
    let took = sent.elapsed();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        status.success(),
        "SIGTERM must end in exit 0, got {status}: {text}"
    );
    assert!(
        took < std::time::Duration::from_secs(10),
        "stopping took {took:?} while the env hung: {text}"
    );
    let outcome: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&summary).expect("summary")).expect("json");
    assert_eq!(outcome["stopped"], serde_json::json!(true), "{outcome}");
    // The hang began early (200 steps are an evaluation and part of one batch): a run whose env
    // had kept answering would be many steps further after 10 s.
    let step = outcome["final_step"].as_u64().expect("final_step");
    assert!(step <= 2, "the env never hung: the run reached step {step}");
}
