//! Shared fixtures of keel's cross-crate and process-level tests.
//!
//! - `keel_bin()`: the `keel` binary built by `cargo build -p keel-ops` (scripts/test.sh does).
//! - `tiny_config()`: a training config small enough for a test to run in seconds on 2 cores.
//! - `s3_root()`: a fresh prefix on the SeaweedFS server that scripts/test.sh starts on loopback
//!   (`KEEL_TEST_S3_ENDPOINT`); tests that need S3 fail with a clear message without it.

pub mod chaos;
pub mod events;
pub mod fuzz;
pub mod procs;
pub mod real_model;
pub mod roles;
pub mod runs;

pub use procs::Guarded;
pub use runs::{
    guarded_output, head_step, kill_at_checkpoint, kill_once, train_command, train_killed_when,
    train_method, train_output, train_toml_output, wait_exit, wait_for,
};

use std::path::PathBuf;

/// Path of the `keel` binary next to this test executable's target profile folder.
pub fn keel_bin() -> PathBuf {
    if let Ok(p) = std::env::var("KEEL_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/keel
    let profile_dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target profile dir");
    let bin = profile_dir.join("keel");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p keel-ops` first (scripts/test.sh does)",
        bin.display()
    );
    bin
}

/// A TOML config for a training run that takes seconds: `steps` RL steps, checkpoints every
/// `checkpoint_every`, in `mode` (`sync` or `async`) with `bound`; GRPO on calc, collapse guard
/// on (no `[guard]` section, so a test may add one). `MethodRun` renders it.
pub fn tiny_config(steps: u64, checkpoint_every: u64, mode: &str, bound: u64) -> String {
    MethodRun {
        steps,
        checkpoint_every,
        bound,
        guard: true,
        ..MethodRun::new("grpo")
    }
    .render(mode)
}

/// `tiny_config` with the collapse guard off. A guard rewind moves training to another branch,
/// which only the guard's own tests want; the process-level store tests keep every life of a run
/// on branch `main`.
pub fn tiny_config_unguarded(steps: u64, checkpoint_every: u64, mode: &str, bound: u64) -> String {
    format!(
        "{}\n[guard]\nenabled = false\n",
        tiny_config(steps, checkpoint_every, mode, bound)
    )
}

/// A loopback port nothing listens on right now (for a server the test starts, or for one that
/// must be unreachable).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// The S3 endpoint of the test SeaweedFS server.
pub fn s3_endpoint() -> String {
    std::env::var("KEEL_TEST_S3_ENDPOINT").unwrap_or_else(|_| {
        panic!("KEEL_TEST_S3_ENDPOINT is not set: run the tests through scripts/test.sh, which starts SeaweedFS on loopback")
    })
}

/// A fresh `s3://bucket/prefix` run root on the test server (AWS_* variables are set by
/// scripts/seaweedfs.sh).
pub fn s3_root(test: &str) -> String {
    let _ = s3_endpoint();
    let bucket = std::env::var("KEEL_TEST_S3_BUCKET").unwrap_or_else(|_| "keel-test".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("s3://{bucket}/{test}-{}-{nanos}", std::process::id())
}

/// A SeaweedFS server of a test's own (for outages: killed and restarted on the same data and
/// ports), started on loopback by `scripts/seaweedfs.sh`. Stopped when dropped.
pub struct OwnSeaweed {
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    pid: u32,
    dir: String,
    args: Vec<String>,
    /// A server this process restarted runs under the process guard (PG-1/2): it dies with the
    /// test even when the test process is SIGKILLed.
    restarted: Option<Guarded>,
}

impl OwnSeaweed {
    /// Starts a fresh server (bucket `keel-test`) with the repository's script; a start that
    /// fails (servers starting at once on a loaded machine) is cleaned up and tried again, up to
    /// three times.
    pub fn start() -> OwnSeaweed {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/seaweedfs.sh");
        // A failed start leaves nothing behind: the EXIT trap stops the server it started.
        let start = format!(
            "trap '[ -n \"${{ok:-}}\" ] || {{ kill -9 ${{SEAWEED_PID:-}}; rm -rf \"${{SEAWEED_DIR:-}}\"; }} 2>/dev/null' EXIT; \
             . {script} >/dev/null && ok=1 && echo $SEAWEED_PID $SEAWEED_DIR $SEAWEED_MASTER_PORT \
             $SEAWEED_VOLUME_PORT $SEAWEED_FILER_PORT $SEAWEED_S3_PORT"
        );
        let mut failures = Vec::new();
        let f = loop {
            let out = std::process::Command::new("bash")
                .env_remove("KEEL_SEAWEED_S3_PORT")
                .arg("-c")
                .arg(&start)
                .output()
                .expect("run scripts/seaweedfs.sh");
            let line = String::from_utf8_lossy(&out.stdout).to_string();
            let f: Vec<String> = line.split_whitespace().map(str::to_string).collect();
            if f.len() == 6 {
                break f;
            }
            failures.push(format!("{line} {}", String::from_utf8_lossy(&out.stderr)));
            assert!(
                failures.len() < 3,
                "scripts/seaweedfs.sh failed three times: {failures:#?}"
            );
        };
        let dir = f[1].to_string();
        let args = vec![
            "mini".into(),
            format!("-dir={dir}/data"),
            "-ip=127.0.0.1".into(),
            "-ip.bind=127.0.0.1".into(),
            format!("-s3.config={dir}/s3.json"),
            "-admin.ui=false".into(),
            "-webdav=false".into(),
            // Iceberg and Lance listen on fixed ports (8181, 9101+): two servers starting at
            // once race for them and one dies, so they are off (as in scripts/seaweedfs.sh).
            "-s3.port.iceberg=0".into(),
            "-s3.port.lance=0".into(),
            format!("-master.port={}", f[2]),
            format!("-volume.port={}", f[3]),
            format!("-filer.port={}", f[4]),
            format!("-s3.port={}", f[5]),
        ];
        OwnSeaweed {
            endpoint: format!("http://127.0.0.1:{}", f[5]),
            pid: f[0].parse().expect("pid"),
            dir,
            args,
            restarted: None,
        }
    }

    /// Sends `sig` (`-STOP`, `-CONT`, …) to the server process, found by its S3 port (a storage
    /// stall is `-STOP` … `-CONT`).
    pub fn signal(&self, sig: &str) {
        let port = self.endpoint.rsplit(':').next().unwrap_or_default();
        let out = std::process::Command::new("pgrep")
            .args(["-f", &format!("s3.port={port}")])
            .output()
            .expect("pgrep");
        let pids = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            !pids.trim().is_empty(),
            "no seaweedfs process on port {port}"
        );
        for pid in pids.split_whitespace() {
            let _ = std::process::Command::new("kill").args([sig, pid]).status();
        }
    }

    /// SIGKILLs the server (an outage).
    pub fn kill(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-9", &self.pid.to_string()])
            .status();
        self.restarted = None; // reaps a restarted server
        std::thread::sleep(std::time::Duration::from_millis(300));
    }

    /// Starts it again on the same data and ports; returns once S3 answers.
    pub fn restart(&mut self) {
        let log = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(format!("{}/weed.log", self.dir))
            .expect("log");
        let child = Guarded::spawn(
            std::process::Command::new("weed")
                .args(&self.args)
                .stdout(log.try_clone().expect("log"))
                .stderr(log),
        )
        .expect("restart weed");
        self.pid = child.id();
        self.restarted = Some(child);
        let addr = self.endpoint.trim_start_matches("http://").to_string();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "seaweedfs did not come back"
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }
}

impl Drop for OwnSeaweed {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .arg(self.pid.to_string())
            .status();
        std::thread::sleep(std::time::Duration::from_millis(500));
        let _ = std::process::Command::new("kill")
            .args(["-9", &self.pid.to_string()])
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The store-level accounting checks of a run root (crash harness, SIGTERM, outage tests):
/// the branch head verifies with nothing skipped; along its lineage every task range and every
/// batch is trained at most once; trained and pending ranges are disjoint and together exactly
/// the ranges below `next_task_index`; the head's step equals the ranges trained. Returns the
/// head and its lineage (newest first), or `None` when the run root has no checkpoint yet.
pub fn check_accounting(
    rt: &tokio::runtime::Runtime,
    store: &keel_store::RunStore,
    tasks_per_batch: u64,
    context: &str,
) -> Option<(
    keel_store::CheckpointManifest,
    Vec<keel_store::CheckpointManifest>,
)> {
    use std::collections::BTreeSet;
    let rp = rt
        .block_on(store.resume_point())
        .unwrap_or_else(|e| panic!("{context}: resume fails: {e}"))?;
    assert!(
        rp.skipped.is_empty(),
        "{context}: a checkpoint failed verification: {:?}",
        rp.skipped
    );
    assert_eq!(
        rp.head, rp.manifest.id,
        "{context}: the head itself must verify"
    );
    let lineage = rt
        .block_on(store.ancestry(&rp.manifest.id))
        .expect("ancestry");
    let head = &lineage[0];
    let mut trained = BTreeSet::new();
    let mut skipped = BTreeSet::new();
    let mut seqs = BTreeSet::new();
    for m in &lineage {
        for &t in &m.data.consumed_tasks {
            assert!(
                trained.insert(t) && !skipped.contains(&t),
                "{context}: task range {t} trained twice (again in {})",
                m.id
            );
        }
        for &t in &m.data.skipped_tasks {
            assert!(
                skipped.insert(t) && !trained.contains(&t),
                "{context}: task range {t} used twice (skipped in {})",
                m.id
            );
        }
        for &s in &m.data.consumed_batches {
            assert!(
                seqs.insert(s),
                "{context}: batch {s} trained twice (again in {})",
                m.id
            );
        }
    }
    let pending: BTreeSet<u64> = head.data.pending_tasks.iter().copied().collect();
    assert!(
        trained.is_disjoint(&pending) && skipped.is_disjoint(&pending),
        "{context}: ranges both used and pending"
    );
    let owed: BTreeSet<u64> = (0..head.data.next_task_index)
        .step_by(tasks_per_batch as usize)
        .collect();
    let accounted: BTreeSet<u64> = trained.union(&pending).chain(&skipped).copied().collect();
    assert_eq!(
        accounted, owed,
        "{context}: task ranges lost or invented below {}",
        head.data.next_task_index
    );
    assert_eq!(
        trained.len() as u64,
        head.step,
        "{context}: step {} but {} ranges trained",
        head.step,
        trained.len()
    );
    Some((rp.manifest, lineage))
}

// ---- Method runs (issue 7): configs, `keel train` processes and what their run roots hold ----

/// A tiny run of one seed method (spec algorithms.md §2–§9): `tiny_config_unguarded`'s shape
/// with the knobs the method tests turn. `toml()` renders it.
#[derive(Clone, Debug)]
pub struct MethodRun {
    /// `learner.algo`.
    pub algo: &'static str,
    /// `run.steps`.
    pub steps: u64,
    /// `run.checkpoint_every`.
    pub checkpoint_every: u64,
    /// `run.mode`.
    pub mode: &'static str,
    /// `run.staleness_bound`.
    pub bound: u64,
    /// `env.name`.
    pub env: &'static str,
    /// `env.difficulty`.
    pub difficulty: usize,
    /// `model.context_len`.
    pub context_len: usize,
    /// `rollout.group_size`.
    pub group_size: usize,
    /// Simulated env step latency in ms (0 = none): slows a run down so that a test can kill it
    /// between two known events.
    pub latency_ms: f64,
    /// More `[learner]` lines (override keys).
    pub learner: String,
    /// More sections (`[armor]`, `[pats]`, `[[agent_models]]`).
    pub extra: String,
    /// Collapse guard on, with no `[guard]` section (`tiny_config`); off by default.
    pub guard: bool,
}

impl MethodRun {
    /// `algo` on the tiny calc config: 6 sync steps, checkpoints every 3, groups of 4.
    pub fn new(algo: &'static str) -> Self {
        MethodRun {
            algo,
            steps: 6,
            checkpoint_every: 3,
            mode: "sync",
            bound: 0,
            env: "calc",
            difficulty: 1,
            context_len: 48,
            group_size: 4,
            latency_ms: 0.0,
            learner: String::new(),
            extra: String::new(),
            guard: false,
        }
    }

    /// The TOML config (collapse guard off unless `guard`: every life of a run stays on branch
    /// `main`).
    pub fn toml(&self) -> String {
        self.render(self.mode)
    }

    /// `toml` with `run.mode = mode`.
    fn render(&self, mode: &str) -> String {
        let latency = if self.latency_ms > 0.0 {
            format!(
                "latency = \"lognormal\"\nlatency_ms = {:?}\nlatency_shape = 0.05\n",
                self.latency_ms
            )
        } else {
            String::new()
        };
        format!(
            r#"
[run]
name = "tiny"
seed = 11
steps = {steps}
mode = "{mode}"
staleness_bound = {bound}
checkpoint_every = {every}
device = "cpu"
threads = 1
# Tests read the metrics log while the run goes (kill_when): store it promptly (JL-4).
metrics_log_flush_ms = 20

[env]
name = "{env}"
difficulty = {difficulty}
{latency}
[model]
context_len = {context_len}
n_layer = 1
d_model = 32
n_head = 2

[sft]
steps = 120
batch_size = 16
demos = 400

[rollout]
tasks_per_batch = 6
group_size = {group_size}
max_turn_tokens = 5
eval_tasks = 16

[metrics]
enabled = false
{guard}
[learner]
algo = "{algo}"
{learner}
{extra}
"#,
            guard = if self.guard {
                ""
            } else {
                "\n[guard]\nenabled = false\n"
            },
            steps = self.steps,
            bound = self.bound,
            every = self.checkpoint_every,
            env = self.env,
            difficulty = self.difficulty,
            context_len = self.context_len,
            group_size = self.group_size,
            algo = self.algo,
            learner = self.learner,
            extra = self.extra,
        )
    }

    /// Writes the config to `<dir>/<name>.toml` and answers its path.
    pub fn write(&self, dir: &std::path::Path, name: &str) -> PathBuf {
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, self.toml()).expect("write config");
        path
    }
}

/// Copies the directory `from` (a local run root) to `to`, recursively.
pub fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read dir").flatten() {
        let path = entry.path();
        let target = to.join(entry.file_name());
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).expect("copy");
        }
    }
}

