//! The visible text of a sampled response: what keel's built-in envs and verifiers read.
//!
//! The chat codec hands an env the raw decoded response of a turn (special tokens dropped, not
//! trimmed, reasoning included: exactly the `solution_str` verl's reward functions receive).
//! [`Env::step_response`](crate::env::Env::step_response) passes it whole to whoever scores it
//! verl's way (a reward service) and [`visible`] of it to everything else.
//!
//! Invariants:
//! - AX-1 [`visible`] drops a leading reasoning block — everything up to and including the
//!   last `</think>` when the text contains one — and then surrounding whitespace; a text
//!   without `</think>` is only trimmed. It never panics and returns a slice of its input.

/// The closing tag of a reasoning block.
pub const THINK_END: &str = "</think>";

/// The visible part of a raw response (AX-1).
pub fn visible(response: &str) -> &str {
    let after = match response.rfind(THINK_END) {
        Some(i) => &response[i + THINK_END.len()..],
        None => response,
    };
    after.trim()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ax1_reasoning_is_dropped_and_the_rest_trimmed() {
        for (raw, want) in [
            ("  answer 72\n", "answer 72"),
            ("<think>6 * 12 = 72</think>\n\n#### 72 ", "#### 72"),
            ("<think>a</think> b </think> c", "c"),
            ("no opening tag</think>42", "42"),
            ("<think>never closed 42", "<think>never closed 42"),
            ("</think>", ""),
            ("", ""),
            ("é漢</think>字 ", "字"),
        ] {
            assert_eq!(visible(raw), want, "{raw:?}");
        }
    }
}
