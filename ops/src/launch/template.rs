//! Fills the launch templates (`ops/launch/*`): `@NAME@` placeholders (upper-case letters,
//! digits and `_` between two `@`) replaced by values already quoted for the template's format.
//!
//! Invariants:
//! - TP-1 (LH-1, with `quote`): the template is scanned once, left to right, and a value is copied
//!   out as it is: a value that contains `@NAME@` is never filled in again, so nothing a user
//!   passes can turn into a placeholder or into template text.
//! - Every placeholder of the template has a value and every value is used: a template and its
//!   renderer cannot drift apart silently.
//!
//! An `@` that does not start a placeholder (a Python decorator, `TERM@@GRACE@` in an sbatch
//! line) is kept. A template engine's own syntax (`{{ }}`, `{% %}`, `{#`) collides with the
//! formats filled here (`${#a[@]}` in bash), which is why this is not one.

use std::collections::BTreeSet;

use anyhow::{bail, Result};

/// The template with each `@NAME@` replaced by its value.
pub fn fill(template: &str, values: &[(&str, String)]) -> Result<String> {
    let mut out = String::with_capacity(template.len() * 2);
    let mut used = BTreeSet::new();
    let mut rest = template;
    while let Some(at) = rest.find('@') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let name_len = after
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(after.len());
        if name_len > 0 && after[name_len..].starts_with('@') {
            let name = &after[..name_len];
            match values.iter().find(|(k, _)| *k == name) {
                Some((_, v)) => out.push_str(v),
                None => bail!("template placeholder @{name}@ has no value"),
            }
            used.insert(name);
            rest = &after[name_len + 1..];
        } else {
            out.push('@');
            rest = after;
        }
    }
    out.push_str(rest);
    for (k, _) in values {
        if !used.contains(k) {
            bail!("the template has no placeholder @{k}@");
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::fill;

    #[test]
    fn placeholders_are_filled_once_and_other_ats_are_kept() {
        let t = "@ray.remote\nx = @A@ # TERM@@B@ a@b.c @A@";
        let out = fill(t, &[("A", "'@B@'".into()), ("B", "60".into())]).expect("fill");
        assert_eq!(out, "@ray.remote\nx = '@B@' # TERM@60 a@b.c '@B@'");
    }

    #[test]
    fn a_missing_or_unused_value_is_an_error() {
        let missing = fill("x = @A@ @B@", &[("A", "1".into())]).unwrap_err();
        assert!(missing.to_string().contains("@B@"), "{missing}");
        let unused = fill("x = @A@", &[("A", "1".into()), ("C", "2".into())]).unwrap_err();
        assert!(unused.to_string().contains("@C@"), "{unused}");
    }
}
