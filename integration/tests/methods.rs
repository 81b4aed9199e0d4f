//! The seed methods end to end (issue 7; spec algorithms.md §2–§9): one short real `keel train`
//! run per method, each checked for the method's own invariant through the run root alone
//! (stored batches, checkpoints, the metrics log), not just for finishing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use keel_integration::events::{
    assert_finite_metrics, method_records, rewinds, step_events, train_events, StepEvent,
};
use keel_integration::{
    checkpoint_file, checkpoints, run_train, seed_bank_version, stored_batches, train_method,
    MethodRun,
};
use keel_store::{RolloutBatch, Source, Trajectory};
use serde_json::Value;

const GROUP: usize = 4; // MethodRun's rollout.group_size
const REFERENCE_RESET_TAG: &str = keel_actors::method::armor::REFERENCE_RESET_TAG;

/// `batch_seq → step` of every trained batch.
fn trained_at(steps: &[StepEvent]) -> BTreeMap<u64, u64> {
    steps.iter().map(|s| (s.batch_seq, s.step)).collect()
}

fn by_group(batch: &RolloutBatch) -> BTreeMap<u64, Vec<&Trajectory>> {
    let mut groups: BTreeMap<u64, Vec<&Trajectory>> = BTreeMap::new();
    for t in &batch.trajectories {
        groups.entry(t.group_id).or_default().push(t);
    }
    groups
}

/// SAMPO (§2): dynamic sampling re-rolls uniform groups from the first update (cold start 0),
/// a re-rolled group is swapped in whole, and every turn carries the env's anchor key (GiGPO).
#[test]
fn sampo_rerolls_uniform_groups_and_records_anchor_keys() {
    let mut run = MethodRun::new("sampo");
    run.learner = "dynamic_sampling_cold_start = 0\n".into();
    let (_dir, root, _, events) = train_method(&run, "sampo");
    let max_tries = 3; // the preset's (spec §2: 3 generation passes)

    // GN-5: a batch left with uniform groups used every pass; one that stopped early has none.
    let gens = method_records(&events, "generate");
    assert!(!gens.is_empty(), "no generate events");
    for (step, d) in &gens {
        let tries = d.tries.unwrap_or(1);
        let uniform = d.uniform_groups.unwrap_or(0);
        assert!((1..=max_tries).contains(&tries), "step {step}: {d:?}");
        assert!(
            uniform == 0 || tries == max_tries,
            "step {step}: uniform groups left after only {tries} passes: {d:?}"
        );
    }
    assert!(
        gens.iter().any(|(_, d)| d.tries.unwrap_or(1) > 1),
        "dynamic sampling never re-rolled a group: {gens:?}"
    );

    eprintln!(
        "sampo passes per batch: {:?}",
        gens.iter()
            .map(|(_, d)| (d.tries, d.uniform_groups))
            .collect::<Vec<_>>()
    );
    let batches = stored_batches(&root);
    assert_eq!(batches.len(), 6);
    for b in &batches {
        for (g, trajs) in by_group(b) {
            // A group is one pass's episodes (re-rolled groups replace the old one whole):
            // trajectory ids are batch_seq·10⁶ + pass·10⁴ + plan index.
            let passes: BTreeSet<u64> = trajs
                .iter()
                .map(|t| t.trajectory_id / 10_000 % 100)
                .collect();
            assert_eq!(
                passes.len(),
                1,
                "batch {} group {g} mixes passes {passes:?}",
                b.batch_seq
            );
            assert!(
                trajs.len() <= GROUP,
                "batch {} group {g}: {} episodes",
                b.batch_seq,
                trajs.len()
            );
            // RO-7 / EN-8: every turn has the anchor key of the state it answered; group
            // members reset with the same seed, so their first states share it.
            for t in &trajs {
                assert_eq!(t.task_id, g);
                assert!(!t.turns.is_empty());
                for turn in &t.turns {
                    assert_ne!(
                        turn.anchor_key, 0,
                        "batch {} traj {}: no anchor key",
                        b.batch_seq, t.trajectory_id
                    );
                    assert!(
                        turn.anchor_state.is_empty(),
                        "texts only for similarity groups"
                    );
                }
            }
            let first: BTreeSet<u64> = trajs.iter().map(|t| t.turns[0].anchor_key).collect();
            assert_eq!(
                first.len(),
                1,
                "batch {} group {g}: turn-0 anchor keys {first:?}",
                b.batch_seq
            );
        }
    }
    let steps = step_events(&events);
    assert_eq!(steps.len(), 6);
    for s in &steps {
        assert_finite_metrics(s, "sampo");
        assert!(s.metrics.groups_kept <= s.metrics.groups_total);
        assert!(s.metrics.actor_steps > 0.0);
    }
}

