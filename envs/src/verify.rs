//! Built-in verifiers of a final answer against a ground truth: the rewards of prompt datasets
//! (issue 19's `env.name = "dataset"`, whose rows carry verl's `data_source` and
//! `reward_model.ground_truth`).
//!
//! - `exact`: the answer (the last `\boxed{…}` of the response if there is one, else the whole
//!   response) equals the ground truth after normalisation: trimmed, surrounding `$` removed,
//!   whitespace collapsed, case folded, a trailing period dropped.
//! - `numeric`: the answer number (the last `\boxed{…}` parsed as a number, else the last number
//!   in the response, so gsm8k's `#### 72` works) equals the ground truth's within
//!   `1e-6 · max(1, |truth|)`. Numbers may carry thousands commas (`1,000`), a sign, decimals,
//!   a `$` or `%`, or be fractions `a/b` and `\frac{a}{b}`. A ground truth that is no number
//!   (MATH's `x^2+1`) is compared as `exact`.
//! - `gsm8k`, `math`: verl's scorers of those data sources ([`verl`], VF-3).
//! - `choice`: the option letter (A–J) of the answer equals the ground truth's first letter.
//!   The answer letter is the `\boxed{…}` content's, else the last standalone capital letter
//!   after the last "answer", else the last standalone capital letter A–J of the response.
//!
//! Invariants:
//! - VF-1 A score is exactly 0.0 or 1.0, and never panics, whatever the text (EN-2, EN-5).
//! - VF-2 [`Verifier::for_data_source`] is a pure function of the name: math sources (gsm8k,
//!   MATH, AIME, AMC, NuminaMath, DeepScaleR, DAPO-Math) are `numeric`, multiple-choice sources
//!   (MMLU, GPQA, ARC, CommonsenseQA, HellaSwag, OpenBookQA, RACE, names with `choice`/`mcq`)
//!   are `choice`, every other name is `exact` — except the sources verl's
//!   `default_compute_score` scores with its gsm8k and MATH scorers, which get those (VF-3).
//! - VF-3 `auto` gives verl's verdict where verl has a rule-based scorer keel ports:
//!   `openai/gsm8k` is `gsm8k` (verl's strict `#### N`, compared as a string) and
//!   `lighteval/MATH`, `DigitalLearningGmbH/MATH-lighteval`, `HuggingFaceH4/MATH-500` are `math`
//!   (verl's last `\boxed{}` and hendrycks_math normalisation), both in [`verl`] (VV-1); names
//!   are matched exactly, as verl matches them. Other math sources (verl's `math_dapo`, `aime*`,
//!   `numina_*`) keep keel's `numeric`.
//! - VF-4 [`Verifier::oracle_answer`] of a ground truth is what the oracle writes: the truth
//!   itself, `#### truth` under `gsm8k`, `\boxed{truth}` under `math` (DS-3, DR-4).

use std::fmt;
use std::str::FromStr;

pub mod verl;

/// One built-in way to score a final answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verifier {
    /// Normalised string equality.
    Exact,
    /// Numeric equality (`\boxed{}` or last number), falling back to `Exact` for non-numbers.
    Numeric,
    /// Multiple-choice option letter.
    Choice,
    /// verl's gsm8k scorer, strict `#### N` (VF-3).
    Gsm8k,
    /// verl's MATH scorer: the last `\boxed{}`, hendrycks_math normalisation (VF-3).
    Math,
}

/// The verifier names [`Verifier::from_str`] accepts.
pub const VERIFIER_NAMES: &[&str] = &["exact", "numeric", "choice", "gsm8k", "math"];

/// The data sources verl's `default_compute_score` scores with its gsm8k scorer (VF-3).
pub const VERL_GSM8K_SOURCES: &[&str] = &["openai/gsm8k"];
/// The data sources verl's `default_compute_score` scores with its MATH scorer (VF-3).
pub const VERL_MATH_SOURCES: &[&str] = &[
    "lighteval/MATH",
    "DigitalLearningGmbH/MATH-lighteval",
    "HuggingFaceH4/MATH-500",
];

impl FromStr for Verifier {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        match name {
            "exact" => Ok(Verifier::Exact),
            "numeric" => Ok(Verifier::Numeric),
            "choice" => Ok(Verifier::Choice),
            "gsm8k" => Ok(Verifier::Gsm8k),
            "math" => Ok(Verifier::Math),
            other => Err(format!(
                "unknown verifier `{other}`; expected one of {}",
                VERIFIER_NAMES.join(", ")
            )),
        }
    }
}

impl fmt::Display for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verifier::Exact => "exact",
            Verifier::Numeric => "numeric",
            Verifier::Choice => "choice",
            Verifier::Gsm8k => "gsm8k",
            Verifier::Math => "math",
        })
    }
}

