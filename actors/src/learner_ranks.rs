//! Learner ranks as processes (issue 36): the trainer's learner actor is rank 0 of a c10d group;
//! ranks 1..N-1 are `keel learner --rank R` processes that build the same learner from the
//! trainer's recorded config and then repeat, in order, every call that changes it.
//!
//! Invariants:
//! - LK-1 (one call order): rank 0 broadcasts each state-changing call ([`RankCommand`]) before
//!   making it; a follower makes exactly the broadcast calls, in order, with the same inputs
//!   (batches are read from the store by key, LA-1), so every collective inside them pairs up.
//! - LK-2 (agreed decisions): what only rank 0 can know during a call (a stop request between
//!   SFT steps) is broadcast from rank 0 at the point it is decided.
//! - LK-3 (no orphan ranks): a follower between calls waits without the collective timeout but
//!   ends as soon as rank 0's sockets close; inside a call it is bound by the timeout (CG-1).
//!   Followers started by `keel train` are killed when the trainer's learner goes away.
//! - LK-4 (one job): the rendezvous identity is the config hash, so a rank started with
//!   another config is refused by name (CG-2).
//! - LK-5 (the dead are named): when a ranked run started by `keel train` fails, its error names
//!   every follower that exited and how (status or signal), not only the rank whose collective
//!   noticed; followers write their stdout to the trainer's stderr.
//! - LK-6 (one GPU per rank): on CUDA, rank 0 learns on the run's device and rank R on GPU
//!   `LOCAL_RANK` (as torchrun sets it), else GPU R, and the group adds NCCL on it (CG-4); a
//!   rank whose GPU does not exist, or a build without NCCL, is refused before the rendezvous.

use std::os::fd::AsFd;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_learner::collective::{RankGroup, Rendezvous};
use keel_learner::data_parallel::SharedGroup;
use keel_learner::LearnerError;
use tch::{Kind, Tensor};

use keel_store::{BatchKey, RunStore};

use crate::config::TrainConfig;
use crate::error::ActorError;
use crate::learner_actor::{init_message, LearnerActor, Restore, RunSft, TrainOn};
use crate::process::{Process, StopSignal};
use crate::remote::worker::{config_of, wait_for_life};
use crate::setup::ModelSetup;

/// How long a follower waits for rank 0's next call (LK-3): a day; a dead rank 0 ends the wait
/// at once.
const IDLE_WAIT: Duration = Duration::from_secs(24 * 3600);

/// A state-changing call of the learner actor, as rank 0 broadcasts it (LK-1).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub enum RankCommand {
    /// `RunSft` without its stop signal (LK-2).
    Sft {
        /// The demonstrations.
        demos: Vec<(Vec<u32>, Vec<u8>)>,
        /// First step to take.
        first_step: u64,
        /// Step to stop before.
        end_step: u64,
        /// Demonstrations per step.
        batch_size: usize,
        /// Learning rate.
        lr: f64,
        /// Seed of the order.
        seed: u64,
    },
    /// `TrainOn`: the stored batch's key and the staleness bound.
    TrainOn {
        /// The batch's key.
        key: String,
        /// The staleness bound.
        bound: u64,
    },
    /// `SetLearningRate`.
    SetLr(f64),
    /// `Snapshot` (a collective: the optimizer shards are gathered).
    Snapshot,
    /// `Restore` with the checkpoint's files.
    Restore(Vec<(String, Vec<u8>)>),
    /// `ResetReference`.
    ResetReference,
    /// `LoadReference` with the weights.
    LoadReference(Vec<u8>),
    /// The trainer's learner is done: followers exit 0.
    Stop,
}

/// Where this process's rank meets the others: the config, overridden by a launcher's
/// torchrun-style environment (`MASTER_ADDR`, `MASTER_PORT`, `WORLD_SIZE`); NCCL on `device`
/// when it is a GPU (LK-6).
pub fn rendezvous(
    cfg: &TrainConfig,
    rank: usize,
    device: tch::Device,
) -> Result<Rendezvous, ActorError> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let host = env("MASTER_ADDR").unwrap_or_else(|| cfg.distributed.learner_addr.clone());
    let port = match env("MASTER_PORT") {
        Some(p) => p
            .parse::<u16>()
            .map_err(|_| ActorError::Internal(format!("MASTER_PORT={p:?} is not a port number")))?,
        None => cfg.distributed.learner_port,
    };
    let world = cfg.learner.ranks;
    if let Some(w) = env("WORLD_SIZE") {
        if w.parse::<usize>().ok() != Some(world) {
            return Err(ActorError::Internal(format!(
                "WORLD_SIZE={w} but learner.ranks = {world}: the launcher and the config disagree on the number of learner ranks"
            )));
        }
    }
    Ok(Rendezvous {
        host,
        port,
        rank,
        world,
        timeout: Duration::from_secs(cfg.distributed.collective_timeout_s),
        cuda_device: keel_learner::collective::nccl_device(device),
    })
}

