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
//! In one process the board is shared memory; across processes the same role is played by the
//! `weights/` prefix of the run root (a generator on another machine polls the newest version).

use std::sync::{Arc, RwLock};

/// One published policy version: its number and its weights as safetensors bytes.
#[derive(Debug, Clone)]
pub struct PublishedWeights {
    /// Policy version (= learner steps taken).
    pub version: u64,
    /// The model's weights, safetensors-encoded.
    pub safetensors: Arc<Vec<u8>>,
    /// Rewinds before these weights (WB-3); set by the board.
    pub epoch: u64,
}

/// The shared board of the latest published weights.
#[derive(Debug, Clone, Default)]
pub struct WeightBoard {
    latest: Arc<RwLock<Option<PublishedWeights>>>,
}

impl WeightBoard {
    /// Publishes `weights` unless a newer version is already there (WB-1).
    pub fn publish(&self, weights: PublishedWeights) {
        let mut guard = match self.latest.write() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        let epoch = guard.as_ref().map_or(0, |w| w.epoch);
        if guard.as_ref().is_none_or(|w| w.version <= weights.version) {
            *guard = Some(PublishedWeights { epoch, ..weights });
        }
    }

    /// Replaces the board's weights with an older version after a rewind (WB-3).
    pub fn rewind(&self, weights: PublishedWeights) {
        let mut guard = match self.latest.write() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        let epoch = guard.as_ref().map_or(0, |w| w.epoch) + 1;
        *guard = Some(PublishedWeights { epoch, ..weights });
    }

    /// The latest published weights, if any.
    pub fn latest(&self) -> Option<PublishedWeights> {
        match self.latest.read() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_only_increase() {
        let b = WeightBoard::default();
        b.publish(PublishedWeights {
            version: 2,
            safetensors: Arc::new(vec![2]),
            epoch: 0,
        });
        b.publish(PublishedWeights {
            version: 1,
            safetensors: Arc::new(vec![1]),
            epoch: 0,
        });
        assert_eq!(b.latest().map(|w| w.version), Some(2));
    }

    #[test]
    fn wb3_rewind_moves_back_under_a_new_epoch() {
        let b = WeightBoard::default();
        b.publish(PublishedWeights {
            version: 5,
            safetensors: Arc::new(vec![5]),
            epoch: 0,
        });
        b.rewind(PublishedWeights {
            version: 2,
            safetensors: Arc::new(vec![2]),
            epoch: 0,
        });
        let w = b.latest().expect("weights");
        assert_eq!((w.version, w.epoch), (2, 1));
        b.publish(PublishedWeights {
            version: 3,
            safetensors: Arc::new(vec![3]),
            epoch: 0,
        });
        let w = b.latest().expect("weights");
        assert_eq!(
            (w.version, w.epoch),
            (3, 1),
            "later publishes keep the epoch"
        );
    }
}
