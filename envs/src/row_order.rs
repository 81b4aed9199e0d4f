//! The order in which a dataset env visits its rows: training task `i` is row
//! `perm_e(i mod n)` of epoch `e = i div n`, where `perm_e` is a Fisher-Yates shuffle of the
//! rows seeded by (shuffle seed, epoch); held-out task `i` is row `i mod n`, unshuffled.
//!
//! Because a row is a function of the task index alone, the data frontier that checkpoints
//! already keep for env task ranges (next task, pending ranges; DF-1..3) is the dataset
//! position: a resumed run continues at the exact row, and a crash neither repeats nor skips one.
//!
//! Invariants:
//! - ROW-1 Every epoch visits every row exactly once; epoch `e + 1` is a new pass (a different
//!   permutation unless the dataset has a single row or shuffling is off).
//! - ROW-2 `row(i)` is a pure function of (`i`, row count, shuffle seed, shuffle on/off).

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::split::mix64;

/// Maps training task indices to rows; caches the permutation of the last epoch asked for.
#[derive(Clone, Debug)]
pub struct RowOrder {
    rows: u64,
    seed: u64,
    shuffle: bool,
    cached: Option<(u64, Vec<u32>)>,
}

/// Row counts a dataset may hold (the permutation stores row numbers as `u32`).
pub const MAX_ROWS: u64 = u32::MAX as u64;

impl RowOrder {
    /// The order over `rows` rows (1..=[`MAX_ROWS`]; an empty dataset has no order).
    pub fn new(rows: u64, seed: u64, shuffle: bool) -> Option<Self> {
        (1..=MAX_ROWS).contains(&rows).then_some(RowOrder {
            rows,
            seed,
            shuffle,
            cached: None,
        })
    }

    /// The epoch of training task `index`.
    pub fn epoch(&self, index: u64) -> u64 {
        index / self.rows
    }

    /// The row of training task `index` (ROW-1, ROW-2).
    pub fn row(&mut self, index: u64) -> u64 {
        let (epoch, pos) = (index / self.rows, index % self.rows);
        if !self.shuffle {
            return pos;
        }
        if self.cached.as_ref().is_none_or(|(e, _)| *e != epoch) {
            let mut perm: Vec<u32> = (0..self.rows as u32).collect();
            let mut rng = ChaCha8Rng::seed_from_u64(mix64(self.seed ^ mix64(epoch)));
            perm.shuffle(&mut rng);
            self.cached = Some((epoch, perm));
        }
        self.cached
            .as_ref()
            .and_then(|(_, perm)| perm.get(pos as usize))
            .map_or(pos, |&r| u64::from(r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rw_o1_each_epoch_is_a_new_pass_over_every_row() {
        let mut order = RowOrder::new(10, 7, true).expect("10 rows");
        let epochs: Vec<Vec<u64>> = (0..3)
            .map(|e| (e * 10..e * 10 + 10).map(|i| order.row(i)).collect())
            .collect();
        for rows in &epochs {
            let mut sorted = rows.clone();
            sorted.sort();
            assert_eq!(sorted, (0..10).collect::<Vec<_>>());
        }
        assert_ne!(epochs[0], epochs[1]);
        assert_ne!(epochs[1], epochs[2]);
        assert_eq!(order.epoch(25), 2);
        let mut plain = RowOrder::new(10, 7, false).expect("10 rows");
        assert_eq!(
            (8..13).map(|i| plain.row(i)).collect::<Vec<_>>(),
            [8, 9, 0, 1, 2]
        );
        assert!(RowOrder::new(0, 7, true).is_none());
    }

    #[test]
    fn rw_o2_rows_depend_on_the_index_only_not_on_the_order_of_asking() {
        let mut forward = RowOrder::new(13, 3, true).expect("13 rows");
        let mut backward = RowOrder::new(13, 3, true).expect("13 rows");
        let a: Vec<u64> = (0..40).map(|i| forward.row(i)).collect();
        let mut b: Vec<u64> = (0..40).rev().map(|i| backward.row(i)).collect();
        b.reverse();
        assert_eq!(a, b);
        let mut other_seed = RowOrder::new(13, 4, true).expect("13 rows");
        assert_ne!(a, (0..40).map(|i| other_seed.row(i)).collect::<Vec<_>>());
    }
}
