//! Input mutation for the fuzz targets: byte-level edits for binary formats and structure-aware
//! edits for JSON, seeded so that a run can be replayed exactly.
//!
//! An input may start with a header line (`kind\n`, e.g. the answer an env server gives to
//! `info`) followed by a JSON body: JSON edits then apply to the body and keep the header.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

/// Values that break parsers: limits of the integer types, non-finite-adjacent floats, empty
/// and long strings, path tricks, wrong container types.
fn interesting_json(rng: &mut StdRng) -> Value {
    match rng.gen_range(0..16) {
        0 => Value::Null,
        1 => Value::Bool(rng.gen()),
        2 => Value::from(-1),
        3 => Value::from(0),
        4 => Value::from(u64::MAX),
        5 => Value::from(u64::MAX - 1),
        6 => Value::from(i64::MIN),
        7 => Value::from(1e308),
        8 => Value::from(-1e-308),
        9 => Value::from(u32::MAX as u64 + 1),
        10 => Value::from(""),
        11 => Value::from("x".repeat(rng.gen_range(65..5000))),
        12 => Value::from("../../etc/passwd"),
        13 => Value::Array(vec![]),
        14 => Value::Object(serde_json::Map::new()),
        _ => Value::from("a b\u{0}c\u{202e}"),
    }
}

/// Interesting integers for binary fields.
const INTERESTING_U64: [u64; 9] = [
    0,
    1,
    2,
    0x7f,
    0xff,
    0x8000_0000,
    0xffff_ffff,
    u64::MAX / 2,
    u64::MAX,
];

/// Counts the nodes of `v` (pre-order).
fn node_count(v: &Value) -> usize {
    1 + match v {
        Value::Array(a) => a.iter().map(node_count).sum(),
        Value::Object(o) => o.values().map(node_count).sum(),
        _ => 0,
    }
}

/// The `n`-th node of `v` in pre-order.
fn node_mut(v: &mut Value, mut n: usize) -> Option<&mut Value> {
    fn walk<'a>(v: &'a mut Value, n: &mut usize) -> Option<&'a mut Value> {
        if *n == 0 {
            return Some(v);
        }
        *n -= 1;
        match v {
            Value::Array(a) => a.iter_mut().find_map(|x| walk(x, n)),
            Value::Object(o) => o.values_mut().find_map(|x| walk(x, n)),
            _ => None,
        }
    }
    walk(v, &mut n)
}

/// A seeded mutator.
pub struct Mutator {
    rng: StdRng,
}

