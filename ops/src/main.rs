//! `keel`: the command-line front end. A thin shell over the `keel-actors` runtime and the
//! `keel-store` run root: parse arguments and config, wire logs, progress and metrics, run.

mod algo_cmd;
mod arena;
mod ckpt;
mod ckpt_export;
mod cli;
mod data_cmd;
mod env_cmd;
mod explain;
mod launch;
mod lineage;
mod metrics_server;
mod preemption;
mod progress;
mod pushgateway;
mod report;
mod store_retries;
mod term_signals;

use std::path::Path;

use anyhow::{Context, Result};
use clap::Parser;

use keel_actors::{
    run_generator, run_job, GeneratorExit, JobOptions, Role, TrainConfig, TrainMetrics,
};
use keel_store::RunStore;

use cli::{CkptCommand, Cli, Command, ConfigCommand};

fn main() {
    let cli = Cli::parse();
    init_tracing(&cli);
    if let Err(e) = run(cli) {
        eprintln!("error: {}", error_chain(&e));
        std::process::exit(exit_code(&e));
    }
}

/// `keel train` / `keel trainer` exit with this when the collapse guard gave up (its rewinds
/// spent, GD-5), so a driver (`keel arena`, a batch script) can tell a collapsed run from a
/// broken one; every other error exits 1.
pub const COLLAPSED_EXIT: i32 = 3;

fn exit_code(e: &anyhow::Error) -> i32 {
    let collapsed = e.chain().any(|c| {
        matches!(
            c.downcast_ref::<keel_actors::ActorError>(),
            Some(keel_actors::ActorError::Collapse { .. })
        )
    });
    if collapsed {
        COLLAPSED_EXIT
    } else {
        1
    }
}

/// The error and its causes, outermost first, each said once: many errors print their source
/// inline, so a cause whose text is already in the line is not repeated.
fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

fn init_tracing(cli: &Cli) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let filter = tracing_subscriber::EnvFilter::try_from_env("KEEL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&cli.log));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colour_logs(
            std::io::IsTerminal::is_terminal(&std::io::stderr()),
            std::env::var_os("NO_COLOR").as_deref(),
        ));
    let fmt = if cli.log_json {
        fmt.json().boxed()
    } else {
        fmt.boxed()
    };
    // The retry counter has its own filter, so it sees retries whatever the log filter (RY-1).
    let counter = store_retries::RetryCounter.with_filter(store_retries::retry_events());
    tracing_subscriber::registry()
        .with(fmt.with_filter(filter))
        .with(counter)
        .init();
}

/// Whether log lines carry ANSI colours: only on a terminal, and not when `NO_COLOR` is set to
/// anything non-empty (no-color.org).
fn colour_logs(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// The config at `path` (read, parsed, validated), or the built-in defaults.
pub(crate) fn load_config(path: Option<&Path>) -> Result<TrainConfig> {
    match path {
        None => Ok(TrainConfig::default()),
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("cannot read config {}", p.display()))?;
            TrainConfig::from_toml(&text).with_context(|| format!("in config {}", p.display()))
        }
    }
}

/// Whether the config file at `path` sets `[section] key` itself.
fn config_sets(path: Option<&Path>, section: &str, key: &str) -> bool {
    path.and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|text| text.parse::<toml::Table>().ok())
        .and_then(|t| t.get(section)?.get(key).cloned())
        .is_some()
}

/// The run root when `--run-root` is not given: `runs/<run.name>`, or with a model folder and
/// no `run.name` in the config, `runs/<the folder's name>` (a Hugging Face run never resumes
/// into the quickstart's root by accident).
fn default_run_root(cfg: &TrainConfig, config: Option<&Path>) -> String {
    let folder = cfg
        .model_dir()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .filter(|n| !n.is_empty() && !config_sets(config, "run", "name"));
    format!("runs/{}", folder.as_deref().unwrap_or(&cfg.run.name))
}

/// `model.context_len` defaults to the positions of a local model folder (`--model DIR`)
/// when the config file does not set it; the built-in model keeps its default.
pub(crate) fn default_context_to_model(cfg: &mut TrainConfig, config: Option<&Path>) -> Result<()> {
    if config_sets(config, "model", "context_len") {
        return Ok(());
    }
    let Some(dir) = cfg.model_dir().filter(|d| d.join("config.json").is_file()) else {
        return Ok(());
    };
    let positions = keel_learner::hf::HfConfig::load(&dir)
        .with_context(|| format!("model folder {}", dir.display()))?
        .max_position_embeddings;
    cfg.model.context_len = positions;
    eprintln!(
        "model.context_len = {positions}, the positions of {} (set it in the config to bound episodes lower: the sampler's memory, and with rollout.batch_invariant its cost, grow with it)",
        dir.display()
    );
    Ok(())
}

