//! difflib's `SequenceMatcher(None, a, b).ratio()` (CPython `Lib/difflib.py`), the similarity
//! ARL-Arena's GiGPO uses to group near-identical observations.
//!
//! ```text
//! ratio = 2·M / (|a| + |b|)      (1 when both are empty)
//! M     = total size of the matching blocks: the longest common block of a[alo..ahi] and
//!         b[blo..bhi] (earliest in a, then in b), recursively left and right of it
//! ```
//! Over characters (Python code points), with difflib's defaults: no junk function, and
//! autojunk: when `|b| ≥ 200`, elements occurring more than `|b|/100 + 1` times in `b` are not
//! used to start a match (they may still extend one). The `difflib` crate is not used: it has
//! no autojunk and rounds the ratio to f32, so its groups differ from the reference's.
//!
//! Invariants:
//! - SR-1: equal to CPython's value for every input (test vectors in
//!   `learner/tests/parity/agentic_advantages.json`), including its asymmetry under autojunk.
//! - SR-2: in [0, 1]; 1 for equal sequences shorter than 200 elements.

use std::collections::HashMap;

/// `SequenceMatcher(None, a, b).ratio()` over the characters of `a` and `b` (module doc).
pub fn sequence_ratio(a: &str, b: &str) -> f64 {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let total = a.len() + b.len();
    if total == 0 {
        return 1.0;
    }
    2.0 * Matcher::new(&a, &b).matches() as f64 / total as f64
}

/// The state of one comparison: `b2j` maps each usable element of `b` to its positions.
struct Matcher<'s> {
    a: &'s [char],
    b: &'s [char],
    b2j: HashMap<char, Vec<usize>>,
}

impl<'s> Matcher<'s> {
    fn new(a: &'s [char], b: &'s [char]) -> Self {
        let mut b2j: HashMap<char, Vec<usize>> = HashMap::new();
        for (j, &c) in b.iter().enumerate() {
            b2j.entry(c).or_default().push(j);
        }
        if b.len() >= 200 {
            let most = b.len() / 100 + 1;
            b2j.retain(|_, positions| positions.len() <= most);
        }
        Matcher { a, b, b2j }
    }

    /// `find_longest_match(alo, ahi, blo, bhi)`: (i, j, size).
    fn longest(&self, alo: usize, ahi: usize, blo: usize, bhi: usize) -> (usize, usize, usize) {
        let (mut bi, mut bj, mut size) = (alo, blo, 0);
        let mut run: HashMap<usize, usize> = HashMap::new();
        for i in alo..ahi {
            let mut next: HashMap<usize, usize> = HashMap::new();
            for &j in self.b2j.get(&self.a[i]).map(Vec::as_slice).unwrap_or(&[]) {
                if j < blo {
                    continue;
                }
                if j >= bhi {
                    break;
                }
                let k = j
                    .checked_sub(1)
                    .and_then(|p| run.get(&p))
                    .copied()
                    .unwrap_or(0)
                    + 1;
                next.insert(j, k);
                if k > size {
                    (bi, bj, size) = (i + 1 - k, j + 1 - k, k);
                }
            }
            run = next;
        }
        // No junk function: a match extends over equal elements on both sides, popular or not.
        while bi > alo && bj > blo && self.a[bi - 1] == self.b[bj - 1] {
            (bi, bj, size) = (bi - 1, bj - 1, size + 1);
        }
        while bi + size < ahi && bj + size < bhi && self.a[bi + size] == self.b[bj + size] {
            size += 1;
        }
        (bi, bj, size)
    }

    /// Total size of `get_matching_blocks()`.
    fn matches(&self) -> usize {
        let mut queue = vec![(0, self.a.len(), 0, self.b.len())];
        let mut total = 0;
        while let Some((alo, ahi, blo, bhi)) = queue.pop() {
            let (i, j, k) = self.longest(alo, ahi, blo, bhi);
            if k == 0 {
                continue;
            }
            total += k;
            if alo < i && blo < j {
                queue.push((alo, i, blo, j));
            }
            if i + k < ahi && j + k < bhi {
                queue.push((i + k, ahi, j + k, bhi));
            }
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn difflib_documentation_examples() {
        // difflib's docstring: SequenceMatcher(None, "abcd", "bcde").ratio() == 0.75.
        assert_eq!(sequence_ratio("abcd", "bcde"), 0.75);
        assert_eq!(sequence_ratio("", ""), 1.0);
        assert_eq!(sequence_ratio("abc", ""), 0.0);
        assert_eq!(sequence_ratio("same", "same"), 1.0);
    }

    #[test]
    fn sr1_autojunk_drops_popular_elements_of_long_sequences() {
        // Values from CPython 3.11 difflib.
        let (short_a, short_b) = ("ab".repeat(50), "ba".repeat(50) + "x");
        assert!((sequence_ratio(&short_a, &short_b) - 0.9850746268656716).abs() < 1e-15);
        // At 200+ elements every character of b is popular: no block can start.
        let (long_a, long_b) = ("ab".repeat(100), "ba".repeat(100) + "x");
        assert_eq!(sequence_ratio(&long_a, &long_b), 0.0);
        // A match starting at the front still extends over popular elements.
        let a = "a".repeat(10);
        let b = "a".repeat(100) + &"xyz".repeat(34)[..100];
        assert!((sequence_ratio(&a, &b) - 20.0 / 210.0).abs() < 1e-15);
    }
}
