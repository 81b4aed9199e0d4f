//! The shipped alert rules, dashboard and metric docs: `promtool check rules`, the promtool unit
//! tests (series that must and must not fire), a runbook per alert, and MT-5 (every metric they
//! name is one keel registers, and every registered metric is documented).

use std::path::{Path, PathBuf};
use std::process::Command;

use keel_actors::TrainMetrics;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn promtool() -> PathBuf {
    let p = std::env::var_os("PROMTOOL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("promtool"));
    let ok = Command::new(&p)
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(ok, "promtool not found: install the Debian package `prometheus` (scripts/setup.sh does) or set PROMTOOL");
    p
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("cannot read {rel}: {e}"))
}

/// The rules with every `annotations:` block removed (promtool compares annotations verbatim;
/// the runbooks are checked separately).
fn without_annotations(rules: &str) -> String {
    let mut out = Vec::new();
    let mut skip: Option<usize> = None;
    for line in rules.lines() {
        let indent = line.len() - line.trim_start().len();
        if let Some(level) = skip {
            if line.trim().is_empty() || indent > level {
                continue;
            }
            skip = None;
        }
        if line.trim() == "annotations:" {
            skip = Some(indent);
            continue;
        }
        out.push(line);
    }
    out.join("\n") + "\n"
}

#[test]
fn promtool_check_rules_accepts_the_shipped_file() {
    let out = Command::new(promtool())
        .args(["check", "rules"])
        .arg(repo().join("ops/alerts/keel-rules.yml"))
        .output()
        .expect("run promtool");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("SUCCESS: 12 rules found"), "{text}");
}

#[test]
fn promtool_unit_tests_fire_and_stay_quiet_as_specified() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("keel-rules.yml"),
        without_annotations(&read("ops/alerts/keel-rules.yml")),
    )
    .expect("rules");
    std::fs::write(
        dir.path().join("keel-rules.test.yml"),
        read("ops/alerts/keel-rules.test.yml"),
    )
    .expect("tests");
    let out = Command::new(promtool())
        .args(["test", "rules", "keel-rules.test.yml"])
        .current_dir(dir.path())
        .output()
        .expect("run promtool");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
}

#[test]
fn every_alert_has_a_summary_a_runbook_and_a_test() {
    let rules = read("ops/alerts/keel-rules.yml");
    let tests = read("ops/alerts/keel-rules.test.yml");
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert_eq!(alerts.len(), 12, "{alerts:?}");
    assert_eq!(rules.matches("summary:").count(), alerts.len());
    assert_eq!(rules.matches("runbook: |").count(), alerts.len());
    for a in &alerts {
        assert!(
            tests.contains(&format!("alertname: {a}")),
            "{a} has no promtool test"
        );
    }
}

/// Every `keel_…` metric name in `text`, histogram suffixes removed.
fn metric_names(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(pos) = text[i..].find("keel_") {
        let start = i + pos;
        let boundary =
            start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let mut end = start;
        while end < bytes.len()
            && (bytes[end].is_ascii_lowercase()
                || bytes[end].is_ascii_digit()
                || bytes[end] == b'_')
        {
            end += 1;
        }
        if boundary {
            let mut name = &text[start..end];
            for suffix in ["_bucket", "_sum", "_count"] {
                if let Some(base) = name.strip_suffix(suffix) {
                    if base.ends_with("_seconds")
                        || base.ends_with("_versions")
                        || base.ends_with("_histogram")
                    {
                        name = base;
                    }
                }
            }
            names.push(name.to_string());
        }
        i = end.max(start + 1);
    }
    names.sort();
    names.dedup();
    names
}

#[test]
fn mt5_rules_dashboard_and_docs_name_only_registered_metrics() {
    let registered = TrainMetrics::new("mt5").expect("metrics").names();
    let not_metrics = [
        "keel_rules",
        "keel_training",
        "keel_integration",
        "keel_bin",
        "keel_ops",
        "keel_actors",
        "keel_store",
    ];
    for file in [
        "ops/alerts/keel-rules.yml",
        "ops/alerts/keel-rules.test.yml",
        "ops/dashboards/keel.json",
        "docs/metrics.md",
    ] {
        for name in metric_names(&read(file)) {
            if not_metrics.contains(&name.as_str()) {
                continue;
            }
            assert!(
                registered.contains(&name),
                "{file} names `{name}`, which keel does not register"
            );
        }
    }
    let docs = read("docs/metrics.md");
    for name in &registered {
        assert!(
            docs.contains(&format!("`{name}`")),
            "`{name}` is registered but not documented in docs/metrics.md"
        );
    }
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("ops/dashboards/keel.json")).expect("dashboard is JSON");
    assert!(
        dashboard["panels"]
            .as_array()
            .is_some_and(|p| p.len() >= 10),
        "dashboard has panels"
    );
}
