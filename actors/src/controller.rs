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
//! - CT-5 (stop): once the stop signal is set (SIGTERM) no generation or update starts; after the
//!   update in progress a checkpoint is committed (ranges in flight recorded as pending, DF-1) and
//!   the loop ends with `stopped`.
//! - CT-6: every checkpoint records the task ranges trained on and the batches dropped since its
//!   parent (`consumed_tasks`, `dropped_batches`), so the lineage accounts for every task id; a
//!   corrupt batch is quarantined (QU-1), counted, and its range regenerated.
//! - CT-7 (methods): what is generated next, what a held batch consumes, the review after a
//!   trained batch, the reference resets and what a checkpoint records (`method_state`) are the
//!   method runtime's (`crate::method`, MR-1..4; RTPO trees, the PATS scaffold and ARMOR
//!   reference resets follow MS-1..3); the controller never asks which method runs.
//! - CT-3: a generator panic or a dropped batch gives its task range back to the cursor; no range
//!   is lost. A restart budget overrun ends the run with an error.
//! - CT-8: when every episode of `MAX_FAILED_BATCHES_IN_A_ROW` training batches in a row failed
//!   in the env (e.g. a server that answers `/info` but fails every `/reset`), the run ends with
//!   an error naming the env and the last failure instead of retrying for ever.
//! - CT-9 (one writer): before every checkpoint commit the controller checks that its trainer
//!   life is still the newest (LV-2) and commits expecting exactly the head generation it last
//!   saw (LV-3); a superseded or fenced-out trainer ends with that error and writes nothing. A
//!   generator it reaches is a `GeneratorHandle` (an actor here, a rank elsewhere, GH-1); a rank
//!   that went silent gets no work until it is heard from again (GH-2).
//! - CT-4 (collapse guard, GD-1..5): every learner result goes through the `CollapseGuard`; a
//!   non-finite update is skipped (its batch is used up, its range recorded as skipped), and a
//!   rewind restores the newest `healthy` checkpoint on the lineage into the learner, starts a
//!   new branch from it (its first checkpoint, tagged `rewind`, is committed before training goes
//!   on), drops every batch sampled on the abandoned branch, continues the data stream from the target's frontier (RW-1: what
//!   the abandoned branch trained after it is owed again) and publishes the restored weights
//!   under a new board epoch (WB-3). See `controller/rewind.rs`.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use keel_envs::{task_seed, Split};
use keel_store::{BatchKey, CheckpointManifest, DataPosition, ExpectHead, NewCheckpoint, RunStore};

use crate::config::TrainConfig;
use crate::error::ActorError;
use crate::events::{EventSink, MethodDetail, TrainEvent};
use crate::frontier::{Frontier, TaskCursor};
use crate::generator::{Generate, Generated, Purpose};
use crate::guard::{CollapseGuard, Verdict, HEALTHY_TAG};
use crate::learner_actor::{LearnerActor, ResetReference, Snapshot, TrainOn, Trained};
use crate::method::plain::Plain;
use crate::method::{MethodIo, MethodRuntime, Planned, Review, StateKeys, REFERENCE_RESET_TAG};
use crate::metrics::{TrainMetrics, Utilization};
use crate::remote::GeneratorHandle;
use crate::rollout::TaskRef;
use crate::supervision::RestartBudget;
use crate::weights::{Board, PublishedReference};

/// A stored batch waiting for the learner.
#[derive(Debug, Clone)]
pub struct ReadyBatch {
    /// Its key.
    pub key: BatchKey,
    /// Its sequence number.
    pub batch_seq: u64,
    /// Its first task id.
    pub first_task: u64,
    /// Its range is held by the method (MR-2; RTPO's sibling batches): it is not given back
    /// when the batch is dropped (the method samples it again, MS-1).
    pub branch: bool,
    /// PATS: its rollout groups, for the review after training (empty otherwise).
    pub groups: Arc<Vec<keel_envs::scaffold::GroupRecord>>,
}

impl ReadyBatch {
    /// A batch of plain groups.
    pub fn plain(key: BatchKey, batch_seq: u64, first_task: u64) -> Self {
        ReadyBatch {
            key,
            batch_seq,
            first_task,
            branch: false,
            groups: Arc::default(),
        }
    }
}

