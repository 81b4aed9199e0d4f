//! What a user walks into with a real Hugging Face folder (issue 31, defects 2, 7 and 9), on a
//! tiny Qwen2.5-Instruct-shaped folder with the real template (make_family_models.py):
//! - the README's `keel train --model DIR --env calc` runs without a `model.context_len`
//!   (it defaults to the folder's positions) into `runs/<folder name>`, and a run root of
//!   another model is refused in one line that says to use another run root;
//! - `model.context_len` bounds every stored episode (RO-11);
//! - `keel data check --model` and `keel train` refuse what the run would refuse (RoPE type,
//!   missing weights) before anything is written.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use keel_integration::{family_models, keel_bin, stored_batches};

/// The tiny Qwen2.5-Instruct folder.
fn qwen25() -> PathBuf {
    family_models().join("qwen2.5")
}

/// A small config without `model.context_len`.
fn small_config(dir: &Path, extra: &str) -> PathBuf {
    let path = dir.join("my.toml");
    std::fs::write(
        &path,
        format!(
            "[run]\nsteps = 1\ncheckpoint_every = 1\n\n[sft]\nsteps = 2\n\n[rollout]\n\
             tasks_per_batch = 2\ngroup_size = 2\neval_tasks = 2\nmax_turn_tokens = 8\n{extra}"
        ),
    )
    .expect("config");
    path
}

fn keel(cwd: &Path, args: &[&str]) -> Output {
    Command::new(keel_bin())
        .current_dir(cwd)
        .args(args)
        .output()
        .expect("keel")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Defect 7: the README's example with defaults, then another model into the same root.
#[test]
fn hf_example_runs_with_defaults_into_its_own_root_and_refuses_another_models_root() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = small_config(dir.path(), "");
    // A small folder: 512 positions (sampling cost grows with model.context_len, issue 35).
    let folder = edited_copy(
        dir.path(),
        "qwen2.5",
        |c| c["max_position_embeddings"] = 512.into(),
        "",
    );
    let model = folder.to_string_lossy().into_owned();
    let cfg = config.to_string_lossy().into_owned();
    let out = keel(
        dir.path(),
        &[
            "train",
            "--no-progress",
            "--model",
            &model,
            "--env",
            "calc",
            "--config",
            &cfg,
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let root = dir.path().join("runs/qwen2.5");
    assert!(root.is_dir(), "the run root is runs/<model folder name>");
    // The built-in model resumed into that root: one line, naming both models and the way out.
    let root_arg = root.to_string_lossy().into_owned();
    let out = keel(
        dir.path(),
        &[
            "train",
            "--no-progress",
            "--config",
            &cfg,
            "--run-root",
            &root_arg,
        ],
    );
    let err = stderr(&out);
    assert!(!out.status.success());
    let line = err
        .lines()
        .find(|l| l.starts_with("error:"))
        .expect("an error line");
    assert!(
        line.contains("another model") && line.contains("--run-root") && !line.contains('{'),
        "{err}"
    );
    assert!(line.len() < 400, "one short line: {line}");
}

/// Defect 2: every stored trajectory fits `model.context_len`.
#[test]
fn context_len_bounds_every_episode_of_a_folder_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    let context = 96;
    // No SFT: the untrained model's long turns run episodes into the bound.
    let config = small_config(
        dir.path(),
        &format!("\n[model]\ncontext_len = {context}\n\n[env]\nname = \"calc\"\ndifficulty = 3\n"),
    );
    let text = std::fs::read_to_string(&config).expect("config");
    std::fs::write(
        &config,
        text.replace("[sft]\nsteps = 2", "[sft]\nsteps = 0"),
    )
    .expect("config");
    let root = dir.path().join("run");
    let out = keel(
        dir.path(),
        &[
            "train",
            "--no-progress",
            "--model",
            &qwen25().to_string_lossy(),
            "--config",
            &config.to_string_lossy(),
            "--run-root",
            &root.to_string_lossy(),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let lengths: Vec<usize> = stored_batches(&root)
        .iter()
        .flat_map(|b| b.trajectories.iter().map(|t| t.tokens.len()))
        .collect();
    assert!(!lengths.is_empty());
    assert!(
        lengths.iter().all(|&n| n <= context),
        "trajectory lengths {lengths:?} over {context}"
    );
}

/// A copy of the folder with `edit` applied to its config.json, or `file` removed.
fn edited_copy(
    dir: &Path,
    name: &str,
    edit: impl Fn(&mut serde_json::Value),
    drop: &str,
) -> PathBuf {
    let to = dir.join(name);
    std::fs::create_dir_all(&to).expect("mkdir");
    for entry in std::fs::read_dir(qwen25()).expect("read") {
        let entry = entry.expect("entry");
        if entry.file_name() != drop {
            std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copy");
        }
    }
    let path = to.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("config")).expect("json");
    edit(&mut cfg);
    std::fs::write(&path, cfg.to_string()).expect("write");
    to
}

/// Defect 9: `keel data check --model` refuses what `keel train` refuses, and a refused folder
/// leaves no run root behind.
#[test]
fn data_check_and_train_refuse_bad_folders_before_writing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rows = dir.path().join("rows.jsonl");
    std::fs::write(
        &rows,
        "{\"prompt\": [{\"role\": \"user\", \"content\": \"What is 2 + 3?\"}], \"data_source\": \"toy\", \"reward_model\": {\"ground_truth\": \"5\"}}\n",
    )
    .expect("rows");
    let yarn = edited_copy(
        dir.path(),
        "yarn",
        |c| {
            c["rope_parameters"] =
                serde_json::json!({"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6})
        },
        "",
    );
    let weightless = edited_copy(dir.path(), "weightless", |_| {}, "model.safetensors");
    for (folder, names) in [(&yarn, "rope_type"), (&weightless, "model.safetensors")] {
        let out = keel(
            dir.path(),
            &[
                "data",
                "check",
                &rows.to_string_lossy(),
                "--model",
                &folder.to_string_lossy(),
            ],
        );
        assert!(
            !out.status.success(),
            "data check passed {}",
            folder.display()
        );
        assert!(stderr(&out).contains(names), "{}", stderr(&out));
        let root = dir.path().join(format!("root-{names}"));
        let out = keel(
            dir.path(),
            &[
                "train",
                "--no-progress",
                "--model",
                &folder.to_string_lossy(),
                "--env",
                "calc",
                "--run-root",
                &root.to_string_lossy(),
            ],
        );
        assert!(!out.status.success());
        assert!(stderr(&out).contains(names), "{}", stderr(&out));
        assert!(!root.exists(), "a refused folder writes nothing");
    }
    // The good folder passes and reports what was checked.
    let out = keel(
        dir.path(),
        &[
            "data",
            "check",
            &rows.to_string_lossy(),
            "--model",
            &qwen25().to_string_lossy(),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("config, weights and chat template pass"));
}
