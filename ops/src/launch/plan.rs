//! What every launcher needs, resolved once from the command line and the config: the keel
//! binary, the run root, the config's text, how many generator ranks, the grace, restarts and
//! resources of each role, and the argument vectors of `keel trainer` and `keel generator`.
//!
//! Invariants:
//! - LH-2: the config is read and validated (`TrainConfig`) before anything is rendered, and
//!   its text travels inside the rendered file: every life of the trainer, wherever the engine
//!   places it, runs the config that was launched, and needs no copy of the file.
//! - LH-3: the ranks launched are 0..N-1 with N = the config's `rollout.generators`, the
//!   ranks the trainer addresses; a `--generators` that says otherwise is an error.
//! - LH-4: the engine's grace is `run.sigterm_grace_s` plus `GRACE_MARGIN_S`, so keel's own
//!   deadline (PE-2: exit 1 when no checkpoint landed) always comes before the engine's SIGKILL.
//! - LH-6: generators take their config from the trainer's record in the run root (GW-1), the
//!   same effective config whatever the trainer's flags; only a config with credentials in a
//!   URL, which the record holds redacted (RD-1), is given to them as well, and then no trainer
//!   flag may change the config (the generator would refuse the different hash).
//! - LH-7: the trainer's resources are per learner rank: with `learner.ranks = N` the trainer
//!   starts ranks 1..N-1 on its own machine (LK-3), so the engine is asked for N times
//!   `--num-cpus-trainer` and `--num-gpus-trainer`, in the one task, pod or actor it places on
//!   one node.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;

/// Seconds the engine waits past `run.sigterm_grace_s` before it kills a role (LH-4).
pub const GRACE_MARGIN_S: u64 = 30;

/// The flags every `keel launch` subcommand takes.
#[derive(Args, Debug, Clone)]
pub struct CommonArgs {
    /// TOML config of the run (built-in defaults without it). Read and checked here; its text
    /// goes into the rendered file, so the engine's machines need no copy.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Run root: s3://bucket/prefix, or a directory every role can reach (made absolute).
    #[arg(long)]
    pub run_root: String,
    /// Generator ranks to start; must equal the config's rollout.generators (the default).
    #[arg(long)]
    pub generators: Option<usize>,
    /// The keel binary as the engine's machines see it (default: this binary for Ray and
    /// Slurm, `keel` on the image's PATH for Kubernetes).
    #[arg(long)]
    pub keel: Option<String>,
    /// Restarts of each role the engine may make after a failure.
    #[arg(long, default_value_t = 3)]
    pub max_restarts: u32,
    /// CPUs of the trainer per learner rank (learner.ranks = N asks for N times as many: the
    /// trainer starts its ranks on its own machine).
    #[arg(long, default_value_t = 1.0)]
    pub num_cpus_trainer: f64,
    /// GPUs of the trainer per learner rank (as --num-cpus-trainer).
    #[arg(long, default_value_t = 0.0)]
    pub num_gpus_trainer: f64,
    /// CPUs of each generator.
    #[arg(long, default_value_t = 1.0)]
    pub num_cpus_generator: f64,
    /// GPUs of each generator.
    #[arg(long, default_value_t = 0.0)]
    pub num_gpus_generator: f64,
    /// Print the rendered file instead of running it.
    #[arg(long)]
    pub print: bool,
    /// Further `keel trainer` arguments, after `--` (e.g. `-- --steps 100 --no-progress`).
    #[arg(last = true)]
    pub trainer_args: Vec<String>,
}

/// `keel trainer` flags that change the effective config (`keel train`'s overrides).
const CONFIG_FLAGS: [&str; 6] = [
    "--algo",
    "--env",
    "--model",
    "--critic",
    "--steps",
    "--metrics-port",
];

/// Where the rank is in `Plan::generator_argv` (an engine may put its own variable there).
pub const RANK_ARG: usize = 3;

/// CPUs and GPUs of one process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Resources {
    pub cpus: f64,
    pub gpus: f64,
}

/// Where the keel binary comes from when `--keel` is not given.
#[derive(Debug, Clone, Copy)]
pub enum KeelDefault {
    /// This very binary (same machine or a shared file system).
    ThisBinary,
    /// `keel`, found on the PATH of a container image.
    OnPath,
}

