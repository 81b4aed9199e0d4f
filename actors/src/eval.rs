//! Held-out evaluation: the one way keel measures a model policy, inside a training job (before
//! and after RL) and outside one (`keel env eval --policy CKPT`, the per-env SFT checks).
//!
//! Invariants:
//! - EV-4: evaluation runs the generator's rollout engine (chat codec, KV-cache sampler, agent
//!   models, context limit) through a [`GeneratorHandle`] on the eval-split tasks `0..tasks`
//!   (EE-1), so a policy is measured exactly as it samples in training; nothing is stored and
//!   no scaffold is shown (GN-8).
//! - EV-5: pass@1 is the success rate of one greedy episode per task: a pure function of the
//!   weights and the env. avg@k is the mean success of k episodes per task sampled at the
//!   rollout temperature. Every report names its decoding; k = 0 skips the sampled pass.
//! - EV-6: intervals are 95% Wilson score intervals over the episodes of each pass.
//! - EV-7 (RM-7): a pass goes to the first generator that may be given work; when a rank does not
//!   answer it (`RankSilent`) or cannot serve it (`OrderVoid`), the pass is issued again to the
//!   next rank that may, under batch number `batch_seq + k·EVAL_RETRY_STRIDE` for the k-th
//!   retry (a withdrawn batch number is never reused). While no rank may be given work, it
//!   waits for one to be heard from.

use std::sync::Arc;

use keel_envs::evaluate::wilson;
use keel_envs::{task_seed, Split};

use crate::config::TrainConfig;
use crate::error::ActorError;
use crate::generator::{Decoding, Generate, Purpose};
use crate::remote::GeneratorHandle;
use crate::rollout::{RolloutStats, TaskRef};
use crate::setup::{LocalGenerators, ModelSetup};
use crate::weights::PublishedWeights;

/// What to evaluate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvalPlan {
    /// Held-out tasks (eval split, ids `0..tasks`).
    pub tasks: usize,
    /// k of avg@k: sampled episodes per task (0: greedy only).
    pub samples: usize,
    /// The sampling temperature of the avg@k pass.
    pub temperature: f64,
    /// The batch sequence numbers of the two passes are `batch_seq` and `batch_seq + 1`.
    pub batch_seq: u64,
}

impl EvalPlan {
    /// The plan of a run's config: `rollout.eval_tasks`, `rollout.eval_samples`, the rollout
    /// temperature.
    pub fn of(cfg: &TrainConfig, batch_seq: u64) -> Self {
        EvalPlan {
            tasks: cfg.rollout.eval_tasks,
            samples: cfg.rollout.eval_samples,
            temperature: cfg.rollout.temperature,
            batch_seq,
        }
    }
}

/// One pass's result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PassResult {
    /// Episodes run.
    pub episodes: usize,
    /// Successful episodes.
    pub successes: usize,
    /// Mean final reward.
    pub mean_reward: f64,
    /// Share of invalid turns.
    pub invalid_rate: f64,
}

impl PassResult {
    fn of(stats: &RolloutStats) -> Self {
        PassResult {
            episodes: stats.episodes,
            successes: stats.successes,
            mean_reward: stats.reward_sum / stats.episodes.max(1) as f64,
            invalid_rate: stats.invalid_turns as f64 / stats.turns.max(1) as f64,
        }
    }

    /// Success rate.
    pub fn rate(&self) -> f64 {
        self.successes as f64 / self.episodes.max(1) as f64
    }

    /// 95% Wilson interval of the success rate (EV-6).
    pub fn ci95(&self) -> (f64, f64) {
        wilson(self.successes, self.episodes)
    }
}

/// An evaluation's result (EV-5).
#[derive(Debug, Clone, PartialEq)]
pub struct EvalReport {
    /// Held-out tasks.
    pub tasks: usize,
    /// The greedy pass: pass@1.
    pub greedy: PassResult,
    /// The sampled pass (avg@k), unless k = 0.
    pub sampled: Option<PassResult>,
    /// k.
    pub samples: usize,
    /// Temperature of the sampled pass.
    pub temperature: f64,
}

impl EvalReport {
    /// pass@1 (greedy).
    pub fn pass_at_1(&self) -> f64 {
        self.greedy.rate()
    }

    /// avg@k (sampled), if it ran.
    pub fn avg_at_k(&self) -> Option<f64> {
        self.sampled.as_ref().map(PassResult::rate)
    }