/// What the learner did with a batch it used up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Used {
    /// An update was applied.
    Trained,
    /// The update was non-finite and refused (GD-1).
    Skipped,
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
    /// The loop ended on a stop request (CT-5).
    pub stopped: bool,
    /// The branch the loop ended on (a rewind moves it, CT-4).
    pub branch: String,
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
    pub board: Arc<dyn Board>,
    /// The generators: actors in this process or ranks in others.
    pub generators: Vec<Arc<dyn GeneratorHandle>>,
    /// This trainer's life and the store of the branch it was claimed on (LV-2).
    pub life: (u64, RunStore),
    /// The head generation the first commit expects (LV-3; `None`: the branch has no head).
    pub head_generation: Option<u64>,
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
    /// Batches dropped when the job resumed; recorded in the first checkpoint (CT-6).
    pub dropped_on_resume: Vec<u64>,
    /// Set to stop with a checkpoint (CT-5).
    pub stop: crate::process::StopSignal,
    /// Method state of the checkpoint resumed from (MS-1..3).
    pub method_state: BTreeMap<String, String>,
    /// The method's runtime, started (`MethodRuntime::start`) from `method_state` (MR-1..4).
    pub method: Box<dyn MethodRuntime>,
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
    /// Batch sequence number → (first task, epoch) of every generation order not yet answered.
    generating: BTreeMap<u64, (u64, u64)>,
    ready: VecDeque<ReadyBatch>,
    training: Option<ReadyBatch>,
    checkpointing: bool,
    consumed_since_checkpoint: Vec<u64>,
    consumed_tasks_since_checkpoint: Vec<u64>,
    /// Ranges whose update was skipped as non-finite since the last checkpoint (GD-1).
    skipped_tasks_since_checkpoint: Vec<u64>,
    dropped_since_checkpoint: Vec<u64>,
    checkpointed_version: Option<u64>,
    dropped: u64,
    last_metrics: BTreeMap<String, f64>,
    finished: bool,
    guard: CollapseGuard,
    /// Bumped by every rewind; generation results of an older epoch are discarded (CT-4).
    epoch: u64,
    rewinding: bool,
    /// Tags for the next checkpoint (a rewind's reason).
    next_tags: Vec<String>,
    gen_util: Utilization,
    learner_util: Utilization,
    /// The method's runtime: its work plan, state and checkpoint entries (CT-7).
    method: Box<dyn MethodRuntime>,
    /// A method state object is being stored; nothing new starts until it is (MS-2).
    writing_state: bool,
    /// This life's tag in method state keys (MS-4).
    life_tag: String,
    /// The head generation this life's next commit expects (LV-3); `None`: no head yet.
    head_generation: Option<u64>,
    /// Training batches in a row whose every episode failed in the env (CT-8).
    failed_batches_in_a_row: u32,
}

/// CT-8: batches in a row whose every episode failed before the run ends.
pub const MAX_FAILED_BATCHES_IN_A_ROW: u32 = 3;

mod rewind;

impl Controller {
    /// A controller from its setup.
    pub fn new(mut s: ControllerSetup) -> Self {
        let (tx, _) = tokio::sync::oneshot::channel();
        let done = Some(std::mem::replace(&mut s.done, tx));
        let mut cursor = TaskCursor::new(&s.frontier, s.cfg.rollout.tasks_per_batch as u64);
        let mut method = std::mem::replace(&mut s.method, Box::new(Plain));
        // MR-2, MS-1: a range the method holds keeps it; the cursor must not hand it out again.
        if let Some(first) = method.held_range() {
            if !cursor.claim(first) {
                method.abandon();
            }
        }
        let ready: VecDeque<ReadyBatch> = s.reuse.drain(..).collect();
        let mut guard = CollapseGuard::new(s.cfg.guard.clone());
        // GD-7: the rewinds so far, and the learning rate they cut, survive a restart.
        if let Some(text) = s.method_state.get(crate::guard::GUARD_STATE) {
            match serde_json::from_str::<crate::guard::GuardState>(text) {
                Ok(state) => guard.restore(state),
                Err(e) => {
                    tracing::warn!(error = %e, "ignoring the checkpoint's collapse-guard state; the guard starts fresh")
                }
            }
        }
        let lr = s.cfg.guard.rewound_lr(s.cfg.learner.lr, guard.rewinds());
        if guard.rewinds() > 0 {
            tracing::info!(
                rewinds = guard.rewinds(),
                lr,
                "collapse guard: continuing after earlier rewinds"
            );
            s.learner.do_send(crate::learner_actor::SetLearningRate(lr));
        }
        if s.metrics.branch() != s.store.branch() {
            s.metrics.set_branch(s.store.branch());
        }
        let c = Self {
            guard,
            epoch: 0,
            rewinding: false,
            next_tags: Vec::new(),
            method,
            writing_state: false,
            life_tag: crate::process::life_tag(),
            head_generation: s.head_generation,
            failed_batches_in_a_row: 0,
            gen_util: Utilization::new(s.generators.len()),
            learner_util: Utilization::new(1),
            next_batch_seq: s.frontier.next_batch_seq,
            gen_busy: vec![None; s.generators.len()],
            cursor,
            generating: BTreeMap::new(),
            ready,
            training: None,
            checkpointing: false,
            consumed_since_checkpoint: Vec::new(),
            consumed_tasks_since_checkpoint: Vec::new(),
            skipped_tasks_since_checkpoint: Vec::new(),
            dropped_since_checkpoint: std::mem::take(&mut s.dropped_on_resume),
            checkpointed_version: Some(s.version),
            dropped: 0,
            last_metrics: BTreeMap::new(),
            finished: false,
            done,
            s,
        };
        c.export_static(lr);
        c
    }

