//! Prometheus metrics of the training loop (documented one by one in `docs/metrics.md`).
//!
//! Invariants:
//! - MT-1: every series carries the constant `run` label and the current `branch`; the other
//!   labels take a handful of values (`env`, actor `kind`, store `object`, drop `reason`, anomaly
//!   `kind`). Nothing is labelled per trajectory, task or batch (bounded cardinality).
//! - MT-2: names follow verl's vocabulary with a `keel_` prefix (`keel_actor_pg_clipfrac`,
//!   `keel_actor_grad_norm`, …) so users of other frameworks recognise them.
//! - MT-3: the registry is owned here; the CLI only serves `TrainMetrics::render`.
//! - MT-4: when the branch changes (a rewind), the gauges of the old branch are dropped, so no
//!   alert keeps firing on a value of an abandoned branch; counters and histograms of the old
//!   branch stay (they no longer move).
//! - MT-5: `docs/metrics.md`, `ops/alerts/keel-rules.yml` and `ops/dashboards/keel.json` name only
//!   metrics registered here (checked by a test).
//! - MT-6: every metric is declared once: a row of the `train_metrics!` table below, or, for a
//!   learner statistic, the `export` of its row in `keel_learner::step_metrics` (gauges named
//!   and explained there, set from each step's `StepMetrics` by iterating that registry).

use std::sync::{Arc, RwLock};
use std::time::Instant;

use prometheus::{GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

use keel_learner::step_metrics::{Stat, STATS};
use keel_learner::StepMetrics;

/// The branch label every series carries; shared by all handles of one run.
#[derive(Clone, Debug)]
struct BranchCell(Arc<RwLock<String>>);

impl BranchCell {
    fn get(&self) -> String {
        match self.0.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }
}

/// The series for some label values; a wrong number of labels is a bug at the call site, logged
/// (not a panic: metrics never stop training).
fn labelled<T>(r: Result<T, prometheus::Error>) -> Option<T> {
    match r {
        Ok(m) => Some(m),
        Err(e) => {
            tracing::warn!(error = %e, "metric used with the wrong labels");
            None
        }
    }
}

/// A gauge labelled with the current branch (plus `extra` labels, given at each use).
#[derive(Clone)]
pub struct BranchGauge {
    vec: GaugeVec,
    branch: BranchCell,
}

impl BranchGauge {
    /// Sets the value on the current branch.
    pub fn set(&self, v: f64) {
        if let Some(g) = labelled(
            self.vec
                .get_metric_with_label_values(&[self.branch.get().as_str()]),
        ) {
            g.set(v);
        }
    }

    /// The value on the current branch.
    pub fn get(&self) -> f64 {
        self.vec
            .get_metric_with_label_values(&[self.branch.get().as_str()])
            .map(|g| g.get())
            .unwrap_or(0.0)
    }

    /// Sets the value of the series with the extra label value `label` (gauges with two labels).
    pub fn set_for(&self, label: &str, v: f64) {
        if let Some(g) = labelled(
            self.vec
                .get_metric_with_label_values(&[self.branch.get().as_str(), label]),
        ) {
            g.set(v);
        }
    }
}

/// A counter labelled with the current branch.
#[derive(Clone)]
pub struct BranchCounter {
    vec: IntCounterVec,
    branch: BranchCell,
}

impl BranchCounter {
    /// Adds one on the current branch.
    pub fn inc(&self) {
        self.inc_by(1);
    }

    /// Adds `n` on the current branch.
    pub fn inc_by(&self, n: u64) {
        if let Some(c) = labelled(
            self.vec
                .get_metric_with_label_values(&[self.branch.get().as_str()]),
        ) {
            c.inc_by(n);
        }
    }

    /// Adds `n` to the series with the extra label value `label` (counters with two labels).
    pub fn inc_for(&self, label: &str, n: u64) {
        if let Some(c) = labelled(
            self.vec
                .get_metric_with_label_values(&[self.branch.get().as_str(), label]),
        ) {
            c.inc_by(n);
        }
    }

    /// The value of the series with the extra label value `label`.
    pub fn get_for(&self, label: &str) -> u64 {
        self.vec
            .get_metric_with_label_values(&[self.branch.get().as_str(), label])
            .map(|c| c.get())
            .unwrap_or(0)
    }

    /// The value on the current branch (series with only the branch label).
    pub fn get(&self) -> u64 {
        self.vec
            .get_metric_with_label_values(&[self.branch.get().as_str()])
            .map(|c| c.get())
            .unwrap_or(0)
    }
}

/// A histogram labelled with the current branch.
#[derive(Clone)]
pub struct BranchHistogram {
    vec: HistogramVec,
    branch: BranchCell,
}

impl BranchHistogram {
    /// Observes `v` on the current branch.
    pub fn observe(&self, v: f64) {
        if let Some(h) = labelled(
            self.vec
                .get_metric_with_label_values(&[self.branch.get().as_str()]),
        ) {
            h.observe(v);
        }
    }

    /// Observes `v` in the series with the extra label value `label`.
    pub fn observe_for(&self, label: &str, v: f64) {
        if let Some(h) = labelled(
            self.vec
                .get_metric_with_label_values(&[self.branch.get().as_str(), label]),
        ) {
            h.observe(v);
        }
    }
}

/// `batches_dropped` without a reason: counted under `reason="other"`.
#[derive(Clone)]
pub struct DroppedCounter(BranchCounter);

impl DroppedCounter {
    /// Counts one dropped batch with reason `other`.
    pub fn inc(&self) {
        self.0.inc_for("other", 1);
    }
}

struct Builder<'a> {
    registry: &'a Registry,
    run: &'a str,
    branch: BranchCell,
    gauges: Vec<GaugeVec>,
    names: Vec<String>,
}

