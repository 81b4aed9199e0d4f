//! verl's rule-based scorers, ported rule for rule so that `verifier = "auto"` gives verl's
//! verdict on the data sources verl's `default_compute_score` scores with them:
//!
//! - `openai/gsm8k` → [`gsm8k_score`] (verl's `reward_score/gsm8k.py`, `method = "strict"`,
//!   `format_score = 0`, `score = 1`): the response is clipped to its last 300 characters; the
//!   strict method takes the last `#### N` (exactly one space, `N` a run of digits, `.` and `,`
//!   with an optional leading `-`) and drops its commas, the flexible one takes the last such
//!   run anywhere that is not `.`; the answer must equal the ground truth *as a string*
//!   (`score`), a wrong one earns `format_score`, none earns 0.
//! - `lighteval/MATH`, `DigitalLearningGmbH/MATH-lighteval`, `HuggingFaceH4/MATH-500` →
//!   [`math_score`] (verl's `reward_score/math_reward.py`, from lm-evaluation-harness'
//!   hendrycks_math): the last `\boxed{…}` (or `\boxed …` up to a `$`) is compared with the
//!   ground truth after [`strip_string`]; a string whose stripping raises in verl is compared
//!   unstripped, a box verl's `remove_boxed` rejects (`\fbox{…}`) scores 0.
//!
//! Invariants:
//! - VV-1 On the same strings, [`gsm8k_score`], [`math_score`] and [`strip_string`] return what
//!   verl's functions return (`None` where verl raises); `envs/tests/data/verl_reward_vectors.json`,
//!   written by running verl (`make_verl_reward_vectors.py`), is checked vector by vector.
//! - VV-2 Lengths and indices are counted in characters (Python's `str`), never bytes, and no
//!   input panics.

/// verl's gsm8k `_SOLUTION_CLIP_CHARS`.
const CLIP_CHARS: usize = 300;

/// How [`gsm8k_score`] finds the answer (verl's `method`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gsm8kMethod {
    /// The last `#### N`.
    Strict,
    /// The last number-like run that is not `.`.
    Flexible,
}

/// verl's `gsm8k.compute_score(solution_str, ground_truth, method, format_score, score)`.
pub fn gsm8k_score(
    solution: &str,
    ground_truth: &str,
    method: Gsm8kMethod,
    format_score: f32,
    score: f32,
) -> f32 {
    match gsm8k_extract(solution, method) {
        None => 0.0,
        Some(answer) if answer == ground_truth => score,
        Some(_) => format_score,
    }
}

/// verl's `gsm8k.extract_solution`.
pub fn gsm8k_extract(solution: &str, method: Gsm8kMethod) -> Option<String> {
    let clipped = last_chars(solution, CLIP_CHARS);
    match method {
        Gsm8kMethod::Strict => number_runs(clipped, true)
            .last()
            .map(|a| a.replace([',', '$'], "")),
        Gsm8kMethod::Flexible => {
            let runs = number_runs(clipped, false);
            // Python's `for … in reversed(runs): if valid: break` leaves the first run when
            // none is valid.
            runs.iter()
                .rev()
                .find(|a| !["", "."].contains(a))
                .or_else(|| runs.first())
                .map(|a| a.to_string())
        }
    }
}

/// The last `n` characters of `text` (Python's `text[-n:]` when longer).
fn last_chars(text: &str, n: usize) -> &str {
    let count = text.chars().count();
    if count <= n {
        return text;
    }
    match text.char_indices().nth(count - n) {
        Some((i, _)) => &text[i..],
        None => text,
    }
}

/// `re.findall("#### (\-?[0-9\.\,]+)")` (`marked`) or `re.findall("(\-?[0-9\.\,]+)")`: the
/// captured runs, left to right, non-overlapping.
fn number_runs(text: &str, marked: bool) -> Vec<&str> {
    let b = text.as_bytes();
    let in_set = |c: u8| c.is_ascii_digit() || c == b'.' || c == b',';
    let mut runs = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let start = if marked {
            if !b[i..].starts_with(b"#### ") {
                i += 1;
                continue;
            }
            i + 5
        } else {
            i
        };
        let mut j = start;
        if b.get(j) == Some(&b'-') && b.get(j + 1).copied().is_some_and(in_set) {
            j += 1;
        }
        let digits = j;
        while j < b.len() && in_set(b[j]) {
            j += 1;
        }
        if j == digits {
            i += 1;
            continue;
        }
        // Only ASCII bytes were matched, so `start..j` are char boundaries.
        runs.push(&text[start..j]);
        i = j;
    }
    runs
}

