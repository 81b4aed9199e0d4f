//! A generator process (`keel generator --rank R`): executes its rank's work orders of the
//! newest trainer life and answers each with a result (RM-1..5).
//!
//! Invariants:
//! - GW-1: the process takes its config from `--config` or, without one, from the trainer life's
//!   record; either way its config hash must equal the life's, or it refuses to start work.
//! - GW-2: an order is executed with exactly the weights it names, loaded from the run root and
//!   checked (WT-2), and installed on the process's board before sampling (RM-2).
//! - GW-3: a store error while executing ends the process non-zero without a result: the engine
//!   restarts it, and the restarted process executes the order again (RM-3). An order whose
//!   weights are gone, or that cannot be read, is answered [`Outcome::Void`] (RM-6) unless the
//!   trainer withdrew it already.
//! - GW-6: a process that finds one of its rank's orders withdrawn (RM-5), or loses the race to
//!   answer one, writes a `heard` record, so the trainer gives the live rank work again.
//! - GW-4: the process ends with [`GeneratorExit::Finished`] once the newest life recorded that
//!   the run finished, and with [`GeneratorExit::Stopped`] on SIGTERM between orders.
//! - GW-5: while it samples (and while it waits for orders) the process loads the newest
//!   published policy weights ahead, on the I/O runtime; an order uses them only when it names
//!   exactly that version (GW-2 holds), else they wait for the order that does. A failed
//!   prefetch is only logged: the order then loads its weights itself.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use actix::Addr;
use keel_store::{LifeRecord, RunStore, StoreError, WeightsId, WeightsPointer};
use tokio::task::JoinHandle;

use super::{LifeKeys, OrderResult, Outcome, WorkOrder};
use crate::config::TrainConfig;
use crate::env_shard::EnvFactory;
use crate::error::ActorError;
use crate::generator::Generator;
use crate::process::{generator_writer, life_tag, Process, StopSignal};
use crate::setup::{LocalGenerators, ModelSetup};
use crate::weights::{PublishedReference, PublishedWeights};

/// How a generator process ended (GW-4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GeneratorExit {
    /// The trainer life `life` finished the run.
    Finished {
        /// The life.
        life: u64,
    },
    /// Stopped on request (SIGTERM).
    Stopped,
}

/// Runs rank `rank` against `store`'s branch until the run finishes or `stop` is set.
pub fn run_generator(
    rank: u32,
    config: Option<TrainConfig>,
    store: RunStore,
    stop: StopSignal,
    env_factory: Option<EnvFactory>,
) -> Result<GeneratorExit, ActorError> {
    let process = Process::start()?;
    let io = process.io();
    let poll = Duration::from_millis(config.as_ref().map_or(100, |c| c.distributed.poll_ms));
    let from_branch = store.branch().to_string();
    let Some((store, first)) = io.block_on(wait_for_life(&store, &stop, poll))? else {
        return Ok(GeneratorExit::Stopped);
    };
    let cfg = config_of(config, &first)?;
    let device = Process::torch(&cfg)?;
    let result = process.run_actors(async {
        let model = ModelSetup::prepare(&cfg, &io, device).await?;
        // GW-1: the shards; a generator actor of this rank is started per trainer life.
        let local =
            LocalGenerators::start(&cfg, &model, &store, &io, env_factory, 0..0, true, &stop)?;
        let mut worker = Worker {
            rank,
            cfg,
            model,
            local,
            store,
            io: io.clone(),
            process: life_tag(),
            poll: Duration::from_millis(poll.as_millis() as u64),
            loaded: None,
            loaded_reference: None,
            full: None,
            prefetch: None,
            from_branch,
            branch_checked: Instant::now(),
        };
        worker.serve(first, &stop).await
    });
    process.end();
    result
}

/// RM-8: the branch to serve, starting from `from`, and its newest trainer life: the last branch
/// along the collapse guard's rewinds from `from` on which a trainer claimed a life (a rewind
/// inside a life makes a branch no trainer has claimed yet; a life on a later branch is newer).
async fn newest_served_life(
    store: &RunStore,
    from: &str,
) -> Result<Option<(RunStore, LifeRecord)>, ActorError> {
    let chain = crate::guard::rewind_chain(store, from).await?;
    for branch in chain.iter().rev() {
        let on = store.on_branch(branch)?;
        if let Some(life) = on.newest_life().await? {
            return Ok(Some((on, life)));
        }
    }
    Ok(None)
}

