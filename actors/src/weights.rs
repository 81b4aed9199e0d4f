//! The weight board: where the controller publishes each new policy version for generators.
//!
//! Invariants:
//! - WB-1: versions on the board only increase; `publish` of an older version is ignored.
//! - WB-2: a generator reads the board at the start of every batch, so a generator restarted
//!   after a panic picks up the current weights without any message from the controller.
//! - WB-3: only a rewind (collapse guard) moves the board back: `rewind` bumps the board's epoch,
//!   and weights are identified by (epoch, version), so a generator never mistakes a new branch's
//!   version v for the abandoned branch's version v.
//!
//! - WB-4: the reference policy (ARMOR anchor rollouts) is published separately, with the
//!   policy version it was copied at; it changes only on a reference reset.
//! - WB-5 (provenance): published policy weights carry their digest and, from a learner, its
//!   log-probs on the provenance probe; a generator that loads them checks the probe before it
//!   samples (`provenance`), and every turn it samples records the digest.
//!
//! The controller publishes through the [`Board`] trait: in one process that is the shared
//! [`WeightBoard`] itself; with generators in other processes it is `remote::StoreBoard`, which
//! also writes every version under the run root's `weights/` prefix (WT-1..4) for them.

use std::hash::Hasher;
use std::sync::{Arc, RwLock, RwLockWriteGuard};

pub use keel_store::WeightsProbe;

/// The write guard, also after a writer panicked (the board holds plain values, always whole).
fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A copy of the value, also after a writer panicked.
fn read<T: Clone>(lock: &RwLock<T>) -> T {
    lock.read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone()
}

/// One published policy version: its number and its weights as safetensors bytes.
#[derive(Debug, Clone)]
pub struct PublishedWeights {
    /// Policy version (= learner steps taken).
    pub version: u64,
    /// The model's weights, safetensors-encoded.
    pub safetensors: Arc<Vec<u8>>,
    /// Rewinds before these weights (WB-3); set by the board.
    pub epoch: u64,
    /// Dr. MAS: the weights of agent models 1.. (model 0 is `safetensors`); empty = one model.
    pub extra_models: Arc<Vec<Vec<u8>>>,
    /// WB-5: [`weights_digest`] of the models, recorded by every turn sampled with them.
    pub digest: u64,
    /// WB-5: the publisher's provenance probe (WT-6), when it has one.
    pub probe: Option<Arc<WeightsProbe>>,
}

/// xxh3-64 over every model's bytes in model order, each preceded by its length.
pub fn weights_digest<'a>(models: impl IntoIterator<Item = &'a [u8]>) -> u64 {
    let mut h = twox_hash::XxHash3_64::new();
    for m in models {
        h.write(&(m.len() as u64).to_le_bytes());
        h.write(m);
    }
    h.finish()
}

impl PublishedWeights {
    /// Version `version` of model 0 `safetensors` and agent models `extra_models`, with their
    /// digest and, from a learner, its provenance probe.
    pub fn new(
        version: u64,
        safetensors: Vec<u8>,
        extra_models: Vec<Vec<u8>>,
        probe: Option<WeightsProbe>,
    ) -> Self {
        let digest = weights_digest(
            std::iter::once(safetensors.as_slice()).chain(extra_models.iter().map(Vec::as_slice)),
        );
        PublishedWeights {
            version,
            safetensors: Arc::new(safetensors),
            epoch: 0,
            extra_models: Arc::new(extra_models),
            digest,
            probe: probe.map(Arc::new),
        }
    }

    /// One model's weights, without a probe.
    pub fn single(version: u64, safetensors: Vec<u8>) -> Self {
        Self::new(version, safetensors, Vec::new(), None)
    }

    /// The weights of model `k` (0 = the main one).
    pub fn model(&self, k: usize) -> Option<&[u8]> {
        match k {
            0 => Some(self.safetensors.as_slice()),
            _ => self.extra_models.get(k - 1).map(Vec::as_slice),
        }
    }
}

/// The reference policy as published (WB-4).
#[derive(Debug, Clone)]
pub struct PublishedReference {
    /// Policy version the reference was copied at (0 = the RL start).
    pub copied_at: u64,
    /// Publication number, set by the board: a generator reloads when it changes (WB-4).
    pub serial: u64,
    /// Its weights.
    pub safetensors: Arc<Vec<u8>>,
}

