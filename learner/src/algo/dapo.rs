//! DAPO pieces (spec §1.7, §2.2): group filtering for dynamic sampling with a retry limit,
//! overlong reward shaping, and the invalid-action penalty (§2.2, §8.2).
//!
//! Dynamic sampling: a group is *informative* when its metric values are not all equal
//! (groups of size 1 are kept, as verl does). Across tries, informative groups accumulate until
//! `target` are kept; when `max_tries` is reached first, the deficit is filled with uniform groups
//! in arrival order (SAMPO's fill rule; verl DAPO errors instead). `max_tries = 0` is unlimited.
//! ```text
//! overlong : exceed = len − (L_max − B) ;  reward += min(−exceed/B · f, 0)
//! invalid  : reward −= c · [action invalid]          (per turn-record; c = 0.1 SAMPO)
//! ```
//!
//! Invariants:
//! - DP-1: a group is never split: decisions are per group id.
//! - DP-2: before the last try only informative groups are kept; on the last try the result is
//!   filled to `target` with uniform groups when possible.
//! - DP-3: overlong shaping never raises a reward and is 0 up to `L_max − B` tokens.

use std::collections::{BTreeMap, HashSet};

/// Group ids whose metric values are not all equal, plus singletons (in first-seen order).
pub fn informative_groups(group_ids: &[u64], metric: &[f64]) -> (Vec<u64>, Vec<u64>) {
    let mut order = Vec::new();
    let mut values: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    for (g, m) in group_ids.iter().zip(metric) {
        if !values.contains_key(g) {
            order.push(*g);
        }
        values.entry(*g).or_default().push(*m);
    }
    let (mut informative, mut uniform) = (Vec::new(), Vec::new());
    for g in order {
        let v = &values[&g];
        if v.len() == 1 || v.iter().any(|x| x != &v[0]) {
            informative.push(g);
        } else {
            uniform.push(g);
        }
    }
    (informative, uniform)
}

/// The outcome of offering one more generation batch to the filter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FilterDecision {
    /// Enough groups: train on these (in order).
    Train(Vec<u64>),
    /// Generate another batch.
    NeedMore,
}

/// Dynamic-sampling state across tries (module doc).
#[derive(Clone, Debug, Default)]
pub struct GroupFilter {
    informative: Vec<u64>,
    uniform: Vec<u64>,
    seen: HashSet<u64>,
    tries: usize,
}

impl GroupFilter {
    /// Offers one generation batch; decides with `target` groups wanted and `max_tries`.
    pub fn offer(
        &mut self,
        group_ids: &[u64],
        metric: &[f64],
        target: usize,
        max_tries: usize,
    ) -> FilterDecision {
        self.tries += 1;
        let (inf, uni) = informative_groups(group_ids, metric);
        for g in inf {
            if self.seen.insert(g) {
                self.informative.push(g);
            }
        }
        for g in uni {
            if self.seen.insert(g) {
                self.uniform.push(g);
            }
        }
        if self.informative.len() >= target {
            return FilterDecision::Train(self.informative[..target].to_vec());
        }
        if max_tries > 0 && self.tries >= max_tries {
            let mut out = self.informative.clone();
            out.extend(self.uniform.iter().take(target - out.len()));
            return FilterDecision::Train(out);
        }
        FilterDecision::NeedMore
    }

    /// Tries so far.
    pub fn tries(&self) -> usize {
        self.tries
    }
}

/// Overlong shaping term (DP-3) for a response of `len` tokens.
pub fn overlong_penalty(len: usize, max_len: usize, buffer: usize, factor: f64) -> f64 {
    if buffer == 0 {
        return 0.0;
    }
    let exceed = len as f64 - (max_len as f64 - buffer as f64);
    (-exceed / buffer as f64 * factor).min(0.0)
}

/// The invalid-action penalty of one record: `−c` when invalid.
pub fn invalid_action_penalty(invalid: bool, coef: f64) -> f64 {
    if invalid {
        -coef
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn informative_keeps_varied_groups_and_singletons() {
        let (inf, uni) = informative_groups(&[1, 1, 2, 2, 3], &[1.0, 0.0, 1.0, 1.0, 0.0]);
        assert_eq!((inf, uni), (vec![1, 3], vec![2]));
    }

    #[test]
    fn ds2_retries_then_fill() {
        let mut f = GroupFilter::default();
        assert_eq!(
            f.offer(&[1, 1, 2, 2], &[1.0, 0.0, 1.0, 1.0], 2, 3),
            FilterDecision::NeedMore
        );
        assert_eq!(
            f.offer(&[3, 3, 4, 4], &[0.0, 0.0, 0.0, 0.0], 2, 3),
            FilterDecision::NeedMore
        );
        assert_eq!(
            f.offer(&[5, 5], &[1.0, 1.0], 2, 3),
            FilterDecision::Train(vec![1, 2])
        );
        let mut g = GroupFilter::default();
        assert_eq!(
            g.offer(&[1, 1, 2, 2, 3, 3], &[1.0, 0.0, 1.0, 1.0, 0.0, 1.0], 2, 3),
            FilterDecision::Train(vec![1, 3])
        );
        // Unlimited tries never fill.
        let mut h = GroupFilter::default();
        for _ in 0..5 {
            assert_eq!(
                h.offer(&[9, 9], &[0.0, 0.0], 1, 0),
                FilterDecision::NeedMore
            );
        }
        assert_eq!(h.tries(), 5);
    }

    #[test]
    fn ds3_overlong_shaping() {
        assert_eq!(overlong_penalty(16000, 20480, 4096, 1.0), 0.0);
        assert_eq!(overlong_penalty(16384, 20480, 4096, 1.0), 0.0);
        assert!((overlong_penalty(18432, 20480, 4096, 1.0) + 0.5).abs() < 1e-12);
        assert!((overlong_penalty(20480, 20480, 4096, 1.0) + 1.0).abs() < 1e-12);
        assert_eq!(invalid_action_penalty(true, 0.1), -0.1);
        assert_eq!(invalid_action_penalty(false, 0.1), 0.0);
    }
}
