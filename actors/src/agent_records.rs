//! The `agent` env's journal in the run's store (AJ-1..4 in keel_envs::agent::journal). Every
//! call blocks until the store answered: env calls run on the env shard's blocking pool (ES-3)
//! and wait on the job's store runtime directly; a call made inside an async context (the
//! gateway's start, reading an earlier process's records) waits on a thread of its own.

use keel_envs::RecordStore;
use keel_store::RunStore;

/// The run's store as the agent journal sees it: names relative to the run root.
pub struct StoreRecords {
    store: RunStore,
    io: tokio::runtime::Handle,
}

impl StoreRecords {
    /// The records of `store`, read and written on `io`.
    pub fn new(store: RunStore, io: tokio::runtime::Handle) -> Self {
        StoreRecords { store, io }
    }
}

impl StoreRecords {
    /// Runs a store call to its end from sync code, inside an async context or not.
    fn wait<T: Send>(
        &self,
        call: impl std::future::Future<Output = Result<T, keel_store::StoreError>> + Send,
    ) -> Result<T, String> {
        let result = match tokio::runtime::Handle::try_current() {
            Err(_) => self.io.block_on(call),
            Ok(_) => std::thread::scope(|s| {
                s.spawn(|| self.io.block_on(call))
                    .join()
                    .map_err(|_| keel_store::StoreError::Encode("a store call panicked".into()))?
            }),
        };
        result.map_err(|e| e.to_string())
    }
}

impl RecordStore for StoreRecords {
    fn put(&self, name: &str, bytes: Vec<u8>) -> Result<(), String> {
        self.wait(self.store.put_object(name, bytes.into()))
    }

    fn get(&self, name: &str) -> Result<Vec<u8>, String> {
        self.wait(self.store.get_object(name)).map(|b| b.to_vec())
    }

    fn list(&self, dir: &str) -> Result<Vec<String>, String> {
        self.wait(self.store.list_objects(dir))
    }

    fn delete(&self, name: &str) -> Result<(), String> {
        self.wait(self.store.delete_object(name))
    }
}