const NUMERIC_SOURCES: &[&str] = &[
    "gsm8k",
    "math",
    "aime",
    "amc",
    "numina",
    "deepscaler",
    "dapo",
];
const CHOICE_SOURCES: &[&str] = &[
    "mmlu",
    "gpqa",
    "arc",
    "commonsense",
    "hellaswag",
    "openbookqa",
    "race",
    "choice",
    "mcq",
];

impl Verifier {
    /// The verifier a row of `data_source` gets when none is configured (VF-2).
    pub fn for_data_source(data_source: &str) -> Verifier {
        if VERL_GSM8K_SOURCES.contains(&data_source) {
            return Verifier::Gsm8k;
        }
        if VERL_MATH_SOURCES.contains(&data_source) {
            return Verifier::Math;
        }
        let name = data_source.to_ascii_lowercase();
        if CHOICE_SOURCES.iter().any(|s| name.contains(s)) {
            Verifier::Choice
        } else if NUMERIC_SOURCES.iter().any(|s| name.contains(s)) {
            Verifier::Numeric
        } else {
            Verifier::Exact
        }
    }

    /// The answer the oracle writes for `ground_truth` (VF-4).
    pub fn oracle_answer(self, ground_truth: &str) -> String {
        match self {
            Verifier::Gsm8k => format!("#### {ground_truth}"),
            Verifier::Math => format!("\\boxed{{{ground_truth}}}"),
            _ => ground_truth.to_string(),
        }
    }

    /// 1.0 when `response` answers `ground_truth`, else 0.0 (VF-1).
    pub fn score(self, response: &str, ground_truth: &str) -> f32 {
        let hit = match self {
            Verifier::Exact => exact(response, ground_truth),
            Verifier::Numeric => match parse_number(answer_text(ground_truth)) {
                Some(truth) => {
                    let answer = match last_boxed(response) {
                        Some(boxed) => parse_number(boxed),
                        None => last_number(response),
                    };
                    answer.is_some_and(|a| (a - truth).abs() <= 1e-6 * truth.abs().max(1.0))
                }
                None => exact(response, ground_truth),
            },
            Verifier::Choice => match choice_letter(answer_text(ground_truth)) {
                Some(truth) => answer_letter(response) == Some(truth),
                None => exact(response, ground_truth),
            },
            Verifier::Gsm8k => {
                verl::gsm8k_score(response, ground_truth, verl::Gsm8kMethod::Strict, 0.0, 1.0)
                    == 1.0
            }
            Verifier::Math => verl::math_score(response, ground_truth) == 1.0,
        };
        if hit {
            1.0
        } else {
            0.0
        }
    }
}

fn exact(response: &str, ground_truth: &str) -> bool {
    normalise(answer_text(response)) == normalise(answer_text(ground_truth))
}

/// The last `\boxed{…}` content of `text`, or `text` itself.
fn answer_text(text: &str) -> &str {
    last_boxed(text).unwrap_or(text)
}

/// The content of the last `\boxed{…}` (or `\fbox{…}`), nested braces matched.
pub fn last_boxed(text: &str) -> Option<&str> {
    let start = ["\\boxed{", "\\fbox{"]
        .iter()
        .filter_map(|m| text.rfind(m).map(|i| i + m.len()))
        .max()?;
    let mut depth = 1usize;
    for (i, c) in text[start..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&text[start..start + i]);
                }
            }
            _ => {}
        }
    }
    None
}