/// SAMPO with GiGPO's similarity option (ARL-Arena `enable_similarity`): every stored turn
/// carries the text of the state it answered (the text its anchor key hashes), and the learner
/// trains on groups by that text (a run without stored texts is refused: `targets` tests).
#[test]
fn sampo_similarity_groups_store_anchor_states_and_train() {
    let mut run = MethodRun::new("sampo");
    run.learner = "dynamic_sampling_cold_start = 0\ngigpo_similarity = 0.5\n".into();
    let (_dir, root, _, events) = train_method(&run, "sampo-similarity");
    let batches = stored_batches(&root);
    assert_eq!(batches.len(), 6);
    for b in &batches {
        for t in &b.trajectories {
            for turn in &t.turns {
                assert!(
                    !turn.anchor_state.is_empty(),
                    "batch {}: no anchor state",
                    b.batch_seq
                );
                assert_eq!(
                    keel_envs::fnv1a64(turn.anchor_state.as_bytes()),
                    turn.anchor_key
                );
            }
        }
    }
    let steps = step_events(&events);
    assert_eq!(steps.len(), 6);
    for s in &steps {
        assert_finite_metrics(s, "sampo-similarity");
        assert!(s.metrics.actor_steps > 0.0);
    }
}

/// SAO (§3): single rollouts in async mode; the first `critic_warmup` updates train the critic
/// only, and every trained token's ratio to the behaviour policy lies inside the DIS band.
#[test]
fn sao_warms_up_the_critic_and_trains_inside_the_dis_band() {
    let mut run = MethodRun::new("sao");
    run.mode = "async";
    run.bound = 2;
    run.group_size = 1;
    run.learner = "critic_warmup = 2\n".into();
    let (_dir, _root, _, events) = train_method(&run, "sao");
    let steps = step_events(&events);
    assert_eq!(steps.len(), 6);
    let (low, high) = (0.3, 5.0); // the preset's band (1 − 0.3, 1 + 5.0)
    eprintln!(
        "sao lags: {:?}",
        steps.iter().map(|s| s.max_lag).collect::<Vec<_>>()
    );
    for s in &steps {
        let step = s.step;
        assert_finite_metrics(s, "sao");
        assert!(s.max_lag <= 2, "over the bound: {s:?}");
        let (actor, critic) = (s.metrics.actor_steps, s.metrics.critic_steps);
        if step <= 2 {
            assert_eq!(actor, 0.0, "step {step} is a critic warm-up update");
            assert!(critic > 0.0, "step {step}: no critic step during warm-up");
            continue;
        }
        assert!(actor > 0.0, "step {step}: no actor step after the warm-up");
        let (lo, hi) = (s.metrics.dis_kept_ratio_min, s.metrics.dis_kept_ratio_max);
        assert!(
            1.0 - low < lo && lo <= hi && hi < 1.0 + high,
            "step {step}: kept ratios [{lo}, {hi}] outside the DIS band"
        );
        assert!((0.0..=1.0).contains(&s.metrics.dis_masked_frac));
    }
}

