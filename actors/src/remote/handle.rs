//! How the controller reaches a generator: an actix address in this process, or a rank in
//! another process reached through work orders in the run root (RM-1..5).
//!
//! Invariants:
//! - GH-1: both kinds answer a [`Generate`] with the same `Result<Generated, ActorError>`, so the
//!   controller's accounting (CT-3, CT-6, CT-8) is one code path for both.
//! - GH-2 (RM-5): a remote order unanswered for the timeout is withdrawn and answered
//!   `RankSilent`; the rank is then unavailable until it is heard from: a new record of it under
//!   `ranks/` (a process start, or a live process that found the withdrawal) or an answer.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::Addr;
use futures::future::BoxFuture;
use keel_store::{RunStore, StoreError};

use super::{LifeKeys, OrderResult, Outcome, StoreBoard, WorkOrder, WITHDRAWN_BY};
use crate::error::ActorError;
use crate::generator::{Generate, Generated, Generator, Purpose};
use crate::metrics::TrainMetrics;

/// A generator the controller can give work to (GH-1).
pub trait GeneratorHandle: Send + Sync + 'static {
    /// Samples `msg`; resolves when the batch is stored (train) or sampled (eval).
    fn generate(&self, msg: Generate) -> BoxFuture<'static, Result<Generated, ActorError>>;
    /// Whether it may be given work now (GH-2); a local actor always may.
    fn available(&self) -> bool;
    /// Whether it is alive, for `keel_actor_alive`.
    fn alive(&self) -> bool;
}

impl GeneratorHandle for Addr<Generator> {
    fn generate(&self, msg: Generate) -> BoxFuture<'static, Result<Generated, ActorError>> {
        let addr = self.clone();
        Box::pin(async move {
            addr.send(msg)
                .await
                .map_err(|e| ActorError::Mailbox(e.to_string()))?
        })
    }

    fn available(&self) -> bool {
        true
    }

    fn alive(&self) -> bool {
        self.connected()
    }
}

/// A generator rank in another process, reached through work orders (RM-1..5).
pub struct RemoteGenerator {
    rank: u32,
    keys: LifeKeys,
    store: RunStore,
    io: tokio::runtime::Handle,
    board: Arc<StoreBoard>,
    timeout: Duration,
    poll: Duration,
    metrics: TrainMetrics,
    /// GH-2: set by a timeout, cleared when the rank is heard from again.
    silent: Arc<AtomicBool>,
    /// Process starts of this rank seen so far (a new one ends a silence).
    starts: Arc<Mutex<BTreeSet<String>>>,
    /// When the rank's process starts were last listed.
    last_check: Mutex<Option<Instant>>,
}