/// A launch, resolved.
#[derive(Debug, Clone)]
pub struct Plan {
    pub keel: String,
    pub run_root: String,
    /// The config file's text, as written (comments and credentials kept: it is not
    /// `TrainConfig::to_toml`, which redacts).
    pub config_text: Option<String>,
    pub run_name: String,
    pub generators: usize,
    pub grace_s: u64,
    pub max_restarts: u32,
    pub trainer: Resources,
    pub generator: Resources,
    pub trainer_args: Vec<String>,
    /// The trainer's `--branch`, which the generators must be given too.
    pub branch: Option<String>,
    /// The config has credentials in a URL: the generators must be given it (LH-6).
    pub generators_need_config: bool,
    /// The config file, absolute (for an engine that can only point at it).
    pub config_path: Option<String>,
    /// The directory `keel launch` ran in (relative paths in the config mean the same there).
    pub cwd: String,
}

impl Plan {
    pub fn resolve(args: &CommonArgs, keel_default: KeelDefault) -> Result<Plan> {
        let (cfg, config_text) = match &args.config {
            None => (keel_actors::TrainConfig::default(), None),
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .with_context(|| format!("cannot read config {}", p.display()))?;
                let cfg = keel_actors::TrainConfig::from_toml(&text)
                    .with_context(|| format!("in config {}", p.display()))?;
                (cfg, Some(text))
            }
        };
        cfg.validate().context("invalid configuration")?;
        let configured = cfg.rollout.generators;
        let generators = match args.generators {
            None => configured,
            Some(n) if n == configured => n,
            Some(n) => bail!(
                "--generators {n} but the config has rollout.generators = {configured}: the \
                 trainer addresses ranks 0..{configured} only; set rollout.generators instead"
            ),
        };
        for (flag, v) in [
            ("--num-cpus-trainer", args.num_cpus_trainer),
            ("--num-gpus-trainer", args.num_gpus_trainer),
            ("--num-cpus-generator", args.num_cpus_generator),
            ("--num-gpus-generator", args.num_gpus_generator),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                bail!("{flag} {v}: must be a number >= 0");
            }
        }
        for a in &args.trainer_args {
            let flag = a.split('=').next().unwrap_or(a);
            if flag == "--config" || flag == "--run-root" {
                bail!("{flag} after `--`: give it to `keel launch` itself, which passes it on");
            }
        }
        let branch = flag_value(&args.trainer_args, "--branch")?;
        if branch.is_none() && flag_value(&args.trainer_args, "--from")?.is_some() {
            bail!(
                "--from without --branch after `--`: name the branch, so that the generators \
                 serve the branch the trainer trains on"
            );
        }
        let generators_need_config = cfg.redacted() != cfg;
        if generators_need_config {
            if let Some(flag) = args
                .trainer_args
                .iter()
                .map(|a| a.split('=').next().unwrap_or(a))
                .find(|f| CONFIG_FLAGS.contains(f))
            {
                bail!(
                    "{flag} after `--` changes the config, but this config has credentials in a \
                     URL, so the generators must be given the file itself: set the key in the \
                     config instead"
                );
            }
        }
        let config_path = match &args.config {
            Some(p) => Some(
                utf8(
                    &std::path::absolute(p).context("cannot make the config path absolute")?,
                    "the config path",
                )?
                .to_owned(),
            ),
            None => None,
        };
        let keel = match (&args.keel, keel_default) {
            (Some(k), _) => k.clone(),
            (None, KeelDefault::OnPath) => "keel".to_owned(),
            (None, KeelDefault::ThisBinary) => {
                let exe = std::env::current_exe().context("cannot find this keel binary")?;
                utf8(&exe, "the keel binary's path")?.to_owned()
            }
        };
        let cwd = std::env::current_dir().context("cannot read the current directory")?;
        let learner_ranks = cfg.learner.ranks as f64; // LH-7
        Ok(Plan {
            keel,
            run_root: absolute_run_root(&args.run_root)?,
            config_text,
            run_name: cfg.run.name.clone(),
            generators,
            grace_s: cfg.run.sigterm_grace_s,
            max_restarts: args.max_restarts,
            trainer: Resources {
                cpus: args.num_cpus_trainer * learner_ranks,
                gpus: args.num_gpus_trainer * learner_ranks,
            },
            generator: Resources {
                cpus: args.num_cpus_generator,
                gpus: args.num_gpus_generator,
            },
            trainer_args: args.trainer_args.clone(),
            branch,
            generators_need_config,
            config_path,
            cwd: utf8(&cwd, "the current directory")?.to_owned(),
        })
    }

    /// The engine's grace (LH-4).
    pub fn engine_grace_s(&self) -> u64 {
        self.grace_s + GRACE_MARGIN_S
    }

    /// `keel trainer [--config CONFIG] --run-root ROOT ARGS...`.
    pub fn trainer_argv(&self, config: Option<&str>) -> Vec<String> {
        let mut argv = vec![self.keel.clone(), "trainer".to_owned()];
        if let Some(c) = config {
            argv.extend(["--config".to_owned(), c.to_owned()]);
        }
        argv.extend(["--run-root".to_owned(), self.run_root.clone()]);
        argv.extend(self.trainer_args.iter().cloned());
        argv
    }

    /// `keel generator --rank RANK --run-root ROOT [--config CONFIG] [--branch B]` (RANK may
    /// be an engine's variable). Without `--config` a generator reads the config the trainer
    /// recorded in the run root, where URL credentials are redacted.
    pub fn generator_argv(&self, rank: &str, config: Option<&str>) -> Vec<String> {
        let mut argv = vec![
            self.keel.clone(),
            "generator".to_owned(),
            "--rank".to_owned(),
            rank.to_owned(),
            "--run-root".to_owned(),
            self.run_root.clone(),
        ];
        argv.extend(self.generator_options(config));
        argv
    }

    /// What follows `--run-root ROOT` in `generator_argv`.
    pub fn generator_options(&self, config: Option<&str>) -> Vec<String> {
        let mut opts = Vec::new();
        if let Some(c) = config {
            opts.extend(["--config".to_owned(), c.to_owned()]);
        }
        if let Some(b) = &self.branch {
            opts.extend(["--branch".to_owned(), b.clone()]);
        }
        opts
    }
}

