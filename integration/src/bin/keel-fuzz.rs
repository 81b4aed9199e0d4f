//! `keel-fuzz`: fuzzes the parsers that read bytes from the store or the network (FZ-1, FZ-2).
//!
//! ```text
//! keel-fuzz run [--seconds 30] [--target NAME] [--seed 1] [--corpus integration/fuzz/corpus]
//!               [--findings DIR]     exit 1 if any target panicked or was slow
//! keel-fuzz seeds [--corpus DIR]     writes the seed corpus from keel's own encoders
//! keel-fuzz replay NAME FILE         runs one input (a saved finding) through a target
//! keel-fuzz list                     the targets
//! ```
//! `scripts/test.sh` runs `keel-fuzz run` (CI: 30 s per target).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use keel_integration::fuzz::{self, targets, TARGETS};

fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

fn default_corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus")
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let corpus = flag(&args, "--corpus").map_or_else(default_corpus, PathBuf::from);
    match args.first().map(String::as_str) {
        Some("run") => run(&args, &corpus),
        Some("seeds") => write_seeds(&corpus),
        Some("replay") => {
            let (Some(name), Some(file)) = (args.get(1), args.get(2)) else {
                bail!("usage: keel-fuzz replay NAME FILE");
            };
            let target = find(name)?;
            let input = std::fs::read(file).with_context(|| format!("cannot read {file}"))?;
            println!("{}: {}", target.name, (target.run)(&input));
            Ok(())
        }
        Some("list") => {
            for t in TARGETS {
                println!("{:16} {}", t.name, t.what);
            }
            Ok(())
        }
        _ => bail!("usage: keel-fuzz run|seeds|replay|list (see the file's doc)"),
    }
}

fn find(name: &str) -> Result<&'static fuzz::Target> {
    TARGETS
        .iter()
        .find(|t| t.name == name)
        .with_context(|| format!("no fuzz target {name:?}; `keel-fuzz list` shows them"))
}

fn run(args: &[String], corpus: &Path) -> Result<()> {
    let seconds: f64 = flag(args, "--seconds").unwrap_or("30").parse()?;
    let seed: u64 = flag(args, "--seed").unwrap_or("1").parse()?;
    let findings_dir = flag(args, "--findings").map_or_else(
        || std::env::temp_dir().join("keel-fuzz-findings"),
        PathBuf::from,
    );
    let targets: Vec<&fuzz::Target> = match flag(args, "--target") {
        Some(name) => vec![find(name)?],
        None => TARGETS.iter().collect(),
    };
    println!(
        "keel-fuzz: seed {seed}, {seconds} s per target, corpus {}",
        corpus.display()
    );
    let mut failed = 0;
    for target in targets {
        let seeds = fuzz::read_seeds(corpus, target.name).with_context(|| {
            format!("the seed corpus of {} ({})", target.name, corpus.display())
        })?;
        if seeds.is_empty() {
            bail!("{}: empty seed corpus; run `keel-fuzz seeds`", target.name);
        }
        let n_seeds = seeds.len();
        let report = fuzz::fuzz(target, seeds, Duration::from_secs_f64(seconds), seed);
        println!(
            "{:16} {:>9} inputs ({:>7.0}/s) from {n_seeds} seeds, {:>4} outcomes, corpus {:>4}, slowest {:.1} ms, findings {}",
            report.target,
            report.inputs,
            report.inputs as f64 / seconds.max(1e-9),
            report.outcomes,
            report.corpus,
            report.slowest.as_secs_f64() * 1e3,
            report.findings.len()
        );
        for (i, f) in report.findings.iter().enumerate() {
            std::fs::create_dir_all(&findings_dir)?;
            let path = findings_dir.join(format!("{}-{i}", target.name));
            std::fs::write(&path, &f.input)?;
            println!(
                "  FINDING {}: {} (input saved to {})",
                target.name,
                f.what,
                path.display()
            );
            failed += 1;
        }
    }
    if failed > 0 {
        bail!("{failed} findings; replay one with `keel-fuzz replay NAME FILE`");
    }
    Ok(())
}

/// Writes `bytes` as `corpus/<target>/<name>`.
fn put(corpus: &Path, target: &str, name: &str, bytes: &[u8]) -> Result<()> {
    let dir = corpus.join(target);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(name), bytes)?;
    Ok(())
}