impl RemoteGenerator {
    /// Rank `rank` of trainer life `keys.life()`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        rank: u32,
        keys: LifeKeys,
        store: RunStore,
        io: tokio::runtime::Handle,
        board: Arc<StoreBoard>,
        timeout: Duration,
        poll: Duration,
        metrics: TrainMetrics,
    ) -> Self {
        RemoteGenerator {
            rank,
            keys,
            store,
            io,
            board,
            timeout,
            poll,
            metrics,
            silent: Arc::default(),
            starts: Arc::default(),
            last_check: Mutex::new(None),
        }
    }

    /// Writes the order and waits for its result (RM-1, RM-5, RM-6).
    async fn run(self: Arc<Self>, msg: Generate) -> Result<Generated, ActorError> {
        // RM-6: the named weights stay stored until this order is answered or withdrawn.
        let pinned = self.board.pin_for_order(msg.batch_seq).await?;
        let order = WorkOrder::new(
            self.keys.life(),
            self.rank,
            pinned.policy,
            pinned.reference,
            msg.clone(),
        );
        let key = self.keys.order(self.rank, msg.batch_seq);
        let body = serde_json::to_vec_pretty(&order)
            .map_err(|e| ActorError::Internal(format!("work order: {e}")))?;
        match self.store.create_object(&key, body.into()).await {
            // An order of this life with this seq exists: the controller never reissues a seq,
            // so it is this very order (a retried write).
            Ok(()) | Err(StoreError::AlreadyExists { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        let result_key = self.keys.result(msg.batch_seq);
        let started = Instant::now();
        loop {
            match self.store.get_object(&result_key).await {
                Ok(bytes) => return self.heard(&result_key, &bytes, &msg),
                Err(StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            let waited = started.elapsed();
            if waited >= self.timeout {
                return self.withdraw(&msg, waited).await;
            }
            tokio::time::sleep(self.poll).await;
        }
    }

    /// A stored answer of this rank: the rank is heard from (GH-2).
    fn heard(&self, key: &str, bytes: &[u8], msg: &Generate) -> Result<Generated, ActorError> {
        self.silent.store(false, Ordering::SeqCst);
        let result = OrderResult::from_bytes(key, bytes)?;
        self.answer(result, msg)
    }

    /// RM-5: gives the order up by storing its result first. A generator answer stored before
    /// the withdrawal wins the create-only race and is taken instead.
    async fn withdraw(&self, msg: &Generate, waited: Duration) -> Result<Generated, ActorError> {
        // GH-2: the records of the rank known now; only a later one ends the silence (a process
        // start, or a live process saying it found this withdrawal).
        let known = self.rank_starts().await.unwrap_or_default();
        let result_key = self.keys.result(msg.batch_seq);
        let withdrawal =
            OrderResult::new(self.rank, WITHDRAWN_BY, msg.batch_seq, Outcome::Withdrawn);
        let body = serde_json::to_vec_pretty(&withdrawal)
            .map_err(|e| ActorError::Internal(format!("withdrawal: {e}")))?;
        match self.store.create_object(&result_key, body.into()).await {
            Ok(()) => {}
            Err(StoreError::AlreadyExists { .. }) => {
                let bytes = self.store.get_object(&result_key).await?;
                if OrderResult::from_bytes(&result_key, &bytes)?.process != WITHDRAWN_BY {
                    return self.heard(&result_key, &bytes, msg);
                }
            }
            Err(e) => return Err(e.into()),
        }
        if let Ok(mut seen) = self.starts.lock() {
            *seen = known;
        }
        self.silent.store(true, Ordering::SeqCst);
        self.metrics.orders_reissued.inc();
        Err(ActorError::RankSilent {
            rank: self.rank,
            batch_seq: msg.batch_seq,
            waited_s: waited.as_secs_f64(),
        })
    }

    fn answer(&self, result: OrderResult, msg: &Generate) -> Result<Generated, ActorError> {
        if result.weight_load_bytes > 0 {
            self.metrics
                .weights_load_seconds
                .observe(result.weight_load_seconds);
            self.metrics
                .weights_bytes
                .inc_for("load", result.weight_load_bytes);
        }
        if result.weights_prefetched {
            self.metrics.weights_prefetched.inc();
        }
        match result.outcome {
            Outcome::Done(g) => {
                if msg.purpose == Purpose::Train && g.key.is_none() && g.trunk_depth.is_none() {
                    return Err(ActorError::RemoteFailed {
                        rank: self.rank,
                        batch_seq: msg.batch_seq,
                        message: "the result names no stored batch".into(),
                    });
                }
                super::answering(*g, msg).map_err(|message| ActorError::RemoteFailed {
                    rank: self.rank,
                    batch_seq: msg.batch_seq,
                    message,
                })
            }
            Outcome::Panicked(p) => Err(ActorError::GeneratorPanicked(format!(
                "rank {}: {p}",
                self.rank
            ))),
            Outcome::AllEpisodesFailed {
                failed,
                last_failure,
            } => Err(ActorError::AllEpisodesFailed {
                batch_seq: msg.batch_seq,
                failed,
                last_failure,
            }),
            Outcome::Failed(message) => Err(ActorError::RemoteFailed {
                rank: self.rank,
                batch_seq: msg.batch_seq,
                message,
            }),
            Outcome::Void(reason) => Err(ActorError::OrderVoid {
                rank: self.rank,
                batch_seq: msg.batch_seq,
                reason,
            }),
            // Only a trainer withdraws, and a trainer takes its own withdrawal as silence.
            Outcome::Withdrawn => Err(ActorError::OrderVoid {
                rank: self.rank,
                batch_seq: msg.batch_seq,
                reason: "the order was withdrawn".into(),
            }),
        }
    }

    /// The start records of this rank's processes.
    async fn rank_starts(&self) -> Result<BTreeSet<String>, StoreError> {
        list_starts(&self.store, &self.keys.ranks_dir(), self.rank).await
    }

    /// GH-2: a silent rank is heard from again when a new process of it has started.
    fn check_started(&self) {
        if let Ok(mut last) = self.last_check.lock() {
            if last.is_some_and(|t| t.elapsed() < self.poll * 10) {
                return;
            }
            *last = Some(Instant::now());
        }
        let (store, dir, rank) = (self.store.clone(), self.keys.ranks_dir(), self.rank);
        let (silent, starts) = (self.silent.clone(), self.starts.clone());
        self.io.spawn(async move {
            let Ok(mine) = list_starts(&store, &dir, rank).await else {
                return;
            };
            if let Ok(mut seen) = starts.lock() {
                if mine.iter().any(|k| !seen.contains(k)) {
                    silent.store(false, Ordering::SeqCst);
                }
                *seen = mine;
            }
        });
    }
}

async fn list_starts(
    store: &RunStore,
    dir: &str,
    rank: u32,
) -> Result<BTreeSet<String>, StoreError> {
    let prefix = format!("r{rank:04}-");
    Ok(store
        .list_objects(dir)
        .await?
        .into_iter()
        .filter(|k| k.rsplit('/').next().is_some_and(|n| n.starts_with(&prefix)))
        .collect())
}

/// The controller's view of a remote rank: the rank behind an `Arc` so orders can run on the
/// I/O runtime.
#[derive(Clone)]
pub struct RemoteHandle(pub Arc<RemoteGenerator>);

impl GeneratorHandle for RemoteHandle {
    fn generate(&self, msg: Generate) -> BoxFuture<'static, Result<Generated, ActorError>> {
        let remote = self.0.clone();
        let io = remote.io.clone();
        Box::pin(async move {
            io.spawn(remote.run(msg))
                .await
                .map_err(|e| ActorError::Internal(format!("work order task: {e}")))?
        })
    }

    fn available(&self) -> bool {
        if self.0.silent.load(Ordering::SeqCst) {
            self.0.check_started();
            return false;
        }
        true
    }

    fn alive(&self) -> bool {
        !self.0.silent.load(Ordering::SeqCst)
    }
}

/// Handles of ranks `0..n` of the trainer life in `keys`.
pub fn remote_ranks(
    n: usize,
    keys: &LifeKeys,
    store: &RunStore,
    io: &tokio::runtime::Handle,
    board: &Arc<StoreBoard>,
    cfg: &crate::config::DistributedSection,
    metrics: &TrainMetrics,
) -> Vec<Arc<dyn GeneratorHandle>> {
    (0..n as u32)
        .map(|rank| {
            let remote = RemoteGenerator::new(
                rank,
                keys.clone(),
                store.clone(),
                io.clone(),
                board.clone(),
                Duration::from_secs(cfg.order_timeout_s),
                Duration::from_millis(cfg.poll_ms),
                metrics.clone(),
            );
            Arc::new(RemoteHandle(Arc::new(remote))) as Arc<dyn GeneratorHandle>
        })
        .collect()
}
