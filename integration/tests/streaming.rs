//! The streaming rollout engine (RO-8, ES-3, SA-7): one pathological episode delays no other
//! episode of its batch, and a rollout's batch is bit-identical run to run however the env's
//! timing interleaves the episodes.

use std::sync::Arc;
use std::time::Duration;

use keel_actors::env_shard::{EnvFactory, ShardOptions, ShardPool};
use keel_actors::rollout::{
    group_plans, run_episodes, Policies, Reroll, RolloutExtras, RolloutSpec, RolloutStats, TaskRef,
};
use keel_actors::supervision::RestartBudget;
use keel_actors::TrainConfig;
use keel_envs::{make_env, Env, LatencyModel};
use keel_integration::{tiny_config, HookedEnv};
use keel_learner::hf::{ChatCodec, HfModel};
use keel_store::RolloutBatch;

/// A tiny random policy over calc's vocabulary and its codec.
fn policy() -> (HfModel, ChatCodec, usize) {
    tch::set_num_threads(1);
    let cfg = TrainConfig::from_toml(&tiny_config(1, 1, "sync", 1)).expect("config");
    let env_cfg = cfg.env_config();
    let tokenizer = Arc::new(keel_envs::tokenizer_for(&env_cfg).expect("tokenizer"));
    let spec = cfg
        .model_spec(&tokenizer, tch::Device::Cpu)
        .expect("model spec");
    let model = spec.build().expect("random model");
    let codec = cfg.chat_codec(&tokenizer).expect("codec");
    (model, codec, spec.config.max_position_embeddings)
}

fn spec(
    tasks: &[TaskRef],
    group: usize,
    context_len: usize,
    reroll: Option<Reroll>,
) -> RolloutSpec {
    RolloutSpec {
        run_id: "streaming".into(),
        batch_seq: 0,
        generator_id: 0,
        policy_version: 0,
        env_name: "calc".into(),
        plans: group_plans(tasks, group, 0),
        temperature: 1.0,
        greedy: false,
        max_turn_tokens: 6,
        context_len,
        rng_seed: 99,
        first_id: 0,
        scaffold: None,
        capture_boundaries: false,
        keep_anchor_states: false,
        batch_invariant: true,
        reroll,
        follow_weights: false,
        stop: None,
    }
}

fn tasks(n: u64) -> Vec<TaskRef> {
    (0..n)
        .map(|i| TaskRef {
            task_id: i,
            task_seed: keel_envs::task_seed(keel_envs::Split::Train, i),
        })
        .collect()
}

#[test]
fn a_pathological_episode_delays_no_other_episode() {
    let (model, codec, context_len) = policy();
    let tasks = tasks(8);
    let slow_seed = tasks[0].task_seed;
    let (fast, slow) = (Duration::from_millis(10), Duration::from_millis(1000));
    // `calc`, except that every step of the task with seed `slow_seed` takes `slow`, every
    // other step `fast` (a blocking sleep, as a slow tool call would be).
    let factory: EnvFactory = Arc::new(move || {
        let hook = Arc::new(move |seed: u64| {
            std::thread::sleep(if seed == slow_seed { slow } else { fast })
        });
        Ok(Box::new(HookedEnv::new(make_env("calc", 2)?, hook)) as Box<dyn Env>)
    });
    let system = actix::System::new();
    let (batch, finished) = system.block_on(async move {
        let options = ShardOptions {
            concurrency: 64,
            latency: LatencyModel::None,
        };
        let pool = ShardPool::start(2, factory, RestartBudget::new("env_shard", 1), options);
        let shards = pool.addrs().to_vec();
        let spec = spec(&tasks, 4, context_len, None);
        // The engine blocks its thread (as it does on a generator's own thread).
        let run = std::thread::spawn(move || {
            let (batch, _, extras) =
                run_episodes(&mut Policies::single(&model), &codec, &shards, &spec)
                    .expect("rollout");
            (batch, extras.finished_seconds)
        });
        loop {
            if run.is_finished() {
                break run.join().expect("rollout thread");
            }
            actix::clock::sleep(Duration::from_millis(20)).await;
        }
    });
    assert_eq!(batch.trajectories.len(), 32);
    let mut slow_done = f64::INFINITY;
    let mut fast_done: f64 = 0.0;
    let mut fast_turns = 0;
    for (t, &at) in batch.trajectories.iter().zip(&finished) {
        if t.task_id == 0 {
            slow_done = slow_done.min(at);
        } else {
            fast_done = fast_done.max(at);
            fast_turns = fast_turns.max(t.turns.len());
        }
    }
    assert!(fast_turns >= 2, "the episodes should take several turns");
    // Every other episode ends before the slow one has taken its first step.
    assert!(
        fast_done < slow.as_secs_f64() * 0.8,
        "the slowest fast episode ended at {fast_done:.3} s: it waited for the slow one"
    );
    assert!(
        slow_done >= slow.as_secs_f64(),
        "slow episodes end at {slow_done:.3} s"
    );
}

#[test]
fn a_streamed_rollout_is_bit_identical_run_to_run() {
    let tasks = tasks(6);
    // Jittered latency: the episodes interleave differently in every run.
    let factory: EnvFactory = Arc::new(|| make_env("calc", 2));
    let run_once = |jitter: u64| -> (RolloutBatch, RolloutStats, RolloutExtras) {
        // The same seeded random weights every time.
        let (model, codec, context_len) = policy();
        let (factory, tasks) = (factory.clone(), tasks.clone());
        let system = actix::System::new();
        system.block_on(async move {
            let options = ShardOptions {
                concurrency: 16,
                latency: LatencyModel::Lognormal {
                    median_ms: 2.0 + jitter as f64,
                    sigma: 1.0,
                    cap_ms: 40.0,
                },
            };
            let pool = ShardPool::start(2, factory, RestartBudget::new("env_shard", 1), options);
            let shards = pool.addrs().to_vec();
            // RO-9 too: uniform groups are re-rolled in the stream, in whatever order they end.
            let reroll = Reroll {
                max_tries: 3,
                anchors: false,
            };
            let spec = spec(&tasks, 4, context_len, Some(reroll));
            let run = std::thread::spawn(move || {
                run_episodes(&mut Policies::single(&model), &codec, &shards, &spec)
                    .expect("rollout")
            });
            loop {
                if run.is_finished() {
                    break run.join().expect("rollout thread");
                }
                actix::clock::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let (first, stats, extras) = run_once(0);
    let (second, _, _) = run_once(5);
    // One attempt per group is kept; the uniform groups were rolled out three times in all.
    assert_eq!(first.trajectories.len(), 24);
    assert!(
        extras.passes >= 2,
        "a random policy leaves some group uniform: {extras:?}"
    );
    let uniform = extras.uniform_groups.len();
    assert!(
        stats.episodes + stats.failed_episodes > 24,
        "re-rolled episodes are counted: {stats:?}"
    );
    assert!(uniform <= 6);
    let ids: std::collections::BTreeSet<u64> =
        first.trajectories.iter().map(|t| t.trajectory_id).collect();
    assert_eq!(ids.len(), 24, "trajectory ids are unique");
    for (a, b) in first.trajectories.iter().zip(&second.trajectories) {
        assert_eq!(a.tokens, b.tokens, "trajectory {}", a.trajectory_id);
        let bits = |t: &keel_store::Trajectory| -> Vec<u32> {
            t.behaviour_logprobs.iter().map(|x| x.to_bits()).collect()
        };
        assert_eq!(
            bits(a),
            bits(b),
            "log-probs of trajectory {}",
            a.trajectory_id
        );
        assert_eq!(a.turns, b.turns);
    }
}
