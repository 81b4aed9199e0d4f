//! SIGTERM during SFT (issue 32 item 5): SFT stops at a step boundary with its progress
//! committed as an `sft-partial` checkpoint and exits 0; the next start continues SFT from it
//! and its SFT checkpoint is bit-identical to an uninterrupted run's (SF-1, SF-2, JB-2); a stop
//! that outlives the grace period is an orderly exit 1 (PE-2), never a crash.

use std::path::Path;

use keel_integration::{checkpoints, run_train, train_command, Guarded, MethodRun};

/// A run whose SFT takes many steps, checkpointed every 40.
fn config(dir: &Path, name: &str, extra_sft: &str) -> std::path::PathBuf {
    let toml = MethodRun {
        steps: 2,
        checkpoint_every: 2,
        ..MethodRun::new("grpo")
    }
    .toml()
    .replace(
        "[sft]\nsteps = 120\n",
        &format!("[sft]\nsteps = 400\n{extra_sft}"),
    );
    assert!(
        toml.contains("steps = 400"),
        "the tiny config changed: {toml}"
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, toml).expect("config");
    path
}

fn spawn(cfg: &Path, root: &Path, out: &Path, err: &Path) -> Guarded {
    Guarded::spawn(
        train_command(cfg, root, &[])
            .env("KEEL_LOG", "info")
            .stdout(std::fs::File::create(out).expect("stdout"))
            .stderr(std::fs::File::create(err).expect("stderr")),
    )
    .expect("start keel train")
}

fn sigterm(child: &Guarded) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
}

/// crc32 of the model of the checkpoint tagged `sft` (the SFT result).
fn sft_model_crc(root: &Path) -> u32 {
    let all = checkpoints(root);
    let sft = all
        .iter()
        .find(|m| m.tags.iter().any(|t| t == "sft"))
        .expect("an sft checkpoint");
    sft.files
        .iter()
        .find(|f| f.name == "model.safetensors")
        .expect("model")
        .crc32
}

#[test]
fn sigterm_during_sft_commits_its_progress_and_the_resumed_sft_is_bit_identical() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path(), "sft", "checkpoint_every = 40\n");
    // The uninterrupted run.
    let whole = dir.path().join("whole");
    run_train(&cfg, &whole, &[]);
    // Stopped once its first SFT checkpoint exists (progress, not time).
    let root = dir.path().join("stopped");
    let (out, err) = (dir.path().join("out.txt"), dir.path().join("err.txt"));
    let mut child = spawn(&cfg, &root, &out, &err);
    loop {
        if root.join("checkpoints").exists() && !checkpoints(&root).is_empty() {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("keel train ended ({status}) before its first SFT checkpoint");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    sigterm(&child);
    let status = child.wait().expect("wait");
    let (stdout, stderr) = (
        std::fs::read_to_string(&out).unwrap_or_default(),
        std::fs::read_to_string(&err).unwrap_or_default(),
    );
    assert!(status.success(), "{status}\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("stopped on request: checkpoint"),
        "{stdout}"
    );
    assert!(!stderr.contains("torch"), "{stderr}");
    let partial: Vec<_> = checkpoints(&root)
        .into_iter()
        .filter(|m| m.tags.iter().any(|t| t == "sft-partial"))
        .collect();
    let done = partial
        .iter()
        .filter_map(|m| m.metrics.get("sft_steps").copied())
        .fold(0.0, f64::max);
    assert!(
        (40.0..400.0).contains(&done),
        "SFT checkpoints: {partial:?}"
    );
    assert!(
        !checkpoints(&root)
            .iter()
            .any(|m| m.tags.iter().any(|t| t == "sft")),
        "SFT did not finish before the stop"
    );
    let stop_ckpt = partial
        .iter()
        .max_by_key(|m| m.metrics.get("sft_steps").copied().unwrap_or(0.0) as u64)
        .map(|m| m.id.clone())
        .expect("the stop's SFT checkpoint");
    // The next start continues SFT from the stop's checkpoint (SF-1) and finishes the run.
    run_train(&cfg, &root, &[]);
    let after = checkpoints(&root);
    let sft_steps_of = |id: &str| {
        after
            .iter()
            .find(|m| m.id == id)
            .and_then(|m| m.metrics.get("sft_steps").copied())
    };
    // Its SFT checkpoints descend from the stop's, each further on.
    let mut chain = Vec::new();
    let mut at = after
        .iter()
        .find(|m| m.tags.iter().any(|t| t == "sft"))
        .and_then(|m| m.parent.clone());
    let mut descends = false;
    while let Some(id) = at {
        if id == stop_ckpt {
            descends = true;
            break;
        }
        chain.push(sft_steps_of(&id).unwrap_or(f64::NAN));
        at = after
            .iter()
            .find(|m| m.id == id)
            .and_then(|m| m.parent.clone());
    }
    assert!(
        descends,
        "the resumed SFT does not descend from the stop's checkpoint {stop_ckpt}: {after:?}"
    );
    assert!(
        chain.iter().all(|&s| s > done),
        "the resumed SFT repeated steps before {done}: {chain:?}"
    );
    assert_eq!(
        sft_model_crc(&root),
        sft_model_crc(&whole),
        "the resumed SFT must end bit-identical to the uninterrupted one (SF-1)"
    );
}

#[test]
fn a_stop_that_outlives_the_grace_period_is_an_orderly_exit_1() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Slow SFT steps (a wide model, big batches) and a 1 s grace: the step in progress
    // outlives the grace period.
    let toml = std::fs::read_to_string(config(dir.path(), "slow", ""))
        .expect("config")
        .replace("d_model = 32", "d_model = 512")
        .replace("n_layer = 1", "n_layer = 6")
        .replace("batch_size = 16", "batch_size = 256")
        .replace("threads = 1", "threads = 1\nsigterm_grace_s = 1");
    let cfg = dir.path().join("slow.toml");
    std::fs::write(&cfg, toml).expect("config");
    let root = dir.path().join("run");
    let (out, err) = (dir.path().join("out.txt"), dir.path().join("err.txt"));
    let mut child = spawn(&cfg, &root, &out, &err);
    // Progress: SFT has started (its first step logged).
    loop {
        let text = std::fs::read_to_string(&err).unwrap_or_default();
        if text.contains("sft") && text.contains("loss") {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("keel train ended ({status}) before SFT started:\n{text}");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    sigterm(&child);
    let status = child.wait().expect("wait");
    let stderr = std::fs::read_to_string(&err).unwrap_or_default();
    assert!(
        status.success() || status.code() == Some(1),
        "an orderly exit (0 after a checkpoint, or 1 past the grace period), got {status}:\n{stderr}"
    );
    assert!(
        !stderr.contains("Internal torch error") && !stderr.contains("panicked"),
        "{stderr}"
    );
    if status.code() == Some(1) {
        assert!(stderr.contains("grace period"), "{stderr}");
    }
    let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
    eprintln!("exit after SIGTERM during a slow SFT step: {status}; stderr ends {tail:?}");
}
