//! Issue 34: an agent written for the OpenAI API, run unchanged by `keel train` through the
//! agent gateway (`[env] name = "agent"`). The agent is examples/agents/calculator_agent.py, a
//! real Python program on the real `openai` client library; the model is a tiny random
//! Qwen2.5 with the real Qwen2.5-Instruct chat template (tools branch).
//!
//! Token exactness (AGT-1): every stored episode starts with exactly the ids transformers renders
//! for the agent's first call (its messages and tools, with the generation prompt), and its
//! sampled turns decode to exactly the answers the agent received, in order.

use std::path::Path;

use keel_actors::events::TrainEvent;
use keel_integration::events::train_events;
use keel_integration::roles::Roles;
use keel_integration::{
    family_models, free_port, python, run_train, stored_batches, train_command, train_log,
    train_output, Guarded,
};

const ROWS: &[(&str, &str)] = &[
    ("What is 3 + 4?", "7"),
    ("What is 12 - 5?", "7"),
    ("What is 6 * 7?", "42"),
    ("What is 9 + 10?", "19"),
    ("What is 8 * 8?", "64"),
    ("What is 100 - 1?", "99"),
];

fn dataset(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("arith.jsonl");
    let lines: Vec<String> = ROWS
        .iter()
        .enumerate()
        .map(|(i, (q, a))| {
            serde_json::json!({
                "data_source": "arith",
                "prompt": [{"role": "system", "content": "You are a careful calculator."},
                           {"role": "user", "content": q}],
                "reward_model": {"ground_truth": a},
                "extra_info": {"index": i},
            })
            .to_string()
        })
        .collect();
    std::fs::write(&path, lines.join("\n")).expect("dataset");
    path
}

fn agent_script(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(name)
}

fn config(dir: &Path, command: &[String], extra: &str, sft: &str) -> std::path::PathBuf {
    let data = dataset(dir);
    let command: Vec<String> = command.iter().map(|c| format!("{c:?}")).collect();
    let path = dir.join("agent.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[run]
seed = 3
steps = 2
checkpoint_every = 2
device = "cpu"
threads = 1

[env]
name = "agent"

[env.dataset]
train_file = {data:?}
eval_file = {data:?}

[env.agent]
command = [{command}]
{extra}

[model]
context_len = 1024

[sft]
{sft}

[rollout]
tasks_per_batch = 2
group_size = 2
eval_tasks = 2
max_turn_tokens = 12
temperature = 1.0

[metrics]
enabled = false

[learner]
algo = "grpo"
"#,
            command = command.join(", "),
            sft = match sft {
                "" => "steps = 0",
                sft => sft,
            },
            extra = match extra.contains("timeout_s") {
                true => extra.to_string(),
                false => format!("timeout_s = 120\n{extra}"),
            }
        ),
    )
    .expect("config");
    path
}

/// A finished `keel train` of an agent: its temp dir, the agents' log folder and the run root.
struct AgentRun {
    dir: tempfile::TempDir,
    logs: std::path::PathBuf,
    root: std::path::PathBuf,
    model: std::path::PathBuf,
}

/// Trains 2 steps with `python3 SCRIPT ARGS... LOGS` as the agent (`extra`: more
/// `[env.agent]` keys).
fn train_agent(script: &str, args: &[&str], extra: &str, sft: &str) -> AgentRun {
    let run = AgentRun::prepare();
    let config = config(run.dir.path(), &run.command(script, args), extra, sft);
    run_train(
        &config,
        &run.root,
        &["--model", &run.model.to_string_lossy()],
    );
    run
}

impl AgentRun {
    /// A fresh temp dir with an empty agents' log folder, the tiny Qwen2.5 and a run root.
    fn prepare() -> AgentRun {
        let dir = tempfile::tempdir().expect("tempdir");
        let logs = dir.path().join("logs");
        std::fs::create_dir_all(&logs).expect("logs");
        let root = dir.path().join("run");
        AgentRun {
            dir,
            logs,
            root,
            model: family_models().join("qwen2.5"),
        }
    }

    /// `python3 SCRIPT ARGS... LOGS`.
    fn command(&self, script: &str, args: &[&str]) -> Vec<String> {
        let mut command = vec![
            "python3".to_string(),
            agent_script(script).display().to_string(),
        ];
        command.extend(args.iter().map(|a| a.to_string()));
        command.push(self.logs.display().to_string());
        command
    }
}

/// What `python3 SCRIPT MODEL LOGS OUT.json` makes of the agents' logs with transformers (the
/// reference renderings the stored episodes are checked against), read from OUT.json.
fn read_agent_logs(script: &str, model: &Path, logs: &Path, dir: &Path) -> Vec<serde_json::Value> {
    let out = dir.join("reference.json");
    python(&[
        agent_script(script).as_os_str(),
        model.as_os_str(),
        logs.as_os_str(),
        out.as_os_str(),
    ]);
    serde_json::from_slice(&std::fs::read(&out).expect("reference")).expect("json")
}

