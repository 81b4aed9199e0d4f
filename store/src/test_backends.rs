//! Runs a store test body on both backends: a local directory and a real S3-compatible server
//! (the SeaweedFS that `scripts/seaweedfs.sh` starts on loopback; `scripts/test.sh` and `.ci/run`
//! do). No mocks: without `KEEL_TEST_S3_ENDPOINT` the S3 half fails with a message saying so.

use std::future::Future;

use crate::root::RunStore;

/// A fresh `s3://bucket/prefix` root on the test server.
pub(crate) fn s3_root(test: &str) -> String {
    if std::env::var("KEEL_TEST_S3_ENDPOINT").is_err() {
        panic!(
            "KEEL_TEST_S3_ENDPOINT is not set: store tests run on local disk and on S3; run them \
             through scripts/test.sh, or `. scripts/seaweedfs.sh` first"
        );
    }
    let bucket = std::env::var("KEEL_TEST_S3_BUCKET").unwrap_or_else(|_| "keel-test".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("s3://{bucket}/store-{test}-{}-{nanos}", std::process::id())
}

/// Runs `body` on a fresh local run root, then on a fresh S3 run root.
pub(crate) async fn each_backend<F, Fut>(test: &str, body: F)
where
    F: Fn(RunStore) -> Fut,
    Fut: Future<Output = ()>,
{
    let dir = tempfile::tempdir().expect("tempdir");
    let local = RunStore::open(dir.path().to_str().expect("utf-8 path")).expect("open local");
    body(local).await;
    let s3 = RunStore::open(&s3_root(test)).expect("open s3");
    body(s3).await;
}

/// Flips one byte of the object at `rel_key` (through the store, so it works on both backends).
pub(crate) async fn flip_byte(store: &RunStore, rel_key: &str, at: usize) {
    let mut bytes = store.get_object(rel_key).await.expect("raw get").to_vec();
    let i = at.min(bytes.len() - 1);
    bytes[i] ^= 0x5a;
    store
        .put_object(rel_key, bytes.into())
        .await
        .expect("overwrite with a corrupt copy");
}
