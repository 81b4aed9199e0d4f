//! Old spellings of renamed keys (CF-2): a config written for an earlier keel keeps working.
//! Each old key found is moved to its new place in the parsed TOML before the schema reads it,
//! and named in a warning; a file giving both spellings of one key is an error naming both.
//!
//! Invariants:
//! - CL-1: [`RENAMED`] maps each old `section.key` to exactly one new dotted path, and no new
//!   path is itself an old one (test `renames_are_one_step`).

use super::ConfigError;

/// Old key → new key. `[env]`'s flat external-server and dataset keys became the envs crate's
/// own tables `[env.external]`, `[env.dataset]` and `[env.dataset.reward]`.
pub const RENAMED: &[(&str, &str)] = &[
    ("env.url", "env.external.url"),
    ("env.timeout_ms", "env.external.timeout_ms"),
    ("env.retries", "env.external.retries"),
    ("env.auth_env", "env.external.auth_env"),
    ("env.max_response_bytes", "env.external.max_response_bytes"),
    ("env.train_file", "env.dataset.train_file"),
    ("env.eval_file", "env.dataset.eval_file"),
    ("env.verifier", "env.dataset.verifier"),
    ("env.prompt_key", "env.dataset.prompt_key"),
    ("env.answer_key", "env.dataset.answer_key"),
    ("env.shuffle", "env.dataset.shuffle"),
    ("env.shuffle_seed", "env.dataset.shuffle_seed"),
    ("env.max_turns", "env.dataset.max_turns"),
    ("env.reward_url", "env.dataset.reward.url"),
    ("env.reward_timeout_ms", "env.dataset.reward.timeout_ms"),
    ("env.reward_retries", "env.dataset.reward.retries"),
    ("env.reward_batch", "env.dataset.reward.batch"),
    (
        "env.reward_batch_wait_ms",
        "env.dataset.reward.batch_wait_ms",
    ),
    ("env.reward_concurrency", "env.dataset.reward.concurrency"),
    ("env.reward_auth_env", "env.dataset.reward.auth_env"),
];

/// Moves every old key of `table` to its new path; returns one note per key moved.
pub fn rename_old_keys(table: &mut toml::Table) -> Result<Vec<String>, ConfigError> {
    let mut notes = Vec::new();
    for (old, new) in RENAMED {
        let Some(value) = take(table, old) else {
            continue;
        };
        if get(table, new).is_some() {
            return Err(ConfigError::OutOfRange {
                key: (*new).into(),
                reason: format!("is also given under its old name `{old}`: keep only `{new}`"),
            });
        }
        put(table, new, value)?;
        notes.push(format!("`{old}` is now `{new}`; reading it as such"));
    }
    Ok(notes)
}

/// Removes and returns the value at a dotted path, if every table on the way exists.
fn take(table: &mut toml::Table, path: &str) -> Option<toml::Value> {
    let (parents, last) = match path.rsplit_once('.') {
        Some((p, l)) => (p, l),
        None => return table.remove(path),
    };
    let mut t = table;
    for part in parents.split('.') {
        t = t.get_mut(part)?.as_table_mut()?;
    }
    t.remove(last)
}

fn get<'a>(table: &'a toml::Table, path: &str) -> Option<&'a toml::Value> {
    let mut parts = path.split('.');
    let mut v = table.get(parts.next()?)?;
    for part in parts {
        v = v.as_table()?.get(part)?;
    }
    Some(v)
}

/// Sets the value at a dotted path, creating missing tables; a non-table on the way is an
/// error naming it.
fn put(table: &mut toml::Table, path: &str, value: toml::Value) -> Result<(), ConfigError> {
    let mut parts: Vec<&str> = path.split('.').collect();
    let last = parts.pop().unwrap_or(path);
    let mut t = table;
    let mut at = String::new();
    for part in parts {
        at = if at.is_empty() {
            part.to_string()
        } else {
            format!("{at}.{part}")
        };
        let entry = t
            .entry(part.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        t = entry
            .as_table_mut()
            .ok_or_else(|| ConfigError::OutOfRange {
                key: at.clone(),
                reason: "must be a table".into(),
            })?;
    }
    t.insert(last.to_string(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TrainConfig;

    #[test]
    fn renames_are_one_step() {
        for (old, new) in RENAMED {
            assert!(
                RENAMED.iter().all(|(o, _)| o != new),
                "{new} is an old name too"
            );
            assert!(
                crate::config::keys().any(|k| k.name == *new),
                "{old} -> {new}: the new key is not documented"
            );
        }
    }

    #[test]
    fn old_flat_env_keys_still_read() {
        let cfg = TrainConfig::from_toml(
            "[env]\nname = \"dataset\"\ntrain_file = \"t.jsonl\"\neval_file = \"e.jsonl\"\nreward_url = \"http://127.0.0.1:9/\"\nreward_batch = 8\nmax_turns = 3\n",
        )
        .expect("old spellings");
        assert_eq!(cfg.env.dataset.reward.batch, 8);
        assert_eq!(cfg.env.dataset.max_turns, 3);
        assert_eq!(cfg.env.dataset.train_file, std::path::Path::new("t.jsonl"));
        let err =
            TrainConfig::from_toml("[env]\nreward_batch = 8\n[env.dataset.reward]\nbatch = 9\n")
                .expect_err("both spellings")
                .to_string();
        assert!(
            err.contains("env.dataset.reward.batch") && err.contains("env.reward_batch"),
            "{err}"
        );
    }
}
