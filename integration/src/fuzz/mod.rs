//! A mutational fuzzer that runs on stable Rust, for the parsers that read bytes from the store
//! or the network (`targets`).
//!
//! Each target starts from its seed corpus (`integration/fuzz/corpus/<target>/`, made by
//! `keel-fuzz seeds` from keel's own encoders), mutates inputs (`mutate`: byte edits, and JSON
//! edits for JSON formats), keeps an input whose outcome signature is new, and runs until its
//! time budget is spent.
//!
//! Invariants:
//! - FZ-1: a target must never panic, whatever its input: a panic is a finding, reported with
//!   the input (saved for `keel-fuzz replay`) and the panic message; so is an input that takes
//!   more than [`SLOW_INPUT`] to parse.
//! - FZ-2: a run is replayable: the mutations follow the seed alone (`--seed`), so the same seed
//!   and corpus give the same inputs in the same order.

pub mod mutate;
pub mod targets;

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

pub use targets::{Target, TARGETS};

/// An input slower than this is a finding (FZ-1).
pub const SLOW_INPUT: Duration = Duration::from_secs(2);

/// At most this many inputs are kept in a target's corpus.
const MAX_CORPUS: usize = 2_000;

/// One input a target failed on.
#[derive(Debug, Clone)]
pub struct Finding {
    /// The input.
    pub input: Vec<u8>,
    /// The panic message, or how long it took.
    pub what: String,
}

/// What one target's run did.
#[derive(Debug, Clone)]
pub struct Report {
    /// The target's name.
    pub target: &'static str,
    /// Inputs run (seeds included).
    pub inputs: u64,
    /// Distinct outcome signatures seen.
    pub outcomes: usize,
    /// Inputs in the corpus at the end.
    pub corpus: usize,
    /// The slowest input's time.
    pub slowest: Duration,
    /// Panics and slow inputs, at most 10.
    pub findings: Vec<Finding>,
}

thread_local! {
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Runs `f` with panics caught and their messages recorded instead of printed.
fn quietly<T>(f: impl FnOnce() -> T + std::panic::UnwindSafe) -> Result<T, String> {
    let r = std::panic::catch_unwind(f);
    r.map_err(|_| {
        LAST_PANIC
            .with(|p| p.borrow_mut().take())
            .unwrap_or_else(|| "panic".into())
    })
}

/// The seed inputs of `target` under `corpus_dir/<target>/`, sorted by file name.
pub fn read_seeds(corpus_dir: &Path, target: &str) -> std::io::Result<Vec<Vec<u8>>> {
    let dir = corpus_dir.join(target);
    let mut paths: Vec<_> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    paths.sort();
    paths.iter().map(std::fs::read).collect()
}

/// Fuzzes `target` from `seeds` for `budget` with mutation seed `seed` (FZ-1, FZ-2).
pub fn fuzz(target: &Target, seeds: Vec<Vec<u8>>, budget: Duration, seed: u64) -> Report {
    let previous_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|info| {
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic".into());
        LAST_PANIC.with(|p| *p.borrow_mut() = Some(format!("{message}{at}")));
    }));
    let mut report = Report {
        target: target.name,
        inputs: 0,
        outcomes: 0,
        corpus: 0,
        slowest: Duration::ZERO,
        findings: Vec::new(),
    };
    let mut seen = BTreeSet::new();
    let mut corpus: Vec<Vec<u8>> = Vec::new();
    let mut mutator = mutate::Mutator::new(seed);
    let started = Instant::now();
    let mut queue = seeds.into_iter();
    loop {
        let input = match queue.next() {
            Some(seed_input) => seed_input,
            None if started.elapsed() >= budget || corpus.is_empty() => break,
            None => {
                let base = &corpus[mutator.pick(corpus.len())];
                let other = &corpus[mutator.pick(corpus.len())];
                mutator.mutate(base, other)
            }
        };
        let run = target.run;
        let t = Instant::now();
        let result = quietly(|| run(&input));
        let took = t.elapsed();
        report.inputs += 1;
        report.slowest = report.slowest.max(took);
        let finding = match result {
            Err(panic) => Some(format!("panic: {panic}")),
            Ok(_) if took > SLOW_INPUT => Some(format!("slow: {:.1} s", took.as_secs_f64())),
            Ok(signature) => {
                let new = seen.insert(signature);
                if (new && corpus.len() < MAX_CORPUS) || corpus.is_empty() {
                    corpus.push(input.clone());
                }
                None
            }
        };
        if let Some(what) = finding {
            if report.findings.len() < 10 {
                report.findings.push(Finding { input, what });
            }
        }
    }
    std::panic::set_hook(previous_hook);
    report.outcomes = seen.len();
    report.corpus = corpus.len();
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_len(bytes: &[u8]) -> String {
        // A planted bug: indexes by a length field without checking it.
        match bytes.first() {
            Some(&n) => format!("{}", bytes[1 + n as usize % 64]),
            None => "empty".into(),
        }
    }

    #[test]
    fn fz1_a_panicking_parser_is_found_and_its_input_kept() {
        let target = Target {
            name: "planted",
            what: "a parser with an unchecked index",
            run: parse_len,
        };
        let report = fuzz(
            &target,
            vec![vec![0, 1, 2, 3]],
            Duration::from_millis(300),
            1,
        );
        let f = report.findings.first().expect("the planted panic is found");
        assert!(f.what.contains("index out of bounds"), "{}", f.what);
        assert!(
            std::panic::catch_unwind(|| parse_len(&f.input)).is_err(),
            "the kept input reproduces it"
        );
        assert!(report.inputs > 10);
    }

    #[test]
    fn fz2_the_same_seed_runs_the_same_inputs() {
        let target = &TARGETS[3]; // head_and_tag: fast
        let seeds = vec![
            b"H\n00000001-00000000".to_vec(),
            b"Ttags/healthy/x".to_vec(),
        ];
        let mut m1 = mutate::Mutator::new(5);
        let mut m2 = mutate::Mutator::new(5);
        for _ in 0..100 {
            assert_eq!(
                m1.mutate(&seeds[0], &seeds[1]),
                m2.mutate(&seeds[0], &seeds[1])
            );
        }
        let report = fuzz(target, seeds, Duration::from_millis(100), 5);
        assert!(report.findings.is_empty(), "{:?}", report.findings);
    }
}
