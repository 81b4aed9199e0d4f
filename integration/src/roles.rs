//! The roles of a multi-process run (`keel trainer` + `keel generator --rank 0/1`) as a test
//! drives them: started under the process guard (PG-1), signalled, restarted, waited for while
//! the run makes progress. Shared by the rank-fault tests and the chaos harness.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::{keel_bin, Guarded, MethodRun};

/// A run that makes no progress in the run root for this long has hung.
pub const NO_PROGRESS: Duration = Duration::from_secs(180);

/// `run` with two generator ranks, `timeout_s` as the order timeout and a short poll.
pub fn config(dir: &Path, name: &str, run: &MethodRun, timeout_s: u64) -> PathBuf {
    let toml = run
        .toml()
        .replace("[rollout]\n", "[rollout]\ngenerators = 2\n")
        .replace(
            "[metrics]\n",
            &format!("[distributed]\norder_timeout_s = {timeout_s}\npoll_ms = 20\n\n[metrics]\n"),
        );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, toml).expect("write config");
    path
}

/// The processes of one multi-process run; all are SIGKILLed when it drops (PG-1).
pub struct Roles {
    pub dir: PathBuf,
    pub cfg: PathBuf,
    pub root: String,
    pub trainer: Option<Guarded>,
    pub gens: [Option<Guarded>; 2],
    /// Variables every role process gets, beyond the test's own environment.
    pub env: Vec<(String, String)>,
    starts: usize,
}

impl Roles {
    pub fn new(dir: &Path, cfg: PathBuf, root: &str) -> Self {
        Roles {
            dir: dir.to_path_buf(),
            cfg,
            root: root.to_string(),
            trainer: None,
            gens: [None, None],
            env: Vec::new(),
            starts: 0,
        }
    }

    fn spawn(&mut self, args: &[&str], name: &str) -> Guarded {
        self.starts += 1;
        let log = self.dir.join(format!("{name}-{}.log", self.starts));
        let file = std::fs::File::create(&log).expect("log file");
        Guarded::spawn(
            Command::new(keel_bin())
                .args(args)
                .arg("--config")
                .arg(&self.cfg)
                .args(["--run-root", &self.root])
                .env("KEEL_LOG", "info")
                .envs(self.env.iter().map(|(k, v)| (k, v)))
                .stdout(Stdio::null())
                .stderr(file),
        )
        .expect("start keel")
    }

    /// The trainer and both generator ranks.
    pub fn start_all(&mut self) {
        self.start_trainer();
        self.start_generator(0);
        self.start_generator(1);
    }

    /// A run of `run` on a local root under `dir`: its roles (none started) and its root.
    pub fn local(dir: &Path, name: &str, run: &MethodRun, timeout_s: u64) -> (Roles, PathBuf) {
        let cfg = config(dir, name, run, timeout_s);
        let root = dir.join("root");
        let roles = Roles::new(dir, cfg, root.to_str().expect("utf-8"));
        (roles, root)
    }

    pub fn start_trainer(&mut self) {
        self.trainer = Some(self.spawn(&["trainer", "--no-progress"], "trainer"));
    }

    pub fn start_generator(&mut self, rank: u32) {
        let r = rank.to_string();
        let child = self.spawn(&["generator", "--rank", &r], &format!("g{rank}"));
        self.gens[rank as usize] = Some(child);
    }

    pub fn generator_pid(&self, rank: u32) -> String {
        let g = self.gens[rank as usize]
            .as_ref()
            .expect("a running generator");
        g.id().to_string()
    }

    pub fn signal_generator(&self, rank: u32, sig: &str) {
        signal(&self.generator_pid(rank), sig);
    }

    pub fn kill_generator(&mut self, rank: u32) {
        self.gens[rank as usize] = None; // PG-1: dropping the guard kills it
    }

    pub fn kill_trainer(&mut self) {
        self.trainer = None;
    }

    /// Every log of the run, for failure messages.
    pub fn logs(&self) -> String {
        let mut names: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        names.retain(|p| p.extension().is_some_and(|e| e == "log"));
        names.sort();
        names
            .iter()
            .map(|p| {
                let text = std::fs::read_to_string(p).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(25).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                format!("--- {}\n{}\n", p.display(), tail.join("\n"))
            })
            .collect()
    }

    /// Waits for the trainer to exit while the local run root keeps changing (NO_PROGRESS).
    pub fn wait_trainer(&mut self) -> ExitStatus {
        let root = PathBuf::from(&self.root);
        self.wait_trainer_with(|| files_under(&root).to_string())
    }

    /// Waits for the trainer to exit while `progress` keeps changing (NO_PROGRESS).
    pub fn wait_trainer_with(&mut self, mut progress: impl FnMut() -> String) -> ExitStatus {
        let (mut seen, mut since) = (progress(), Instant::now());
        loop {
            let trainer = self.trainer.as_mut().expect("a trainer");
            if let Ok(Some(status)) = trainer.try_wait() {
                self.trainer = None;
                return status;
            }
            let now = progress();
            if now != seen {
                (seen, since) = (now, Instant::now());
            }
            if since.elapsed() > NO_PROGRESS {
                panic!(
                    "the run made no progress for {NO_PROGRESS:?}:\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for generator `rank` to exit on its own (after the trainer finished the run).
    pub fn wait_generator(&mut self, rank: u32) -> ExitStatus {
        let g = self.gens[rank as usize].as_mut().expect("a generator");
        let deadline = Instant::now() + NO_PROGRESS;
        loop {
            if let Ok(Some(status)) = g.try_wait() {
                self.gens[rank as usize] = None;
                return status;
            }
            if Instant::now() > deadline {
                panic!(
                    "generator rank {rank} did not exit after the run finished:\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The trainer and every running generator exit 0.
    pub fn finish_ok(&mut self) {
        let status = self.wait_trainer();
        self.finished_ok(status);
    }

    /// The trainer and every running generator exit 0, while `progress` keeps changing.
    pub fn finish_ok_with(&mut self, progress: impl FnMut() -> String) {
        let status = self.wait_trainer_with(progress);
        self.finished_ok(status);
    }

    /// The trainer ended with `status`: it and every running generator exit 0.
    pub fn finished_ok(&mut self, status: ExitStatus) {
        assert!(
            status.success(),
            "keel trainer failed ({status}):\n{}",
            self.logs()
        );
        for rank in 0..2 {
            if self.gens[rank as usize].is_some() {
                let status = self.wait_generator(rank);
                assert!(
                    status.success(),
                    "generator {rank} failed ({status}):\n{}",
                    self.logs()
                );
            }
        }
    }
}

pub fn signal(pid: &str, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, pid])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill {sig} {pid}");
}

/// The number of files under `root` (progress of a run).
pub fn files_under(root: &Path) -> usize {
    walk(root).len()
}

pub fn walk(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for path in entries.filter_map(|e| e.ok().map(|e| e.path())) {
            if path.is_dir() {
                dirs.push(path);
            } else {
                found.push(path);
            }
        }
    }
    found
}
