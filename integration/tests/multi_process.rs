//! Roles as processes (`keel trainer` + `keel generator --rank R`), coordinated only through the
//! run root, and trainer lives as fencing tokens:
//!
//! - a sync run of a trainer and two generator processes on SeaweedFS ends bit-identical to the
//!   one-process `keel train` with the same config and seed (RM-2, SU-1);
//! - two trainers started one second apart on one empty run root: exactly one trains, the other
//!   exits non-zero naming the winner (LV-2);
//! - a zombie trainer (SIGSTOP, a new trainer starts, SIGCONT) exits without writing a checkpoint
//!   (LV-2, LV-3);
//! - a SIGKILL soak over every role (trainer, either generator; 20 kills in CI,
//!   `KEEL_ROLE_SOAK=N` for N, `KEEL_CRASH_SEED` replays) with the crash harness's accounting check
//!   after each kill, ending in a finished run (RM-3, RM-5). Each kill waits for progress in the
//!   run root (the trainer's next checkpoint, a generator's next order or result), never for
//!   the clock, so a loaded machine slows the soak down without changing what it proves;
//! - in async mode the generator processes load newer weights while they sample, and orders
//!   that name them find them loaded (GW-5).
//!
//! Every process a test starts is killed with its process group when the test ends (PG-1).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use keel_integration::{check_accounting, keel_bin, s3_root, test_rt, Guarded, MethodRun};
use keel_store::RunStore;
use rand::{Rng, SeedableRng};

const TASKS_PER_BATCH: u64 = 6; // MethodRun's rollout.tasks_per_batch

/// A tiny sync GRPO run with two generator ranks; `latency_ms` slows each env step down.
fn config(dir: &Path, name: &str, steps: u64, latency_ms: f64) -> PathBuf {
    let run = MethodRun {
        steps,
        checkpoint_every: 2,
        latency_ms,
        ..MethodRun::new("grpo")
    };
    config_of(dir, name, &run)
}

/// `run` with two generator ranks and a short order timeout and poll.
fn config_of(dir: &Path, name: &str, run: &MethodRun) -> PathBuf {
    let toml = run
        .toml()
        .replace("[rollout]\n", "[rollout]\ngenerators = 2\n")
        .replace(
            "[metrics]\n",
            "[distributed]\norder_timeout_s = 20\npoll_ms = 20\n\n[metrics]\n",
        );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, toml).expect("write config");
    path
}

