//! Learner ranks end to end (issue 36): `keel train` with `learner.ranks = 2` starts a
//! `keel learner --rank 1` process, the two learners train over PyTorch's Gloo group on loopback
//! (LK-1..4, DDP-1..4), and the run ends where one learner's run ends. A follower that dies fails
//! the trainer's next collective with a clear error instead of hanging it (CG-1, LK-3).

use std::path::Path;
use std::time::Duration;

use keel_integration::runs::PROGRESS_DEADLINE;
use keel_integration::{
    free_port, head_file, head_weights, log_tail, spawn_train, test_rt, wait_exit, MethodRun,
};

/// The tiny GRPO run with `ranks` learner ranks meeting on a free loopback port.
fn ranked_run(ranks: usize, steps: u64) -> MethodRun {
    ranked("grpo", ranks, steps)
}

/// The tiny run of `algo` with `ranks` learner ranks meeting on a free loopback port.
fn ranked(algo: &'static str, ranks: usize, steps: u64) -> MethodRun {
    MethodRun {
        steps,
        checkpoint_every: steps,
        learner: format!("ranks = {ranks}\n"),
        extra: format!(
            "[distributed]\nlearner_port = {}\ncollective_timeout_s = 120\n",
            free_port()
        ),
        ..MethodRun::new(algo)
    }
}

/// `(name, f32 values)` of every tensor of a safetensors file, by name.
fn tensors(bytes: &[u8]) -> Vec<(String, Vec<f32>)> {
    let st = safetensors::SafeTensors::deserialize(bytes).expect("safetensors");
    let mut out: Vec<(String, Vec<f32>)> = st
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let values = view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            (name, values)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Runs `run` on `root` to its end; answers the head checkpoint's step and weights.
fn train(dir: &Path, run: &MethodRun, name: &str) -> (u64, Vec<u8>) {
    let root = dir.join(name);
    let config = run.write(dir, name);
    let mut child = spawn_train(&config, &root, &[]);
    let status = wait_exit(&mut child, PROGRESS_DEADLINE, || log_tail(&root));
    assert!(
        status.success(),
        "{name} failed ({status}):\n{}",
        log_tail(&root)
    );
    head_weights(&test_rt(), &root)
}

/// DDP-1 between two safetensors files: the same tensors, equal up to the order of a sum.
fn assert_same_update(one: &[u8], two: &[u8], what: &str) {
    let (one, two) = (tensors(one), tensors(two));
    assert_eq!(
        one.iter().map(|t| &t.0).collect::<Vec<_>>(),
        two.iter().map(|t| &t.0).collect::<Vec<_>>(),
        "{what}"
    );
    for ((name, a), (_, b)) in one.iter().zip(&two) {
        let diff: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
        let norm: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum();
        let rel = (diff / norm.max(1e-30)).sqrt();
        eprintln!("{what} {name}: {rel:e}");
        assert!(rel <= 1e-5, "{what} {name}: ‖two − one‖ / ‖one‖ = {rel:e}");
    }
}

/// Continues a copy of the run root `base` as `name` with `run` (a resume, here on another
/// number of ranks); answers the head checkpoint's step and weights. Every copy's next batch
/// is sampled from the same weights, so the update is compared on the same batch. Later
/// batches could differ: N ranks round differently from one (sharded SFT: within 1e-5,
/// unit-tested), and weights one rounding apart may draw another token (measured: Dr. MAS's
/// main model 4e-4 apart after two RL steps, 1e-8 after one).
fn continued(dir: &Path, base: &Path, run: &MethodRun, name: &str) -> (u64, Vec<u8>) {
    keel_integration::copy_dir(base, &dir.join(name));
    train(dir, run, name)
}

#[test]
fn two_learner_ranks_train_the_policy_one_learner_trains() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, sft) = train(dir.path(), &ranked_run(1, 1), "base");
    let base = dir.path().join("base");
    let (step1, one) = continued(dir.path(), &base, &ranked_run(1, 3), "one");
    let (step2, two) = continued(dir.path(), &base, &ranked_run(2, 3), "two");
    assert_eq!((step1, step2), (3, 3));
    assert!(
        one != sft,
        "two RL steps moved no weight: nothing is compared"
    );
    // DDP-1: the same gradients up to the order of a sum (measured: at most 7e-9 relative).
    assert_same_update(&one, &two, "the policy");
    // Every step reports the largest peak memory of the ranks' processes (RSS-1).
    let peaks: Vec<f64> = keel_integration::events::train_events(&dir.path().join("two"))
        .into_iter()
        .filter_map(|ev| match ev {
            keel_actors::events::TrainEvent::Step { metrics, .. } => Some(metrics.peak_rss_mib),
            _ => None,
        })
        .collect();
    assert!(peaks.len() >= 2, "{peaks:?}");
    assert!(
        peaks[peaks.len() - 2..]
            .iter()
            .all(|p| p.is_finite() && *p > 50.0),
        "{peaks:?}"
    );
}

