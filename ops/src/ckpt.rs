//! `keel ckpt list | lineage | show | tag | verify | gc`: checkpoint housekeeping over the
//! store's lineage API.
//!
//! Invariant CKL-1: `list` and `lineage` work on a run root whose heads or manifests are damaged
//! (the store's survey, SY-1): they show every readable checkpoint, mark what is damaged and name
//! the checkpoint to resume from with the command that does it (SY-2).

use std::time::Duration;

use anyhow::{Context, Result};
use keel_store::{RunStore, Survey};

fn open(run_root: &str) -> Result<(RunStore, tokio::runtime::Runtime)> {
    let store =
        RunStore::open(run_root).with_context(|| format!("cannot open run root {run_root}"))?;
    let rt = keel_actors::process::current_thread_runtime()?;
    Ok((store, rt))
}

/// `keel ckpt list`: every readable checkpoint, heads marked, damage reported (CKL-1).
pub fn list(run_root: &str) -> Result<()> {
    let (store, rt) = open(run_root)?;
    let survey = rt.block_on(store.survey())?;
    if survey.manifests.is_empty() && survey.unreadable.is_empty() {
        println!("no checkpoints under {run_root}");
        return report_damage(&survey);
    }
    let heads = survey.intact_heads();
    println!(
        "{:<20} {:>6} {:>8} {:<20} {:<16} {:>8}",
        "id", "step", "version", "parent", "tags", "eval"
    );
    for m in &survey.manifests {
        let mark = crate::lineage::head_marks(&heads, &m.id);
        let eval = m
            .metrics
            .get("eval_success_before")
            .map(|v| format!("{v:.3}"))
            .unwrap_or_else(|| "-".into());
        println!(
            "{:<20} {:>6} {:>8} {:<20} {:<16} {:>8}{mark}",
            m.id,
            m.step,
            m.policy_version,
            m.parent.as_deref().unwrap_or("-"),
            m.tags.join(","),
            eval
        );
    }
    report_damage(&survey)
}

/// `keel ckpt lineage`: the checkpoints as a tree, damage reported (CKL-1).
pub fn lineage(run_root: &str) -> Result<()> {
    let (store, rt) = open(run_root)?;
    let survey = rt.block_on(store.survey())?;
    if survey.manifests.is_empty() {
        println!("no checkpoints under {run_root}");
    } else {
        let added = rt.block_on(store.added_tags())?;
        let tagged: Vec<_> = survey
            .manifests
            .iter()
            .map(|m| RunStore::with_added_tags(m.clone(), &added))
            .collect();
        print!(
            "{}",
            crate::lineage::render_tree(&tagged, &survey.intact_heads())
        );
    }
    report_damage(&survey)
}

/// CKL-1: the unreadable manifests and damaged heads, each head with the checkpoint to resume
/// from (SY-2).
fn report_damage(survey: &Survey) -> Result<()> {
    for (id, why) in &survey.unreadable {
        println!("damaged: checkpoint {id}: {why}");
    }
    for h in survey.heads.iter().filter(|h| h.damage.is_some()) {
        let why = h.damage.as_deref().unwrap_or_default();
        println!("damaged: the head of branch {}: {why}", h.branch);
        match &h.resume_from {
            Some(m) => println!(
                "  resume from {} (step {}, the newest readable checkpoint of {}): \
                 keel train --config <your config> --from {}",
                m.id, m.step, h.branch, m.id
            ),
            None => println!(
                "  branch {} has no readable checkpoint: start again or restore the run root",
                h.branch
            ),
        }
    }
    Ok(())
}

/// `keel ckpt show <id>`: the manifest (tags added after commit merged in) as JSON.
pub fn show(run_root: &str, id: &str) -> Result<()> {
    let (store, rt) = open(run_root)?;
    let manifest = rt.block_on(store.checkpoint(id))?;
    let added = rt.block_on(store.added_tags())?;
    let manifest = RunStore::with_added_tags(manifest, &added);
    println!("{}", serde_json::to_string_pretty(&manifest)?);
    Ok(())
}

/// `keel ckpt tag <id> <tag>`.
pub fn tag(run_root: &str, id: &str, tag: &str) -> Result<()> {
    let (store, rt) = open(run_root)?;
    rt.block_on(store.tag_checkpoint(id, tag))
        .with_context(|| format!("cannot tag {id}"))?;
    println!("tagged {id} {tag}");
    Ok(())
}

/// `keel ckpt verify <id>`: re-reads every blob and checks its size and crc32.
pub fn verify(run_root: &str, id: &str) -> Result<()> {
    let (store, rt) = open(run_root)?;
    let manifest = rt.block_on(store.checkpoint(id))?;
    let files = rt
        .block_on(store.verify_checkpoint(&manifest))
        .with_context(|| format!("checkpoint {id} failed verification"))?;
    let bytes: usize = files.iter().map(|(_, b)| b.len()).sum();
    println!(
        "ok: {id}: {} files, {bytes} bytes, sizes and crc32s match the manifest",
        files.len()
    );
    Ok(())
}

/// `keel ckpt gc`: lineage-aware retention (GC-1..7); `dry_run` only prints the plan.
pub fn gc(run_root: &str, keep_last: usize, orphan_min_age_s: u64, dry_run: bool) -> Result<()> {
    let (store, rt) = open(run_root)?;
    let plan = rt.block_on(store.plan_gc(keep_last, Duration::from_secs(orphan_min_age_s)))?;
    for (id, why) in &plan.keep {
        println!("keep     {id}  ({why})");
    }
    for id in &plan.collect {
        println!("collect  {id}");
    }
    for key in &plan.orphans {
        println!("orphan   {key}");
    }
    for key in &plan.stale_heads {
        println!("old head {key}");
    }
    for key in &plan.stale_state {
        println!("state    {key}");
    }
    if let (Some(first), Some(last)) = (plan.stale_batches.first(), plan.stale_batches.last()) {
        // A long run holds thousands: one line, not one per batch.
        println!(
            "batches  {} no kept checkpoint can reuse: {first} … {last}",
            plan.stale_batches.len()
        );
    }
    let summary = format!(
        "{} kept, {} checkpoints to collect, {} orphan objects, {} old head generations, {} unnamed method state objects, {} used rollout batches",
        plan.keep.len(),
        plan.collect.len(),
        plan.orphans.len(),
        plan.stale_heads.len(),
        plan.stale_state.len(),
        plan.stale_batches.len()
    );
    if dry_run {
        println!("dry run: {summary}; nothing was deleted");
        return Ok(());
    }
    rt.block_on(store.apply_gc(&plan))?;
    println!("done: {summary}");
    Ok(())
}