    /// Sets the gauges that describe the run rather than a step (again after a branch switch).
    fn export_static(&self, lr: f64) {
        let (m, cfg) = (&self.s.metrics, &self.s.cfg);
        m.set_run_info(
            &cfg.config_hash(),
            if cfg.staleness_bound() == 0 {
                "sync"
            } else {
                "async"
            },
        );
        m.staleness_bound.set(cfg.staleness_bound() as f64);
        m.lr.set(lr);
        m.rl_active.set(1.0);
        m.actors_alive
            .set_for("generator", self.s.generators.len() as f64);
        m.generator_ranks.set(self.s.generators.len() as f64);
        m.orders_reissued.inc_by(0);
        m.weights_prefetched.inc_by(0);
        m.actors_alive
            .set_for("env_shard", cfg.rollout.env_shards as f64);
        m.actors_alive.set_for("learner", 1.0);
        m.last_checkpoint_time.set(crate::process::unix_secs());
        // Counters exist from the start, so that `increase()` sees their first event.
        m.learner_steps.inc_by(0);
        m.nonfinite_steps.inc_by(0);
        m.store_quarantined.inc_for("batch", 0);
        m.guard_rewinds.inc_by(0);
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
        self.s.metrics.rl_active.set(0.0);
        let outcome = result.map(|()| LoopOutcome {
            version: self.s.version,
            last_checkpoint: self.s.parent_checkpoint.clone(),
            dropped_batches: self.dropped,
            branch: self.s.store.branch().to_string(),
            stopped: self.s.stop.requested(),
        });
        if let Some(tx) = self.done.take() {
            let _ = tx.send(outcome);
        }
        ctx.stop();
    }

    fn pump(&mut self, ctx: &mut Context<Self>) {
        if self.finished || self.rewinding || self.writing_state {
            return;
        }
        self.observe_loop();
        if let Some(b) = self.s.budgets.iter().find(|b| b.exhausted()) {
            let err = ActorError::RestartBudgetExhausted {
                kind: b.kind(),
                restarts: b.used(),
                budget: b.max_restarts(),
            };
            return self.finish(ctx, Err(err));
        }
        let steps = self.s.cfg.run.steps;
        let stopping = self.s.stop.requested();
        if (self.s.version >= steps || stopping) && self.training.is_none() && !self.checkpointing {
            if self.checkpointed_version != Some(self.s.version) {
                return self.checkpoint(ctx);
            }
            return self.finish(ctx, Ok(()));
        }
        if stopping {
            return; // CT-5: nothing new starts; the update in progress ends in a checkpoint
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
            if !self.s.generators[g].available() {
                continue; // GH-2: a silent rank waits until it is heard from
            }
            self.generate(g, ctx);
        }
    }

    /// Mirrors the loop's state into the metrics: queue, in-flight, restarts by kind (SV-2).
    fn observe_loop(&mut self) {
        let m = &self.s.metrics;
        m.queue_depth.set(self.ready.len() as f64);
        m.batches_in_flight.set(self.generating.len() as f64);
        for b in &self.s.budgets {
            let kind = b.kind();
            let seen = m.actor_restarts.get_for(kind);
            let used = u64::from(b.used());
            if used > seen {
                m.actor_restarts.inc_for(kind, used - seen);
            }
            m.budget_exhausted
                .set_for(kind, if b.exhausted() { 1.0 } else { 0.0 });
        }
        let alive = self.s.generators.iter().filter(|g| g.alive()).count();
        m.actors_alive.set_for("generator", alive as f64);
        m.generator_ranks_alive.set(alive as f64);
    }

    /// What the method's hooks may reach (MR-3: state keys carry this life's tag).
    fn method_io(&self) -> MethodIo {
        MethodIo {
            cfg: self.s.cfg.clone(),
            store: self.s.store.clone(),
            io: self.s.io.clone(),
            learner: self.s.learner.clone(),
            board: self.s.board.clone(),
            life_tag: self.life_tag.clone(),
        }
    }

    fn set_gen_busy(&mut self, g: usize, seq: Option<u64>) {
        self.gen_busy[g] = seq;
        self.gen_util
            .set_busy(self.gen_busy.iter().filter(|b| b.is_some()).count());
    }

    /// Asks generator `g` for the next batch: the method's next work (CT-7) over a task range.
    fn generate(&mut self, g: usize, ctx: &mut Context<Self>) {
        let seq = self.next_batch_seq;
        self.next_batch_seq += 1;
        let keys = StateKeys {
            store: self.s.store.clone(),
            life_tag: self.life_tag.clone(),
        };
        let planned = self.method.next_work(seq, &mut self.cursor, &keys);
        let (first, epoch) = (planned.first_task, self.epoch);
        self.set_gen_busy(g, Some(seq));
        self.generating.insert(seq, (first, epoch));
        let n = self.s.cfg.rollout.tasks_per_batch as u64;
        let tasks = (first..first + n)
            .map(|id| TaskRef {
                task_id: id,
                task_seed: task_seed(Split::Train, id),
            })
            .collect();
        let msg = Generate {
            batch_seq: seq,
            tasks,
            purpose: Purpose::Train,
            work: planned.work.clone(),
            scaffold: self.method.scaffold(),
        };
        self.s.generators[g]
            .generate(msg)
            .into_actor(self)
            .map(move |res, act, ctx| {
                act.set_gen_busy(g, None);
                act.generating.remove(&seq);
                if epoch != act.epoch {
                    return act.drop_abandoned(seq, ctx);
                }
                act.on_generated(seq, planned, res, ctx)
            })
            .spawn(ctx);
    }