/// The served branch and its newest life, once a trainer has claimed one (`None`: stopped
/// first).
pub(crate) async fn wait_for_life(
    store: &RunStore,
    stop: &StopSignal,
    poll: Duration,
) -> Result<Option<(RunStore, LifeRecord)>, ActorError> {
    let mut said = false;
    loop {
        if stop.requested() {
            return Ok(None);
        }
        if let Some(found) = newest_served_life(store, store.branch()).await? {
            return Ok(Some(found));
        }
        if !said {
            tracing::info!(
                root = store.root_url(),
                branch = store.branch(),
                "waiting for a trainer to claim the run root"
            );
            said = true;
        }
        tokio::time::sleep(poll).await;
    }
}

/// GW-1: the config the generator runs under.
pub(crate) fn config_of(
    config: Option<TrainConfig>,
    life: &LifeRecord,
) -> Result<TrainConfig, ActorError> {
    let cfg = match config {
        Some(c) => c,
        None => TrainConfig::from_toml(&life.config_toml).map_err(|e| {
            ActorError::Resume(format!(
                "the config of trainer {} does not parse ({e}); pass the trainer's --config",
                life.describe()
            ))
        })?,
    };
    cfg.validate()?;
    if cfg.config_hash() != life.config_hash {
        return Err(ActorError::Resume(format!(
            "this generator's config (hash {}) is not the one trainer {} trains under (hash {}); \
             pass the trainer's --config (a config with credentials in URLs is stored redacted, \
             so it must be passed)",
            cfg.config_hash(),
            life.describe(),
            life.config_hash
        )));
    }
    Ok(cfg)
}

struct Worker {
    rank: u32,
    cfg: TrainConfig,
    model: ModelSetup,
    local: LocalGenerators,
    store: RunStore,
    io: tokio::runtime::Handle,
    process: String,
    poll: Duration,
    /// The policy weights on the board now.
    loaded: Option<WeightsId>,
    /// The reference on the board now.
    loaded_reference: Option<WeightsId>,
    /// The last full weights set decoded: the base of the deltas that follow it (WT-5).
    full: Option<(WeightsId, Vec<bytes::Bytes>)>,
    /// Newer policy weights being loaded ahead of the order that will name them (GW-5).
    prefetch: Option<Prefetch>,
    /// The branch the process was started on (`--branch`); RM-8 follows rewinds from it.
    from_branch: String,
    /// When RM-8's rewinds were last followed.
    branch_checked: Instant,
}

/// How often a generator follows the collapse guard's rewinds (RM-8).
const BRANCH_CHECK: Duration = Duration::from_secs(1);

/// Policy weights read and decoded: their pointer and their models.
type Fetched = (WeightsPointer, Vec<bytes::Bytes>);

/// Policy weights loaded ahead (GW-5).
struct Prefetch {
    id: WeightsId,
    task: JoinHandle<Result<Fetched, StoreError>>,
}

/// Reads and decodes policy weights `id` of `life` (WT-2, WT-5).
async fn fetch_policy(
    store: &RunStore,
    life: u64,
    id: WeightsId,
    full: Option<&(WeightsId, Vec<bytes::Bytes>)>,
) -> Result<Fetched, StoreError> {
    let pointer = store.weights_pointer(life, id).await?;
    let models = store.load_weights(&pointer, full).await?;
    Ok((pointer, models))
}

/// One trainer life as this process serves it.
struct Serving {
    life: LifeRecord,
    keys: LifeKeys,
    generator: Addr<Generator>,
    /// Orders of this rank known to be answered (or skipped).
    done: BTreeSet<u64>,
}

