//! Prometheus metrics of the training loop.
//!
//! Invariants:
//! - MT-1: every series carries the `run` label and nothing per-trajectory (bounded cardinality).
//! - MT-2: names follow verl's vocabulary with a `keel_` prefix (`keel_actor_pg_clipfrac`, …) so
//!   users of other frameworks recognise them.
//! - MT-3: the registry is owned here; the CLI only serves `TrainMetrics::registry`.

use prometheus::{Gauge, Histogram, HistogramOpts, IntCounter, IntGauge, Opts, Registry};

use keel_learner::StepMetrics;

/// The metric handles of one training run.
#[derive(Clone)]
pub struct TrainMetrics {
    registry: Registry,
    /// Learner updates taken.
    pub learner_step: IntGauge,
    /// Current policy version.
    pub policy_version: IntGauge,
    /// Policy-gradient loss.
    pub pg_loss: Gauge,
    /// Total loss.
    pub loss: Gauge,
    /// Value loss (PPO).
    pub value_loss: Gauge,
    /// Fraction of tokens whose ratio was clipped.
    pub pg_clipfrac: Gauge,
    /// Approximate KL to the behaviour policy.
    pub ppo_kl: Gauge,
    /// Mean token entropy.
    pub entropy: Gauge,
    /// Gradient norm before clipping.
    pub grad_norm: Gauge,
    /// Learner tokens per second.
    pub learner_tokens_per_s: Gauge,
    /// Seconds per learner step.
    pub step_seconds: Histogram,
    /// Training rollout success rate of the last batch.
    pub rollout_success: Gauge,
    /// Mean final reward of the last batch.
    pub rollout_reward: Gauge,
    /// Invalid-action rate (per turn) of the last batch.
    pub rollout_invalid_rate: Gauge,
    /// Held-out evaluation success rate.
    pub eval_success: Gauge,
    /// Policy-version lag of each trained turn.
    pub staleness: Histogram,
    /// Batches dropped for exceeding the staleness bound or belonging to a lost future.
    pub batches_dropped: IntCounter,
    /// Batches trained on.
    pub batches_trained: IntCounter,
    /// Committed checkpoints.
    pub checkpoints: IntCounter,
    /// Actor restarts.
    pub actor_restarts: IntCounter,
}

fn opts(name: &str, help: &str, run: &str) -> Opts {
    Opts::new(name, help).const_label("run", run)
}

impl TrainMetrics {
    /// Creates and registers every metric for run `run`.
    pub fn new(run: &str) -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let g = |name: &str, help: &str| -> Result<Gauge, prometheus::Error> {
            let m = Gauge::with_opts(opts(name, help, run))?;
            registry.register(Box::new(m.clone()))?;
            Ok(m)
        };
        let c = |name: &str, help: &str| -> Result<IntCounter, prometheus::Error> {
            let m = IntCounter::with_opts(opts(name, help, run))?;
            registry.register(Box::new(m.clone()))?;
            Ok(m)
        };
        let ig = |name: &str, help: &str| -> Result<IntGauge, prometheus::Error> {
            let m = IntGauge::with_opts(opts(name, help, run))?;
            registry.register(Box::new(m.clone()))?;
            Ok(m)
        };
        let h = |name: &str, help: &str, buckets: Vec<f64>| -> Result<Histogram, prometheus::Error> {
            let o = HistogramOpts::new(name, help).const_label("run", run).buckets(buckets);
            let m = Histogram::with_opts(o)?;
            registry.register(Box::new(m.clone()))?;
            Ok(m)
        };
        Ok(Self {
            learner_step: ig("keel_learner_step", "Learner updates taken")?,
            policy_version: ig("keel_policy_version", "Current policy version")?,
            pg_loss: g("keel_actor_pg_loss", "Policy-gradient loss of the last step")?,
            loss: g("keel_actor_loss", "Total loss of the last step")?,
            value_loss: g("keel_critic_vf_loss", "Value loss of the last step")?,
            pg_clipfrac: g("keel_actor_pg_clipfrac", "Fraction of model tokens whose ratio was clipped")?,
            ppo_kl: g("keel_actor_ppo_kl", "Approximate KL between behaviour and current policy")?,
            entropy: g("keel_actor_entropy", "Mean token entropy of the policy")?,
            grad_norm: g("keel_actor_grad_norm", "Gradient L2 norm before clipping")?,
            learner_tokens_per_s: g("keel_perf_learner_tokens_per_second", "Learner model tokens per second")?,
            step_seconds: h(
                "keel_learner_step_seconds",
                "Seconds per learner step",
                prometheus::exponential_buckets(0.01, 2.0, 14)?,
            )?,
            rollout_success: g("keel_rollout_success_rate", "Success rate of the last training batch")?,
            rollout_reward: g("keel_rollout_reward_mean", "Mean final reward of the last training batch")?,
            rollout_invalid_rate: g("keel_rollout_invalid_action_rate", "Invalid actions per turn in the last batch")?,
            eval_success: g("keel_eval_success_rate", "Held-out evaluation success rate")?,
            staleness: h(
                "keel_rollout_staleness_versions",
                "Policy versions between a trained turn's sampling and its update",
                vec![0.0, 1.0, 2.0, 3.0, 4.0, 8.0, 16.0],
            )?,
            batches_dropped: c("keel_rollout_batches_dropped_total", "Batches dropped (staleness bound or lost future)")?,
            batches_trained: c("keel_rollout_batches_trained_total", "Batches trained on")?,
            checkpoints: c("keel_store_checkpoints_committed_total", "Checkpoints committed")?,
            actor_restarts: c("keel_actor_restarts_total", "Supervised actor restarts")?,
            registry,
        })
    }

    /// The registry to serve on `/metrics`.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Records one learner step.
    pub fn record_step(&self, step: u64, m: &StepMetrics) {
        self.learner_step.set(step as i64);
        self.policy_version.set(step as i64);
        self.pg_loss.set(m.pg_loss);
        self.loss.set(m.loss);
        self.value_loss.set(m.value_loss);
        self.pg_clipfrac.set(m.clip_frac);
        self.ppo_kl.set(m.approx_kl);
        self.entropy.set(m.entropy);
        self.grad_norm.set(m.grad_norm);
        self.learner_tokens_per_s.set(m.tokens_per_s);
        self.step_seconds.observe(m.step_seconds);
        self.batches_trained.inc();
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let enc = prometheus::TextEncoder::new();
        if let Err(e) = prometheus::Encoder::encode(&enc, &self.registry.gather(), &mut buf) {
            return format!("# encoding failed: {e}\n");
        }
        String::from_utf8_lossy(&buf).into_owned()
    }
}
