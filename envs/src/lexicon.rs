//! The procedural lexicon of the built-in environments: invented names, number words and the
//! ordered, duplicate-free word lists their vocabularies are built from.
//!
//! Invariants:
//! - LX-1 Every function here is pure: the same call returns the same words in the same order,
//!   so tokenizer ids built from them are stable (TK-1).
//! - LX-2 Invented names are two syllables, lowercase ASCII, and never an English keyword any
//!   env uses (they are built from a consonant-vowel pattern no keyword has).

use rand::seq::SliceRandom;
use rand::Rng;

const CONSONANTS: [&str; 10] = ["b", "d", "f", "g", "k", "l", "m", "n", "v", "z"];
const VOWELS: [&str; 4] = ["a", "e", "o", "u"];

/// The first `n` invented names, `CVCV` (e.g. `bado`), in a fixed order (at most 1600).
pub fn names(n: usize) -> Vec<String> {
    let syllables: Vec<String> = CONSONANTS
        .iter()
        .flat_map(|c| VOWELS.iter().map(move |v| format!("{c}{v}")))
        .collect();
    let mut out = Vec::with_capacity(n);
    // Interleave first syllables so small pools still vary in both positions.
    'outer: for second in &syllables {
        for first in &syllables {
            if out.len() == n {
                break 'outer;
            }
            out.push(format!("{first}{second}"));
        }
    }
    out
}

/// `k` distinct items of `pool`, in random order.
pub fn pick<T: Clone>(pool: &[T], k: usize, rng: &mut impl Rng) -> Vec<T> {
    pool.choose_multiple(rng, k.min(pool.len()))
        .cloned()
        .collect()
}

/// Decimal words `lo..=hi`.
pub fn numbers(lo: i64, hi: i64) -> Vec<String> {
    (lo..=hi).map(|n| n.to_string()).collect()
}

/// An ordered word list without duplicates (first occurrence wins).
#[derive(Default)]
pub struct WordList {
    words: Vec<String>,
    seen: std::collections::HashSet<String>,
}

impl WordList {
    /// Appends the words not yet present, in order.
    pub fn extend<S: AsRef<str>>(&mut self, words: impl IntoIterator<Item = S>) -> &mut Self {
        for w in words {
            let w = w.as_ref();
            if self.seen.insert(w.to_string()) {
                self.words.push(w.to_string());
            }
        }
        self
    }

    /// Appends the whitespace-separated words of each text.
    pub fn extend_text<S: AsRef<str>>(&mut self, texts: impl IntoIterator<Item = S>) -> &mut Self {
        for t in texts {
            let words: Vec<String> = t.as_ref().split_whitespace().map(str::to_string).collect();
            self.extend(words);
        }
        self
    }

    /// The words.
    pub fn into_vec(self) -> Vec<String> {
        self.words
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lx1_names_are_stable_and_distinct() {
        let a = names(300);
        assert_eq!(a, names(300));
        assert_eq!(&names(10)[..], &a[..10]);
        let set: std::collections::HashSet<_> = a.iter().collect();
        assert_eq!(set.len(), 300);
        assert_eq!(names(5000).len(), 1600);
        assert!(a.iter().all(|n| n.len() == 4));
    }

    #[test]
    fn word_list_dedups_in_order() {
        let mut w = WordList::default();
        w.extend(["a", "b"]).extend_text(["b c  a d"]);
        assert_eq!(w.into_vec(), vec!["a", "b", "c", "d"]);
    }
}