/// Episodes trained and episodes failed, summed over the run's `rollout` events.
fn rollout_counts(root: &Path) -> (usize, usize) {
    let (mut trained, mut failed) = (0, 0);
    for event in train_events(root) {
        if let TrainEvent::Rollout {
            episodes,
            failed_episodes,
            ..
        } = event
        {
            trained += episodes;
            failed += failed_episodes;
        }
    }
    (trained, failed)
}

#[test]
fn an_openai_client_agent_trains_through_the_gateway_token_exact() {
    let AgentRun {
        dir,
        logs,
        root,
        model,
    } = train_agent(
        "../examples/agents/calculator_agent.py",
        &["--follow-up", "--logprobs", "--log"],
        "",
        "",
    );
    let logged = read_agent_logs("tests/python/agent_prompts.py", &model, &logs, dir.path());
    let files = keel_learner::hf::tokenizer::folder_files(&model).expect("files");
    let codec = keel_actors::parts::codec_from_files(&files, &Default::default()).expect("codec");
    let episodes: Vec<_> = stored_batches(&root)
        .into_iter()
        .flat_map(|b| b.trajectories)
        .collect();
    assert!(!episodes.is_empty(), "no episode was stored");
    for t in &episodes {
        let first = t
            .loss_mask
            .iter()
            .position(|&m| m == 1)
            .expect("a sampled token");
        let (mut answers, mut sampled_logprobs) = (Vec::new(), Vec::new());
        let mut i = first;
        while i < t.tokens.len() {
            let end = (i..t.tokens.len())
                .find(|&j| t.loss_mask[j] == 0)
                .unwrap_or(t.tokens.len());
            answers.push(codec.response_text(&t.tokens[i..end]).expect("decode"));
            sampled_logprobs.push(t.behaviour_logprobs[i..end].to_vec());
            i = (end..t.tokens.len())
                .find(|&j| t.loss_mask[j] == 1)
                .unwrap_or(t.tokens.len());
        }
        assert_eq!(t.turns.len(), 2, "the agent's follow-up is a second turn");
        let prompt: Vec<u64> = t.tokens[..first].iter().map(|&x| u64::from(x)).collect();
        let found = logged.iter().find(|l| {
            l["first"].as_array().is_some_and(|ids| {
                ids.iter().filter_map(|x| x.as_u64()).collect::<Vec<_>>() == prompt
            }) && l["answers"] == serde_json::json!(answers)
        });
        let same_prompt = logged.iter().filter(|l| {
            l["first"].as_array().is_some_and(|ids| {
                ids.iter().filter_map(|x| x.as_u64()).collect::<Vec<_>>() == prompt
            })
        });
        let same_answers = logged
            .iter()
            .filter(|l| l["answers"] == serde_json::json!(answers));
        assert!(
            found.is_some(),
            "no agent saw this episode: first prompt {} tokens (logs with it: {}), answers {answers:?} (logs with them: {}); first logged prompt: {}",
            first,
            same_prompt.count(),
            same_answers.count(),
            logged[0]["first"]
        );
        // OAI-5: the log-probs the agent got are the stored behaviour log-probs of the turn's
        // content tokens (its stop token, when it stopped, excluded), bit for bit.
        let got = found.map(|l| l["logprobs"].clone()).unwrap_or_default();
        for (k, stored) in sampled_logprobs.iter().enumerate() {
            let returned: Vec<f32> = got[k]
                .as_array()
                .expect("logprobs of every answer")
                .iter()
                .map(|x| x.as_f64().expect("a number") as f32)
                .collect();
            assert!(
                returned.len() + 1 >= stored.len() && returned[..] == stored[..returned.len()],
                "turn {k}: returned {returned:?}, stored {stored:?}"
            );
        }
    }
}

#[test]
fn a_bad_agent_command_is_refused_before_anything_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = family_models().join("qwen2.5");
    let config = config(dir.path(), &[], "", "");
    let root = dir.path().join("run");
    let out = train_output(&config, &root, &["--model", &model.to_string_lossy()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("env.agent.command"), "{err}");
    assert!(!root.exists(), "nothing is written");
}

