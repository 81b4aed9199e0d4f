//! `rollout.backend = "vllm"` against a real vLLM 0.32 server on CPU (scripts/vllm_env.sh; the
//! tests fail with the reason when it cannot be installed, they never skip): a tiny untied
//! Qwen2 with log-probs far from uniform trains on calc (SFT + RL) with every behaviour
//! log-prob the engine reported equal to keel's recomputation under the version that sampled it
//! (multi-turn continuations through the prefix cache included), resumes after a SIGKILL with
//! no server left behind, takes weights in flight in async mode (aborted requests resubmitted
//! with their partial tokens, one digest per version; a tied-embedding model), restarts a
//! server killed mid-run, serves a `keel generator --rank 0` process on the `dataset` env (verl
//! rows), samples on a server it was pointed at (`rollout.vllm.url`), and refuses to sample when
//! a reload or a prefix-cache reset is skipped (VE-2).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use keel_integration::real_model::{addition_split, batch_rewards, installed, smollm2};
use keel_integration::{
    checkpoint_file, checkpoints, kill_at_checkpoint, log_tail, python, run_train, spawn_train,
    stored_batches, write_sum_rows,
};
use keel_learner::hf::{HfModel, LoadOptions};

/// The interpreter of the vLLM environment: `$KEEL_VLLM_PYTHON` (scripts/test.sh sets it), or
/// what scripts/vllm_env.sh installs and prints.
fn vllm_python() -> String {
    std::env::var("KEEL_VLLM_PYTHON").unwrap_or_else(|_| {
        installed(
            "vllm_env.sh",
            "vLLM (the vLLM backend is untested without it)",
        )
    })
}

/// The tiny Qwen2 the engine serves (integration/tests/python/vllm_tiny_model.py).
fn tiny_model(dir: &Path) -> PathBuf {
    model_folder(dir, false)
}

/// The tiny Qwen2, its embeddings tied (as SmolLM2's and Qwen2.5-0.5B's are) when `tied`.
fn model_folder(dir: &Path, tied: bool) -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/vllm_tiny_model.py");
    let out = dir.join("model");
    let tie = if tied { "tied" } else { "untied" };
    python(&[
        script.as_os_str(),
        out.as_os_str(),
        "0".as_ref(),
        tie.as_ref(),
    ]);
    out
}

/// A run of `steps` RL steps on calc with the vLLM backend; `extra` is appended (TOML).
fn config(dir: &Path, name: &str, steps: u64, mode: &str, extra: &str) -> PathBuf {
    let toml = format!(
        r#"
[run]
name = "{name}"
seed = 5
steps = {steps}
mode = "{mode}"
staleness_bound = 2
checkpoint_every = 1
device = "cpu"
threads = 1

[env]
name = "calc"
difficulty = 1

[model]
context_len = 256

[sft]
steps = 4
batch_size = 8
demos = 32

[rollout]
tasks_per_batch = 4
group_size = 4
max_turn_tokens = 12
eval_tasks = 4
eval_samples = 0
backend = "vllm"

[rollout.vllm]
python = "{python}"

[metrics]
enabled = false

[guard]
enabled = false

[learner]
algo = "grpo"
{extra}
"#,
        python = vllm_python()
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, toml).expect("write config");
    path
}

