//! `keel data check FILE`: validates a prompt dataset file and shows it as the model will see
//! it: its format, row count and schema (the shape of its first row as keel reads it), the
//! verifiers, tools and data sources of its rows, prompt lengths in the model's tokens against
//! `model.context_len`, and the first rows with the chat template applied.
//!
//! Every row is parsed; bad rows are listed (file, row, field) and the command fails, so a file
//! that passes here loads in `keel train` with `env.name = "dataset"`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};

use keel_envs::dataset::{file, Row};
use keel_envs::{Dataset, DatasetConfig, Tokenizer};
use keel_learner::hf::ChatMessage;

/// Bad rows printed before the count.
const SHOWN_ERRORS: usize = 20;

/// `keel data ...`.
#[derive(Subcommand, Debug)]
pub enum DataCommand {
    /// Validate a dataset file; print its schema, row count and first rows as the model sees
    /// them (chat template applied, tokens counted, the longest prompt against the context).
    Check(CheckArgs),
}

/// `keel data check`.
#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The `.jsonl` or `.parquet` file.
    pub file: PathBuf,
    /// A run config: its `[env]` keys say where prompts and answers are and which verifier
    /// scores them; its model is the one whose tokens are counted.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Count tokens with this Hugging Face model folder's tokenizer and chat template (sets
    /// model.path; default: the config's model, else the built-in word-level one).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Rows to show rendered.
    #[arg(long, default_value_t = 3)]
    pub rows: usize,
}

/// Runs one `keel data` command.
pub fn run(cmd: DataCommand) -> Result<()> {
    match cmd {
        DataCommand::Check(args) => check(&args),
    }
}

fn check(args: &CheckArgs) -> Result<()> {
    let mut cfg = crate::load_config(args.config.as_deref())?;
    if let Some(dir) = &args.model {
        cfg.model.path = dir.to_string_lossy().into_owned();
        crate::default_context_to_model(&mut cfg, args.config.as_deref())?;
        // Everything `keel train` would refuse about the folder, before the rows.
        if let Some(m) = cfg.preflight().context("the model cannot be trained")? {
            println!(
                "model    {} ({:?}, {} layers, {} positions; model.context_len {}): config, weights and chat template pass",
                dir.display(),
                m.arch,
                m.num_hidden_layers,
                m.max_position_embeddings,
                cfg.model.context_len
            );
        }
        if let Some(line) = crate::generation_defaults(&cfg) {
            println!("sampling {line}");
        }
    }
    let data_cfg = DatasetConfig {
        train_file: args.file.clone(),
        eval_file: args.file.clone(),
        ..cfg.env.dataset.clone()
    };
    data_cfg.validate()?;
    let raw = file::read(&args.file)?;
    let name = args.file.display().to_string();
    let schema = data_cfg.schema();
    let (mut rows, mut bad) = (Vec::new(), Vec::new());
    for r in &raw.rows {
        match Row::parse(&r.value, &schema, &name, r.number) {
            Ok(row) => rows.push((r.number, row)),
            Err(e) => bad.push(e),
        }
    }
    println!("file     {name} ({:?})", raw.format);
    println!("rows     {}", raw.rows.len());
    println!("schema   (row {}, as keel reads it)", raw.rows[0].number);
    if let Some(fields) = raw.rows[0].value.as_object() {
        for (key, value) in fields {
            println!("  {key}: {}", file::shape(value));
        }
    }
    if !bad.is_empty() {
        for e in bad.iter().take(SHOWN_ERRORS) {
            eprintln!("error: {e}");
        }
        bail!(
            "{} of {} rows of {name} are bad{}",
            bad.len(),
            raw.rows.len(),
            if bad.len() > SHOWN_ERRORS {
                format!(" (the first {SHOWN_ERRORS} are listed)")
            } else {
                String::new()
            }
        );
    }
    print_tallies(&rows);
    let data = Dataset::load(&data_cfg)?;
    let words = Tokenizer::from_words(data.vocabulary());
    let codec = cfg
        .chat_codec(&words)
        .context("cannot build the model's chat codec")?;
    let mut lengths = Vec::with_capacity(rows.len());
    for (number, row) in &rows {
        let ids = codec.prompt(&preamble(row), row.prompt())?;
        lengths.push((ids.len(), *number));
    }
    let limit = cfg.model.context_len;
    let (longest, at) = lengths.iter().max().copied().unwrap_or((0, 0));
    let total: usize = lengths.iter().map(|(n, _)| n).sum();
    let over = lengths.iter().filter(|(n, _)| *n >= limit).count();
    println!(
        "prompt tokens  min {}  mean {:.1}  max {longest} (row {at}); context limit {limit} (model.context_len): {}",
        lengths.iter().map(|(n, _)| *n).min().unwrap_or(0),
        total as f64 / lengths.len().max(1) as f64,
        if over == 0 {
            "every prompt fits".to_string()
        } else {
            format!("{over} prompts leave no room for an answer")
        }
    );
    for (number, row) in rows.iter().take(args.rows) {
        let mut messages = preamble(row);
        messages.push(ChatMessage::new("user", row.prompt()));
        let text = codec.tokenizer().apply_chat_template(&messages, true)?;
        let tokens = codec.prompt(&preamble(row), row.prompt())?.len();
        println!(
            "--- row {number} ({}, {} verifier, {tokens} tokens) ---",
            source_name(row),
            row.verifier
        );
        println!("{text}");
        println!("--- ground truth: {}", row.ground_truths.join(" | "));
    }
    Ok(())
}

fn preamble(row: &Row) -> Vec<ChatMessage> {
    row.preamble()
        .iter()
        .map(|m| ChatMessage::new(&m.role, &m.content))
        .collect()
}

fn source_name(row: &Row) -> &str {
    if row.data_source.is_empty() {
        "no data_source"
    } else {
        &row.data_source
    }
}

fn print_tallies(rows: &[(usize, Row)]) {
    let mut verifiers: BTreeMap<String, usize> = BTreeMap::new();
    let mut sources: BTreeMap<&str, usize> = BTreeMap::new();
    let mut tools: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, row) in rows {
        *verifiers.entry(row.verifier.to_string()).or_default() += 1;
        *sources.entry(source_name(row)).or_default() += 1;
        for t in &row.tools {
            *tools.entry(t.word()).or_default() += 1;
        }
    }
    println!("verifiers      {}", list_of(&verifiers));
    println!("data sources   {}", list_of(&sources));
    if tools.is_empty() {
        println!("tools          none (every row is single-turn)");
    } else {
        println!(
            "tools          {} (rows with tools are multi-turn)",
            list_of(&tools)
        );
    }
}

fn list_of<K: std::fmt::Display>(m: &BTreeMap<K, usize>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}