/// Agents that misbehave (integration/tests/python/hostile_agent.py: malformed JSON, no key,
/// an unknown key, an oversized body, another temperature, a call ending with an assistant
/// message (a prefill), a hang past
/// `timeout_s`, an exit before the first call, an exit without the reward) each get a clear
/// HTTP status or fail only their own episode: the run finishes, the failures are counted in
/// the `rollout` events, and no agent outlives its episode (APR-2).
#[test]
fn misbehaving_agents_get_clear_errors_and_the_run_goes_on() {
    let run = train_agent(
        "tests/python/hostile_agent.py",
        &[],
        "max_request_bytes = 65536\ntimeout_s = 20",
        "",
    );
    let logs = &run.logs;
    let mut seen: Vec<serde_json::Value> = std::fs::read_dir(logs)
        .expect("logs")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .map(|e| serde_json::from_slice(&std::fs::read(e.path()).expect("log")).expect("json"))
        .collect();
    seen.sort_by_key(|v| v["kind"].as_str().map(str::to_owned));
    let of = |kind: &str| -> Vec<&serde_json::Value> {
        seen.iter().filter(|v| v["kind"] == kind).collect()
    };
    for kind in [
        "good",
        "probe",
        "prefill",
        "hang",
        "early_exit",
        "no_reward",
    ] {
        assert!(!of(kind).is_empty(), "no {kind} agent ran: {seen:?}");
    }
    // A probe makes a dozen calls; on a loaded machine one may meet its episode's timeout
    // before the end (it is killed as the hang agent is). What it logged must be right, and
    // at least one probe must get through all of it.
    let probes = of("probe");
    assert!(
        probes.iter().any(|p| p.get("reward_status").is_some()),
        "no probe agent finished its calls: {seen:?}"
    );
    for probe in probes {
        let finished = probe.get("reward_status").is_some();
        let statuses = [
            ("malformed", 400),
            ("no_key", 401),
            ("unknown_key", 404),
            ("huge", 413),
            ("temperature", 400),
            ("reward_status", 200),
        ];
        for (what, status) in statuses {
            if finished || probe.get(what).is_some() {
                assert_eq!(probe[what], status, "{what}: {probe}");
            }
        }
        if !finished {
            continue;
        }
        assert_eq!(
            probe["retry_same"], true,
            "a retry gets the stored answer: {probe}"
        );
        assert_eq!(
            probe["retry_key"], true,
            "a call with an answered Idempotency-Key gets the stored answer: {probe}"
        );
        assert!(
            probe["capped_tokens"].as_u64().is_some_and(|n| n <= 2),
            "max_tokens = 2 bounds the turn (AGT-7): {probe}"
        );
        assert_eq!(
            probe["stop_cut"], true,
            "the answer ends before its stop: {probe}"
        );
    }
    for prefill in of("prefill") {
        assert_eq!(prefill["prefill"], 400, "{prefill}");
    }
    for agent in &seen {
        let pid = agent["pid"].as_u64().expect("pid");
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "agent {agent} outlived its episode"
        );
    }
    let (trained, failed) = rollout_counts(&run.root);
    assert!(
        trained > 0 && failed > 0,
        "trained {trained}, failed {failed}"
    );
}

/// An agent that compacts its history (calculator_agent.py --compact: after its first answer
/// the model's draft is replaced by a calculator call and its result) trains in segments
/// (AGT-3, RO-12, RB-4): every episode is two trajectories sharing its id and reward, both
/// trained, and each segment's prompt is exactly what transformers renders for the
/// conversation it started from (the assistant's tool call rendered by the template).
#[test]
fn an_agent_that_compacts_its_history_trains_in_segments() {
    let run = train_agent(
        "../examples/agents/calculator_agent.py",
        &["--compact", "--log"],
        "",
        "",
    );
    assert_eq!(rollout_counts(&run.root), (8, 0), "no episode failed");
    let rendered = run.dir.path().join("rendered.json");
    python(&[
        agent_script("tests/python/agent_prompts.py").as_os_str(),
        run.model.as_os_str(),
        run.logs.as_os_str(),
        rendered.as_os_str(),
    ]);
    let logged: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(&rendered).expect("rendered")).expect("json");
    let batches = stored_batches(&run.root);
    assert!(!batches.is_empty(), "no batch was stored");
    for batch in batches {
        let mut episodes: std::collections::BTreeMap<u64, Vec<&keel_store::Trajectory>> =
            Default::default();
        for t in &batch.trajectories {
            episodes.entry(t.episode_id).or_default().push(t);
        }
        assert_eq!(episodes.len(), 4, "2 tasks x 2 episodes per batch");
        for (id, segments) in episodes {
            assert_eq!(segments.len(), 2, "episode {id}: one segment per call");
            assert_eq!(
                segments[0].trajectory_id, id,
                "the first segment keeps the id"
            );
            assert_eq!(segments[0].final_reward, segments[1].final_reward);
            let prompts: Vec<Vec<u64>> = segments
                .iter()
                .map(|t| {
                    let first = t.loss_mask.iter().position(|&m| m == 1);
                    let first = first.expect("every segment has sampled (trained) tokens");
                    t.tokens[..first].iter().map(|&x| u64::from(x)).collect()
                })
                .collect();
            let seen = logged
                .iter()
                .any(|l| l["segments"] == serde_json::json!(prompts));
            assert!(
                seen,
                "episode {id}: no agent's two conversations render to its segment prompts ({} and {} tokens)",
                prompts[0].len(),
                prompts[1].len()
            );
        }
    }
}