/// ARMOR (§4): anchor episodes from the reference join only informative groups, one successful
/// anchor at most; the mixed ratio is a mediant of 1 and the plain ratio; reference resets are
/// checkpoints tagged `reference-reset` that later checkpoints name (MS-3).
#[test]
fn armor_keeps_successful_anchors_and_resets_the_reference() {
    let mut run = MethodRun::new("armor");
    run.checkpoint_every = 1;
    // Dynamic sampling (the preset's) re-rolls groups without a successful anchor, so anchors
    // show up in 6 steps; 3 passes instead of 10 keep the test short.
    run.learner = "dynamic_sampling_tries = 3\n".into();
    run.extra = "[armor]\nanchor_episodes = 2\nreference_reset_every = 3\n".into();
    let (_dir, root, _, events) = train_method(&run, "armor");
    let steps = step_events(&events);
    let at = trained_at(&steps);

    // GN-7: the stored groups.
    let mut anchored_batches = BTreeSet::new();
    for b in &stored_batches(&root) {
        for (g, trajs) in by_group(b) {
            let on: Vec<f32> = trajs
                .iter()
                .filter(|t| t.source == Source::OnPolicy)
                .map(|t| t.final_reward)
                .collect();
            let anchors: Vec<&&Trajectory> = trajs
                .iter()
                .filter(|t| t.source == Source::Anchor)
                .collect();
            assert!(
                anchors.len() <= 1,
                "batch {} group {g}: {} anchors",
                b.batch_seq,
                anchors.len()
            );
            if let Some(a) = anchors.first() {
                assert!(
                    a.final_reward >= 1.0,
                    "batch {} group {g}: a failed anchor",
                    b.batch_seq
                );
                assert!(
                    on.windows(2).any(|w| w[0] != w[1]),
                    "batch {} group {g}: an anchor in a uniform group {on:?}",
                    b.batch_seq
                );
                anchored_batches.insert(b.batch_seq);
            }
        }
    }
    eprintln!("armor: batches with an anchor episode: {anchored_batches:?}");
    assert!(
        !anchored_batches.is_empty(),
        "no anchor episode was kept in 6 steps"
    );
    for s in &steps {
        assert_finite_metrics(s, "armor");
        let tokens = s.metrics.anchor_tokens;
        assert_eq!(
            tokens > 0.0,
            anchored_batches.contains(&s.batch_seq),
            "step {}: anchor_tokens {tokens} vs stored anchors",
            s.step
        );
        if tokens > 0.0 {
            let (mixed, plain) = (
                s.metrics.anchor_mixed_ratio_max,
                s.metrics.anchor_plain_ratio_max,
            );
            assert!(
                mixed <= plain.max(1.0) + 1e-6,
                "step {}: mixed {mixed} > max(1, {plain})",
                s.step
            );
        }
    }
    assert_eq!(at.len(), 6, "six trained batches");

    // MS-3: resets at 3 and 6; checkpoints after a reset name it; the reference weights are
    // the policy at the reset (and the SFT policy before the first).
    let resets: Vec<u64> = method_records(&events, "armor")
        .iter()
        .map(|(_, d)| d.reference_reset_at.expect("reset step"))
        .collect();
    assert_eq!(resets, vec![3, 6]);
    let ckpts = checkpoints(&root);
    let steps_of: Vec<u64> = ckpts.iter().map(|m| m.step).collect();
    assert_eq!(steps_of, (0..=6).collect::<Vec<_>>());
    let tagged: Vec<u64> = ckpts
        .iter()
        .filter(|m| m.tags.iter().any(|t| t == REFERENCE_RESET_TAG))
        .map(|m| m.step)
        .collect();
    assert_eq!(tagged, vec![3, 6]);
    let (sft, reset3, reset6) = (&ckpts[0], &ckpts[3], &ckpts[6]);
    for m in &ckpts[1..] {
        let named = if m.step <= 3 { &sft.id } else { &reset3.id };
        assert_eq!(
            m.reference.as_ref(),
            Some(named),
            "checkpoint {} names the wrong reference",
            m.id
        );
    }
    let model = |m| checkpoint_file(&root, m, "model.safetensors");
    let reference = |m| checkpoint_file(&root, m, "reference.safetensors");
    for m in &ckpts[1..] {
        let want = match m.step {
            1..=2 => model(sft),
            3..=5 => model(reset3),
            _ => model(reset6),
        };
        assert!(
            reference(m) == want,
            "checkpoint {}: reference weights are not the last reset's policy",
            m.id
        );
    }
    assert!(
        model(reset3) != model(sft),
        "RL did not move the policy before the reset"
    );
}

fn sorl(algo: &'static str, mode: &'static str, bound: u64) {
    let mut run = MethodRun::new(algo);
    run.mode = mode;
    run.bound = bound;
    let (_dir, _root, _, events) = train_method(&run, algo);
    let steps = step_events(&events);
    assert_eq!(steps.len(), 6, "{algo}");
    for s in &steps {
        assert_finite_metrics(s, algo);
        assert!(s.max_lag <= bound, "{algo}: {s:?}");
        assert!(s.metrics.actor_steps > 0.0);
        // The turn ratios are reported (the JSON has them) and, the ratio being taken against
        // the behaviour log-probs, stay near 1 on these small updates: a ratio taken against
        // anything else (or not per turn) would not. Whether CTN fires exactly where it must
        // is checked on a constructed batch (keel-learner so1_ctn_fires_exactly_...).
        let (lo, hi) = (s.metrics.turn_ratio_min, s.metrics.turn_ratio_max);
        assert!(
            lo > 0.5 && hi < 2.0,
            "{algo} step {}: turn ratios min {lo} max {hi}",
            s.step
        );
    }
}

