//! The real pretrained model the tests train (SmolLM2-135M-Instruct, scripts/fetch_smollm2.sh),
//! the installers the tests run, and the arithmetic rows it learns on.

use std::path::{Path, PathBuf};

/// What `scripts/<script>` installs, as the path it prints; `what` names it when it fails (the
/// tests fail with the reason, they never skip).
pub fn installed(script: &str, what: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scripts")
        .join(script);
    let out = std::process::Command::new("bash")
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("bash runs scripts/{script}: {e}"));
    assert!(
        out.status.success(),
        "{what} could not be installed (scripts/{script}):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// SmolLM2-135M-Instruct (scripts/fetch_smollm2.sh: `$KEEL_SMOLLM2`, or the script run here).
pub fn smollm2() -> PathBuf {
    PathBuf::from(
        std::env::var("KEEL_SMOLLM2")
            .unwrap_or_else(|_| installed("fetch_smollm2.sh", "SmolLM2-135M-Instruct")),
    )
}

/// Rows of "What is A plus B?" (A, B in 1..=9) drawn from `seed`, verl-shaped (scored by the
/// `numeric` verifier: the response's last number).
pub fn addition_rows(path: &Path, n: usize, seed: u64) {
    let mut state = seed;
    let mut draw = || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        1 + (state >> 33) % 9
    };
    let text: String = (0..n)
        .map(|i| {
            let (a, b) = (draw(), draw());
            let row = serde_json::json!({
                "data_source": "addition",
                "prompt": [
                    {"role": "system", "content": "Answer with one number."},
                    {"role": "user", "content": format!("What is {a} plus {b}?")},
                ],
                "reward_model": {"style": "rule", "ground_truth": (a + b).to_string()},
                "extra_info": {"index": i},
            });
            format!("{row}\n")
        })
        .collect();
    std::fs::write(path, text).expect("write rows");
}

/// A train file of 200 sums and a held-out file of 16 others under `dir` (the real-model
/// learning tests' data).
pub fn addition_split(dir: &Path) -> (PathBuf, PathBuf) {
    let (train, eval) = (dir.join("train.jsonl"), dir.join("test.jsonl"));
    addition_rows(&train, 200, 1);
    addition_rows(&eval, 16, 2);
    (train, eval)
}

/// The mean reward of each trained batch of the run at `root`, in step order.
pub fn batch_rewards(root: &Path) -> Vec<f64> {
    crate::events::train_events(root)
        .into_iter()
        .filter_map(|ev| match ev {
            keel_actors::events::TrainEvent::Step { metrics, .. } => Some(metrics.mean_reward),
            _ => None,
        })
        .collect()
}
