//! The trainer's weight board when generators run in other processes: the in-memory board plus
//! an uploader that stores every published version under `weights/<life>/` (WT-1..4).
//!
//! Invariants:
//! - SB-1: publishing never blocks the controller: the board takes the version at once and a
//!   background task uploads it; an order waits ([`StoreBoard::ready_policy`]) until weights at
//!   least as new as the board's are stored, and names the newest stored ones (RM-1).
//! - SB-2: versions published faster than they upload are coalesced: only the newest waiting
//!   version is uploaded, so a slow store delays orders but never queues stale weights.
//! - SB-3: after a policy upload, the weights no order can still name are pruned: older epochs,
//!   and versions more than `keep` behind, except those a pending order names: an order pins its
//!   weights from the moment it names them until it is answered or withdrawn (RM-6), since
//!   orders complete out of order and a restarted rank answers late.
//! - SB-4: an upload failure is sticky: every later order fails with it (the run ends with the
//!   store's error, as a failed batch write would).
//! - SB-5: a policy version is stored as a delta against the last full version of its epoch
//!   (WT-5) unless it is the first of the epoch or `FULL_EVERY` versions have passed since the
//!   last full one; pruning never removes a kept delta's base.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use keel_store::{RunStore, StoreError, WeightsId, WeightsPointer};
use tokio::sync::{mpsc, watch};

use crate::error::ActorError;
use crate::metrics::TrainMetrics;
use crate::weights::{Board, PublishedReference, PublishedWeights, WeightBoard};

/// What the uploader has stored so far.
#[derive(Debug, Clone, Default)]
struct Uploaded {
    policy: Option<WeightsId>,
    reference: Option<WeightsId>,
    error: Option<String>,
}

/// A full version is stored at least this often (SB-5): a delta's cost grows with the distance
/// to its base.
const FULL_EVERY: u64 = 16;

enum Upload {
    Policy(PublishedWeights),
    Reference(PublishedReference),
}

/// The weights each pending order names, by batch (SB-3, RM-6).
type Pins = Arc<Mutex<BTreeMap<u64, Vec<WeightsId>>>>;

/// The store-backed board (see the module doc).
pub struct StoreBoard {
    memory: WeightBoard,
    queue: mpsc::UnboundedSender<Upload>,
    uploaded: watch::Receiver<Uploaded>,
    pins: Pins,
}

/// The weights an order names, pinned until this is dropped (SB-3).
pub struct PinnedWeights {
    /// The policy weights.
    pub policy: WeightsId,
    /// The reference, if one was published.
    pub reference: Option<WeightsId>,
    seq: u64,
    pins: Pins,
}

impl Drop for PinnedWeights {
    fn drop(&mut self) {
        if let Ok(mut pins) = self.pins.lock() {
            pins.remove(&self.seq);
        }
    }
}

/// The id of published policy weights.
pub fn policy_id(w: &PublishedWeights) -> WeightsId {
    WeightsId::Policy {
        epoch: w.epoch,
        version: w.version,
    }
}

impl StoreBoard {
    /// A board of trainer life `life` uploading on `io`; keeps `keep` versions behind the newest.
    pub fn start(
        store: RunStore,
        io: &tokio::runtime::Handle,
        life: u64,
        keep: u64,
        metrics: TrainMetrics,
    ) -> Arc<StoreBoard> {
        let (queue, rx) = mpsc::unbounded_channel();
        let (tx, uploaded) = watch::channel(Uploaded::default());
        let pins = Pins::default();
        let pruning = Pruning {
            life,
            keep,
            pins: pins.clone(),
        };
        io.spawn(upload_loop(store, pruning, metrics, rx, tx));
        Arc::new(StoreBoard {
            memory: WeightBoard::default(),
            queue,
            uploaded,
            pins,
        })
    }

    /// Waits until `want` (or something newer) is stored and returns what is stored (SB-1).
    async fn ready(
        &self,
        want: WeightsId,
        pick: fn(&Uploaded) -> Option<WeightsId>,
    ) -> Result<WeightsId, ActorError> {
        let mut rx = self.uploaded.clone();
        loop {
            {
                let now = rx.borrow_and_update();
                if let Some(e) = &now.error {
                    return Err(ActorError::Internal(format!(
                        "publishing weights to the run root failed: {e}"
                    )));
                }
                if let Some(stored) = pick(&now).filter(|s| *s >= want) {
                    return Ok(stored);
                }
            }
            rx.changed()
                .await
                .map_err(|_| ActorError::Internal("the weights uploader stopped".into()))?;
        }
    }

