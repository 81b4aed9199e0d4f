//! Validation of object keys that come from callers.
//!
//! Invariants:
//! - KY-1: a key accepted by [`validate_rel_key`] is a non-empty sequence of `/`-separated
//!   segments, none empty, `.` or `..`; it is not absolute and contains no backslash, no control
//!   character and no `#`. Joined under the run prefix it therefore names an object inside the
//!   run root and nowhere else.
//! - KY-2: a name accepted by [`validate_segment`] is a single such segment (no `/`).
//! - KY-3: keys are at most [`MAX_KEY_BYTES`] bytes, the S3 limit.
//! - KY-4: a name accepted by [`validate_name`] (run names, branch names, tags) is 1 to 64
//!   characters of `A-Z a-z 0-9 . _ -`, not starting with `.` or `-`: a plain, portable segment.

use object_store::path::Path;

use crate::error::StoreError;

/// The longest key accepted, in bytes (S3's limit).
pub const MAX_KEY_BYTES: usize = 1024;

fn reject(key: &str, reason: &str) -> StoreError {
    StoreError::InvalidKey {
        key: key.to_string(),
        reason: reason.to_string(),
    }
}

/// Checks KY-1 and KY-3 for a caller-supplied key relative to the run root.
pub fn validate_rel_key(key: &str) -> Result<(), StoreError> {
    if key.is_empty() {
        return Err(reject(key, "the key is empty"));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(reject(key, "the key is longer than 1024 bytes"));
    }
    if key.starts_with('/') {
        return Err(reject(key, "absolute paths are not allowed"));
    }
    if key.contains('\\') {
        return Err(reject(key, "backslashes are not allowed"));
    }
    if key.chars().any(char::is_control) {
        return Err(reject(key, "control characters are not allowed"));
    }
    if key.contains('#') {
        return Err(reject(
            key,
            "'#' is reserved by the local backend for staging files",
        ));
    }
    for segment in key.split('/') {
        match segment {
            "" => {
                return Err(reject(
                    key,
                    "empty path segments (\"//\" or a trailing '/') are not allowed",
                ))
            }
            "." | ".." => return Err(reject(key, "'.' and '..' segments are not allowed")),
            _ => {}
        }
    }
    // Belt and braces: the backend's own parser must agree that the key is plain.
    Path::parse(key).map_err(|e| reject(key, &e.to_string()))?;
    Ok(())
}

/// Checks KY-2: `name` must be one plain segment, e.g. a file name inside a checkpoint.
pub fn validate_segment(name: &str) -> Result<(), StoreError> {
    validate_rel_key(name)?;
    if name.contains('/') {
        return Err(reject(
            name,
            "a single name is required, '/' is not allowed",
        ));
    }
    Ok(())
}

/// Checks KY-4 for a run, branch or tag name.
pub fn validate_name(name: &str) -> Result<(), StoreError> {
    if name.is_empty() || name.len() > 64 {
        return Err(reject(name, "a name must be 1 to 64 characters long"));
    }
    if name.starts_with('.') || name.starts_with('-') {
        return Err(reject(name, "a name must not start with '.' or '-'"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(reject(
            name,
            "a name may only contain letters, digits, '.', '_' and '-'",
        ));
    }
    Ok(())
}

/// Checks KY-4 for a branch name.
pub fn validate_branch(name: &str) -> Result<(), StoreError> {
    validate_name(name)
}

/// Joins an already validated prefix (possibly empty) and an already validated relative key.
pub fn join(prefix: &str, rel: &str) -> String {
    if prefix.is_empty() {
        rel.to_string()
    } else {
        format!("{prefix}/{rel}")
    }
}

/// Parses a full key (prefix included) into a backend path, rejecting anything KY-1 rejects.
pub fn to_path(full_key: &str) -> Result<Path, StoreError> {
    validate_rel_key(full_key)?;
    Path::parse(full_key).map_err(|e| reject(full_key, &e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ky1_hostile_keys_are_rejected() {
        for key in [
            "",
            "../x",
            "a/../../x",
            "/etc/passwd",
            "a//b",
            "a/",
            "./a",
            "a\\b",
            "..\\x",
            "a\nb",
            "a\0b",
            "x#1",
            "..",
        ] {
            assert!(
                matches!(validate_rel_key(key), Err(StoreError::InvalidKey { .. })),
                "{key:?} was accepted"
            );
        }
        let long = "a".repeat(MAX_KEY_BYTES + 1);
        assert!(validate_rel_key(&long).is_err());
    }

    #[test]
    fn ky1_plain_keys_are_accepted() {
        for key in [
            "x",
            "metrics/step-00000001.json",
            "a/b/c.d",
            "lineage.jsonl",
            "..a",
            "a..b",
        ] {
            validate_rel_key(key).unwrap_or_else(|e| panic!("{key:?}: {e}"));
        }
    }

    #[test]
    fn ky2_segments_are_single() {
        assert!(validate_segment("model.safetensors").is_ok());
        assert!(matches!(
            validate_segment("a/b"),
            Err(StoreError::InvalidKey { .. })
        ));
        assert!(matches!(
            validate_segment(".."),
            Err(StoreError::InvalidKey { .. })
        ));
    }

    #[test]
    fn ky4_names_are_plain() {
        for ok in ["main", "from-00000006-abc", "run_1.b"] {
            validate_name(ok).unwrap_or_else(|e| panic!("{ok:?}: {e}"));
        }
        for bad in [
            "",
            ".hidden",
            "-x",
            "a/b",
            "..",
            "a b",
            "é",
            &"x".repeat(65),
        ] {
            assert!(validate_name(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn error_names_the_key_and_reason() {
        let e = validate_rel_key("../x").expect_err("rejected");
        assert_eq!(
            e.to_string(),
            "invalid object key \"../x\": '.' and '..' segments are not allowed; \
             use a relative path of plain segments"
        );
    }
}