    /// A batch sampled on a branch a rewind abandoned (CT-4): the rewind already owes its range
    /// again from the target's frontier (RW-1).
    fn drop_abandoned(&mut self, seq: u64, ctx: &mut Context<Self>) {
        self.s.metrics.batches_dropped_by.inc_for("rewind", 1);
        self.dropped += 1;
        (self.s.events)(&TrainEvent::Dropped {
            batch_seq: seq,
            reason: "sampled on a branch a collapse-guard rewind abandoned".into(),
        });
        self.pump(ctx)
    }

    /// A generation's answer: a stored batch is ready to train; one that stored none (RTPO's
    /// trunks) goes to the method; a lost one's range is owed again (CT-3).
    fn on_generated(
        &mut self,
        seq: u64,
        planned: Planned,
        res: Result<Generated, ActorError>,
        ctx: &mut Context<Self>,
    ) {
        let mut generated = match res {
            Ok(g) if g.key.is_some() || g.trunk_depth.is_some() => g,
            Ok(_) => {
                let err = ActorError::Internal("train batch was not stored".into());
                return self.finish(ctx, Err(err));
            }
            Err(e) => return self.generation_failed(seq, &planned, e, ctx),
        };
        self.failed_batches_in_a_row = 0;
        let (m, stats) = (&self.s.metrics, &generated.stats);
        m.generated_tokens_per_s
            .set(stats.sampled_tokens as f64 / generated.sample_seconds.max(1e-9));
        m.store_put_seconds
            .observe_for("batch", generated.put_seconds);
        if let Some(u) = stats.sampler_utilization() {
            m.sampler_utilization.set(u);
        }
        m.episodes_failed.inc_by(stats.failed_episodes as u64);
        self.note_generated(&generated);
        match generated.key.take() {
            Some(key) => self.ready.push_back(ReadyBatch {
                key,
                batch_seq: seq,
                first_task: planned.first_task,
                branch: planned.held,
                groups: Arc::new(std::mem::take(&mut generated.groups)),
            }),
            None => {
                if let Err(e) = self.method.on_unstored(&planned, &generated) {
                    return self.finish(ctx, Err(e));
                }
            }
        }
        self.pump(ctx);
    }

    /// A generation failed: its range is owed again (a held range stays with the method, MR-2),
    /// unless the failure ends the run (CT-8, a store error).
    fn generation_failed(
        &mut self,
        seq: u64,
        planned: &Planned,
        e: ActorError,
        ctx: &mut Context<Self>,
    ) {
        if !planned.held {
            self.cursor.give_back(planned.first_task);
        }
        match e {
            ActorError::GeneratorPanicked(p) => {
                tracing::warn!(batch_seq = seq, panic = %p, "retrying the batch's tasks after a generator panic");
            }
            ActorError::EngineRestarted(e) => {
                tracing::warn!(batch_seq = seq, error = %e, "retrying the batch's tasks on a restarted vLLM server");
            }
            e @ (ActorError::RankSilent { .. } | ActorError::OrderVoid { .. }) => {
                // RM-5, RM-6: the range is issued again, to a rank that answers.
                tracing::warn!(batch_seq = seq, error = %e, "re-issuing a work order");
            }
            ActorError::AllEpisodesFailed {
                batch_seq,
                failed,
                last_failure,
            } => {
                // CT-3: the range is owed again. CT-8: an env that fails every episode of
                // several batches in a row ends the run.
                self.s.metrics.episodes_failed.inc_by(failed as u64);
                self.failed_batches_in_a_row += 1;
                if self.failed_batches_in_a_row >= MAX_FAILED_BATCHES_IN_A_ROW {
                    let err = ActorError::EnvFailing {
                        env: self.s.cfg.env.name.clone(),
                        batches: self.failed_batches_in_a_row,
                        last_failure,
                    };
                    return self.finish(ctx, Err(err));
                }
                tracing::warn!(batch_seq, failed, last_failure = %last_failure, "every episode of the batch failed in its env; retrying its tasks");
            }
            ActorError::Store(e) => {
                self.s.metrics.store_errors.inc_for("put_batch", 1);
                return self.finish(ctx, Err(ActorError::Store(e)));
            }
            e => return self.finish(ctx, Err(e)),
        }
        self.pump(ctx);
    }
    /// Reports what a generation did beyond its batch: dynamic-sampling passes, RTPO trunks,
    /// PATS scaffold tokens.
    fn note_generated(&mut self, g: &Generated) {
        let step = self.s.version;
        if g.key.is_some() {
            (self.s.events)(&TrainEvent::Rollout {
                batch_seq: g.batch_seq,
                policy_version: g.policy_version,
                episodes: g.stats.episodes,
                failed_episodes: g.stats.failed_episodes,
                sample_seconds: g.sample_seconds,
                decode_steps: g.stats.decode_steps,
                busy_decode_steps: g.stats.busy_decode_steps,
                weight_updates: g.stats.weight_updates,
                resubmitted_requests: g.stats.resubmitted_requests,
                sampled_tokens: g.stats.sampled_tokens as u64,
            });
        }
        let mut detail = MethodDetail::default();
        if g.tries > 1 || g.uniform_groups > 0 {
            detail.tries = Some(g.tries as u64);
            detail.uniform_groups = Some(g.uniform_groups as u64);
        }
        detail.rtpo_trunk_depth = g.trunk_depth.map(|d| d as u64);
        if g.stats.scaffold_tokens > 0 || self.method.scaffold().is_some() {
            detail.prompt_tokens = Some(g.stats.prompt_tokens as u64);
            detail.scaffold_tokens = Some(g.stats.scaffold_tokens as u64);
        }
        if detail != MethodDetail::default() {
            detail.batch_seq = Some(g.batch_seq);
            (self.s.events)(&TrainEvent::Method {
                step,
                method: "generate".into(),
                detail,
            });
        }
    }

