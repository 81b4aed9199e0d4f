//! A word-level tokenizer over one environment's declared vocabulary.
//!
//! Every environment declares its finite, procedural word list ([`crate::Env::vocabulary`]);
//! [`Tokenizer::from_words`] puts the four special tokens first and the env's words after them,
//! in the env's order (ids are positions): `<pad>`=0, `<bos>`=1, `<eot>`=2 (ends an agent turn),
//! `<agent>`=3 (the agent speaks next), then the words, then the two PATS scaffold marker words
//! [`SCAFFOLD_MARKERS`] (`tip`, `avoid`; see [`crate::scaffold`]) unless the env already declares
//! them. The markers come last so that adding them changed no existing id.
//!
//! For `calc` that gives, unchanged since the walking skeleton:
//! `task calc answer result error invalid action out of range + - *` (ids 4..=16), then
//! every integer from -99 to 999 in increasing order (ids 17..=1115; `n` has id `n + 116`), then
//! `tip` (1116) and `avoid` (1117).
//!
//! Invariants:
//! - TK-1 An env's vocabulary and its order never change: ids are stable across runs and
//!   versions (the `calc` layout above is pinned by a test).
//! - TK-2 `decode(encode(t)) == t` for every text `t` of vocabulary words separated by single
//!   spaces; `encode` splits on any whitespace.
//! - TK-3 `encode` fails with `EnvError::UnknownWord` on the first word outside the vocabulary;
//!   `decode` never fails (ids out of range decode as `<unk>`).
//! - TK-4 (retired: sampled turns are decoded by the runtime's chat codec, CC-3, over the
//!   exported tokenizer of TK-5).
//! - TK-5 The exported Hugging Face tokenizer ([`Tokenizer::hf_tokenizer_json`], see
//!   [`hf_export`]) encodes every text of whitespace-separated vocabulary words to exactly the
//!   ids of `encode`; a word outside the vocabulary (holding no special token) fails there too.

use std::collections::HashMap;

use crate::error::{quote, EnvError};

pub mod hf_export;

const SPECIAL_WORDS: [&str; 4] = ["<pad>", "<bos>", "<eot>", "<agent>"];
/// Marker word that starts a rendered PATS skill entry (`tip go to fridge 1`).
pub const SKILL_MARKER: &str = "tip";
/// Marker word that starts a rendered PATS mistake entry (`avoid open drawer 1`).
pub const MISTAKE_MARKER: &str = "avoid";
/// The scaffold marker words every tokenizer knows, appended after the env's words (TK-1).
pub const SCAFFOLD_MARKERS: [&str; 2] = [SKILL_MARKER, MISTAKE_MARKER];
/// What `decode` writes for an id outside the vocabulary.
const UNKNOWN: &str = "<unk>";

/// Ids of the special tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpecialTokens {
    /// Padding.
    pub pad: u32,
    /// Start of a trajectory.
    pub bos: u32,
    /// End of an agent turn.
    pub eot: u32,
    /// Marks that the agent speaks next.
    pub agent: u32,
}

/// A word-level tokenizer with a fixed vocabulary.
#[derive(Clone, Debug)]
pub struct Tokenizer {
    words: Vec<String>,
    ids: HashMap<String, u32>,
}

impl Tokenizer {
    /// The vocabulary of the `calc` environment (see the module doc).
    pub fn calc() -> Tokenizer {
        Tokenizer::from_words(&crate::calc::vocabulary())
    }

    /// The special tokens followed by `words` in order, then the [`SCAFFOLD_MARKERS`] not among
    /// `words`; a repeated word keeps its first id.
    pub fn from_words(words: &[String]) -> Tokenizer {
        let mut all: Vec<String> = SPECIAL_WORDS.iter().map(|w| w.to_string()).collect();
        let mut ids: HashMap<String, u32> = all
            .iter()
            .enumerate()
            .map(|(i, w)| (w.clone(), i as u32))
            .collect();
        let markers = SCAFFOLD_MARKERS.iter().map(|m| m.to_string());
        for w in words.iter().cloned().chain(markers) {
            if !ids.contains_key(&w) {
                ids.insert(w.clone(), all.len() as u32);
                all.push(w);
            }
        }
        Tokenizer { words: all, ids }
    }

