//! `keel config explain` and docs/config.md: every documented key ([`super::keys`]) with its
//! type and default read from the serialised default config.
//!
//! Invariants:
//! - CX-1: the documented keys are exactly the keys that `TrainConfig::default()` serialises
//!   to, no more and no fewer (test `table_matches_the_schema`); adding a config field without
//!   a [`Key`] in its section fails the tests with the key's name.
//! - CX-2: a key's type and default shown to users are read from the serialised default
//!   config, never written by hand.
//! - CK-3: every key's declared range agrees with validation: a value just outside a numeric
//!   range (or a word outside a word list) is refused naming the key, and for keys with no
//!   condition on other keys the bounds themselves are accepted (test
//!   `declared_ranges_are_what_validation_accepts`).

use super::key::Key;
use super::TrainConfig;

/// One row of `keel config explain`: the declaration plus type and default from the schema.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyInfo {
    /// `section.key`.
    pub key: String,
    /// `integer`, `float`, `string`, `boolean`, `array` or `table`.
    pub kind: &'static str,
    /// The default as TOML.
    pub default: String,
    /// Allowed values.
    pub range: String,
    /// What it does.
    pub doc: &'static str,
}

fn kind_of(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::String(_) => "string",
        serde_json::Value::Number(n) if n.is_f64() => "float",
        serde_json::Value::Number(_) => "integer",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Array(_) => "array",
        serde_json::Value::Object(_) => "table",
        serde_json::Value::Null => "optional",
    }
}

fn is_documented(key: &str) -> bool {
    super::keys().any(|d| d.name == key)
}

/// The leaves under `prefix`: a table without a documented key of its own is descended into.
fn leaves(prefix: String, v: serde_json::Value, out: &mut Vec<(String, serde_json::Value)>) {
    match v {
        serde_json::Value::Object(t) if !is_documented(&prefix) => {
            for (k, v) in t {
                leaves(format!("{prefix}.{k}"), v, out);
            }
        }
        v => out.push((prefix, v)),
    }
}

/// Every key of the default config with its value (CX-2). Serialised through JSON so that
/// optional keys (unset by default) are listed too.
pub fn schema_keys() -> Vec<(String, serde_json::Value)> {
    let mut out = Vec::new();
    if let Ok(serde_json::Value::Object(root)) = serde_json::to_value(TrainConfig::default()) {
        for (section, v) in root {
            leaves(section, v, &mut out);
        }
    }
    out
}

/// The full listing: every documented key with its type and default (CX-2), section by
/// section.
pub fn explain() -> Vec<KeyInfo> {
    let schema = schema_keys();
    super::keys()
        .map(|d: &Key| {
            let value = schema.iter().find(|(k, _)| k == d.name).map(|(_, v)| v);
            KeyInfo {
                key: d.name.to_string(),
                kind: value.map_or("?", kind_of),
                default: value.map_or_else(
                    || "?".into(),
                    |v| {
                        if v.is_null() {
                            "unset".into()
                        } else {
                            v.to_string()
                        }
                    },
                ),
                range: d.shown_range(),
                doc: d.doc,
            }
        })
        .collect()
}

#[cfg(test)]
#[path = "explain_tests.rs"]
mod tests;
