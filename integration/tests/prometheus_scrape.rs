//! A real Prometheus server (on a free loopback port, with its own config and data dir) scrapes a
//! running `keel train` and answers queries for keel's series through its HTTP API; it also loads
//! the shipped alert rules.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use keel_integration::{free_port, spawn_train, tiny_config, Guarded};

fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// GET `path` from 127.0.0.1:`port`; the body, or None if the server is not answering yet.
fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let (head, body) = buf.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.").then(|| body.to_string())
}

/// The result vector of an instant query, once the server answers.
fn query(port: u16, q: &str) -> Vec<serde_json::Value> {
    let body = http_get(port, &format!("/api/v1/query?query={}", encode(q))).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(t) = f() {
            return t;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn prometheus_bin() -> PathBuf {
    let p = std::env::var_os("PROMETHEUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("prometheus"));
    let ok = Command::new(&p)
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(ok, "prometheus not found: install the Debian package `prometheus` (scripts/setup.sh does) or set PROMETHEUS");
    p
}

#[test]
fn prometheus_scrapes_a_running_keel_train() {
    let prometheus = prometheus_bin();
    let dir = tempfile::tempdir().expect("tempdir");
    let keel_port = free_port();
    let prom_port = free_port();

    let cfg = tiny_config(100_000, 50, "sync", 1).replace("enabled = false", "enabled = true");
    let cfg_path = dir.path().join("keel.toml");
    std::fs::write(&cfg_path, cfg).expect("write config");
    let port = keel_port.to_string();
    let _keel = spawn_train(
        &cfg_path,
        &dir.path().join("run"),
        &["--metrics-port", &port],
    );

    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ops/alerts/keel-rules.yml");
    let prom_cfg = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: keel\n    static_configs:\n      - targets: ['127.0.0.1:{keel_port}']\n",
        rules.display()
    );
    let prom_cfg_path = dir.path().join("prometheus.yml");
    std::fs::write(&prom_cfg_path, prom_cfg).expect("write prometheus config");
    let _server = Guarded::spawn(
        Command::new(prometheus)
            .arg(format!("--config.file={}", prom_cfg_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .expect("start prometheus");

    wait_for("prometheus to answer", Duration::from_secs(60), || {
        http_get(prom_port, "/-/ready")
    });
    let up = wait_for("keel's target to be up", Duration::from_secs(60), || {
        let r = query(prom_port, "up{job=\"keel\"} == 1");
        (!r.is_empty()).then_some(r)
    });
    assert_eq!(
        up[0]["metric"]["instance"],
        format!("127.0.0.1:{keel_port}")
    );

    // The first RL steps arrive after the SFT warm start and the first evaluation.
    let steps = wait_for(
        "keel_learner_steps_total >= 2",
        Duration::from_secs(240),
        || {
            let r = query(prom_port, "keel_learner_steps_total{run=\"tiny\"} >= 2");
            (!r.is_empty()).then_some(r)
        },
    );
    assert_eq!(steps[0]["metric"]["branch"], "main", "{steps:?}");
    let success = query(prom_port, "keel_rollout_success_rate");
    assert_eq!(success.len(), 1, "{success:?}");
    assert_eq!(success[0]["metric"]["env"], "calc");
    for q in [
        "keel_actor_grad_norm",
        "keel_actor_pg_clipfrac",
        "keel_actor_lr",
        "keel_rollout_token_staleness_versions_count",
        "keel_store_get_seconds_count",
        "keel_run_rl_active == 1",
        "keel_run_info",
    ] {
        assert!(!query(prom_port, q).is_empty(), "no series for {q}");
    }
    let rules = http_get(prom_port, "/api/v1/rules").unwrap_or_default();
    for alert in [
        "KeelGradNormSpike",
        "KeelNonFiniteLoss",
        "KeelLearnerStalled",
    ] {
        assert!(
            rules.contains(alert),
            "the server did not load {alert}: {rules}"
        );
    }
}