/// `keel <role args> --run-root <root>`, logging to `log`; killed when dropped (PG-1).
fn spawn(args: &[&str], config: &Path, root: &str, log: &Path) -> Guarded {
    let log = std::fs::File::create(log).expect("log file");
    Guarded::spawn(
        Command::new(keel_bin())
            .args(args)
            .arg("--config")
            .arg(config)
            .args(["--run-root", root])
            .env("KEEL_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(log),
    )
    .expect("start keel")
}

fn trainer(config: &Path, root: &str, log: &Path) -> Guarded {
    spawn(&["trainer", "--no-progress"], config, root, log)
}

fn generator(rank: u32, config: &Path, root: &str, log: &Path) -> Guarded {
    let rank = rank.to_string();
    spawn(&["generator", "--rank", &rank], config, root, log)
}

fn wait_ok(child: &mut Guarded, what: &str, log: &Path) {
    let status = child.wait().expect("wait");
    assert!(
        status.success(),
        "{what} failed ({status}):\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

/// A trainer and generator ranks 0 and 1 on `root` (logs in `dir`), each of which must exit 0:
/// the generators once the trainer recorded that the run finished (GW-4).
fn run_trainer_and_two_generators(dir: &Path, cfg: &Path, root: &str) {
    let logs: Vec<PathBuf> = ["trainer", "g0", "g1"]
        .iter()
        .map(|n| dir.join(format!("{n}.log")))
        .collect();
    let mut t = trainer(cfg, root, &logs[0]);
    let mut g0 = generator(0, cfg, root, &logs[1]);
    let mut g1 = generator(1, cfg, root, &logs[2]);
    wait_ok(&mut t, "keel trainer", &logs[0]);
    wait_ok(&mut g0, "keel generator --rank 0", &logs[1]);
    wait_ok(&mut g1, "keel generator --rank 1", &logs[2]);
}

/// (step, model crc, optimizer crc) of every checkpoint on the head's lineage, oldest first.
fn lineage_crcs(rt: &tokio::runtime::Runtime, root: &str) -> Vec<(u64, u32, u32)> {
    let store = RunStore::open(root).expect("open");
    let (_, lineage) = check_accounting(rt, &store, TASKS_PER_BATCH, root).expect("a checkpoint");
    let crc = keel_integration::file_crc;
    lineage
        .iter()
        .rev()
        .map(|m| {
            (
                m.step,
                crc(m, "model.safetensors"),
                crc(m, "optimizer.safetensors"),
            )
        })
        .collect()
}

#[test]
fn sync_trainer_and_two_generators_end_bit_identical_to_one_process_on_s3() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = test_rt();
    let cfg = config(dir.path(), "sync", 6, 0.0);
    let one = s3_root("mp-one");
    let log = dir.path().join("one.log");
    let mut train = spawn(&["train", "--no-progress"], &cfg, &one, &log);
    wait_ok(&mut train, "keel train", &log);

    let multi = s3_root("mp-multi");
    run_trainer_and_two_generators(dir.path(), &cfg, &multi);

    let a = lineage_crcs(&rt, &one);
    let b = lineage_crcs(&rt, &multi);
    assert_eq!(a.len(), 4, "SFT root + steps 2, 4, 6: {a:?}");
    assert_eq!(a, b, "the multi-process run must be bit-identical");
    // The batches were sampled by the generator processes (their keys carry the rank, ST-12).
    let store = RunStore::open(&multi).expect("open");
    let keys = rt.block_on(store.list_batches()).expect("batches");
    assert_eq!(keys.len(), 6);
    assert!(keys.iter().all(|k| k.0.contains("-r000")), "{keys:?}");
}

#[test]
fn two_trainers_on_one_empty_run_root_exactly_one_trains() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = test_rt();
    let cfg = config(dir.path(), "race", 12, 5.0);
    let root = dir.path().join("root");
    let root = root.to_str().expect("utf8");
    let (log_a, log_b) = (dir.path().join("a.log"), dir.path().join("b.log"));
    let mut a = spawn(&["train", "--no-progress"], &cfg, root, &log_a);
    std::thread::sleep(Duration::from_secs(1));
    let mut b = spawn(&["train", "--no-progress"], &cfg, root, &log_b);
    let (sa, sb) = (a.wait().expect("a"), b.wait().expect("b"));
    let (text_a, text_b) = (
        std::fs::read_to_string(&log_a).unwrap_or_default(),
        std::fs::read_to_string(&log_b).unwrap_or_default(),
    );
    assert!(
        sb.success(),
        "the newer trainer (life 2) trains to the end:\n{text_b}"
    );
    assert!(!sa.success(), "the older trainer must stop:\n{text_a}");
    assert!(
        text_a.contains("superseded by life 2 (train, pid"),
        "the loser names the winner:\n{text_a}"
    );
    let store = RunStore::open(root).expect("open");
    let (head, lineage) =
        check_accounting(&rt, &store, TASKS_PER_BATCH, "after the race").expect("a checkpoint");
    assert_eq!(head.step, 12);
    // One SFT root, and every checkpoint there is on one lineage: nobody else committed.
    let all = rt.block_on(store.list_checkpoints()).expect("list");
    assert_eq!(all.len(), lineage.len(), "no checkpoint off the lineage");
    assert_eq!(all.iter().filter(|m| m.parent.is_none()).count(), 1);
}

/// Polls until the run root holds a checkpoint at `step` or more.
fn wait_for_step(rt: &tokio::runtime::Runtime, root: &str, step: u64, child: &mut Guarded) {
    let store = RunStore::open(root).expect("open");
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        if let Ok(Some(m)) = rt.block_on(store.latest_checkpoint()) {
            if m.step >= step {
                return;
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the trainer ended ({status}) before step {step}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("no checkpoint at step {step} within 120 s");
}

#[test]
fn a_zombie_trainer_exits_without_writing_a_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = test_rt();
    let cfg = config(dir.path(), "zombie", 16, 5.0);
    let root = dir.path().join("root");
    let root = root.to_str().expect("utf8");
    let (log_a, log_b) = (dir.path().join("a.log"), dir.path().join("b.log"));
    let mut a = spawn(&["train", "--no-progress"], &cfg, root, &log_a);
    wait_for_step(&rt, root, 2, &mut a);
    let pid = a.id().to_string();
    let signal = |sig: &str| {
        let ok = Command::new("kill")
            .args([sig, &pid])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill {sig} {pid}");
    };
    signal("-STOP");
    let store = RunStore::open(root).expect("open");
    let before: Vec<String> = rt
        .block_on(store.list_checkpoints())
        .expect("list")
        .into_iter()
        .map(|m| m.id)
        .collect();
    let mut b = spawn(&["train", "--no-progress"], &cfg, root, &log_b);
    let newest = before.len();
    // Let the new life commit at least one checkpoint of its own, then wake the zombie.
    let deadline = Instant::now() + Duration::from_secs(120);
    while rt.block_on(store.list_checkpoints()).expect("list").len() <= newest {
        assert!(
            Instant::now() < deadline,
            "the new trainer committed nothing"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    signal("-CONT");
    let sa = a.wait().expect("a");
    let text_a = std::fs::read_to_string(&log_a).unwrap_or_default();
    assert!(!sa.success(), "the zombie must exit non-zero:\n{text_a}");
    assert!(text_a.contains("superseded by life 2"), "{text_a}");
    wait_ok(&mut b, "the new trainer", &log_b);
    let (head, lineage) =
        check_accounting(&rt, &store, TASKS_PER_BATCH, "after the zombie").expect("a checkpoint");
    assert_eq!(head.step, 16);
    let all = rt.block_on(store.list_checkpoints()).expect("list");
    assert_eq!(
        all.len(),
        lineage.len(),
        "the zombie wrote a checkpoint off the lineage"
    );
}

/// Which role a soak kill hits.
#[derive(Clone, Copy, Debug)]
enum Role {
    Trainer,
    Generator(u32),
}

/// What a soak kill waits for: one more of these in the run root.
#[derive(Clone, Copy, Debug)]
enum Progress {
    Orders,
    Results,
    Checkpoints,
}

/// How many orders, results and checkpoint manifests the local run root `root` holds.
fn progress(root: &Path) -> [usize; 3] {
    let mut counts = [0; 3];
    for path in keel_integration::roles::walk(root) {
        let under = |name: &str| path.components().any(|c| c.as_os_str() == name);
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if under("orders") {
            counts[0] += 1;
        } else if under("results") {
            counts[1] += 1;
        } else if under("checkpoints") && name == "MANIFEST.json" {
            counts[2] += 1;
        }
    }
    counts
}

/// Waits until the run root holds one more `kind` than `since`; answers the counts then. A run
/// that makes no progress for 180 s, or a trainer that ends, fails the soak.
fn wait_for_progress(
    root: &Path,
    kind: Progress,
    since: [usize; 3],
    trainer: &mut Guarded,
    context: &str,
) -> [usize; 3] {
    let k = kind as usize;
    let mut stalled = Instant::now();
    let mut seen = since;
    loop {
        let now = progress(root);
        if now[k] > since[k] {
            return now;
        }
        if now != seen {
            (seen, stalled) = (now, Instant::now());
        }
        if let Ok(Some(status)) = trainer.try_wait() {
            panic!("the trainer ended on its own ({status}) before {context}");
        }
        assert!(
            stalled.elapsed() < Duration::from_secs(180),
            "no progress for 180 s before {context}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigkill_soak_over_every_role_keeps_the_books() {
    let kills: usize = std::env::var("KEEL_ROLE_SOAK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let seed: u64 = std::env::var("KEEL_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    eprintln!("role soak seed: {seed} (replay with KEEL_CRASH_SEED={seed})");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = test_rt();
    let steps = 1_000_000; // killed lives never finish on their own
    let cfg = config(dir.path(), "soak", steps, 2.0);
    let root = dir.path().join("root");
    let root = root.to_str().expect("utf8");
    let store = RunStore::open(root).expect("open");
    let log = |name: &str, n: usize| dir.path().join(format!("{name}-{n}.log"));
    let mut t = trainer(&cfg, root, &log("trainer", 0));
    let mut gens = [
        generator(0, &cfg, root, &log("g0", 0)),
        generator(1, &cfg, root, &log("g1", 0)),
    ];
    let mut trainer_kills = 0;
    let mut last = progress(Path::new(root));
    for n in 1..=kills {
        let role = match rng.gen_range(0..3) {
            0 => Role::Trainer,
            r => Role::Generator(r - 1),
        };
        // Kills follow progress, never the clock: a trainer dies after its next checkpoint, a
        // generator after the next order or result.
        let kind = match role {
            Role::Trainer => Progress::Checkpoints,
            Role::Generator(_) if rng.gen_bool(0.5) => Progress::Orders,
            Role::Generator(_) => Progress::Results,
        };
        let context = format!("kill {n} ({role:?} after {kind:?}, seed {seed})");
        last = wait_for_progress(Path::new(root), kind, last, &mut t, &context);
        let victim = match role {
            Role::Trainer => &mut t,
            Role::Generator(r) => &mut gens[r as usize],
        };
        if let Ok(Some(status)) = victim.try_wait() {
            panic!("{role:?} ended on its own ({status}) before kill {n}");
        }
        victim.kill_group();
        let context = format!("after kill {n} ({role:?}, seed {seed})");
        check_accounting(&rt, &store, TASKS_PER_BATCH, &context);
        match role {
            Role::Trainer => {
                trainer_kills += 1;
                t = trainer(&cfg, root, &log("trainer", n));
            }
            Role::Generator(r) => {
                gens[r as usize] = generator(r, &cfg, root, &log(&format!("g{r}"), n));
            }
        }
    }
    // The last trainer life finishes the run: a few more steps past the newest checkpoint.
    t.kill_group();
    let (head, _) = check_accounting(&rt, &store, TASKS_PER_BATCH, "before the last life")
        .expect("the soak reached a checkpoint");
    let finish = config(dir.path(), "finish", head.step + 4, 0.0);
    // The config changed (steps), so the generators must be given it: restart them.
    for g in &mut gens {
        g.kill_group();
    }
    let last = log("trainer", kills + 1);
    let lives = rt.block_on(store.lives()).expect("lives").len();
    let mut t = trainer(&finish, root, &last);
    // GW-1: generators given the new config must see the life that trains under it.
    let deadline = Instant::now() + Duration::from_secs(60);
    while rt.block_on(store.lives()).expect("lives").len() == lives {
        assert!(
            Instant::now() < deadline,
            "the last trainer claimed no life"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut gens: Vec<Guarded> = (0..2)
        .map(|r| generator(r, &finish, root, &log(&format!("g{r}"), kills + 1)))
        .collect();
    wait_ok(&mut t, "the last trainer life", &last);
    for (r, g) in gens.iter_mut().enumerate() {
        wait_ok(
            g,
            "a generator of the last life",
            &log(&format!("g{r}"), kills + 1),
        );
    }
    let (end, _) = check_accounting(&rt, &store, TASKS_PER_BATCH, "at the end").expect("end");
    assert_eq!(end.step, head.step + 4);
    eprintln!(
        "role soak: {kills} kills ({trainer_kills} of the trainer), {} steps trained",
        end.step
    );
}

/// Every order result (`results/<life>/<seq>.json`) under the local run root `root`.
fn order_results(root: &Path) -> Vec<serde_json::Value> {
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).expect("read dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.components().any(|c| c.as_os_str() == "results")
                && path.extension().is_some_and(|e| e == "json")
            {
                let text = std::fs::read_to_string(&path).expect("read result");
                found.push(serde_json::from_str(&text).expect("a result parses"));
            }
        }
    }
    found
}

#[test]
fn async_generators_load_newer_weights_while_they_sample() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = test_rt();
    let run = MethodRun {
        steps: 8,
        checkpoint_every: 4,
        mode: "async",
        bound: 2,
        latency_ms: 10.0,
        ..MethodRun::new("grpo")
    };
    let cfg = config_of(dir.path(), "async", &run);
    let root = dir.path().join("root");
    let root_s = root.to_str().expect("utf-8").to_owned();
    run_trainer_and_two_generators(dir.path(), &cfg, &root_s);

    let store = RunStore::open(&root_s).expect("open");
    let (head, _) = check_accounting(&rt, &store, TASKS_PER_BATCH, "async").expect("accounting");
    assert_eq!(head.step, 8);
    let results = order_results(&root);
    let trained: Vec<&serde_json::Value> = results
        .iter()
        .filter(|r| r["outcome"].get("Done").is_some())
        .collect();
    assert!(!trained.is_empty(), "no answered orders in {results:?}");
    let ahead = results
        .iter()
        .filter(|r| r["weights_prefetched"] == serde_json::json!(true))
        .count();
    // The first order of each rank cannot find its weights loaded ahead; in async mode the
    // trainer publishes while the ranks sample, so later orders do.
    assert!(
        ahead >= 2,
        "{ahead} of {} orders found their weights loaded ahead",
        results.len()
    );
}
