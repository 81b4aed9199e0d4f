//! `keel env list | play | eval`: browse the environment suite, play an env in the terminal, and
//! evaluate a policy (the oracle, a random one, or a checkpoint) on held-out tasks.

use std::io::{BufRead, Write};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};

use keel_actors::config::codec_from_files;
use keel_actors::model_policy::ModelPolicy;
use keel_envs::evaluate::{evaluate, oracle_policy, random_policy, Transcript};
use keel_envs::{build_env, task_seed, Env, EnvConfig, ExternalConfig, Split, ENVS};
use keel_learner::hf::tokenizer::{TOKENIZER_CONFIG_FILE, TOKENIZER_FILE};
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
}

impl EnvArgs {
    fn build(&self) -> Result<Box<dyn Env>> {
        let external = self.url.clone().map(|url| ExternalConfig {
            url,
            ..ExternalConfig::default()
        });
        let cfg = EnvConfig {
            name: self.name.clone(),
            difficulty: self.difficulty,
            external,
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
    /// Most tokens per turn for a checkpoint policy.
    #[arg(long, default_value_t = 8)]
    max_turn_tokens: usize,
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
    println!("{}", env.reset(task_seed(split, args.seed)));
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
        let out = env.step(&action);
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
    let mut env = args.env.build()?;
    let report = match args.policy.as_str() {
        "oracle" => evaluate(env.as_mut(), args.episodes, &mut oracle_policy()),
        "random" => evaluate(
            env.as_mut(),
            args.episodes,
            &mut random_policy(args.rng_seed),
        ),
        id => {
            let mut policy = load_checkpoint_policy(&args.run_root, id, args.max_turn_tokens)?;
            let mut failure = None;
            let mut act = |e: &dyn Env, t: &Transcript| {
                policy.act(e, t).unwrap_or_else(|err| {
                    failure.get_or_insert(err.to_string());
                    String::new()
                })
            };
            let report = evaluate(env.as_mut(), args.episodes, &mut act);
            if let Some(err) = failure {
                bail!("policy failed: {err}");
            }
            report
        }
    };
    let (lo, hi) = report.ci95();
    println!(
        "{} difficulty {} policy {}: success {:.3} (95% CI {:.3}..{:.3}) over {} held-out tasks; mean reward {:.3}; invalid actions {:.1}%",
        env.name(),
        args.env.difficulty,
        args.policy,
        report.success_rate(),
        lo,
        hi,
        report.episodes,
        report.mean_reward,
        100.0 * report.invalid_rate
    );
    Ok(())
}

fn load_checkpoint_policy(run_root: &str, id: &str, max_turn_tokens: usize) -> Result<ModelPolicy> {
    let store =
        RunStore::open(run_root).with_context(|| format!("cannot open run root {run_root}"))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let manifest = if id == "latest" {
        rt.block_on(store.latest_checkpoint())?
            .with_context(|| format!("no checkpoint under {run_root}"))?
    } else {
        let all = rt.block_on(store.list_checkpoints())?;
        all.into_iter().find(|m| m.id == id).with_context(|| format!("no checkpoint {id} under {run_root} (`keel ckpt list`); --policy takes oracle, random or a checkpoint id"))?
    };
    let json = rt.block_on(store.read_checkpoint_file(&manifest, "learner.json"))?;
    let weights = rt.block_on(store.read_checkpoint_file(&manifest, "model.safetensors"))?;
    let mut tokenizer_files = Vec::new();
    for name in [TOKENIZER_FILE, TOKENIZER_CONFIG_FILE] {
        let bytes = rt
            .block_on(store.read_checkpoint_file(&manifest, name))
            .with_context(|| format!("checkpoint {} has no {name}", manifest.id))?;
        tokenizer_files.push((name.to_string(), bytes.to_vec()));
    }
    let codec = codec_from_files(&tokenizer_files)
        .with_context(|| format!("the tokenizer of checkpoint {}", manifest.id))?;
    let mut policy = ModelPolicy::from_checkpoint_files(&json, &weights, codec, max_turn_tokens)?;
    // Dr. MAS agent models (LA-4): `agent-model-<k>.learner.json` + `.model.safetensors`.
    for f in manifest
        .files
        .iter()
        .filter(|f| f.name.starts_with("agent-model-") && f.name.ends_with(".learner.json"))
    {
        let prefix = f.name.trim_end_matches("learner.json");
        let json = rt.block_on(store.read_checkpoint_file(&manifest, &f.name))?;
        let weights = rt.block_on(
            store.read_checkpoint_file(&manifest, &format!("{prefix}model.safetensors")),
        )?;
        policy = policy.with_agent_model(&json, &weights)?;
    }
    Ok(policy)
}
