//! `keel ckpt show | tag | verify | gc`: checkpoint housekeeping over the store's lineage API.

use std::time::Duration;

use anyhow::{Context, Result};
use keel_store::RunStore;

fn open(run_root: &str) -> Result<(RunStore, tokio::runtime::Runtime)> {
    let store =
        RunStore::open(run_root).with_context(|| format!("cannot open run root {run_root}"))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    Ok((store, rt))
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