impl Builder<'_> {
    fn labels<'l>(extra: &'l [&'l str]) -> Vec<&'l str> {
        let mut l = vec!["branch"];
        l.extend_from_slice(extra);
        l
    }

    fn gauge(
        &mut self,
        name: &str,
        help: &str,
        extra: &[&str],
    ) -> Result<BranchGauge, prometheus::Error> {
        self.names.push(name.to_string());
        let vec = GaugeVec::new(
            Opts::new(name, help).const_label("run", self.run),
            &Self::labels(extra),
        )?;
        self.registry.register(Box::new(vec.clone()))?;
        self.gauges.push(vec.clone());
        Ok(BranchGauge {
            vec,
            branch: self.branch.clone(),
        })
    }

    fn counter(
        &mut self,
        name: &str,
        help: &str,
        extra: &[&str],
    ) -> Result<BranchCounter, prometheus::Error> {
        self.names.push(name.to_string());
        let vec = IntCounterVec::new(
            Opts::new(name, help).const_label("run", self.run),
            &Self::labels(extra),
        )?;
        self.registry.register(Box::new(vec.clone()))?;
        Ok(BranchCounter {
            vec,
            branch: self.branch.clone(),
        })
    }

    fn histogram(
        &mut self,
        name: &str,
        help: &str,
        extra: &[&str],
        buckets: Vec<f64>,
    ) -> Result<BranchHistogram, prometheus::Error> {
        self.names.push(name.to_string());
        let opts = HistogramOpts::new(name, help)
            .const_label("run", self.run)
            .buckets(buckets);
        let vec = HistogramVec::new(opts, &Self::labels(extra))?;
        self.registry.register(Box::new(vec.clone()))?;
        Ok(BranchHistogram {
            vec,
            branch: self.branch.clone(),
        })
    }

    /// One gauge per learner statistic that declares a Prometheus export (MT-6).
    fn learner_gauges(&mut self) -> Result<Vec<(BranchGauge, Stat)>, prometheus::Error> {
        STATS
            .iter()
            .filter_map(|s| s.export.map(|e| (e, s.stat)))
            .map(|(e, stat)| Ok((self.gauge(e.metric, e.help, &[])?, stat)))
            .collect()
    }
}

fn lag_buckets() -> Result<Vec<f64>, prometheus::Error> {
    Ok(vec![0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0])
}

fn secs_buckets() -> Result<Vec<f64>, prometheus::Error> {
    prometheus::exponential_buckets(0.001, 2.0, 18)
}

fn grad_norm_buckets() -> Result<Vec<f64>, prometheus::Error> {
    prometheus::exponential_buckets(0.01, 2.0, 18)
}

