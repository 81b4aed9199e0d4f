//! `keel launch ray|slurm|k8s`: keel's process roles — one `keel trainer`, generator ranks
//! `keel generator --rank R` for R in 0..rollout.generators — on an engine that places,
//! restarts and signals them. keel never talks to a scheduler: each launcher renders one file
//! from a template under `ops/launch/` (a Ray driver, an sbatch script, a JobSet manifest)
//! and the engine does the rest; the roles coordinate only through the run root.
//!
//! Invariants (each module states its own):
//! - LH-1 (`quote`, `template`): no user value can change a rendered file's structure: values
//!   are quoted for the file's format and templates are filled in one pass.
//! - `plan` (LH-2..4): the config is read and checked here and travels in the file; the ranks
//!   launched are the ranks the trainer addresses; the engine's grace exceeds keel's.
//! - LH-5: the launch's outcome is the trainer's exit status; generators are restarted after
//!   a failure (bounded by `--max-restarts`) and stopped once the trainer has exited.

mod k8s;
mod plan;
mod quote;
mod ray;
mod signals;
mod slurm;
mod template;

use anyhow::Result;
use clap::Subcommand;

/// `keel launch ...`.
#[derive(Subcommand, Debug)]
pub enum LaunchCommand {
    /// Run the roles on a Ray cluster: renders a Python driver (one placement group, an actor
    /// per role running its keel process) and runs it with python3 (`--print` shows it).
    Ray(ray::RayArgs),
    /// Print a heterogeneous sbatch script: the trainer and an srun step per generator rank.
    Slurm(slurm::SlurmArgs),
    /// Print a JobSet manifest (jobset.x-k8s.io/v1alpha2) and the config's ConfigMap.
    K8s(k8s::K8sArgs),
}

/// Runs one `keel launch` subcommand.
pub fn run(command: LaunchCommand) -> Result<()> {
    match command {
        LaunchCommand::Ray(args) => ray::run(args),
        LaunchCommand::Slurm(args) => slurm::run(args),
        LaunchCommand::K8s(args) => k8s::run(args),
    }
}
