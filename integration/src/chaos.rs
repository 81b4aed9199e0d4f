//! What the chaos harness (integration/tests/chaos.rs, issue 32) reads from a run root beside
//! `check_accounting`:
//!
//! - CH-1 (staleness books): every batch trained along a lineage is still in the store, and
//!   every on-policy turn in it was sampled at most `bound` policy versions behind the update
//!   that trained it, and never by a policy newer than that update. A checkpoint records which
//!   batches were trained since its parent, not at which update, so a batch of checkpoint `m`
//!   (parent `p`) was trained at some version in `p.policy_version .. m.policy_version`; the
//!   check is exact for a checkpoint one update after its parent and otherwise never fails a
//!   run that kept the bound.
//! - CH-2 (a commit in flight): a checkpoint folder that appeared after the watch started and
//!   has blobs but no manifest, or a manifest that its branch head does not name yet, is a
//!   commit the trainer has not finished; a signal sent to a trainer stopped while that holds
//!   lands inside the commit.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use keel_store::{BatchKey, CheckpointManifest, RunStore, Source};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::ObjectStore;
use tokio::runtime::Runtime;

/// Sends `sig` to process `pid` at once (no `kill` process in between: a SIGSTOP that must land
/// inside a commit cannot wait for a fork and exec).
pub fn send(pid: u32, sig: Signal) {
    kill(Pid::from_raw(pid as i32), sig).unwrap_or_else(|e| panic!("kill -{sig} {pid}: {e}"));
}

/// What [`check_staleness`] read.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Staleness {
    /// Trained batches read (a batch stored twice by a re-executed order counts twice).
    pub batches: usize,
    /// On-policy turns checked.
    pub turns: usize,
    /// The largest lag of a turn behind the version its checkpoint's parent held (a lower
    /// bound of its lag when trained).
    pub max_lag: u64,
}

/// The batch keys of every branch the harness looked at, by branch and then batch seq.
#[derive(Default)]
pub struct BatchIndex {
    branches: HashMap<String, BTreeMap<u64, Vec<BatchKey>>>,
}

impl BatchIndex {
    /// The keys stored for `seq` on `branch`, listing the branch again when `seq` is not known
    /// yet (it was stored after the last listing).
    fn keys(&mut self, rt: &Runtime, store: &RunStore, branch: &str, seq: u64) -> Vec<BatchKey> {
        let known = self
            .branches
            .get(branch)
            .is_some_and(|b| b.contains_key(&seq));
        if !known {
            let on = store.on_branch(branch).expect("a branch name keel wrote");
            let mut by_seq: BTreeMap<u64, Vec<BatchKey>> = BTreeMap::new();
            for key in rt.block_on(on.list_batches()).expect("list batches") {
                if let Some(s) = key.batch_seq() {
                    by_seq.entry(s).or_default().push(key);
                }
            }
            self.branches.insert(branch.to_string(), by_seq);
        }
        self.branches[branch].get(&seq).cloned().unwrap_or_default()
    }
}

/// CH-1 over `lineage` (newest first, as `check_accounting` answers it). Checkpoints whose id
/// is in `checked` are skipped; the ones checked now are added to it.
pub fn check_staleness(
    rt: &Runtime,
    store: &RunStore,
    lineage: &[CheckpointManifest],
    bound: u64,
    index: &mut BatchIndex,
    checked: &mut BTreeSet<String>,
    context: &str,
) -> Staleness {
    let mut books = Staleness::default();
    for (i, m) in lineage.iter().enumerate() {
        if m.data.consumed_batches.is_empty() || checked.contains(&m.id) {
            continue;
        }
        let first = lineage.get(i + 1).map_or(0, |p| p.policy_version);
        let last = m.policy_version.saturating_sub(1).max(first);
        // A batch is stored on the branch that trained it; look along the lineage if not.
        let mut branches: Vec<&str> = vec![&m.branch];
        branches.extend(lineage.iter().map(|l| l.branch.as_str()));
        for &seq in &m.data.consumed_batches {
            let keys = branches
                .iter()
                .map(|b| index.keys(rt, store, b, seq))
                .find(|k| !k.is_empty())
                .unwrap_or_else(|| {
                    panic!("{context}: batch {seq} trained in {} is not stored", m.id)
                });
            // A late second answer to one order stores a second batch under the same seq;
            // only when there is one is it surely the batch that was trained.
            let unique = keys.len() == 1;
            for key in keys {
                let versions = turn_versions(rt, store, &key, context);
                for v in versions {
                    assert!(
                        v + bound >= first,
                        "{context}: {} has a turn of policy version {v}, trained in {} after \
                         version {first}: more than the bound {bound} behind",
                        key.0,
                        m.id
                    );
                    assert!(
                        !unique || v <= last,
                        "{context}: {} has a turn of policy version {v}, newer than every \
                         update ({first}..={last}) that could have trained it in {}",
                        key.0,
                        m.id
                    );
                    books.turns += 1;
                    books.max_lag = books.max_lag.max(first.saturating_sub(v));
                }
                books.batches += 1;
            }
        }
        checked.insert(m.id.clone());
    }
    books
}

