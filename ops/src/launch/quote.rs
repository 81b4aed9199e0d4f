//! Quoting of user values (paths, names, config text, trainer arguments) for the three
//! template formats.
//!
//! Invariants (LH-1):
//! - `python_str`: a Python string literal whose value is the input, for any input: a JSON
//!   string as `serde_json` writes it (`\"`, `\\`, `\n`, `\r`, `\t`, `\b`, `\f`, `\u00XX` for
//!   other control characters, everything else as itself) means the same in Python.
//! - `shell_word`: one POSIX shell word whose value is the input (`shlex`); a NUL byte, which
//!   no shell word can hold, is an error.
//! - `yaml_str`: a YAML double-quoted scalar of printable ASCII only (YAML 1.1 and 1.2, so
//!   Go's parsers read it like PyYAML does), whose value is the input.
//! - `k8s_literal`: the input with every `$` doubled, so Kubernetes' `$(VAR)` expansion in
//!   `command`, `args` and `env` gives back the input instead of a variable's value.

use anyhow::{bail, Result};

/// A Python string literal with the value `s`.
pub fn python_str(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

/// One POSIX shell word with the value `s`.
pub fn shell_word(s: &str) -> Result<String> {
    match shlex::try_quote(s) {
        Ok(q) => Ok(q.into_owned()),
        Err(_) => bail!("{s:?} holds a NUL byte, which no shell word can carry"),
    }
}

/// A YAML double-quoted scalar with the value `s`, in printable ASCII.
pub fn yaml_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            ' '..='~' => out.push(c),
            c if (c as u32) <= 0xFFFF => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push_str(&format!("\\U{:08X}", c as u32)),
        }
    }
    out.push('"');
    out
}

/// `s` with `$` escaped against Kubernetes' `$(VAR)` expansion.
pub fn k8s_literal(s: &str) -> String {
    s.replace('$', "$$")
}

#[cfg(test)]
mod tests {
    use super::{k8s_literal, python_str, shell_word, yaml_str};

    #[test]
    fn quoting_escapes_what_each_format_would_interpret() {
        assert_eq!(python_str("a'b\"c\\d\n"), r#""a'b\"c\\d\n""#);
        assert_eq!(
            shell_word("plain/path-1.toml").expect("q"),
            "plain/path-1.toml"
        );
        // `'` only inside double quotes, `$` and backticks only inside single ones.
        assert_eq!(
            shell_word("it's $(x) `y`").expect("q"),
            r#""it's "'$(x) `y`'"#
        );
        assert!(shell_word("a\0b").is_err());
        assert_eq!(yaml_str("a\"b\\c\nd: #e"), r#""a\"b\\c\nd: #e""#);
        assert_eq!(yaml_str("é\u{85}😀\r"), r#""\u00E9\u0085\U0001F600\u000D""#);
        assert_eq!(k8s_literal("$(HOME)/$$x"), "$$(HOME)/$$$$x");
    }
}
