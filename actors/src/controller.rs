//! The controller: owns the policy version, admits generation under the staleness bound, feeds
//! stored batches to the learner, publishes weights and schedules checkpoints.
//!
//! Invariants:
//! - AS-1 (staleness admission): a batch may start sampling only while
//!   `generating + ready + training <= bound`; each of those produces one update before the new
//!   batch is trained, so its tokens are at most `bound` versions old when used. Sync mode is
//!   bound 0: sample, train, publish, repeat. The learner re-checks every turn (LA-2).
//! - CT-1: the version only moves when the learner answers an update; the new weights are
//!   published to the board (WB-1) before any further generation is admitted.
//! - CT-2: a checkpoint is taken between two updates (the learner is idle) and records the
//!   frontier (DF-1) with every range handed out but not yet trained on as pending.
//! - CT-3: a generator panic or a dropped batch gives its task range back to the cursor; no range
//!   is lost. A restart budget overrun ends the run with an error.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use actix::prelude::*;
use keel_envs::{task_seed, Split};
use keel_store::{BatchKey, DataPosition, NewCheckpoint, RunStore};

use crate::config::TrainConfig;
use crate::error::ActorError;
use crate::events::{EventSink, TrainEvent};
use crate::frontier::{Frontier, TaskCursor};
use crate::generator::{Generate, Generated, Generator, Purpose};
use crate::learner_actor::{LearnerActor, Snapshot, TrainOn, Trained};
use crate::metrics::TrainMetrics;
use crate::rollout::TaskRef;
use crate::supervision::RestartBudget;
use crate::weights::WeightBoard;

/// A stored batch waiting for the learner.
#[derive(Debug, Clone)]
pub struct ReadyBatch {
    /// Its key.
    pub key: BatchKey,
    /// Its sequence number.
    pub batch_seq: u64,
    /// Its first task id.
    pub first_task: u64,
}

/// How the RL loop ended.
#[derive(Debug, Clone, Default)]
pub struct LoopOutcome {
    /// Final policy version.
    pub version: u64,
    /// Last committed checkpoint.
    pub last_checkpoint: Option<String>,
    /// Batches dropped during the loop.
    pub dropped_batches: u64,
}

/// Everything the controller is started with.
pub struct ControllerSetup {
    /// The job config.
    pub cfg: Arc<TrainConfig>,
    /// The run root.
    pub store: RunStore,
    /// Runtime for store I/O.
    pub io: tokio::runtime::Handle,
    /// Metrics.
    pub metrics: TrainMetrics,
    /// Where weights are published.
    pub board: WeightBoard,
    /// Generator actors.
    pub generators: Vec<Addr<Generator>>,
    /// The learner.
    pub learner: Addr<LearnerActor>,
    /// Restart budgets to watch (SV-2).
    pub budgets: Vec<RestartBudget>,
    /// Event sink.
    pub events: EventSink,
    /// Version the learner holds now.
    pub version: u64,
    /// Frontier to continue from.
    pub frontier: Frontier,
    /// Batches found in the store to train on first.
    pub reuse: Vec<ReadyBatch>,
    /// The checkpoint this run continues from (the new checkpoints' parent).
    pub parent_checkpoint: Option<String>,
    /// The reference-anchor checkpoint.
    pub reference: Option<String>,
    /// Metrics to carry into every checkpoint (e.g. the pre-RL eval).
    pub carried_metrics: BTreeMap<String, f64>,
    /// Where to report the end of the loop.
    pub done: tokio::sync::oneshot::Sender<Result<LoopOutcome, ActorError>>,
}

/// The controller actor.
pub struct Controller {
    s: ControllerSetup,
    done: Option<tokio::sync::oneshot::Sender<Result<LoopOutcome, ActorError>>>,
    cursor: TaskCursor,
    next_batch_seq: u64,
    gen_busy: Vec<Option<u64>>,
    generating: BTreeMap<u64, u64>,
    ready: VecDeque<ReadyBatch>,
    training: Option<ReadyBatch>,
    checkpointing: bool,
    consumed_since_checkpoint: Vec<u64>,
    checkpointed_version: Option<u64>,
    dropped: u64,
    last_metrics: BTreeMap<String, f64>,
    finished: bool,
}

