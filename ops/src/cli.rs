//! Command-line arguments (clap derive).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// keel: stable agentic reinforcement learning of LLM agents.
#[derive(Parser, Debug)]
#[command(name = "keel", version, about)]
pub struct Cli {
    /// Log filter (tracing env-filter syntax); KEEL_LOG overrides it.
    #[arg(long, global = true, default_value = "warn,keel=info")]
    pub log: String,
    /// Log as JSON lines instead of text.
    #[arg(long, global = true)]
    pub log_json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level commands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Train (or resume training) a policy: every role in this process.
    Train(TrainArgs),
    /// The trainer of a multi-process run: controller + learner; generator ranks run as
    /// `keel generator --rank R` processes that share the run root (one trainer per branch).
    Trainer(TrainArgs),
    /// One generator rank of a multi-process run: samples the work orders the trainer writes
    /// to the run root for this rank; exits 0 when the trainer has finished the run.
    Generator(GeneratorArgs),
    /// One learner rank 1..N-1 of a run with `learner.ranks = N` (rank 0 is the trainer): builds
    /// the learner from the trainer's recorded config and makes rank 0's calls over c10d; exits
    /// 0 when the trainer's learner stops. `keel train` starts these itself on one machine.
    Learner(LearnerArgs),
    /// Inspect configuration.
    Config {
        /// What to show.
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Inspect checkpoints of a run root.
    Ckpt {
        /// What to do.
        #[command(subcommand)]
        command: CkptCommand,
    },
    /// Environments: list them, play one, evaluate a policy.
    Env {
        /// What to do.
        #[command(subcommand)]
        command: crate::env_cmd::EnvCommand,
    },
    /// Prompt datasets: check a file before training on it.
    Data {
        /// What to do.
        #[command(subcommand)]
        command: crate::data_cmd::DataCommand,
    },
    /// Plot a run's curves (PNG + SVG, one line per branch) and write a markdown summary.
    Report(ReportArgs),
    /// Run a grid of methods × envs × seeds × (control, stress) as separate runs and write the
    /// comparison: table.md / table.csv with intervals over seeds, verdicts against each
    /// method's baseline, and plots. Finished cells are skipped, unfinished ones resumed.
    Arena(crate::arena::ArenaArgs),
    /// Algorithm presets: list them, show one.
    Algo {
        /// What to show.
        #[command(subcommand)]
        command: crate::algo_cmd::AlgoCommand,
    },
    /// Run the trainer and the generator ranks on Ray, or print a Slurm / Kubernetes job.
    Launch {
        /// Which engine.
        #[command(subcommand)]
        command: crate::launch::LaunchCommand,
    },
}

/// `keel report`.
#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Run root: a local directory or s3://bucket/prefix.
    pub run: String,
    /// Output folder (default: <run root>/report for a local run, ./report-<name> for S3).
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

/// `keel train`.
#[derive(Args, Debug)]
pub struct TrainArgs {
    /// TOML config; built-in quickstart defaults for anything it leaves out.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Run root: a local directory or s3://bucket/prefix (default runs/<run.name>). A run root
    /// that holds a checkpoint is resumed.
    #[arg(long)]
    pub run_root: Option<String>,
    /// Override learner.algo (a preset of `keel algo list`).
    #[arg(long)]
    pub algo: Option<String>,
    /// Override env.name (an env of `keel env list`).
    #[arg(long)]
    pub env: Option<String>,
    /// Train this Hugging Face model folder (config.json, safetensors, tokenizer with a chat
    /// template) instead of the built-in tiny model: sets model.path.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Start the separate critic (SAO; learner.critic_model = "separate") from this folder
    /// instead of a copy of the policy: sets model.critic_path.
    #[arg(long)]
    pub critic: Option<PathBuf>,
    /// Override run.steps.
    #[arg(long)]
    pub steps: Option<u64>,
    /// Override metrics.port (0 picks a free port).
    #[arg(long)]
    pub metrics_port: Option<u16>,
    /// No progress bar (logs only).
    #[arg(long)]
    pub no_progress: bool,
    /// Write the final outcome as JSON to this file.
    #[arg(long)]
    pub summary_json: Option<PathBuf>,
    /// Start a new branch from this checkpoint id (its parent); a branch that already has
    /// checkpoints is resumed instead.
    #[arg(long)]
    pub from: Option<String>,
    /// Branch to train on (default `main`, or `from-<id>` with --from).
    #[arg(long)]
    pub branch: Option<String>,
    /// Record this checkpoint as the reference anchor (KL / ARMOR) of new checkpoints.
    #[arg(long)]
    pub reference: Option<String>,
}

/// Where a role process of a run finds it: `keel generator` and `keel learner`.
#[derive(Args, Debug)]
pub struct RoleArgs {
    /// The trainer's TOML config; without it the config the trainer recorded in the run root is
    /// used (it must be passed when the config has credentials in URLs, which are stored redacted).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Run root: a local directory or s3://bucket/prefix (default runs/<run.name> of --config).
    #[arg(long)]
    pub run_root: Option<String>,
    /// Branch the trainer trains on (default `main`).
    #[arg(long)]
    pub branch: Option<String>,
}

/// `keel generator`.
#[derive(Args, Debug)]
pub struct GeneratorArgs {
    /// This process's rank: 0 .. rollout.generators - 1 of the trainer's config.
    #[arg(long)]
    pub rank: u32,
    #[command(flatten)]
    pub role: RoleArgs,
}

/// `keel learner`.
#[derive(Args, Debug)]
pub struct LearnerArgs {
    /// This process's rank: 1 .. learner.ranks - 1 (a launcher's RANK when not given).
    #[arg(long)]
    pub rank: Option<usize>,
    #[command(flatten)]
    pub role: RoleArgs,
}

/// `keel config ...`.
#[derive(Subcommand, Debug)]
pub enum ConfigCommand {
    /// Print the effective configuration (defaults merged with the file).
    Show {
        /// TOML config.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// List every config key with its type, default, allowed range and meaning.
    Explain {
        /// As a markdown table (docs/config.md).
        #[arg(long)]
        markdown: bool,
    },
}

/// `keel ckpt ...`.
#[derive(Subcommand, Debug)]
pub enum CkptCommand {
    /// List committed checkpoints.
    List {
        /// Run root: a local directory or s3://bucket/prefix.
        #[arg(long, default_value = "runs/quickstart")]
        run_root: String,
    },
    /// Show the checkpoints as a tree (parents, branches, tags, heads).
    Lineage {
        /// Run root: a local directory or s3://bucket/prefix.
        #[arg(long, default_value = "runs/quickstart")]
        run_root: String,
    },
    /// Print one checkpoint's manifest (lineage, data frontier, files, metrics) as JSON.
    Show {
        /// Checkpoint id.
        id: String,
        /// Run root: a local directory or s3://bucket/prefix.
        #[arg(long, default_value = "runs/quickstart")]
        run_root: String,
    },
    /// Add a tag (e.g. `reference`, `healthy`) to a checkpoint.
    Tag {
        /// Checkpoint id.
        id: String,
        /// The tag: 1-64 of [A-Za-z0-9._-].
        tag: String,
        /// Run root: a local directory or s3://bucket/prefix.
        #[arg(long, default_value = "runs/quickstart")]
        run_root: String,
    },
    /// Re-read every file of a checkpoint and check its size and crc32 against the manifest.
    Verify {
        /// Checkpoint id.
        id: String,
        /// Run root: a local directory or s3://bucket/prefix.
        #[arg(long, default_value = "runs/quickstart")]
        run_root: String,
    },
    /// Write a checkpoint's policy as a Hugging Face folder (config.json, safetensors,
    /// tokenizer) that transformers, vLLM and SGLang load directly; a LoRA run's adapters are
    /// merged in, or with --peft written unmerged in PEFT's format.
    Export {
        /// Checkpoint id.
        id: String,
        /// The new folder to create (must not exist).
        out: PathBuf,
        /// Run root: a local directory or s3://bucket/prefix.
        #[arg(long, default_value = "runs/quickstart")]
        run_root: String,
        /// LoRA runs: write the adapters unmerged (adapter_config.json +
        /// adapter_model.safetensors) for peft's `PeftModel.from_pretrained(base, OUT)`.
        #[arg(long)]
        peft: bool,
        /// LoRA runs: the base model's folder, when not where the run loaded it from (its
        /// hash must match the one the checkpoint records).
        #[arg(long)]
        base: Option<PathBuf>,
    },
    /// Lineage-aware retention: keep the last N per branch, tagged ones and what they need;
    /// collect the rest, orphan blobs of failed commits, and the rollout batches no kept
    /// checkpoint can reuse on a resume.
    Gc {
        /// Run root: a local directory or s3://bucket/prefix.
        #[arg(long, default_value = "runs/quickstart")]
        run_root: String,
        /// Checkpoints kept on each branch's lineage, newest first.
        #[arg(long, default_value_t = 3)]
        keep_last: usize,
        /// Orphan blobs and unnamed method state objects younger than this are left alone (a
        /// commit may be in progress, a running job may still read them).
        #[arg(long, default_value_t = 3600)]
        orphan_min_age_s: u64,
        /// Only print what would go.
        #[arg(long)]
        dry_run: bool,
    },
}
