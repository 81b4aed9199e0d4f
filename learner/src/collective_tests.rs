//! Ranks as threads of one process on loopback: the real Gloo group, TCPStore and sockets.

use tch::{Kind, Tensor};

use super::test_support::{free_port, rendezvous};
use super::*;

/// Runs `body(rank, group)` on `world` threads that joined one group; returns their results.
fn on_ranks<T: Send + 'static>(
    world: usize,
    identity: impl Fn(usize) -> String,
    body: impl Fn(usize, &mut RankGroup) -> T + Send + Sync + Clone + 'static,
) -> Vec<Result<T, CollectiveError>> {
    let port = free_port();
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let body = body.clone();
            let identity = identity(rank);
            std::thread::spawn(move || {
                let mut group = RankGroup::join(&rendezvous(port, rank, world, 20), &identity)?;
                Ok(body(rank, &mut group))
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank thread"))
        .collect()
}

#[test]
fn cl_all_reduce_broadcast_and_all_gather_agree_over_two_and_three_ranks() {
    for world in [2usize, 3] {
        let results = on_ranks(
            world,
            |_| "job".into(),
            |rank, group| {
                let mut sum = Tensor::from_slice(&[rank as f32 + 1.0, 10.0 * rank as f32]);
                group.all_reduce_sum(&mut sum).expect("all_reduce");
                let mut from_last = Tensor::full([3], rank as f64, (Kind::Float, tch::Device::Cpu));
                group
                    .broadcast(&mut from_last, group.world() - 1)
                    .expect("broadcast");
                let gathered = group
                    .all_gather(&Tensor::from_slice(&[rank as i64]))
                    .expect("all_gather");
                let gathered: Vec<i64> = gathered.iter().map(|t| t.int64_value(&[0])).collect();
                (
                    Vec::<f32>::try_from(sum).expect("f32"),
                    Vec::<f32>::try_from(from_last).expect("f32"),
                    gathered,
                )
            },
        );
        let n = world as f32;
        for result in results {
            let (sum, from_last, gathered) = result.expect("rank");
            assert_eq!(sum, vec![n * (n + 1.0) / 2.0, 10.0 * n * (n - 1.0) / 2.0]);
            assert_eq!(from_last, vec![n - 1.0; 3]);
            assert_eq!(gathered, (0..world as i64).collect::<Vec<_>>());
        }
    }
}

#[test]
fn cl2_a_rank_started_for_another_job_is_refused_by_name() {
    let results = on_ranks(
        3,
        |rank| {
            if rank == 2 {
                "config abc".into()
            } else {
                "config 123".into()
            }
        },
        |_, _| (),
    );
    for result in results {
        match result {
            Err(CollectiveError::IdentityMismatch {
                rank,
                expected,
                found,
            }) => {
                assert_eq!(
                    (rank, expected.as_str(), found.as_str()),
                    (2, "config 123", "config abc")
                );
            }
            other => panic!("expected the identity refusal, got {other:?}"),
        }
    }
}

#[test]
fn cl1_a_dead_peer_fails_the_collective_instead_of_hanging_it() {
    let port = free_port();
    let survivor = std::thread::spawn(move || {
        let mut group = RankGroup::join(&rendezvous(port, 0, 2, 5), "job")?;
        let mut t = Tensor::ones([4], (Kind::Float, tch::Device::Cpu));
        group.all_reduce_sum(&mut t)
    });
    let dead = std::thread::spawn(move || {
        // Joins, then goes away without taking part: its sockets close.
        RankGroup::join(&rendezvous(port, 1, 2, 5), "job").map(drop)
    });
    dead.join()
        .expect("dead rank thread")
        .expect("the dead rank joined");
    let err = survivor
        .join()
        .expect("survivor thread")
        .expect_err("a dead peer must fail the call");
    let text = err.to_string();
    assert!(
        text.contains("all_reduce") && text.contains("rank 0 of 2"),
        "{text}"
    );
}

#[test]
fn cl1_a_hung_peer_fails_the_collective_at_the_timeout() {
    let port = free_port();
    let (release, wait_release) = std::sync::mpsc::channel::<()>();
    let hung = std::thread::spawn(move || {
        let group = RankGroup::join(&rendezvous(port, 1, 2, 2), "job");
        // Stays a member but never calls the collective, until the survivor has failed.
        let _ = wait_release.recv();
        drop(group);
    });
    let mut group = RankGroup::join(&rendezvous(port, 0, 2, 2), "job").expect("join");
    let mut t = Tensor::ones([4], (Kind::Float, tch::Device::Cpu));
    let err = group
        .all_reduce_sum(&mut t)
        .expect_err("a hung peer must fail the call");
    assert!(err.to_string().contains("all_reduce"), "{err}");
    release.send(()).expect("release");
    hung.join().expect("hung rank thread");
}

/// CG-4: this build has NCCL (scripts/setup.sh installs the headers learner/build.rs needs), and
/// a rank joined with a CUDA device builds libtorch's ProcessGroupNCCL on it: with a GPU, a
/// one-rank group sums a CUDA tensor over NCCL and a CPU one over Gloo; without a GPU the join
/// fails with c10d's reason, naming the rendezvous, instead of crashing.
#[test]
fn cg4_a_cuda_rank_gets_nccl_and_without_a_gpu_a_reason() {
    assert!(
        nccl_compiled(),
        "keel-learner was built without NCCL (see the build's warning)"
    );
    let mut at = rendezvous(free_port(), 0, 1, 20);
    at.cuda_device = Some(0);
    let joined = RankGroup::join(&at, "job");
    if tch::Cuda::is_available() {
        let mut group = joined.expect("an NCCL group on cuda:0");
        let mut gpu = Tensor::ones([4], (Kind::Float, tch::Device::Cuda(0)));
        group.all_reduce_sum(&mut gpu).expect("NCCL all_reduce");
        let mut cpu = Tensor::ones([4], (Kind::Float, tch::Device::Cpu));
        group.all_reduce_sum(&mut cpu).expect("Gloo all_reduce");
        assert_eq!(
            Vec::<f32>::try_from(&gpu.to_device(tch::Device::Cpu)).expect("f32"),
            vec![1.0; 4]
        );
        return;
    }
    let err = match joined {
        Ok(_) => panic!("an NCCL group joined on a machine without a GPU"),
        Err(e) => e.to_string(),
    };
    eprintln!("{err}");
    assert!(
        err.contains("rendezvous at 127.0.0.1") && err.to_lowercase().contains("gpu"),
        "{err}"
    );
}