/// SORL (§6) with GRPO advantages, sync: turn-level ratio statistics on every update.
#[test]
fn so_grpo_sync_reports_turn_ratios() {
    sorl("so_grpo", "sync", 0);
}

/// SORL (§6) with a critic, async (bound 1): turn-level ratios, staleness within the bound.
#[test]
fn so_ppo_async_reports_turn_ratios_within_the_bound() {
    sorl("so_ppo", "async", 1);
}

/// RTPO (§7, MS-1, GN-6, RO-5): each tree trains its depths in reverse turn order (depth 0 =
/// the last turn); siblings branch from the trunk's recorded boundary (context tokens masked out,
/// the branched turn first), one group per (task, depth).
#[test]
fn rtpo_branches_every_depth_in_reverse_turn_order_from_the_trunk() {
    let run = MethodRun::new("rtpo");
    let (_dir, root, _, events) = train_method(&run, "rtpo");
    let steps = step_events(&events);
    let at = trained_at(&steps);

    // Depth order per tree.
    let mut trees: BTreeMap<u64, Vec<(u64, u64, u64)>> = BTreeMap::new(); // first_task → (depth, depths, batch_seq)
    let mut depth_of_batch = BTreeMap::new();
    for (_, d) in method_records(&events, "rtpo") {
        let (first, depth, depths, seq) = (
            d.first_task.expect("first_task"),
            d.depth.expect("depth"),
            d.depths.expect("depths"),
            d.batch_seq.expect("batch_seq"),
        );
        trees.entry(first).or_default().push((depth, depths, seq));
        depth_of_batch.insert(seq, (first, depth));
    }
    let trunk_depths: Vec<u64> = method_records(&events, "generate")
        .iter()
        .filter_map(|(_, d)| d.rtpo_trunk_depth)
        .collect();
    assert_eq!(trees.len(), trunk_depths.len(), "one tree per trunk batch");
    for ((first, tree), want) in trees.iter().zip(&trunk_depths) {
        let depths: Vec<u64> = tree.iter().map(|x| x.0).collect();
        assert!(
            tree.iter().all(|x| x.1 == *want),
            "tree {first}: depths changed: {tree:?}"
        );
        let complete = (0..*want).collect::<Vec<_>>();
        assert!(
            depths == complete
                || (first == trees.keys().last().expect("a tree") && complete.starts_with(&depths)),
            "tree {first}: depths trained {depths:?}, want {complete:?}"
        );
    }
    eprintln!("rtpo trees: {trees:?}");
    assert_eq!(depth_of_batch.len(), 6, "every step trains one depth");

    // The trunk records (GN-6).
    let mut boundaries: BTreeMap<u64, Vec<keel_actors::rollout::BoundaryState>> = BTreeMap::new();
    for entry in std::fs::read_dir(root.join("state/rtpo")).expect("state/rtpo") {
        let path = entry.expect("entry").path();
        let record = keel_actors::generator::TrunkRecord::from_bytes(
            &path.display().to_string(),
            &std::fs::read(&path).expect("trunk record"),
        )
        .expect("a trunk record");
        for t in record.trunks {
            boundaries.insert(t.task_id, t.boundaries);
        }
    }

    for b in &stored_batches(&root) {
        let (first, depth) = depth_of_batch[&b.batch_seq];
        let step = at[&b.batch_seq];
        assert!(!b.trajectories.is_empty());
        for (g, trajs) in by_group(b) {
            let task = trajs[0].task_id;
            assert!((first..first + 6).contains(&task));
            assert_eq!(
                g,
                keel_actors::generator::sibling_group(task, depth as usize),
                "batch {}: group id of task {task} at depth {depth}",
                b.batch_seq
            );
            let bounds = &boundaries[&task];
            let boundary = &bounds[bounds.len() - 1 - depth as usize];
            for t in &trajs {
                assert_eq!(t.task_id, task);
                assert_eq!(
                    t.trained_turn,
                    Some(0),
                    "batch {} traj {}",
                    b.batch_seq,
                    t.trajectory_id
                );
                let start = t.turns[0].start as usize;
                // RO-5: the context is the trunk's exact boundary, never trained on.
                assert_eq!(
                    &t.tokens[..start],
                    boundary.tokens.as_slice(),
                    "batch {} traj {}: context is not the boundary",
                    b.batch_seq,
                    t.trajectory_id
                );
                assert!(
                    t.loss_mask[..start].iter().all(|&m| m == 0),
                    "batch {} traj {}: a context token is trained",
                    b.batch_seq,
                    t.trajectory_id
                );
                for (i, &m) in t.loss_mask.iter().enumerate() {
                    if m == 1 {
                        assert!(t
                            .turns
                            .iter()
                            .any(|u| (u.start as usize..u.end as usize).contains(&i)));
                    }
                }
                assert_eq!(t.turns[0].agent_id, boundary.agent_id);
                assert_eq!(t.turns[0].anchor_key, boundary.anchor_key);
                // Branched with the weights current when the depth came up (sync: step − 1).
                assert!(t.turns.iter().all(|u| u.policy_version == step - 1));
            }
            assert!(trajs.len() <= GROUP);
        }
    }
    for s in &steps {
        assert_finite_metrics(s, "rtpo");
    }
}