/// The stderr log of a `keel train` process on `root` (next to it).
pub fn train_log(root: &std::path::Path) -> PathBuf {
    root.with_extension("log")
}

/// The last `n` bytes of a train log, for failure messages.
pub fn log_tail(root: &std::path::Path) -> String {
    let text = std::fs::read_to_string(train_log(root)).unwrap_or_default();
    let cut = text.len().saturating_sub(3000);
    let cut = (cut..text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len());
    text[cut..].to_string()
}

/// Starts `keel train --config <config> --run-root <root> --no-progress --summary-json
/// <root>.json [extra]`, logging warnings and errors to `train_log(root)`; killed with its
/// process group when dropped (PG-1).
pub fn spawn_train(config: &std::path::Path, root: &std::path::Path, extra: &[&str]) -> Guarded {
    let log = std::fs::File::create(train_log(root)).expect("log file");
    Guarded::spawn(
        train_command(config, root, extra)
            .env("KEEL_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(log),
    )
    .expect("start keel train")
}

/// Runs `keel train` to its end; asserts it succeeded and answers its summary JSON.
pub fn run_train(
    config: &std::path::Path,
    root: &std::path::Path,
    extra: &[&str],
) -> serde_json::Value {
    let status = spawn_train(config, root, extra)
        .wait()
        .expect("wait keel train");
    assert!(
        status.success(),
        "keel train on {} failed ({status}):\n{}",
        root.display(),
        log_tail(root)
    );
    serde_json::from_slice(&std::fs::read(root.with_extension("json")).expect("summary json"))
        .expect("summary is JSON")
}

/// SIGKILLs `child` as soon as `ready(events of root's metrics log)` holds (polled every few
/// ms; segments are stored in order, JL-1, so a line seen there was logged with everything
/// before it). Panics when the run exits first or makes no such progress (`kill_once`).
pub fn kill_when(
    child: &mut std::process::Child,
    root: &std::path::Path,
    what: &str,
    ready: impl Fn(&[keel_actors::events::TrainEvent]) -> bool,
) {
    kill_once(
        child,
        what,
        std::time::Duration::from_millis(3),
        || log_tail(root),
        || ready(&events::train_events(root)),
    );
}

/// A runtime for store reads in tests.
pub fn test_rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Every batch stored on a local run root's `main` branch, by batch_seq.
pub fn stored_batches(root: &std::path::Path) -> Vec<keel_store::RolloutBatch> {
    let rt = test_rt();
    let store = keel_store::RunStore::open(root.to_str().expect("utf8")).expect("open");
    let keys = rt.block_on(store.list_batches()).expect("list batches");
    keys.iter()
        .map(|k| {
            rt.block_on(store.get_batch(k))
                .expect("batch")
                .to_owned()
                .expect("deserialize batch")
        })
        .collect()
}

/// Every committed checkpoint of a local run root, by step.
pub fn checkpoints(root: &std::path::Path) -> Vec<keel_store::CheckpointManifest> {
    let rt = test_rt();
    let store = keel_store::RunStore::open(root.to_str().expect("utf8")).expect("open");
    rt.block_on(store.list_checkpoints())
        .expect("list checkpoints")
}

/// The lineage of the `main` head of a local run root, newest first.
pub fn head_lineage(root: &std::path::Path) -> Vec<keel_store::CheckpointManifest> {
    let rt = test_rt();
    let store = keel_store::RunStore::open(root.to_str().expect("utf8")).expect("open");
    let head = rt
        .block_on(store.latest_checkpoint())
        .expect("head")
        .expect("a checkpoint");
    rt.block_on(store.ancestry(&head.id)).expect("ancestry")
}

/// One verified file of a checkpoint of a local run root.
pub fn checkpoint_file(
    root: &std::path::Path,
    manifest: &keel_store::CheckpointManifest,
    name: &str,
) -> Vec<u8> {
    let rt = test_rt();
    let store = keel_store::RunStore::open(root.to_str().expect("utf8")).expect("open");
    rt.block_on(store.read_checkpoint_file(manifest, name))
        .unwrap_or_else(|e| panic!("{} of {}: {e}", name, manifest.id))
        .to_vec()
}

/// The crc32 the manifest records for its file `name` (panics naming the checkpoint if absent).
pub fn file_crc(manifest: &keel_store::CheckpointManifest, name: &str) -> u32 {
    manifest
        .files
        .iter()
        .find(|f| f.name == name)
        .map(|f| f.crc32)
        .unwrap_or_else(|| panic!("{} has no {name}", manifest.id))
}

/// PATS: the version of the seed bank the SFT checkpoint (step 0) names (PS-1).
pub fn seed_bank_version(root: &std::path::Path) -> u64 {
    let sft = checkpoints(root)
        .into_iter()
        .find(|c| c.step == 0)
        .expect("the SFT checkpoint");
    let pointer: serde_json::Value =
        serde_json::from_str(&sft.data.method_state["pats"]).expect("pats pointer");
    pointer["version"].as_u64().expect("version")
}

/// Runs `python3` (or `$PYTHON`) with `args` and asserts it succeeded; the reference scripts
/// need torch and transformers (scripts/setup.sh installs them).
pub fn python(args: &[&std::ffi::OsStr]) {
    let py = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let out = std::process::Command::new(&py)
        .args(args)
        .output()
        .expect("python3 must be on PATH (scripts/setup.sh)");
    assert!(
        out.status.success(),
        "{py} {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A built-in env that runs `before_step(task seed)` before every step: fault and latency
/// injection for tests (a panic, a sleep), everything else forwarded to `inner`.
pub struct HookedEnv {
    inner: Box<dyn keel_envs::Env>,
    seed: u64,
    before_step: std::sync::Arc<dyn Fn(u64) + Send + Sync>,
}

impl HookedEnv {
    /// `inner` with the hook.
    pub fn new(
        inner: Box<dyn keel_envs::Env>,
        before_step: std::sync::Arc<dyn Fn(u64) + Send + Sync>,
    ) -> Self {
        HookedEnv {
            inner,
            seed: 0,
            before_step,
        }
    }
}

impl keel_envs::Env for HookedEnv {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn reset(&mut self, task_seed: u64) -> String {
        self.seed = task_seed;
        self.inner.reset(task_seed)
    }
    fn step(&mut self, action: &str) -> keel_envs::StepOutcome {
        (self.before_step)(self.seed);
        self.inner.step(action)
    }
    fn oracle_action(&self) -> String {
        self.inner.oracle_action()
    }
    fn max_turns(&self) -> usize {
        self.inner.max_turns()
    }
    fn success(&self) -> bool {
        self.inner.success()
    }
    fn vocabulary(&self) -> Vec<String> {
        self.inner.vocabulary()
    }
    fn admissible_actions(&self) -> Vec<String> {
        self.inner.admissible_actions()
    }
    fn anchor_state(&self) -> String {
        self.inner.anchor_state()
    }
    fn snapshot(&self) -> Result<keel_envs::EnvSnapshot, keel_envs::EnvError> {
        self.inner.snapshot()
    }
    fn restore(&mut self, snapshot: &keel_envs::EnvSnapshot) -> Result<(), keel_envs::EnvError> {
        self.inner.restore(snapshot)
    }
}

/// A Python server of `envs/external/` (the reference env server or the reference reward
/// service) on a free loopback port, as a child process killed on drop.
pub struct PythonServer {
    child: std::process::Child,
    /// `http://127.0.0.1:<port>`.
    pub url: String,
}

impl PythonServer {
    /// Starts `envs/external/<script>` with `--port 0` and `extra`, and reads its
    /// `listening on PORT` banner.
    pub fn start(script: &str, extra: &[&str]) -> PythonServer {
        use std::io::BufRead;
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../envs/external")
            .join(script);
        let mut child = std::process::Command::new("python3")
            .arg(&path)
            .args(["--port", "0"])
            .args(extra)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 must be installed to run the Python servers' tests");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("server banner");
        let port = line
            .trim()
            .strip_prefix("listening on ")
            .expect("`listening on PORT`")
            .to_string();
        PythonServer {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }
}

impl Drop for PythonServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The step and `model.safetensors` bytes of the head checkpoint of the run root `root`.
pub fn head_weights(rt: &tokio::runtime::Runtime, root: &std::path::Path) -> (u64, Vec<u8>) {
    head_file(rt, root, "model.safetensors")
}

/// The head checkpoint's step and its file `name`.
pub fn head_file(
    rt: &tokio::runtime::Runtime,
    root: &std::path::Path,
    name: &str,
) -> (u64, Vec<u8>) {
    let store = keel_store::RunStore::open(root.to_str().expect("utf8")).expect("open");
    let m = rt
        .block_on(store.latest_checkpoint())
        .expect("head")
        .expect("a checkpoint");
    let bytes = rt
        .block_on(store.read_checkpoint_file(&m, name))
        .unwrap_or_else(|e| panic!("{name} of the head checkpoint: {e}"));
    (m.step, bytes.to_vec())
}

/// Tiny random models of four families with their real chat templates, special tokens and eos
/// lists (learner/tests/python/make_family_models.py): `qwen2.5`, `qwen3`, `llama3.1` and
/// `llama3.2` under the returned folder. Built once per version of the script into the temp
/// folder and shared by every test process (the script is deterministic); a build goes to a
/// private folder first and is renamed into place, so concurrent tests never see half of one.
pub fn family_models() -> &'static std::path::Path {
    use std::hash::{Hash, Hasher};
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../learner/tests/python/make_family_models.py");
        let mut hash = std::collections::hash_map::DefaultHasher::new();
        std::fs::read(&script)
            .expect("make_family_models.py")
            .hash(&mut hash);
        let dir = std::env::temp_dir().join(format!("keel-families-{:016x}", hash.finish()));
        if !dir.exists() {
            let own =
                std::env::temp_dir().join(format!("keel-families-build-{}", std::process::id()));
            python(&[script.as_os_str(), own.as_os_str()]);
            // Another test process may have won the race: its folder is the same.
            let _ = std::fs::rename(&own, &dir);
            let _ = std::fs::remove_dir_all(&own);
        }
        dir
    })
}

/// `n` verl-layout rows "what is A plus B ?" (numeric answers, A and B from `i + offset`) at
/// `path`; every third row names the calculator tool.
pub fn write_sum_rows(path: &std::path::Path, n: usize, offset: usize) {
    let mut text = String::new();
    for i in 0..n {
        let (a, b) = ((i + offset) % 7 + 1, (i + offset) % 5 + 2);
        let mut row = serde_json::json!({
            "data_source": "mini-gsm8k",
            "prompt": [
                {"role": "system", "content": "answer with one number"},
                {"role": "user", "content": format!("what is {a} plus {b} ?")},
            ],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": (a + b).to_string()},
            "extra_info": {"index": i},
        });
        if i % 3 == 0 {
            row["extra_info"]["tools"] = serde_json::json!(["calculator"]);
        }
        text.push_str(&row.to_string());
        text.push('\n');
    }
    std::fs::write(path, text).expect("write rows");
}
