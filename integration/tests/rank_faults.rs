//! The work-order protocol under single faults of one generator rank or of the trainer
//! (`keel trainer` + `keel generator --rank R`, issue 32 items 1–3):
//!
//! - a rank SIGKILLed while it holds an order and restarted after training moved on finds the
//!   order's weights still stored (RM-6), answers it, and gets new orders;
//! - a rank stopped past the order timeout has its order withdrawn (RM-5); once it runs again it
//!   is heard from (GW-6) and gets new orders, while the other rank carried the run;
//! - with rank 0 never started, evaluation is issued again to rank 1 (RM-7, EV-7) and the run
//!   finishes;
//! - a trainer restarted after a collapse-guard rewind trains on `rewind-1`, and the generators,
//!   started on `main`, follow it there (RM-8) and finish with it.
//!
//! Every fault fires on progress in the run root (an order, a withdrawal, a checkpoint); a run
//! that stops making progress fails the test, and every process started is killed when the test
//! ends, passed or failed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use keel_actors::events::TrainEvent;
use keel_integration::events::train_events;
use keel_integration::roles::{config, walk, Roles};
use keel_integration::{check_accounting, test_rt, MethodRun};
use keel_store::RunStore;

const TASKS_PER_BATCH: u64 = 6; // MethodRun's rollout.tasks_per_batch

/// An order or result file: (rank dir or "", seq, body).
fn json_files(root: &Path, kind: &str) -> Vec<(PathBuf, serde_json::Value)> {
    walk(root)
        .into_iter()
        .filter(|p| {
            p.components().any(|c| c.as_os_str() == kind)
                && p.extension().is_some_and(|e| e == "json")
        })
        .filter_map(|p| {
            let text = std::fs::read_to_string(&p).ok()?;
            let body = serde_json::from_str(&text).ok()?;
            Some((p, body))
        })
        .collect()
}

fn seq(body: &serde_json::Value) -> u64 {
    body["batch_seq"].as_u64().expect("batch_seq")
}

/// The results stored so far.
fn results(root: &Path) -> Vec<serde_json::Value> {
    json_files(root, "results")
        .into_iter()
        .map(|(_, b)| b)
        .collect()
}

/// A training order of `rank` with no result yet.
fn open_train_order(root: &Path, rank: u32) -> Option<serde_json::Value> {
    let answered: Vec<u64> = results(root).iter().map(seq).collect();
    json_files(root, "orders")
        .into_iter()
        .map(|(_, b)| b)
        .filter(|b| b["rank"] == rank && b["purpose"] == "Train")
        .filter(|b| !answered.contains(&seq(b)))
        .max_by_key(seq)
}