fn arg(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// The rollout temperature of the parity run: the engine's log-probs are after temperature
/// (`processed_logprobs`), as keel's are.
const TEMPERATURE: f64 = 0.7;

/// The engine's behaviour log-probs against keel's recomputation of every sampled token of
/// every stored batch, each with the checkpointed weights of the version that sampled that
/// token (RB-5: a turn's version changes included).
#[derive(Debug, Default)]
struct Parity {
    /// The largest |engine log-prob − keel log-prob|.
    worst: f32,
    /// Sampled tokens compared.
    tokens: usize,
    /// The most sampled turns of one trajectory.
    most_turns: usize,
    /// Tokens sampled by a newer version than their turn's first token.
    after_change: usize,
    /// The largest difference on those tokens had they been recomputed with their turn's
    /// first version instead: what a per-turn version would have claimed.
    worst_if_per_turn: f32,
}

fn engine_vs_keel(root: &Path, model_dir: &Path) -> Parity {
    let by_step: BTreeMap<u64, _> = checkpoints(root).into_iter().map(|m| (m.step, m)).collect();
    let mut models: BTreeMap<u64, HfModel> = BTreeMap::new();
    let mut keel_logprobs = |version: u64, ids: &[i64]| {
        let model = models.entry(version).or_insert_with(|| {
            let manifest = by_step
                .get(&version)
                .unwrap_or_else(|| panic!("no checkpoint of version {version}"));
            let mut m = HfModel::load(
                model_dir,
                LoadOptions::policy(tch::Device::Cpu, tch::Kind::Float),
            )
            .expect("load the folder");
            m.load_safetensors(&checkpoint_file(root, manifest, "model.safetensors"))
                .expect("load the checkpoint's weights");
            m
        });
        keel_learner::probe::sequence_logprobs(model, ids, TEMPERATURE).expect("recompute")
    };
    let mut p = Parity::default();
    for batch in stored_batches(root) {
        for traj in &batch.trajectories {
            p.most_turns = p.most_turns.max(traj.turns.len());
            let ids: Vec<i64> = traj.tokens.iter().map(|&t| i64::from(t)).collect();
            let mut by_version: BTreeMap<u64, Vec<f32>> = BTreeMap::new();
            for turn in &traj.turns {
                for t in (turn.start.max(1)..turn.end).filter(|&t| traj.loss_mask[t as usize] == 1)
                {
                    let engine = traj.behaviour_logprobs[t as usize];
                    let mut diff = |v: u64| {
                        let keel = by_version
                            .entry(v)
                            .or_insert_with(|| keel_logprobs(v, &ids));
                        (engine - keel[t as usize - 1]).abs()
                    };
                    p.worst = p.worst.max(diff(turn.version_at(t)));
                    p.tokens += 1;
                    if turn.version_at(t) != turn.policy_version {
                        p.after_change += 1;
                        p.worst_if_per_turn = p.worst_if_per_turn.max(diff(turn.policy_version));
                    }
                }
            }
        }
    }
    p
}

/// Sets the parity runs' sampling temperature in config `cfg`.
fn at_parity_temperature(cfg: &Path) {
    let text = std::fs::read_to_string(cfg).expect("config").replace(
        "backend = \"vllm\"\n",
        &format!("backend = \"vllm\"\ntemperature = {TEMPERATURE}\n"),
    );
    std::fs::write(cfg, text).expect("write config");
}

/// The vLLM servers keel started for run `name` (pid files of its engine folders) that still run.
fn live_servers(name: &str) -> Vec<i32> {
    let prefix = format!("keel-vllm-{name}-g");
    std::fs::read_dir(std::env::temp_dir())
        .expect("temp dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .filter_map(|e| std::fs::read_to_string(e.path().join("server.pid")).ok())
        .filter_map(|t| t.trim().parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("vllm"))
        })
        .collect()
}

/// Whether every server of run `name` has exited. A server is sent SIGTERM when its keel exits
/// (parent-death signal) and shuts down on its own: this waits for that, up to a minute.
fn servers_gone(name: &str) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !live_servers(name).is_empty() {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    true
}

/// Sync SFT + RL on calc through the engine at temperature 0.7, SIGKILLed after its step-1
/// checkpoint and resumed: the engine's behaviour log-probs are keel's within 1e-4 nats (f32)
/// for every sampled token, multi-turn episodes included, and no server outlives the run.
#[test]
fn vllm_trains_resumes_and_its_logprobs_are_keels() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = tiny_model(dir.path());
    let name = format!("vllm-sync-{}", std::process::id());
    let cfg = config(dir.path(), &name, 3, "sync", "");
    at_parity_temperature(&cfg);
    let root = dir.path().join("run");
    let with_model = ["--model", arg(&model)];
    let mut first = spawn_train(&cfg, &root, &with_model);
    kill_at_checkpoint(&mut first, &root, 1);
    drop(first);
    // VS-3: the SIGKILLed keel's server got its parent-death signal (or is reaped next start).
    let summary = run_train(&cfg, &root, &with_model);
    assert_eq!(summary["final_step"], 3, "{summary}");
    assert!(
        servers_gone(&name),
        "a vLLM server outlived its run:\n{}",
        log_tail(&root)
    );
    let p = engine_vs_keel(&root, &model);
    eprintln!("engine vs keel: {p:?}");
    assert!(
        p.tokens > 100,
        "only {} sampled tokens were checked",
        p.tokens
    );
    assert!(
        p.most_turns >= 2,
        "no multi-turn episode: the prefix cache was not exercised"
    );
    assert_eq!(p.after_change, 0, "sync mode: one version per turn");
    assert!(
        p.worst <= 1e-4,
        "engine and keel log-probs differ by {:e} nats over {} tokens",
        p.worst,
        p.tokens
    );
}

