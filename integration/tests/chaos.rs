//! The chaos harness (issue 32): a multi-process run (`keel trainer` + `keel generator --rank 0/1`
//! on a SeaweedFS server of the test's own) under a seeded schedule of single faults:
//!
//! - SIGTERM of the trainer during SFT (always the first fault; it resumes SFT, SF-1), during RL,
//!   and inside a checkpoint commit (the trainer SIGSTOPped while a new checkpoint folder has no
//!   manifest or no head yet, CH-2; then SIGTERM, SIGCONT), then a restart;
//! - SIGKILL of the trainer or of a generator, restarted, or a generator left down until the
//!   next fault (the other rank carries the run meanwhile);
//! - SIGSTOP of a generator past the order timeout (its order is withdrawn; it is heard from
//!   again, RM-5) or of the trainer, then SIGCONT;
//! - a storage stall (the server SIGSTOPped past the order timeout) and a storage restart;
//! - (async) a collapse-guard rewind (a NaN fault in the config) followed at once by a SIGKILL
//!   and restart of the trainer: the generators follow the new branch on their own (RM-8).
//!
//! Every fault fires once the run made progress since the previous one (a newer checkpoint on
//! the branch the run trains, a checkpoint folder being committed, a rewind), never on a clock.
//! After each, the books of the run root are checked: every task range and batch trained at most
//! once, trained + pending = handed out (`check_accounting`), and every trained batch within the
//! staleness bound (CH-1). A last life finishes the run with every process exiting 0; then
//! - async: the books again: nothing lost, nothing trained twice, the bound held;
//! - sync: every checkpoint of the chaos run's lineage is bit-identical (model and optimizer) to
//!   the checkpoint at the same step of an uninterrupted `keel train` of the same config.
//!
//! `KEEL_CHAOS=N` runs N faults per test (CI: 8 async, 6 sync); `KEEL_CHAOS_SEED` replays a
//! schedule (seed and schedule are printed first); the faults survived are printed by kind.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use keel_integration::chaos::{check_staleness, send, BatchIndex, CommitWatch, Staleness};
use keel_integration::roles::{config, Roles, NO_PROGRESS};
use keel_integration::{check_accounting, keel_bin, test_rt, Guarded, MethodRun, OwnSeaweed};
use keel_store::{CheckpointManifest, RunStore};
use nix::sys::signal::Signal;
use rand::{Rng, SeedableRng};

const TASKS_PER_BATCH: u64 = 6; // MethodRun's rollout.tasks_per_batch
const ORDER_TIMEOUT_S: u64 = 4;
const ASYNC_BOUND: u64 = 2;

/// One single fault.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    TermTrainerInSft,
    RewindThenKillTrainer,
    TermTrainerInCommit,
    TermTrainer,
    KillTrainer,
    StopTrainer,
    KillGenerator(u32),
    DropGenerator(u32),
    StopGenerator(u32),
    StallStorage,
    RestartStorage,
}

impl Fault {
    fn draw(rng: &mut impl Rng) -> Fault {
        let rank = rng.gen_range(0..2);
        match rng.gen_range(0..9) {
            0 => Fault::TermTrainer,
            1 => Fault::KillTrainer,
            2 => Fault::StopTrainer,
            3 => Fault::KillGenerator(rank),
            4 => Fault::DropGenerator(rank),
            5 => Fault::StopGenerator(rank),
            6 => Fault::StallStorage,
            7 => Fault::RestartStorage,
            _ => Fault::TermTrainerInCommit,
        }
    }

    /// `n` faults: SIGTERM during SFT, (async) the rewind, SIGTERM in a commit, then drawn ones.
    fn schedule(n: usize, mode: Mode, rng: &mut impl Rng) -> Vec<Fault> {
        let mut fixed = vec![Fault::TermTrainerInSft];
        if mode == Mode::Async {
            fixed.push(Fault::RewindThenKillTrainer);
        }
        fixed.push(Fault::TermTrainerInCommit);
        let drawn: Vec<Fault> = (0..n).map(|_| Fault::draw(rng)).collect();
        fixed.into_iter().chain(drawn).take(n).collect()
    }

