//! `keel ckpt export CKPT OUT`: a checkpoint's policy as a Hugging Face folder that
//! `transformers` (`AutoModelForCausalLM`, `AutoTokenizer`), vLLM and SGLang load as it is, with
//! no merge or conversion step.
//!
//! Invariants:
//! - EXP-1: every blob is verified against the manifest (size, CRC32) before anything is written.
//! - EXP-2: the folder holds `config.json` (`*ForCausalLM`, HS-1), the policy's weights under HF
//!   names (a critic's value head is left out), and the checkpoint's tokenizer files.
//! - EXP-3: nothing is written unless all of it is: the folder is assembled beside `OUT` and
//!   renamed into place; an existing `OUT` is an error and is left untouched.
//! - EXP-4 (LoRA): a LoRA checkpoint's adapters go onto its base (the recorded folder or seed,
//!   or `--base DIR`), which must have the recorded hash (MD-6); the default export merges
//!   them (HS-3), `--peft` writes them unmerged in PEFT's format with the base's folder as
//!   `base_model_name_or_path`. `--peft` on a full fine-tune is an error.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use keel_learner::hf::tokenizer::{TOKENIZER_CONFIG_FILE, TOKENIZER_FILE};
use keel_learner::hf::HfModel;
use keel_learner::{model_from_checkpoint, policy_from_checkpoint};
use keel_store::RunStore;

/// How to export (EXP-4).
pub struct ExportOptions<'a> {
    /// Write a LoRA run's adapters unmerged, in PEFT's format.
    pub peft: bool,
    /// A LoRA run's base folder, overriding the recorded one.
    pub base: Option<&'a Path>,
}

/// Exports checkpoint `id` of `run_root` into the new folder `out` (EXP-1..4).
pub fn export(run_root: &str, id: &str, out: &Path, opts: &ExportOptions<'_>) -> Result<()> {
    if out.exists() {
        bail!(
            "{} already exists; choose a new folder (export never overwrites)",
            out.display()
        );
    }
    let store =
        RunStore::open(run_root).with_context(|| format!("cannot open run root {run_root}"))?;
    let rt = keel_actors::process::current_thread_runtime()?;
    let manifest = rt
        .block_on(store.checkpoint(id))
        .with_context(|| format!("no checkpoint {id} in {run_root}"))?;
    let files = rt
        .block_on(store.verify_checkpoint(&manifest))
        .with_context(|| format!("checkpoint {id} failed verification"))?;
    let file = |name: &str| {
        files
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, b)| b.as_ref())
            .with_context(|| format!("checkpoint {id} has no {name}"))
    };
    let (learner_json, weights) = (file("learner.json")?, file("model.safetensors")?);
    let policy: HfModel = if opts.peft {
        let model = model_from_checkpoint(learner_json, weights, opts.base)
            .with_context(|| format!("cannot read the adapters of checkpoint {id}"))?;
        if model.lora().is_none() {
            bail!(
                "checkpoint {id} is a full fine-tune, not LoRA adapters: export it without --peft"
            );
        }
        model
    } else {
        policy_from_checkpoint(learner_json, weights, opts.base)
            .with_context(|| format!("cannot read the policy of checkpoint {id}"))?
    };
    let staging = staging_dir(out)?;
    let written = (|| -> Result<()> {
        if opts.peft {
            let base = policy
                .source_dir()
                .map(|d| d.display().to_string())
                .unwrap_or_default();
            policy.save_peft(&staging, &base)
        } else {
            policy.save_pretrained(&staging)
        }
        .with_context(|| format!("cannot write {}", staging.display()))?;
        for name in [TOKENIZER_FILE, TOKENIZER_CONFIG_FILE] {
            let path = staging.join(name);
            std::fs::write(&path, file(name)?)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        std::fs::rename(&staging, out)
            .with_context(|| format!("cannot move the export into {}", out.display()))
    })();
    if written.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    written?;
    let what = if opts.peft {
        let n: i64 = policy
            .peft_tensors()
            .iter()
            .map(|(_, t)| t.numel() as i64)
            .sum();
        format!("{n} adapter parameters (PEFT format)")
    } else {
        format!("{} parameters", policy.config().n_params())
    };
    println!(
        "exported {id} (step {}, policy version {}) to {}: {what}",
        manifest.step,
        manifest.policy_version,
        out.display(),
    );
    Ok(())
}

/// A fresh folder beside `out` to assemble the export in (EXP-3).
fn staging_dir(out: &Path) -> Result<PathBuf> {
    let name = out
        .file_name()
        .with_context(|| format!("{} is not a folder name", out.display()))?
        .to_string_lossy();
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent)
        .with_context(|| format!("cannot create {}", parent.display()))?;
    let staging = parent.join(format!(".{name}.partial-{}", std::process::id()));
    if staging.exists() {
        std::fs::remove_dir_all(&staging)
            .with_context(|| format!("cannot clear {}", staging.display()))?;
    }
    Ok(staging)
}