impl Worker {
    async fn serve(
        &mut self,
        first: LifeRecord,
        stop: &StopSignal,
    ) -> Result<GeneratorExit, ActorError> {
        let mut serving = self.begin(first).await?;
        loop {
            if stop.requested() {
                return Ok(GeneratorExit::Stopped);
            }
            // RM-3: only the newest life is served; RM-8: on the branch the trainer trains.
            if let Some((store, newest)) = self.newer_life(&serving).await? {
                config_of(Some(self.cfg.clone()), &newest)?;
                if store.branch() != self.store.branch() {
                    tracing::info!(
                        branch = store.branch(),
                        "following the trainer to its branch"
                    );
                }
                self.store = store;
                serving = self.begin(newest).await?;
            }
            if let Some(seq) = self.next_order(&mut serving).await? {
                self.execute(&mut serving, seq).await?;
                continue;
            }
            if let Some(end) = self.store.life_end(serving.life.life).await? {
                if end.finished {
                    tracing::info!(
                        life = end.life,
                        "the trainer finished the run; generator exits"
                    );
                    return Ok(GeneratorExit::Finished { life: end.life });
                }
            }
            tokio::time::sleep(self.poll).await;
            self.look_ahead(serving.life.life).await;
        }
    }

    /// A life to serve instead of `serving`'s: a newer one of this branch (RM-3) or, checked
    /// every [`BRANCH_CHECK`], one on the branch the rewinds lead to (RM-8).
    async fn newer_life(
        &mut self,
        serving: &Serving,
    ) -> Result<Option<(RunStore, LifeRecord)>, ActorError> {
        if self.branch_checked.elapsed() >= BRANCH_CHECK {
            self.branch_checked = Instant::now();
            if let Some((store, life)) = newest_served_life(&self.store, &self.from_branch).await? {
                if store.branch() != self.store.branch() || life.life > serving.life.life {
                    return Ok(Some((store, life)));
                }
            }
            return Ok(None);
        }
        Ok(self
            .store
            .newest_life()
            .await?
            .filter(|newest| newest.life > serving.life.life)
            .map(|life| (self.store.clone(), life)))
    }

