//! `[tracking]` against the real software: TensorBoard event files read back by the
//! `tensorboard` package's own readers, and an MLflow tracking server (`mlflow server` from
//! PyPI, started here on loopback) read back through its REST API. Each run is SIGKILLed after a
//! delivery its checkpoint does not cover, then resumed: no step is logged twice (TB-1, ML-1).
//! A tracker that cannot be reached never stops training (TR-1).
//! Needs python3 with tensorboard and mlflow (scripts/setup.sh installs them).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use keel_integration::{
    checkpoints, free_port, head_step, python, run_train, tiny_config, train_killed_when, Guarded,
};

/// A tiny GRPO run of `steps` steps, checkpoints every 3, trackers delivering every step.
fn config(dir: &Path, steps: u64, tracking: &str) -> PathBuf {
    let path = dir.join("tracked.toml");
    let text = format!(
        "{}\n[guard]\nenabled = false\n\n[tracking]\nflush_every_steps = 1\n{tracking}\n",
        tiny_config(steps, 3, "sync", 0)
    );
    std::fs::write(&path, text).expect("config");
    path
}

/// The TensorBoard folder of `branch` as the tensorboard package reads it.
fn read_tensorboard(dir: &Path, run: &Path) -> serde_json::Value {
    let out = dir.join("tb.json");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/read_tensorboard.py");
    python(&[script.as_os_str(), run.as_os_str(), out.as_os_str()]);
    serde_json::from_slice(&std::fs::read(&out).expect("tb.json")).expect("json")
}

/// The highest last step of the segment files in `run` (complete ones: a local write in
/// progress is a staging file `<name>#<n>`).
fn segment_last_step(run: &Path) -> u64 {
    std::fs::read_dir(run)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    if !name.ends_with(".keel") {
                        return None;
                    }
                    name.split('.').nth(4).and_then(|s| s.parse::<u64>().ok())
                })
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(0)
}

fn steps_of(v: &serde_json::Value) -> Vec<u64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().or_else(|| x[0].as_u64()).expect("step"))
        .collect()
}

#[test]
fn tensorboard_reads_the_event_files_and_a_resume_logs_no_step_twice() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path(), 8, "tensorboard = true");
    let root = dir.path().join("run");
    let run = root.join("tensorboard/main");
    // Killed once steps past its step-3 checkpoint are delivered, before the step-6 one.
    train_killed_when(&cfg, &root, "steps past the checkpoint", || {
        segment_last_step(&run) >= 4 && head_step(&root).is_some_and(|s| s >= 3)
    });
    let delivered = segment_last_step(&run);
    let resumed_from = head_step(&root).unwrap_or(0);
    assert!(
        delivered > resumed_from,
        "the test needs steps after the checkpoint"
    );
    // A kill between the local backend's staging write and its rename leaves `<segment>#<n>`,
    // which listings skip but TensorBoard reads: make the newest segment such a leftover; the
    // next life must remove it (TB-3) and log its steps once.
    let mut segments: Vec<PathBuf> = std::fs::read_dir(&run)
        .expect("segments")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "keel"))
        .collect();
    segments.sort();
    let newest = segments.pop().expect("a segment");
    let leftover = PathBuf::from(format!("{}#1", newest.display()));
    std::fs::rename(&newest, &leftover).expect("rename");
    run_train(&cfg, &root, &[]);
    assert!(!leftover.exists(), "the interrupted write is removed");

    let tb = read_tensorboard(dir.path(), &run);
    let once: Vec<u64> = (1..=8).collect();
    assert_eq!(
        steps_of(&tb["raw"]["rollout/success"]),
        once,
        "every step once in the files"
    );
    assert_eq!(steps_of(&tb["raw"]["train/loss"]), once);
    assert_eq!(
        steps_of(&tb["scalars"]["rollout/success"]),
        once,
        "as TensorBoard serves it"
    );
    for tag in [
        "train/grad_norm",
        "train/entropy",
        "train/pg_loss",
        "rollout/reward",
    ] {
        assert!(tb["scalars"][tag].is_array(), "{tag} missing: {tb}");
    }
    assert_eq!(steps_of(&tb["scalars"]["eval/success"]), vec![0, 8]);
    let config_text = &tb["texts"]["config"];
    assert_eq!(steps_of(config_text), vec![0]);
    assert!(config_text[0][1]
        .as_str()
        .expect("text")
        .contains("[learner]"));
    assert_eq!(steps_of(&tb["texts"]["checkpoint"]), vec![0, 3, 6, 8]);
}

/// `mlflow server` on a free loopback port with a SQLite store in `dir`; killed on drop.
struct MlflowServer {
    /// Its own process group: the server's workers and job consumers die with it (PG-1).
    _server: Guarded,
    url: String,
}