/// Dr. MAS with a model of its own for agent 1 (LA-4): on 2 ranks both models end where a
/// one-rank run leaves them; every learner of the actor joins the ranks.
#[test]
fn dr_mas_agent_models_train_on_two_ranks_as_on_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = |ranks: usize, steps: u64| {
        MethodRun {
        steps,
        checkpoint_every: steps,
        env: "solver-verifier",
        difficulty: 2,
        context_len: 128,
        learner: format!("ranks = {ranks}"),
        extra: format!(
            "[[agent_models]]\nagents = [1]\nlr = 0.0005\n\n[distributed]\nlearner_port = {}\ncollective_timeout_s = 120\n",
            free_port()
        ),
        ..MethodRun::new("dr_mas")
    }
    };
    let rt = test_rt();
    let models = |root: &Path| {
        [
            head_file(&rt, root, "model.safetensors").1,
            head_file(&rt, root, "agent-model-1.model.safetensors").1,
        ]
    };
    train(dir.path(), &run(1, 1), "base");
    let base = dir.path().join("base");
    let start = models(&base);
    let mut ends = Vec::new();
    for (ranks, name) in [(1, "one"), (2, "two")] {
        let (step, _) = continued(dir.path(), &base, &run(ranks, 2), name);
        assert_eq!(step, 2, "{name}");
        ends.push(models(&dir.path().join(name)));
    }
    for (k, what) in ["Dr. MAS's main model", "Dr. MAS's agent-1 model"]
        .iter()
        .enumerate()
    {
        assert!(ends[0][k] != start[k], "{what}: RL moved no weight");
        assert_same_update(&ends[0][k], &ends[1][k], what);
    }
}

/// SAO's separate critic on 2 ranks (OP-7, OF-1): its AdamW is sharded like the policy's, so
/// the checkpoint holds one `critic_optimizer` shard per rank, each well under the one-rank
/// file, and the policy and the critic both take the one-rank update.
#[test]
fn sao_shards_its_separate_critics_optimizer_on_two_ranks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = |ranks: usize, steps: u64| {
        let mut run = ranked("sao", ranks, steps);
        run.learner.push_str("critic_warmup = 1\n");
        run
    };
    let rt = test_rt();
    let file = |name: &str, f: &str| head_file(&rt, &dir.path().join(name), f).1;
    train(dir.path(), &run(1, 1), "base");
    let base = dir.path().join("base");
    for (ranks, name) in [(1, "one"), (2, "two")] {
        let (step, _) = continued(dir.path(), &base, &run(ranks, 2), name);
        assert_eq!(step, 2, "{name}");
    }
    for f in ["model.safetensors", "critic.safetensors"] {
        assert!(
            file("one", f) != file("base", f),
            "SAO's step 2 moved no weight of {f}"
        );
        assert_same_update(&file("one", f), &file("two", f), f);
    }
    let whole = file("one", "critic_optimizer.safetensors").len();
    for rank in 0..2 {
        let shard = file(
            "two",
            &format!("critic_optimizer.rank-{rank}-of-2.safetensors"),
        )
        .len();
        assert!(
            4 * shard < 3 * whole,
            "critic optimizer shard {rank}: {shard} bytes of one rank's {whole}"
        );
    }
}

/// Pids of the live processes whose parent is `parent` and whose command line has `needle`.
fn children_running(parent: u32, needle: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // pid (comm) state ppid ...: the comm may hold spaces, so split after its ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if ppid == Some(parent) && cmdline.contains(needle) {
            pids.push(pid);
        }
    }
    pids
}

/// The pid of `trainer`'s learner rank 1, once the trainer started it (progress, not time).
fn rank_one(trainer: &mut std::process::Child, root: &Path) -> i32 {
    let deadline = std::time::Instant::now() + PROGRESS_DEADLINE;
    loop {
        if let Some(&pid) = children_running(trainer.id(), "--rank 1").first() {
            return pid;
        }
        assert!(
            trainer.try_wait().expect("try_wait").is_none(),
            "the trainer exited before starting rank 1:\n{}",
            log_tail(root)
        );
        assert!(
            std::time::Instant::now() < deadline,
            "no rank 1 within {PROGRESS_DEADLINE:?}:\n{}",
            log_tail(root)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_killed_learner_rank_fails_the_run_and_a_restart_resumes_it_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Env latency keeps the run busy between its checkpoints, so the kill lands mid-run.
    let run = MethodRun {
        checkpoint_every: 3,
        latency_ms: 5.0,
        ..ranked_run(2, 9)
    };
    let (whole_step, expected) = train(dir.path(), &run, "whole");

    let root = dir.path().join("run");
    let config = run.write(dir.path(), "run");
    let mut trainer = spawn_train(&config, &root, &[]);
    let follower = rank_one(&mut trainer, &root);
    // Once a checkpoint of the ranks' training is stored, rank 1 dies mid-run.
    keel_integration::wait_for("the first checkpoint", PROGRESS_DEADLINE, || {
        keel_integration::head_step(&root).is_some_and(|s| s >= 3)
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(follower),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("SIGKILL rank 1");
    // CG-1: the trainer's next collective fails at once (the peer's sockets closed); the
    // timeout (120 s here) bounds a hung peer, never reached by a dead one.
    let status = wait_exit(&mut trainer, PROGRESS_DEADLINE, || log_tail(&root));
    let log = log_tail(&root);
    assert!(
        !status.success(),
        "the run must fail without its rank:\n{log}"
    );
    assert!(
        log.contains("rank 0 of 2"),
        "the error must name the collective and the rank:\n{log}"
    );
    assert!(
        log.contains(&format!(
            "learner rank 1 (pid {follower}) was killed by SIGKILL"
        )),
        "LK-5: the error must name the dead rank and how it died:\n{log}"
    );
    // A restart (a new group) resumes from the last checkpoint and ends where the
    // uninterrupted run ended, bit for bit.
    let (step, resumed) = train(dir.path(), &run, "run");
    assert_eq!((step, whole_step), (9, 9));
    assert!(resumed == expected, "the resumed run's weights differ");
}