/// The multi-process roles (`keel trainer` + `keel generator --rank 0/1`, coordinated only
/// through the run root): each generator process runs its own gateway on its own port and
/// starts the agents of the episodes it samples; the trainer never talks to an agent. The run
/// trains every episode, and every batch is a generator rank's.
#[test]
fn agents_train_under_the_multi_process_roles() {
    let run = AgentRun::prepare();
    let command = run.command("../examples/agents/calculator_agent.py", &["--log"]);
    let cfg = config(run.dir.path(), &command, "", "");
    let toml = std::fs::read_to_string(&cfg)
        .expect("config")
        .replace(
            "[model]\n",
            &format!("[model]\npath = {:?}\n", run.model.display().to_string()),
        )
        .replace("[rollout]\n", "[rollout]\ngenerators = 2\n")
        .replace(
            "[metrics]\n",
            "[distributed]\norder_timeout_s = 120\npoll_ms = 20\n\n[metrics]\n",
        );
    std::fs::write(&cfg, toml).expect("config");
    let (dir, root, logs) = (run.dir.path(), &run.root, &run.logs);
    let mut roles = Roles::new(dir, cfg, root.to_str().expect("utf-8"));
    roles.start_all();
    roles.finish_ok();
    let (trained, failed) = rollout_counts(root);
    assert_eq!((trained, failed), (8, 0), "2 steps of 2 tasks x 2 episodes");
    // Batches are written by generator ranks (writer tag `l<life>-r<rank>-…`), never the trainer.
    let batches: Vec<String> = std::fs::read_dir(root.join("batches"))
        .expect("batches")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    assert!(
        !batches.is_empty() && batches.iter().all(|b| b.contains("-r000")),
        "batches: {batches:?}"
    );
    let agents = std::fs::read_dir(logs).expect("logs").count();
    assert!(agents >= 8, "{agents} agent runs logged");
}

/// An agent written on the OpenAI Agents SDK (examples/agents/agents_sdk_calculator.py: a
/// function tool, `Runner.run`, the SDK's own chat-completions model) trains unchanged: every
/// call the SDK makes extends its conversation as the gateway requires, so no episode fails.
#[test]
fn an_openai_agents_sdk_agent_trains_unchanged() {
    let run = train_agent(
        "../examples/agents/agents_sdk_calculator.py",
        &["--log"],
        "",
        "",
    );
    assert_eq!(
        rollout_counts(&run.root),
        (8, 0),
        "2 steps of 2 tasks x 2 episodes"
    );
    let conversations = std::fs::read_dir(&run.logs).expect("logs").count();
    assert!(conversations >= 8, "{conversations} SDK runs logged");
}

/// The SFT warm start demonstrates through the agent program too (the row's answer as the
/// model's turn, DM-1..5): every demonstration is a real agent episode, run as concurrently as
/// the rollout runs them (`env.concurrency`), and SFT then trains on them before RL starts.
#[test]
fn the_sft_warm_start_demonstrates_through_concurrent_agents() {
    let run = train_agent(
        "../examples/agents/calculator_agent.py",
        &["--log"],
        "",
        "steps = 2\nbatch_size = 4\ndemos = 12\nnoise = 0.0",
    );
    let demos: Vec<serde_json::Value> = std::fs::read_dir(&run.logs)
        .expect("logs")
        .filter_map(|e| e.ok())
        .map(|e| serde_json::from_slice(&std::fs::read(e.path()).expect("log")).expect("json"))
        .filter(|v: &serde_json::Value| {
            v["split"] == "train" && v["messages"].as_array().is_some_and(|m| m.len() == 3)
        })
        .collect();
    // Rollout episodes of the train split are there too; the 12 demonstrations all succeed.
    let solved = demos.iter().filter(|d| d["reward"] == 1.0).count();
    assert!(
        solved >= 12,
        "{solved} solved demonstrations of 12: {demos:?}"
    );
    let ran: Vec<(f64, f64)> = demos
        .iter()
        .filter_map(|d| Some((d["ran"][0].as_f64()?, d["ran"][1].as_f64()?)))
        .collect();
    let overlapping = ran
        .iter()
        .enumerate()
        .any(|(i, a)| ran[i + 1..].iter().any(|b| a.0 < b.1 && b.0 < a.1));
    assert!(overlapping, "demonstrations ran one at a time: {ran:?}");
    let sft_steps: Vec<u64> = train_events(&run.root)
        .into_iter()
        .filter_map(|e| match e {
            TrainEvent::SftDone { steps, .. } => Some(steps),
            _ => None,
        })
        .collect();
    assert_eq!(sft_steps, vec![2]);
    let (trained, _) = rollout_counts(&run.root);
    assert!(trained > 0, "RL trained no episode after SFT");
}

