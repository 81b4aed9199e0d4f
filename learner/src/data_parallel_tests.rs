//! Learner ranks as threads of one process over a real Gloo group on loopback: the update of N
//! ranks against one rank's on the same batches (DDP-1..4, OP-7, LR-9).

use crate::collective::test_support::{free_port, rendezvous};
use crate::collective::RankGroup;
use crate::learner::{is_optimizer_shard, Learner};
use crate::learner_config::{Algo, LearnerConfig};
use crate::learner_tests::{cfg, rl_batch, tiny};

use super::*;

/// Every parameter of `l`'s policy by name, flattened.
fn weights(l: &Learner) -> Vec<(String, Vec<f32>)> {
    l.model()
        .named_parameters()
        .into_iter()
        .map(|(n, t)| (n, Vec::<f32>::try_from(&t.flatten(0, -1)).expect("f32")))
        .collect()
}

/// What a job is: its learner config, whether the model has a value head, and its seed.
#[derive(Clone)]
struct Job {
    cfg: LearnerConfig,
    value_head: bool,
    seed: u64,
}

impl Job {
    fn learner(&self) -> Learner {
        Learner::new(
            tiny(self.value_head, self.seed),
            self.cfg.clone(),
            self.seed,
        )
        .expect("learner")
    }
}

/// A rank's weights and checkpoint files at the end of a run.
type RankEnd = (Vec<(String, Vec<f32>)>, Vec<(String, Vec<u8>)>);

/// Runs `steps` updates of `job` on `ranks` ranks (threads), each rank first restoring
/// `resume` when given; returns every rank's weights and checkpoint files.
fn run_ranks(
    job: &Job,
    ranks: usize,
    steps: usize,
    resume: Option<Vec<(String, Vec<u8>)>>,
) -> Vec<RankEnd> {
    let port = free_port();
    let handles: Vec<_> = (0..ranks)
        .map(|rank| {
            let (job, resume) = (job.clone(), resume.clone());
            std::thread::spawn(move || {
                tch::set_num_threads(1);
                let mut l = job.learner();
                let batch = rl_batch(l.model());
                if ranks > 1 {
                    let group =
                        RankGroup::join(&rendezvous(port, rank, ranks, 30), "job").expect("join");
                    l.join_ranks(std::sync::Arc::new(std::sync::Mutex::new(group)))
                        .expect("join ranks");
                }
                if let Some(files) = &resume {
                    l.restore(files).expect("restore");
                }
                for _ in 0..steps {
                    l.train_step(&batch).expect("train step");
                }
                let files = l.state_files().expect("state files");
                (weights(&l), files)
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank"))
        .collect()
}

/// The largest ‖a − b‖ / ‖b‖ over the parameter tensors.
fn max_relative(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> f64 {
    let mut worst = 0f64;
    for ((na, va), (nb, vb)) in a.iter().zip(b) {
        assert_eq!(na, nb);
        let diff: f64 = va
            .iter()
            .zip(vb)
            .map(|(x, y)| f64::from(x - y).powi(2))
            .sum();
        let norm: f64 = vb.iter().map(|y| f64::from(*y).powi(2)).sum();
        worst = worst.max((diff / norm.max(1e-30)).sqrt());
    }
    worst
}

fn jobs() -> Vec<(&'static str, Job)> {
    let grpo = Job {
        cfg: LearnerConfig {
            epochs: 2,
            minibatches: 2,
            ..cfg(Algo::Grpo)
        },
        value_head: false,
        seed: 31,
    };
    let ppo = Job {
        cfg: LearnerConfig {
            epochs: 2,
            minibatches: 2,
            entropy_coef: Some(0.01),
            gamma: Some(1.0),
            lam: Some(0.95),
            ..cfg(Algo::Ppo)
        },
        value_head: true,
        seed: 32,
    };
    let sao = Job {
        cfg: LearnerConfig {
            lr: 3e-3,
            minibatches: 1,
            ..LearnerConfig::for_preset(crate::Preset::Sao)
        },
        value_head: false,
        seed: 33,
    };
    vec![
        ("grpo", grpo),
        ("ppo with a critic", ppo),
        ("sao, separate critic", sao),
    ]
}

#[test]
fn dp1_two_and_three_ranks_update_as_one_rank() {
    for (name, job) in jobs() {
        let one = run_ranks(&job, 1, 3, None);
        for ranks in [2, 3] {
            let many = run_ranks(&job, ranks, 3, None);
            for (rank, (w, _)) in many.iter().enumerate() {
                assert_eq!(
                    w, &many[0].0,
                    "{name}: rank {rank} holds other weights than rank 0 (DDP-2)"
                );
            }
            let rel = max_relative(&many[0].0, &one[0].0);
            assert!(
                rel <= 1e-6,
                "{name}, {ranks} ranks: weights {rel:e} off one rank's"
            );
            let again = run_ranks(&job, ranks, 3, None);
            assert_eq!(
                again[0].0, many[0].0,
                "{name}: {ranks} ranks are not bit-reproducible"
            );
        }
    }
}

/// The bytes of every optimizer file of a checkpoint, by name.
fn optimizer_sizes(files: &[(String, Vec<u8>)]) -> Vec<(String, usize)> {
    files
        .iter()
        .filter(|(n, _)| n == "optimizer.safetensors" || is_optimizer_shard(n))
        .map(|(n, b)| (n.clone(), b.len()))
        .collect()
}

#[test]
fn op7_each_rank_keeps_a_share_of_the_optimizer_state() {
    let (_, job) = jobs().remove(0);
    let one = optimizer_sizes(&run_ranks(&job, 1, 1, None)[0].1);
    let whole = one[0].1 as f64;
    for ranks in [2usize, 3] {
        let run = run_ranks(&job, ranks, 1, None);
        let shards = optimizer_sizes(&run[0].1);
        assert_eq!(shards.len(), ranks, "{shards:?}");
        for (rank, (_, files)) in run.iter().enumerate().skip(1) {
            assert!(
                optimizer_sizes(files).is_empty(),
                "DDP-5: rank {rank} of {ranks} gathered optimizer shards"
            );
        }
        for (name, size) in &shards {
            let share = *size as f64 / whole;
            assert!(
                share < 1.5 / ranks as f64,
                "{name}: {size} bytes is {share:.2} of one rank's {whole} bytes with {ranks} ranks"
            );
        }
    }
}

#[test]
fn op7_a_checkpoint_resumes_on_another_number_of_ranks() {
    let (_, job) = jobs().remove(1); // PPO: the shared critic's head lives in the sharded optimizer
    let straight = run_ranks(&job, 1, 4, None);
    for (from, to) in [(2usize, 3usize), (3, 1), (1, 2)] {
        let first = run_ranks(&job, from, 2, None);
        let resumed = run_ranks(&job, to, 2, Some(first[0].1.clone()));
        let rel = max_relative(&resumed[0].0, &straight[0].0);
        assert!(
            rel <= 1e-6,
            "{from} → {to} ranks: weights {rel:e} off an uninterrupted run"
        );
    }
}

#[test]
fn dp_row_shares_balance_tokens_and_keep_order() {
    let shares = row_shares(&[10, 11, 12, 13, 14], &[5, 1, 4, 2, 3], 2);
    assert_eq!(shares, vec![vec![10, 11, 13], vec![12, 14]]);
    assert_eq!(row_shares(&[7], &[3], 3), vec![vec![7], vec![], vec![]]);
    assert_eq!(owners(&[100, 10, 10, 50, 60], 2), vec![0, 1, 1, 1, 1]);
}
