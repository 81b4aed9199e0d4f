//! Sizes the validator used to accept crash the run (issue 32 item 6): each is now refused by
//! `keel train` before the run root exists, naming its key (VB-1..3).

use std::process::Command;

use keel_integration::{keel_bin, MethodRun};

/// `keel train` with `MethodRun::new("grpo")` patched by `edit`: (success, stderr, root written).
fn train_with(edit: impl Fn(String) -> String) -> (bool, String, bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("bad.toml");
    std::fs::write(&cfg, edit(MethodRun::new("grpo").toml())).expect("config");
    let root = dir.path().join("root");
    let out = Command::new(keel_bin())
        .args(["train", "--no-progress", "--config"])
        .arg(&cfg)
        .arg("--run-root")
        .arg(&root)
        .output()
        .expect("run keel train");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    (out.status.success(), stderr, root.exists())
}

#[test]
fn absurd_sizes_are_refused_before_the_run_root_is_written() {
    let cases: [(&str, &str, &str); 6] = [
        ("[run]\n", "[run]\nthreads = 2147483648\n", "run.threads"),
        (
            "[model]\n",
            "[model]\nd_model = 1000000000000\n",
            "model.d_model",
        ),
        ("[sft]\n", "[sft]\ndemos = 1000000000000\n", "sft.demos"),
        (
            "[sft]\n",
            "[sft]\nbatch_size = 1000000000000\n",
            "sft.batch_size",
        ),
        (
            "[rollout]\n",
            "[rollout]\ntasks_per_batch = 1000000000000\n",
            "rollout.tasks_per_batch",
        ),
        (
            "[rollout]\n",
            "[rollout]\ngroup_size = 100000\n",
            "rollout.group_size",
        ),
    ];
    for (section, with_key, key) in cases {
        let (ok, stderr, written) = train_with(|toml| {
            let toml = remove_key(&toml, key);
            assert!(toml.contains(section), "no {section} in the config");
            toml.replacen(section, with_key, 1)
        });
        assert!(!ok, "{key}: accepted");
        assert!(
            stderr.contains(key),
            "{key}: the error does not name it:\n{stderr}"
        );
        assert!(
            !written,
            "{key}: the run root was written before the refusal"
        );
        assert!(
            !stderr.contains("memory allocation") && !stderr.contains("panicked"),
            "{key}: {stderr}"
        );
    }
}

/// `toml` without a line setting the last part of `key` (so the case's own line is the only one).
fn remove_key(toml: &str, key: &str) -> String {
    let name = key.rsplit('.').next().expect("key");
    toml.lines()
        .filter(|l| {
            !l.trim_start().starts_with(&format!("{name} "))
                && !l.trim_start().starts_with(&format!("{name}="))
        })
        .map(|l| format!("{l}\n"))
        .collect()
}