/// `launch = "pull"` (GTW-5, APR-4): keel starts no agent; a pool worker standing for another
/// host (examples/agents/pool_worker.py) pulls episodes with the pool key, runs the unchanged
/// calculator agent on each and reports their ends. The run trains and no episode fails.
#[test]
fn agents_elsewhere_pull_their_episodes() {
    let AgentRun {
        dir,
        logs,
        root,
        model,
    } = AgentRun::prepare();
    let port = free_port();
    let pool_key = "keel-test-pool-key-0123456789";
    let config = config(
        dir.path(),
        &[],
        &format!(
            "launch = \"pull\"\nbind = \"127.0.0.1:{port}\"\npool_key_env = \"KEEL_TEST_POOL_KEY\""
        ),
        "",
    );
    let log = std::fs::File::create(train_log(&root)).expect("log file");
    let mut train = Guarded::spawn(
        train_command(&config, &root, &["--model", &model.to_string_lossy()])
            .env("KEEL_TEST_POOL_KEY", pool_key)
            .env("KEEL_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(log),
    )
    .expect("start keel train");
    let worker = Guarded::spawn(
        std::process::Command::new("python3")
            .arg(agent_script("../examples/agents/pool_worker.py"))
            .args(["--gateway", &format!("http://127.0.0.1:{port}/v1")])
            .args(["--workers", "4", "--patience", "3", "--", "python3"])
            .arg(agent_script("../examples/agents/calculator_agent.py"))
            .arg("--log")
            .arg(&logs)
            .env("KEEL_AGENT_POOL_KEY", pool_key)
            .stdout(std::process::Stdio::piped()),
    )
    .expect("start the pool worker");
    let status = train.wait().expect("wait keel train");
    assert!(
        status.success(),
        "keel train failed ({status}):\n{}",
        keel_integration::log_tail(&root)
    );
    let mut worker = worker;
    let mut out = String::new();
    if let Some(mut stdout) = worker.stdout.take() {
        std::io::Read::read_to_string(&mut stdout, &mut out).expect("worker output");
    }
    let ran: serde_json::Value = serde_json::from_str(out.trim()).expect("worker summary");
    let (trained, failed) = rollout_counts(&root);
    assert!(
        trained > 0 && failed == 0,
        "trained {trained}, failed {failed}"
    );
    assert!(
        ran["episodes"]
            .as_u64()
            .is_some_and(|n| n as usize >= trained),
        "the pool ran {ran} episodes for {trained} trained"
    );
    let logged = std::fs::read_dir(&logs).expect("logs").count();
    assert!(
        logged >= trained,
        "{logged} agent logs for {trained} episodes"
    );
}

/// Files in `dir` whose names end with `suffix`.
fn count_files(dir: &Path, suffix: &str) -> usize {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(suffix))
                .count()
        })
        .unwrap_or(0)
}

/// The config of a journal test: agents pulled from a fixed port (AJ-2 scopes records by it).
fn pulled_config(dir: &Path, port: u16) -> std::path::PathBuf {
    config(
        dir,
        &[],
        &format!(
            "launch = \"pull\"\nbind = \"127.0.0.1:{port}\"\npool_key_env = \"KEEL_TEST_POOL_KEY\""
        ),
        "",
    )
}

const POOL_KEY: &str = "keel-test-pool-key-0123456789";

/// A pool worker running tests/python/restart_agent.py, which pauses every training episode
/// after its first answer until LOGS/go exists; 8 workers: the first batch's 4 paused episodes
/// and the evaluation's after a restart.
fn restart_agents(port: u16, logs: &Path) -> Guarded {
    Guarded::spawn(
        std::process::Command::new("python3")
            .arg(agent_script("../examples/agents/pool_worker.py"))
            .args(["--gateway", &format!("http://127.0.0.1:{port}/v1")])
            .args(["--workers", "8", "--patience", "600", "--", "python3"])
            .arg(agent_script("tests/python/restart_agent.py"))
            .arg(logs)
            .env("KEEL_AGENT_POOL_KEY", POOL_KEY)
            .stdout(std::process::Stdio::null()),
    )
    .expect("start the pool worker")
}

/// Waits (for progress, not time) until the first batch's 4 episodes (2 tasks × 2) have each
/// been answered once and are paused; `gone` says why the run cannot get there. Answers the
/// paused agents' keys.
fn wait_mid_episode(logs: &Path, mut gone: impl FnMut() -> Option<String>) -> Vec<String> {
    while count_files(logs, ".first") < 4 {
        if let Some(why) = gone() {
            panic!("the run ended before its agents were mid-episode: {why}");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    std::fs::read_dir(logs)
        .expect("logs")
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            name.strip_suffix(".first").map(str::to_string)
        })
        .collect()
}