/// Async with weights in flight: swaps abort the engine's requests, which are resubmitted with
/// their partial tokens; no episode is lost and every turn's digest is its version's. Each
/// token records the version that sampled it: a turn a swap cut in two changes version at its
/// pause point (RB-5), and keel's recomputation under each token's version matches the
/// engine's log-probs where the turn's first version would not. The model has tied
/// embeddings: vLLM on CPU applies only part of a reload of a tied model, so keel hands the
/// engine untied folders (HS-4), and every swap passes the engine's probe.
#[test]
fn vllm_takes_weights_in_flight_without_losing_an_episode() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = model_folder(dir.path(), true);
    let name = format!("vllm-async-{}", std::process::id());
    let cfg = config(dir.path(), &name, 4, "async", "");
    at_parity_temperature(&cfg);
    let root = dir.path().join("run");
    let summary = run_train(&cfg, &root, &["--model", arg(&model)]);
    assert_eq!(summary["final_step"], 4, "{summary}");
    let mut digests: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for batch in stored_batches(&root) {
        assert_eq!(
            batch.trajectories.len(),
            16,
            "batch {} lost episodes",
            batch.batch_seq
        );
        for traj in &batch.trajectories {
            for turn in &traj.turns {
                assert!(
                    turn.policy_version >= batch.policy_version,
                    "a turn older than its batch"
                );
                let changes = turn.version_changes.iter();
                let versions = std::iter::once((turn.policy_version, turn.weights_digest))
                    .chain(changes.map(|c| (c.policy_version, c.weights_digest)));
                for (version, digest) in versions {
                    let d = digests.entry(version).or_default();
                    if !d.contains(&digest) {
                        d.push(digest);
                    }
                }
            }
        }
    }
    assert!(
        digests.values().all(|d| d.len() == 1),
        "a version sampled with two digests: {digests:?}"
    );
    let (mut updates, mut resubmitted) = (0, 0);
    for ev in keel_integration::events::train_events(&root) {
        if let keel_actors::events::TrainEvent::Rollout {
            weight_updates,
            resubmitted_requests,
            ..
        } = ev
        {
            updates += weight_updates;
            resubmitted += resubmitted_requests;
        }
    }
    eprintln!("in-flight swaps: {updates}, requests resubmitted: {resubmitted}");
    assert!(
        updates > 0 && resubmitted > 0,
        "no swap aborted a request in flight ({updates} swaps, {resubmitted} resubmitted)"
    );
    let p = engine_vs_keel(&root, &model);
    eprintln!("engine vs keel, per token: {p:?}");
    assert!(
        p.after_change > 0,
        "no turn changed version mid-turn, although {resubmitted} requests were resubmitted"
    );
    assert!(
        p.worst <= 1e-4,
        "per-token versions: engine and keel log-probs differ by {:e} nats",
        p.worst
    );
    assert!(
        p.worst_if_per_turn > 1e-3,
        "the tokens after a pause point would match their turn's first version too \
         ({:e} nats): the check cannot tell the versions apart",
        p.worst_if_per_turn
    );
}