/// Polls `cond` until it holds; the trainer ending first fails the test.
fn wait_until<T>(roles: &mut Roles, what: &str, mut cond: impl FnMut(&Roles) -> Option<T>) -> T {
    loop {
        if let Some(found) = cond(roles) {
            return found;
        }
        if let Some(t) = roles.trainer.as_mut() {
            if let Ok(Some(status)) = t.try_wait() {
                panic!(
                    "the trainer ended ({status}) before {what}:\n{}",
                    roles.logs()
                );
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Stops generator `rank` while it holds an unanswered training order; returns that order.
fn stop_rank_holding_an_order(roles: &mut Roles, rank: u32) -> serde_json::Value {
    let root = PathBuf::from(&roles.root);
    loop {
        let order = wait_until(roles, "an order to the rank", |_| {
            open_train_order(&root, rank)
        });
        roles.signal_generator(rank, "-STOP");
        if !results(&root).iter().any(|r| seq(r) == seq(&order)) {
            return order;
        }
        roles.signal_generator(rank, "-CONT"); // answered just before the stop: the next one
    }
}

/// Done results of `rank` for orders after `after`.
fn later_answers(root: &Path, rank: u32, after: u64) -> usize {
    results(root)
        .iter()
        .filter(|r| r["rank"] == rank && r["process"] != "trainer" && seq(r) > after)
        .filter(|r| r["outcome"].get("Done").is_some())
        .count()
}

fn async_run(steps: u64) -> MethodRun {
    MethodRun {
        steps,
        checkpoint_every: 2,
        mode: "async",
        bound: 2,
        latency_ms: 20.0,
        ..MethodRun::new("grpo")
    }
}

#[test]
fn a_rank_restarted_after_training_moved_on_answers_its_order_and_gets_new_work() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = test_rt();
    // A long order timeout: the order is still pending when the rank comes back.
    let (mut roles, root) = Roles::local(dir.path(), "restart", &async_run(40), 600);
    let root_s = roles.root.clone();
    roles.start_all();
    let order = stop_rank_holding_an_order(&mut roles, 1);
    roles.kill_generator(1);
    let version = order["weights"]["Policy"]["version"]
        .as_u64()
        .expect("version");
    // Rank 0 trains on: the order's weights fall far behind what SB-3's window keeps.
    let store = RunStore::open(&root_s).expect("open");
    wait_until(&mut roles, "training moved on", |_| {
        let head = rt.block_on(store.latest_checkpoint()).ok().flatten()?;
        (head.step >= version + 8).then_some(())
    });
    roles.start_generator(1);
    let s = seq(&order);
    let answer = wait_until(&mut roles, "the restarted rank answered", |_| {
        results(&root).into_iter().find(|r| seq(r) == s)
    });
    assert!(
        answer["outcome"].get("Done").is_some() && answer["rank"] == 1,
        "the restarted rank must answer its order with its (pinned) weights: {answer}\n{}",
        roles.logs()
    );
    wait_until(
        &mut roles,
        "a new order answered by the restarted rank",
        |_| (later_answers(&root, 1, s) > 0).then_some(()),
    );
    roles.finish_ok();
    let (head, _) = check_accounting(&rt, &store, TASKS_PER_BATCH, "restart").expect("accounting");
    assert_eq!(head.step, 40);
}

#[test]
fn a_rank_stopped_past_the_timeout_is_withdrawn_then_heard_from_and_given_work() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = test_rt();
    let (mut roles, root) = Roles::local(dir.path(), "late", &async_run(40), 4);
    let root_s = roles.root.clone();
    roles.start_all();
    let order = stop_rank_holding_an_order(&mut roles, 1);
    let s = seq(&order);
    // RM-5: past the timeout the trainer withdraws the order (its result, written by the trainer).
    let withdrawal = wait_until(&mut roles, "the order was withdrawn", |_| {
        results(&root).into_iter().find(|r| seq(r) == s)
    });
    assert_eq!(withdrawal["process"], "trainer", "{withdrawal}");
    assert_eq!(withdrawal["outcome"], "Withdrawn", "{withdrawal}");
    roles.signal_generator(1, "-CONT");
    // GW-6: the live rank is heard from and gets work again while the run goes on.
    wait_until(&mut roles, "the late rank answered a new order", |_| {
        (later_answers(&root, 1, s) > 0).then_some(())
    });
    let heard = walk(&root)
        .iter()
        .filter(|p| p.to_string_lossy().contains("-heard-"))
        .count();
    assert!(
        heard >= 1,
        "the late rank wrote no heard record:\n{}",
        roles.logs()
    );
    roles.finish_ok();
    let store = RunStore::open(&root_s).expect("open");
    let (head, _) = check_accounting(&rt, &store, TASKS_PER_BATCH, "late").expect("accounting");
    assert_eq!(head.step, 40);
}

#[test]
fn evaluation_is_issued_again_when_rank_0_is_down() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = test_rt();
    let run = MethodRun {
        steps: 4,
        checkpoint_every: 2,
        ..MethodRun::new("grpo")
    };
    let (mut roles, root) = Roles::local(dir.path(), "eval", &run, 3);
    let root_s = roles.root.clone();
    roles.start_trainer();
    roles.start_generator(1); // rank 0 never comes
    roles.finish_ok();
    let store = RunStore::open(&root_s).expect("open");
    let (head, _) = check_accounting(&rt, &store, TASKS_PER_BATCH, "eval").expect("accounting");
    assert_eq!(head.step, 4);
    let all = results(&root);
    assert!(
        all.iter()
            .all(|r| r["rank"] != 0 || r["process"] == "trainer"),
        "{all:?}"
    );
    let evals = train_events(&root)
        .iter()
        .filter(|e| matches!(e, TrainEvent::Eval { .. }))
        .count();
    assert_eq!(evals, 2, "both evaluations ran on rank 1");
}

#[test]
fn generators_follow_a_restarted_trainer_to_its_rewind_branch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = test_rt();
    // A second fault, past the restart: the restarted life rewinds again, inside itself, to a
    // branch no trainer claims (rewind-2); the generators keep serving the life on rewind-1.
    let run = MethodRun {
        steps: 18,
        checkpoint_every: 2,
        guard: true,
        latency_ms: 20.0,
        extra: "[faults]\nnan_loss_at_step = 5\nnan_loss_count = 3\nlr_blowup_at_step = 12\nlr_blowup_to = 1.0\n"
            .into(),
        ..MethodRun::new("grpo")
    };
    let (mut roles, _) = Roles::local(dir.path(), "rewind", &run, 20);
    let root_s = roles.root.clone();
    roles.start_all();
    // The guard rewinds to step 4 on `rewind-1`; once that branch is past the poisoned step, the
    // trainer dies and a new one (no --branch) follows the rewind (GD-6).
    let store = RunStore::open(&root_s).expect("open");
    wait_until(&mut roles, "rewind-1 passed step 6", |_| {
        let head = rt.block_on(store.branch_head("rewind-1")).ok().flatten()?;
        let m = rt
            .block_on(store.ancestry(&head.id))
            .ok()?
            .into_iter()
            .next()?;
        (m.step >= 6).then_some(())
    });
    roles.kill_trainer();
    roles.start_trainer();
    roles.finish_ok();
    let on_rewind = store.on_branch("rewind-1").expect("branch");
    let lives = rt.block_on(on_rewind.lives()).expect("lives");
    assert_eq!(lives.len(), 1, "the restarted trainer trained on rewind-1");
    let end = rt
        .block_on(keel_actors::guard::follow_rewinds(&store, "main"))
        .expect("follow");
    let on_end = store.on_branch(&end).expect("branch");
    let (head, _) = check_accounting(&rt, &on_end, TASKS_PER_BATCH, "rewind").expect("accounting");
    assert_eq!(head.step, 18);
    assert_eq!(
        end, "rewind-2",
        "the restarted life rewound again inside itself"
    );
}

