//! `keel env list | play | eval`: browse the environment suite, play an env in the terminal, and
//! evaluate a policy (the oracle, a random one, or a checkpoint) on held-out tasks.

use std::io::{BufRead, Write};

use anyhow::{Context, Result};
use clap::{Args, Subcommand};

use keel_actors::eval::EvalPlan;
use keel_actors::job::EVAL_BATCH_SEQ;
use keel_actors::weights::PublishedWeights;
use keel_actors::TrainConfig;
use keel_envs::evaluate::{evaluate, oracle_policy, random_policy};
use keel_envs::{build_env, task_seed, DatasetConfig, Env, EnvConfig, ExternalConfig, Split, ENVS};
use keel_store::RunStore;

/// `keel env ...`.
#[derive(Subcommand, Debug)]
pub enum EnvCommand {
    /// List the environments with their difficulty range and agents.
    List,
    /// Play an environment in the terminal (`?` lists valid actions, `!` plays the oracle's).
    Play(PlayArgs),
    /// Evaluate a policy on held-out tasks: success rate with a 95% confidence interval.
    Eval(EvalArgs),
}

/// Which env (shared by `play` and `eval`).
#[derive(Args, Debug)]
pub struct EnvArgs {
    /// Environment name (`keel env list`).
    pub name: String,
    /// Difficulty (sets the horizon).
    #[arg(long, default_value_t = 2)]
    pub difficulty: usize,
    /// Server URL for `external`.
    #[arg(long)]
    pub url: Option<String>,
    /// Training rows for `dataset` (`.jsonl` or `.parquet`).
    #[arg(long)]
    pub train_file: Option<std::path::PathBuf>,
    /// Held-out rows for `dataset` (default: the training file).
    #[arg(long)]
    pub eval_file: Option<std::path::PathBuf>,
}

impl EnvArgs {
    fn build(&self) -> Result<Box<dyn Env>> {
        let external = self.url.clone().map(|url| ExternalConfig {
            url,
            ..ExternalConfig::default()
        });
        let dataset = self.train_file.clone().map(|train_file| DatasetConfig {
            eval_file: self.eval_file.clone().unwrap_or_else(|| train_file.clone()),
            train_file,
            ..DatasetConfig::default()
        });
        let cfg = EnvConfig {
            name: self.name.clone(),
            difficulty: self.difficulty,
            external,
            dataset,
            agent: None,
        };
        build_env(&cfg).with_context(|| format!("cannot build env {}", self.name))
    }
}

/// `keel env play`.
#[derive(Args, Debug)]
pub struct PlayArgs {
    #[command(flatten)]
    env: EnvArgs,
    /// Task index.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Play a held-out task instead of a training one.
    #[arg(long)]
    eval: bool,
}

/// `keel env eval`.
#[derive(Args, Debug)]
pub struct EvalArgs {
    #[command(flatten)]
    env: EnvArgs,
    /// `oracle`, `random`, or a checkpoint id of --run-root (`latest` = the head).
    #[arg(long, default_value = "oracle")]
    policy: String,
    /// Held-out tasks to evaluate.
    #[arg(long, default_value_t = 200)]
    episodes: usize,
    /// Run root holding the checkpoint.
    #[arg(long, default_value = "runs/quickstart")]
    run_root: String,
    /// The run's config for a checkpoint policy (default: the one its trainer recorded in the
    /// run root); the env and the evaluation settings come from this command.
    #[arg(long)]
    config: Option<std::path::PathBuf>,
    /// Checkpoint policy: k of avg@k, sampled episodes per task besides the greedy one (EV-5);
    /// default: the config's `rollout.eval_samples`.
    #[arg(long)]
    samples: Option<usize>,
    /// Checkpoint policy: most tokens per turn (default: the config's `rollout.max_turn_tokens`).
    #[arg(long)]
    max_turn_tokens: Option<usize>,
    /// Seed of the random policy.
    #[arg(long, default_value_t = 0)]
    rng_seed: u64,
}

/// Runs one `keel env` command.
pub fn run(cmd: EnvCommand) -> Result<()> {
    match cmd {
        EnvCommand::List => {
            println!("{:<16} {:>10} {:>6}  about", "name", "difficulty", "agents");
            for e in ENVS {
                let range = if e.max_difficulty == 0 {
                    "-".to_string()
                } else {
                    format!("1..={}", e.max_difficulty)
                };
                println!("{:<16} {:>10} {:>6}  {}", e.name, range, e.agents, e.about);
            }
            Ok(())
        }
        EnvCommand::Play(args) => play(args),
        EnvCommand::Eval(args) => eval(args),
    }
}