    fn train(&mut self, batch: ReadyBatch, ctx: &mut Context<Self>) {
        let msg = TrainOn {
            key: batch.key.clone(),
            bound: self.bound(),
        };
        self.training = Some(batch);
        self.learner_util.set_busy(1);
        self.s
            .learner
            .send(msg)
            .into_actor(self)
            .map(|res, act, ctx| {
                act.learner_util.set_busy(0);
                let Some(batch) = act.training.take() else {
                    return act.finish(ctx, Err(ActorError::Internal("training slot empty".into())));
                };
                match res.map_err(|e| ActorError::Mailbox(e.to_string())).and_then(|r| r) {
                    Ok(trained) => act.on_trained(batch, trained, ctx),
                    Err(ActorError::Learner(keel_learner::LearnerError::NonFinite { what })) if act.guard.config().enabled => {
                        return act.on_nonfinite(batch, &what, ctx);
                    }
                    Err(ActorError::Stale { batch_seq, lag, bound }) => {
                        act.dropped += 1;
                        act.dropped_since_checkpoint.push(batch_seq);
                        act.s.metrics.batches_dropped_by.inc_for("stale", 1);
                        if !batch.branch {
                            act.cursor.give_back(batch.first_task);
                        }
                        let reason = format!("a turn was {lag} versions old, over the bound {bound}");
                        tracing::warn!(batch_seq, %reason, "dropped a stale batch; its tasks are regenerated");
                        (act.s.events)(&TrainEvent::Dropped { batch_seq, reason });
                    }
                    Err(ActorError::Store(e @ keel_store::StoreError::CorruptBatch { .. })) => {
                        act.quarantine(batch, e.to_string(), ctx);
                    }
                    Err(ActorError::Store(e)) => {
                        act.s.metrics.store_errors.inc_for("get_batch", 1);
                        return act.finish(ctx, Err(ActorError::Store(e)));
                    }
                    Err(e) => return act.finish(ctx, Err(e)),
                }
                act.pump(ctx);
            })
            .spawn(ctx);
    }

    /// A non-finite update was refused (GD-1): count it, consume the batch, maybe rewind.
    fn on_nonfinite(&mut self, batch: ReadyBatch, what: &str, ctx: &mut Context<Self>) {
        self.consume(&batch, Used::Skipped);
        let m = &self.s.metrics;
        m.nonfinite_steps.inc();
        m.guard_anomalies.inc_for("nonfinite", 1);
        let verdict = self.guard.on_nonfinite(what);
        m.guard_consecutive_skips
            .set(f64::from(self.guard.consecutive_skips()));
        tracing::warn!(
            batch_seq = batch.batch_seq,
            version = self.s.version,
            what,
            ?verdict,
            "skipped a non-finite update"
        );
        (self.s.events)(&TrainEvent::Skipped {
            step: self.s.version,
            batch_seq: batch.batch_seq,
            what: what.to_string(),
        });
        match verdict {
            Verdict::Rewind(anomaly) => self.rewind(anomaly, ctx),
            _ => self.pump(ctx),
        }
    }

    /// Accounts for a batch the learner used (CT-6): its range is trained, or skipped when its
    /// update was refused as non-finite (GD-1); a held batch's range is the method's (MR-2).
    fn consume(&mut self, batch: &ReadyBatch, used: Used) {
        self.consumed_since_checkpoint.push(batch.batch_seq);
        if !batch.branch {
            match used {
                Used::Trained => self.consumed_tasks_since_checkpoint.push(batch.first_task),
                Used::Skipped => self.skipped_tasks_since_checkpoint.push(batch.first_task),
            }
            return;
        }
        // MR-2: a held batch (an RTPO sibling batch) moves the method on; its range counts as
        // trained once the method says so (MS-1: after the tree's last depth).
        let Some(held) = self.method.on_held_consumed(batch.batch_seq) else {
            return;
        };
        (self.s.events)(&TrainEvent::Method {
            step: self.s.version,
            method: self.method.name().into(),
            detail: held.detail,
        });
        if let Some(first) = held.trained {
            self.consumed_tasks_since_checkpoint.push(first);
        }
    }