    /// The tokenizer of an environment's declared vocabulary.
    pub fn for_env(env: &dyn crate::Env) -> Tokenizer {
        Tokenizer::from_words(&env.vocabulary())
    }

    /// Number of ids.
    pub fn vocab_size(&self) -> usize {
        self.words.len()
    }

    /// Ids of the special tokens.
    pub fn special(&self) -> SpecialTokens {
        SpecialTokens {
            pad: 0,
            bos: 1,
            eot: 2,
            agent: 3,
        }
    }

    /// Ids of the whitespace-separated words of `text` (TK-3).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, EnvError> {
        text.split_whitespace()
            .map(|w| {
                self.token(w)
                    .ok_or_else(|| EnvError::UnknownWord { word: quote(w) })
            })
            .collect()
    }

    /// Words of `ids` joined by single spaces (TK-3).
    pub fn decode(&self, ids: &[u32]) -> String {
        let words: Vec<&str> = ids.iter().map(|&id| self.word(id)).collect();
        words.join(" ")
    }

    /// The id of one word, if it is in the vocabulary.
    pub fn token(&self, word: &str) -> Option<u32> {
        self.ids.get(word).copied()
    }

    fn word(&self, id: u32) -> &str {
        self.words.get(id as usize).map_or(UNKNOWN, String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tk1_vocabulary_layout_is_fixed() {
        let t = Tokenizer::calc();
        assert_eq!(t.vocab_size(), 4 + 13 + 1099 + 2);
        assert_eq!(
            t.special(),
            SpecialTokens {
                pad: 0,
                bos: 1,
                eot: 2,
                agent: 3
            }
        );
        assert_eq!(t.token("<pad>"), Some(0));
        assert_eq!(t.token("<agent>"), Some(3));
        assert_eq!(t.token("task"), Some(4));
        assert_eq!(t.token("*"), Some(16));
        assert_eq!(t.token("-99"), Some(17));
        assert_eq!(t.token("0"), Some(116));
        assert_eq!(t.token("999"), Some(1115));
        assert_eq!(t.token(SKILL_MARKER), Some(1116));
        assert_eq!(t.token(MISTAKE_MARKER), Some(1117));
        assert_eq!(t.token("1000"), None);
        assert_eq!(t.token("007"), None);
    }

    #[test]
    fn scaffold_markers_come_after_the_env_words_once() {
        let words: Vec<String> = ["go", "avoid", "to"]
            .iter()
            .map(|w| w.to_string())
            .collect();
        let t = Tokenizer::from_words(&words);
        assert_eq!(t.vocab_size(), 4 + 3 + 1);
        assert_eq!(t.token("go"), Some(4));
        assert_eq!(t.token("avoid"), Some(5));
        assert_eq!(t.token("to"), Some(6));
        assert_eq!(t.token("tip"), Some(7));
        assert_eq!(t.decode(&t.encode("tip go to").unwrap()), "tip go to");
    }

    #[test]
    fn tk2_round_trip() {
        let t = Tokenizer::calc();
        for text in [
            "task 3 + 4 * 5 - 2",
            "calc -7 * 9",
            "result -63",
            "error out of range",
            "",
        ] {
            let ids = t.encode(text).unwrap();
            assert_eq!(t.decode(&ids), text);
        }
        let all: Vec<u32> = (0..t.vocab_size() as u32).collect();
        assert_eq!(t.encode(&t.decode(&all)).unwrap(), all);
        assert_eq!(
            t.encode("  calc\t1\n+  2 ").unwrap(),
            t.encode("calc 1 + 2").unwrap()
        );
    }

    #[test]
    fn tk3_unknown_words_and_ids() {
        let t = Tokenizer::calc();
        assert_eq!(
            t.encode("calc 1 / 2"),
            Err(EnvError::UnknownWord { word: "/".into() })
        );
        assert!(matches!(
            t.encode("ünïcode"),
            Err(EnvError::UnknownWord { .. })
        ));
        assert_eq!(t.decode(&[4, 99_999]), "task <unk>");
    }
}