/// Dr. MAS (§8, LA-4): agent 1 has its own model with its own learning rate; both models'
/// files are in every checkpoint and a resumed run restores both.
#[test]
fn dr_mas_trains_an_agent_model_and_resumes_it() {
    let mut run = MethodRun::new("dr_mas");
    run.steps = 4;
    run.env = "solver-verifier";
    run.difficulty = 2;
    run.context_len = 128;
    run.extra = "[[agent_models]]\nagents = [1]\nlr = 0.0005\n".into();
    let (dir, root, _, _) = train_method(&run, "drmas");

    let mut agents = BTreeSet::new();
    for b in &stored_batches(&root) {
        for t in &b.trajectories {
            agents.extend(t.turns.iter().map(|u| u.agent_id));
        }
    }
    assert_eq!(
        agents,
        BTreeSet::from([0, 1]),
        "turns of both agents are stored"
    );

    let learner_json = |m, name: &str| -> Value {
        serde_json::from_slice(&checkpoint_file(&root, m, name)).expect("learner.json")
    };
    let ckpts = checkpoints(&root);
    let at4 = ckpts
        .iter()
        .find(|m| m.step == 4)
        .expect("checkpoint at 4")
        .clone();
    for f in ["model.safetensors", "optimizer.safetensors", "learner.json"] {
        assert!(at4.files.iter().any(|e| e.name == f), "{f}");
        assert!(
            at4.files
                .iter()
                .any(|e| e.name == format!("agent-model-1.{f}")),
            "agent-model-1.{f}"
        );
    }
    let (main, agent) = (
        learner_json(&at4, "learner.json"),
        learner_json(&at4, "agent-model-1.learner.json"),
    );
    assert_eq!(agent["config"]["lr"], serde_json::json!(0.0005));
    assert_ne!(main["config"]["lr"], agent["config"]["lr"]);
    assert_eq!(
        (main["updates"].as_u64(), agent["updates"].as_u64()),
        (Some(4), Some(4))
    );
    let w1_at4 = checkpoint_file(&root, &at4, "agent-model-1.model.safetensors");
    assert!(
        w1_at4 != checkpoint_file(&root, &at4, "model.safetensors"),
        "the two models are one"
    );

    // Resume to 6 steps on the same root.
    let config = dir.path().join("drmas.toml");
    let summary = run_train(&config, &root, &["--steps", "6"]);
    assert_eq!(summary["resumed_from"], serde_json::json!(at4.id));
    assert_eq!(summary["final_step"], serde_json::json!(6));
    let at6 = checkpoints(&root)
        .into_iter()
        .find(|m| m.step == 6)
        .expect("checkpoint at 6");
    assert_eq!(at6.parent.as_deref(), Some(at4.id.as_str()));
    let agent6 = learner_json(&at6, "agent-model-1.learner.json");
    assert_eq!(
        agent6["updates"].as_u64(),
        Some(6),
        "agent model 1 continued from its checkpoint"
    );
    assert_eq!(agent6["config"]["lr"], serde_json::json!(0.0005));
    assert_eq!(
        agent6["agents"],
        serde_json::json!([1]),
        "the agent model records its agents"
    );
    assert!(checkpoint_file(&root, &at6, "agent-model-1.model.safetensors") != w1_at4);

    // `keel env eval --policy latest` plays each agent with its own model (LA-4), through the
    // one evaluation function (EV-4): a generator with the checkpoint's agent models.
    let out = std::process::Command::new(keel_integration::keel_bin())
        .args([
            "env",
            "eval",
            "solver-verifier",
            "--difficulty",
            "1",
            "--episodes",
            "8",
            "--policy",
            "latest",
            "--run-root",
        ])
        .arg(&root)
        .output()
        .expect("keel env eval");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("pass@1 (greedy)") && text.contains("avg@2 (T=1)"),
        "{text}"
    );
}

