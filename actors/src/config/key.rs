//! One config key as data: its TOML name, the values it accepts as a typed [`Range`], and its
//! documentation. Each section module declares its keys next to its struct; validation checks a
//! value against the same [`Key`] that `keel config explain` and docs/config.md print.
//!
//! Invariants:
//! - CK-1: a key's shown range is rendered from its [`Range`] (plus the `also` text for
//!   conditions on other keys); validation of a section's own keys calls the same value's
//!   checks, so the two cannot drift. Keys validated by another crate's own type (`learner.*`,
//!   `env.dataset.*`, `env.external.*`, `pats.*`, `armor.loss.*`) are held to their declared
//!   range by the boundary test of `config::explain` (CK-3).
//! - CK-2: an out-of-range value is a [`ConfigError::OutOfRange`] naming the key as written in
//!   TOML and the accepted values; integer bounds read "must be at least N" / "at most N".

use std::fmt;

use super::ConfigError;

/// One bound of a real interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Bound {
    /// The value itself is allowed.
    Closed(f64),
    /// Only values strictly beyond it are allowed.
    Open(f64),
    /// No bound on this side.
    None,
}

/// The values a key accepts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Range {
    /// An integer in `min..=max` (`max` None: no upper bound).
    Int {
        /// Smallest value.
        min: u64,
        /// Largest value.
        max: Option<u64>,
    },
    /// A finite real number between two bounds.
    Real {
        /// Lower bound.
        lo: Bound,
        /// Upper bound.
        hi: Bound,
    },
    /// 0 (the feature off) or a real number above `above`.
    OffOrAbove(f64),
    /// One of these words.
    Words(&'static [&'static str]),
    /// `true` or `false`.
    Bool,
    /// Text of the described form (names, URLs, paths, tables), checked by the section's code.
    Text(&'static str),
}

/// The integers from `min` up, with no upper bound.
pub const fn at_least(min: u64) -> Range {
    Range::Int { min, max: None }
}

/// The integers `min..=max`.
pub const fn ints(min: u64, max: u64) -> Range {
    Range::Int {
        min,
        max: Some(max),
    }
}

/// The reals in `(0, 1]`.
pub const UNIT_OPEN_LOW: Range = Range::Real {
    lo: Bound::Open(0.0),
    hi: Bound::Closed(1.0),
};

/// The reals in `[0, 1]`.
pub const UNIT: Range = Range::Real {
    lo: Bound::Closed(0.0),
    hi: Bound::Closed(1.0),
};

/// The reals above 0.
pub const POSITIVE: Range = Range::Real {
    lo: Bound::Open(0.0),
    hi: Bound::None,
};

/// The reals from 0 up.
pub const NON_NEGATIVE: Range = Range::Real {
    lo: Bound::Closed(0.0),
    hi: Bound::None,
};

/// A documented config key (CK-1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Key {
    /// `section.key` as written in TOML.
    pub name: &'static str,
    /// The values it accepts on its own.
    pub range: Range,
    /// Conditions involving other keys or the machine, checked by the section's code (empty:
    /// none).
    pub also: &'static str,
    /// What it does.
    pub doc: &'static str,
}

impl Key {
    /// A key with no conditions beyond its range.
    pub const fn new(name: &'static str, range: Range, doc: &'static str) -> Key {
        Key {
            name,
            range,
            also: "",
            doc,
        }
    }

    /// A key whose value is also bounded by other keys or the machine (`also`, shown after its
    /// range).
    pub const fn with_also(
        name: &'static str,
        range: Range,
        also: &'static str,
        doc: &'static str,
    ) -> Key {
        Key {
            name,
            range,
            also,
            doc,
        }
    }

    /// The error of a value this key refuses (CK-2).
    pub fn error(&self, reason: String) -> ConfigError {
        ConfigError::OutOfRange {
            key: self.name.to_string(),
            reason,
        }
    }

    /// Checks an integer value against [`Range::Int`].
    pub fn check_int(&self, value: u64) -> Result<(), ConfigError> {
        let Range::Int { min, max } = self.range else {
            return Err(self.error(format!("is declared as {}, not an integer", self.range)));
        };
        if value < min {
            return Err(self.error(format!("must be at least {min}, got {value}")));
        }
        match max {
            Some(max) if value > max => {
                Err(self.error(format!("must be at most {max}, got {value}")))
            }
            _ => Ok(()),
        }
    }

    /// Checks a real value against [`Range::Real`] or [`Range::OffOrAbove`].
    pub fn check_real(&self, value: f64) -> Result<(), ConfigError> {
        let ok = match self.range {
            Range::Real { lo, hi } => value.is_finite() && above(value, lo) && below(value, hi),
            Range::OffOrAbove(a) => value.is_finite() && (value == 0.0 || value > a),
            other => {
                return Err(self.error(format!("is declared as {other}, not a real number")));
            }
        };
        if ok {
            Ok(())
        } else {
            Err(self.error(format!("must be {}, got {value}", self.range.phrase())))
        }
    }

