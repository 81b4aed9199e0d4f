//! Tests of `checkpoint`, named after its invariants (CK-n).

use super::*;

fn local() -> (tempfile::TempDir, RunStore) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = RunStore::open(dir.path().to_str().expect("utf-8 path")).expect("open");
    (dir, store)
}

fn new_ckpt(step: u64, parent: Option<String>) -> NewCheckpoint {
    NewCheckpoint {
        parent,
        step,
        policy_version: step / 2,
        config_hash: "cfg-abc".into(),
        reference: Some("ref-model".into()),
        tags: vec!["test".into()],
        data: DataPosition {
            next_task_index: step * 10,
            next_batch_seq: step,
            consumed_batches: vec![step],
            pending_tasks: vec![step * 10 + 4],
        },
        metrics: BTreeMap::from([("loss".to_string(), 0.5), ("reward".to_string(), -1.25)]),
        files: vec![
            (
                "model.safetensors".into(),
                Bytes::from(vec![step as u8; 1000]),
            ),
            ("optim.bin".into(), Bytes::from_static(b"adam")),
        ],
    }
}

#[tokio::test]
async fn ck1_ck2_commit_two_then_latest_is_the_second() {
    let (_dir, store) = local();
    assert!(store.latest_checkpoint().await.expect("no head").is_none());
    assert!(store.list_checkpoints().await.expect("empty").is_empty());

    let first = store
        .commit_checkpoint(new_ckpt(10, None))
        .await
        .expect("commit 1");
    assert_eq!(
        store.latest_checkpoint().await.expect("head"),
        Some(first.clone())
    );
    let second = store
        .commit_checkpoint(new_ckpt(20, Some(first.id.clone())))
        .await
        .expect("commit 2");
    let latest = store
        .latest_checkpoint()
        .await
        .expect("head")
        .expect("some");
    assert_eq!(latest, second);
    assert_eq!(latest.parent.as_deref(), Some(first.id.as_str()));
    assert_eq!(
        latest.files[0],
        FileEntry {
            name: "model.safetensors".into(),
            size: 1000,
            crc32: crc32fast::hash(&[20u8; 1000])
        }
    );
    assert_eq!(latest.data.consumed_batches, vec![20]);
    assert_eq!(latest.metrics["reward"], -1.25);
    assert_eq!(latest.format_version, CHECKPOINT_FORMAT_VERSION);
    assert_eq!(
        store.list_checkpoints().await.expect("list"),
        vec![first, second]
    );
}

#[tokio::test]
async fn ck5_ids_differ_for_branches_at_the_same_step() {
    let (_dir, store) = local();
    let a = store.commit_checkpoint(new_ckpt(7, None)).await.expect("a");
    let b = store.commit_checkpoint(new_ckpt(7, None)).await.expect("b");
    assert_ne!(a.id, b.id);
    assert!(
        a.id.starts_with("00000007-") && a.id.len() == 17,
        "{}",
        a.id
    );
    assert!(a.id[9..].chars().all(|c| c.is_ascii_hexdigit()), "{}", a.id);
    let listed = store.list_checkpoints().await.expect("list");
    assert_eq!(listed.len(), 2);
    assert_eq!(store.latest_checkpoint().await.expect("head"), Some(b));
}

