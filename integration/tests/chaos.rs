//! The chaos harness (issue 32): a multi-process run (`keel trainer` + `keel generator --rank 0/1`,
//! async, on a SeaweedFS server of the test's own) under a seeded schedule of single faults:
//!
//! - SIGTERM of the trainer during SFT (always the first fault; it resumes SFT, SF-1) and
//!   during RL, then a restart;
//! - SIGKILL of the trainer or of a generator, restarted, or a generator left down until the
//!   next fault (the other rank carries the run);
//! - SIGSTOP of a generator past the order timeout (its order is withdrawn; it is heard from
//!   again, RM-5) or of the trainer, then SIGCONT;
//! - a storage stall (the server SIGSTOPped past the order timeout) and a storage restart;
//! - a collapse-guard rewind (a NaN fault in the config) that every later trainer life and both
//!   generators follow (RM-8).
//!
//! Every fault fires once the run made progress since the previous one (a newer checkpoint on
//! the branch the run trains), never on a clock; the store's accounting is checked after each
//! (every task range trained at most once, trained + pending = handed out). The last life then
//! finishes the run and the books are checked again: nothing lost, nothing trained twice (the
//! learner refuses any turn past the staleness bound, LA-2). `KEEL_CHAOS=N` runs N faults (CI:
//! 8), `KEEL_CHAOS_SEED` replays a schedule; the counts of each kind survived are printed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use keel_integration::roles::{config, signal, Roles, NO_PROGRESS};
use keel_integration::{check_accounting, test_rt, MethodRun, OwnSeaweed};
use keel_store::RunStore;
use rand::{Rng, SeedableRng};

const TASKS_PER_BATCH: u64 = 6; // MethodRun's rollout.tasks_per_batch
const ORDER_TIMEOUT_S: u64 = 4;

