//! Tests of `checkpoint`, named after its invariants (CK-n); each runs on local disk and on S3.

use super::*;
use crate::test_backends::{each_backend, flip_byte};

pub(crate) fn new_ckpt(step: u64, parent: Option<String>) -> NewCheckpoint {
    NewCheckpoint {
        parent,
        step,
        policy_version: step / 2,
        config_hash: "cfg-abc".into(),
        reference: Some("ref-model".into()),
        tags: vec!["test".into()],
        data: DataPosition {
            next_task_index: step * 10 + 10,
            next_batch_seq: step + 1,
            consumed_batches: vec![step],
            pending_tasks: vec![step * 10 + 4],
            consumed_tasks: vec![step * 10],
            dropped_batches: vec![],
            skipped_tasks: vec![],
            pending_batch_seqs: Some(vec![step]),
            method_state: BTreeMap::from([("rtpo".to_string(), format!("{{\"depth\":{step}}}"))]),
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
    each_backend("ck1", |store| async move {
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
        assert_eq!(latest.branch, "main");
        assert_eq!(
            latest.files[0],
            FileEntry {
                name: "model.safetensors".into(),
                size: 1000,
                crc32: crc32fast::hash(&[20u8; 1000])
            }
        );
        assert_eq!(latest.data.consumed_batches, vec![20]);
        assert_eq!(latest.data.consumed_tasks, vec![200]);
        assert_eq!(latest.metrics["reward"], -1.25);
        assert_eq!(latest.format_version, CHECKPOINT_FORMAT_VERSION);
        assert_eq!(
            store.list_checkpoints().await.expect("list"),
            vec![first, second]
        );
    })
    .await;
}

#[tokio::test]
async fn ck5_ids_differ_for_branches_at_the_same_step() {
    each_backend("ck5", |store| async move {
        let a = store.commit_checkpoint(new_ckpt(7, None)).await.expect("a");
        let b = store.commit_checkpoint(new_ckpt(7, None)).await.expect("b");
        assert_ne!(a.id, b.id);
        assert!(
            a.id.starts_with("00000007-") && a.id.len() == 17,
            "{}",
            a.id
        );
        assert!(a.id[9..].chars().all(|c| c.is_ascii_hexdigit()), "{}", a.id);
        assert_eq!(store.list_checkpoints().await.expect("list").len(), 2);
        assert_eq!(store.latest_checkpoint().await.expect("head"), Some(b));
    })
    .await;
}

#[tokio::test]
async fn ck4_read_checkpoint_file_verifies() {
    each_backend("ck4", |store| async move {
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
        // Same size, one byte flipped: the crc catches it.
        let rel = format!("checkpoints/{}/model.safetensors", m.id);
        flip_byte(&store, &rel, 500).await;
        match store.read_checkpoint_file(&m, "model.safetensors").await {
            Err(StoreError::CorruptCheckpoint { id, reason }) => {
                assert_eq!(id, m.id);
                assert!(reason.contains("crc32"), "{reason}");
            }
            r => panic!("expected CorruptCheckpoint, got {r:?}"),
        }
        // Truncated: the size catches it.
        store
            .put_object(&rel, Bytes::from_static(b"0123456789"))
            .await
            .expect("truncate");
        assert!(matches!(
            store.read_checkpoint_file(&m, "model.safetensors").await,
            Err(StoreError::CorruptCheckpoint { reason, .. }) if reason.contains("10 bytes")
        ));
        assert!(store.verify_checkpoint(&m).await.is_err());
    })
    .await;
}

#[tokio::test]
async fn ck1_directories_without_manifest_are_not_checkpoints() {
    each_backend("ck1b", |store| async move {
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
    })
    .await;
}

#[tokio::test]
async fn ck2_head_naming_a_missing_or_broken_manifest_is_corrupt() {
    each_backend("ck2", |store| async move {
        let head = "branches/main/HEAD.0000000001";
        store
            .put_object(head, Bytes::from_static(b"00000009-00000000\n"))
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
            .put_object(
                "branches/main/HEAD.0000000002",
                Bytes::from_static(b"../../etc"),
            )
            .await
            .expect("put");
        assert!(matches!(
            store.latest_checkpoint().await,
            Err(StoreError::CorruptCheckpoint { .. })
        ));
    })
    .await;
}

#[tokio::test]
async fn ck6_bad_file_names_and_metrics_are_rejected() {
    each_backend("ck6", |store| async move {
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
        assert!(store
            .commit_checkpoint_on("../x", new_ckpt(1, None), ExpectHead::Current)
            .await
            .is_err());
    })
    .await;
}

#[tokio::test]
async fn ck3_racing_committers_exactly_one_wins() {
    each_backend("ck3", |store| async move {
        let base = store
            .commit_checkpoint(new_ckpt(1, None))
            .await
            .expect("base");
        let racers = (0..4).map(|i| {
            let s = store.clone();
            let parent = base.id.clone();
            async move {
                s.commit_checkpoint_on(
                    "main",
                    new_ckpt(2 + i, Some(parent.clone())),
                    ExpectHead::Id(parent),
                )
                .await
            }
        });
        let results = futures::future::join_all(racers).await;
        let winners: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(winners.len(), 1, "{results:?}");
        for r in &results {
            if let Err(e) = r {
                assert!(matches!(e, StoreError::Conflict { .. }), "{e:?}");
                assert!(e.to_string().contains("another writer"), "{e}");
            }
        }
        let head = store
            .latest_checkpoint()
            .await
            .expect("head")
            .expect("some");
        assert_eq!(head.id, winners[0].id);
        // A stale expectation is refused before anything is written.
        assert!(matches!(
            store
                .commit_checkpoint_on("main", new_ckpt(9, None), ExpectHead::Id(base.id.clone()))
                .await,
            Err(StoreError::Conflict { .. })
        ));
        assert!(matches!(
            store
                .commit_checkpoint_on("main", new_ckpt(9, None), ExpectHead::NoHead)
                .await,
            Err(StoreError::Conflict { .. })
        ));
    })
    .await;
}

#[tokio::test]
async fn ck7_resume_falls_back_to_the_newest_verifiable_ancestor() {
    each_backend("ck7", |store| async move {
        assert!(store.resume_point().await.expect("empty").is_none());
        let a = store.commit_checkpoint(new_ckpt(1, None)).await.expect("a");
        let b = store
            .commit_checkpoint(new_ckpt(2, Some(a.id.clone())))
            .await
            .expect("b");
        let c = store
            .commit_checkpoint(new_ckpt(3, Some(b.id.clone())))
            .await
            .expect("c");
        let rp = store.resume_point().await.expect("resume").expect("some");
        assert_eq!(rp.manifest.id, c.id);
        assert!(rp.skipped.is_empty());
        assert_eq!(rp.files[0].1.len(), 1000);

        flip_byte(
            &store,
            &format!("checkpoints/{}/model.safetensors", c.id),
            3,
        )
        .await;
        store
            .put_object(
                &format!("checkpoints/{}/optim.bin", b.id),
                Bytes::from_static(b"ada"),
            )
            .await
            .expect("truncate");
        let rp = store.resume_point().await.expect("resume").expect("some");
        assert_eq!(rp.manifest.id, a.id);
        assert_eq!(rp.head, c.id);
        let skipped: Vec<_> = rp.skipped.iter().map(|s| s.id.clone()).collect();
        assert_eq!(skipped, vec![c.id.clone(), b.id.clone()]);
        assert!(rp.skipped[0].reason.contains("crc32"), "{:?}", rp.skipped);
        // The corrupt blobs were quarantined.
        let q = store.list_quarantine().await.expect("q");
        assert!(
            q.contains(&format!(
                "quarantine/checkpoints/{}/model.safetensors",
                c.id
            )),
            "{q:?}"
        );
        assert!(
            q.contains(&format!("quarantine/checkpoints/{}/optim.bin", b.id)),
            "{q:?}"
        );

        // The next commit continues the branch from the ancestor, expecting the head it saw.
        let d = store
            .commit_checkpoint_on(
                "main",
                new_ckpt(2, Some(a.id.clone())),
                ExpectHead::Id(rp.head),
            )
            .await
            .expect("d");
        assert_eq!(store.latest_checkpoint().await.expect("head"), Some(d));

        // Nothing verifiable at all: an error, never "start from scratch".
        flip_byte(&store, &format!("checkpoints/{}/optim.bin", a.id), 0).await;
        store
            .put_object(
                &format!(
                    "checkpoints/{}/optim.bin",
                    store.latest_checkpoint().await.expect("h").expect("s").id
                ),
                Bytes::new(),
            )
            .await
            .expect("empty");
        match store.resume_point().await {
            Err(e @ StoreError::NoVerifiableCheckpoint { .. }) => {
                assert!(e.to_string().contains("keel train --from"), "{e}")
            }
            r => panic!("expected NoVerifiableCheckpoint, got {r:?}"),
        }
    })
    .await;
}

#[tokio::test]
async fn ck1_large_blobs_go_up_in_parts_and_verify() {
    each_backend("multipart", |store| async move {
        let store = store.with_multipart_threshold(64 << 10);
        let mut c = new_ckpt(4, None);
        let big: Vec<u8> = (0..(9u32 << 20)).map(|i| (i % 251) as u8).collect();
        c.files[0].1 = Bytes::from(big.clone());
        let m = store.commit_checkpoint(c).await.expect("commit");
        let files = store.verify_checkpoint(&m).await.expect("verify");
        assert_eq!(files[0].1, Bytes::from(big));
    })
    .await;
}

#[tokio::test]
async fn branches_have_their_own_heads_and_batches() {
    each_backend("branches", |store| async move {
        let a = store.commit_checkpoint(new_ckpt(1, None)).await.expect("a");
        let side = store.on_branch("exp-1").expect("branch");
        assert!(side.latest_checkpoint().await.expect("none").is_none());
        let b = side
            .commit_checkpoint_on("exp-1", new_ckpt(2, Some(a.id.clone())), ExpectHead::NoHead)
            .await
            .expect("b");
        assert_eq!(b.branch, "exp-1");
        assert_eq!(
            side.latest_checkpoint().await.expect("head"),
            Some(b.clone())
        );
        assert_eq!(store.latest_checkpoint().await.expect("head"), Some(a));
        assert_eq!(
            side.batch_key(3)
                .0
                .rsplit_once('/')
                .map(|x| x.0.ends_with("branches/exp-1/batches")),
            Some(true)
        );
        assert!(store.on_branch("a/b").is_err());
    })
    .await;
}