    fn on_trained(&mut self, batch: ReadyBatch, t: Trained, ctx: &mut Context<Self>) {
        self.s.version = t.version;
        self.s.board.publish(t.weights.clone());
        self.consume(&batch, Used::Trained);
        self.record_trained(&t);
        for (model, what) in &t.refused_models {
            // LA-5: an agent model kept its weights for this step; the step stands.
            self.s.metrics.nonfinite_steps.inc();
            self.s.metrics.guard_anomalies.inc_for("nonfinite", 1);
            tracing::warn!(step = t.version, model, what = %what, "agent model kept its weights: non-finite update");
        }
        let verdict = self.guard.on_step(t.metrics.grad_norm, t.metrics.approx_kl);
        self.s.metrics.guard_consecutive_skips.set(0.0);
        self.last_metrics = BTreeMap::from([
            ("loss".to_string(), t.metrics.loss),
            ("rollout_success".to_string(), t.success_rate),
            ("grad_norm".to_string(), t.metrics.grad_norm),
            ("entropy".to_string(), t.metrics.entropy),
        ]);
        let reward = t.metrics.mean_reward;
        (self.s.events)(&TrainEvent::Step {
            step: t.version,
            total: self.s.cfg.run.steps,
            batch_seq: t.batch_seq,
            metrics: Box::new(t.metrics),
            success: t.success_rate,
            invalid_rate: t.invalid_rate,
            max_lag: t.turn_lags.iter().copied().max().unwrap_or(0),
            branch: self.s.metrics.branch(),
            reward,
        });
        if let Verdict::Rewind(anomaly) = verdict {
            self.s.metrics.guard_anomalies.inc_for(anomaly.kind(), 1);
            return self.rewind(anomaly, ctx);
        }
        if self.review(t.version, &batch, ctx) {
            return; // MS-2: the step ends once the review's state is stored
        }
        self.end_step(t.version, ctx);
    }

    /// After an update (and the method's review): a reference reset when the method asks for
    /// one (ARMOR, MS-3), else a scheduled checkpoint.
    fn end_step(&mut self, version: u64, ctx: &mut Context<Self>) {
        if self.method.resets_reference_at(version) {
            return self.reset_reference(ctx);
        }
        let every = self.s.cfg.run.checkpoint_every;
        if version.is_multiple_of(every) || version >= self.s.cfg.run.steps {
            self.checkpoint(ctx);
        }
    }

    /// The method's review of a trained batch (PATS, MS-2), off the controller's thread.
    /// Nothing new starts until the review and its state write are done; a new state is stored
    /// before any generation may use it and before a checkpoint names it. True when the review
    /// took the step over: it ends the step (`end_step`) when it lands.
    fn review(&mut self, step: u64, batch: &ReadyBatch, ctx: &mut Context<Self>) -> bool {
        let io = self.method_io();
        let Some(review) = self.method.review(step, batch, &io) else {
            return false;
        };
        self.writing_state = true;
        review
            .into_actor(self)
            .map(move |res, act, ctx| {
                act.writing_state = false;
                match res {
                    Ok(review) => act.after_review(step, review, ctx),
                    Err(e) => act.finish(ctx, Err(e)),
                }
            })
            .spawn(ctx);
        true
    }

    /// Records a review and stores the state it produced, then ends the step (MS-2).
    fn after_review(&mut self, step: u64, review: Review, ctx: &mut Context<Self>) {
        let (detail, write) = match review {
            Review::Done { detail, write } => (*detail, write),
            Review::Skipped(e) => {
                tracing::warn!(step, method = self.method.name(), error = %e, "review skipped");
                self.end_step(step, ctx);
                return self.pump(ctx);
            }
        };
        self.method.export(&self.s.metrics);
        (self.s.events)(&TrainEvent::Method {
            step,
            method: self.method.name().into(),
            detail,
        });
        let Some((key, bytes)) = write else {
            self.end_step(step, ctx);
            return self.pump(ctx);
        };
        self.writing_state = true;
        let (io, store) = (self.s.io.clone(), self.s.store.clone());
        async move {
            io.spawn(async move { store.create_object(&key, bytes.into()).await })
                .await
        }
        .into_actor(self)
        .map(move |res, act, ctx| {
            act.writing_state = false;
            match res {
                Ok(Ok(())) => {
                    act.end_step(step, ctx);
                    act.pump(ctx)
                }
                Ok(Err(e)) => act.finish(ctx, Err(e.into())),
                Err(e) => act.finish(
                    ctx,
                    Err(ActorError::Internal(format!("method state write: {e}"))),
                ),
            }
        })
        .spawn(ctx);
    }

