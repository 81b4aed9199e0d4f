//! Sizes the validator used to accept crash the run (issue 32 item 6): each is now refused by
//! `keel train` before the run root exists, naming its key (VB-1..3).

use keel_integration::{train_output, MethodRun};

/// `keel train` with `MethodRun::new("grpo")` patched by `edit`: (success, stderr, root written).
fn train_with(edit: impl Fn(String) -> String) -> (bool, String, bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("bad.toml");
    std::fs::write(&cfg, edit(MethodRun::new("grpo").toml())).expect("config");
    let root = dir.path().join("root");
    let out = train_output(&cfg, &root, &[]);
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

/// `MemTotal` of this machine in bytes (0 where /proc/meminfo cannot be read).
fn machine_memory() -> f64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kib| kib.parse::<f64>().ok())
        .map_or(0.0, |kib| kib * 1024.0)
}

#[test]
fn a_kv_cache_larger_than_memory_is_refused_before_the_run_root_is_written() {
    // VB-4: the built-in model at 131072 tokens of context fits the learner's bound (about 8 GiB
    // for one sequence), but each generator's KV cache for 257 slots is
    // 2 · 8 layers · 257 · 131072 · 256 · 4 B = 514 GiB. Before VB-4 the run trained SFT and
    // failed at the first sampled batch, with the run root written.
    let kv = 2.0 * 8.0 * 257.0 * 131_072.0 * 256.0 * 4.0;
    let memory = machine_memory();
    if memory == 0.0 || memory >= kv {
        eprintln!("skipped: this machine's memory ({memory} B) holds a {kv} B cache");
        return;
    }
    let (ok, stderr, written) = train_with(|_| {
        let toml = MethodRun {
            context_len: 131_072,
            group_size: 64,
            ..MethodRun::new("grpo")
        }
        .toml();
        let shape = "n_layer = 1\nd_model = 32\nn_head = 2\n";
        assert!(toml.contains(shape), "the tiny config changed: {toml}");
        toml.replace(shape, "n_layer = 8\nd_model = 256\nn_head = 4\n")
    });
    assert!(!ok, "accepted");
    assert!(
        stderr.contains("model.context_len") && stderr.contains("KV cache"),
        "{stderr}"
    );
    assert!(!written, "the run root was written before the refusal");
}