/// The checks of a journal test once the run finished: the agents that lived through the kill
/// got their recorded first answer back on retry; each of their episodes is two segments in
/// the first batch, the first holding exactly the tokens they were answered with before the
/// kill; no record is left.
fn assert_taken_up(root: &Path, logs: &Path, journal: &Path, paused: &[String]) {
    assert_eq!(
        count_files(journal, ""),
        0,
        "AJ-2: ended episodes leave no record"
    );
    let mut firsts = Vec::new();
    for key in paused {
        let text = std::fs::read(logs.join(format!("{key}.json"))).unwrap_or_else(|e| {
            let why = std::fs::read_to_string(logs.join(format!("{key}.error")))
                .unwrap_or_else(|_| "it wrote no error".into());
            panic!("an agent that lived through the kill did not log its episode ({e}): {why}")
        });
        let log: serde_json::Value = serde_json::from_slice(&text).expect("json");
        assert_eq!(
            log["answers"][0], log["answers"][1],
            "AGT-2 across a restart: a retried call gets the recorded answer"
        );
        firsts.push(log["answers"][0].clone());
    }
    assert_eq!(firsts.len(), 4, "every paused agent finished its episode");
    let first_batch = stored_batches(root)
        .into_iter()
        .find(|b| b.batch_seq == 0)
        .expect("the first batch");
    let mut segments: std::collections::BTreeMap<u64, Vec<&keel_store::Trajectory>> =
        Default::default();
    for t in &first_batch.trajectories {
        segments.entry(t.episode_id).or_default().push(t);
    }
    assert_eq!(segments.len(), 4, "the first batch's episodes");
    let sampled = |t: &keel_store::Trajectory| -> Vec<f64> {
        t.behaviour_logprobs
            .iter()
            .zip(&t.loss_mask)
            .filter(|(_, &m)| m == 1)
            .map(|(&l, _)| f64::from(l))
            .collect()
    };
    let matched = firsts
        .iter()
        .filter(|first| {
            let logged: Vec<f64> = first["logprobs"]
                .as_array()
                .expect("logprobs")
                .iter()
                .filter_map(serde_json::Value::as_f64)
                .collect();
            segments.values().any(|episode| {
                let held = sampled(episode[0]);
                episode.len() == 2
                    && Some(held.len() as u64) == first["completion_tokens"].as_u64()
                    && held.len() >= logged.len()
                    && held.iter().zip(&logged).all(|(a, b)| (a - b).abs() < 1e-5)
            })
        })
        .count();
    assert_eq!(
        matched, 4,
        "every first segment holds the tokens its agent was answered with before the kill"
    );
}

/// AJ-1..4: `keel train` is SIGKILLed while every agent of its first batch is mid-episode (its
/// first call answered, so recorded), then started again on the same root and bind. The agents
/// (pulled by a pool worker, alive through the kill) retry their first call with its
/// Idempotency-Key and get the recorded answer, never a second sample; they go on, and each
/// episode is trained as two segments, the first holding exactly the tokens sampled before the
/// kill (their log-probs are the ones the agent was given). The journal is empty at the end.
#[test]
fn a_sigkilled_trainer_takes_up_its_agents_episodes_from_the_journal() {
    let AgentRun {
        dir,
        logs,
        root,
        model,
    } = AgentRun::prepare();
    let port = free_port();
    let config = pulled_config(dir.path(), port);
    let start = || {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(train_log(&root))
            .expect("log file");
        Guarded::spawn(
            train_command(&config, &root, &["--model", &model.to_string_lossy()])
                .env("KEEL_TEST_POOL_KEY", POOL_KEY)
                .env("KEEL_LOG", "warn")
                .stdout(std::process::Stdio::null())
                .stderr(log),
        )
        .expect("start keel train")
    };
    let mut train = start();
    let _agents = restart_agents(port, &logs);
    let paused = wait_mid_episode(&logs, || {
        let status = train.try_wait().expect("poll keel train")?;
        Some(format!(
            "keel train exited {status}:\n{}",
            keel_integration::log_tail(&root)
        ))
    });
    let journal = root.join("agent-journal").join(format!("127.0.0.1_{port}"));
    assert!(
        count_files(&journal, "") >= 4,
        "AJ-1: answered calls are recorded before their answer"
    );
    train.kill().expect("SIGKILL keel train");
    train.wait().expect("reap keel train");
    let mut train = start();
    std::fs::write(logs.join("go"), "").expect("go");
    let status = train.wait().expect("wait keel train");
    assert!(
        status.success(),
        "the restarted keel train failed ({status}):\n{}",
        keel_integration::log_tail(&root)
    );
    assert_taken_up(&root, &logs, &journal, &paused);
}

