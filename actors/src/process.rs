//! What every keel process shares, whatever its role: the stop signal its SIGTERM handler sets,
//! the tags that name its life in store keys, the wall clock, and the one bootstrap of its
//! runtimes ([`Process`]): `run_job` (`keel train`, `keel trainer`), `run_generator`
//! (`keel generator`) and `evaluate_weights` all start and end through it.
//!
//! Invariants:
//! - PR-1: a [`StopSignal`] is shared by its clones; once requested it stays requested.
//! - PR-2: a process's [`life_tag`] is its start time in ms and its pid (hex), so two processes
//!   (or two lives of one run root) never share a tag; the writer tags of a trainer life
//!   ([`trainer_writer`]) and of a generator process ([`generator_writer`]) are built from it
//!   and from the life number alone, never from anything a later process may reuse (ST-12).
//! - PR-3: the wall clock ([`since_epoch`]) never fails: a clock set before 1970 reads zero.
//! - PR-4: a [`Process`] ends its actor system before its I/O runtime, and the I/O runtime waits
//!   at most [`IO_SHUTDOWN`] for its tasks, so a hung store call cannot keep a process alive.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::config::TrainConfig;
use crate::error::ActorError;

/// A request to stop after the current update with a checkpoint (SIGTERM), shared by clones
/// (PR-1).
#[derive(Clone, Default, Debug)]
pub struct StopSignal(Arc<AtomicBool>);

impl StopSignal {
    /// Asks the job to stop.
    pub fn request(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether a stop was asked for.
    pub fn requested(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Time since the Unix epoch (zero if the clock is before it, PR-3).
pub fn since_epoch() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_ms() -> u64 {
    since_epoch().as_millis() as u64
}

/// Seconds since the Unix epoch (0.0 if the clock is before it).
pub fn unix_secs() -> f64 {
    since_epoch().as_secs_f64()
}

/// A tag unique to this process: its start time and pid, in hex (PR-2). Method state objects
/// of a life that crashed before a checkpoint named them are never overwritten by the next
/// life, which names its own (MS-4).
pub fn life_tag() -> String {
    format!("{:x}-{:x}", unix_ms(), std::process::id())
}

/// The writer tag of trainer life `life`'s batches (ST-12).
pub fn trainer_writer(life: u64) -> String {
    format!("l{life:010}")
}

/// The writer tag of the batches that generator process `process` (its [`life_tag`]) of rank
/// `rank` writes for trainer life `life` (ST-12).
pub fn generator_writer(life: u64, rank: u32, process: &str) -> String {
    format!("l{life:010}-r{rank:04}-{process}")
}

/// A runtime of its own for the calling thread (current-thread, I/O and timers enabled): the
/// store calls of a command that runs no actors (`keel ckpt`, `keel ckpt export`, `keel env
/// eval --policy <checkpoint>`, the arena's cell stats, a Pushgateway push) or one thread's own
/// async work (the signal thread). The one place such a runtime is built; a command keeps it
/// for all its calls, [`block_on`] is the one-call form.
pub fn current_thread_runtime() -> Result<tokio::runtime::Runtime, ActorError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ActorError::Internal(format!("cannot start a runtime: {e}")))
}

/// Runs `work` to its end on a [`current_thread_runtime`] of its own: one store call of a
/// command that runs no actors (`keel report`, following the guard's rewinds before a job).
pub fn block_on<F: Future>(work: F) -> Result<F::Output, ActorError> {
    Ok(current_thread_runtime()?.block_on(work))
}

/// How long the I/O runtime may take to finish its tasks at the end of a process (PR-4).
pub const IO_SHUTDOWN: Duration = Duration::from_secs(10);

/// The I/O runtime's worker threads: store calls only wait on the network or the disk.
const IO_WORKERS: usize = 2;

/// One keel process's runtimes: the I/O runtime every store call runs on, and the actix
/// system its actors run in ([`Process::run_actors`]).
pub struct Process {
    io_runtime: tokio::runtime::Runtime,
}

impl Process {
    /// Starts the I/O runtime (threads named `keel-io`).
    pub fn start() -> Result<Process, ActorError> {
        let io_runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(IO_WORKERS)
            .thread_name("keel-io")
            .enable_all()
            .build()
            .map_err(|e| ActorError::Internal(format!("cannot start the I/O runtime: {e}")))?;
        Ok(Process { io_runtime })
    }

    /// A handle on the I/O runtime.
    pub fn io(&self) -> tokio::runtime::Handle {
        self.io_runtime.handle().clone()
    }

    /// Sets torch's threads to `run.threads` (0 keeps torch's default) and answers the device
    /// `run.device` names.
    pub fn torch(cfg: &TrainConfig) -> Result<tch::Device, ActorError> {
        if cfg.run.threads > 0 {
            tch::set_num_threads(cfg.run.threads as i32);
        }
        crate::setup::select_device(&cfg.run.device)
    }

    /// Runs `roles` to its end in an actix system of its own, stopped and dropped before this
    /// returns (PR-4). Call it from a thread that runs no other system.
    pub fn run_actors<F: Future>(&self, roles: F) -> F::Output {
        let system = actix::System::new();
        let out = system.block_on(roles);
        actix::System::current().stop();
        drop(system);
        out
    }

    /// Ends the I/O runtime, waiting at most [`IO_SHUTDOWN`] for its tasks (PR-4).
    pub fn end(self) {
        self.io_runtime.shutdown_timeout(IO_SHUTDOWN);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pr1_a_stop_is_seen_by_every_clone() {
        let stop = StopSignal::default();
        let seen = stop.clone();
        assert!(!seen.requested());
        stop.request();
        assert!(seen.requested() && stop.requested());
    }

    #[test]
    fn pr2_writer_tags_name_the_life_rank_and_process() {
        let tag = life_tag();
        let (ms, pid) = tag.split_once('-').expect("<ms>-<pid>");
        assert!(u64::from_str_radix(ms, 16).is_ok_and(|t| t > 0), "{tag}");
        assert_eq!(u32::from_str_radix(pid, 16).ok(), Some(std::process::id()));
        assert_eq!(trainer_writer(7), "l0000000007");
        assert_eq!(generator_writer(7, 1, "ab-c"), "l0000000007-r0001-ab-c");
    }

    #[test]
    fn pr3_the_wall_clock_agrees_with_itself() {
        let (ms, secs) = (unix_ms(), unix_secs());
        assert!(ms > 0 && (secs * 1000.0 - ms as f64).abs() < 60_000.0);
    }

    #[test]
    fn pr4_actors_run_and_io_ends() {
        let process = Process::start().expect("runtime");
        let io = process.io();
        let v = process.run_actors(async move { io.spawn(async { 41 + 1 }).await });
        assert_eq!(v.ok(), Some(42));
        process.end();
        assert_eq!(block_on(async { 7 }).ok(), Some(7));
    }
}