/// The value of `flag` in `args` (`--flag V` or `--flag=V`), if given.
fn flag_value(args: &[String], flag: &str) -> Result<Option<String>> {
    let mut found = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == flag {
            match it.next() {
                Some(v) => found = Some(v.clone()),
                None => bail!("{flag} after `--` has no value"),
            }
        } else if let Some(v) = a.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            found = Some(v.to_owned());
        }
    }
    Ok(found)
}

/// A whole number of resources (Slurm and Kubernetes count CPUs per task and GPUs whole).
pub fn whole(v: f64, flag: &str) -> Result<u64> {
    if v.fract() != 0.0 || v > u32::MAX as f64 {
        bail!("{flag} {v}: this engine takes whole numbers");
    }
    Ok(v as u64)
}

fn utf8<'a>(p: &'a Path, what: &str) -> Result<&'a str> {
    p.to_str()
        .with_context(|| format!("{what} {} is not UTF-8", p.display()))
}

/// `s3://...` (any URL) as given; a local path made absolute, since the engine's processes
/// start in other directories.
fn absolute_run_root(root: &str) -> Result<String> {
    if root.contains("://") {
        return Ok(root.to_owned());
    }
    if root.is_empty() {
        bail!("--run-root is empty");
    }
    let abs = std::path::absolute(root)
        .with_context(|| format!("cannot make the run root {root} absolute"))?;
    Ok(utf8(&abs, "the run root")?.to_owned())
}

#[cfg(test)]
mod tests {
    use super::{CommonArgs, KeelDefault, Plan};

    fn args(config: Option<std::path::PathBuf>) -> CommonArgs {
        CommonArgs {
            config,
            run_root: "s3://b/run".into(),
            generators: None,
            keel: Some("/opt/keel".into()),
            max_restarts: 2,
            num_cpus_trainer: 1.0,
            num_gpus_trainer: 1.0,
            num_cpus_generator: 2.0,
            num_gpus_generator: 0.5,
            print: true,
            trainer_args: vec!["--steps".into(), "5".into()],
        }
    }

    #[test]
    fn generators_and_grace_come_from_the_config() {
        let dir = tempfile::tempdir().expect("dir");
        let p = dir.path().join("c.toml");
        let text = "[run]\nsigterm_grace_s = 45\n\n[rollout]\ngenerators = 3\n";
        std::fs::write(&p, text).expect("write");
        let plan = Plan::resolve(&args(Some(p.clone())), KeelDefault::OnPath).expect("plan");
        assert_eq!((plan.generators, plan.grace_s), (3, 45));
        assert_eq!(plan.engine_grace_s(), 75);
        assert_eq!(plan.config_text.as_deref(), Some(text));
        assert_eq!(plan.keel, "/opt/keel");
        assert_eq!(
            plan.trainer_argv(Some("/c")),
            [
                "/opt/keel",
                "trainer",
                "--config",
                "/c",
                "--run-root",
                "s3://b/run",
                "--steps",
                "5"
            ]
        );
        assert_eq!(
            plan.generator_argv("2", None),
            [
                "/opt/keel",
                "generator",
                "--rank",
                "2",
                "--run-root",
                "s3://b/run"
            ]
        );
        assert_eq!(plan.generator_argv("7", Some("/c"))[super::RANK_ARG], "7");
        let mut a = args(Some(p));
        a.generators = Some(2);
        let e = Plan::resolve(&a, KeelDefault::OnPath).unwrap_err();
        assert!(e.to_string().contains("rollout.generators = 3"), "{e}");
    }