/// VE-2: a skipped reload and a prefix cache kept across a swap are both refused before a
/// token is sampled with them, naming the version and the check.
#[test]
fn vllm_refuses_a_skipped_reload_and_a_kept_prefix_cache() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = tiny_model(dir.path());
    for (fault, check) in [
        ("skip_weight_reload", "on the vllm backend"),
        (
            "skip_prefix_cache_reset",
            "on the vllm (prefix cache) backend",
        ),
    ] {
        let name = format!("vllm-{}-{}", fault.replace('_', "-"), std::process::id());
        let cfg = config(
            dir.path(),
            &name,
            3,
            "sync",
            &format!("\n[faults]\n{fault} = true\n"),
        );
        let root = dir.path().join(&name);
        let status = spawn_train(&cfg, &root, &["--model", arg(&model)])
            .wait()
            .expect("wait");
        let log = log_tail(&root);
        assert!(!status.success(), "{fault}: the run succeeded:\n{log}");
        assert!(
            log.contains("failed its provenance probe") && log.contains(check),
            "{fault}: not refused by the engine check ({check}):\n{log}"
        );
    }
}

/// A stand-in for a server of another vLLM version at `rollout.vllm.url`: a Python HTTP server
/// answering `/version` with 0.11.0 (and 200 to anything else), killed when dropped.
struct OtherVersionServer(std::process::Child, u16);

impl OtherVersionServer {
    fn start() -> Self {
        let code = r#"
import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"version": "0.11.0"} if self.path == "/version" else {}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", 0), H)
print(server.server_address[1], flush=True)
server.serve_forever()
"#;
        let mut child = std::process::Command::new("python3")
            .args(["-c", code])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 runs");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)
            .expect("the port");
        let port = line.trim().parse().expect("a port number");
        OtherVersionServer(child, port)
    }
}

impl Drop for OtherVersionServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Bad input the engine meets: a server that runs another vLLM version is refused naming both
/// versions, and a model vLLM cannot load (keel can: head_dim 16, below what vLLM's CPU
/// attention supports) fails the run naming `rollout.vllm` with the server's own log tail.
#[test]
fn vllm_refuses_another_version_and_a_model_it_cannot_load() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = tiny_model(dir.path());
    let other = OtherVersionServer::start();
    let name = format!("vllm-other-{}", std::process::id());
    let cfg = config(dir.path(), &name, 1, "sync", "");
    let text = std::fs::read_to_string(&cfg).expect("config").replace(
        "[rollout.vllm]\n",
        &format!("[rollout.vllm]\nurl = \"http://127.0.0.1:{}\"\n", other.1),
    );
    std::fs::write(&cfg, text).expect("write config");
    let root = dir.path().join(&name);
    let status = spawn_train(&cfg, &root, &["--model", arg(&model)])
        .wait()
        .expect("wait");
    let log = log_tail(&root);
    assert!(!status.success(), "another vLLM version was driven:\n{log}");
    assert!(
        log.contains("runs vLLM 0.11.0") && log.contains("keel drives vLLM 0.32."),
        "the refusal does not name the versions:\n{log}"
    );
    drop(other);

    let narrow = dir.path().join("narrow");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/vllm_tiny_model.py");
    python(&[
        script.as_os_str(),
        narrow.as_os_str(),
        "0".as_ref(),
        "untied".as_ref(),
        "16".as_ref(),
    ]);
    let name = format!("vllm-unloadable-{}", std::process::id());
    let cfg = config(dir.path(), &name, 1, "sync", "");
    let root = dir.path().join(&name);
    let status = spawn_train(&cfg, &root, &["--model", arg(&narrow)])
        .wait()
        .expect("wait");
    let log = log_tail(&root);
    assert!(
        !status.success(),
        "vLLM served a model it cannot load:\n{log}"
    );
    assert!(
        log.contains("rollout.vllm")
            && log.contains("Unsupported CPU attention configuration: head_dim=16"),
        "the failure names neither the key nor the server's reason:\n{log}"
    );
    assert!(servers_gone(&name), "a failed server was left running");
}