fn normalise(text: &str) -> String {
    let t = text.trim().trim_matches('$').trim();
    let t = t.strip_suffix('.').unwrap_or(t);
    t.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

/// `text` as one number: `1,000`, `-3.5`, `$12`, `45%`, `3/4`, `\frac{3}{4}`, `\dfrac{3}{4}`.
pub fn parse_number(text: &str) -> Option<f64> {
    let t = text.trim().trim_matches('$').trim();
    let t = t.strip_prefix("\\$").unwrap_or(t).trim();
    let t = t
        .strip_suffix("\\%")
        .or_else(|| t.strip_suffix('%'))
        .unwrap_or(t);
    for frac in ["\\frac{", "\\dfrac{", "\\tfrac{"] {
        if let Some(rest) = t.strip_prefix(frac) {
            let (num, rest) = rest.split_once("}{")?;
            let den = rest.strip_suffix('}')?;
            return ratio(parse_number(num)?, parse_number(den)?);
        }
    }
    if let Some((num, den)) = t.split_once('/') {
        return ratio(parse_number(num)?, parse_number(den)?);
    }
    let plain: String = t.chars().filter(|&c| c != ',').collect();
    let (sign, digits) = match plain.strip_prefix('-') {
        Some(rest) => (-1.0, rest),
        None => (1.0, plain.strip_prefix('+').unwrap_or(&plain)),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return None;
    }
    digits
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
        .map(|v| sign * v)
}

fn ratio(num: f64, den: f64) -> Option<f64> {
    (den != 0.0).then(|| num / den)
}

/// The last number written in `text` (sign, thousands commas, decimals, a `a/b` fraction).
pub fn last_number(text: &str) -> Option<f64> {
    let b = text.as_bytes();
    let mut last = None;
    let mut i = 0;
    while i < b.len() {
        if !b[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let negative = i > 0 && b[i - 1] == b'-' && (i < 2 || !b[i - 2].is_ascii_alphanumeric());
        let start = i;
        let mut j = scan_integer(b, i);
        if j + 1 < b.len() && b[j] == b'.' && b[j + 1].is_ascii_digit() {
            j += 1;
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
        }
        if j + 1 < b.len() && b[j] == b'/' && b[j + 1].is_ascii_digit() {
            j = scan_integer(b, j + 1);
        }
        if let Some(v) = parse_number(&text[start..j]) {
            last = Some(if negative { -v } else { v });
        }
        i = j;
    }
    last
}

/// Digits from `i`, with commas that are followed by exactly three digits (thousands).
fn scan_integer(b: &[u8], mut i: usize) -> usize {
    loop {
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let thousands = b.get(i) == Some(&b',')
            && b.len() >= i + 4
            && b[i + 1..i + 4].iter().all(u8::is_ascii_digit)
            && b.get(i + 4).is_none_or(|c| !c.is_ascii_digit());
        if thousands {
            i += 1;
        } else {
            return i;
        }
    }
}

/// An option letter A–J: the text's first character when it stands alone (`B`, `B.`, `(B)`).
fn choice_letter(text: &str) -> Option<char> {
    let t = text.trim().trim_start_matches('(');
    let mut chars = t.chars();
    let c = chars.next()?.to_ascii_uppercase();
    let alone = chars.next().is_none_or(|n| !n.is_alphanumeric());
    (('A'..='J').contains(&c) && alone).then_some(c)
}

fn answer_letter(response: &str) -> Option<char> {
    if let Some(boxed) = last_boxed(response) {
        return choice_letter(boxed);
    }
    let lower = response.to_ascii_lowercase();
    let tail = lower
        .rfind("answer")
        .map(|i| &response[i..])
        .filter(|t| last_standalone_letter(t).is_some());
    last_standalone_letter(tail.unwrap_or(response))
}

/// The last capital A–J with no letter or digit on either side.
fn last_standalone_letter(text: &str) -> Option<char> {
    let chars: Vec<char> = text.chars().collect();
    (0..chars.len()).rev().find_map(|i| {
        let c = chars[i];
        let before = i.checked_sub(1).map(|k| chars[k]);
        let after = chars.get(i + 1).copied();
        let alone = |n: Option<char>| n.is_none_or(|n| !n.is_alphanumeric());
        (('A'..='J').contains(&c) && alone(before) && alone(after)).then_some(c)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vf2_data_sources_choose_their_verifier() {
        for (source, want) in [
            ("openai/gsm8k", Verifier::Gsm8k),
            ("lighteval/MATH", Verifier::Math),
            ("DigitalLearningGmbH/MATH-lighteval", Verifier::Math),
            ("HuggingFaceH4/MATH-500", Verifier::Math),
            // verl matches names exactly: near names keep keel's numeric (VF-3).
            ("gsm8k", Verifier::Numeric),
            ("OpenAI/GSM8K", Verifier::Numeric),
            ("lighteval/math", Verifier::Numeric),
            ("math_dapo", Verifier::Numeric),
            ("aime2024", Verifier::Numeric),
            ("cais/mmlu", Verifier::Choice),
            ("Idavidrein/gpqa", Verifier::Choice),
            ("allenai/ai2_arc", Verifier::Choice),
            ("my-trivia", Verifier::Exact),
            ("", Verifier::Exact),
        ] {
            assert_eq!(Verifier::for_data_source(source), want, "{source}");
        }
        assert_eq!("numeric".parse::<Verifier>(), Ok(Verifier::Numeric));
        assert_eq!(
            "regex".parse::<Verifier>().unwrap_err(),
            "unknown verifier `regex`; expected one of exact, numeric, choice, gsm8k, math"
        );
    }

    #[test]
    fn numeric_reads_boxed_answers_gsm8k_marks_and_the_last_number() {
        let v = Verifier::Numeric;
        for (response, truth, want) in [
            ("so she has 3 + 4 = 7 apples.\n#### 72", "72", 1.0),
            ("The answer is \\boxed{72}.", "72", 1.0),
            ("\\boxed{72} wait, 73", "72", 1.0), // the box wins over a later number
            ("It costs $1,000 in total", "1000", 1.0),
            ("it is -3.50", "-3.5", 1.0),
            ("x = \\boxed{\\frac{3}{4}}", "0.75", 1.0),
            ("3/4 of them", "\\frac{3}{4}", 1.0),
            ("45%", "45", 1.0),
            ("the list 3, 4", "4", 1.0), // `3, 4` is no thousands number
            ("the answer is 71", "72", 0.0),
            ("no number here", "72", 0.0),
            ("\\boxed{seventy}", "72", 0.0),
            ("", "72", 0.0),
            ("1/0", "1", 0.0),
            // A non-numeric truth is compared exactly (MATH's expressions).
            ("so \\boxed{x^2 + 1}", "x^2 + 1", 1.0),
            ("so \\boxed{x^2 + 2}", "x^2 + 1", 0.0),
        ] {
            assert_eq!(v.score(response, truth), want, "{response:?} vs {truth:?}");
        }
    }

    #[test]
    fn vf3_issue_probes_get_verls_verdict_and_numeric_stays_lenient() {
        for (response, gsm8k, numeric) in [
            ("The answer is 3460", 0.0, 1.0),
            ("#### 3460 dollars for 10 laptops", 1.0, 0.0),
            ("#### 3,460", 1.0, 1.0),
            ("\\boxed{3460}", 0.0, 1.0),
        ] {
            assert_eq!(Verifier::Gsm8k.score(response, "3460"), gsm8k, "{response}");
            assert_eq!(
                Verifier::Numeric.score(response, "3460"),
                numeric,
                "{response}"
            );
        }
    }

    #[test]
    fn vf4_the_oracle_answer_passes_its_verifier() {
        let truths = [
            "72",
            "-3.5",
            "B",
            "\\frac{1}{2}",
            "x^2 + 1",
            "(-\\infty, 2]",
        ];
        for (v, passing) in [
            (Verifier::Exact, &truths[..]),
            (Verifier::Math, &truths[..]),
            // verl's gsm8k scorer only reads `#### N` numbers.
            (Verifier::Gsm8k, &truths[..2]),
        ] {
            for truth in truths {
                let oracle = v.oracle_answer(truth);
                let ok = v.score(&oracle, truth) == 1.0;
                assert_eq!(ok, passing.contains(&truth), "{v} {truth:?} as {oracle:?}");
            }
        }
        assert_eq!(Verifier::Gsm8k.oracle_answer("72"), "#### 72");
        assert_eq!(Verifier::Math.oracle_answer("72"), "\\boxed{72}");
    }

    #[test]
    fn exact_normalises_case_space_dollars_and_a_final_period() {
        let v = Verifier::Exact;
        assert_eq!(v.score("  Paris. ", "paris"), 1.0);
        assert_eq!(v.score("The  capital\nis Rome", "the capital is rome"), 1.0);
        assert_eq!(v.score("$\\boxed{Rome}$", "Rome"), 1.0);
        assert_eq!(v.score("Rome, Italy", "Rome"), 0.0);
    }

    #[test]
    fn choice_reads_the_option_letter() {
        let v = Verifier::Choice;
        for (response, truth, want) in [
            ("B", "B", 1.0),
            ("(C)", "C", 1.0),
            ("A cat sat. The answer is (D).", "D", 1.0),
            ("Answer: b", "B", 0.0), // lower case is no option letter
            ("I think \\boxed{E}", "E", 1.0),
            ("Both A and B look fine, but the answer is C", "C", 1.0),
            ("The answer is C", "B", 0.0),
            ("none", "A", 0.0),
            ("ABBA", "A", 0.0),
        ] {
            assert_eq!(v.score(response, truth), want, "{response:?} vs {truth:?}");
        }
        // A ground truth that is no letter falls back to exact.
        assert_eq!(v.score("blue", "Blue"), 1.0);
    }

    #[test]
    fn vf1_scores_are_zero_or_one_on_hostile_text() {
        let long = "9".repeat(400);
        let hostile = [
            "\\boxed{",
            "\\boxed{{{}",
            "}}}}",
            "-",
            "1,",
            "1,00",
            ",123",
            long.as_str(),
            "\u{0}\u{ffff}é漢字 5",
            "\\frac{1}{",
            "\\frac{}{}",
            "/",
            "3/",
        ];
        for text in hostile {
            for v in [
                Verifier::Exact,
                Verifier::Numeric,
                Verifier::Choice,
                Verifier::Gsm8k,
                Verifier::Math,
            ] {
                for truth in ["5", "A", "x", ""] {
                    let s = v.score(text, truth);
                    assert!(s == 0.0 || s == 1.0, "{v} {text:?} {truth:?}: {s}");
                }
            }
        }
        assert_eq!(last_number("1,000,000 and 2,50"), Some(50.0));
        assert_eq!(last_number("t-5"), Some(5.0));
        assert_eq!(last_number("x = -5"), Some(-5.0));
    }
}