/// The policy versions of every on-policy turn of the batch at `key`.
fn turn_versions(rt: &Runtime, store: &RunStore, key: &BatchKey, context: &str) -> Vec<u64> {
    let batch = rt
        .block_on(store.get_batch(key))
        .and_then(|b| b.to_owned())
        .unwrap_or_else(|e| panic!("{context}: trained batch {} unreadable: {e}", key.0));
    batch
        .trajectories
        .iter()
        .filter(|t| t.source == Source::OnPolicy)
        .flat_map(|t| t.turns.iter().map(|turn| turn.policy_version))
        .collect()
}

/// One folder level of a run root at a time (S3 `delimiter` listings): the folders under
/// `checkpoints/` are one short page however many checkpoints there are, where
/// `RunStore::list_objects` reads every blob of every checkpoint (~200 ms at 280 checkpoints on
/// a loaded 2-core machine: longer than a commit, so a long soak would catch none).
pub struct Folders {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
}

impl Folders {
    /// `root` as `RunStore::open` takes it (`s3://bucket/prefix` with the AWS environment, or a
    /// local directory).
    pub fn open(root: &str) -> Folders {
        let (store, prefix): (Arc<dyn ObjectStore>, &str) = match root.strip_prefix("s3://") {
            Some(rest) => {
                let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
                let s3 = AmazonS3Builder::from_env()
                    .with_bucket_name(bucket)
                    .build()
                    .expect("an S3 client from the AWS environment");
                (Arc::new(s3), prefix)
            }
            None => {
                let local = LocalFileSystem::new_with_prefix(root).expect("a local run root");
                (Arc::new(local), "")
            }
        };
        Folders {
            store,
            prefix: Path::from(prefix.trim_end_matches('/')),
        }
    }

    /// The folder names and the object names directly under `rel` (`a/b`); a listing that fails
    /// (storage restarting) is empty.
    fn level(&self, rt: &Runtime, rel: &str) -> (Vec<String>, Vec<String>) {
        let mut at = self.prefix.clone();
        for part in rel.split('/') {
            at = at.join(part);
        }
        let Ok(listed) = rt.block_on(self.store.list_with_delimiter(Some(&at))) else {
            return (Vec::new(), Vec::new());
        };
        let name = |p: &Path| p.filename().unwrap_or_default().to_string();
        let folders = listed.common_prefixes.iter().map(name).collect();
        let objects = listed.objects.iter().map(|o| name(&o.location)).collect();
        (folders, objects)
    }

    /// Whether checkpoint `id` has its manifest.
    fn has_manifest(&self, rt: &Runtime, id: &str) -> bool {
        let (_, objects) = self.level(rt, &format!("checkpoints/{id}"));
        objects.iter().any(|n| n == "MANIFEST.json")
    }
}

/// CH-2: watches a run root for a checkpoint commit in flight.
pub struct CommitWatch {
    folders: Folders,
    /// Folders that existed when the watch started or whose commit it saw finished.
    seen: BTreeSet<String>,
    /// Commits that finished between two polls (too quick to catch).
    pub missed: usize,
}

impl CommitWatch {
    /// Every checkpoint folder of `root` there is now counts as old (an orphan of a killed
    /// commit too).
    pub fn new(rt: &Runtime, root: &str) -> Self {
        let folders = Folders::open(root);
        let (ids, _) = folders.level(rt, "checkpoints");
        CommitWatch {
            folders,
            seen: ids.into_iter().collect(),
            missed: 0,
        }
    }

    /// A new checkpoint folder without its manifest, if there is one now.
    pub fn poll(&mut self, rt: &Runtime) -> Option<String> {
        let (ids, _) = self.folders.level(rt, "checkpoints");
        for id in ids {
            if self.seen.contains(&id) {
                continue;
            }
            if !self.folders.has_manifest(rt, &id) {
                return Some(id);
            }
            self.seen.insert(id);
            self.missed += 1;
        }
        None
    }

    /// Whether the commit of `id` is still unfinished: no manifest, or a manifest its branch
    /// head (read through `store`) does not name yet. An id that is finished is remembered.
    pub fn unfinished(&mut self, rt: &Runtime, store: &RunStore, id: &str) -> bool {
        if !self.folders.has_manifest(rt, id) {
            return true;
        }
        let branch = rt
            .block_on(store.ancestry(id))
            .ok()
            .and_then(|l| l.into_iter().next())
            .map(|m| m.branch);
        let head = branch.and_then(|b| rt.block_on(store.branch_head(&b)).ok().flatten());
        let finished = head.is_some_and(|h| h.id == id);
        if finished {
            self.seen.insert(id.to_string());
            self.missed += 1;
        }
        !finished
    }
}
