//! `keel launch ray` end to end on a private Ray head: each test runs in a fresh network
//! namespace (`unshare -n -r`, only loopback up: Ray listens on every interface and rewrites
//! 127.0.0.1 to a routable address, so there must be no other) and, where the kernel allows,
//! a fresh PID namespace, so nothing it starts can outlive it. The head is `ray start --block`,
//! stopped by its pid; `ray stop` (which stops every Ray on the machine) is never used.
//!
//! - `ray_driver_restarts_a_killed_generator_and_returns_the_trainers_status` uses
//!   `tests/python/fake_keel.py` as keel (placed under a hostile path): SIGKILL of a
//!   generator's process restarts it, the trainer's exit status is the launch's, a generator
//!   that fails with a status is restarted too, SIGTERM to `keel launch` stops every role.
//! - `ray_launch_survives_a_killed_generator_and_finishes_the_run` runs the real roles
//!   (`keel trainer`, `keel generator`) on a tiny config with 2 generators, SIGKILLs rank 1's
//!   `keel generator` mid-run and checks that the run still finishes with its last checkpoint.
//!
//! Both skip, saying why, when `python3 -c "import ray"` fails (scripts/setup.sh installs Ray)
//! or user and network namespaces are not permitted.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use keel_integration::{keel_bin, tiny_config_unguarded};
use keel_store::RunStore;
use serde_json::Value;

/// Why this machine cannot run the tests, or `None`.
fn cannot_run() -> Option<String> {
    let ray = Command::new("python3").args(["-c", "import ray"]).output();
    if !ray.is_ok_and(|o| o.status.success()) {
        return Some("`python3 -c \"import ray\"` fails (scripts/setup.sh installs Ray)".into());
    }
    let netns = Command::new("unshare").args(["-n", "-r", "true"]).output();
    if !netns.is_ok_and(|o| o.status.success()) {
        return Some("`unshare -n -r true` is not permitted here".into());
    }
    None
}

/// `unshare` flags: user + network namespaces, and a PID namespace when permitted (then every
/// process of the test dies with it).
fn unshare_flags() -> Vec<&'static str> {
    let pidns = Command::new("unshare")
        .args(["-n", "-r", "-p", "-f", "--mount-proc", "true"])
        .output()
        .is_ok_and(|o| o.status.success());
    if pidns {
        vec!["-n", "-r", "-p", "-f", "--mount-proc"]
    } else {
        vec!["-n", "-r"]
    }
}

/// Inside the namespaces: loopback up, a Ray head on 127.0.0.1:6379 (CPUs for the trainer and
/// two generators), then `keel launch ray ARGS...`, whose status is the script's.
const SCRIPT: &str = r#"
set -u
ip link set lo up || exit 90
ray start --head --block --num-cpus 4 --include-dashboard=false --disable-usage-stats \
  --node-ip-address 127.0.0.1 --port 6379 --temp-dir "$WORK/ray" >"$WORK/ray-head.log" 2>&1 &
head=$!
trap 'kill -TERM "$head" 2>/dev/null; wait "$head"' EXIT
for _ in $(seq 600); do
  (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null && break
  kill -0 "$head" 2>/dev/null || { echo "the Ray head did not start" >&2; exit 91; }
  sleep 0.1
done
"$KEEL" launch ray --address 127.0.0.1:6379 "$@" &
launcher=$!
while wait "$launcher"; code=$?; [ "$code" -gt 128 ] && kill -0 "$launcher" 2>/dev/null; do :; done
exit "$code"
"#;

/// A `keel launch ray` on a private head; `work` holds the Ray head's files and the logs.
struct Launch {
    child: Child,
    work: PathBuf,
}

impl Launch {
    fn start(work: &Path, args: &[String]) -> Launch {
        std::fs::create_dir_all(work).expect("work dir");
        let log = std::fs::File::create(work.join("launch.log")).expect("log");
        let child = Command::new("unshare")
            .args(unshare_flags())
            .args(["bash", "-c", SCRIPT, "keel-ray-test"])
            .args(args)
            .current_dir(work)
            .env("WORK", work)
            .env("KEEL", keel_bin())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("unshare");
        Launch {
            child,
            work: work.to_owned(),
        }
    }

    fn log(&self) -> String {
        launch_log(&self.work)
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().expect("wait").is_none()
    }

    fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let work = self.work.clone();
        keel_integration::wait_exit(&mut self.child, timeout, || launch_log(&work))
    }
}

/// The tails of a launch's own log and of its Ray head's, for failure messages.
fn launch_log(work: &Path) -> String {
    let launch = std::fs::read_to_string(work.join("launch.log")).unwrap_or_default();
    let head = std::fs::read_to_string(work.join("ray-head.log")).unwrap_or_default();
    let tail = |s: &str| {
        s.lines()
            .rev()
            .take(60)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    };
    format!(
        "--- launch ---\n{}\n--- ray head ---\n{}",
        tail(&launch),
        tail(&head)
    )
}