/// Where the controller publishes weights (WB-1..4): the in-memory board, or one that also
/// stores every version for generators in other processes.
pub trait Board: Send + Sync + 'static {
    /// Publishes `weights` unless a newer version is already there (WB-1).
    fn publish(&self, weights: PublishedWeights);
    /// Replaces the weights with an older version under a new epoch after a rewind (WB-3).
    fn rewind(&self, weights: PublishedWeights);
    /// Publishes the reference policy (WB-4).
    fn publish_reference(&self, reference: PublishedReference);
    /// The latest published weights, if any.
    fn latest(&self) -> Option<PublishedWeights>;
}

impl Board for WeightBoard {
    fn publish(&self, weights: PublishedWeights) {
        WeightBoard::publish(self, weights)
    }
    fn rewind(&self, weights: PublishedWeights) {
        WeightBoard::rewind(self, weights)
    }
    fn publish_reference(&self, reference: PublishedReference) {
        WeightBoard::publish_reference(self, reference)
    }
    fn latest(&self) -> Option<PublishedWeights> {
        WeightBoard::latest(self)
    }
}

/// The shared board of the latest published weights.
#[derive(Debug, Clone, Default)]
pub struct WeightBoard {
    latest: Arc<RwLock<Option<PublishedWeights>>>,
    reference: Arc<RwLock<Option<PublishedReference>>>,
}

impl WeightBoard {
    /// Publishes `weights` unless a newer version is already there (WB-1).
    pub fn publish(&self, weights: PublishedWeights) {
        let mut guard = write(&self.latest);
        let epoch = guard.as_ref().map_or(0, |w| w.epoch);
        if guard.as_ref().is_none_or(|w| w.version <= weights.version) {
            *guard = Some(PublishedWeights { epoch, ..weights });
        }
    }

    /// Replaces the board's weights with an older version after a rewind (WB-3).
    pub fn rewind(&self, weights: PublishedWeights) {
        let mut guard = write(&self.latest);
        let epoch = guard.as_ref().map_or(0, |w| w.epoch) + 1;
        *guard = Some(PublishedWeights { epoch, ..weights });
    }

    /// Publishes the reference policy (WB-4).
    pub fn publish_reference(&self, reference: PublishedReference) {
        let mut guard = write(&self.reference);
        let serial = guard.as_ref().map_or(0, |r| r.serial + 1);
        *guard = Some(PublishedReference {
            serial,
            ..reference
        });
    }

    /// The reference policy, if one was published.
    pub fn reference(&self) -> Option<PublishedReference> {
        read(&self.reference)
    }

    /// The latest published weights, if any.
    pub fn latest(&self) -> Option<PublishedWeights> {
        read(&self.latest)
    }

    /// Puts exactly `weights` on the board, epoch included (a generator process loading the
    /// version its work order names; the order, not the board, decides what is newest).
    pub fn install(&self, weights: PublishedWeights) {
        *write(&self.latest) = Some(weights);
    }

    /// Puts exactly `reference` on the board, serial included (see [`WeightBoard::install`]).
    pub fn install_reference(&self, reference: PublishedReference) {
        *write(&self.reference) = Some(reference);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_only_increase() {
        let b = WeightBoard::default();
        b.publish(PublishedWeights::single(2, vec![2]));
        b.publish(PublishedWeights::single(1, vec![1]));
        assert_eq!(b.latest().map(|w| w.version), Some(2));
    }

    #[test]
    fn wb3_rewind_moves_back_under_a_new_epoch() {
        let b = WeightBoard::default();
        b.publish(PublishedWeights::single(5, vec![5]));
        b.rewind(PublishedWeights::single(2, vec![2]));
        let w = b.latest().expect("weights");
        assert_eq!((w.version, w.epoch), (2, 1));
        b.publish(PublishedWeights::single(3, vec![3]));
        let w = b.latest().expect("weights");
        assert_eq!(
            (w.version, w.epoch),
            (3, 1),
            "later publishes keep the epoch"
        );
    }
}