/// AJ-1..4 for the gateway's own process: under the multi-process roles the gateway runs in
/// the generator (`keel generator --rank 0`). SIGKILL it while its agents are mid-episode and
/// start it again: the trainer goes on, the restarted generator takes the episodes up from the
/// journal, and nothing its agents were answered is lost or sampled twice.
#[test]
fn a_sigkilled_generator_takes_up_its_agents_episodes_from_the_journal() {
    let run = AgentRun::prepare();
    let port = free_port();
    let cfg = pulled_config(run.dir.path(), port);
    let toml = std::fs::read_to_string(&cfg)
        .expect("config")
        .replace(
            "[model]\n",
            &format!("[model]\npath = {:?}\n", run.model.display().to_string()),
        )
        .replace(
            "[metrics]\n",
            "[distributed]\norder_timeout_s = 120\npoll_ms = 20\n\n[metrics]\n",
        );
    std::fs::write(&cfg, toml).expect("config");
    let (dir, root, logs) = (run.dir.path(), &run.root, &run.logs);
    let mut roles = Roles::new(dir, cfg, root.to_str().expect("utf-8"));
    roles
        .env
        .push(("KEEL_TEST_POOL_KEY".into(), POOL_KEY.into()));
    roles.start_trainer();
    roles.start_generator(0);
    let _agents = restart_agents(port, logs);
    let paused = wait_mid_episode(logs, || {
        let g = roles.gens[0].as_mut()?;
        let status = g.try_wait().expect("poll the generator")?;
        Some(format!("the generator exited {status}:\n{}", roles.logs()))
    });
    roles.kill_generator(0);
    roles.start_generator(0);
    std::fs::write(logs.join("go"), "").expect("go");
    roles.finish_ok();
    let journal = root.join("agent-journal").join(format!("127.0.0.1_{port}"));
    assert_taken_up(root, logs, &journal, &paused);
}

/// Held-out success rises on a real pretrained model trained through the gateway: the
/// unchanged examples/agents/minimal_agent.py (the README's ten-line agent: one
/// chat-completions call with the row's messages) asks SmolLM2-135M-Instruct "What is A plus
/// B?"; keel's numeric verifier scores its answer (`reward = "verifier"`). The model knows the
/// sums but mostly says so at length, so within 16 tokens its last number is rarely the sum;
/// GRPO steps through the gateway teach it to answer with it.
#[test]
fn an_unchanged_agent_teaches_a_real_model_through_the_gateway() {
    use keel_integration::real_model::{addition_split, batch_rewards, smollm2};
    let dir = tempfile::tempdir().expect("tempdir");
    let model = smollm2();
    let (train, eval) = addition_split(dir.path());
    let agent = agent_script("../examples/agents/minimal_agent.py");
    let cfg = dir.path().join("smollm2-agent.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
[run]
seed = 5
steps = 8
checkpoint_every = 100
device = "cpu"
threads = 2

[env]
name = "agent"

[env.dataset]
train_file = {train:?}
eval_file = {eval:?}
verifier = "numeric"

[env.agent]
command = ["python3", {agent:?}]
reward = "verifier"
timeout_s = 300

[model]
context_len = 256

[sft]
steps = 0

[rollout]
tasks_per_batch = 8
group_size = 4
max_turn_tokens = 16
eval_tasks = 16
eval_samples = 0

[metrics]
enabled = false

[guard]
enabled = false

[learner]
algo = "grpo"
lr = 5e-5
"#
        ),
    )
    .expect("config");
    let root = dir.path().join("run");
    let summary = run_train(&cfg, &root, &["--model", &model.to_string_lossy()]);
    assert_eq!(summary["final_step"], 8, "{summary}");
    let (before, after) = (
        summary["eval_before"].as_f64().expect("eval_before"),
        summary["eval_after"].as_f64().expect("eval_after"),
    );
    let rewards = batch_rewards(&root);
    eprintln!(
        "SmolLM2 through the gateway: held-out success {before} before RL, {after} after 8 \
         steps; batch rewards {rewards:.3?}"
    );
    assert!(
        after >= before + 0.2,
        "RL through the gateway did not teach the model: {before} -> {after}; rewards {rewards:.3?}"
    );
}

/// A trajectory as alternating spans: (context tokens, then the sampled tokens' log-probs), in
/// order; the last context may be empty.
fn spans(t: &keel_store::Trajectory) -> Vec<(Vec<u32>, Vec<f32>)> {
    let mut out: Vec<(Vec<u32>, Vec<f32>)> = Vec::new();
    let mut i = 0;
    while i < t.tokens.len() {
        let sampled = (i..t.tokens.len())
            .find(|&j| t.loss_mask[j] == 1)
            .unwrap_or(t.tokens.len());
        let end = (sampled..t.tokens.len())
            .find(|&j| t.loss_mask[j] == 0)
            .unwrap_or(t.tokens.len());
        out.push((
            t.tokens[i..sampled].to_vec(),
            t.behaviour_logprobs[sampled..end].to_vec(),
        ));
        i = end;
    }
    out
}