impl Drop for Launch {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// pids of the processes whose arguments hold every one of `words`, in that order, each pair
/// of neighbours adjacent (`/proc/<pid>/cmdline`, so no pattern language gets in the way of
/// a hostile run root, which makes the match unique to this test).
fn pids_running(words: &[&str]) -> Vec<u32> {
    let mut pids = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for p in procs.filter_map(|e| e.ok()) {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(raw) = std::fs::read(p.path().join("cmdline")) else {
            continue;
        };
        let argv: Vec<String> = raw
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if argv
            .windows(words.len())
            .any(|w| w.iter().zip(words).all(|(a, b)| a == b))
        {
            pids.push(pid);
        }
    }
    pids
}

/// The `keel generator` (real or fake) of `rank` on `root`.
fn generator_pids(rank: &str, root: &str) -> Vec<u32> {
    pids_running(&["generator", "--rank", rank, "--run-root", root])
}

/// Any process of a role on `root` (the launch is over when there is none).
fn role_pids(root: &str) -> Vec<u32> {
    let mut pids = pids_running(&["--run-root", root]);
    pids.retain(|p| {
        std::fs::read(format!("/proc/{p}/cmdline"))
            .is_ok_and(|c| !String::from_utf8_lossy(&c).contains("launch"))
    });
    pids
}

fn signal(sig: &str, pid: u32) {
    let status = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {sig} {pid}");
}

fn wait_until(launch: &mut Launch, what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ok() {
        assert!(
            launch.running(),
            "keel launch ray exited before {what}\n{}",
            launch.log()
        );
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}\n{}",
            launch.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn records(run_root: &Path, prefix: &str) -> Vec<Value> {
    let Ok(entries) = std::fs::read_dir(run_root.join("fake")) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            let n = e.file_name().to_string_lossy().to_string();
            n.starts_with(prefix) && n.ends_with(".json")
        })
        .filter_map(|e| serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok())
        .collect()
}

#[test]
fn ray_driver_restarts_a_killed_generator_and_returns_the_trainers_status() {
    if let Some(why) = cannot_run() {
        eprintln!("skipping the Ray launch test: {why}");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let hostile = dir.path().join("it's \"a\" $(touch canary) dir");
    std::fs::create_dir_all(&hostile).expect("dir");
    let keel = hostile.join("fake keel");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/fake_keel.py"),
        &keel,
    )
    .expect("fake keel");
    let config = dir.path().join("c.toml");
    let config_text = "[run]\nsigterm_grace_s = 5\n\n[rollout]\ngenerators = 2\n";
    std::fs::write(&config, config_text).expect("config");
    let root = hostile.join("run");
    std::fs::create_dir_all(root.join("fake")).expect("fake dir");
    std::fs::write(root.join("fake/fail-once-0"), "").expect("fail-once");
    let args = |root: &Path| -> Vec<String> {
        vec![
            "--config".into(),
            config.to_str().expect("utf8").into(),
            "--run-root".into(),
            root.to_str().expect("utf8").into(),
            "--keel".into(),
            keel.to_str().expect("utf8").into(),
            "--max-restarts".into(),
            "2".into(),
            "--".into(),
            "--steps".into(),
            "3".into(),
        ]
    };
    let root_s = root.to_str().expect("utf8").to_owned();
    let work = dir.path().join("w1");
    let mut launch = Launch::start(&work, &args(&root));
    wait_until(
        &mut launch,
        "the trainer and both ranks",
        Duration::from_secs(180),
        || {
            records(&root, "trainer-").len() == 1
                && records(&root, "generator-0-").len() == 2
                && !generator_pids("1", &root_s).is_empty()
        },
    );
    let pids = generator_pids("1", &root_s);
    assert_eq!(pids.len(), 1, "one rank-1 process: {pids:?}");
    signal("-KILL", pids[0]);
    wait_until(
        &mut launch,
        "rank 1 to be restarted",
        Duration::from_secs(120),
        || records(&root, "generator-1-").len() == 2,
    );
    std::fs::write(root.join("fake/finish"), "3").expect("finish");
    let status = launch.wait(Duration::from_secs(120));
    assert_eq!(
        status.code(),
        Some(3),
        "the trainer's status\n{}",
        launch.log()
    );
    let trainer = &records(&root, "trainer-")[0];
    assert_eq!(
        trainer["config_text"], config_text,
        "the launched config reached the trainer"
    );
    let work_abs = std::fs::canonicalize(&work).expect("work dir");
    assert_eq!(
        trainer["cwd"],
        work_abs.to_str().expect("utf8"),
        "roles run where keel launch ran"
    );
    let log = launch.log();
    assert!(
        log.contains("process exited with 137; restarting it"),
        "{log}"
    );
    assert!(
        log.contains("process exited with 7; restarting it"),
        "{log}"
    );
    assert!(role_pids(&root_s).is_empty(), "a role outlived the launch");
    assert!(!dir.path().join("canary").exists() && !hostile.join("canary").exists());

    // SIGTERM to the launch: forwarded to every role, which stop (exit 0).
    let root2 = hostile.join("run2");
    let root2_s = root2.to_str().expect("utf8").to_owned();
    let mut launch = Launch::start(&dir.path().join("w2"), &args(&root2));
    wait_until(&mut launch, "every role", Duration::from_secs(180), || {
        records(&root2, "trainer-").len() == 1 && records(&root2, "generator-").len() == 2
    });
    let launcher = pids_running(&["launch", "ray"]);
    let launcher: Vec<u32> = launcher
        .into_iter()
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == root2_s.as_bytes()))
        })
        .collect();
    assert_eq!(
        launcher.len(),
        1,
        "one keel launch ray on {root2_s}: {launcher:?}"
    );
    signal("-TERM", launcher[0]);
    let status = launch.wait(Duration::from_secs(120));
    assert_eq!(
        status.code(),
        Some(0),
        "the trainer stopped cleanly\n{}",
        launch.log()
    );
    for role in ["trainer", "generator-0", "generator-1"] {
        assert!(
            root2.join(format!("fake/{role}-sigterm")).exists(),
            "{role} got no SIGTERM\n{}",
            launch.log()
        );
    }
}

