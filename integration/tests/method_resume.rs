//! Resume mid-method (issue 7): a `keel train` process is SIGKILLed at a chosen point of a
//! method's own state — a critic warm-up, a PATS review, an ARMOR reference reset, between two
//! depths of an RTPO tree, after the dynamic-sampling cold start — and restarted on the same run
//! root; the method continues exactly where the checkpoint says. Kills are deterministic: each
//! waits for a given line of the metrics log (or state object), with a simulated env latency
//! that keeps the next checkpoint well away.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use keel_actors::events::TrainEvent;
use keel_integration::events::{method_records, step_events, train_events};
use keel_integration::{
    checkpoint_file, checkpoints, head_lineage, kill_when, run_train, seed_bank_version,
    spawn_train, stored_batches, MethodRun,
};
use keel_store::CheckpointManifest;
use serde_json::Value;

const REFERENCE_RESET_TAG: &str = keel_actors::method::armor::REFERENCE_RESET_TAG;

/// A checkpoint event of `step` is in the log.
fn checkpointed(events: &[TrainEvent], step: u64) -> bool {
    events
        .iter()
        .any(|e| matches!(e, TrainEvent::Checkpoint { step: s, .. } if *s == step))
}

/// Life 1 of `run` on `<dir>/<name>`, killed once `ready` holds; answers (config, root, head).
fn killed_life(
    dir: &Path,
    run: &MethodRun,
    name: &str,
    what: &str,
    ready: impl Fn(&[TrainEvent]) -> bool,
) -> (std::path::PathBuf, std::path::PathBuf, CheckpointManifest) {
    let config = run.write(dir, name);
    let root = dir.join(name);
    let mut child = spawn_train(&config, &root, &[]);
    kill_when(&mut child, &root, what, ready);
    let head = head_lineage(&root).remove(0);
    (config, root, head)
}

/// Tensor names of a safetensors blob.
fn tensor_names(bytes: &[u8]) -> Vec<String> {
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("header length")) as usize;
    let header: BTreeMap<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).expect("header");
    header.into_keys().filter(|k| k != "__metadata__").collect()
}

/// SAO's critic survives a kill during its warm-up: the warm-up count goes on from the restored
/// version (actor steps start exactly after `critic_warmup` updates overall), and the critic (a
/// separate value model), both optimizers and the counters are restored exactly — in sync mode the killed-and-resumed run ends
/// bit-identical to an uninterrupted one.
#[test]
fn sao_resumed_mid_warmup_continues_the_critic_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut run = MethodRun::new("sao");
    run.group_size = 1;
    run.checkpoint_every = 1;
    run.latency_ms = 10.0;
    run.learner = "critic_warmup = 3\n".into();
    let (config, root, head) =
        killed_life(dir.path(), &run, "sao", "the checkpoint at step 2", |ev| {
            checkpointed(ev, 2)
        });
    assert_eq!(
        head.step, 2,
        "killed at step {} instead of mid-warm-up",
        head.step
    );
    let summary = run_train(&config, &root, &[]);
    assert_eq!(summary["resumed_from"], serde_json::json!(head.id));

    let steps = step_events(&train_events(&root));
    assert_eq!(
        steps.iter().map(|s| s.step).collect::<Vec<_>>(),
        (1..=6).collect::<Vec<_>>()
    );
    for s in &steps {
        let (step, actor) = (s.step, s.metrics.actor_steps);
        assert_eq!(
            actor == 0.0,
            step <= 3,
            "step {step}: actor_steps {actor} (warm-up is 3 updates)"
        );
        assert!(s.metrics.critic_steps > 0.0, "step {step}");
    }

    // SAO's critic is a separate value model (`critic.safetensors`, its own AdamW): the policy
    // file carries no value head, the critic file does, and the warm-up trains it.
    let ckpts = checkpoints(&root);
    let file = |m: &CheckpointManifest, f: &str| checkpoint_file(&root, m, f);
    let value_head = |bytes: &[u8]| {
        tensor_names(bytes)
            .into_iter()
            .filter(|n| n.starts_with("score."))
            .count()
    };
    assert_eq!(
        value_head(&file(&head, "model.safetensors")),
        0,
        "the policy has no value head"
    );
    assert!(
        value_head(&file(&head, "critic.safetensors")) > 0,
        "the checkpoint's critic has no value head"
    );
    let first = ckpts
        .iter()
        .find(|m| m.step == 1)
        .expect("the step-1 checkpoint");
    assert!(
        file(&head, "critic.safetensors") != file(first, "critic.safetensors"),
        "the warm-up did not train the critic"
    );
    assert!(
        file(&head, "model.safetensors") == file(first, "model.safetensors"),
        "the warm-up moved the policy"
    );

    let clean_config = run.write(dir.path(), "clean");
    let clean = dir.path().join("clean");
    run_train(&clean_config, &clean, &[]);
    let last = |root: &Path| checkpoints(root).pop().expect("head");
    let (a, b) = (last(&root), last(&clean));
    assert_eq!((a.step, b.step), (6, 6));
    for f in [
        "model.safetensors",
        "optimizer.safetensors",
        "critic.safetensors",
        "critic_optimizer.safetensors",
    ] {
        assert!(
            checkpoint_file(&root, &a, f) == checkpoint_file(&clean, &b, f),
            "{f}: the resumed run differs from the uninterrupted one"
        );
    }
}