/// Learner ranks run on CPU over Gloo, or on GPUs over NCCL when this build has it (LK-6).
pub fn check_device(device: tch::Device) -> Result<(), ActorError> {
    match device {
        tch::Device::Cpu => Ok(()),
        tch::Device::Cuda(_) if keel_learner::collective::nccl_compiled() => Ok(()),
        other => Err(ActorError::Internal(format!(
            "learner.ranks > 1 on {other:?} needs NCCL, which this keel was built without (a libtorch without CUDA, or without the headers scripts/setup.sh installs): set run.device = \"cpu\" or learner.ranks = 1"
        ))),
    }
}

/// The device of follower rank `rank` on a run whose device is `device` (LK-6): CPU stays CPU;
/// on CUDA, GPU `LOCAL_RANK` when a launcher set it, else GPU `rank`, which must exist.
pub fn follower_device(device: tch::Device, rank: usize) -> Result<tch::Device, ActorError> {
    if device == tch::Device::Cpu {
        return Ok(device);
    }
    let local = match std::env::var("LOCAL_RANK").ok().filter(|v| !v.is_empty()) {
        Some(v) => v
            .parse::<usize>()
            .map_err(|_| ActorError::Internal(format!("LOCAL_RANK={v:?} is not a rank number")))?,
        None => rank,
    };
    let gpus = tch::Cuda::device_count().max(0) as usize;
    if local >= gpus {
        return Err(ActorError::Internal(format!(
            "learner rank {rank} needs GPU {local} (NCCL: one GPU per rank), but this machine has {gpus}: lower learner.ranks or start the rank where its GPU is"
        )));
    }
    Ok(tch::Device::Cuda(local))
}

/// Whether a launcher started the ranks (`WORLD_SIZE` set): then `keel train` starts none.
pub fn launched_externally() -> bool {
    std::env::var("WORLD_SIZE").is_ok_and(|v| !v.is_empty())
}

/// Joins the learner ranks' group as `at.rank`; `config_hash` is the identity every rank must
/// share (LK-4).
pub fn join(at: &Rendezvous, config_hash: &str) -> Result<SharedGroup, ActorError> {
    let identity = format!("config hash {config_hash}");
    let group = RankGroup::join(at, &identity).map_err(LearnerError::from)?;
    Ok(Arc::new(Mutex::new(group)))
}

/// A follower rank: makes rank 0's calls, in order, until it says stop (LK-1). An error of a
/// call that is not a collective's is rank 0's too (same inputs): it is logged and the next call
/// awaited; a collective's error ends the rank.
pub fn follow(actor: &mut LearnerActor) -> Result<(), ActorError> {
    loop {
        let Some(link) = actor.follower_link() else {
            return Err(ActorError::Internal(
                "follow() on a learner that is not a follower rank".into(),
            ));
        };
        let result = match link.receive()? {
            RankCommand::Sft {
                demos,
                first_step,
                end_step,
                batch_size,
                lr,
                seed,
            } => actor
                .run_sft(RunSft {
                    demos: Arc::new(demos),
                    first_step,
                    end_step,
                    batch_size,
                    lr,
                    seed,
                    stop: StopSignal::default(),
                })
                .map(drop),
            RankCommand::TrainOn { key, bound } => actor
                .train_on(TrainOn {
                    key: BatchKey(key),
                    bound,
                })
                .map(drop),
            RankCommand::SetLr(lr) => actor.set_lr(lr),
            RankCommand::Snapshot => actor.snapshot().map(drop),
            RankCommand::Restore(files) => actor.restore(Restore(files)).map(drop),
            RankCommand::ResetReference => actor.reset_reference().map(drop),
            RankCommand::LoadReference(weights) => actor.load_reference(&weights),
            RankCommand::Stop => return Ok(()),
        };
        match result {
            Err(ActorError::Learner(e @ LearnerError::Collective(_))) => return Err(e.into()),
            Err(e) => {
                tracing::warn!(error = %e, "a learner call failed here as on rank 0; awaiting the next")
            }
            Ok(()) => {}
        }
    }
}

