//! Word-level text helpers: normalisation, word-Jaccard, the vocabulary check.

use std::collections::BTreeSet;

use crate::tokenizer::Tokenizer;

/// `text` with runs of whitespace collapsed to single spaces and no leading/trailing space.
pub fn normalise(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Jaccard similarity of the word sets of `a` and `b` (1 when both are empty).
pub fn word_jaccard(a: &str, b: &str) -> f64 {
    let a: BTreeSet<&str> = a.split_whitespace().collect();
    let b: BTreeSet<&str> = b.split_whitespace().collect();
    let union = a.union(&b).count();
    if union == 0 {
        return 1.0;
    }
    a.intersection(&b).count() as f64 / union as f64
}

/// The first word of `text` the tokenizer cannot encode as an ordinary word (unknown, or one of
/// the special tokens such as `<eot>`), if any.
pub fn unknown_word<'t>(text: &'t str, vocab: &Tokenizer) -> Option<&'t str> {
    let s = vocab.special();
    let special = [s.pad, s.bos, s.eot, s.agent];
    text.split_whitespace()
        .find(|w| vocab.token(w).is_none_or(|id| special.contains(&id)))
}

/// Number of words of `text`.
pub fn word_count(text: &str) -> usize {
    text.split_whitespace().count()
}