/// Whether `stored` sampled log-probs are the `returned` ones (the content tokens; a stop
/// token, when the turn stopped at one, is stored after them), bit for bit in f32.
fn same_logprobs(stored: &[f32], returned: &serde_json::Value) -> bool {
    let returned: Vec<f32> = returned
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_f64())
                .map(|x| x as f32)
                .collect()
        })
        .unwrap_or_default();
    returned.len() <= stored.len()
        && stored.len() <= returned.len() + 1
        && returned[..] == stored[..returned.len()]
}

/// OAI-6, AGT-8: an agent on the text-completions API (examples/agents/text_agent.py, the real
/// `openai` client's `completions.create`) trains unchanged and token-exact. Its first prompt
/// is stored as transformers' tokenizer encodes it (no chat template); a retry of the same
/// call gets the same completion; the follow-up prompt, which extends the first prompt and its
/// answer, adds exactly its new text's tokens after the sampled ones; the rewritten prompt
/// starts a second segment; every sampled token's log-prob is the one the agent was given.
#[test]
fn a_text_completions_agent_trains_token_exact() {
    let AgentRun {
        dir,
        logs,
        root,
        model,
    } = train_agent(
        "../examples/agents/text_agent.py",
        &["--rewrite", "--log"],
        "",
        "",
    );
    let rows = read_agent_logs("tests/python/text_ids.py", &model, &logs, dir.path());
    for entry in std::fs::read_dir(&logs).expect("logs").flatten() {
        let log: serde_json::Value =
            serde_json::from_slice(&std::fs::read(entry.path()).expect("log")).expect("json");
        assert_eq!(
            log["ids"][0], log["ids"][1],
            "AGT-2: the retry is the same call"
        );
        assert_eq!(log["texts"][0], log["texts"][1]);
        assert!(
            log["objects"]
                .as_array()
                .is_some_and(|o| o.iter().all(|x| x == "text_completion")),
            "{log}"
        );
    }
    let mut episodes: std::collections::BTreeMap<(u64, u64), Vec<keel_store::Trajectory>> =
        Default::default();
    for batch in stored_batches(&root) {
        for t in batch.trajectories {
            episodes
                .entry((batch.batch_seq, t.episode_id))
                .or_default()
                .push(t);
        }
    }
    assert!(!episodes.is_empty(), "no episode was stored");
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_u64())
                    .map(|x| x as u32)
                    .collect()
            })
            .unwrap_or_default()
    };
    for segments in episodes.values() {
        assert_eq!(
            segments.len(),
            2,
            "the rewritten prompt is a second segment"
        );
        let (first, second) = (spans(&segments[0]), spans(&segments[1]));
        assert_eq!(first.len(), 2, "two turns in the first segment");
        assert_eq!(second.len(), 1, "one turn in the second");
        let found = rows.iter().any(|row| {
            first[0].0 == ids(&row["first"])
                && same_logprobs(&first[0].1, &row["logprobs"][0])
                && first[1].0 == ids(&row["rest"])
                && same_logprobs(&first[1].1, &row["logprobs"][2])
                && second[0].0 == ids(&row["fresh"])
                && same_logprobs(&second[0].1, &row["logprobs"][3])
        });
        assert!(
            found,
            "no agent's prompts and answers are this episode's tokens: first prompt {} tokens, follow-up {} tokens, fresh prompt {} tokens",
            first[0].0.len(),
            first[1].0.len(),
            second[0].0.len()
        );
    }
}

/// Async mode (`run.mode = "async"`): generators sample agent episodes while the learner
/// trains, within the staleness bound, and every answered call is journaled as in sync mode.
/// The calculator agent trains 4 steps; no episode fails, and every trained turn was sampled
/// at most `staleness_bound` versions before the update that used it (the learner refuses
/// older ones, so a finished run is the check; the versions are asserted from the batches).
#[test]
fn agents_train_in_async_mode() {
    let run = AgentRun::prepare();
    let command = run.command("../examples/agents/calculator_agent.py", &["--log"]);
    let cfg = config(run.dir.path(), &command, "", "");
    let toml = std::fs::read_to_string(&cfg).expect("config").replace(
        "steps = 2\n",
        "steps = 4\nmode = \"async\"\nstaleness_bound = 1\n",
    );
    std::fs::write(&cfg, toml).expect("config");
    let summary = run_train(&cfg, &run.root, &["--model", &run.model.to_string_lossy()]);
    assert_eq!(summary["final_step"], 4, "{summary}");
    let (trained, failed) = rollout_counts(&run.root);
    assert!(
        trained >= 16 && failed == 0,
        "trained {trained}, failed {failed}"
    );
    for batch in stored_batches(&run.root) {
        for t in &batch.trajectories {
            for turn in &t.turns {
                assert!(
                    turn.policy_version >= batch.policy_version,
                    "a turn older than its batch"
                );
            }
        }
    }
    assert_eq!(
        keel_integration::roles::files_under(&run.root.join("agent-journal")),
        0,
        "no record is left"
    );
}