#[test]
fn a_storage_stall_past_the_order_timeout_leaves_no_rank_silent() {
    let server = keel_integration::OwnSeaweed::start();
    // This test process and the keel processes it starts talk only to their own server.
    std::env::set_var("AWS_ENDPOINT_URL", &server.endpoint);
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = test_rt();
    let timeout_s = 4;
    let cfg = config(dir.path(), "stall", &async_run(24), timeout_s);
    let root = keel_integration::s3_root("stall");
    let mut roles = Roles::new(dir.path(), cfg, &root);
    roles.start_all();
    let store = RunStore::open(&root).expect("open");
    let step = |rt: &tokio::runtime::Runtime| {
        rt.block_on(store.latest_checkpoint())
            .ok()
            .flatten()
            .map_or(0, |m| m.step)
    };
    wait_until(&mut roles, "a checkpoint past step 2", |_| {
        (step(&rt) >= 2).then_some(())
    });
    // The stall is the fault: the server answers nothing for longer than the order timeout.
    server.signal("-STOP");
    std::thread::sleep(Duration::from_secs(timeout_s + 6));
    server.signal("-CONT");
    let stalled_at = step(&rt);
    let last_order_before = rt
        .block_on(store.list_objects("orders"))
        .expect("orders")
        .iter()
        .filter_map(|k| keel_actors::remote::seq_of_key(k))
        .filter(|&s| s < keel_actors::job::EVAL_BATCH_SEQ)
        .max()
        .unwrap_or(0);
    let status = roles.wait_trainer_with(|| step(&rt).to_string());
    roles.finished_ok(status);
    let (head, _) = check_accounting(&rt, &store, TASKS_PER_BATCH, "stall").expect("accounting");
    assert_eq!(head.step, 24, "the run went on from step {stalled_at}");
    let results: Vec<serde_json::Value> = rt.block_on(async {
        let mut all = Vec::new();
        for key in store.list_objects("results").await.expect("results") {
            let body = store.get_object(&key).await.expect("a result");
            all.push(serde_json::from_slice(&body).expect("a result parses"));
        }
        all
    });
    let withdrawn = results
        .iter()
        .filter(|r| r["outcome"] == "Withdrawn")
        .count();
    eprintln!("orders withdrawn across the stall: {withdrawn}");
    for rank in 0..2 {
        let after = results
            .iter()
            .filter(|r| r["rank"] == rank && seq(r) > last_order_before)
            .filter(|r| seq(r) < keel_actors::job::EVAL_BATCH_SEQ)
            .filter(|r| r["outcome"].get("Done").is_some())
            .count();
        assert!(
            after > 0,
            "rank {rank} got no work after the stall:\n{}",
            roles.logs()
        );
    }
    drop(server);
}