    fn kind(self) -> &'static str {
        match self {
            Fault::TermTrainerInSft => "SIGTERM trainer during SFT",
            Fault::RewindThenKillTrainer => "guard rewind, then SIGKILL trainer",
            Fault::TermTrainerInCommit => "SIGTERM trainer at a commit",
            Fault::TermTrainer => "SIGTERM trainer during RL",
            Fault::KillTrainer => "SIGKILL trainer",
            Fault::StopTrainer => "SIGSTOP trainer",
            Fault::KillGenerator(_) => "SIGKILL generator, restarted",
            Fault::DropGenerator(_) => "SIGKILL generator, left down",
            Fault::StopGenerator(_) => "SIGSTOP generator past the timeout",
            Fault::StallStorage => "storage stall past the timeout",
            Fault::RestartStorage => "storage killed and restarted",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Sync,
    Async,
}

/// The run under chaos: its roles, its server, where it stands and its books.
struct Chaos {
    mode: Mode,
    roles: Roles,
    server: OwnSeaweed,
    store: RunStore,
    rt: tokio::runtime::Runtime,
    /// A generator left down by the previous fault.
    down: Option<u32>,
    index: BatchIndex,
    checked: BTreeSet<String>,
    staleness: Staleness,
}

impl Chaos {
    /// A run of `mode` on a fresh server and root, every role started.
    fn start(mode: Mode, dir: &Path) -> Chaos {
        let server = OwnSeaweed::start();
        std::env::set_var("AWS_ENDPOINT_URL", &server.endpoint);
        let cfg = chaos_config(mode, dir, "chaos", 1_000_000);
        let root = keel_integration::s3_root("chaos");
        let mut chaos = Chaos {
            mode,
            roles: Roles::new(dir, cfg, &root),
            store: RunStore::open(&root).expect("open"),
            server,
            rt: test_rt(),
            down: None,
            index: BatchIndex::default(),
            checked: BTreeSet::new(),
            staleness: Staleness::default(),
        };
        chaos.roles.start_all();
        chaos
    }

    fn bound(&self) -> u64 {
        match self.mode {
            Mode::Sync => 0,
            Mode::Async => ASYNC_BOUND,
        }
    }

    /// The branch the run trains (the guard's rewinds followed, GD-6) and its head step.
    fn head(&self) -> (RunStore, u64) {
        let branch = self
            .rt
            .block_on(keel_actors::guard::follow_rewinds(&self.store, "main"))
            .unwrap_or_else(|_| "main".into());
        let store = self.store.on_branch(&branch).expect("branch");
        let step = self
            .rt
            .block_on(store.latest_checkpoint())
            .ok()
            .flatten()
            .map_or(0, |m| m.step);
        (store, step)
    }

    /// Panics (with every log) when the trainer ended or nothing happened for NO_PROGRESS.
    fn assert_running(&mut self, since: Instant, context: &str) {
        if let Some(t) = self.roles.trainer.as_mut() {
            if let Ok(Some(status)) = t.try_wait() {
                panic!(
                    "the trainer ended ({status}) before {context}:\n{}",
                    self.roles.logs()
                );
            }
        }
        assert!(
            since.elapsed() < NO_PROGRESS,
            "no progress for {NO_PROGRESS:?} before {context}:\n{}",
            self.roles.logs()
        );
    }