    /// One line naming each pass's decoding, e.g.
    /// `pass@1 (greedy) 0.412 [0.353, 0.473], avg@4 (T=1) 0.380 [0.351, 0.410] over 256 held-out tasks`.
    pub fn describe(&self) -> String {
        let (lo, hi) = self.greedy.ci95();
        let mut out = format!("pass@1 (greedy) {:.3} [{lo:.3}, {hi:.3}]", self.pass_at_1());
        if let Some(s) = &self.sampled {
            let (lo, hi) = s.ci95();
            out += &format!(
                ", avg@{} (T={}) {:.3} [{lo:.3}, {hi:.3}]",
                self.samples,
                self.temperature,
                s.rate()
            );
        }
        out + &format!(" over {} held-out tasks", self.tasks)
    }
}

/// The distance between the batch numbers of an eval pass and its retry (EV-7): more than any
/// `2 · version` of an eval plan.
pub const EVAL_RETRY_STRIDE: u64 = 1 << 32;

/// How long an eval pass waits between looks for a generator that may be given work (EV-7).
const EVAL_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// Runs one eval pass on the first generator that answers it (EV-7).
async fn eval_pass(
    generators: &[Arc<dyn GeneratorHandle>],
    tasks: &[TaskRef],
    seq: u64,
    decoding: Decoding,
) -> Result<RolloutStats, ActorError> {
    let mut retry = 0u64;
    let mut next = 0usize;
    loop {
        let Some(g) = (0..generators.len())
            .map(|k| (next + k) % generators.len())
            .find(|&g| generators[g].available())
        else {
            tokio::time::sleep(EVAL_WAIT).await;
            continue;
        };
        let msg = Generate::groups(
            seq + retry * EVAL_RETRY_STRIDE,
            tasks.to_vec(),
            Purpose::Eval(decoding),
        );
        match generators[g].generate(msg).await {
            Ok(generated) => return Ok(generated.stats),
            Err(e @ (ActorError::RankSilent { .. } | ActorError::OrderVoid { .. })) => {
                tracing::warn!(error = %e, "issuing the evaluation pass again");
                retry += 1;
                next = g + 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Evaluates the weights the generators sample with (EV-4, EV-5, EV-7).
pub async fn evaluate(
    generators: &[Arc<dyn GeneratorHandle>],
    plan: &EvalPlan,
) -> Result<EvalReport, ActorError> {
    if generators.is_empty() {
        return Err(ActorError::Internal(
            "evaluation without a generator".into(),
        ));
    }
    let tasks: Vec<TaskRef> = (0..plan.tasks as u64)
        .map(|i| TaskRef {
            task_id: i,
            task_seed: task_seed(Split::Eval, i),
        })
        .collect();
    let greedy = eval_pass(generators, &tasks, plan.batch_seq, Decoding::Greedy).await?;
    let greedy = PassResult::of(&greedy);
    let sampled = if plan.samples > 0 {
        let decoding = Decoding::Sampled {
            samples: plan.samples,
        };
        let stats = eval_pass(generators, &tasks, plan.batch_seq + 1, decoding).await?;
        Some(PassResult::of(&stats))
    } else {
        None
    };
    Ok(EvalReport {
        tasks: plan.tasks,
        greedy,
        sampled,
        samples: plan.samples,
        temperature: plan.temperature,
    })
}

/// Evaluates `weights` outside a training job: this process's env shards and one generator
/// under `cfg`, the same [`evaluate`] a job runs (`keel env eval --policy CKPT`, the SFT
/// checks). `store` is the generator's run root (evaluation writes nothing to it). Runs its own
/// actor system; call it from a thread that runs none.
pub fn evaluate_weights(
    cfg: &TrainConfig,
    store: &keel_store::RunStore,
    weights: PublishedWeights,
    plan: &EvalPlan,
) -> Result<EvalReport, ActorError> {
    let process = crate::process::Process::start()?;
    let device = crate::setup::select_device(&cfg.run.device)?;
    let handle = process.io();
    let report = process.run_actors(async move {
        let model = ModelSetup::prepare(cfg, &handle, device).await?;
        let local = LocalGenerators::start(
            cfg,
            &model,
            store,
            &handle,
            None,
            0..1,
            false,
            &crate::process::StopSignal::default(),
        )?;
        local.board.publish(weights);
        let generator: Arc<dyn GeneratorHandle> = Arc::new(
            local
                .generators
                .first()
                .cloned()
                .ok_or_else(|| ActorError::Internal("no generator".into()))?,
        );
        evaluate(&[generator], plan).await
    });
    process.end();
    report
}
