//! `keel`: the command-line front end. A thin shell over the `keel-actors` runtime and the
//! `keel-store` run root: parse arguments and config, wire logs, progress and metrics, run.

mod cli;
mod metrics_server;
mod progress;

use std::path::Path;

use anyhow::{Context, Result};
use clap::Parser;

use keel_actors::{run_job, JobOptions, TrainConfig, TrainMetrics};
use keel_store::RunStore;

use cli::{CkptCommand, Cli, Command, ConfigCommand};

fn main() {
    let cli = Cli::parse();
    init_tracing(&cli);
    if let Err(e) = run(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn init_tracing(cli: &Cli) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("KEEL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&cli.log));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if cli.log_json {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn load_config(path: Option<&Path>) -> Result<TrainConfig> {
    match path {
        None => Ok(TrainConfig::default()),
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("cannot read config {}", p.display()))?;
            TrainConfig::from_toml(&text).with_context(|| format!("in config {}", p.display()))
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Train(args) => train(args),
        Command::Config { command: ConfigCommand::Show { config } } => {
            let cfg = load_config(config.as_deref())?;
            print!("{}", cfg.to_toml());
            Ok(())
        }
        Command::Ckpt { command: CkptCommand::List { run_root } } => ckpt_list(&run_root),
    }
}

fn train(args: cli::TrainArgs) -> Result<()> {
    let mut cfg = load_config(args.config.as_deref())?;
    if let Some(steps) = args.steps {
        cfg.run.steps = steps;
    }
    if let Some(port) = args.metrics_port {
        cfg.metrics.port = port;
    }
    cfg.validate().context("invalid configuration")?;
    let run_root = args.run_root.unwrap_or_else(|| format!("runs/{}", cfg.run.name));
    let store = RunStore::open(&run_root).with_context(|| format!("cannot open run root {run_root}"))?;
    let metrics = TrainMetrics::new(&cfg.run.name).context("cannot register metrics")?;
    let _server = if cfg.metrics.enabled {
        let server = metrics_server::serve(&cfg.metrics.bind, cfg.metrics.port, metrics.clone())?;
        eprintln!("metrics: http://{}/metrics", server.addr());
        Some(server)
    } else {
        None
    };
    eprintln!("run root: {}", store.root_url());
    let progress = progress::Progress::new(cfg.run.steps, args.no_progress);
    let outcome = run_job(cfg, store, metrics, progress.sink(), JobOptions::default())?;
    progress.finish();
    println!("held-out success before RL (after SFT): {:.3}", outcome.eval_before);
    println!("held-out success after RL:              {:.3}", outcome.eval_after);
    println!(
        "steps: {}  last checkpoint: {}  resumed from: {}  reused batches: {}  dropped batches: {}",
        outcome.final_step,
        outcome.last_checkpoint.as_deref().unwrap_or("-"),
        outcome.resumed_from.as_deref().unwrap_or("-"),
        outcome.reused_batches,
        outcome.dropped_batches
    );
    if let Some(path) = args.summary_json {
        std::fs::write(&path, serde_json::to_string_pretty(&outcome)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

fn ckpt_list(run_root: &str) -> Result<()> {
    let store = RunStore::open(run_root).with_context(|| format!("cannot open run root {run_root}"))?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let list = rt.block_on(store.list_checkpoints())?;
    let head = rt.block_on(store.latest_checkpoint())?.map(|m| m.id);
    if list.is_empty() {
        println!("no checkpoints under {run_root}");
        return Ok(());
    }
    println!("{:<20} {:>6} {:>8} {:<20} {:<16} {:>8}", "id", "step", "version", "parent", "tags", "eval");
    for m in list {
        let mark = if head.as_deref() == Some(m.id.as_str()) { " <- HEAD" } else { "" };
        let eval = m.metrics.get("eval_success_before").map(|v| format!("{v:.3}")).unwrap_or_else(|| "-".into());
        println!(
            "{:<20} {:>6} {:>8} {:<20} {:<16} {:>8}{mark}",
            m.id,
            m.step,
            m.policy_version,
            m.parent.as_deref().unwrap_or("-"),
            m.tags.join(","),
            eval
        );
    }
    Ok(())
}