    /// Waits until the run's head moved past `step` (or, with `any`, until any checkpoint exists).
    fn wait_for_progress(&mut self, step: u64, any: bool, context: &str) {
        let since = Instant::now();
        loop {
            let (store, now) = self.head();
            let exists = any
                && self
                    .rt
                    .block_on(store.list_checkpoints())
                    .is_ok_and(|l| !l.is_empty());
            if now > step || exists {
                return;
            }
            self.assert_running(since, context);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn trainer_pid(&self) -> u32 {
        self.roles.trainer.as_ref().expect("a trainer").id()
    }

    /// The trainer got SIGTERM: it must exit 0 (having committed a checkpoint); a new life starts.
    fn trainer_exits_0_and_restarts(&mut self, context: &str) {
        let status = self
            .roles
            .trainer
            .as_mut()
            .expect("trainer")
            .wait()
            .expect("wait");
        assert!(
            status.success(),
            "SIGTERM ({context}) must end in exit 0, got {status}:\n{}",
            self.roles.logs()
        );
        self.roles.trainer = None;
        self.roles.start_trainer();
    }

    /// SIGTERM lands inside the next checkpoint commit that the watch catches in flight (CH-2);
    /// after 8 commits too quick to catch it lands wherever the run is. Answers where it landed.
    fn term_in_commit(&mut self, context: &str) -> &'static str {
        let mut watch = CommitWatch::new(&self.rt, &self.roles.root);
        let since = Instant::now();
        while watch.missed < 8 {
            self.assert_running(since, context);
            let Some(id) = watch.poll(&self.rt) else {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            };
            let pid = self.trainer_pid();
            send(pid, Signal::SIGSTOP);
            if watch.unfinished(&self.rt, &self.store, &id) {
                send(pid, Signal::SIGTERM);
                send(pid, Signal::SIGCONT);
                eprintln!("{context}: SIGTERM landed inside the commit of {id}");
                self.trainer_exits_0_and_restarts(context);
                return "landed inside it";
            }
            send(pid, Signal::SIGCONT);
        }
        send(self.trainer_pid(), Signal::SIGTERM);
        self.trainer_exits_0_and_restarts(context);
        "8 commits too quick to catch: landed during RL"
    }

    /// Waits for the collapse guard to rewind (the followed branch changes from `from`), then
    /// SIGKILLs the trainer and starts a new life; the generators must follow on their own.
    fn rewind_then_kill(&mut self, from: &str, context: &str) {
        let since = Instant::now();
        while self.head().0.branch() == from {
            self.assert_running(since, context);
            std::thread::sleep(Duration::from_millis(20));
        }
        self.roles.kill_trainer();
        self.roles.start_trainer();
    }

    /// Injects `fault` (after its progress condition); answers a note on where it landed.
    fn inject(&mut self, fault: Fault, context: &str) -> Option<&'static str> {
        let stall = Duration::from_secs(ORDER_TIMEOUT_S + 2);
        match fault {
            Fault::TermTrainerInSft | Fault::TermTrainer => {
                send(self.trainer_pid(), Signal::SIGTERM);
                self.trainer_exits_0_and_restarts(context);
            }
            Fault::TermTrainerInCommit => return Some(self.term_in_commit(context)),
            Fault::RewindThenKillTrainer => {
                let from = self.head().0.branch().to_string();
                self.rewind_then_kill(&from, context);
            }
            Fault::KillTrainer => {
                self.roles.kill_trainer();
                self.roles.start_trainer();
            }
            Fault::StopTrainer => {
                let pid = self.trainer_pid();
                send(pid, Signal::SIGSTOP);
                std::thread::sleep(stall);
                send(pid, Signal::SIGCONT);
            }
            Fault::KillGenerator(r) => {
                self.roles.kill_generator(r);
                self.roles.start_generator(r);
            }
            Fault::DropGenerator(r) => {
                self.roles.kill_generator(r);
                self.down = Some(r);
            }
            Fault::StopGenerator(r) => {
                self.roles.signal_generator(r, "-STOP");
                std::thread::sleep(stall);
                self.roles.signal_generator(r, "-CONT");
            }
            Fault::StallStorage => {
                self.server.signal("-STOP");
                std::thread::sleep(stall);
                self.server.signal("-CONT");
            }
            Fault::RestartStorage => {
                self.server.kill();
                self.server.restart();
            }
        }
        None
    }