    /// GW-5: starts loading the newest published policy weights of `life` when they are newer
    /// than what is on the board and what is being loaded already.
    async fn look_ahead(&mut self, life: u64) {
        let newest = match self.store.newest_weights(life).await {
            Ok(Some(id)) => id,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list published weights to load ahead");
                return;
            }
        };
        let have = self.prefetch.as_ref().map(|p| p.id).max(self.loaded);
        if have.is_some_and(|h| h >= newest) {
            return;
        }
        if let Some(old) = self.prefetch.take() {
            old.task.abort();
        }
        let (store, full) = (self.store.clone(), self.full.clone());
        let task = self
            .io
            .spawn(async move { fetch_policy(&store, life, newest, full.as_ref()).await });
        tracing::debug!(weights = ?newest, "loading weights ahead");
        self.prefetch = Some(Prefetch { id: newest, task });
    }

    /// The policy weights `id` of `life`: loaded ahead when they were (`true`), else now.
    async fn policy_weights(
        &mut self,
        life: u64,
        id: WeightsId,
    ) -> Result<(Fetched, bool), ActorError> {
        match self.prefetch.take() {
            Some(p) if p.id == id => match p.task.await {
                Ok(Ok(fetched)) => return Ok((fetched, true)),
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, weights = ?id, "loading ahead failed; loading again")
                }
                Err(e) => {
                    tracing::warn!(error = %e, weights = ?id, "loading ahead did not finish; loading again")
                }
            },
            // Newer weights than this order's: they wait for the order that names them.
            Some(p) if p.id > id => self.prefetch = Some(p),
            Some(p) => p.task.abort(),
            None => {}
        }
        let fetched = fetch_policy(&self.store, life, id, self.full.as_ref()).await?;
        Ok((fetched, false))
    }

    /// Starts serving `life`: a generator actor writing batches under this process's tag
    /// (ST-12, RM-4) and the process's start record (GH-2).
    async fn begin(&mut self, life: LifeRecord) -> Result<Serving, ActorError> {
        let keys = LifeKeys::new(&self.store, life.life);
        // Weights are named within a life: a new life's version v is other weights.
        (self.loaded, self.loaded_reference, self.full) = (None, None, None);
        if let Some(old) = self.prefetch.take() {
            old.task.abort();
        }
        let writer = generator_writer(life.life, self.rank, &self.process);
        let store = self.store.clone().with_writer(&writer)?;
        let generator =
            self.local
                .start_generator(&self.cfg, &self.model, &store, &self.io, self.rank);
        let record = serde_json::json!({
            "rank": self.rank,
            "process": self.process,
            "pid": std::process::id(),
            "started_unix_ms": crate::process::unix_ms(),
        });
        let body = serde_json::to_vec_pretty(&record)
            .map_err(|e| ActorError::Internal(format!("rank start record: {e}")))?;
        match self
            .store
            .create_object(&keys.rank_start(self.rank, &self.process), body.into())
            .await
        {
            Ok(()) | Err(StoreError::AlreadyExists { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        tracing::info!(rank = self.rank, life = %life.describe(), "generator serving trainer life");
        Ok(Serving {
            life,
            keys,
            generator,
            done: BTreeSet::new(),
        })
    }

    /// The oldest order of this rank without a result.
    async fn next_order(&self, serving: &mut Serving) -> Result<Option<u64>, ActorError> {
        let orders = self
            .store
            .list_objects(&serving.keys.orders_dir(self.rank))
            .await?;
        let mut seqs: Vec<u64> = orders.iter().filter_map(|k| super::seq_of_key(k)).collect();
        seqs.sort_unstable();
        for seq in seqs {
            if serving.done.contains(&seq) {
                continue;
            }
            match self.store.get_object(&serving.keys.result(seq)).await {
                Ok(bytes) => {
                    if let Ok(stored) = OrderResult::from_bytes(&serving.keys.result(seq), &bytes) {
                        self.note_withdrawn(serving, &stored).await?;
                    }
                    serving.done.insert(seq);
                }
                Err(StoreError::NotFound { .. }) => return Ok(Some(seq)),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(None)
    }

    /// Executes order `seq` and writes its result (GW-2, GW-3).
    async fn execute(&mut self, serving: &mut Serving, seq: u64) -> Result<(), ActorError> {
        let key = serving.keys.order(self.rank, seq);
        let order = match self.store.get_object(&key).await {
            Ok(bytes) => WorkOrder::from_bytes(&key, &bytes),
            Err(e) => Err(e),
        };
        let order = match order {
            Ok(order) => order,
            Err(e @ (StoreError::NotFound { .. } | StoreError::CorruptObject { .. })) => {
                return self.void(serving, seq, e.to_string()).await;
            }
            Err(e) => return Err(e.into()),
        };
        let started = Instant::now();
        let (loaded_bytes, prefetched) = match self.load(serving.life.life, &order).await {
            Ok(loaded) => loaded,
            Err(ActorError::Store(StoreError::NotFound { key })) => {
                let reason = format!("its weights {key} are not in the run root");
                return self.void(serving, seq, reason).await;
            }
            Err(e) => return Err(e),
        };
        let load_seconds = started.elapsed().as_secs_f64();
        // GW-5: while the episodes run, newer weights are loaded ahead.
        let request = serving.generator.send(order.generate);
        tokio::pin!(request);
        let answer = loop {
            tokio::select! {
                biased;
                answer = &mut request => break answer,
                () = tokio::time::sleep(self.poll) => self.look_ahead(serving.life.life).await,
            }
        }
        .map_err(|e| ActorError::Mailbox(e.to_string()))?;
        let outcome = match answer {
            Ok(generated) => Outcome::Done(Box::new(generated)),
            Err(ActorError::GeneratorPanicked(p)) => Outcome::Panicked(p),
            Err(ActorError::AllEpisodesFailed {
                failed,
                last_failure,
                ..
            }) => Outcome::AllEpisodesFailed {
                failed,
                last_failure,
            },
            // GW-3: the store may come back; the restarted process answers.
            Err(e @ ActorError::Store(_)) => return Err(e),
            Err(e) => Outcome::Failed(e.to_string()),
        };
        if self.local.gen_budget.exhausted() {
            return Err(ActorError::RestartBudgetExhausted {
                kind: "generator",
                restarts: self.local.gen_budget.used(),
                budget: self.local.gen_budget.max_restarts(),
            });
        }
        let mut result = OrderResult::new(self.rank, &self.process, seq, outcome);
        result.weight_load_seconds = load_seconds;
        result.weight_load_bytes = loaded_bytes;
        result.weights_prefetched = prefetched;
        self.answer(serving, result).await
    }

    /// GW-3, RM-6: answers order `seq` [`Outcome::Void`]: its range is owed again (unless a
    /// withdrawal came first).
    async fn void(
        &self,
        serving: &mut Serving,
        seq: u64,
        reason: String,
    ) -> Result<(), ActorError> {
        tracing::warn!(batch_seq = seq, reason = %reason, "answering an order that cannot be served");
        let result = OrderResult::new(self.rank, &self.process, seq, Outcome::Void(reason));
        self.answer(serving, result).await
    }

    /// Stores `result` as the answer to its order. RM-3: when another process of this rank
    /// answered first, its answer stands; when the trainer withdrew the order, GW-6.
    async fn answer(&self, serving: &mut Serving, result: OrderResult) -> Result<(), ActorError> {
        let seq = result.batch_seq;
        let key = serving.keys.result(seq);
        let body = serde_json::to_vec_pretty(&result)
            .map_err(|e| ActorError::Internal(format!("order result: {e}")))?;
        match self.store.create_object(&key, body.into()).await {
            Ok(()) => {}
            Err(StoreError::AlreadyExists { .. }) => {
                let stored = OrderResult::from_bytes(&key, &self.store.get_object(&key).await?)?;
                self.note_withdrawn(serving, &stored).await?;
            }
            Err(e) => return Err(e.into()),
        }
        serving.done.insert(seq);
        Ok(())
    }

    /// GW-6: when `stored`, the result of one of this rank's orders, is the trainer's
    /// withdrawal, tells the trainer this process is alive (once per order and process).
    async fn note_withdrawn(
        &self,
        serving: &Serving,
        stored: &OrderResult,
    ) -> Result<(), ActorError> {
        if !matches!(stored.outcome, Outcome::Withdrawn) {
            return Ok(());
        }
        let seq = stored.batch_seq;
        tracing::info!(
            batch_seq = seq,
            "the trainer withdrew this order; telling it this rank is alive"
        );
        let record = serde_json::json!({
            "rank": self.rank,
            "process": self.process,
            "withdrawn_batch_seq": seq,
            "unix_ms": crate::process::unix_ms(),
        });
        let body = serde_json::to_vec_pretty(&record)
            .map_err(|e| ActorError::Internal(format!("heard record: {e}")))?;
        let heard = serving.keys.rank_heard(self.rank, &self.process, seq);
        match self.store.create_object(&heard, body.into()).await {
            Ok(()) | Err(StoreError::AlreadyExists { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// GW-2: puts the order's weights (and reference) on the board; returns the bytes read
    /// and whether the policy weights had been loaded ahead (GW-5).
    async fn load(&mut self, life: u64, order: &WorkOrder) -> Result<(u64, bool), ActorError> {
        let mut bytes = 0;
        let mut prefetched = false;
        if self.loaded != Some(order.weights) {
            let WeightsId::Policy { epoch, version } = order.weights else {
                return Err(ActorError::Internal(format!(
                    "order {} names {:?} as its policy",
                    order.generate.batch_seq, order.weights
                )));
            };
            let ((pointer, models), ahead) = self.policy_weights(life, order.weights).await?;
            prefetched = ahead;
            if pointer.base.is_none() {
                self.full = Some((order.weights, models.clone()));
            }
            let mut blobs = models.into_iter();
            bytes += pointer.bytes();
            let Some(first) = blobs.next() else {
                return Err(ActorError::Internal(format!(
                    "weights {:?} have no model",
                    order.weights
                )));
            };
            let weights = PublishedWeights::new(
                version,
                first.to_vec(),
                blobs.map(|b| b.to_vec()).collect(),
                pointer.probe.clone(),
            );
            self.local
                .board
                .install(PublishedWeights { epoch, ..weights });
            self.loaded = Some(order.weights);
        }
        if let Some(id @ WeightsId::Reference { serial }) = order.reference {
            if self.loaded_reference != Some(id) {
                let pointer = self.store.weights_pointer(life, id).await?;
                let blob = self.store.read_weights(&pointer).await?.into_iter().next();
                let Some(blob) = blob else {
                    return Err(ActorError::Internal(format!(
                        "reference {id:?} has no model"
                    )));
                };
                bytes += pointer.bytes();
                self.local.board.install_reference(PublishedReference {
                    copied_at: pointer.copied_at,
                    serial,
                    safetensors: std::sync::Arc::new(blob.to_vec()),
                });
                self.loaded_reference = Some(id);
            }
        }
        Ok((bytes, prefetched))
    }
}