/// PATS resumes from the bank its checkpoint names, even when the killed life had already
/// reviewed (and stored) the next version: every step is reviewed once, versions never go back,
/// and the trained prompts carry the version in force.
#[test]
fn pats_resumes_from_the_checkpointed_bank_and_keeps_reviewing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut run = MethodRun::new("pats");
    run.checkpoint_every = 2;
    run.context_len = 64;
    run.latency_ms = 5.0;
    run.extra = "[pats]\nrender_words = 24\n".into();
    let root_of = dir.path().join("pats");
    let state_root = root_of.clone();
    // Killed after step 3's review stored its bank version, before the checkpoint at 4: the
    // resumed run repeats step 3 from the checkpoint at 2.
    let (config, root, head) = killed_life(
        dir.path(),
        &run,
        "pats",
        "step 3's stored review",
        move |ev| {
            method_records(ev, "pats").iter().any(|(step, d)| {
                let v = d.version.unwrap_or(0);
                *step == 3
                    && (v == d.version_before.unwrap_or(0)
                        || std::fs::read_dir(state_root.join("state/pats"))
                            .into_iter()
                            .flatten()
                            .flatten()
                            .any(|f| {
                                f.file_name()
                                    .to_string_lossy()
                                    .starts_with(&format!("scaffold-{v:06}-"))
                            }))
            })
        },
    );
    assert_eq!(root, root_of);
    assert_eq!(head.step, 2);
    let pointer: Value =
        serde_json::from_str(&head.data.method_state["pats"]).expect("pats pointer");
    let resumed_version = pointer["version"].as_u64().expect("version");

    let summary = run_train(&config, &root, &[]);
    assert_eq!(summary["resumed_from"], serde_json::json!(head.id));
    let events = train_events(&root);
    let reviews = method_records(&events, "pats");
    assert_eq!(
        reviews.iter().map(|r| r.0).collect::<Vec<_>>(),
        (1..=6).collect::<Vec<_>>(),
        "one review after every trained step"
    );
    let seed = seed_bank_version(&root);
    let mut after = BTreeMap::from([(0u64, seed)]);
    let mut last = seed;
    for (step, d) in &reviews {
        let (v0, v1) = (d.version_before.expect("v0"), d.version.expect("v1"));
        assert_eq!(
            v0, last,
            "step {step}: the review does not continue the previous version"
        );
        assert!(v1 >= v0, "step {step}: the version went back");
        if *step == 3 {
            assert_eq!(
                v0, resumed_version,
                "the resumed run did not load the checkpoint's bank"
            );
        }
        last = v1;
        after.insert(*step, v1);
    }
    // Every later checkpoint names the version its step ended with.
    for m in checkpoints(&root).iter().filter(|m| m.step > 0) {
        let p: Value = serde_json::from_str(&m.data.method_state["pats"]).expect("pointer");
        assert_eq!(
            p["version"].as_u64(),
            Some(after[&m.step]),
            "checkpoint {}",
            m.id
        );
        assert!(
            root.join(p["key"].as_str().expect("key")).exists(),
            "checkpoint {} names a missing state",
            m.id
        );
    }
    // What was trained was sampled under the bank in force.
    let trained: BTreeMap<u64, u64> = step_events(&events)
        .iter()
        .map(|s| (s.batch_seq, s.step))
        .collect();
    for b in stored_batches(&root)
        .iter()
        .filter(|b| trained.contains_key(&b.batch_seq))
    {
        let want = after[&(trained[&b.batch_seq] - 1)];
        for t in &b.trajectories {
            assert_eq!(t.scaffold_version, want, "batch {}", b.batch_seq);
        }
    }
}