    /// The books of the branch the run trains: accounting, then staleness (CH-1).
    fn check_books(&mut self, context: &str) -> Option<CheckpointManifest> {
        let (store, _) = self.head();
        let (head, lineage) = check_accounting(&self.rt, &store, TASKS_PER_BATCH, context)?;
        let books = check_staleness(
            &self.rt,
            &self.store,
            &lineage,
            self.bound(),
            &mut self.index,
            &mut self.checked,
            context,
        );
        self.staleness.batches += books.batches;
        self.staleness.turns += books.turns;
        self.staleness.max_lag = self.staleness.max_lag.max(books.max_lag);
        Some(head)
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The run's config: GRPO with two ranks, SFT checkpointed, every checkpoint blob a multipart
/// upload (a commit of several requests, so a SIGTERM can land inside it); async adds the
/// staleness bound, a checkpoint per update and a NaN fault at step 7 that the guard rewinds.
fn chaos_config(mode: Mode, dir: &Path, name: &str, steps: u64) -> PathBuf {
    let run = match mode {
        Mode::Async => MethodRun {
            mode: "async",
            bound: ASYNC_BOUND,
            guard: true,
            extra: "[faults]\nnan_loss_at_step = 7\nnan_loss_count = 3\n".into(),
            ..MethodRun::new("grpo")
        },
        Mode::Sync => MethodRun::new("grpo"),
    };
    // Async checkpoints every update, so that CH-1 knows the update each batch was trained at.
    let every = if mode == Mode::Async { 1 } else { 2 };
    let run = MethodRun {
        steps,
        checkpoint_every: every,
        latency_ms: 5.0,
        ..run
    };
    let path = config(dir, name, &run, ORDER_TIMEOUT_S);
    let mut toml = std::fs::read_to_string(&path)
        .expect("config")
        .replace("[run]\n", "[run]\ncheckpoint_multipart_bytes = 1\n")
        .replace("[sft]\n", "[sft]\ncheckpoint_every = 20\n");
    if mode == Mode::Async {
        toml = toml.replace("[metrics]\n", "[guard]\nmax_rewinds = 20\n\n[metrics]\n");
    }
    std::fs::write(&path, toml).expect("config");
    path
}

/// The seed (`KEEL_CHAOS_SEED`, or the clock) and the schedule of `default` faults
/// (`KEEL_CHAOS`), printed so that a failure can be replayed.
fn seeded_schedule(mode: Mode, default: u64) -> (u64, Vec<Fault>) {
    let faults = env_u64("KEEL_CHAOS").unwrap_or(default) as usize;
    let seed = env_u64("KEEL_CHAOS_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let schedule = Fault::schedule(faults, mode, &mut rng);
    eprintln!("chaos {mode:?} seed {seed} (replay: KEEL_CHAOS_SEED={seed}): {schedule:?}");
    (seed, schedule)
}

/// Fires every fault of `schedule` on progress, checking the books after each; answers how many
/// of each kind (and where a commit SIGTERM landed) the run survived.
fn run_schedule(chaos: &mut Chaos, schedule: &[Fault], seed: u64) -> BTreeMap<String, usize> {
    let mut survived: BTreeMap<String, usize> = BTreeMap::new();
    for (n, fault) in schedule.iter().enumerate() {
        let context = format!("fault {n} ({fault:?}, {:?} seed {seed})", chaos.mode);
        let (_, step) = chaos.head();
        match fault {
            // Their own progress conditions: a commit in flight, a rewind.
            Fault::TermTrainerInCommit | Fault::RewindThenKillTrainer => {}
            // SFT commits its first checkpoint: SFT is under way.
            Fault::TermTrainerInSft => chaos.wait_for_progress(step, true, &context),
            _ => chaos.wait_for_progress(step, false, &context),
        }
        if let Some(r) = chaos.down.take() {
            chaos.roles.start_generator(r);
        }
        let note = chaos.inject(*fault, &context);
        chaos.check_books(&context);
        let kind = match note {
            Some(note) => format!("{} ({note})", fault.kind()),
            None => fault.kind().to_string(),
        };
        *survived.entry(kind).or_default() += 1;
    }
    survived
}

/// The last life trains 4 steps past the head (a new config: every role takes it) and every
/// role exits 0; answers that config and the final step.
fn finish(chaos: &mut Chaos, dir: &Path) -> (PathBuf, u64) {
    chaos.roles.kill_trainer();
    for r in 0..2 {
        chaos.roles.kill_generator(r);
    }
    let (_, step) = chaos.head();
    chaos
        .check_books("before the last life")
        .expect("the run reached a checkpoint");
    let cfg = chaos_config(chaos.mode, dir, "finish", step + 4);
    chaos.roles.cfg = cfg.clone();
    // GW-1: generators given the new config must find the life that trains under it.
    let lives = |c: &Chaos| {
        let (store, _) = c.head();
        c.rt.block_on(store.lives()).map_or(0, |l| l.len())
    };
    let before = lives(chaos);
    chaos.roles.start_trainer();
    let since = Instant::now();
    while lives(chaos) == before {
        chaos.assert_running(since, "the last trainer claims its life");
        std::thread::sleep(Duration::from_millis(20));
    }
    chaos.roles.start_generator(0);
    chaos.roles.start_generator(1);
    let (rt, store) = (&chaos.rt, &chaos.store);
    chaos.roles.finish_ok_with(|| head_id(rt, store));
    let end = chaos.check_books("at the end").expect("a checkpoint");
    assert_eq!(end.step, step + 4, "the last life trains to its steps");
    (cfg, end.step)
}

fn head_id(rt: &tokio::runtime::Runtime, store: &RunStore) -> String {
    let branch = rt
        .block_on(keel_actors::guard::follow_rewinds(store, "main"))
        .unwrap_or_else(|_| "main".into());
    let on = store.on_branch(&branch).expect("branch");
    rt.block_on(on.latest_checkpoint())
        .ok()
        .flatten()
        .map_or_else(String::new, |m| m.id)
}

fn report(chaos: &Chaos, seed: u64, survived: &BTreeMap<String, usize>, step: u64) {
    let (store, _) = chaos.head();
    eprintln!(
        "chaos {:?} seed {seed}: {} faults survived: {survived:?}; finished at step {step} on \
         branch {}; staleness books: {:?}",
        chaos.mode,
        survived.values().sum::<usize>(),
        store.branch(),
        chaos.staleness
    );
}

#[test]
fn an_async_multi_process_run_survives_a_seeded_schedule_of_single_faults() {
    let (seed, schedule) = seeded_schedule(Mode::Async, 8);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut chaos = Chaos::start(Mode::Async, dir.path());
    let survived = run_schedule(&mut chaos, &schedule, seed);
    let (_, step) = finish(&mut chaos, dir.path());
    assert!(
        chaos.staleness.turns > 0,
        "the staleness books read nothing"
    );
    report(&chaos, seed, &survived, step);
}

/// (step, model crc, optimizer crc) of every RL checkpoint on the lineage of `store`'s head.
fn rl_crcs(rt: &tokio::runtime::Runtime, store: &RunStore) -> BTreeMap<u64, (u32, u32)> {
    let (_, lineage) = check_accounting(rt, store, TASKS_PER_BATCH, "crcs").expect("a checkpoint");
    let crc = keel_integration::file_crc;
    lineage
        .iter()
        .filter(|m| m.step > 0)
        .map(|m| {
            let crcs = (crc(m, "model.safetensors"), crc(m, "optimizer.safetensors"));
            (m.step, crcs)
        })
        .collect()
}

/// An uninterrupted one-process `keel train` of `cfg` on a fresh root of the same server.
fn uninterrupted(dir: &Path, cfg: &Path) -> RunStore {
    let root = keel_integration::s3_root("chaos-reference");
    let log = dir.join("reference.log");
    let status = Guarded::spawn(
        Command::new(keel_bin())
            .args(["train", "--no-progress", "--config"])
            .arg(cfg)
            .args(["--run-root", &root])
            .env("KEEL_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log")),
    )
    .expect("start keel train")
    .wait()
    .expect("wait");
    assert!(
        status.success(),
        "the uninterrupted run failed ({status}):\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    RunStore::open(&root).expect("open")
}

#[test]
fn a_sync_multi_process_run_under_faults_ends_bit_identical_to_an_uninterrupted_one() {
    let (seed, schedule) = seeded_schedule(Mode::Sync, 6);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut chaos = Chaos::start(Mode::Sync, dir.path());
    let survived = run_schedule(&mut chaos, &schedule, seed);
    let (cfg, step) = finish(&mut chaos, dir.path());
    report(&chaos, seed, &survived, step);
    let reference = uninterrupted(dir.path(), &cfg);
    let want = rl_crcs(&chaos.rt, &reference);
    let got = rl_crcs(&chaos.rt, &chaos.head().0);
    assert!(
        want.contains_key(&step),
        "the uninterrupted run ends at {step}"
    );
    assert_eq!(
        got.get(&step),
        want.get(&step),
        "seed {seed}: the final checkpoint (step {step}) differs from the uninterrupted run's"
    );
    let common: Vec<u64> = got
        .keys()
        .filter(|s| want.contains_key(s))
        .copied()
        .collect();
    for s in &common {
        assert_eq!(got[s], want[s], "seed {seed}: step {s} differs");
    }
    eprintln!(
        "chaos Sync seed {seed}: {} checkpoints (steps {:?}..={step}) bit-identical to the \
         uninterrupted run's",
        common.len(),
        common.first()
    );
}