/// PATS (§5, MS-2, GN-8, RO-6): reviews after every step grow the bank; training prompts carry
/// the bank in force (its version recorded per trajectory, its `tip`/`avoid` entries in the
/// tokens); evaluation prompts never do.
/// LA-5: when only an agent model's update is non-finite, that model keeps its weights for
/// the step but its version moves with the main model's, so the run goes on (before, the
/// versions diverged and the run failed or refused every later batch as stale).
#[test]
fn dr_mas_a_non_finite_agent_model_update_keeps_the_versions_together() {
    let mut run = MethodRun::new("dr_mas");
    run.steps = 4;
    run.checkpoint_every = 1;
    run.env = "solver-verifier";
    run.difficulty = 2;
    run.context_len = 128;
    run.extra = "[[agent_models]]\nagents = [1]\nlr = 0.0005\n\n\
                 [faults]\nnan_loss_at_step = 2\nnan_loss_model = 1\n"
        .into();
    let (_dir, root, _, _) = train_method(&run, "drmas-nan");
    let ckpts = checkpoints(&root);
    let at = |step: u64| {
        ckpts
            .iter()
            .find(|m| m.step == step)
            .unwrap_or_else(|| panic!("a checkpoint at {step}"))
    };
    let file = |step, name: &str| checkpoint_file(&root, at(step), name);
    let updates = |step, name: &str| -> Option<u64> {
        let v: Value = serde_json::from_slice(&file(step, name)).expect("learner.json");
        v["updates"].as_u64()
    };
    assert_eq!(
        (
            updates(4, "learner.json"),
            updates(4, "agent-model-1.learner.json")
        ),
        (Some(4), Some(4)),
        "both models end at version 4"
    );
    let agent = "agent-model-1.model.safetensors";
    assert!(
        file(1, agent) == file(2, agent),
        "the agent model's poisoned update must leave its weights"
    );
    assert!(
        file(2, agent) != file(3, agent),
        "the agent model trains again"
    );
    assert!(
        file(1, "model.safetensors") != file(2, "model.safetensors"),
        "the main model's update of the same step went through"
    );
}

