//! The tool calls of agentic dataset rows: `calc A OP B` (the built-in `calc` env's
//! calculator, CAL-2 number spelling) and `search WORDS` (BM25 over the row's documents, the
//! best one returned), and how a final answer's text is taken from a response.
//!
//! Invariants:
//! - TL-1 A response is a tool call exactly when its first word names a tool of its row; a
//!   malformed call is answered `error invalid action` and uses up its turn (EN-2).
//! - TL-2 Observations are made of the words of the row's documents and [`KEYWORDS`] (and
//!   `calc` numbers), so the word-level vocabulary covers them (DS-4, EN-6).

use super::row::{Row, Tool};
use crate::bm25::Bm25;
use crate::calc::{parse_calc_call, MAX_VALUE, MIN_VALUE};

/// The observation of an invalid action.
pub(crate) const INVALID: &str = "error invalid action";
/// The env's own words (TL-2).
pub(crate) const KEYWORDS: &str =
    "answer calc search result error invalid action out of range no results + - *";

/// What a tool call answered.
pub(crate) struct Called {
    pub observation: String,
    pub valid: bool,
}

/// The tool call `action` makes, or `None` when it is the final answer (TL-1).
pub(crate) fn call(row: &Row, action: &str) -> Option<Called> {
    let first = action.split_whitespace().next()?;
    let tool = row.tools.iter().find(|t| t.word() == first)?;
    let answer = |observation: String| Called {
        observation,
        valid: true,
    };
    let invalid = || Called {
        observation: INVALID.into(),
        valid: false,
    };
    Some(match tool {
        Tool::Calculator => match parse_calc_call(action) {
            Some((a, op, b)) => match op
                .apply(a, b)
                .filter(|r| (MIN_VALUE..=MAX_VALUE).contains(r))
            {
                Some(r) => answer(format!("result {r}")),
                None => answer("error out of range".into()),
            },
            None => invalid(),
        },
        Tool::Search => {
            let query: Vec<&str> = action.split_whitespace().skip(1).collect();
            if query.is_empty() {
                return Some(invalid());
            }
            match Bm25::new(&row.documents).top_k(&query, 1).first() {
                Some(&best) => answer(row.documents[best].clone()),
                None => answer("no results".into()),
            }
        }
    })
}

/// The answer a final response gives: the response without a leading `answer` word.
pub(crate) fn answer_text(action: &str) -> &str {
    let trimmed = action.trim_start();
    match trimmed.strip_prefix("answer") {
        Some(rest) if rest.is_empty() || rest.starts_with(char::is_whitespace) => rest.trim(),
        _ => trimmed,
    }
}