/// Declares `TrainMetrics` from one table of `field: kind("name", "help", [labels] [,
/// buckets]);` rows (`batches_dropped` counts into the row it names), and `TrainMetrics::register_table`, which registers each row.
macro_rules! train_metrics {
    (batches_dropped from $dropped:ident; $(
        $(#[doc = $doc:literal])*
        $field:ident: $kind:ident($name:literal, $help:literal, [$($label:literal),*]
            $(, $buckets:expr)?);
    )*) => {
        /// The metric handles of one training run. Cheap to clone; all clones share one
        /// registry.
        #[derive(Clone)]
        pub struct TrainMetrics {
            registry: Registry,
            branch: BranchCell,
            gauges: Vec<GaugeVec>,
            names: Vec<String>,
            started: Instant,
            /// The exported learner statistics (MT-6), each with its gauge.
            learner: Vec<(BranchGauge, Stat)>,
            /// Batches dropped (any reason; kept for the call sites that do not say why).
            pub batches_dropped: DroppedCounter,
            /// 1, labelled with the config hash and mode.
            pub run_info: GaugeVec,
            $( $(#[doc = $doc])* pub $field: train_metrics!(@type $kind), )*
        }

        impl TrainMetrics {
            /// Registers every row of the table on `b`; `run_info` and the learner gauges are
            /// registered by the caller.
            fn register_table(
                mut b: Builder<'_>,
                learner: Vec<(BranchGauge, Stat)>,
                run_info: GaugeVec,
            ) -> Result<Self, prometheus::Error> {
                $( let $field = train_metrics!(@make b, $kind, $name, $help, [$($label),*]
                    $(, $buckets)?); )*
                Ok(TrainMetrics {
                    batches_dropped: DroppedCounter($dropped.clone()),
                    $( $field, )*
                    learner,
                    run_info,
                    registry: b.registry.clone(),
                    branch: b.branch,
                    gauges: b.gauges,
                    names: b.names,
                    started: Instant::now(),
                })
            }
        }
    };
    (@type gauge) => { BranchGauge };
    (@type counter) => { BranchCounter };
    (@type histogram) => { BranchHistogram };
    (@make $b:ident, gauge, $name:literal, $help:literal, [$($label:literal),*]) => {
        $b.gauge($name, $help, &[$($label),*])?
    };
    (@make $b:ident, counter, $name:literal, $help:literal, [$($label:literal),*]) => {
        $b.counter($name, $help, &[$($label),*])?
    };
    (@make $b:ident, histogram, $name:literal, $help:literal, [$($label:literal),*],
        $buckets:expr) => {
        $b.histogram($name, $help, &[$($label),*], $buckets?)?
    };
}

train_metrics! {
    batches_dropped from batches_dropped_by;
    /// Learner updates taken.
    learner_step: gauge("keel_learner_step", "Learner updates taken on this branch's lineage", []);
    /// Current policy version.
    policy_version: gauge("keel_policy_version", "Current policy version", []);
    /// Updates applied (counter, for rates and the stall alert).
    learner_steps: counter(
        "keel_learner_steps_total",
        "Learner updates applied by this process",
        []
    );
    /// Gradient norm before clipping (distribution).
    grad_norm_hist: histogram(
        "keel_actor_grad_norm_histogram",
        "Gradient L2 norm before clipping, every step",
        [],
        grad_norm_buckets()
    );
    /// Learning rate in force.
    lr: gauge("keel_actor_lr", "Learning rate in force", []);
    /// Seconds per learner step.
    step_seconds: histogram(
        "keel_learner_step_seconds",
        "Seconds per learner step",
        [],
        secs_buckets()
    );
    /// Updates refused because the loss or gradient was non-finite (GD-1).
    nonfinite_steps: counter(
        "keel_learner_nonfinite_steps_total",
        "Updates skipped for a non-finite loss or gradient",
        []
    );
    /// Fraction of wall time the learner waited for batches.
    learner_idle_ratio: gauge(
        "keel_trainer_idle_ratio",
        "Fraction of wall time the learner waited for batches since the last step",
        []
    );
    /// Success rate of the last training batch, by `env`.
    rollout_success: gauge(
        "keel_rollout_success_rate",
        "Success rate of the last training batch",
        ["env"]
    );
    /// Mean final reward of the last training batch, by `env`.
    rollout_reward: gauge(
        "keel_rollout_reward_mean",
        "Mean final reward of the last training batch",
        ["env"]
    );
    /// Mean agent turns per episode of the last batch.
    episode_turns: gauge(
        "keel_rollout_episode_turns_mean",
        "Mean agent turns per episode in the last batch",
        []
    );
    /// Mean model tokens per episode of the last batch.
    response_length: gauge(
        "keel_rollout_response_length_mean",
        "Mean model tokens per episode in the last batch",
        []
    );
    /// Mean trajectories per episode of the last batch (RB-4).
    segments_per_episode: gauge(
        "keel_rollout_segments_per_episode",
        "Mean trajectories per episode in the last batch: above 1 when agents rewrite their history",
        []
    );
    /// Invalid-action rate (per turn) of the last batch.
    rollout_invalid_rate: gauge(
        "keel_rollout_invalid_action_rate",
        "Invalid actions per turn in the last batch",
        []
    );
    /// Model tokens sampled per second of generation.
    generated_tokens_per_s: gauge(
        "keel_perf_generated_tokens_per_second",
        "Model tokens sampled per second by one generator",
        []
    );
    /// Policy-version lag of each trained model token.
    token_staleness: histogram(
        "keel_rollout_token_staleness_versions",
        "Policy versions between a trained token's sampling and its update",
        [],
        lag_buckets()
    );
    /// Policy-version lag of each trained trajectory (its oldest turn).
    trajectory_staleness: histogram(
        "keel_rollout_trajectory_staleness_versions",
        "Policy versions between a trained trajectory's oldest turn and its update",
        [],
        lag_buckets()
    );
    /// Largest lag in the last trained batch.
    staleness_max: gauge(
        "keel_rollout_staleness_max_versions",
        "Largest policy-version lag in the last trained batch",
        []
    );
    /// The staleness bound in force (0 in sync mode).
    staleness_bound: gauge(
        "keel_rollout_staleness_bound",
        "The staleness bound in force (0 in sync mode)",
        []
    );
    /// Stored batches waiting for the learner.
    queue_depth: gauge("keel_rollout_queue_depth", "Stored batches waiting for the learner", []);
    /// Batches being sampled.
    batches_in_flight: gauge("keel_rollout_batches_in_flight", "Batches being sampled", []);
    /// Fraction of generator wall time spent idle.
    generator_idle_ratio: gauge(
        "keel_rollouter_idle_ratio",
        "Fraction of generator wall time spent idle since the last step",
        []
    );
    /// Fraction of the last batch's decode steps with at least 90% of the sampler's slots busy.
    sampler_utilization: gauge(
        "keel_rollout_sampler_utilization",
        "Fraction of the last stored batch's decode steps with at least 90% of the sampler's slots busy",
        []
    );
    /// Held-out evaluation success rate.
    eval_success: gauge("keel_eval_success_rate", "Held-out evaluation success rate", []);
    /// Batches trained on.
    batches_trained: counter("keel_rollout_batches_trained_total", "Batches trained on", []);
    /// Episodes that failed in their env (RO-4): counted, never trained.
    episodes_failed: counter(
        "keel_rollout_episodes_failed_total",
        "Episodes that failed in their env (agent died or timed out, reward service failed); never trained",
        []
    );
    /// Batches dropped, by `reason`.
    batches_dropped_by: counter(
        "keel_rollout_batches_dropped_total",
        "Batches dropped, by reason (stale, rewind, corrupt, other)",
        ["reason"]
    );
    /// Events a tracker (TensorBoard, MLflow) could not deliver, by `tracker` (TR-1).
    tracking_dropped: counter(
        "keel_tracking_events_dropped_total",
        "Events a tracker could not deliver (full queue, server down), by tracker",
        ["tracker"]
    );
    /// Store put latency by `object`.
    store_put_seconds: histogram(
        "keel_store_put_seconds",
        "Store put latency",
        ["object"],
        secs_buckets()
    );
    /// Store get latency by `object`.
    store_get_seconds: histogram(
        "keel_store_get_seconds",
        "Store get latency",
        ["object"],
        secs_buckets()
    );
    /// Bytes moved to or from the store, by `direction`.
    store_bytes: counter(
        "keel_store_bytes_total",
        "Bytes moved to (put) or from (get) the store",
        ["direction"]
    );
    /// Store operations that failed (after the store's own retries), by `op`.
    store_errors: counter(
        "keel_store_errors_total",
        "Store operations that failed after the store's retries",
        ["op"]
    );
    /// Store requests retried, as reported by the store.
    store_retries: counter("keel_store_retries_total", "Store requests retried", []);
    /// Corrupt objects moved to quarantine, by `object`.
    store_quarantined: counter(
        "keel_store_quarantined_objects_total",
        "Corrupt objects moved to quarantine, by object kind",
        ["object"]
    );
    /// Seconds to commit a checkpoint.
    checkpoint_commit_seconds: histogram(
        "keel_store_checkpoint_commit_seconds",
        "Seconds to snapshot and commit a checkpoint",
        [],
        secs_buckets()
    );
    /// Bytes of the last committed checkpoint.
    checkpoint_bytes: gauge(
        "keel_store_checkpoint_bytes",
        "Bytes of the last committed checkpoint",
        []
    );
    /// Unix time of the last committed checkpoint.
    last_checkpoint_time: gauge(
        "keel_store_last_checkpoint_timestamp_seconds",
        "Unix time of the last committed checkpoint",
        []
    );
    /// Seconds since the last committed checkpoint (computed at scrape time).
    seconds_since_checkpoint: gauge(
        "keel_store_seconds_since_checkpoint",
        "Seconds since the last committed checkpoint",
        []
    );
    /// Committed checkpoints.
    checkpoints: counter("keel_store_checkpoints_committed_total", "Checkpoints committed", []);
    /// Supervised actor restarts, by `kind`.
    actor_restarts: counter(
        "keel_runtime_actor_restarts_total",
        "Supervised actor restarts, by actor kind",
        ["kind"]
    );
    /// Live actors, by `kind`.
    actors_alive: gauge("keel_runtime_actors_alive", "Live actors, by actor kind", ["kind"]);
    /// Generator ranks the trainer addresses (`keel trainer`) or generator actors (`keel train`).
    generator_ranks: gauge(
        "keel_generator_ranks",
        "Generator ranks (keel trainer) or generator actors (keel train) of the run",
        []
    );
    /// Generator ranks that answer (not silent past `distributed.order_timeout_s`).
    generator_ranks_alive: gauge(
        "keel_generator_ranks_alive",
        "Generator ranks that answer work orders (not silent past the order timeout)",
        []
    );
    /// Work orders issued again after their rank went silent (RM-5).
    orders_reissued: counter(
        "keel_generator_orders_reissued_total",
        "Work orders issued again because their rank did not answer in time",
        []
    );
    /// Seconds to store one published weights version for other processes (SB-1).
    weights_publish_seconds: histogram(
        "keel_weights_publish_seconds",
        "Seconds to store one published weights version for generator processes",
        [],
        secs_buckets()
    );
    /// Seconds a generator process took to load an order's weights (as it reports them).
    weights_load_seconds: histogram(
        "keel_weights_load_seconds",
        "Seconds a generator process took to load the weights a work order names",
        [],
        secs_buckets()
    );
    /// Weight bytes stored (`publish`) and loaded by generator processes (`load`).
    weights_bytes: counter(
        "keel_weights_bytes_total",
        "Weight bytes stored for (publish) and loaded by (load) generator processes",
        ["direction"]
    );
    /// Work orders whose weights a generator process had loaded ahead (GW-5).
    weights_prefetched: counter(
        "keel_weights_prefetched_total",
        "Work orders whose weights a generator process had loaded ahead, while it sampled",
        []
    );
    /// 1 when a kind's restart budget is spent (SV-2), by `kind`.
    budget_exhausted: gauge(
        "keel_runtime_supervisor_budget_exhausted",
        "1 when an actor kind spent its restart budget",
        ["kind"]
    );
    /// Anomalies the collapse guard saw, by `kind`.
    guard_anomalies: counter(
        "keel_guard_anomalies_total",
        "Anomalies seen by the collapse guard, by kind",
        ["kind"]
    );
    /// Rewinds to a healthy checkpoint.
    guard_rewinds: counter("keel_guard_rewinds_total", "Rewinds to a healthy checkpoint", []);
    /// Non-finite skips in a row right now.
    guard_consecutive_skips: gauge("keel_guard_consecutive_skips", "Non-finite skips in a row", []);
    /// PATS: version of the scaffold bank in force.
    scaffold_version: gauge(
        "keel_pats_scaffold_version",
        "PATS: version of the scaffold bank in force",
        []
    );
    /// PATS: entries in the scaffold bank.
    scaffold_entries: gauge("keel_pats_scaffold_entries", "PATS: entries in the scaffold bank", []);
    /// 1 while the RL loop runs.
    rl_active: gauge("keel_run_rl_active", "1 while the RL loop runs", []);
}

impl TrainMetrics {
    /// Creates and registers every metric for run `run`, on branch `main`: the table above,
    /// the exported learner statistics (MT-6) and `keel_run_info`.
    pub fn new(run: &str) -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let mut b = Builder {
            registry: &registry,
            run,
            branch: BranchCell(Arc::new(RwLock::new("main".to_string()))),
            gauges: Vec::new(),
            names: vec!["keel_run_info".to_string()],
        };
        let learner = b.learner_gauges()?;
        let run_info = GaugeVec::new(
            Opts::new("keel_run_info", "Always 1; labels describe the run").const_label("run", run),
            &["branch", "config_hash", "mode"],
        )?;
        registry.register(Box::new(run_info.clone()))?;
        let m = Self::register_table(b, learner, run_info)?;
        if let Ok(g) = m.run_info.get_metric_with_label_values(&["main", "", ""]) {
            g.set(1.0);
        }
        Ok(m)
    }

    /// The gauge of an exported learner statistic (None when `stat` is not exported).
    pub fn stat(&self, stat: Stat) -> Option<&BranchGauge> {
        self.learner
            .iter()
            .find(|(_, s)| *s == stat)
            .map(|(g, _)| g)
    }

    /// The registry to serve on `/metrics`.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The current branch label.
    pub fn branch(&self) -> String {
        self.branch.get()
    }

    /// Switches every series to branch `name`, dropping the old branch's gauges (MT-4).
    pub fn set_branch(&self, name: &str) {
        match self.branch.0.write() {
            Ok(mut g) => *g = name.to_string(),
            Err(p) => *p.into_inner() = name.to_string(),
        }
        for g in &self.gauges {
            g.reset();
        }
        self.run_info.reset();
    }

    /// Sets the run-info series (config hash, mode) on the current branch.
    pub fn set_run_info(&self, config_hash: &str, mode: &str) {
        self.run_info.reset();
        if let Ok(g) =
            self.run_info
                .get_metric_with_label_values(&[self.branch().as_str(), config_hash, mode])
        {
            g.set(1.0);
        }
    }

    /// Records one learner step's learner-side numbers: every exported statistic (MT-6), the
    /// step counters and the grad-norm and step-time histograms.
    pub fn record_step(&self, step: u64, m: &StepMetrics) {
        self.learner_step.set(step as f64);
        self.policy_version.set(step as f64);
        self.learner_steps.inc();
        for (gauge, stat) in &self.learner {
            gauge.set(m.get(*stat));
        }
        if m.grad_norm.is_finite() {
            self.grad_norm_hist.observe(m.grad_norm);
        }
        self.step_seconds.observe(m.step_seconds);
        self.batches_trained.inc();
    }

    /// Records a committed checkpoint of `bytes` bytes that took `seconds`.
    pub fn record_checkpoint(&self, bytes: u64, seconds: f64) {
        self.checkpoints.inc();
        self.checkpoint_bytes.set(bytes as f64);
        self.checkpoint_commit_seconds.observe(seconds);
        self.last_checkpoint_time.set(crate::process::unix_secs());
    }

    /// Seconds since this handle was created.
    pub fn uptime_seconds(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// The text exposition of every metric; refreshes the scrape-time gauges first.
    pub fn render(&self) -> String {
        let last = self.last_checkpoint_time.get();
        if last > 0.0 {
            self.seconds_since_checkpoint
                .set((crate::process::unix_secs() - last).max(0.0));
        }
        let mut buf = Vec::new();
        let enc = prometheus::TextEncoder::new();
        if let Err(e) = prometheus::Encoder::encode(&enc, &self.registry.gather(), &mut buf) {
            return format!("# encoding failed: {e}\n");
        }
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// The names of every registered metric family (MT-5).
    pub fn names(&self) -> Vec<String> {
        let mut names = self.names.clone();
        names.sort();
        names
    }
}

/// Busy/idle accounting of `slots` workers, integrated over time: the idle ratio of an interval
/// is `1 - ∫busy dt / (slots · interval)`.
#[derive(Debug, Clone)]
pub struct Utilization {
    slots: usize,
    busy: usize,
    last_change: Instant,
    busy_integral: f64,
    window_start: Instant,
}

impl Utilization {
    /// All `slots` idle from now.
    pub fn new(slots: usize) -> Self {
        let now = Instant::now();
        Self {
            slots: slots.max(1),
            busy: 0,
            last_change: now,
            busy_integral: 0.0,
            window_start: now,
        }
    }

    fn integrate(&mut self, now: Instant) {
        self.busy_integral += self.busy as f64 * now.duration_since(self.last_change).as_secs_f64();
        self.last_change = now;
    }

    /// `busy` workers are busy from now on.
    pub fn set_busy(&mut self, busy: usize) {
        self.integrate(Instant::now());
        self.busy = busy.min(self.slots);
    }

    /// The idle ratio since the previous call, and starts a new interval.
    pub fn take_idle_ratio(&mut self) -> f64 {
        let now = Instant::now();
        self.integrate(now);
        let wall = now.duration_since(self.window_start).as_secs_f64() * self.slots as f64;
        let ratio = if wall > 0.0 {
            (1.0 - self.busy_integral / wall).clamp(0.0, 1.0)
        } else {
            0.0
        };
        self.busy_integral = 0.0;
        self.window_start = now;
        ratio
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mt1_every_series_has_run_and_branch() {
        let m = TrainMetrics::new("r1").expect("metrics");
        m.stat(Stat::GradNorm).expect("exported").set(1.5);
        m.rollout_success.set_for("calc", 0.5);
        m.actor_restarts.inc_for("generator", 1);
        let text = m.render();
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            assert!(line.contains("run=\"r1\""), "{line}");
            assert!(line.contains("branch=\"main\""), "{line}");
        }
        assert!(
            text.contains("keel_actor_grad_norm{branch=\"main\",run=\"r1\"} 1.5"),
            "{text}"
        );
    }

    #[test]
    fn mt4_branch_switch_drops_old_gauges_keeps_counters() {
        let m = TrainMetrics::new("r").expect("metrics");
        m.stat(Stat::GradNorm).expect("exported").set(9.0);
        m.learner_steps.inc();
        m.set_branch("main-r1");
        m.stat(Stat::GradNorm).expect("exported").set(1.0);
        let text = m.render();
        assert!(
            !text.contains("keel_actor_grad_norm{branch=\"main\""),
            "{text}"
        );
        assert!(
            text.contains("keel_actor_grad_norm{branch=\"main-r1\""),
            "{text}"
        );
        assert!(
            text.contains("keel_learner_steps_total{branch=\"main\",run=\"r\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn seconds_since_checkpoint_is_computed_at_scrape() {
        let m = TrainMetrics::new("r").expect("metrics");
        m.record_checkpoint(10, 0.1);
        assert!(m.render().contains("keel_store_seconds_since_checkpoint"));
    }

    #[test]
    fn utilization_integrates_busy_time() {
        let mut u = Utilization::new(2);
        u.set_busy(2);
        std::thread::sleep(std::time::Duration::from_millis(20));
        u.set_busy(0);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let idle = u.take_idle_ratio();
        assert!((0.3..0.7).contains(&idle), "idle {idle}");
        u.set_busy(2);
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert!(u.take_idle_ratio() < 0.1);
    }
}