    /// A reference reset (ARMOR, MS-3): copies the policy into the reference, publishes it to the
    /// generators and commits a checkpoint tagged `reference-reset` that later checkpoints name
    /// as reference.
    fn reset_reference(&mut self, ctx: &mut Context<Self>) {
        self.checkpointing = true;
        let version = self.s.version;
        self.s
            .learner
            .send(ResetReference)
            .into_actor(self)
            .map(move |res, act, ctx| {
                act.checkpointing = false;
                match res
                    .map_err(|e| ActorError::Mailbox(e.to_string()))
                    .and_then(|r| r)
                {
                    Ok(weights) => {
                        act.s.board.publish_reference(PublishedReference {
                            copied_at: version,
                            serial: 0,
                            safetensors: Arc::new(weights),
                        });
                        (act.s.events)(&TrainEvent::Method {
                            step: version,
                            method: act.method.name().into(),
                            detail: MethodDetail {
                                reference_reset_at: Some(version),
                                ..MethodDetail::default()
                            },
                        });
                        act.next_tags.push(REFERENCE_RESET_TAG.to_string());
                        act.checkpoint(ctx);
                    }
                    Err(e) => act.finish(ctx, Err(e)),
                }
            })
            .spawn(ctx);
    }

    /// Exports one trained batch's numbers (learner, rollout, staleness, store, idle ratios).
    fn record_trained(&mut self, t: &Trained) {
        let m = &self.s.metrics;
        m.record_step(t.version, &t.metrics);
        m.lr.set(t.lr);
        let env = self.s.cfg.env.name.as_str();
        m.rollout_success.set_for(env, t.success_rate);
        m.rollout_reward.set_for(env, t.metrics.mean_reward);
        m.rollout_invalid_rate.set(t.invalid_rate);
        m.episode_turns.set(t.episode_turns);
        m.response_length.set(t.response_length);
        m.segments_per_episode.set(t.segments_per_episode);
        for &(lag, tokens) in &t.token_lags {
            for _ in 0..tokens {
                m.token_staleness.observe(lag as f64);
            }
        }
        for &lag in &t.trajectory_lags {
            m.trajectory_staleness.observe(lag as f64);
        }
        m.staleness_max
            .set(t.turn_lags.iter().copied().max().unwrap_or(0) as f64);
        m.store_get_seconds.observe_for("batch", t.get_seconds);
        m.store_bytes.inc_for("get", t.get_bytes);
        m.generator_idle_ratio.set(self.gen_util.take_idle_ratio());
        m.learner_idle_ratio
            .set(self.learner_util.take_idle_ratio());
    }

    /// The guard's and the method's checkpoint entries (GD-7, CT-7).
    fn method_state(&self) -> BTreeMap<String, String> {
        let mut method_state = BTreeMap::new();
        if self.guard.config().enabled {
            if let Ok(state) = serde_json::to_string(&self.guard.state()) {
                method_state.insert(crate::guard::GUARD_STATE.to_string(), state);
            }
        }
        self.method.save_state(&mut method_state);
        method_state
    }

    /// The data position a checkpoint records now (CT-2, CT-6, DF-4); takes what was consumed,
    /// skipped and dropped since the last checkpoint.
    fn data_position(&mut self) -> DataPosition {
        // Orders of an epoch a rewind abandoned are not this branch's: the rewind owes their
        // ranges again from its target's frontier (RW-1), and their batches are discarded.
        let current = self
            .generating
            .iter()
            .filter(|(_, (_, epoch))| *epoch == self.epoch);
        // MR-2: a range the method holds is pending too.
        let in_flight: Vec<u64> = current
            .clone()
            .map(|(_, (first, _))| *first)
            .chain(self.ready.iter().map(|b| b.first_task))
            .chain(self.method.held_range())
            .collect();
        // The resume index: where the batches of the pending ranges are (or will be) stored.
        let pending_batch_seqs: Vec<u64> = current
            .map(|(seq, _)| *seq)
            .chain(self.ready.iter().map(|b| b.batch_seq))
            .collect::<std::collections::BTreeSet<u64>>()
            .into_iter()
            .collect();
        let frontier = self.cursor.frontier(in_flight, self.next_batch_seq);
        DataPosition {
            next_task_index: frontier.next_task,
            next_batch_seq: frontier.next_batch_seq,
            consumed_batches: std::mem::take(&mut self.consumed_since_checkpoint),
            pending_tasks: frontier.pending.clone(),
            consumed_tasks: std::mem::take(&mut self.consumed_tasks_since_checkpoint),
            dropped_batches: std::mem::take(&mut self.dropped_since_checkpoint),
            skipped_tasks: std::mem::take(&mut self.skipped_tasks_since_checkpoint),
            pending_batch_seqs: Some(pending_batch_seqs),
            method_state: self.method_state(),
        }
    }

