//! `keel launch slurm --print`: a heterogeneous sbatch script (`ops/launch/slurm.sbatch`):
//! component 0 the trainer, component 1 the generator ranks, an `srun` step per role.
//!
//! Invariants:
//! - SL-2 (LH-1): every value in the script's body is one shell word (`shell_word`) or a quoted
//!   here-document (the config, under a delimiter that no line of it equals); values on
//!   `#SBATCH` lines, which sbatch reads without a shell, are limited to a safe alphabet.
//! - SL-1: `--signal=B:TERM@<engine grace>` and `--requeue`; the script forwards SIGTERM to
//!   every step and exits with the trainer's status (LH-5).

use anyhow::{bail, Result};
use clap::Args;

use super::plan::{whole, CommonArgs, KeelDefault, Plan, Resources};
use super::quote::shell_word;
use super::template::fill;

const SCRIPT: &str = include_str!("../../launch/slurm.sbatch");

/// `keel launch slurm`.
#[derive(Args, Debug)]
pub struct SlurmArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Job name (default keel-<run.name>).
    #[arg(long)]
    pub name: Option<String>,
    /// Partition of both components.
    #[arg(long)]
    pub partition: Option<String>,
    /// Account charged.
    #[arg(long)]
    pub account: Option<String>,
    /// Time limit of both components (Slurm's format, e.g. 2-00:00:00); the trainer gets
    /// SIGTERM the engine grace before it.
    #[arg(long)]
    pub time: Option<String>,
}

/// The sbatch script, rendered.
pub fn render(args: &SlurmArgs) -> Result<String> {
    let plan = Plan::resolve(&args.common, KeelDefault::ThisBinary)?;
    if plan.generators == 0 {
        bail!("rollout.generators is 0: a heterogeneous job needs at least one generator");
    }
    let name = match &args.name {
        Some(n) => sbatch_value("--name", n)?.to_owned(),
        None => format!("keel-{}", safe_name(&plan.run_name)),
    };
    let mut extra = Vec::new();
    for (flag, v) in [
        ("partition", &args.partition),
        ("account", &args.account),
        ("time", &args.time),
    ] {
        if let Some(v) = v {
            extra.push(format!("#SBATCH --{flag}={}", sbatch_value(flag, v)?));
        }
    }
    let component = |tasks: usize, r: Resources, role: &str| -> Result<String> {
        let mut lines = vec![
            format!("#SBATCH --ntasks={tasks}"),
            format!(
                "#SBATCH --cpus-per-task={}",
                whole(r.cpus, &format!("--num-cpus-{role}"))?.max(1)
            ),
        ];
        let gpus = whole(r.gpus, &format!("--num-gpus-{role}"))?;
        if gpus > 0 {
            lines.push(format!("#SBATCH --gpus-per-task={gpus}"));
        }
        lines.extend(extra.iter().cloned());
        Ok(lines.join("\n"))
    };
    let trainer_args = plan
        .trainer_args
        .iter()
        .map(|a| shell_word(a))
        .collect::<Result<Vec<_>>>()?
        .join(" ");
    // LH-6: the generators on other nodes can only be pointed at the file (a shared file
    // system); the rank and the run root are the script's own (a loop over the ranks).
    let generator_config = plan
        .config_path
        .as_deref()
        .filter(|_| plan.generators_need_config);
    if let Some(p) = generator_config {
        eprintln!(
            "note: the config has credentials in a URL, so the generators read {p} itself: it \
             must be on a file system every node shares, unchanged while the job runs"
        );
    }
    let generator_args = plan
        .generator_options(generator_config)
        .iter()
        .map(|a| shell_word(a))
        .collect::<Result<Vec<_>>>()?
        .join(" ");
    let config_block = match &plan.config_text {
        None => "# No config: the trainer runs on the built-in defaults.\n".to_owned(),
        Some(text) => config_block(text),
    };
    if plan.engine_grace_s() > u64::from(u16::MAX) {
        bail!("run.sigterm_grace_s is too large for sbatch --signal (at most 65535 s in all)");
    }
    fill(
        SCRIPT,
        &[
            ("JOB_NAME", name),
            ("ENGINE_GRACE_S", plan.engine_grace_s().to_string()),
            ("SBATCH_TRAINER", component(1, plan.trainer, "trainer")?),
            (
                "SBATCH_GENERATORS",
                component(plan.generators, plan.generator, "generator")?,
            ),
            ("KEEL", shell_word(&plan.keel)?),
            ("RUN_ROOT", shell_word(&plan.run_root)?),
            ("GENERATORS", plan.generators.to_string()),
            ("MAX_RESTARTS", plan.max_restarts.to_string()),
            ("TRAINER_ARGS", trainer_args),
            ("GENERATOR_ARGS", generator_args),
            ("CONFIG_BLOCK", config_block),
        ],
    )
}

/// `keel launch slurm`: only prints (submit with `sbatch`).
pub fn run(args: SlurmArgs) -> Result<()> {
    if !args.common.print {
        bail!(
            "keel launch slurm only renders the job: `keel launch slurm --print ... > keel.sbatch` \
             and submit it with `sbatch keel.sbatch`"
        );
    }
    print!("{}", render(&args)?);
    Ok(())
}

/// The config's text in a quoted here-document (nothing in it is expanded), under a delimiter
/// that no line of the text equals, then `--config` for the trainer.
fn config_block(text: &str) -> String {
    let mut delimiter = "KEEL_CONFIG_EOF".to_owned();
    let mut n = 0;
    while text.lines().any(|l| l == delimiter) {
        n += 1;
        delimiter = format!("KEEL_CONFIG_EOF_{n}");
    }
    let newline = if text.ends_with('\n') { "" } else { "\n" };
    format!(
        "cat >\"$CONFIG_DIR/config.toml\" <<'{delimiter}'\n{text}{newline}{delimiter}\n\
         TRAINER_ARGS=(--config \"$CONFIG_DIR/config.toml\" ${{TRAINER_ARGS[@]+\"${{TRAINER_ARGS[@]}}\"}})\n"
    )
}

/// A value for an `#SBATCH` line, which sbatch splits itself: letters, digits and `._:,+-`.
fn sbatch_value<'a>(flag: &str, v: &'a str) -> Result<&'a str> {
    let ok = !v.is_empty()
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._:,+-".contains(c));
    if !ok {
        bail!(
            "--{} {v:?}: only letters, digits and ._:,+- go on an #SBATCH line",
            flag.trim_start_matches('-')
        );
    }
    Ok(v)
}

/// `s` with anything but letters, digits, `.`, `_` and `-` replaced by `-`.
fn safe_name(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{config_block, sbatch_value};

    #[test]
    fn the_here_document_delimiter_is_no_line_of_the_config() {
        let text = "name = \"\"\"\nKEEL_CONFIG_EOF\nKEEL_CONFIG_EOF_1\n\"\"\"";
        let block = config_block(text);
        assert!(block.contains("<<'KEEL_CONFIG_EOF_2'\n"), "{block}");
        assert!(block.contains("\n\"\"\"\nKEEL_CONFIG_EOF_2\n"), "{block}");
    }

    #[test]
    fn sbatch_lines_take_only_a_safe_alphabet() {
        assert!(sbatch_value("partition", "gpu-a100,gpu_h100").is_ok());
        assert!(sbatch_value("time", "2-00:00:00").is_ok());
        for bad in ["a b", "x\n#SBATCH --wrap=y", "$(id)", ""] {
            assert!(sbatch_value("partition", bad).is_err(), "{bad:?}");
        }
    }
}