/// The sampling defaults of the model folder's generation_config.json, reported next to what
/// keel samples with: keel samples the full distribution at `rollout.temperature` (the
/// learner's log-probs assume exactly that, RO-2), so top_p/top_k are reported, not applied;
/// the temperature applies by setting `rollout.temperature`.
pub(crate) fn generation_defaults(cfg: &TrainConfig) -> Option<String> {
    let dir = cfg.model_dir()?;
    let text = std::fs::read_to_string(dir.join("generation_config.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let keys = ["temperature", "top_p", "top_k", "repetition_penalty"];
    let found: Vec<String> = keys
        .iter()
        .filter_map(|k| v.get(*k).map(|x| format!("{k} {x}")))
        .collect();
    (!found.is_empty()).then(|| {
        format!(
            "generation_config.json suggests {}; keel samples the full distribution at rollout.temperature = {} (set it to use the model's temperature; top_p/top_k would make the samples off-policy for the learner)",
            found.join(", "),
            cfg.rollout.temperature
        )
    })
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Train(args) => train(args, Role::Train),
        Command::Trainer(args) => train(args, Role::Trainer),
        Command::Generator(args) => generator(args),
        Command::Learner(args) => learner_rank(args),
        Command::Config {
            command: ConfigCommand::Show { config },
        } => {
            let cfg = load_config(config.as_deref())?;
            print!("{}", cfg.to_toml());
            Ok(())
        }
        Command::Config {
            command: ConfigCommand::Explain { markdown },
        } => {
            explain::print(markdown);
            Ok(())
        }
        Command::Ckpt {
            command: CkptCommand::List { run_root },
        } => ckpt::list(&run_root),
        Command::Ckpt {
            command: CkptCommand::Lineage { run_root },
        } => ckpt::lineage(&run_root),
        Command::Ckpt {
            command: CkptCommand::Show { id, run_root },
        } => ckpt::show(&run_root, &id),
        Command::Ckpt {
            command: CkptCommand::Tag { id, tag, run_root },
        } => ckpt::tag(&run_root, &id, &tag),
        Command::Ckpt {
            command: CkptCommand::Verify { id, run_root },
        } => ckpt::verify(&run_root, &id),
        Command::Ckpt {
            command:
                CkptCommand::Export {
                    id,
                    out,
                    run_root,
                    peft,
                    base,
                },
        } => ckpt_export::export(
            &run_root,
            &id,
            &out,
            &ckpt_export::ExportOptions {
                peft,
                base: base.as_deref(),
            },
        ),
        Command::Ckpt {
            command:
                CkptCommand::Gc {
                    run_root,
                    keep_last,
                    orphan_min_age_s,
                    dry_run,
                },
        } => ckpt::gc(&run_root, keep_last, orphan_min_age_s, dry_run),
        Command::Report(args) => run_report(args),
        Command::Arena(args) => arena::run(args),
        Command::Env { command } => env_cmd::run(command),
        Command::Data { command } => data_cmd::run(command),
        Command::Algo { command } => algo_cmd::run(command),
        Command::Launch { command } => launch::run(command),
    }
}

fn run_report(args: cli::ReportArgs) -> Result<()> {
    let store =
        RunStore::open(&args.run).with_context(|| format!("cannot open run root {}", args.run))?;
    let text = keel_actors::process::block_on(keel_actors::jsonl::read_log(&store))?
        .with_context(|| format!("cannot read the metrics log of {}", args.run))?;
    if text.is_empty() {
        anyhow::bail!(
            "{} has no metrics log ({}/ is empty): no trainer has run there",
            args.run,
            keel_actors::jsonl::METRICS_DIR
        );
    }
    let log = report::parse_log(&text);
    let out = args.out.unwrap_or_else(|| {
        if args.run.contains("://") {
            let name = args
                .run
                .trim_end_matches('/')
                .rsplit('/')
                .next()
                .unwrap_or("run");
            std::path::PathBuf::from(format!("report-{name}"))
        } else {
            Path::new(&args.run).join("report")
        }
    });
    let text = report::load_font();
    if !text {
        eprintln!("report: no font found (install fonts-dejavu-core or set KEEL_REPORT_FONT); plots are drawn without text");
    }
    let bar = indicatif::ProgressBar::new(report::CURVES.len() as u64 + 1);
    if args.no_progress {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar.set_style(
        indicatif::ProgressStyle::with_template("report {pos}/{len} {wide_bar} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    report::write_report(&args.run, &log, &out, text, &bar)?;
    bar.finish_and_clear();
    println!("report: {}", out.join("summary.md").display());
    Ok(())
}

fn train(args: cli::TrainArgs, role: Role) -> Result<()> {
    let mut cfg = load_config(args.config.as_deref())?;
    apply_train_flags(&mut cfg, &args)?;
    default_context_to_model(&mut cfg, args.config.as_deref())?;
    cfg.validate().context("invalid configuration")?;
    cfg.preflight().context("the model cannot be trained")?;
    if let Some(line) = generation_defaults(&cfg) {
        eprintln!("{line}");
    }
    let run_root = args
        .run_root
        .clone()
        .unwrap_or_else(|| default_run_root(&cfg, args.config.as_deref()));
    let store =
        RunStore::open(&run_root).with_context(|| format!("cannot open run root {run_root}"))?;
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
    let push = (!cfg.metrics.pushgateway_url.is_empty())
        .then(|| (cfg.metrics.clone(), cfg.run.name.clone()));
    let branch = start_branch(&args, &store)?;
    let options = JobOptions {
        from: args.from.clone(),
        branch,
        reference: args.reference.clone(),
        role,
        stop: preemption::stop_signal(cfg.run.sigterm_grace_s)?,
        ..JobOptions::default()
    };
    let result = run_job(cfg, store, metrics.clone(), progress.sink(), options);
    progress.finish();
    if let Some((push_to, run)) = push {
        push_final_metrics(&push_to, &run, &metrics);
    }
    let outcome = result?;
    print_outcome(&outcome);
    if let Some(path) = args.summary_json {
        std::fs::write(&path, serde_json::to_string_pretty(&outcome)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// `keel train`'s flags over the config's values (`--algo`, `--env`, `--model`, `--critic`,
/// `--steps`, `--metrics-port`).
fn apply_train_flags(cfg: &mut TrainConfig, args: &cli::TrainArgs) -> Result<()> {
    if let Some(name) = &args.algo {
        cfg.learner.algo = keel_learner::Algo::from_name(name).with_context(|| {
            let names: Vec<String> = keel_learner::Algo::ALL.iter().map(|p| p.name()).collect();
            format!(
                "--algo {name:?} is not a preset; choose one of {}",
                names.join(", ")
            )
        })?;
    }
    if let Some(env) = &args.env {
        cfg.env.name = env.clone();
    }
    if let Some(dir) = &args.model {
        cfg.model.path = dir.to_string_lossy().into_owned();
    }
    if let Some(dir) = &args.critic {
        cfg.model.critic_path = dir.to_string_lossy().into_owned();
    }
    if let Some(steps) = args.steps {
        cfg.run.steps = steps;
    }
    if let Some(port) = args.metrics_port {
        cfg.metrics.port = port;
    }
    Ok(())
}

/// The branch the run continues on: `--branch`, or with neither `--branch` nor `--from` where
/// the collapse guard's rewinds led (GD-6; None: the default branch).
fn start_branch(args: &cli::TrainArgs, store: &RunStore) -> Result<Option<String>> {
    Ok(match (&args.branch, &args.from) {
        (None, None) => {
            let b = keel_actors::process::block_on(keel_actors::guard::follow_rewinds(
                store,
                keel_store::DEFAULT_BRANCH,
            ))??;
            (b != keel_store::DEFAULT_BRANCH).then(|| {
                eprintln!("branch: {b} (a collapse-guard rewind moved the run there)");
                b
            })
        }
        _ => args.branch.clone(),
    })
}

/// Batch jobs: the final values outlive the process (PGW-1), also when the run failed.
fn push_final_metrics(
    push_to: &keel_actors::config::MetricsSection,
    run: &str,
    metrics: &TrainMetrics,
) {
    store_retries::export(metrics);
    match pushgateway::push(push_to, run, metrics.render()) {
        Ok(()) => eprintln!(
            "metrics pushed to {}",
            keel_envs::redact_url(&pushgateway::group_url(&push_to.pushgateway_url, run))
        ),
        Err(e) => eprintln!("warning: {}", error_chain(&e)),
    }
}

/// `keel train`'s closing lines: held-out success before and after RL, the books, and how a
/// stopped run ends.
fn print_outcome(outcome: &keel_actors::JobOutcome) {
    let success = |v: f64, none: &str| {
        if v.is_finite() {
            format!("{v:.3}")
        } else {
            none.to_string()
        }
    };
    println!(
        "held-out success before RL (after SFT): {}",
        success(
            outcome.eval_before,
            "not recorded (the resumed checkpoint carries none)"
        )
    );
    println!(
        "held-out success after RL:              {}",
        success(
            outcome.eval_after,
            if outcome.stopped {
                "not evaluated (stopped before the end)"
            } else {
                "not evaluated (no held-out tasks were run)"
            }
        )
    );
    println!(
        "steps: {}  last checkpoint: {}  resumed from: {}  reused batches: {}  dropped batches: {}",
        outcome.final_step,
        outcome.last_checkpoint.as_deref().unwrap_or("-"),
        outcome.resumed_from.as_deref().unwrap_or("-"),
        outcome.reused_batches,
        outcome.dropped_batches
    );
    match (outcome.stopped, outcome.last_checkpoint.as_deref()) {
        (true, Some(id)) => println!(
            "stopped on request: checkpoint {id} committed on branch {}",
            outcome.branch
        ),
        (true, None) => println!(
            "stopped on request before the first checkpoint: the same command starts the run again"
        ),
        (false, _) => {}
    }
}

/// What a role process (`keel generator`, `keel learner`) starts from: the config when given,
/// the run root's branch, and the stop signal.
struct RoleStart {
    cfg: Option<TrainConfig>,
    store: RunStore,
    stop: keel_actors::StopSignal,
}

impl RoleStart {
    /// Opens `args`'s run root on its branch; `role` names the process in messages.
    fn open(args: &cli::RoleArgs, role: &str) -> Result<Self> {
        let cfg = match &args.config {
            Some(p) => Some(load_config(Some(p))?),
            None => None,
        };
        let run_root = match (&args.run_root, &cfg) {
            (Some(r), _) => r.clone(),
            (None, Some(c)) => format!("runs/{}", c.run.name),
            (None, None) => {
                anyhow::bail!("keel {role} needs --run-root (or --config to derive it)")
            }
        };
        let store = RunStore::open(&run_root)
            .with_context(|| format!("cannot open run root {run_root}"))?;
        let branch = args.branch.as_deref().unwrap_or(keel_store::DEFAULT_BRANCH);
        let store = store.on_branch(branch)?;
        let stop = preemption::stop_signal(cfg.as_ref().map_or(30, |c| c.run.sigterm_grace_s))?;
        eprintln!("{role} on run root {} (branch {branch})", store.root_url());
        Ok(RoleStart { cfg, store, stop })
    }
}

/// `keel generator --rank R`: serves the rank's work orders until the run is finished.
fn generator(args: cli::GeneratorArgs) -> Result<()> {
    let start = RoleStart::open(&args.role, &format!("generator rank {}", args.rank))?;
    match run_generator(args.rank, start.cfg, start.store, start.stop, None)
        .with_context(|| format!("generator rank {}", args.rank))?
    {
        GeneratorExit::Finished { life } => {
            println!(
                "generator rank {}: trainer life {life} finished the run",
                args.rank
            )
        }
        GeneratorExit::Stopped => println!("generator rank {}: stopped on request", args.rank),
    }
    Ok(())
}

/// `keel learner --rank R`: follows the trainer's learner (rank 0) until it stops (LK-1).
fn learner_rank(args: cli::LearnerArgs) -> Result<()> {
    let rank = match args.rank {
        Some(r) => r,
        None => std::env::var("RANK")
            .ok()
            .and_then(|r| r.parse::<usize>().ok())
            .context("keel learner needs --rank R (or RANK from a launcher)")?,
    };
    let start = RoleStart::open(&args.role, &format!("learner rank {rank}"))?;
    keel_actors::learner_ranks::run_learner_rank(rank, start.cfg, start.store, start.stop)
        .with_context(|| format!("learner rank {rank}"))?;
    println!("learner rank {rank}: the trainer's learner stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{colour_logs, error_chain};
    use std::ffi::OsStr;

    #[test]
    fn an_error_says_each_cause_once_outermost_first() {
        let io =
            || std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        // A store error that prints its source inline, under a context that does too.
        let e = anyhow::Error::new(keel_store::StoreError::LocalIo {
            path: "runs/x".into(),
            source: io(),
        })
        .context(format!(
            "cannot open runs/x: local run root runs/x: {}",
            io()
        ))
        .context("cannot resume");
        let text = error_chain(&e);
        assert_eq!(text.matches("connection refused").count(), 1, "{text}");
        assert!(
            text.starts_with("cannot resume: cannot open runs/x"),
            "{text}"
        );
        let plain = anyhow::anyhow!("inner").context("outer");
        assert_eq!(error_chain(&plain), "outer: inner");
    }

    #[test]
    fn logs_are_coloured_only_on_a_terminal_without_no_color() {
        assert!(colour_logs(true, None));
        assert!(
            !colour_logs(false, None),
            "a file or a pipe gets plain text"
        );
        assert!(!colour_logs(true, Some(OsStr::new("1"))), "NO_COLOR=1");
        assert!(
            colour_logs(true, Some(OsStr::new(""))),
            "an empty NO_COLOR is unset"
        );
    }
}