impl MlflowServer {
    fn start(dir: &Path) -> Self {
        let port = free_port();
        let py = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        let server = Guarded::spawn(
            Command::new(py)
                .args([
                    "-m",
                    "mlflow",
                    "server",
                    "--host",
                    "127.0.0.1",
                    "--workers",
                    "1",
                ])
                .args(["--port", &port.to_string()])
                .arg("--backend-store-uri")
                .arg(format!("sqlite:///{}", dir.join("mlflow.db").display()))
                .arg("--artifacts-destination")
                .arg(dir.join("artifacts"))
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(dir.join("mlflow.log")).expect("log")),
        )
        .expect("start mlflow server (pip install mlflow)");
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(120);
        while ureq::get(&format!("{url}/health")).call().is_err() {
            assert!(
                Instant::now() < deadline,
                "mlflow server did not come up:\n{}",
                std::fs::read_to_string(dir.join("mlflow.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
        MlflowServer {
            _server: server,
            url,
        }
    }

    fn get(&self, path: &str, query: &[(&str, &str)]) -> serde_json::Value {
        self.try_get(path, query)
            .unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// A GET that may fail (e.g. 404 for an experiment keel has not created yet).
    fn try_get(&self, path: &str, query: &[(&str, &str)]) -> Result<serde_json::Value, String> {
        let mut req = ureq::get(&format!("{}/api/2.0/mlflow/{path}", self.url));
        for (k, v) in query {
            req = req.query(*k, *v);
        }
        req.call()
            .map_err(|e| e.to_string())?
            .body_mut()
            .read_json()
            .map_err(|e| e.to_string())
    }

    fn post(&self, path: &str, body: serde_json::Value) -> serde_json::Value {
        ureq::post(&format!("{}/api/2.0/mlflow/{path}", self.url))
            .send_json(body)
            .expect(path)
            .body_mut()
            .read_json()
            .expect("json")
    }

    /// The run of keel run root `root` on `main`, if it exists (None before keel has created
    /// its experiment).
    fn run(&self, root: &Path) -> Option<serde_json::Value> {
        let exp = self
            .try_get(
                "experiments/get-by-name",
                &[("experiment_name", "keel-test")],
            )
            .ok()?;
        let id = exp["experiment"]["experiment_id"].as_str()?.to_string();
        let found = self.post(
            "runs/search",
            serde_json::json!({
                "experiment_ids": [id],
                "filter": format!("tags.`keel.run_key` = '{}#main'", root.display()),
            }),
        );
        let runs = found["runs"].as_array().cloned().unwrap_or_default();
        // ML-1: a resumed job continues the run; a second run for one key is a bug.
        assert!(
            runs.len() <= 1,
            "{} runs for one keel run and branch",
            runs.len()
        );
        runs.first().cloned()
    }

    /// Steps of metric `key` in run `run_id`, in logging order.
    fn history(&self, run_id: &str, key: &str) -> Vec<u64> {
        let h = self.get(
            "metrics/get-history",
            &[("run_id", run_id), ("metric_key", key)],
        );
        let mut steps: Vec<u64> = h["metrics"]
            .as_array()
            .map(|m| m.iter().filter_map(|p| p["step"].as_u64()).collect())
            .unwrap_or_default();
        steps.sort_unstable();
        steps
    }
}

#[test]
fn mlflow_gets_one_run_with_params_metrics_and_tags_and_a_resume_logs_no_step_twice() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = MlflowServer::start(dir.path());
    let tracking = format!(
        "mlflow_url = \"{}\"\nmlflow_experiment = \"keel-test\"",
        server.url
    );
    let cfg = config(dir.path(), 8, &tracking);
    let root = dir.path().join("run");
    train_killed_when(&cfg, &root, "steps past the checkpoint", || {
        head_step(&root).is_some_and(|s| s >= 3)
            && server.run(&root).is_some_and(|r| {
                let id = r["info"]["run_id"].as_str().unwrap_or_default().to_string();
                server
                    .history(&id, "rollout/success")
                    .last()
                    .is_some_and(|&s| s >= 4)
            })
    });
    run_train(&cfg, &root, &[]);

    let run = server
        .run(&root)
        .expect("one run for the keel run and branch");
    let id = run["info"]["run_id"].as_str().expect("run id");
    let once: Vec<u64> = (1..=8).collect();
    assert_eq!(
        server.history(id, "rollout/success"),
        once,
        "every step once"
    );
    assert_eq!(server.history(id, "train/loss"), once);
    assert_eq!(server.history(id, "eval/success"), vec![0, 8]);
    let params = run["data"]["params"].as_array().expect("params");
    let param = |k: &str| {
        params
            .iter()
            .find(|p| p["key"] == k)
            .map(|p| p["value"].clone())
    };
    assert_eq!(param("learner.algo"), Some("grpo".into()));
    assert_eq!(param("run.steps"), Some("8".into()));
    let tags = run["data"]["tags"].as_array().expect("tags");
    let tag = |k: &str| {
        tags.iter()
            .find(|t| t["key"] == k)
            .map(|t| t["value"].clone())
    };
    assert_eq!(tag("keel.preset"), Some("grpo".into()));
    assert_eq!(tag("keel.env"), Some("calc".into()));
    let last = checkpoints(&root)
        .into_iter()
        .max_by_key(|m| m.step)
        .expect("head");
    assert_eq!(tag("keel.last_checkpoint"), Some(last.id.clone().into()));
    assert_eq!(tag("keel.checkpoint.0000000008"), Some(last.id.into()));
    assert!(tag("keel.checkpoint.0000000003").is_some());
    // Lineage: each checkpoint names the one it continues, as its manifest does.
    assert!(last.parent.is_some(), "the head has a parent");
    assert_eq!(
        tag("keel.checkpoint.0000000008.parent"),
        last.parent.map(Into::into)
    );
    assert_eq!(run["info"]["status"], "FINISHED");
}

#[test]
fn an_unreachable_mlflow_server_never_stops_training() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let cfg = config(
        dir.path(),
        4,
        &format!("mlflow_url = \"http://127.0.0.1:{port}\""),
    );
    let root = dir.path().join("run");
    let summary = run_train(&cfg, &root, &[]);
    assert_eq!(summary["final_step"], 4);
}