/// A server that dies mid-run (SIGKILL of its process group, once a step is checkpointed) is
/// started again under the generators' restart budget and the run finishes; a missing
/// interpreter fails the run naming `rollout.vllm.python`.
#[test]
fn vllm_server_death_restarts_under_the_budget_and_a_missing_interpreter_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = tiny_model(dir.path());
    let name = format!("vllm-death-{}", std::process::id());
    let cfg = config(dir.path(), &name, 4, "sync", "");
    let root = dir.path().join("run");
    let mut run = spawn_train(&cfg, &root, &["--model", arg(&model)]);
    let mut killed = None;
    while killed.is_none() {
        if let Some(status) = run.try_wait().expect("poll keel") {
            panic!(
                "the run ended ({status}) before its server could be killed:\n{}",
                log_tail(&root)
            );
        }
        if keel_integration::head_step(&root).is_some_and(|s| s >= 1) {
            killed = live_servers(&name).first().copied();
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let group = nix::unistd::Pid::from_raw(killed.expect("a server"));
    nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL).expect("kill the server");
    let status = run.wait().expect("wait keel");
    assert!(
        status.success(),
        "the run did not survive its server's death:\n{}",
        log_tail(&root)
    );
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.with_extension("json")).expect("summary"))
            .expect("summary JSON");
    assert_eq!(summary["final_step"], 4, "{summary}");
    assert!(
        summary["generator_restarts"].as_u64() >= Some(1),
        "the server's death was not counted: {summary}"
    );

    let bad = dir.path().join("bad.toml");
    let text = std::fs::read_to_string(&cfg).expect("config");
    std::fs::write(
        &bad,
        text.replace(&vllm_python(), "/nonexistent/bin/python"),
    )
    .expect("write");
    let bad_root = dir.path().join("bad");
    let status = spawn_train(&bad, &bad_root, &["--model", arg(&model)])
        .wait()
        .expect("wait");
    let log = log_tail(&bad_root);
    assert!(
        !status.success(),
        "a missing interpreter was accepted:\n{log}"
    );
    assert!(
        log.contains("rollout.vllm.python") && log.contains("/nonexistent/bin/python"),
        "the error does not name the key and the path:\n{log}"
    );
}

/// `keel trainer` + `keel generator --rank 0` on the `dataset` env: the generator process starts
/// its own server, and both roles exit 0 with the run finished and no server left behind.
#[test]
fn vllm_serves_a_generator_process() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = tiny_model(dir.path());
    let name = format!("vllm-roles-{}", std::process::id());
    let cfg = config(
        dir.path(),
        &name,
        2,
        "sync",
        "\n[distributed]\npoll_ms = 20\n",
    );
    let text = std::fs::read_to_string(&cfg).expect("config");
    let (train, eval) = (
        dir.path().join("train.jsonl"),
        dir.path().join("test.jsonl"),
    );
    write_sum_rows(&train, 24, 0);
    write_sum_rows(&eval, 4, 0);
    let dataset = format!(
        "[env]\nname = \"dataset\"\n\n[env.dataset]\ntrain_file = {train:?}\neval_file = {eval:?}\nmax_turns = 2\n"
    );
    let text = text
        .replace("[env]\nname = \"calc\"\ndifficulty = 1\n", &dataset)
        .replace(
            "[model]\n",
            &format!("[model]\npath = \"{}\"\n", arg(&model)),
        );
    assert!(
        text.contains("name = \"dataset\""),
        "the env was not replaced"
    );
    std::fs::write(&cfg, text).expect("write config");
    let root = dir.path().join("root");
    let mut roles = keel_integration::roles::Roles::new(dir.path(), cfg, arg(&root));
    roles.start_trainer();
    roles.start_generator(0);
    roles.finish_ok();
    assert_eq!(
        keel_integration::head_step(&root),
        Some(2),
        "{}",
        roles.logs()
    );
    assert!(
        servers_gone(&name),
        "the generator process's server outlived it"
    );
}