#[test]
fn pats_scaffolds_training_prompts_and_never_eval_prompts() {
    let mut run = MethodRun::new("pats");
    run.context_len = 64;
    run.extra = "[pats]\nrender_words = 24\n".into();
    let (_dir, root, _, events) = train_method(&run, "pats");
    let steps = step_events(&events);
    let at = trained_at(&steps);

    // A review after every trained step; versions only move forward, one review to the next.
    let reviews = method_records(&events, "pats");
    assert_eq!(
        reviews.iter().map(|r| r.0).collect::<Vec<_>>(),
        (1..=6).collect::<Vec<_>>()
    );
    // Step → bank version after its review; RL starts from the seed bank (PS-1).
    let seed = seed_bank_version(&root);
    assert!(seed > 0, "no seed bank");
    let mut version_after = BTreeMap::from([(0u64, seed)]);
    let mut last = seed;
    for (step, d) in &reviews {
        let (before, after) = (d.version_before.expect("v0"), d.version.expect("v1"));
        assert_eq!(
            before, last,
            "step {step}: review starts from another version"
        );
        assert!(after >= before);
        last = after;
        version_after.insert(*step, after);
    }
    assert!(last > 0, "the bank never changed in 6 reviews");

    // Generations report their prompt and scaffold tokens; the scaffold is there once the bank
    // has entries.
    for (step, d) in method_records(&events, "generate") {
        let (prompt, scaffold) = (
            d.prompt_tokens.expect("prompt_tokens"),
            d.scaffold_tokens.expect("scaffold_tokens"),
        );
        assert!(scaffold < prompt);
        assert_eq!(scaffold > 0, version_after[&step] > 0, "step {step}: {d:?}");
    }

    // Stored training trajectories: the bank version in force at sampling, rendered in the prompt.
    let tok = keel_envs::tokenizer_for(&keel_envs::EnvConfig::new("calc", 1)).expect("tokenizer");
    let mut scaffolded = 0;
    for b in &stored_batches(&root) {
        let sampled_at = at[&b.batch_seq] - 1;
        let want = version_after[&sampled_at];
        for t in &b.trajectories {
            assert_eq!(
                t.scaffold_version, want,
                "batch {} traj {}",
                b.batch_seq, t.trajectory_id
            );
            let prompt = tok
                .decode(&t.tokens[..t.turns.first().map_or(t.tokens.len(), |u| u.start as usize)]);
            let marked = prompt
                .split_whitespace()
                .any(|w| w == "tip" || w == "avoid");
            assert_eq!(marked, want > 0, "batch {} prompt {prompt:?}", b.batch_seq);
            scaffolded += usize::from(marked);
        }
    }
    assert!(scaffolded > 0);

    // The checkpoint names the stored state of the last version (MS-2).
    let head = checkpoints(&root).pop().expect("head");
    let pointer: Value = serde_json::from_str(&head.data.method_state["pats"]).expect("pointer");
    assert_eq!(pointer["version"].as_u64(), Some(last));
    let state = keel_envs::scaffold::ScaffoldState::from_json_bytes(
        &std::fs::read(root.join(pointer["key"].as_str().expect("key"))).expect("stored state"),
    )
    .expect("state");
    assert_eq!(state.bank().version(), last);

    // GN-8 at the generator: with that bank, an eval batch has no scaffold, a train batch does.
    eval_has_no_scaffold(&run, &root, &head, state.bank().clone());
}

/// Sends the same tasks to a real `Generator` as `Purpose::Eval` and as `Purpose::Train`, both
/// with `bank`: only the training prompts carry it.
fn eval_has_no_scaffold(
    run: &MethodRun,
    root: &Path,
    head: &keel_store::CheckpointManifest,
    bank: keel_envs::scaffold::Bank,
) {
    use keel_actors::env_shard::{EnvFactory, EnvShard, ShardOptions};
    use keel_actors::generator::{Decoding, Generate, Generator, GeneratorSetup, Purpose, Work};
    use keel_actors::rollout::TaskRef;
    use keel_actors::supervision::RestartBudget;
    use keel_actors::weights::{PublishedWeights, WeightBoard};

    tch::set_num_threads(1);
    let cfg = keel_actors::TrainConfig::from_toml(&run.toml()).expect("config");
    let env_cfg = cfg.env_config();
    let tokenizer = Arc::new(keel_envs::tokenizer_for(&env_cfg).expect("tokenizer"));
    let model = cfg
        .model_spec(&tokenizer, tch::Device::Cpu)
        .expect("model spec");
    let weights = checkpoint_file(root, head, "model.safetensors");
    let process = keel_actors::process::Process::start().expect("io");
    let scratch = tempfile::tempdir().expect("tempdir");
    let store = keel_store::RunStore::open(scratch.path().to_str().expect("utf8")).expect("store");
    let handle = process.io();
    let version = bank.version();
    let (eval, train, batch) = process.run_actors(async move {
        let factory: EnvFactory = Arc::new(move || keel_envs::build_env(&env_cfg));
        let budget = RestartBudget::new("env_shard", 4);
        let shard = actix::Supervisor::start(move |_| {
            EnvShard::with_options(factory.clone(), budget.clone(), ShardOptions::default())
        });
        let board = WeightBoard::default();
        board.publish(PublishedWeights::single(head.step, weights));
        let setup = GeneratorSetup {
            id: 0,
            run_id: "tiny".into(),
            seed: 11,
            env_name: "calc".into(),
            model,
            codec: Arc::new(cfg.chat_codec(&tokenizer).expect("codec")),
            shards: vec![shard],
            store: store.clone(),
            io: handle.clone(),
            board,
            budget: RestartBudget::new("generator", 4),
            group_size: 1,
            temperature: 1.0,
            max_turn_tokens: 5,
            context_len: cfg.model.context_len,
            anchor_episodes: 0,
            dynamic_sampling: None,
            keep_anchor_states: false,
            agent_model: Vec::new(),
            scaffold_words: 24,
            batch_invariant: true,
            follow_weights: false,
            stop: Default::default(),
            skip_weight_reload: false,
            engine: None,
        };
        let generator = actix::SyncArbiter::start(1, move || Generator::new(setup.clone()));
        let tasks: Vec<TaskRef> = (0..8)
            .map(|i| TaskRef {
                task_id: i,
                task_seed: keel_envs::task_seed(keel_envs::Split::Eval, i),
            })
            .collect();
        let bank = Arc::new(bank);
        let ask = |batch_seq, purpose| Generate {
            batch_seq,
            tasks: tasks.clone(),
            purpose,
            work: Work::Groups,
            scaffold: Some(bank.clone()),
        };
        let eval = generator
            .send(ask(
                1 << 40,
                Purpose::Eval(Decoding::Sampled { samples: 1 }),
            ))
            .await
            .expect("mailbox")
            .expect("eval");
        let train = generator
            .send(ask(0, Purpose::Train))
            .await
            .expect("mailbox")
            .expect("train");
        let key = train.key.clone().expect("a stored train batch");
        let batch = handle
            .spawn(async move { store.get_batch(&key).await.map(|b| b.to_owned()) })
            .await
            .expect("join")
            .expect("get")
            .expect("owned");
        (eval, train, batch)
    });
    assert!(eval.key.is_none(), "an evaluation batch was stored");
    assert_eq!(
        eval.stats.scaffold_tokens, 0,
        "evaluation prompts carry a scaffold"
    );
    assert!(
        train.stats.scaffold_tokens > 0,
        "training prompts carry no scaffold"
    );
    assert_eq!(
        eval.stats.prompt_tokens + train.stats.scaffold_tokens,
        train.stats.prompt_tokens,
        "the same tasks' prompts differ by more than the scaffold"
    );
    assert!(
        batch
            .trajectories
            .iter()
            .all(|t| t.scaffold_version == version),
        "stored training trajectories do not record bank version {version}"
    );
}