    /// The stored policy weights an order should name: the board's, or newer (SB-1).
    pub async fn ready_policy(&self) -> Result<WeightsId, ActorError> {
        let Some(latest) = self.memory.latest() else {
            return Err(ActorError::Internal("no weights published yet".into()));
        };
        self.ready(policy_id(&latest), |u| u.policy).await
    }

    /// The stored reference an order should name, if a reference was published.
    pub async fn ready_reference(&self) -> Result<Option<WeightsId>, ActorError> {
        let Some(r) = self.memory.reference() else {
            return Ok(None);
        };
        let want = WeightsId::Reference { serial: r.serial };
        self.ready(want, |u| u.reference).await.map(Some)
    }

    /// The stored weights order `seq` names, pinned against pruning while the returned value
    /// lives (SB-3, RM-6). The newest stored version is never pruned, so nothing can go between
    /// naming it and pinning it.
    pub async fn pin_for_order(&self, seq: u64) -> Result<PinnedWeights, ActorError> {
        let policy = self.ready_policy().await?;
        let reference = self.ready_reference().await?;
        let ids = std::iter::once(policy).chain(reference).collect();
        if let Ok(mut pins) = self.pins.lock() {
            pins.insert(seq, ids);
        }
        Ok(PinnedWeights {
            policy,
            reference,
            seq,
            pins: self.pins.clone(),
        })
    }
}

impl Board for StoreBoard {
    fn publish(&self, weights: PublishedWeights) {
        self.memory.publish(weights);
        if let Some(w) = self.memory.latest() {
            let _ = self.queue.send(Upload::Policy(w));
        }
    }

    fn rewind(&self, weights: PublishedWeights) {
        self.memory.rewind(weights);
        if let Some(w) = self.memory.latest() {
            let _ = self.queue.send(Upload::Policy(w));
        }
    }

    fn publish_reference(&self, reference: PublishedReference) {
        self.memory.publish_reference(reference);
        if let Some(r) = self.memory.reference() {
            let _ = self.queue.send(Upload::Reference(r));
        }
    }

    fn latest(&self) -> Option<PublishedWeights> {
        self.memory.latest()
    }
}

/// What the uploader prunes by (SB-3).
struct Pruning {
    life: u64,
    keep: u64,
    pins: Pins,
}

async fn upload_loop(
    store: RunStore,
    pruning: Pruning,
    metrics: TrainMetrics,
    mut rx: mpsc::UnboundedReceiver<Upload>,
    tx: watch::Sender<Uploaded>,
) {
    // SB-5: the last full version stored, as a base for deltas.
    let mut last_full: Option<(WeightsId, Vec<Bytes>)> = None;
    while let Some(first) = rx.recv().await {
        // SB-2: of what is waiting, only the newest policy and reference are worth storing.
        let (mut policy, mut reference) = (None, None);
        let mut next = Some(first);
        while let Some(item) = next.take().or_else(|| rx.try_recv().ok()) {
            match item {
                Upload::Policy(w) => policy = Some(w),
                Upload::Reference(r) => reference = Some(r),
            }
        }
        if let Some(r) = reference {
            let id = WeightsId::Reference { serial: r.serial };
            let models = [Bytes::from(r.safetensors.as_ref().clone())];
            let publish = store.publish_weights(pruning.life, id, r.copied_at, &models, None, None);
            match timed(publish, &metrics).await {
                Ok(_) => tx.send_modify(|u| u.reference = Some(id)),
                Err(e) => return tx.send_modify(|u| u.error = Some(e)),
            }
        }
        if let Some(w) = policy.filter(|w| tx.borrow().policy != Some(policy_id(w))) {
            let id = policy_id(&w);
            let models: Vec<Bytes> = (0..=w.extra_models.len())
                .filter_map(|k| w.model(k).map(|b| Bytes::from(b.to_vec())))
                .collect();
            let base = last_full.as_ref().filter(|(b, _)| delta_base_ok(*b, id));
            let base = base.map(|(b, m)| (*b, m.as_slice()));
            let probe = w.probe.as_deref();
            let publish = store.publish_weights(pruning.life, id, 0, &models, base, probe);
            match timed(publish, &metrics).await {
                Ok(full) => {
                    if full {
                        last_full = Some((id, models));
                    }
                    tx.send_modify(|u| u.policy = Some(id))
                }
                Err(e) => return tx.send_modify(|u| u.error = Some(e)),
            }
            prune(&store, &pruning, id, &tx).await;
        }
    }
}