impl Mutator {
    /// A mutator whose choices follow `seed` alone.
    pub fn new(seed: u64) -> Self {
        Mutator {
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// An index below `n` (n > 0).
    pub fn pick(&mut self, n: usize) -> usize {
        self.rng.gen_range(0..n)
    }

    /// `input` changed by one to four stacked edits; `other` is another corpus entry to splice.
    pub fn mutate(&mut self, input: &[u8], other: &[u8]) -> Vec<u8> {
        let (header, body) = split_header(input);
        if let Ok(json) = serde_json::from_slice::<Value>(body) {
            if self.rng.gen_bool(0.7) {
                let mut out = header.to_vec();
                out.extend(self.mutate_json(json));
                return out;
            }
        }
        let mut out = input.to_vec();
        for _ in 0..self.rng.gen_range(1..=4) {
            self.mutate_bytes(&mut out, other);
        }
        out
    }

    fn mutate_json(&mut self, mut json: Value) -> Vec<u8> {
        for _ in 0..self.rng.gen_range(1..=3) {
            let n = node_count(&json);
            let pick = self.rng.gen_range(0..n);
            let choice = self.rng.gen_range(0..6);
            let replacement = interesting_json(&mut self.rng);
            let count = self.rng.gen_range(2..40);
            let Some(node) = node_mut(&mut json, pick) else {
                continue;
            };
            match (choice, &mut *node) {
                (0, Value::Object(o)) if !o.is_empty() => {
                    let k = o.keys().nth(self.rng.gen_range(0..o.len())).cloned();
                    if let Some(k) = k {
                        o.remove(&k);
                    }
                }
                (1, Value::Array(a)) if !a.is_empty() => {
                    let x = a[self.rng.gen_range(0..a.len())].clone();
                    a.extend(std::iter::repeat_n(x, count));
                }
                (2, Value::Number(num)) => {
                    if let Some(x) = num.as_u64() {
                        let delta = [1u64, 2, 1 << 32][self.rng.gen_range(0..3)];
                        *node = Value::from(x.wrapping_add(delta));
                    } else {
                        *node = replacement;
                    }
                }
                (3, _) => {
                    let mut nested = node.clone();
                    for _ in 0..count {
                        nested = Value::Array(vec![nested]);
                    }
                    *node = nested;
                }
                _ => *node = replacement,
            }
        }
        serde_json::to_vec(&json).unwrap_or_default()
    }

    fn mutate_bytes(&mut self, out: &mut Vec<u8>, other: &[u8]) {
        let len = out.len();
        match self.rng.gen_range(0..9) {
            0 if len > 0 => {
                let i = self.rng.gen_range(0..len);
                out[i] ^= 1 << self.rng.gen_range(0..8);
            }
            1 if len > 0 => {
                let i = self.rng.gen_range(0..len);
                out[i] = self.rng.gen();
            }
            2 if len >= 8 => {
                let i = self.rng.gen_range(0..=len - 8);
                let v = INTERESTING_U64[self.rng.gen_range(0..INTERESTING_U64.len())];
                let width = [1usize, 2, 4, 8][self.rng.gen_range(0..4)];
                out[i..i + width].copy_from_slice(&v.to_le_bytes()[..width]);
            }
            3 => {
                let i = self.rng.gen_range(0..=len);
                let n = self.rng.gen_range(1..16);
                let bytes: Vec<u8> = (0..n).map(|_| self.rng.gen()).collect();
                out.splice(i..i, bytes);
            }
            4 if len > 1 => {
                let i = self.rng.gen_range(0..len);
                let n = self.rng.gen_range(1..=(len - i).min(32));
                out.drain(i..i + n);
            }
            5 if len > 1 => {
                let i = self.rng.gen_range(0..len);
                let n = self.rng.gen_range(1..=(len - i).min(64));
                let chunk = out[i..i + n].to_vec();
                let at = self.rng.gen_range(0..=len);
                out.splice(at..at, chunk);
            }
            6 if len > 0 => out.truncate(self.rng.gen_range(0..len)),
            7 if !other.is_empty() => {
                let cut = self.rng.gen_range(0..=len);
                let from = self.rng.gen_range(0..other.len());
                out.truncate(cut);
                out.extend_from_slice(&other[from..]);
            }
            _ => {
                let i = self.rng.gen_range(0..=len);
                out.insert(i, [0u8, 0xff, b'"', b'{', b'\n'][self.rng.gen_range(0..5)]);
            }
        }
    }
}

/// An input's header line (through its first `\n`, when what follows is JSON-like) and body.
pub fn split_header(input: &[u8]) -> (&[u8], &[u8]) {
    match input.iter().position(|&b| b == b'\n') {
        Some(i) if i < 64 && matches!(input.get(i + 1), Some(b'{' | b'[' | b'"')) => {
            input.split_at(i + 1)
        }
        _ => (&[], input),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_follow_the_seed_and_keep_the_header() {
        let input = br#"info
{"name":"grid","max_turns":8,"vocabulary":["go","left"]}"#;
        let a: Vec<Vec<u8>> = {
            let mut m = Mutator::new(7);
            (0..50).map(|_| m.mutate(input, b"other")).collect()
        };
        let b: Vec<Vec<u8>> = {
            let mut m = Mutator::new(7);
            (0..50).map(|_| m.mutate(input, b"other")).collect()
        };
        assert_eq!(a, b, "replayable");
        assert!(a.iter().any(|x| x.as_slice() != input.as_slice()));
        let kept = a.iter().filter(|x| x.starts_with(b"info\n{")).count();
        assert!(kept > 25, "JSON edits keep the header: {kept} of 50");
    }
}
