//! `env.name = "dataset"` end to end through the `keel` binary: a verl-layout JSONL dataset
//! (system prompts, numeric answers, some rows with the calculator tool) trains the built-in
//! model; a run SIGKILLed mid-training resumes and ends bit-identical to an uninterrupted one
//! (the data frontier is the dataset position: no row trained twice or skipped); `keel data
//! check` shows a good file and names the file, row and field of a bad one.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use keel_integration::keel_bin;
use keel_store::RunStore;

/// `n` rows "what is A plus B ?" (numeric answers); every third row names the calculator.
fn write_rows(path: &Path, n: usize, offset: usize) {
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

fn config(dir: &Path, steps: u64) -> std::path::PathBuf {
    let (train, eval) = (dir.join("train.jsonl"), dir.join("test.jsonl"));
    write_rows(&train, 40, 0);
    write_rows(&eval, 8, 100);
    let text = format!(
        r#"
[run]
name = "dataset"
seed = 5
steps = {steps}
checkpoint_every = 2
device = "cpu"
threads = 1

[env]
name = "dataset"
train_file = {train:?}
eval_file = {eval:?}
max_turns = 2

[model]
context_len = 64
n_layer = 1
d_model = 32
n_head = 2

[sft]
steps = 40
batch_size = 8
demos = 64

[rollout]
tasks_per_batch = 4
group_size = 4
max_turn_tokens = 4
eval_tasks = 8

[metrics]
enabled = false

[learner]
algo = "grpo"
"#
    );
    let path = dir.join("dataset.toml");
    std::fs::write(&path, text).expect("config");
    path
}

fn train(config: &Path, root: &Path, summary: &Path) -> std::process::Child {
    Command::new(keel_bin())
        .args(["train", "--no-progress", "--config"])
        .arg(config)
        .arg("--run-root")
        .arg(root)
        .arg("--summary-json")
        .arg(summary)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start keel train")
}

fn finish(child: std::process::Child) {
    let out = child.wait_with_output().expect("wait");
    assert!(
        out.status.success(),
        "keel train failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn final_weights(rt: &tokio::runtime::Runtime, root: &Path) -> (u64, Vec<u8>) {
    let store = RunStore::open(root.to_str().expect("utf8")).expect("open");
    let m = rt
        .block_on(store.latest_checkpoint())
        .expect("head")
        .expect("a checkpoint");
    let w = rt
        .block_on(store.read_checkpoint_file(&m, "model.safetensors"))
        .expect("weights");
    (m.step, w.to_vec())
}

#[test]
fn dataset_run_trains_and_resumes_bit_identically_after_sigkill() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(dir.path(), 12);

    let clean = dir.path().join("clean");
    let clean_summary = dir.path().join("clean.json");
    finish(train(&config, &clean, &clean_summary));
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&clean_summary).expect("summary")).expect("json");
    assert_eq!(summary["final_step"], 12);

    let killed = dir.path().join("killed");
    let summary_path = dir.path().join("killed.json");
    let mut child = train(&config, &killed, &summary_path);
    let store = RunStore::open(killed.to_str().expect("utf8")).expect("open");
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        assert!(
            Instant::now() < deadline,
            "no checkpoint past step 4 in 300 s"
        );
        if let Some(status) = child.try_wait().expect("wait") {
            panic!("training exited ({status}) before it could be killed");
        }
        let head = rt.block_on(store.latest_checkpoint()).ok().flatten();
        if head.is_some_and(|m| m.step >= 4) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    finish(train(&config, &killed, &summary_path));
    let resumed: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&summary_path).expect("summary")).expect("json");
    assert!(resumed["resumed_from"].is_string(), "{resumed}");
    let (step_a, a) = final_weights(&rt, &clean);
    let (step_b, b) = final_weights(&rt, &killed);
    assert_eq!((step_a, step_b), (12, 12));
    assert!(
        a == b,
        "the resumed run's weights differ from the uninterrupted run's"
    );
}

#[test]
fn data_check_shows_a_good_file_and_names_bad_rows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = dir.path().join("good.jsonl");
    write_rows(&good, 5, 0);
    let out = Command::new(keel_bin())
        .args(["data", "check"])
        .arg(&good)
        .output()
        .expect("keel data check");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "rows     5",
        "  prompt: list<{content: string, role: string}>",
        "  reward_model: {ground_truth: string, style: string}",
        "verifiers      numeric 5",
        "data sources   mini-gsm8k 5",
        "tools          calc 2 (rows with tools are multi-turn)",
        "context limit 64 (model.context_len): every prompt fits",
        "--- row 1 (mini-gsm8k, numeric verifier, ",
        "answer with one number",
        "what is 1 plus 2 ?",
        "--- ground truth: 3",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }

    let bad = dir.path().join("bad.jsonl");
    let rows = std::fs::read_to_string(&good).expect("read");
    let mut lines: Vec<String> = rows.lines().map(str::to_string).collect();
    lines[3] = r#"{"prompt": [{"role": "user", "content": "hi"}], "reward_model": {}}"#.into();
    std::fs::write(&bad, lines.join("\n")).expect("write");
    let out = Command::new(keel_bin())
        .args(["data", "check"])
        .arg(&bad)
        .output()
        .expect("keel data check");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&format!(
            "error: dataset {}, row 4, field `reward_model.ground_truth`: missing",
            bad.display()
        )),
        "{err}"
    );
    assert!(err.contains("1 of 5 rows of"), "{err}");
}
