//! The method runtimes' hooks without a run: selection, the plain defaults (MR-1), RTPO's tree
//! (MS-1, MR-2), ARMOR's reset schedule (MS-3) and what each asks of the generators.

use std::collections::BTreeMap;

use keel_learner::Algo;
use keel_store::RunStore;

use super::rtpo::{Rtpo, RtpoTree, RTPO_STATE};
use super::{select, MethodRuntime, Planned, StateKeys};
use crate::config::TrainConfig;
use crate::frontier::{Frontier, TaskCursor};
use crate::generator::{Generated, Work};
use crate::rollout::RolloutStats;

fn cfg(algo: Algo) -> TrainConfig {
    let mut cfg = TrainConfig::default();
    cfg.learner.algo = algo;
    cfg
}

fn keys(dir: &tempfile::TempDir) -> StateKeys {
    StateKeys {
        store: RunStore::open(&dir.path().to_string_lossy()).expect("store"),
        life_tag: "life".into(),
    }
}

fn cursor() -> TaskCursor {
    let start = Frontier {
        next_task: 0,
        pending: Vec::new(),
        next_batch_seq: 0,
    };
    TaskCursor::new(&start, 4)
}

/// A training generation's answer that stored no batch (RTPO's trunks).
fn unstored(batch_seq: u64, trunk_depth: Option<usize>) -> Generated {
    Generated {
        key: None,
        batch_seq,
        policy_version: 0,
        stats: RolloutStats::default(),
        tasks: Vec::new(),
        sample_seconds: 0.0,
        put_seconds: 0.0,
        tries: 1,
        uniform_groups: 0,
        trunk_depth,
        groups: Vec::new(),
    }
}

fn state(m: &dyn MethodRuntime) -> BTreeMap<String, String> {
    let mut s = BTreeMap::new();
    m.save_state(&mut s);
    s
}

#[test]
fn select_picks_the_runtime_of_the_configured_algo() {
    let cases = [
        (Algo::Rtpo, "rtpo"),
        (Algo::Pats, "pats"),
        (Algo::Armor, "armor"),
        (Algo::Sao, "sao"),
        (Algo::Sampo, "sampo"),
        (Algo::DrMas, "dr_mas"),
        (Algo::Grpo, "plain"),
        (Algo::Dapo, "plain"),
    ];
    for (algo, name) in cases {
        assert_eq!(select(&cfg(algo)).name(), name, "{algo:?}");
    }
}

#[test]
fn mr1_a_plain_method_takes_groups_from_the_cursor_and_keeps_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut m = select(&cfg(Algo::Grpo));
    let mut c = cursor();
    for first in [0, 4] {
        let p = m.next_work(first, &mut c, &keys(&dir));
        assert_eq!(
            (p.first_task, &p.work, p.held),
            (first, &Work::Groups, false)
        );
    }
    assert!(m.reuses_stored_batches());
    assert_eq!(m.held_range(), None);
    assert!(m.on_held_consumed(1).is_none());
    assert!(!m.resets_reference_at(10));
    assert!(m.scaffold().is_none());
    assert!(state(m.as_ref()).is_empty());
    let planned = Planned {
        first_task: 0,
        work: Work::Groups,
        held: false,
    };
    assert!(m.on_unstored(&planned, &unstored(0, None)).is_err());
}

#[test]
fn ms1_an_rtpo_range_is_one_trunk_then_every_depth_and_trained_after_the_last() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut m, mut c) = (Rtpo::default(), cursor());
    assert!(!m.reuses_stored_batches());
    let trunks = m.next_work(7, &mut c, &keys(&dir));
    let Work::Trunks { key } = &trunks.work else {
        panic!("expected trunks, got {:?}", trunks.work);
    };
    assert!(key.ends_with("rtpo/trunk-0000000007-life.json"), "{key}");
    assert!(!trunks.held);
    m.on_unstored(&trunks, &unstored(7, Some(2)))
        .expect("a tree");
    assert_eq!(m.held_range(), Some(trunks.first_task));
    let saved = state(&m);
    let tree = RtpoTree::from_state(&saved[RTPO_STATE]).expect("tree position");
    assert_eq!((tree.depth, tree.next, &tree.key), (2, 0, key));
    for depth in 0..2 {
        let p = m.next_work(8 + depth as u64, &mut c, &keys(&dir));
        assert_eq!(
            p.work,
            Work::Branches {
                key: key.clone(),
                depth
            }
        );
        assert_eq!((p.first_task, p.held), (trunks.first_task, true));
        let step = m.on_held_consumed(8 + depth as u64).expect("held");
        assert_eq!(step.detail.depth, Some(depth as u64));
        let trained = (depth == 1).then_some(trunks.first_task);
        assert_eq!(step.trained, trained, "depth {depth}");
    }
    assert_eq!(m.held_range(), None);
    assert!(state(&m).is_empty());
}

#[test]
fn ms1_trunks_without_a_turn_end_the_run_and_a_rewind_abandons_the_tree() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut m, mut c) = (Rtpo::default(), cursor());
    let trunks = m.next_work(0, &mut c, &keys(&dir));
    let err = m.on_unstored(&trunks, &unstored(0, Some(0))).unwrap_err();
    assert!(err.to_string().contains("context_len"), "{err}");
    m.on_unstored(&trunks, &unstored(0, Some(3)))
        .expect("a tree");
    m.abandon();
    assert_eq!(m.held_range(), None);
    assert!(matches!(
        m.next_work(1, &mut c, &keys(&dir)).work,
        Work::Trunks { .. }
    ));
}

#[test]
fn ms3_armor_resets_the_reference_every_n_steps_and_samples_anchors() {
    let mut c = cfg(Algo::Armor);
    c.armor.reference_reset_every = 3;
    c.armor.anchor_episodes = 2;
    let m = select(&c);
    let resets: Vec<u64> = (1..=7).filter(|&v| m.resets_reference_at(v)).collect();
    assert_eq!(resets, [3, 6]);
    assert_eq!(m.sampling(&c).anchor_episodes, 2);
    c.armor.reference_reset_every = 0;
    assert!(!(1..10).any(|v| select(&c).resets_reference_at(v)));
    // Anchors are ARMOR's only.
    let grpo = cfg(Algo::Grpo);
    assert_eq!(select(&grpo).sampling(&grpo).anchor_episodes, 0);
}

#[test]
fn pats_renders_its_scaffold_and_samples_again_after_a_resume() {
    let c = cfg(Algo::Pats);
    let m = select(&c);
    assert_eq!(m.sampling(&c).scaffold_words, c.pats.render_words);
    assert!(!m.reuses_stored_batches());
    assert!(m.scaffold().is_none(), "no bank before start");
    let grpo = cfg(Algo::Grpo);
    assert_eq!(select(&grpo).sampling(&grpo).scaffold_words, 0);
}
