//! Shared fixtures of keel's cross-crate and process-level tests.
//!
//! - `keel_bin()`: the `keel` binary built by `cargo build -p keel-ops` (scripts/test.sh does).
//! - `tiny_config()`: a training config small enough for a test to run in seconds on 2 cores.
//! - `s3_root()`: a fresh prefix on the SeaweedFS server that scripts/test.sh starts on loopback
//!   (`KEEL_TEST_S3_ENDPOINT`); tests that need S3 fail with a clear message without it.

use std::path::PathBuf;

/// Path of the `keel` binary next to this test executable's target profile folder.
pub fn keel_bin() -> PathBuf {
    if let Ok(p) = std::env::var("KEEL_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/keel
    let profile_dir = exe.parent().and_then(|d| d.parent()).expect("target profile dir");
    let bin = profile_dir.join("keel");
    assert!(bin.exists(), "{} is missing: run `cargo build -p keel-ops` first (scripts/test.sh does)", bin.display());
    bin
}

/// A TOML config for a training run that takes seconds: `steps` RL steps, checkpoints every
/// `checkpoint_every`, in `mode` (`sync` or `async`) with `bound`.
pub fn tiny_config(steps: u64, checkpoint_every: u64, mode: &str, bound: u64) -> String {
    format!(
        r#"
[run]
name = "tiny"
seed = 11
steps = {steps}
mode = "{mode}"
staleness_bound = {bound}
checkpoint_every = {checkpoint_every}
device = "cpu"
threads = 1

[env]
n_ops = 1

[model]
context_len = 48
n_layer = 1
d_model = 32
n_head = 2

[sft]
steps = 120
batch_size = 16
demos = 400

[rollout]
tasks_per_batch = 6
group_size = 4
max_turn_tokens = 5
eval_tasks = 16

[metrics]
enabled = false
"#
    )
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
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("s3://{bucket}/{test}-{}-{nanos}", std::process::id())
}
