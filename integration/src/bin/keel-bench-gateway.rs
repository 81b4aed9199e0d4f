//! `keel-bench-gateway`: what serving turns through the OpenAI-compatible agent gateway costs
//! against sampling them directly (issue 34).
//!
//! Two ordinary in-process training runs (`run_job`) of the same tiny Qwen2.5-family model
//! (real chat template) on the same single-turn rows, seed and sampler, differing only in who
//! asks for the turn:
//! - `direct`: the `dataset` env; the engine renders each row's prompt and samples the answer.
//! - `gateway`: the `agent` env; each episode starts an agent process that sends the row's
//!   prompt to `/v1/chat/completions` once; keel's verifier scores the answer
//!   (`env.agent.reward = "verifier"`), as the dataset env does. Two agents: keel-echo-agent
//!   (compiled, no libtorch: starts in about a millisecond, so the gateway is what is timed)
//!   and the same call from Python on the standard library (`json` + `urllib`: the lightest
//!   real agent, whose start-up is ~150 ms of CPU).
//!
//! A batch is `--agents` concurrent episodes. The figure is the mean seconds to sample one
//! batch (the `rollout` events' `sample_seconds`), gateway over direct, measured in the same
//! run; the overhead includes starting one agent process per episode. Calls/s is the gateway
//! cell's episodes (one call each) over its sampling seconds.
//!
//! ```text
//! cargo build --release -p keel-envs -p keel-integration --bin keel-echo-agent --bin keel-bench-gateway
//! target/release/keel-bench-gateway [--steps 4] [--agents 64] [--turn-tokens 16] [--model DIR]
//! ```

use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context, Result};
use keel_actors::events::TrainEvent;
use keel_actors::{run_job, JobOptions, TrainConfig, TrainMetrics};
use keel_store::RunStore;

struct Args {
    steps: u64,
    agents: usize,
    turn_tokens: usize,
    /// A Hugging Face folder instead of the tiny Qwen2.5 (e.g. scripts/fetch_smollm2.sh's).
    model: Option<std::path::PathBuf>,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        steps: 4,
        agents: 64,
        turn_tokens: 16,
        model: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| -> Result<usize> {
            it.next()
                .with_context(|| format!("{name} needs a value"))?
                .parse()
                .with_context(|| format!("{name} takes a positive integer"))
        };
        match a.as_str() {
            "--steps" => args.steps = value("--steps")? as u64,
            "--agents" => args.agents = value("--agents")?,
            "--turn-tokens" => args.turn_tokens = value("--turn-tokens")?,
            "--model" => args.model = Some(it.next().context("--model needs a folder")?.into()),
            other => bail!(
                "unknown argument {other:?} (expected --steps N, --agents N, --turn-tokens N, --model DIR)"
            ),
        }
    }
    if args.steps == 0 || args.agents < 4 || !args.agents.is_multiple_of(4) || args.turn_tokens == 0
    {
        bail!("--steps and --turn-tokens must be at least 1, --agents a multiple of 4");
    }
    Ok(args)
}

/// The Python agent: one chat-completions call with the task's prompt, then exit.
const PY_AGENT: &str = r#"import json, os, urllib.request
task = json.loads(os.environ["KEEL_TASK"])
body = json.dumps({"model": "policy", "messages": task["prompt"]}).encode()
urllib.request.urlopen(urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
             "Content-Type": "application/json"})).read()
"#;

/// 4 × `agents` rows "What is a + b?" with their sums.
fn write_rows(path: &Path, agents: usize) -> Result<()> {
    let rows: Vec<String> = (0..4 * agents)
        .map(|i| {
            let (a, b) = (i % 17 + 2, i % 13 + 3);
            serde_json::json!({
                "data_source": "arith",
                "prompt": [{"role": "user", "content": format!("What is {a} + {b}?")}],
                "reward_model": {"ground_truth": (a + b).to_string()},
            })
            .to_string()
        })
        .collect();
    Ok(std::fs::write(path, rows.join("\n"))?)
}

/// Who asks for the turns of a cell.
enum Asker {
    /// The `dataset` env: the engine itself.
    Direct,
    /// The `agent` env starting this command per episode.
    Spawned(Vec<String>),
    /// The `agent` env serving a persistent pool that pulls episodes from this port.
    Pulled(u16),
}

/// The pool key the pulled cell's gateway reads (from this variable) and its pool sends.
const POOL_KEY_ENV: &str = "KEEL_BENCH_POOL_KEY";