/// The seed corpus, made by keel's own encoders and a real (local) run root.
fn write_seeds(corpus: &Path) -> Result<()> {
    for (i, b) in targets::seed_batches().iter().enumerate() {
        put(
            corpus,
            "batch_frame",
            &format!("{i}.krb"),
            &keel_store::frame::encode_batch(b, 3)?,
        )?;
        put(
            corpus,
            "batch_archive",
            &format!("{i}.rkyv"),
            &keel_store::frame::archive_batch(b)?,
        )?;
    }

    let dir = tempfile::tempdir()?;
    let root = dir.path().to_str().context("utf-8 tempdir")?;
    let store = keel_store::RunStore::open(root)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut parent = None;
    for (i, data) in seed_positions().into_iter().enumerate() {
        let ckpt = keel_store::NewCheckpoint {
            parent: parent.clone(),
            step: 3 * (i as u64 + 1),
            policy_version: 3 * (i as u64 + 1),
            config_hash: "9f2c6a0d".into(),
            reference: parent.clone(),
            tags: if i == 0 {
                vec!["healthy".into()]
            } else {
                vec![]
            },
            data,
            metrics: [
                ("loss".to_string(), 0.25),
                ("rollout_success".to_string(), 0.5),
            ]
            .into(),
            files: vec![(
                "model.safetensors".into(),
                bytes::Bytes::from_static(b"weights"),
            )],
        };
        let m = rt.block_on(store.commit_checkpoint(ckpt))?;
        let bytes = std::fs::read(
            dir.path()
                .join(format!("checkpoints/{}/MANIFEST.json", m.id)),
        )?;
        let mut input = format!("{}\n", m.id).into_bytes();
        input.extend(bytes);
        put(corpus, "manifest", &format!("{i}.json"), &input)?;
        parent = Some(m.id);
    }
    let head = std::fs::read(dir.path().join("branches/main/HEAD.0000000002"))?;
    put(
        corpus,
        "head_and_tag",
        "head",
        &[b"H\n".as_slice(), &head].concat(),
    )?;
    put(corpus, "head_and_tag", "generation", b"G\nHEAD.0000000012")?;
    let id = parent.unwrap_or_default();
    put(
        corpus,
        "head_and_tag",
        "tag",
        format!("T\ntags/healthy/{id}").as_bytes(),
    )?;

    let base = targets::delta_base();
    let mut small = base.clone();
    small[100] ^= 0x5a;
    small[3000] = 7;
    let mut large = base.clone();
    for (i, b) in large.iter_mut().enumerate().step_by(3) {
        *b = b.wrapping_add(i as u8);
    }
    for (name, new) in [("small", small), ("large", large)] {
        let delta =
            keel_store::weights::encode_delta(&new, &base)?.context("a delta of equal lengths")?;
        put(corpus, "weights_delta", name, &delta)?;
    }

    let view = r#"{"agent_id":0,"anchor_state":"room 3 key","admissible_actions":["go north","take key"],"oracle_action":"take key","success":false,"turns":1,"done":false}"#;
    let answers = [
        (
            "info",
            r#"{"name":"grid","max_turns":8,"vocabulary":["go","north","take","key","room","3"]}"#
                .to_string(),
        ),
        (
            "reset",
            format!(r#"{{"session":"s-1","prompt":"you are in room 3","view":{view}}}"#),
        ),
        (
            "step",
            format!(
                r#"{{"outcome":{{"observation":"you see a key","reward":0.0,"done":false,"invalid_action":false}},"view":{view}}}"#
            ),
        ),
        (
            "snapshot",
            r#"{"state":{"room":3,"inventory":["key"],"turn":1}}"#.to_string(),
        ),
        ("restore", format!(r#"{{"session":"s-2","view":{view}}}"#)),
    ];
    for (path, body) in answers {
        put(
            corpus,
            "env_answer",
            path,
            format!("{path}\n{body}").as_bytes(),
        )?;
    }

    let edits = [
        r#"{"edits":[{"op":"add","kind":"skill","task_type":"pick","text":"go to the kitchen","cites":[0]}]}"#,
        r#"{"edits":[{"op":"add","kind":"mistake","task_type":null,"text":"look","cites":[]},{"op":"update","id":0,"text":"go to the room","cites":[0]},{"op":"delete","id":1}]}"#,
        r#"{"edits":[]}"#,
    ];
    for (i, e) in edits.iter().enumerate() {
        put(
            corpus,
            "reviewer_answer",
            &format!("{i}.json"),
            e.as_bytes(),
        )?;
    }
    println!("wrote the seed corpus under {}", corpus.display());
    Ok(())
}

/// Data positions of the seed manifests: a plain one, one with work in flight and method state,
/// one with skipped ranges and a legacy one without a resume index.
fn seed_positions() -> Vec<keel_store::DataPosition> {
    use keel_store::DataPosition;
    vec![
        DataPosition {
            next_task_index: 36,
            next_batch_seq: 6,
            consumed_batches: vec![3, 4, 5],
            consumed_tasks: vec![18, 24, 30],
            pending_batch_seqs: Some(vec![]),
            ..DataPosition::default()
        },
        DataPosition {
            next_task_index: 72,
            next_batch_seq: 13,
            consumed_batches: vec![6, 7, 9],
            pending_tasks: vec![54, 66],
            consumed_tasks: vec![36, 42, 60],
            dropped_batches: vec![8],
            pending_batch_seqs: Some(vec![10, 12]),
            method_state: [(
                "guard".to_string(),
                r#"{"rewinds":1,"lr_factor":0.5,"consecutive_skips":0}"#.to_string(),
            )]
            .into(),
            ..DataPosition::default()
        },
        DataPosition {
            next_task_index: 90,
            next_batch_seq: 16,
            consumed_batches: vec![13, 14, 15],
            consumed_tasks: vec![72, 84],
            skipped_tasks: vec![78],
            pending_tasks: vec![66],
            pending_batch_seqs: None,
            ..DataPosition::default()
        },
    ]
}