fn play(args: PlayArgs) -> Result<()> {
    let mut env = args.env.build()?;
    let split = if args.eval { Split::Eval } else { Split::Train };
    println!("{}", env.try_reset(task_seed(split, args.seed))?);
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let mut total = 0.0f32;
    let mut turn = 1;
    while turn <= env.max_turns() {
        print!(
            "[turn {turn}/{} agent {}] > ",
            env.max_turns(),
            env.agent_id()
        );
        std::io::stdout().flush()?;
        let Some(line) = lines.next() else { break };
        let line = line?;
        let action = match line.trim() {
            "?" => {
                println!("valid actions: {}", env.admissible_actions().join(" | "));
                continue;
            }
            "!" => {
                let a = env.oracle_action();
                println!("oracle: {a}");
                a
            }
            _ => line,
        };
        turn += 1;
        let out = env.try_step(&action)?;
        total += out.reward;
        if !out.observation.is_empty() {
            println!("{}", out.observation);
        }
        if out.done {
            break;
        }
    }
    println!("episode over: success {}  reward {total:.2}", env.success());
    Ok(())
}

fn eval(args: EvalArgs) -> Result<()> {
    let report = match args.policy.as_str() {
        "oracle" | "random" => {
            let mut env = args.env.build()?;
            let report = if args.policy == "oracle" {
                evaluate(env.as_mut(), args.episodes, &mut oracle_policy())
            } else {
                evaluate(
                    env.as_mut(),
                    args.episodes,
                    &mut random_policy(args.rng_seed),
                )
            }
            .with_context(|| format!("evaluating the {} policy", args.policy))?;
            let (lo, hi) = report.ci95();
            format!(
                "success {:.3} (95% CI {lo:.3}..{hi:.3}) over {} held-out tasks; mean reward {:.3}; invalid actions {:.1}%",
                report.success_rate(),
                report.episodes,
                report.mean_reward,
                100.0 * report.invalid_rate
            )
        }
        id => eval_checkpoint(&args, id)?,
    };
    println!(
        "{} difficulty {} policy {}: {report}",
        args.env.name, args.env.difficulty, args.policy
    );
    Ok(())
}

/// A checkpoint policy through the one evaluation function (`keel_actors::eval`, EV-4..6): the
/// run's config with this command's env, the checkpoint's weights, pass@1 (greedy) and avg@k.
fn eval_checkpoint(args: &EvalArgs, id: &str) -> Result<String> {
    let store = RunStore::open(&args.run_root)
        .with_context(|| format!("cannot open run root {}", args.run_root))?;
    let rt = keel_actors::process::current_thread_runtime()?;
    let manifest = if id == "latest" {
        rt.block_on(store.latest_checkpoint())?
            .with_context(|| format!("no checkpoint under {}", args.run_root))?
    } else {
        let all = rt.block_on(store.list_checkpoints())?;
        all.into_iter().find(|m| m.id == id).with_context(|| format!("no checkpoint {id} under {} (`keel ckpt list`); --policy takes oracle, random or a checkpoint id", args.run_root))?
    };
    let mut cfg = match &args.config {
        Some(path) => crate::load_config(Some(path))?,
        None => {
            let branch = store.on_branch(&manifest.branch)?;
            let life = rt.block_on(branch.newest_life())?.with_context(|| {
                format!(
                    "the run root records no config for branch {}; pass --config with the run's config",
                    manifest.branch
                )
            })?;
            TrainConfig::from_toml(&life.config_toml)
                .context("the config the run's trainer recorded")?
        }
    };
    cfg.env.name = args.env.name.clone();
    cfg.env.difficulty = args.env.difficulty;
    if let Some(url) = &args.env.url {
        cfg.env.external.url = url.clone();
    }
    if let Some(n) = args.max_turn_tokens {
        cfg.rollout.max_turn_tokens = n;
    }
    cfg.validate()
        .context("the run's config with this command's env")?;
    let mut weights = PublishedWeights::single(
        manifest.policy_version,
        rt.block_on(store.read_checkpoint_file(&manifest, "model.safetensors"))?
            .to_vec(),
    );
    // Dr. MAS agent models (LA-4): `agent-model-<k>.model.safetensors`, k = 1, 2, …
    let mut extra = Vec::new();
    for k in 1.. {
        let name = format!("agent-model-{k}.model.safetensors");
        if !manifest.files.iter().any(|f| f.name == name) {
            break;
        }
        extra.push(
            rt.block_on(store.read_checkpoint_file(&manifest, &name))?
                .to_vec(),
        );
    }
    weights.extra_models = std::sync::Arc::new(extra);
    let plan = EvalPlan {
        tasks: args.episodes,
        samples: args.samples.unwrap_or(cfg.rollout.eval_samples),
        temperature: cfg.rollout.temperature,
        batch_seq: EVAL_BATCH_SEQ,
    };
    let report = keel_actors::eval::evaluate_weights(&cfg, &store, weights, &plan)
        .with_context(|| format!("evaluating checkpoint {}", manifest.id))?;
    Ok(format!(
        "{}; mean reward {:.3}; invalid actions {:.1}% (greedy)",
        report.describe(),
        report.greedy.mean_reward,
        100.0 * report.greedy.invalid_rate
    ))
}