/// verl's `math_reward.compute_score(solution_str, ground_truth)`: 1.0 or 0.0.
pub fn math_score(solution: &str, ground_truth: &str) -> f32 {
    let hit = last_boxed_only_string(solution)
        .and_then(|boxed| remove_boxed(&boxed))
        .is_some_and(|answer| is_equiv(&answer, ground_truth));
    if hit {
        1.0
    } else {
        0.0
    }
}

/// verl's `is_equiv`: equal after [`strip_string`], or equal as given when stripping either
/// raises.
pub fn is_equiv(a: &str, b: &str) -> bool {
    match (strip_string(a), strip_string(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// verl's `last_boxed_only_string`: the last `\boxed{…}` (braces matched) or `\fbox{…}`, or
/// `\boxed ` and what follows the last one up to a `$`.
pub fn last_boxed_only_string(text: &str) -> Option<String> {
    if let Some(i) = text.rfind("\\boxed ") {
        let tail = &text[i + "\\boxed ".len()..];
        let tail = tail.split('$').next().unwrap_or(tail);
        return Some(format!("\\boxed {tail}"));
    }
    let idx = text.rfind("\\boxed").or_else(|| text.rfind("\\fbox"))?;
    let mut open: i64 = 0;
    for (k, c) in text[idx..].char_indices() {
        match c {
            '{' => open += 1,
            '}' => {
                open -= 1;
                if open == 0 {
                    return Some(text[idx..=idx + k].to_string());
                }
            }
            _ => {}
        }
    }
    None
}

/// verl's `remove_boxed`; `None` where its assertions fail.
pub fn remove_boxed(s: &str) -> Option<String> {
    if s.contains("\\boxed ") {
        return s.strip_prefix("\\boxed ").map(str::to_string);
    }
    s.strip_prefix("\\boxed{")
        .and_then(|rest| rest.strip_suffix('}'))
        .map(str::to_string)
}

/// verl's `strip_string` (hendrycks_math's normalisation); `None` where verl raises.
pub fn strip_string(text: &str) -> Option<String> {
    let mut s = text.replace('\n', "").replace("\\!", "");
    s = s.replace("\\\\", "\\");
    s = s.replace("tfrac", "frac").replace("dfrac", "frac");
    s = s.replace("\\left", "").replace("\\right", "");
    s = s.replace("^{\\circ}", "").replace("^\\circ", "");
    s = s.replace("\\$", "");
    s = remove_right_units(&s)?;
    s = s.replace("\\\\%", "").replace("\\%", "");
    s = s.replace(" .", " 0.").replace("{.", "{0.");
    if s.is_empty() {
        return Some(s);
    }
    if s.starts_with('.') {
        s.insert(0, '0');
    }
    let parts: Vec<&str> = s.split('=').collect();
    if parts.len() == 2 && parts[0].chars().count() <= 2 {
        s = parts[1].to_string();
    }
    s = fix_sqrt(&s)?;
    s = s.replace(' ', "");
    s = fix_fracs(&s)?;
    if s == "0.5" {
        s = "\\frac{1}{2}".into();
    }
    Some(fix_a_slash_b(&s))
}

/// `5 \text{ cm}` → `5 `; `None` for two or more `\text{ ` (verl's assertion).
fn remove_right_units(s: &str) -> Option<String> {
    let parts: Vec<&str> = s.split("\\text{ ").collect();
    match parts.len() {
        1 => Some(s.to_string()),
        2 => Some(parts[0].to_string()),
        _ => None,
    }
}

/// `\sqrt3` → `\sqrt{3}`; `None` when `\sqrt` ends the text (verl's IndexError).
fn fix_sqrt(s: &str) -> Option<String> {
    if !s.contains("\\sqrt") {
        return Some(s.to_string());
    }
    let mut parts = s.split("\\sqrt");
    let mut out = parts.next().unwrap_or_default().to_string();
    for part in parts {
        let mut chars = part.chars();
        match chars.next()? {
            '{' => {
                out.push_str("\\sqrt");
                out.push_str(part);
            }
            a => {
                out.push_str(&format!("\\sqrt{{{a}}}"));
                out.push_str(chars.as_str());
            }
        }
    }
    Some(out)
}

/// `\frac12` → `\frac{1}{2}`, `\frac1b` → `\frac{1}{b}`; the text unchanged when a `\frac`
/// is followed by one character only, `None` when by none (verl's IndexError).
fn fix_fracs(s: &str) -> Option<String> {
    let mut parts = s.split("\\frac");
    let mut out = parts.next().unwrap_or_default().to_string();
    for part in parts {
        out.push_str("\\frac");
        let chars: Vec<char> = part.chars().collect();
        let first = *chars.first()?;
        if first == '{' {
            out.push_str(part);
            continue;
        }
        let Some(&second) = chars.get(1) else {
            return Some(s.to_string());
        };
        let rest: String = chars[2..].iter().collect();
        if second == '{' {
            out.push_str(&format!("{{{first}}}{second}{rest}"));
        } else {
            out.push_str(&format!("{{{first}}}{{{second}}}{rest}"));
        }
    }
    Some(out)
}

/// `3/4` → `\frac{3}{4}` when both sides are integers written as Python's `int` prints them.
fn fix_a_slash_b(s: &str) -> String {
    let parts: Vec<&str> = s.split('/').collect();
    match parts[..] {
        [a, b] if canonical_int(a) && canonical_int(b) => format!("\\frac{{{a}}}{{{b}}}"),
        _ => s.to_string(),
    }
}

/// Whether `text` is `str(int(text))`: `0` or an optional `-` and ASCII digits without a
/// leading zero, at most Python's 4300 (`int` refuses longer ones).
fn canonical_int(text: &str) -> bool {
    let digits = text.strip_prefix('-').unwrap_or(text);
    let plain = !digits.is_empty()
        && digits.len() <= PY_INT_MAX_STR_DIGITS
        && digits.bytes().all(|c| c.is_ascii_digit());
    plain && (text == "0" || !digits.starts_with('0'))
}

/// Python's default `sys.get_int_max_str_digits()`.
const PY_INT_MAX_STR_DIGITS: usize = 4300;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::Verifier;
    use serde_json::Value;

    fn vectors() -> Vec<Value> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/verl_reward_vectors.json");
        let text = std::fs::read_to_string(&path).expect("the vectors file");
        let doc: Value = serde_json::from_str(&text).expect("JSON");
        doc["vectors"].as_array().expect("a vectors list").clone()
    }

    fn text<'v>(v: &'v Value, key: &str) -> &'v str {
        v[key].as_str().unwrap_or_else(|| panic!("{key} of {v}"))
    }

    /// VV-1, VF-3: keel's `auto` verdict is verl's `default_compute_score`'s on every vector,
    /// the gsm8k port's is verl's for both methods and other scores, and `strip_string` agrees.
    #[test]
    fn vv1_keel_agrees_with_verl_on_every_vector() {
        let (mut by_source, mut gsm8k, mut strip, mut disagree) = (0, 0, 0, Vec::new());
        for v in vectors() {
            let (keel, verl) = match text(&v, "scorer") {
                "default_compute_score" => {
                    by_source += 1;
                    let verifier = Verifier::for_data_source(text(&v, "data_source"));
                    let keel = verifier.score(text(&v, "solution_str"), text(&v, "ground_truth"));
                    (Value::from(keel), v["score"].clone())
                }
                "gsm8k" => {
                    gsm8k += 1;
                    let method = match text(&v, "method") {
                        "strict" => Gsm8kMethod::Strict,
                        _ => Gsm8kMethod::Flexible,
                    };
                    let as_f32 = |key: &str| v[key].as_f64().expect("a number") as f32;
                    let keel = gsm8k_score(
                        text(&v, "solution_str"),
                        text(&v, "ground_truth"),
                        method,
                        as_f32("format_score"),
                        as_f32("score_value"),
                    );
                    (Value::from(keel), v["score"].clone())
                }
                _ => {
                    strip += 1;
                    (strip_string(text(&v, "input")).into(), v["output"].clone())
                }
            };
            let same = match (keel.as_f64(), verl.as_f64()) {
                (Some(a), Some(b)) => (a - b).abs() < 1e-6,
                _ => keel == verl,
            };
            if !same {
                disagree.push(format!("{v}: keel {keel}"));
            }
        }
        assert!(by_source >= 80 && gsm8k >= 120 && strip >= 40);
        assert!(
            disagree.is_empty(),
            "keel and verl disagree:\n{}",
            disagree.join("\n")
        );
    }

    #[test]
    fn vv2_no_panic_on_hostile_text() {
        for text in [
            "",
            "\\",
            "\\frac",
            "\\sqrt",
            "é\\fracé",
            "\\boxed",
            "\\boxed{",
            "}{",
            "#### ",
            "#### -",
            "-",
            "漢字 \\boxed é$",
            "\\text{ \\text{ ",
            "=",
            "/",
            "-/-",
        ] {
            let _ = strip_string(text);
            let _ = math_score(text, text);
            for m in [Gsm8kMethod::Strict, Gsm8kMethod::Flexible] {
                let _ = gsm8k_score(text, "1", m, 0.0, 1.0);
            }
        }
        assert!(canonical_int("0") && canonical_int("-12") && canonical_int("7"));
        assert!(!canonical_int("-0") && !canonical_int("03") && !canonical_int("+3"));
        assert!(!canonical_int("") && !canonical_int("-") && !canonical_int("1.0"));
    }
}