/// SFT then RL on the `dataset` env (verl rows), once per backend: the held-out success of the
/// SFT-trained policy evaluated greedily through the engine is the built-in sampler's, and above
/// the untrained policy's 0, so the engine serves the trained weights. Both runs are
/// deterministic (sync mode, same seeds, greedy evaluation), so the comparison is too.
#[test]
fn vllm_evaluates_the_trained_policy_as_keel_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = tiny_model(dir.path());
    let (train, eval) = (
        dir.path().join("train.jsonl"),
        dir.path().join("test.jsonl"),
    );
    write_sum_rows(&train, 40, 0);
    write_sum_rows(&eval, 8, 0);
    let dataset = format!(
        "[env]\nname = \"dataset\"\n\n[env.dataset]\ntrain_file = {train:?}\neval_file = {eval:?}\nmax_turns = 2\n"
    );
    let mut solved = Vec::new();
    for backend in ["keel", "vllm"] {
        let name = format!("vllm-eval-{backend}-{}", std::process::id());
        let cfg = config(dir.path(), &name, 2, "sync", "");
        let text = std::fs::read_to_string(&cfg)
            .expect("config")
            .replace("[env]\nname = \"calc\"\ndifficulty = 1\n", &dataset)
            .replace(
                "steps = 4\nbatch_size = 8\ndemos = 32",
                "steps = 400\nbatch_size = 8\ndemos = 200",
            )
            .replace("eval_tasks = 4", "eval_tasks = 8")
            .replace("backend = \"vllm\"", &format!("backend = \"{backend}\""));
        std::fs::write(&cfg, text).expect("write config");
        let root = dir.path().join(&name);
        let summary = run_train(&cfg, &root, &["--model", arg(&model)]);
        assert_eq!(summary["final_step"], 2, "{summary}");
        solved.push(summary["eval_before"].as_f64().expect("eval_before"));
    }
    eprintln!(
        "held-out success after SFT: keel {}, vllm {}",
        solved[0], solved[1]
    );
    assert!(solved[0] > 0.0, "SFT taught the policy nothing: {solved:?}");
    assert_eq!(
        solved[0], solved[1],
        "the engine evaluates another policy than keel's sampler (keel, vllm)"
    );
}

/// A sync run of `steps` RL steps at learning rate `lr` on SmolLM2: [`config`] with batches of
/// 8 tasks, 2 threads and no intermediate checkpoints (each is 1.6 GB), then `edits`
/// (`(from, to)` replacements of its text).
fn real_model_config(
    dir: &Path,
    name: &str,
    (steps, lr): (u64, &str),
    edits: &[(&str, &str)],
) -> PathBuf {
    let cfg = config(dir, name, steps, "sync", &format!("lr = {lr}\n"));
    let mut text = std::fs::read_to_string(&cfg)
        .expect("config")
        .replace("checkpoint_every = 1", "checkpoint_every = 100")
        .replace("threads = 1", "threads = 2")
        .replace("tasks_per_batch = 4", "tasks_per_batch = 8");
    for (from, to) in edits {
        assert!(text.contains(from), "{from:?} is not in the config");
        text = text.replace(from, to);
    }
    std::fs::write(&cfg, text).expect("write config");
    cfg
}

/// RL through the engine learns, on a real pretrained model: SmolLM2-135M-Instruct knows that
/// 3 plus 5 is 8 but mostly says so at length, so within 16 tokens its last number is rarely
/// the sum (transformers, greedy: 3 of 16); eight GRPO steps sampled by vLLM, each version
/// swapped in and verified, teach it to answer with the sum.
#[test]
fn vllm_rl_teaches_a_real_model_to_answer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = smollm2();
    let (train, eval) = addition_split(dir.path());
    let name = format!("vllm-learns-{}", std::process::id());
    let dataset = format!(
        "[env]\nname = \"dataset\"\n\n[env.dataset]\ntrain_file = {train:?}\neval_file = {eval:?}\nmax_turns = 2\nverifier = \"numeric\"\n"
    );
    let cfg = real_model_config(
        dir.path(),
        &name,
        (8, "5e-5"),
        &[
            ("[env]\nname = \"calc\"\ndifficulty = 1\n", &dataset),
            ("steps = 4\nbatch_size = 8\ndemos = 32", "steps = 0"),
            ("max_turn_tokens = 12", "max_turn_tokens = 16"),
            ("eval_tasks = 4", "eval_tasks = 16"),
        ],
    );
    let root = dir.path().join(&name);
    let summary = run_train(&cfg, &root, &["--model", arg(&model)]);
    assert_eq!(summary["final_step"], 8, "{summary}");
    let (before, after) = (
        summary["eval_before"].as_f64().expect("eval_before"),
        summary["eval_after"].as_f64().expect("eval_after"),
    );
    let rewards = batch_rewards(&root);
    eprintln!(
        "SmolLM2 through vLLM: held-out success {before} before RL, {after} after 8 steps; \
         batch rewards {rewards:.3?}"
    );
    assert!(
        after >= before + 0.2,
        "RL through the engine did not teach the model: {before} -> {after}; rewards {rewards:.3?}"
    );
}