/// `keel learner --rank R`: waits for the trainer's life on the run root's branch, builds the
/// learner from its recorded config (or `config`, which must hash the same), joins the ranks
/// and follows rank 0 until it stops (LK-1..4).
pub fn run_learner_rank(
    rank: usize,
    config: Option<TrainConfig>,
    store: RunStore,
    stop: StopSignal,
) -> Result<(), ActorError> {
    if rank == 0 {
        return Err(ActorError::Internal(
            "rank 0 is the trainer (keel train / keel trainer); keel learner serves ranks 1..N-1"
                .into(),
        ));
    }
    let process = Process::start()?;
    let io = process.io();
    let result = (|| {
        let poll = Duration::from_millis(config.as_ref().map_or(100, |c| c.distributed.poll_ms));
        let Some((store, life)) = io.block_on(wait_for_life(&store, &stop, poll))? else {
            return Ok(());
        };
        let cfg = config_of(config, &life)?;
        if rank >= cfg.learner.ranks {
            return Err(ActorError::Internal(format!(
                "--rank {rank} but the trainer's learner.ranks = {}",
                cfg.learner.ranks
            )));
        }
        let device = follower_device(Process::torch(&cfg)?, rank)?;
        check_device(device)?;
        let model = process.run_actors(ModelSetup::prepare(&cfg, &io, device))?;
        let mut actor = LearnerActor::new(store, io.clone());
        actor.init(init_message(&cfg, &model, device)?)?;
        let at = rendezvous(&cfg, rank, device)?;
        tracing::info!(rank, ranks = at.world, host = %at.host, port = at.port, "learner rank: joining rank 0");
        let group = join(&at, &cfg.config_hash())?;
        actor.join_ranks(group)?;
        follow(&mut actor)
    })();
    process.end();
    result
}

/// This process's end of the command stream.
pub struct RankLink {
    group: SharedGroup,
    rank: usize,
}

impl RankLink {
    /// The link of a learner that joined `group`.
    pub fn new(group: SharedGroup) -> Result<Self, ActorError> {
        let rank = lock(&group)?.rank();
        Ok(RankLink { group, rank })
    }

    /// Whether this is rank 0, the one that decides.
    pub fn leads(&self) -> bool {
        self.rank == 0
    }

    /// Rank 0: broadcasts `cmd` to the followers (LK-1).
    pub fn send(&self, cmd: &RankCommand) -> Result<(), ActorError> {
        let bytes = bincode::serialize(cmd)
            .map_err(|e| ActorError::Internal(format!("cannot encode a rank command: {e}")))?;
        let mut group = lock(&self.group)?;
        let mut len = Tensor::from_slice(&[bytes.len() as i64]);
        group.broadcast(&mut len, 0).map_err(LearnerError::from)?;
        let mut body = Tensor::from_slice(&bytes);
        group.broadcast(&mut body, 0).map_err(LearnerError::from)?;
        Ok(())
    }

    /// A follower: waits for rank 0's next call (LK-3).
    pub fn receive(&self) -> Result<RankCommand, ActorError> {
        let mut group = lock(&self.group)?;
        let mut len = Tensor::zeros([1], (Kind::Int64, tch::Device::Cpu));
        group
            .broadcast_within(&mut len, 0, IDLE_WAIT)
            .map_err(LearnerError::from)?;
        let n = len.int64_value(&[0]).max(0) as usize;
        let mut body = Tensor::zeros([n as i64], (Kind::Uint8, tch::Device::Cpu));
        group.broadcast(&mut body, 0).map_err(LearnerError::from)?;
        let mut bytes = vec![0u8; n];
        body.f_copy_data(&mut bytes, n)
            .map_err(LearnerError::from)?;
        bincode::deserialize(&bytes)
            .map_err(|e| ActorError::Internal(format!("cannot decode rank 0's command: {e}")))
    }

