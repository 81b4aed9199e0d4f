//! `keel launch ray`: the Ray driver (`ops/launch/ray_driver.py`) with the launch's plan, and
//! running it with `python3`.
//!
//! Invariants:
//! - RL-3 (LH-1): the driver's only placeholder is `@KEEL_PLAN@`, filled with one Python string
//!   literal holding the plan as JSON; the driver reads every value from it (`json.loads`),
//!   so no value is ever Python source.
//! - RL-1: `keel launch ray` exits with the driver's exit status, which is the trainer's
//!   (LH-5); SIGTERM/SIGINT reach the driver once (it runs in a process group of its own, so
//!   a terminal's Ctrl-C is not delivered to it a second time) and the driver forwards them
//!   to every role.
//! - RL-2: the driver file is a temporary file, removed when the driver has exited.

use std::io::Write;
use std::os::unix::process::CommandExt;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde_json::json;

use super::plan::{CommonArgs, KeelDefault, Plan};
use super::quote::python_str;
use super::template::fill;

const DRIVER: &str = include_str!("../../launch/ray_driver.py");

/// How the placement group's bundles may share nodes (Ray's strategies).
#[derive(ValueEnum, Clone, Copy, Debug)]
#[value(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Strategy {
    Pack,
    Spread,
    StrictPack,
    StrictSpread,
}

impl Strategy {
    fn name(self) -> &'static str {
        match self {
            Strategy::Pack => "PACK",
            Strategy::Spread => "SPREAD",
            Strategy::StrictPack => "STRICT_PACK",
            Strategy::StrictSpread => "STRICT_SPREAD",
        }
    }
}

/// `keel launch ray`.
#[derive(Args, Debug)]
pub struct RayArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// The Ray cluster to join (`ray.init(address=...)`): `auto`, `HOST:PORT` or `ray://...`.
    #[arg(long, default_value = "auto")]
    pub address: String,
    /// How the roles' bundles may share nodes.
    #[arg(long, value_enum, default_value_t = Strategy::Pack)]
    pub placement_strategy: Strategy,
    /// Seconds to wait for the cluster to have room for every role.
    #[arg(long, default_value_t = 600)]
    pub placement_timeout_s: u64,
    /// The Python that runs the driver (must import ray).
    #[arg(long, default_value = "python3")]
    pub python: String,
}

/// The driver, rendered.
pub fn render(args: &RayArgs) -> Result<String> {
    let plan = Plan::resolve(&args.common, KeelDefault::ThisBinary)?;
    for (role, r) in [("trainer", plan.trainer), ("generator", plan.generator)] {
        if r.cpus == 0.0 && r.gpus == 0.0 {
            bail!("the {role} asks for no CPU and no GPU: a Ray bundle needs some resource");
        }
    }
    let mut roles = vec![json!({
        "name": "trainer",
        "argv": plan.trainer_argv(None),
        "config_text": plan.config_text,
        "cpus": plan.trainer.cpus,
        "gpus": plan.trainer.gpus,
        "restart_on": "signal",
    })];
    for rank in 0..plan.generators {
        roles.push(json!({
            "name": format!("generator-{rank}"),
            "argv": plan.generator_argv(&rank.to_string(), None),
            "config_text": if plan.generators_need_config { plan.config_text.as_deref() } else { None },
            "cpus": plan.generator.cpus,
            "gpus": plan.generator.gpus,
            "restart_on": "failure",
        }));
    }
    let doc = json!({
        "address": args.address,
        "run_root": plan.run_root,
        "cwd": plan.cwd,
        "engine_grace_s": plan.engine_grace_s(),
        "max_restarts": plan.max_restarts,
        "placement_strategy": args.placement_strategy.name(),
        "placement_timeout_s": args.placement_timeout_s,
        "roles": roles,
    });
    fill(DRIVER, &[("KEEL_PLAN", python_str(&doc.to_string()))])
}

/// `keel launch ray`: print the driver, or run it and exit with its status.
pub fn run(args: RayArgs) -> Result<()> {
    let driver = render(&args)?;
    if args.common.print {
        print!("{driver}");
        return Ok(());
    }
    let mut file = tempfile::Builder::new()
        .prefix("keel-ray-driver-")
        .suffix(".py")
        .tempfile()
        .context("cannot create the driver file")?;
    file.write_all(driver.as_bytes())
        .and_then(|()| file.flush())
        .context("cannot write the driver file")?;
    let mut child = std::process::Command::new(&args.python)
        .arg(file.path())
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot run {} {}", args.python, file.path().display()))?;
    super::signals::forward_to(child.id())?;
    let status = child.wait().context("cannot wait for the Ray driver")?;
    drop(file);
    match status.code() {
        Some(0) => Ok(()),
        Some(code) => {
            eprintln!("keel launch ray: the driver exited with {code}");
            std::process::exit(code)
        }
        None => bail!("the Ray driver was killed by a signal ({status})"),
    }
}
