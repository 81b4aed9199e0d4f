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
    /// Train (or resume training) a policy.
    Train(TrainArgs),
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
}