/// ARMOR resumed from its reference-reset checkpoint: that checkpoint is the reference of the
/// following ones, whose reference weights are its policy; the next reset comes on schedule.
#[test]
fn armor_resumed_at_a_reference_reset_keeps_that_reference() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut run = MethodRun::new("armor");
    run.checkpoint_every = 1;
    run.latency_ms = 5.0;
    run.learner = "dynamic_sampling_tries = 1\n".into(); // no re-rolls: not what this test is about
    run.extra = "[armor]\nanchor_episodes = 2\nreference_reset_every = 3\n".into();
    let (config, root, head) = killed_life(
        dir.path(),
        &run,
        "armor",
        "the reset checkpoint at step 3",
        |ev| checkpointed(ev, 3),
    );
    assert_eq!(head.step, 3);
    assert!(
        head.tags.iter().any(|t| t == REFERENCE_RESET_TAG),
        "{:?}",
        head.tags
    );
    let summary = run_train(&config, &root, &[]);
    assert_eq!(summary["resumed_from"], serde_json::json!(head.id));

    let ckpts = head_lineage(&root);
    let by_step: BTreeMap<u64, &CheckpointManifest> = ckpts.iter().map(|m| (m.step, m)).collect();
    assert_eq!(
        by_step.keys().copied().collect::<Vec<_>>(),
        (0..=6).collect::<Vec<_>>()
    );
    let resets: Vec<u64> = ckpts
        .iter()
        .rev()
        .filter(|m| m.tags.iter().any(|t| t == REFERENCE_RESET_TAG))
        .map(|m| m.step)
        .collect();
    assert_eq!(resets, vec![3, 6]);
    let model = |s: u64| checkpoint_file(&root, by_step[&s], "model.safetensors");
    for s in 4..=6 {
        let m = by_step[&s];
        assert_eq!(
            m.reference.as_deref(),
            Some(head.id.as_str()),
            "checkpoint {} after the resume",
            m.id
        );
        let want = model(if s < 6 { 3 } else { 6 });
        assert!(
            checkpoint_file(&root, m, "reference.safetensors") == want,
            "checkpoint {}: the reference weights are not the last reset's policy",
            m.id
        );
    }
    let armor: Vec<u64> = method_records(&train_events(&root), "armor")
        .iter()
        .map(|(s, _)| *s)
        .collect();
    assert_eq!(armor, vec![3, 6]);
}