impl Controller {
    /// A controller from its setup.
    pub fn new(mut s: ControllerSetup) -> Self {
        let (tx, _) = tokio::sync::oneshot::channel();
        let done = Some(std::mem::replace(&mut s.done, tx));
        let cursor = TaskCursor::new(&s.frontier, s.cfg.rollout.tasks_per_batch as u64);
        let ready: VecDeque<ReadyBatch> = s.reuse.drain(..).collect();
        Self {
            next_batch_seq: s.frontier.next_batch_seq,
            gen_busy: vec![None; s.generators.len()],
            cursor,
            generating: BTreeMap::new(),
            ready,
            training: None,
            checkpointing: false,
            consumed_since_checkpoint: Vec::new(),
            checkpointed_version: Some(s.version),
            dropped: 0,
            last_metrics: BTreeMap::new(),
            finished: false,
            done,
            s,
        }
    }

    fn bound(&self) -> u64 {
        self.s.cfg.staleness_bound()
    }

    fn outstanding(&self) -> u64 {
        (self.generating.len() + self.ready.len() + usize::from(self.training.is_some())) as u64
    }

    fn finish(&mut self, ctx: &mut Context<Self>, result: Result<(), ActorError>) {
        if self.finished {
            return;
        }
        self.finished = true;
        let outcome = result.map(|()| LoopOutcome {
            version: self.s.version,
            last_checkpoint: self.s.parent_checkpoint.clone(),
            dropped_batches: self.dropped,
        });
        if let Some(tx) = self.done.take() {
            let _ = tx.send(outcome);
        }
        ctx.stop();
    }

    fn pump(&mut self, ctx: &mut Context<Self>) {
        if self.finished {
            return;
        }
        if let Some(b) = self.s.budgets.iter().find(|b| b.exhausted()) {
            let err = ActorError::RestartBudgetExhausted { kind: b.kind(), restarts: b.used(), budget: b.max_restarts() };
            return self.finish(ctx, Err(err));
        }
        let steps = self.s.cfg.run.steps;
        if self.s.version >= steps && self.training.is_none() && !self.checkpointing {
            if self.checkpointed_version != Some(self.s.version) {
                return self.checkpoint(ctx);
            }
            return self.finish(ctx, Ok(()));
        }
        if self.training.is_none() && !self.checkpointing && self.s.version < steps {
            if let Some(batch) = self.ready.pop_front() {
                self.train(batch, ctx);
            }
        }
        for g in 0..self.s.generators.len() {
            let wanted = self.s.version + self.outstanding() < steps;
            if self.gen_busy[g].is_some() || !wanted || self.outstanding() > self.bound() {
                continue;
            }
            self.generate(g, ctx);
        }
    }

    fn generate(&mut self, g: usize, ctx: &mut Context<Self>) {
        let first = self.cursor.take();
        let seq = self.next_batch_seq;
        self.next_batch_seq += 1;
        self.gen_busy[g] = Some(seq);
        self.generating.insert(seq, first);
        let n = self.s.cfg.rollout.tasks_per_batch as u64;
        let tasks = (first..first + n).map(|id| TaskRef { task_id: id, task_seed: task_seed(Split::Train, id) }).collect();
        let msg = Generate { batch_seq: seq, tasks, purpose: Purpose::Train };
        self.s.generators[g]
            .send(msg)
            .into_actor(self)
            .map(move |res, act, ctx| {
                act.gen_busy[g] = None;
                act.generating.remove(&seq);
                match res.map_err(|e| ActorError::Mailbox(e.to_string())).and_then(|r| r) {
                    Ok(Generated { key: Some(key), .. }) => {
                        act.ready.push_back(ReadyBatch { key, batch_seq: seq, first_task: first });
                    }
                    Ok(Generated { key: None, .. }) => {
                        return act.finish(ctx, Err(ActorError::Internal("train batch was not stored".into())));
                    }
                    Err(ActorError::GeneratorPanicked(p)) => {
                        tracing::warn!(batch_seq = seq, panic = %p, "retrying the batch's tasks after a generator panic");
                        act.s.metrics.actor_restarts.inc();
                        act.cursor.give_back(first);
                    }
                    Err(e) => return act.finish(ctx, Err(e)),
                }
                act.pump(ctx);
            })
            .spawn(ctx);
    }