    /// Commits a checkpoint of the learner as it is now (CT-2, CT-9).
    fn checkpoint(&mut self, ctx: &mut Context<Self>) {
        self.checkpointing = true;
        let started = Instant::now();
        let mut tags = std::mem::take(&mut self.next_tags);
        if self.guard.checkpoint_is_healthy() {
            tags.push(HEALTHY_TAG.to_string());
        }
        let version = self.s.version;
        let resets_reference = tags.iter().any(|t| t == REFERENCE_RESET_TAG);
        let mut metrics = self.s.carried_metrics.clone();
        metrics.extend(self.last_metrics.clone());
        let ckpt = NewCheckpoint {
            parent: self.s.parent_checkpoint.clone(),
            step: version,
            policy_version: version,
            config_hash: self.s.cfg.config_hash(),
            reference: self.s.reference.clone(),
            tags,
            data: self.data_position(),
            metrics,
            files: Vec::new(),
        };
        let expect = self.head_generation;
        self.commit(ckpt, expect)
            .into_actor(self)
            .map(move |res, act, ctx| {
                act.checkpointing = false;
                match res {
                    Ok((manifest, bytes)) => {
                        act.head_generation = Some(expect.map_or(1, |g| g + 1));
                        let seconds = started.elapsed().as_secs_f64();
                        act.committed(manifest, version, bytes, seconds, resets_reference);
                    }
                    Err(e) => {
                        if matches!(e, ActorError::Store(_)) {
                            act.s.metrics.store_errors.inc_for("commit_checkpoint", 1);
                        }
                        return act.finish(ctx, Err(e));
                    }
                }
                act.pump(ctx);
            })
            .spawn(ctx);
    }

    /// Checks the life (LV-2), snapshots the learner into `ckpt` and commits it create-only,
    /// expecting head generation `expect` (LV-3). Answers the manifest and the bytes written.
    fn commit(
        &self,
        mut ckpt: NewCheckpoint,
        expect: Option<u64>,
    ) -> impl std::future::Future<Output = Result<(CheckpointManifest, u64), ActorError>> + 'static
    {
        let store: RunStore = self.s.store.clone();
        let io = self.s.io.clone();
        let learner = self.s.learner.clone();
        let (life, lives) = self.s.life.clone();
        async move {
            // LV-2: a superseded trainer writes nothing; LV-3: nor does one behind the head.
            lives.check_life(life).await?;
            let files = learner
                .send(Snapshot)
                .await
                .map_err(|e| ActorError::Mailbox(e.to_string()))??;
            let bytes: u64 = files.iter().map(|(_, b)| b.len() as u64).sum();
            ckpt.files = files
                .into_iter()
                .map(|(n, b)| (n, bytes::Bytes::from(b)))
                .collect();
            let branch = store.branch().to_string();
            let manifest = io
                .spawn(async move {
                    store
                        .commit_checkpoint_on(&branch, ckpt, ExpectHead::Generation(expect))
                        .await
                })
                .await
                .map_err(|e| ActorError::Internal(format!("checkpoint task: {e}")))??;
            Ok((manifest, bytes))
        }
    }

    /// A checkpoint was committed: it becomes the parent of the next (and, at a reference
    /// reset, the reference, MS-3).
    fn committed(
        &mut self,
        manifest: CheckpointManifest,
        version: u64,
        bytes: u64,
        seconds: f64,
        resets_reference: bool,
    ) {
        self.checkpointed_version = Some(version);
        self.s.metrics.record_checkpoint(bytes, seconds);
        self.s.metrics.store_bytes.inc_for("put", bytes);
        tracing::info!(id = %manifest.id, step = version, "checkpoint committed");
        (self.s.events)(&TrainEvent::Checkpoint {
            id: manifest.id.clone(),
            step: version,
            parent: manifest.parent.clone(),
        });
        if resets_reference {
            self.s.reference = Some(manifest.id.clone());
        }
        self.s.parent_checkpoint = Some(manifest.id);
    }
}

impl Controller {
    /// A stored batch failed its checks (CT-6): quarantine it, count it, owe its range again.
    fn quarantine(&mut self, batch: ReadyBatch, reason: String, ctx: &mut Context<Self>) {
        self.dropped += 1;
        self.dropped_since_checkpoint.push(batch.batch_seq);
        if !batch.branch {
            self.cursor.give_back(batch.first_task);
        }
        self.s.metrics.store_quarantined.inc_for("batch", 1);
        self.s.metrics.batches_dropped_by.inc_for("corrupt", 1);
        tracing::warn!(batch_seq = batch.batch_seq, %reason, "quarantining a corrupt batch; its tasks are regenerated");
        (self.s.events)(&TrainEvent::Dropped {
            batch_seq: batch.batch_seq,
            reason: reason.clone(),
        });
        let (store, key) = (self.s.store.clone(), batch.key.clone());
        let moved = self
            .s
            .io
            .spawn(async move { store.quarantine_batch(&key, &reason).await });
        moved
            .into_actor(self)
            .map(|res, act, ctx| match res {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => act.finish(ctx, Err(e.into())),
                Err(e) => act.finish(
                    ctx,
                    Err(ActorError::Internal(format!("quarantine task: {e}"))),
                ),
            })
            .spawn(ctx);
    }
}

impl Actor for Controller {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // CT-5: notice a stop request, and GH-2: a silent rank heard from again, even while
        // nothing else wakes the loop.
        ctx.run_interval(std::time::Duration::from_millis(100), |act, ctx| {
            act.pump(ctx)
        });
        self.pump(ctx);
    }
}