/// Whether this keel has the process roles (`keel trainer`, `keel generator`).
fn has_roles() -> bool {
    ["trainer", "generator"].iter().all(|role| {
        Command::new(keel_bin())
            .args([role, "--help"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

#[test]
fn ray_launch_survives_a_killed_generator_and_finishes_the_run() {
    if let Some(why) = cannot_run() {
        eprintln!("skipping the Ray launch test: {why}");
        return;
    }
    if !has_roles() {
        eprintln!(
            "skipping the Ray end-to-end run: this keel has no `keel trainer` / `keel generator` \
             yet (the template and fake-keel tests still run)"
        );
        return;
    }
    let rt = keel_integration::test_rt();
    let dir = tempfile::tempdir().expect("tempdir");
    let steps = 16;
    let config = dir.path().join("tiny.toml");
    let text = tiny_config_unguarded(steps, 2, "sync", 0)
        .replace("[rollout]\n", "[rollout]\ngenerators = 2\n")
        .replace(
            "[env]\n",
            "[env]\nlatency = \"lognormal\"\nlatency_ms = 20.0\nlatency_shape = 0.05\n",
        );
    assert!(text.contains("generators = 2"), "{text}");
    std::fs::write(&config, text).expect("config");
    let root = dir.path().join("run");
    let root_s = root.to_str().expect("utf8").to_owned();
    let args: Vec<String> = vec![
        "--config".into(),
        config.to_str().expect("utf8").into(),
        "--run-root".into(),
        root_s.clone(),
        "--max-restarts".into(),
        "3".into(),
        "--".into(),
        "--no-progress".into(),
    ];
    let mut launch = Launch::start(&dir.path().join("w"), &args);
    let store = RunStore::open(&root_s).expect("open");
    wait_until(
        &mut launch,
        "an RL checkpoint with rank 1 running",
        Duration::from_secs(600),
        || {
            let head = rt.block_on(store.latest_checkpoint()).ok().flatten();
            head.is_some_and(|m| m.step >= 2) && !generator_pids("1", &root_s).is_empty()
        },
    );
    let head = rt
        .block_on(store.latest_checkpoint())
        .expect("head")
        .expect("checkpoint");
    assert!(
        head.step < steps,
        "the run finished before the kill (step {})",
        head.step
    );
    let pids = generator_pids("1", &root_s);
    assert_eq!(pids.len(), 1, "one rank-1 keel generator: {pids:?}");
    signal("-KILL", pids[0]);
    let status = launch.wait(Duration::from_secs(900));
    assert!(
        status.success(),
        "keel launch ray failed ({status})\n{}",
        launch.log()
    );
    assert!(
        launch
            .log()
            .contains("process exited with 137; restarting it"),
        "{}",
        launch.log()
    );
    let last = rt
        .block_on(store.latest_checkpoint())
        .expect("head")
        .expect("checkpoint");
    assert_eq!(last.step, steps, "the final checkpoint");
    let list = Command::new(keel_bin())
        .args(["ckpt", "list", "--run-root", &root_s])
        .output()
        .expect("keel ckpt list");
    assert!(list.status.success());
    let text = String::from_utf8_lossy(&list.stdout);
    let head_line = text
        .lines()
        .find(|l| l.ends_with("<- HEAD main"))
        .unwrap_or_default();
    assert_eq!(
        head_line.split_whitespace().nth(1),
        Some(steps.to_string().as_str()),
        "keel ckpt list shows the last step at HEAD:\n{text}"
    );
    assert!(role_pids(&root_s).is_empty(), "a role outlived the launch");
}