fn cell_toml(args: &Args, data: &Path, model: &Path, asker: &Asker) -> Result<String> {
    let agent = "name = \"agent\"\n[env.agent]\nreward = \"verifier\"\nmax_calls = 1";
    let env = match asker {
        Asker::Direct => "name = \"dataset\"".to_string(),
        Asker::Spawned(command) => format!("{agent}\ncommand = {command:?}"),
        Asker::Pulled(port) => format!(
            "{agent}\nlaunch = \"pull\"\nbind = \"127.0.0.1:{port}\"\npool_key_env = \"{POOL_KEY_ENV}\""
        ),
    };
    let data = data.to_str().context("utf-8 data path")?;
    Ok(format!(
        r#"[run]
name = "bench-gateway"
seed = 11
steps = {steps}
checkpoint_every = 1000
threads = 1

[env]
concurrency = {agents}
{env}

[env.dataset]
train_file = "{data}"
eval_file = "{data}"
verifier = "exact"

[model]
path = "{model}"
context_len = 256

[sft]
steps = 0

[rollout]
tasks_per_batch = {tasks}
group_size = 4
eval_tasks = 4
eval_samples = 0
max_turn_tokens = {turn}
"#,
        steps = args.steps,
        agents = args.agents,
        tasks = args.agents / 4,
        turn = args.turn_tokens,
        model = model.display(),
    ))
}

/// Mean sampling seconds per batch, and episodes per batch.
fn run_cell(toml: &str) -> Result<(f64, f64)> {
    let cfg = TrainConfig::from_toml(toml).map_err(anyhow::Error::msg)?;
    let dir = tempfile::tempdir()?;
    let store = RunStore::open(dir.path().to_str().context("utf-8 temp dir")?)?;
    let metrics = TrainMetrics::new(&cfg.run.name)?;
    let seen: Arc<Mutex<Vec<(f64, usize)>>> = Arc::default();
    let sink_seen = seen.clone();
    let sink = Arc::new(move |e: &TrainEvent| {
        if let (
            TrainEvent::Rollout {
                sample_seconds,
                episodes,
                ..
            },
            Ok(mut s),
        ) = (e, sink_seen.lock())
        {
            s.push((*sample_seconds, *episodes));
        }
    });
    run_job(cfg, store, metrics, sink, JobOptions::default())?;
    let s = seen
        .lock()
        .map_err(|_| anyhow::anyhow!("event log poisoned"))?;
    if s.is_empty() {
        bail!("no batch was stored");
    }
    let n = s.len() as f64;
    Ok((
        s.iter().map(|x| x.0).sum::<f64>() / n,
        s.iter().map(|x| x.1 as f64).sum::<f64>() / n,
    ))
}

/// The pool process, killed when its cell is done.
struct PoolGuard(std::process::Child);

impl Drop for PoolGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn main() -> Result<()> {
    let args = parse_args()?;
    tch::set_num_threads(1);
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("rows.jsonl");
    write_rows(&data, args.agents)?;
    let model = match &args.model {
        Some(dir) => dir.clone(),
        None => keel_integration::family_models().join("qwen2.5"),
    };
    let script = dir.path().join("agent.py");
    std::fs::write(&script, PY_AGENT)?;
    let echo = std::env::current_exe()?.with_file_name("keel-echo-agent");
    if !echo.exists() {
        bail!(
            "{} is missing: build it (cargo build -p keel-envs --bin keel-echo-agent)",
            echo.display()
        );
    }
    let path = |p: &Path| p.to_str().map(str::to_owned).context("utf-8 path");
    let (direct, episodes) = run_cell(&cell_toml(&args, &data, &model, &Asker::Direct)?)?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let cells = [
        (
            "gateway, pulled by a keel-echo-agent pool",
            Asker::Pulled(port),
        ),
        (
            "gateway, keel-echo-agent per episode",
            Asker::Spawned(vec![path(&echo)?]),
        ),
        (
            "gateway, Python urllib agent per episode",
            Asker::Spawned(vec!["python3".into(), path(&script)?]),
        ),
    ];
    println!(
        "{} concurrent episodes per batch, {} steps, turns of up to {} tokens ({}, 1 thread)",
        args.agents,
        args.steps,
        args.turn_tokens,
        match &args.model {
            Some(dir) => dir.display().to_string(),
            None => "tiny Qwen2.5".into(),
        }
    );
    println!("| cell | sampling s/batch | episodes/batch | vs direct | calls/s |");
    println!("|---|---|---|---|---|");
    println!(
        "| direct (dataset env) | {direct:.3} | {episodes:.1} | 1.000× | {:.1} |",
        episodes / direct
    );
    let pool_key = "keel-bench-pool-key-0123456789";
    std::env::set_var(POOL_KEY_ENV, pool_key);
    for (name, asker) in cells {
        // The pool starts first and keeps pulling (no process per episode), as a sandbox pool
        // on other hosts would; it exits once the gateway is gone.
        let _pool = match &asker {
            Asker::Pulled(port) => Some(PoolGuard(
                std::process::Command::new(&echo)
                    .args(["--pull", &format!("http://127.0.0.1:{port}/v1")])
                    .args(["--workers", &args.agents.to_string()])
                    .env("KEEL_AGENT_POOL_KEY", pool_key)
                    .spawn()
                    .context("start the keel-echo-agent pool")?,
            )),
            _ => None,
        };
        let (gateway, n) = run_cell(&cell_toml(&args, &data, &model, &asker)?)?;
        println!(
            "| {name} | {gateway:.3} | {n:.1} | {:.3}× | {:.1} |",
            gateway / direct,
            n / gateway
        );
    }
    Ok(())
}