/// One single fault.
#[derive(Debug, Clone, Copy)]
enum Fault {
    TermTrainerInSft,
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
        match rng.gen_range(0..8) {
            0 => Fault::TermTrainer,
            1 => Fault::KillTrainer,
            2 => Fault::StopTrainer,
            3 => Fault::KillGenerator(rank),
            4 => Fault::DropGenerator(rank),
            5 => Fault::StopGenerator(rank),
            6 => Fault::StallStorage,
            _ => Fault::RestartStorage,
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Fault::TermTrainerInSft => "SIGTERM trainer during SFT",
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

/// The run under chaos: its roles, its server and where it stands.
struct Chaos {
    roles: Roles,
    server: OwnSeaweed,
    store: RunStore,
    rt: tokio::runtime::Runtime,
    /// A generator left down by the previous fault.
    down: Option<u32>,
}

impl Chaos {
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
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn trainer_pid(&self) -> String {
        self.roles
            .trainer
            .as_ref()
            .expect("a trainer")
            .id()
            .to_string()
    }

    /// SIGTERM: the trainer commits a checkpoint and exits 0; then a new life starts.
    fn term_trainer(&mut self) {
        signal(&self.trainer_pid(), "-TERM");
        let status = self
            .roles
            .trainer
            .as_mut()
            .expect("trainer")
            .wait()
            .expect("wait");
        assert!(
            status.success(),
            "SIGTERM must end in exit 0, got {status}:\n{}",
            self.roles.logs()
        );
        self.roles.trainer = None;
        self.roles.start_trainer();
    }

    fn inject(&mut self, fault: Fault) {
        let stall = Duration::from_secs(ORDER_TIMEOUT_S + 2);
        match fault {
            Fault::TermTrainerInSft | Fault::TermTrainer => self.term_trainer(),
            Fault::KillTrainer => {
                self.roles.kill_trainer();
                self.roles.start_trainer();
            }
            Fault::StopTrainer => {
                let pid = self.trainer_pid();
                signal(&pid, "-STOP");
                std::thread::sleep(stall);
                signal(&pid, "-CONT");
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
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The run's config: async GRPO with two ranks, SFT checkpointed, a NaN fault the guard rewinds.
fn chaos_config(dir: &std::path::Path, name: &str, steps: u64) -> std::path::PathBuf {
    let run = MethodRun {
        steps,
        checkpoint_every: 2,
        mode: "async",
        bound: 2,
        guard: true,
        latency_ms: 5.0,
        extra: "[faults]\nnan_loss_at_step = 7\nnan_loss_count = 3\n".into(),
        ..MethodRun::new("grpo")
    };
    let path = config(dir, name, &run, ORDER_TIMEOUT_S);
    let toml = std::fs::read_to_string(&path)
        .expect("config")
        .replace("[sft]\n", "[sft]\ncheckpoint_every = 20\n")
        .replace("[metrics]\n", "[guard]\nmax_rewinds = 20\n\n[metrics]\n");
    std::fs::write(&path, toml).expect("config");
    path
}

#[test]
fn a_multi_process_run_survives_a_seeded_schedule_of_single_faults() {
    let faults = env_u64("KEEL_CHAOS").unwrap_or(8) as usize;
    let seed = env_u64("KEEL_CHAOS_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let schedule: Vec<Fault> = std::iter::once(Fault::TermTrainerInSft)
        .chain((1..faults).map(|_| Fault::draw(&mut rng)))
        .collect();
    eprintln!("chaos seed {seed} (replay: KEEL_CHAOS_SEED={seed}): {schedule:?}");
    let server = OwnSeaweed::start();
    std::env::set_var("AWS_ENDPOINT_URL", &server.endpoint);
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = chaos_config(dir.path(), "chaos", 1_000_000);
    let root = keel_integration::s3_root("chaos");
    let mut chaos = Chaos {
        roles: Roles::new(dir.path(), cfg, &root),
        store: RunStore::open(&root).expect("open"),
        server,
        rt: test_rt(),
        down: None,
    };
    chaos.roles.start_all();
    let mut survived: BTreeMap<&str, usize> = BTreeMap::new();
    for (n, fault) in schedule.iter().enumerate() {
        let context = format!("fault {n} ({fault:?}, seed {seed})");
        let (_, step) = chaos.head();
        // The first fault hits SFT: it fires once SFT committed its first checkpoint.
        let first = matches!(fault, Fault::TermTrainerInSft);
        chaos.wait_for_progress(step, first, &context);
        if let Some(r) = chaos.down.take() {
            chaos.roles.start_generator(r);
        }
        chaos.inject(*fault);
        let (store, _) = chaos.head();
        check_accounting(&chaos.rt, &store, TASKS_PER_BATCH, &context);
        *survived.entry(fault.kind()).or_default() += 1;
    }
    finish(&mut chaos, dir.path(), seed);
    let (store, step) = chaos.head();
    eprintln!(
        "chaos seed {seed}: {} faults survived: {survived:?}; finished at step {step} on branch {}",
        schedule.len(),
        store.branch()
    );
}

/// The last life trains a few steps past the head and every role exits 0; the books balance.
fn finish(chaos: &mut Chaos, dir: &std::path::Path, seed: u64) {
    chaos.roles.kill_trainer();
    let (store, step) = chaos.head();
    check_accounting(&chaos.rt, &store, TASKS_PER_BATCH, "before the last life")
        .expect("the run reached a checkpoint");
    // A new config (steps): every role takes it.
    for r in 0..2 {
        chaos.roles.kill_generator(r);
    }
    chaos.roles.cfg = chaos_config(dir, "finish", step + 4);
    // GW-1: generators given the new config must find the life that trains under it.
    let lives = |c: &Chaos| {
        let (store, _) = c.head();
        c.rt.block_on(store.lives()).map_or(0, |l| l.len())
    };
    let before = lives(chaos);
    chaos.roles.start_trainer();
    let since = Instant::now();
    while lives(chaos) == before {
        assert!(
            since.elapsed() < NO_PROGRESS,
            "the last trainer claimed no life"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    chaos.roles.start_generator(0);
    chaos.roles.start_generator(1);
    chaos
        .roles
        .finish_ok_with(|| chaos_head_step(&chaos.rt, &chaos.store));
    let (store, _) = chaos.head();
    let (end, _) =
        check_accounting(&chaos.rt, &store, TASKS_PER_BATCH, "at the end").expect("a checkpoint");
    assert_eq!(end.step, step + 4, "seed {seed}");
}

fn chaos_head_step(rt: &tokio::runtime::Runtime, store: &RunStore) -> String {
    let branch = rt
        .block_on(keel_actors::guard::follow_rewinds(store, "main"))
        .unwrap_or_else(|_| "main".into());
    let on = store.on_branch(&branch).expect("branch");
    rt.block_on(on.latest_checkpoint())
        .ok()
        .flatten()
        .map_or_else(String::new, |m| m.id)
}