/// RTPO killed between two depths of a tree continues that tree at the checkpoint's `next`
/// depth; killed again just after storing a new trunk, it samples that trunk again. Across all
/// lives every (tree, depth) is trained exactly once, in reverse turn order.
#[test]
fn rtpo_resumed_between_depths_trains_each_depth_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut run = MethodRun::new("rtpo");
    run.steps = 8;
    run.checkpoint_every = 1;
    run.latency_ms = 5.0;
    // Life 1: killed at the checkpoint right after a tree's depth 0, before its depth 1.
    let (config, root, head) = killed_life(
        dir.path(),
        &run,
        "rtpo",
        "a checkpoint inside a tree",
        |ev| {
            method_records(ev, "rtpo").iter().any(|(step, d)| {
                d.depth.unwrap_or(0) + 1 < d.depths.unwrap_or(0) && checkpointed(ev, *step)
            })
        },
    );
    let tree: keel_actors::method::rtpo::RtpoTree = serde_json::from_str(
        head.data
            .method_state
            .get("rtpo")
            .expect("a tree in the checkpoint"),
    )
    .expect("tree");
    assert!(0 < tree.next && tree.next < tree.depth, "{tree:?}");

    // Life 2: resumes the tree, finishes it, then is killed once it stored the next trunk.
    let trunks = |root: &Path| -> BTreeSet<String> {
        std::fs::read_dir(root.join("state/rtpo"))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    let before = trunks(&root);
    let mut child = spawn_train(&config, &root, &[]);
    let r = root.clone();
    kill_when(&mut child, &root, "a new trunk record", move |_| {
        trunks(&r).len() > before.len()
    });
    let second = head_lineage(&root).remove(0);

    // Life 3: to the end.
    let summary = run_train(&config, &root, &[]);
    assert_eq!(summary["resumed_from"], serde_json::json!(second.id));
    assert_eq!(summary["final_step"], serde_json::json!(8));
    let events = train_events(&root);
    let resumed: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            TrainEvent::Resumed { step, .. } => Some(*step),
            _ => None,
        })
        .collect();
    assert_eq!(resumed, vec![head.step, second.step]);

    // Each (tree, depth) once, depths 0, 1, … per tree; the resumed tree went on at `next`.
    let mut seen: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new(); // first_task → (depth, step)
    let mut depths_of = BTreeMap::new();
    let mut seqs = BTreeSet::new();
    for (step, d) in method_records(&events, "rtpo") {
        let first = d.first_task.expect("first_task");
        seen.entry(first)
            .or_default()
            .push((d.depth.expect("depth"), step));
        depths_of.insert(first, d.depths.expect("depths"));
        assert!(seqs.insert(d.batch_seq.expect("seq")));
    }
    assert_eq!(seqs.len(), 8, "one depth per step: {seen:?}");
    let last_tree = *seen.keys().last().expect("a tree");
    for (first, depths) in &seen {
        let order: Vec<u64> = depths.iter().map(|x| x.0).collect();
        let n = order.len() as u64;
        assert_eq!(
            order,
            (0..n).collect::<Vec<_>>(),
            "tree {first}: depths {depths:?}"
        );
        if *first != last_tree {
            assert_eq!(
                n, depths_of[first],
                "tree {first} was left unfinished: {depths:?}"
            );
        }
    }
    let resumed_tree = &seen[&tree.first_task];
    let next = resumed_tree
        .iter()
        .find(|(_, step)| *step > head.step)
        .expect("the tree went on after the resume");
    assert_eq!(
        next.0 as usize, tree.next,
        "the resumed tree skipped or repeated a depth: {resumed_tree:?}"
    );
    assert_eq!(
        resumed_tree.len(),
        tree.depth,
        "the resumed tree was not finished"
    );

    // The lineage trained each of those batches once, and each finished tree's range once.
    let lineage = head_lineage(&root);
    let mut consumed = BTreeSet::new();
    let mut ranges = BTreeSet::new();
    for m in &lineage {
        for &s in &m.data.consumed_batches {
            assert!(consumed.insert(s), "batch {s} trained twice");
        }
        for &t in &m.data.consumed_tasks {
            assert!(ranges.insert(t), "range {t} trained twice");
        }
    }
    assert_eq!(consumed, seqs);
    let finished: BTreeSet<u64> = seen
        .iter()
        .filter(|(f, _)| **f != last_tree || !lineage[0].data.method_state.contains_key("rtpo"))
        .map(|(f, _)| *f)
        .collect();
    assert_eq!(ranges, finished);
}

/// Dynamic sampling after a resume: the cold start counts policy versions, so a run resumed past
/// it keeps re-rolling uniform groups at once (and never re-rolled before it).
#[test]
fn dynamic_sampling_resumed_after_the_cold_start_keeps_rerolling() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut run = MethodRun::new("sampo");
    run.checkpoint_every = 1;
    run.latency_ms = 3.0;
    run.learner = "dynamic_sampling_cold_start = 3\n".into();
    let (config, root, head) = killed_life(
        dir.path(),
        &run,
        "sampo",
        "the checkpoint at step 3",
        |ev| checkpointed(ev, 3),
    );
    assert_eq!(head.step, 3);
    let summary = run_train(&config, &root, &[]);
    assert_eq!(summary["resumed_from"], serde_json::json!(head.id));

    let events = train_events(&root);
    let gens = method_records(&events, "generate");
    let mut rerolled_after_resume = false;
    for (step, d) in &gens {
        let tries = d.tries.unwrap_or(1);
        let uniform = d.uniform_groups.unwrap_or(0);
        if *step < 3 {
            assert_eq!(
                tries, 1,
                "version {step}: re-rolled before the cold start: {d:?}"
            );
        } else {
            assert!(
                uniform == 0 || tries == 3,
                "version {step}: uniform groups left after {tries} passes: {d:?}"
            );
            rerolled_after_resume |= *step > 3 && tries > 1;
        }
    }
    assert!(
        rerolled_after_resume,
        "the resumed run never re-rolled: {gens:?}"
    );
    // SAMPO's fill rule: what the last try left uniform is trained on, before the cold start
    // and after it.
    for s in step_events(&events) {
        assert_eq!(
            s.metrics.groups_kept, s.metrics.groups_total,
            "the learner dropped groups: {s:?}"
        );
    }
}