/// SB-5: whether `id` may be stored as a delta against the full version `base`.
fn delta_base_ok(base: WeightsId, id: WeightsId) -> bool {
    match (base, id) {
        (
            WeightsId::Policy {
                epoch: be,
                version: bv,
            },
            WeightsId::Policy { epoch, version },
        ) => be == epoch && version > bv && version - bv < FULL_EVERY,
        _ => false,
    }
}

/// Stores one set (`publish`, a `RunStore::publish_weights`) and records its cost; answers
/// whether it was stored in full.
async fn timed(
    publish: impl std::future::Future<Output = Result<WeightsPointer, StoreError>>,
    metrics: &TrainMetrics,
) -> Result<bool, String> {
    let started = Instant::now();
    let pointer = publish.await.map_err(|e| e.to_string())?;
    metrics
        .weights_publish_seconds
        .observe(started.elapsed().as_secs_f64());
    metrics.weights_bytes.inc_for("publish", pointer.bytes());
    tracing::debug!(
        id = ?pointer.id,
        bytes = pointer.bytes(),
        delta = pointer.base.is_some(),
        "weights published to the run root"
    );
    Ok(pointer.base.is_none())
}

/// SB-3: weights no order can name any more go; a failed prune only leaves garbage behind.
async fn prune(
    store: &RunStore,
    pruning: &Pruning,
    newest: WeightsId,
    tx: &watch::Sender<Uploaded>,
) {
    let WeightsId::Policy { epoch, version } = newest else {
        return;
    };
    let reference = tx.borrow().reference;
    let keep = pruning.keep;
    let pins = pruning.pins.clone();
    let pinned = move |id: &WeightsId| {
        pins.lock()
            .map(|p| p.values().any(|ids| ids.contains(id)))
            .unwrap_or(true)
    };
    let keep_id = |id: &WeightsId| {
        pinned(id)
            || match *id {
                WeightsId::Policy {
                    epoch: e,
                    version: v,
                } => e == epoch && v + keep >= version,
                r @ WeightsId::Reference { .. } => Some(r) == reference,
            }
    };
    if let Err(e) = store.prune_weights(pruning.life, keep_id).await {
        tracing::warn!(error = %e, "could not prune old weights from the run root");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(version: u64) -> WeightsId {
        WeightsId::Policy { epoch: 0, version }
    }

    /// Publishes `version` (bytes no delta shrinks: every version is stored in full, so no
    /// delta base is kept for its own sake) and waits until the uploader stored it.
    async fn publish(board: &StoreBoard, version: u64) {
        use rand::{RngCore, SeedableRng};
        let mut bytes = vec![0u8; 256];
        rand_chacha::ChaCha8Rng::seed_from_u64(version).fill_bytes(&mut bytes);
        board.publish(PublishedWeights::single(version, bytes));
        board.ready_policy().await.expect("stored");
    }

    /// The stored ids once `gone` was pruned (the prune runs after the upload).
    async fn after_pruning(store: &RunStore, gone: WeightsId) -> Vec<WeightsId> {
        for _ in 0..500 {
            let ids = store.weights_ids(1).await.expect("ids");
            if !ids.contains(&gone) {
                return ids;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("{gone:?} was never pruned");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sb3_an_order_pins_its_weights_until_it_is_answered() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = RunStore::open(&dir.path().to_string_lossy()).expect("store");
        let metrics = TrainMetrics::new("sb3").expect("metrics");
        let io = tokio::runtime::Handle::current();
        let board = StoreBoard::start(store.clone(), &io, 1, 1, metrics);
        publish(&board, 1).await;
        let pinned = board.pin_for_order(7).await.expect("pin");
        assert_eq!(pinned.policy, v(1));
        for version in 2..=6 {
            publish(&board, version).await;
        }
        let ids = after_pruning(&store, v(4)).await;
        assert_eq!(
            ids,
            vec![v(1), v(5), v(6)],
            "the pending order's weights stay"
        );
        drop(pinned); // answered
        publish(&board, 7).await;
        let ids = after_pruning(&store, v(5)).await;
        assert_eq!(ids, vec![v(6), v(7)], "an answered order pins nothing");
    }
}
