//! What a person reads in logs: `keel train` writing to a file (or a pipe) prints plain text,
//! no ANSI colour codes.

use std::process::Command;

use keel_integration::{free_port, guarded_output, keel_bin, tiny_config, train_command};

#[test]
fn logs_written_to_a_file_carry_no_colour_codes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("tiny.toml");
    std::fs::write(&config, tiny_config(1, 1, "sync", 0)).expect("config");
    let out = guarded_output(
        train_command(&config, &dir.path().join("run"), &[])
            .env("KEEL_LOG", "info")
            .env_remove("NO_COLOR"),
    );
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "keel train failed:\n{text}");
    assert!(
        text.contains("INFO"),
        "the run logged nothing at info:\n{text}"
    );
    assert!(
        !text.contains('\u{1b}'),
        "ANSI escape codes in piped logs:\n{text}"
    );
}

/// Every file under `dir`, recursively.
fn files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// Credentials in configured URLs (RD-1) reach no output of a run: not `keel config show`, not
/// the logs and messages of `keel train` (a Pushgateway and an MLflow server that are both
/// down, so their errors are printed), not the run root (the metrics log, checkpoints, the
/// TensorBoard config text).
#[test]
fn url_credentials_appear_in_no_output_of_a_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let config = dir.path().join("secret.toml");
    let text = tiny_config(2, 1, "sync", 0).replace(
        "[metrics]",
        "[metrics]\npushgateway_url = \"http://alice:s3cret@127.0.0.1:1\"",
    );
    assert!(
        text.contains("pushgateway_url"),
        "the tiny config has a [metrics] section"
    );
    std::fs::write(
        &config,
        format!("{text}\n[tracking]\ntensorboard = true\nflush_every_steps = 1\nmlflow_url = \"http://alice:s3cret@127.0.0.1:{port}\"\n"),
    )
    .expect("config");
    let root = dir.path().join("run");
    let show = Command::new(keel_bin())
        .args(["config", "show", "--config"])
        .arg(&config)
        .output()
        .expect("config show");
    let train = guarded_output(train_command(&config, &root, &[]).env("KEEL_LOG", "debug"));
    let mut seen: Vec<(String, Vec<u8>)> = vec![
        ("config show stdout".into(), show.stdout.clone()),
        ("config show stderr".into(), show.stderr.clone()),
        ("train stdout".into(), train.stdout.clone()),
        ("train stderr".into(), train.stderr.clone()),
    ];
    assert!(
        show.status.success() && train.status.success(),
        "{}",
        String::from_utf8_lossy(&train.stderr)
    );
    assert!(
        String::from_utf8_lossy(&show.stdout).contains("***@127.0.0.1"),
        "config show keeps the rest of the URL"
    );
    for f in files(&root) {
        let bytes = std::fs::read(&f).expect("read");
        seen.push((f.display().to_string(), bytes));
    }
    assert!(
        seen.iter().any(|(n, _)| n.contains("tfevents")),
        "TensorBoard wrote nothing"
    );
    for (name, bytes) in &seen {
        let text = String::from_utf8_lossy(bytes);
        assert!(
            !text.contains("s3cret") && !text.contains("alice"),
            "{name} shows the URL credentials:\n{}",
            text.lines()
                .filter(|l| l.contains("s3cret") || l.contains("alice"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}