    #[test]
    fn lh7_the_trainer_is_given_the_resources_of_its_learner_ranks() {
        let dir = tempfile::tempdir().expect("dir");
        let p = dir.path().join("c.toml");
        std::fs::write(&p, "[learner]\nranks = 3\n").expect("write");
        let plan = Plan::resolve(&args(Some(p)), KeelDefault::OnPath).expect("plan");
        assert_eq!((plan.trainer.cpus, plan.trainer.gpus), (3.0, 3.0));
        assert_eq!(
            (plan.generator.cpus, plan.generator.gpus),
            (2.0, 0.5),
            "generators are not learner ranks"
        );
        let alone = Plan::resolve(&args(None), KeelDefault::OnPath).expect("plan");
        assert_eq!((alone.trainer.cpus, alone.trainer.gpus), (1.0, 1.0));
    }

    #[test]
    fn the_trainers_branch_goes_to_the_generators() {
        let mut a = args(None);
        a.trainer_args = vec!["--from".into(), "ck-1".into(), "--branch=exp".into()];
        let plan = Plan::resolve(&a, KeelDefault::OnPath).expect("plan");
        let argv = plan.generator_argv("0", Some("/c"));
        assert_eq!(argv[6..], ["--config", "/c", "--branch", "exp"]);
        a.trainer_args = vec!["--from".into(), "ck-1".into()];
        let e = Plan::resolve(&a, KeelDefault::OnPath).unwrap_err();
        assert!(e.to_string().contains("--branch"), "{e}");
    }

    #[test]
    fn only_a_config_with_url_credentials_goes_to_the_generators() {
        let dir = tempfile::tempdir().expect("dir");
        let plain = dir.path().join("plain.toml");
        std::fs::write(&plain, "[metrics]\npushgateway_url = \"http://pg:9091\"\n").expect("w");
        let plan = Plan::resolve(&args(Some(plain)), KeelDefault::OnPath).expect("plan");
        assert!(!plan.generators_need_config);
        let secret = dir.path().join("secret.toml");
        std::fs::write(
            &secret,
            "[metrics]\npushgateway_url = \"http://user:pw@pg:9091\"\n",
        )
        .expect("w");
        let mut a = args(Some(secret));
        a.trainer_args.clear();
        let plan = Plan::resolve(&a, KeelDefault::OnPath).expect("plan");
        assert!(plan.generators_need_config);
        assert!(plan
            .config_path
            .as_deref()
            .is_some_and(|p| p.ends_with("secret.toml")));
        a.trainer_args = vec!["--steps=9".into()];
        let e = Plan::resolve(&a, KeelDefault::OnPath).unwrap_err();
        assert!(e.to_string().contains("--steps"), "{e}");
    }

    #[test]
    fn bad_flags_and_configs_are_refused_with_the_reason() {
        let mut a = args(None);
        a.num_gpus_trainer = -1.0;
        let e = Plan::resolve(&a, KeelDefault::OnPath).unwrap_err();
        assert!(e.to_string().contains("--num-gpus-trainer"), "{e}");
        let mut a = args(None);
        a.trainer_args = vec!["--run-root=/x".into()];
        let e = Plan::resolve(&a, KeelDefault::OnPath).unwrap_err();
        assert!(e.to_string().contains("--run-root"), "{e}");
        let dir = tempfile::tempdir().expect("dir");
        let p = dir.path().join("bad.toml");
        std::fs::write(&p, "[rollout]\ngenerator = 2\n").expect("write");
        let e = Plan::resolve(&args(Some(p)), KeelDefault::OnPath).unwrap_err();
        assert!(format!("{e:#}").contains("generator"), "{e:#}");
    }

    #[test]
    fn a_local_run_root_is_made_absolute_and_a_url_is_kept() {
        let mut a = args(None);
        a.run_root = "runs/x".into();
        let plan = Plan::resolve(&a, KeelDefault::ThisBinary).expect("plan");
        assert!(std::path::Path::new(&plan.run_root).is_absolute());
        assert!(plan.run_root.ends_with("runs/x"));
        assert!(std::path::Path::new(&plan.keel).is_absolute());
        a.run_root = "s3://bucket/p".into();
        let plan = Plan::resolve(&a, KeelDefault::OnPath).expect("plan");
        assert_eq!(plan.run_root, "s3://bucket/p");
    }
}