#[tokio::test]
async fn ck4_read_checkpoint_file_verifies() {
    let (dir, store) = local();
    let m = store
        .commit_checkpoint(new_ckpt(3, None))
        .await
        .expect("commit");
    let blob = store
        .read_checkpoint_file(&m, "model.safetensors")
        .await
        .expect("read");
    assert_eq!(&blob[..], &[3u8; 1000][..]);
    assert!(matches!(
        store.read_checkpoint_file(&m, "absent.bin").await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(matches!(
        store.read_checkpoint_file(&m, "../HEAD").await,
        Err(StoreError::InvalidKey { .. })
    ));

    // Same size, one byte flipped on disk: the crc catches it.
    let path = dir
        .path()
        .join(format!("checkpoints/{}/model.safetensors", m.id));
    let mut bytes = std::fs::read(&path).expect("read blob");
    bytes[500] ^= 1;
    std::fs::write(&path, &bytes).expect("corrupt blob");
    match store.read_checkpoint_file(&m, "model.safetensors").await {
        Err(StoreError::CorruptCheckpoint { id, reason }) => {
            assert_eq!(id, m.id);
            assert!(reason.contains("crc32"), "{reason}");
        }
        r => panic!("expected CorruptCheckpoint, got {r:?}"),
    }
    // Truncated on disk: the size catches it.
    std::fs::write(&path, &bytes[..10]).expect("truncate blob");
    assert!(matches!(
        store.read_checkpoint_file(&m, "model.safetensors").await,
        Err(StoreError::CorruptCheckpoint { reason, .. }) if reason.contains("10 bytes")
    ));
    // Gone: corrupt, not merely not found.
    std::fs::remove_file(&path).expect("remove blob");
    assert!(matches!(
        store.read_checkpoint_file(&m, "model.safetensors").await,
        Err(StoreError::CorruptCheckpoint { reason, .. }) if reason.contains("missing")
    ));
}

#[tokio::test]
async fn ck1_directories_without_manifest_are_not_checkpoints() {
    let (_dir, store) = local();
    let m = store
        .commit_checkpoint(new_ckpt(1, None))
        .await
        .expect("commit");
    // A crashed commit: blobs written, no manifest.
    store
        .put_object(
            "checkpoints/00000002-deadbeef/model.safetensors",
            Bytes::from_static(b"x"),
        )
        .await
        .expect("orphan blob");
    assert_eq!(
        store.list_checkpoints().await.expect("list"),
        vec![m.clone()]
    );
    assert_eq!(store.latest_checkpoint().await.expect("head"), Some(m));
}

#[tokio::test]
async fn ck2_head_naming_a_missing_or_broken_manifest_is_corrupt() {
    let (_dir, store) = local();
    store
        .put_object(
            "checkpoints/HEAD",
            Bytes::from_static(b"00000009-00000000\n"),
        )
        .await
        .expect("put");
    match store.latest_checkpoint().await {
        Err(StoreError::CorruptCheckpoint { id, .. }) => assert_eq!(id, "00000009-00000000"),
        r => panic!("expected CorruptCheckpoint, got {r:?}"),
    }
    store
        .put_object(
            "checkpoints/00000009-00000000/MANIFEST.json",
            Bytes::from_static(b"{not json"),
        )
        .await
        .expect("put");
    assert!(matches!(
        store.latest_checkpoint().await,
        Err(StoreError::CorruptCheckpoint { .. })
    ));
    assert!(matches!(
        store.list_checkpoints().await,
        Err(StoreError::CorruptCheckpoint { .. })
    ));
    store
        .put_object("checkpoints/HEAD", Bytes::from_static(b"../../etc"))
        .await
        .expect("put");
    assert!(matches!(
        store.latest_checkpoint().await,
        Err(StoreError::CorruptCheckpoint { .. })
    ));
}

#[tokio::test]
async fn ck6_bad_file_names_and_metrics_are_rejected() {
    let (_dir, store) = local();
    for name in ["../escape", "a/b", "MANIFEST.json", ""] {
        let mut c = new_ckpt(1, None);
        c.files[0].0 = name.into();
        assert!(
            store.commit_checkpoint(c).await.is_err(),
            "{name:?} was accepted"
        );
    }
    let mut c = new_ckpt(1, None);
    c.files[1].0 = c.files[0].0.clone();
    assert!(matches!(
        store.commit_checkpoint(c).await,
        Err(StoreError::InvalidCheckpoint { .. })
    ));
    let mut c = new_ckpt(1, None);
    c.metrics.insert("loss".into(), f64::NAN);
    assert!(matches!(
        store.commit_checkpoint(c).await,
        Err(StoreError::InvalidCheckpoint { .. })
    ));
    assert!(store.latest_checkpoint().await.expect("head").is_none());
}

#[tokio::test]
async fn ck3_head_moves_with_create_then_conditional_update_on_memory_backend() {
    // InMemory supports PutMode::Update, so this exercises the conditional path, not the fallback.
    let store = RunStore::with_backend_for_tests(std::sync::Arc::new(
        object_store::memory::InMemory::new(),
    ));
    let a = store.commit_checkpoint(new_ckpt(1, None)).await.expect("a");
    let b = store
        .commit_checkpoint(new_ckpt(2, Some(a.id.clone())))
        .await
        .expect("b");
    assert_eq!(store.latest_checkpoint().await.expect("head"), Some(b));
}

#[tokio::test]
async fn ck3_a_stale_conditional_update_is_a_conflict() {
    let store = RunStore::with_backend_for_tests(std::sync::Arc::new(
        object_store::memory::InMemory::new(),
    ));
    let key = "checkpoints/HEAD";
    let first = store
        .put_full(key, Bytes::from_static(b"a"), PutMode::Create)
        .await
        .expect("create");
    store
        .put_full(key, Bytes::from_static(b"b"), PutMode::Overwrite)
        .await
        .expect("other writer");
    let stale = PutMode::Update(UpdateVersion {
        e_tag: first.e_tag,
        version: first.version,
    });
    assert!(matches!(
        store.put_full(key, Bytes::from_static(b"c"), stale).await,
        Err(StoreError::Conflict { .. })
    ));
    assert!(matches!(
        store
            .put_full(key, Bytes::from_static(b"d"), PutMode::Create)
            .await,
        Err(StoreError::AlreadyExists { .. })
    ));
}