    /// Rank 0's `flag`, on every rank (LK-2).
    pub fn agree(&self, flag: bool) -> Result<bool, ActorError> {
        let mut t = Tensor::from_slice(&[u8::from(flag)]);
        lock(&self.group)?
            .broadcast(&mut t, 0)
            .map_err(LearnerError::from)?;
        Ok(t.int64_value(&[0]) != 0)
    }
}

fn lock(group: &SharedGroup) -> Result<std::sync::MutexGuard<'_, RankGroup>, ActorError> {
    group
        .lock()
        .map_err(|_| ActorError::Internal("the learner rank group was poisoned by a panic".into()))
}

/// The `keel learner --rank R` processes of a one-machine run, killed when dropped (LK-3).
pub struct Followers(Vec<Child>);

impl Followers {
    /// Starts ranks 1..N-1 of the run root's branch: this binary, `learner --rank R`.
    pub fn spawn(ranks: usize, run_root: &str, branch: &str) -> Result<Self, ActorError> {
        let exe = std::env::current_exe()
            .map_err(|e| ActorError::Internal(format!("cannot find the keel binary: {e}")))?;
        let mut children = Followers(Vec::new());
        for rank in 1..ranks {
            // A follower's one result line is a log line here: the trainer's stdout is its own.
            let stdout = std::io::stderr()
                .as_fd()
                .try_clone_to_owned()
                .map_or_else(|_| Stdio::null(), Stdio::from);
            let child = Command::new(&exe)
                .args(["learner", "--rank", &rank.to_string()])
                .args(["--run-root", run_root, "--branch", branch])
                .stdin(Stdio::null())
                .stdout(stdout)
                .spawn()
                .map_err(|e| {
                    ActorError::Internal(format!("cannot start learner rank {rank}: {e}"))
                })?;
            children.0.push(child);
        }
        Ok(children)
    }
}

impl Followers {
    /// `error` ended the ranked run: names the followers that exited and how (a dead peer's
    /// collective error names only the rank that saw it, LK-5). A follower whose exit is not
    /// visible yet (its sockets close a moment before it can be reaped) is waited for briefly.
    pub fn blame(&mut self, error: ActorError) -> ActorError {
        let deadline = std::time::Instant::now() + EXIT_VISIBLE;
        let mut exited = vec![None; self.0.len()];
        loop {
            for (child, status) in self.0.iter_mut().zip(exited.iter_mut()) {
                if status.is_none() {
                    *status = child.try_wait().ok().flatten();
                }
            }
            if exited.iter().any(Option::is_some) || std::time::Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let dead: Vec<String> = exited
            .iter()
            .zip(&self.0)
            .enumerate()
            .filter_map(|(i, (status, child))| {
                let status = status.as_ref()?;
                Some(format!(
                    "learner rank {} (pid {}) {}",
                    i + 1,
                    child.id(),
                    how(status)
                ))
            })
            .collect();
        match dead.is_empty() {
            true => error,
            false => ActorError::RankExited {
                ranks: dead.join("; "),
                cause: Box::new(error),
            },
        }
    }
}

/// How long [`Followers::blame`] waits for a dead follower to be reapable.
const EXIT_VISIBLE: Duration = Duration::from_secs(1);

/// A follower's exit, in words: its code, or the signal that killed it.
fn how(status: &std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(sig)) => match nix::sys::signal::Signal::try_from(sig) {
            Ok(name) => format!("was killed by {name} (signal {sig})"),
            Err(_) => format!("was killed by signal {sig}"),
        },
        (None, None) => format!("ended ({status})"),
    }
}

impl Drop for Followers {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// LK-6: CPU ranks stay on the CPU; a CUDA rank whose GPU this machine lacks is refused
    /// with the count, before any rendezvous.
    #[test]
    fn lk6_a_rank_gets_its_own_gpu_or_a_reason() {
        assert_eq!(
            follower_device(tch::Device::Cpu, 3).expect("cpu"),
            tch::Device::Cpu
        );
        let err = follower_device(tch::Device::Cuda(0), 1000)
            .expect_err("GPU 1000 exists nowhere")
            .to_string();
        assert!(
            err.contains("learner rank 1000 needs GPU 1000") && err.contains("this machine has"),
            "{err}"
        );
        assert!(check_device(tch::Device::Cpu).is_ok());
        assert!(
            check_device(tch::Device::Cuda(0)).is_ok(),
            "this build has NCCL, so GPU ranks are allowed"
        );
    }
}