/// SFT then RL through the engine on calc, a multi-turn tool env, with a real model: a short
/// SFT warm start teaches SmolLM2-135M-Instruct calc's action format (greedy held-out success
/// is then near 1), and GRPO steps sampled by vLLM make its sampled answers right: held-out
/// avg@4 at the rollout temperature rises.
#[test]
fn vllm_sft_then_rl_learns_calc_on_a_real_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = smollm2();
    let name = format!("vllm-calc-{}", std::process::id());
    let cfg = real_model_config(
        dir.path(),
        &name,
        (6, "3e-5"),
        &[
            ("context_len = 256", "context_len = 384"),
            (
                "steps = 4\nbatch_size = 8\ndemos = 32",
                "steps = 10\nbatch_size = 8\ndemos = 64\nlr = 3e-5",
            ),
            (
                "eval_tasks = 4\neval_samples = 0",
                "eval_tasks = 16\neval_samples = 4",
            ),
        ],
    );
    let root = dir.path().join(&name);
    let summary = run_train(&cfg, &root, &["--model", arg(&model)]);
    assert_eq!(summary["final_step"], 6, "{summary}");
    let avg_at_4: Vec<(String, f64)> = keel_integration::events::train_events(&root)
        .into_iter()
        .filter_map(|ev| match ev {
            keel_actors::events::TrainEvent::Eval {
                phase, avg_at_k, ..
            } => Some((phase, avg_at_k?)),
            _ => None,
        })
        .collect();
    let rewards = batch_rewards(&root);
    eprintln!(
        "SmolLM2 on calc through vLLM: greedy held-out success {} after SFT, {} after 6 RL \
         steps; held-out avg@4 {avg_at_4:?}; batch rewards {rewards:.3?}",
        summary["eval_before"], summary["eval_after"]
    );
    let [(_, before), (_, after)] = avg_at_4[..] else {
        panic!("expected an avg@4 before and after RL: {avg_at_4:?}");
    };
    assert!(
        after >= before + 0.15,
        "RL through the engine did not improve calc: avg@4 {before} -> {after}; rewards {rewards:.3?}"
    );
}

/// `rollout.vllm.url`: keel samples on a server it did not start (dev mode, the flags the key
/// documents): it swaps its own weights in, verifies them, trains, and leaves the server running
/// (VE-3).
#[test]
fn vllm_samples_on_a_server_it_was_pointed_at() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = tiny_model(dir.path());
    let port = keel_integration::free_port();
    let log = std::fs::File::create(dir.path().join("server.log")).expect("log");
    let spec = keel_actors::vllm::server::ServerSpec {
        python: vllm_python().into(),
        model_dir: model.clone(),
        max_model_len: 256,
        dtype: "float32".into(),
        block_size: 32,
        log: dir.path().join("server.log"),
        health_timeout: std::time::Duration::from_secs(600),
    };
    let mut server = keel_integration::Guarded::spawn(
        keel_actors::vllm::server::command(&spec, port)
            .stdout(log.try_clone().expect("log"))
            .stderr(log),
    )
    .expect("start the vLLM server");
    let url = format!("http://127.0.0.1:{port}");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(std::time::Duration::from_secs(2)))
        .build()
        .into();
    while agent.get(format!("{url}/health")).call().is_err() {
        if let Some(status) = server.try_wait().expect("poll the server") {
            let text = std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default();
            panic!("the vLLM server exited ({status}):\n{text}");
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    let name = format!("vllm-url-{}", std::process::id());
    let cfg = config(dir.path(), &name, 2, "sync", "");
    let text = std::fs::read_to_string(&cfg).expect("config").replace(
        "[rollout.vllm]\n",
        &format!("[rollout.vllm]\nurl = \"{url}\"\n"),
    );
    std::fs::write(&cfg, text).expect("write config");
    let root = dir.path().join("run");
    let summary = run_train(&cfg, &root, &["--model", arg(&model)]);
    assert_eq!(summary["final_step"], 2, "{summary}");
    assert!(
        server.try_wait().expect("poll the server").is_none(),
        "keel stopped a server it did not start"
    );
    assert!(
        agent.get(format!("{url}/health")).call().is_ok(),
        "the server no longer answers"
    );
}
