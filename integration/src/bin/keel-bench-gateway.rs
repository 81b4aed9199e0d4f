//! `keel-bench-gateway`: what serving turns through the OpenAI-compatible agent gateway costs
//! against sampling them directly (issue 34).
//!
//! Two ordinary in-process training runs (`run_job`) of the same tiny Qwen2.5-family model
//! (real chat template) on the same single-turn rows, seed and sampler, differing only in who
//! asks for the turn:
//! - `direct`: the `dataset` env; the engine renders each row's prompt and samples the answer.
//! - `gateway`: the `agent` env; each episode starts an agent process (this binary with
//!   `--agent`: a compiled HTTP client, so Python start-up is not what is timed) that sends the
//!   row's prompt to `/v1/chat/completions` once; keel's verifier scores the answer
//!   (`env.agent.reward = "verifier"`), as the dataset env does.
//!
//! A batch is `--agents` concurrent episodes. The figure is the mean seconds to sample one
//! batch (the `rollout` events' `sample_seconds`), gateway over direct, measured in the same
//! run; the overhead includes starting one agent process per episode. Calls/s is the gateway
//! cell's episodes (one call each) over its sampling seconds.
//!
//! ```text
//! cargo build --release -p keel-integration --bin keel-bench-gateway
//! target/release/keel-bench-gateway [--steps 4] [--agents 64] [--turn-tokens 16]
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
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        steps: 4,
        agents: 64,
        turn_tokens: 16,
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
            other => bail!(
                "unknown argument {other:?} (expected --steps N, --agents N, --turn-tokens N)"
            ),
        }
    }
    if args.steps == 0 || args.agents < 4 || args.agents % 4 != 0 || args.turn_tokens == 0 {
        bail!("--steps and --turn-tokens must be at least 1, --agents a multiple of 4");
    }
    Ok(args)
}

/// The agent: one chat-completions call with the task's prompt, then exit.
fn agent() -> Result<()> {
    let task: serde_json::Value =
        serde_json::from_str(&std::env::var("KEEL_TASK").context("KEEL_TASK")?)?;
    let base = std::env::var("OPENAI_BASE_URL").context("OPENAI_BASE_URL")?;
    let key = std::env::var("OPENAI_API_KEY").context("OPENAI_API_KEY")?;
    let body = serde_json::json!({"model": "policy", "messages": task["prompt"]});
    ureq::post(&format!("{base}/chat/completions"))
        .header("Authorization", &format!("Bearer {key}"))
        .send_json(&body)
        .context("the chat call")?;
    Ok(())
}

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

fn cell_toml(args: &Args, data: &Path, model: &Path, agent: Option<&Path>) -> Result<String> {
    let env = match agent {
        None => "name = \"dataset\"".to_string(),
        Some(bin) => format!(
            "name = \"agent\"\n[env.agent]\ncommand = [{:?}, \"--agent\"]\nreward = \"verifier\"\nmax_calls = 1",
            bin.to_str().context("utf-8 binary path")?
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

fn main() -> Result<()> {
    if std::env::args().nth(1).as_deref() == Some("--agent") {
        return agent();
    }
    let args = parse_args()?;
    tch::set_num_threads(1);
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("rows.jsonl");
    write_rows(&data, args.agents)?;
    let model = keel_integration::family_models().join("qwen2.5");
    let me = std::env::current_exe()?;
    let (direct, episodes) = run_cell(&cell_toml(&args, &data, &model, None)?)?;
    let (gateway, gateway_episodes) = run_cell(&cell_toml(&args, &data, &model, Some(&me))?)?;
    println!(
        "{} concurrent episodes per batch, {} steps, turns of up to {} tokens (tiny Qwen2.5, 1 thread)",
        args.agents, args.steps, args.turn_tokens
    );
    println!("| cell | sampling s/batch | episodes/batch | vs direct |");
    println!("|---|---|---|---|");
    println!("| direct (dataset env) | {direct:.3} | {episodes:.1} | 1.000× |");
    println!(
        "| gateway (agent env, one call per agent process) | {gateway:.3} | {gateway_episodes:.1} | {:.3}× |",
        gateway / direct
    );
    println!(
        "gateway overhead per batch: {:+.1}%; calls/s through the gateway: {:.1}",
        100.0 * (gateway / direct - 1.0),
        gateway_episodes / gateway
    );
    Ok(())
}