    /// Checks a word against [`Range::Words`].
    pub fn check_word(&self, value: &str) -> Result<(), ConfigError> {
        let Range::Words(words) = self.range else {
            return Err(self.error(format!("is declared as {}, not a word", self.range)));
        };
        if words.contains(&value) {
            return Ok(());
        }
        Err(self.error(format!(
            "must be one of {}, got {value:?}",
            words.join(", ")
        )))
    }

    /// The accepted values as `keel config explain` shows them: the range, then `also`.
    pub fn shown_range(&self) -> String {
        if self.also.is_empty() {
            self.range.to_string()
        } else {
            format!("{}; {}", self.range, self.also)
        }
    }
}

fn above(v: f64, lo: Bound) -> bool {
    match lo {
        Bound::Closed(b) => v >= b,
        Bound::Open(b) => v > b,
        Bound::None => true,
    }
}

fn below(v: f64, hi: Bound) -> bool {
    match hi {
        Bound::Closed(b) => v <= b,
        Bound::Open(b) => v < b,
        Bound::None => true,
    }
}

/// `2^k` for large powers of two, `10^k` for large powers of ten, else the number.
fn number(n: u64) -> String {
    if n >= 1 << 20 && n.is_power_of_two() {
        return format!("2^{}", n.trailing_zeros());
    }
    if n >= 1_000_000 {
        let mut k = 0;
        let mut m = n;
        while m.is_multiple_of(10) {
            m /= 10;
            k += 1;
        }
        if m == 1 {
            return format!("10^{k}");
        }
    }
    n.to_string()
}

fn real(x: f64) -> String {
    format!("{x}")
}

impl Range {
    /// The range as the end of "must be …".
    fn phrase(&self) -> String {
        match self {
            Range::Real { .. } => format!("in {self}"),
            other => other.to_string(),
        }
    }
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Range::Int { min, max: None } => write!(f, ">= {}", number(*min)),
            Range::Int {
                min,
                max: Some(max),
            } => write!(f, "{}..={}", number(*min), number(*max)),
            Range::Real { lo, hi } => match (lo, hi) {
                (Bound::Open(a), Bound::None) => write!(f, "> {}", real(*a)),
                (Bound::Closed(a), Bound::None) => write!(f, ">= {}", real(*a)),
                (lo, hi) => {
                    let (open, a) = match lo {
                        Bound::Closed(a) => ('[', real(*a)),
                        Bound::Open(a) => ('(', real(*a)),
                        Bound::None => ('(', "-inf".into()),
                    };
                    let (close, b) = match hi {
                        Bound::Closed(b) => (']', real(*b)),
                        Bound::Open(b) => (')', real(*b)),
                        Bound::None => (')', "inf".into()),
                    };
                    write!(f, "{open}{a}, {b}{close}")
                }
            },
            Range::OffOrAbove(a) => write!(f, "0 (off) or > {}", real(*a)),
            Range::Words(words) => write!(f, "{}", words.join(" | ")),
            Range::Bool => write!(f, "true | false"),
            Range::Text(form) => write!(f, "{form}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_render_as_users_write_values() {
        assert_eq!(ints(1, 1 << 40).to_string(), "1..=2^40");
        assert_eq!(ints(1, 10_000_000).to_string(), "1..=10^7");
        assert_eq!(ints(0, 64).to_string(), "0..=64");
        assert_eq!(at_least(1).to_string(), ">= 1");
        assert_eq!(UNIT_OPEN_LOW.to_string(), "(0, 1]");
        assert_eq!(POSITIVE.to_string(), "> 0");
        assert_eq!(Range::OffOrAbove(1.0).to_string(), "0 (off) or > 1");
        assert_eq!(Range::Words(&["sync", "async"]).to_string(), "sync | async");
    }

    #[test]
    fn checks_name_the_key_and_the_bound() {
        let k = Key::new("rollout.group_size", ints(1, 1024), "doc");
        let e = k.check_int(0).expect_err("below").to_string();
        assert!(
            e.contains("rollout.group_size") && e.contains("at least 1"),
            "{e}"
        );
        let e = k.check_int(1025).expect_err("above").to_string();
        assert!(e.contains("at most 1024, got 1025"), "{e}");
        assert!(k.check_int(1024).is_ok());
        let t = Key::new("sft.lr", UNIT_OPEN_LOW, "doc");
        assert!(t.check_real(0.0).is_err() && t.check_real(f64::NAN).is_err());
        assert!(t.check_real(1.0).is_ok());
        let w = Key::new("run.mode", Range::Words(&["sync", "async"]), "doc");
        assert!(w.check_word("async").is_ok());
        assert!(w
            .check_word("both")
            .expect_err("word")
            .to_string()
            .contains("sync, async"));
        assert!(
            k.check_real(1.0).is_err(),
            "a declared type mismatch is an error"
        );
    }
}