    fn train(&mut self, batch: ReadyBatch, ctx: &mut Context<Self>) {
        let msg = TrainOn { key: batch.key.clone(), bound: self.bound() };
        self.training = Some(batch);
        self.s
            .learner
            .send(msg)
            .into_actor(self)
            .map(|res, act, ctx| {
                let Some(batch) = act.training.take() else {
                    return act.finish(ctx, Err(ActorError::Internal("training slot empty".into())));
                };
                match res.map_err(|e| ActorError::Mailbox(e.to_string())).and_then(|r| r) {
                    Ok(trained) => act.on_trained(batch, trained, ctx),
                    Err(ActorError::Stale { batch_seq, lag, bound }) => {
                        act.dropped += 1;
                        act.s.metrics.batches_dropped.inc();
                        act.cursor.give_back(batch.first_task);
                        let reason = format!("a turn was {lag} versions old, over the bound {bound}");
                        tracing::warn!(batch_seq, %reason, "dropped a stale batch; its tasks are regenerated");
                        (act.s.events)(&TrainEvent::Dropped { batch_seq, reason });
                    }
                    Err(e) => return act.finish(ctx, Err(e)),
                }
                act.pump(ctx);
            })
            .spawn(ctx);
    }

    fn on_trained(&mut self, batch: ReadyBatch, t: Trained, ctx: &mut Context<Self>) {
        self.s.version = t.version;
        self.s.board.publish(t.weights);
        self.consumed_since_checkpoint.push(batch.batch_seq);
        let m = &self.s.metrics;
        m.record_step(t.version, &t.metrics);
        m.rollout_success.set(t.success_rate);
        m.rollout_reward.set(t.metrics.mean_reward);
        m.rollout_invalid_rate.set(t.invalid_rate);
        for &lag in &t.turn_lags {
            m.staleness.observe(lag as f64);
        }
        self.last_metrics = BTreeMap::from([
            ("loss".to_string(), t.metrics.loss),
            ("rollout_success".to_string(), t.success_rate),
            ("grad_norm".to_string(), t.metrics.grad_norm),
            ("entropy".to_string(), t.metrics.entropy),
        ]);
        (self.s.events)(&TrainEvent::Step {
            step: t.version,
            total: self.s.cfg.run.steps,
            batch_seq: t.batch_seq,
            metrics: t.metrics,
            success: t.success_rate,
            invalid_rate: t.invalid_rate,
            max_lag: t.turn_lags.iter().copied().max().unwrap_or(0),
        });
        let every = self.s.cfg.run.checkpoint_every;
        if t.version % every == 0 || t.version >= self.s.cfg.run.steps {
            self.checkpoint(ctx);
        }
    }

    fn checkpoint(&mut self, ctx: &mut Context<Self>) {
        self.checkpointing = true;
        let version = self.s.version;
        let in_flight: Vec<u64> = self.generating.values().copied().chain(self.ready.iter().map(|b| b.first_task)).collect();
        let frontier = self.cursor.frontier(in_flight, self.next_batch_seq);
        let mut metrics = self.s.carried_metrics.clone();
        metrics.extend(self.last_metrics.clone());
        let data = DataPosition {
            next_task_index: frontier.next_task,
            next_batch_seq: frontier.next_batch_seq,
            consumed_batches: std::mem::take(&mut self.consumed_since_checkpoint),
            pending_tasks: frontier.pending.clone(),
        };
        let store: RunStore = self.s.store.clone();
        let io = self.s.io.clone();
        let learner = self.s.learner.clone();
        let parent = self.s.parent_checkpoint.clone();
        let reference = self.s.reference.clone();
        let config_hash = self.s.cfg.config_hash();
        let fut = async move {
            let files = learner.send(Snapshot).await.map_err(|e| ActorError::Mailbox(e.to_string()))??;
            let ckpt = NewCheckpoint {
                parent,
                step: version,
                policy_version: version,
                config_hash,
                reference,
                tags: Vec::new(),
                data,
                metrics,
                files: files.into_iter().map(|(n, b)| (n, bytes::Bytes::from(b))).collect(),
            };
            let manifest = io
                .spawn(async move { store.commit_checkpoint(ckpt).await })
                .await
                .map_err(|e| ActorError::Internal(format!("checkpoint task: {e}")))??;
            Ok::<_, ActorError>(manifest)
        };
        fut.into_actor(self)
            .map(move |res, act, ctx| {
                act.checkpointing = false;
                match res {
                    Ok(manifest) => {
                        act.checkpointed_version = Some(version);
                        act.s.metrics.checkpoints.inc();
                        tracing::info!(id = %manifest.id, step = version, "checkpoint committed");
                        (act.s.events)(&TrainEvent::Checkpoint { id: manifest.id.clone(), step: version });
                        act.s.parent_checkpoint = Some(manifest.id);
                    }
                    Err(e) => return act.finish(ctx, Err(e)),
                }
                act.pump(ctx);
            })
            .spawn(ctx);
    }
}

impl Actor for Controller {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.pump(ctx);
    }
}
