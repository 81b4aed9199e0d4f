//! What a person reads in logs: `keel train` writing to a file (or a pipe) prints plain text,
//! no ANSI colour codes.

use std::process::{Command, Stdio};

use keel_integration::{keel_bin, tiny_config};

#[test]
fn logs_written_to_a_file_carry_no_colour_codes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("tiny.toml");
    std::fs::write(&config, tiny_config(1, 1, "sync", 0)).expect("config");
    let out = Command::new(keel_bin())
        .args(["train", "--no-progress", "--config"])
        .arg(&config)
        .arg("--run-root")
        .arg(dir.path().join("run"))
        .env("KEEL_LOG", "info")
        .env_remove("NO_COLOR")
        .stdout(Stdio::null())
        .output()
        .expect("run keel train");
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