/// PATS under the collapse guard: a rewind restores the bank the healthy checkpoint names (the
/// bank goes back with the weights it was trained under), and reviews continue from it.
#[test]
fn pats_rewind_restores_the_bank_of_the_healthy_checkpoint() {
    let mut run = MethodRun::new("pats");
    run.context_len = 64;
    run.steps = 8;
    run.checkpoint_every = 3;
    run.extra =
        "[pats]\nrender_words = 24\n\n[faults]\nnan_loss_at_step = 5\nnan_loss_count = 3\n".into();
    let dir = tempfile::tempdir().expect("tempdir");
    let toml = run
        .toml()
        .replace("[guard]\nenabled = false", "[guard]\nenabled = true");
    let config = dir.path().join("pats.toml");
    std::fs::write(&config, toml).expect("config");
    let root = dir.path().join("pats");
    let summary = run_train(&config, &root, &[]);
    assert_eq!(summary["final_step"], serde_json::json!(8));
    let events = train_events(&root);
    let rewinds = rewinds(&events);
    assert_eq!(rewinds.len(), 1, "{rewinds:?}");
    let target = rewinds[0].to_checkpoint.clone();
    assert_eq!(rewinds[0].to_step, 3);
    // The bank version the healthy checkpoint (step 3) names.
    let target_ckpt = checkpoints(&root)
        .into_iter()
        .find(|c| c.id == target)
        .expect("target checkpoint on main");
    let pointer: Value =
        serde_json::from_str(&target_ckpt.data.method_state["pats"]).expect("pointer");
    let named = pointer["version"].as_u64().expect("version");
    let reviews = method_records(&events, "pats");
    // Reviews 1..=4 on main (step 4's review came after the checkpoint at 3), then step 4 again
    // on the rewind branch, starting from the checkpoint's bank.
    let steps: Vec<u64> = reviews.iter().map(|r| r.0).collect();
    assert_eq!(steps, vec![1, 2, 3, 4, 4, 5, 6, 7, 8], "{reviews:?}");
    let abandoned = reviews[3].1.version.expect("v");
    let again = reviews[4].1.version_before.expect("v0");
    assert_eq!(
        again, named,
        "the rewound review must start from the checkpoint's bank"
    );
    assert!(
        abandoned > named,
        "step 4's review on main changed the bank ({named} -> {abandoned})"
    );
}
