//! `keel algo list | show NAME`: the algorithm presets of `keel_learner::algo::presets`, with
//! their components and the spec's default hyper-parameters. Everything shown comes from the
//! registry itself; this module only prints it.

use anyhow::{bail, Result};
use clap::Subcommand;

use keel_learner::Preset;

/// `keel algo ...`.
#[derive(Subcommand, Debug)]
pub enum AlgoCommand {
    /// List the algorithm presets (the values of `learner.algo`).
    List,
    /// Show one preset: its components and default hyper-parameters.
    Show {
        /// Preset name, e.g. `sao` (`keel algo list`).
        name: String,
    },
}

/// Runs an `algo` subcommand.
pub fn run(command: AlgoCommand) -> Result<()> {
    match command {
        AlgoCommand::List => {
            for p in Preset::ALL {
                println!("{:<8}  {}", p.name(), p.summary());
            }
            Ok(())
        }
        AlgoCommand::Show { name } => match Preset::from_name(&name) {
            Some(p) => {
                print!("{}", p.describe());
                Ok(())
            }
            None => {
                let names: Vec<String> = Preset::ALL.iter().map(|p| p.name()).collect();
                bail!(
                    "unknown algorithm preset {name:?}; known: {}",
                    names.join(", ")
                )
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_and_show_every_preset_and_reject_unknown_names() {
        run(AlgoCommand::List).expect("list");
        for p in Preset::ALL {
            run(AlgoCommand::Show { name: p.name() }).expect("show");
        }
        let e = run(AlgoCommand::Show {
            name: "ppo2".into(),
        })
        .expect_err("unknown");
        assert!(
            e.to_string()
                .contains("unknown algorithm preset \"ppo2\"; known: ppo, grpo"),
            "{e}"
        );
    }
}
