//! Tests of `root`, named after its invariants (ST-n).

use super::*;
use crate::batch::tests::sample_batch;
use crate::test_backends::{each_backend, flip_byte};
use object_store::ClientConfigKey;

fn local() -> (tempfile::TempDir, RunStore) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = RunStore::open(dir.path().to_str().expect("utf-8 path")).expect("open");
    (dir, store)
}

#[tokio::test]
async fn st3_st4_put_get_list_batches() {
    each_backend("st3", |store| async move {
        assert!(store.list_batches().await.expect("empty list").is_empty());
        for seq in [12, 3, 10_000_000_000, 7] {
            let key = store.put_batch(&sample_batch(seq)).await.expect("put");
            assert_eq!(key, store.batch_key(seq));
        }
        assert!(store.batch_key(12).0.ends_with("batches/0000000012.krb"));
        let keys = store.list_batches().await.expect("list");
        let seqs: Vec<_> = keys.iter().map(|k| k.batch_seq().expect("seq")).collect();
        assert_eq!(seqs, vec![3, 7, 12, 10_000_000_000]);

        let buf = store.get_batch(&store.batch_key(7)).await.expect("get");
        assert_eq!(buf.to_owned().expect("deserialize"), sample_batch(7));
        assert_eq!(buf.archived().batch_seq.to_native(), 7);

        // Other objects under batches/ are ignored by the listing.
        store
            .put_object("batches/README", Bytes::from_static(b"hi"))
            .await
            .expect("put");
        assert_eq!(store.list_batches().await.expect("list").len(), 4);
    })
    .await;
}

#[tokio::test]
async fn st3_listing_from_a_seq_lists_only_the_tail() {
    each_backend("st3-from", |store| async move {
        let tagged = store.clone().with_writer("l0000000002").expect("writer");
        for seq in [0, 1, 9, 10, 11, 250] {
            store.put_batch(&sample_batch(seq)).await.expect("put");
        }
        tagged
            .put_batch(&sample_batch(10))
            .await
            .expect("put tagged");
        let seqs = |keys: Vec<BatchKey>| -> Vec<u64> {
            keys.iter().map(|k| k.batch_seq().expect("seq")).collect()
        };
        let from_10 = store.list_batches_from(10).await.expect("list");
        assert_eq!(seqs(from_10), vec![10, 10, 11, 250]);
        assert_eq!(
            seqs(store.list_batches_from(12).await.expect("list")),
            vec![250]
        );
        assert_eq!(
            seqs(store.list_batches_from(251).await.expect("list")),
            Vec::<u64>::new()
        );
        assert_eq!(store.list_batches_from(0).await.expect("list").len(), 7);
    })
    .await;
}

#[tokio::test]
async fn st1_second_put_of_a_seq_is_already_exists() {
    each_backend("st1", |store| async move {
        store.put_batch(&sample_batch(5)).await.expect("first put");
        let mut other = sample_batch(5);
        other.generator_id = 99;
        match store.put_batch(&other).await {
            Err(StoreError::AlreadyExists { key }) => {
                assert!(key.ends_with("batches/0000000005.krb"), "{key}")
            }
            r => panic!("expected AlreadyExists, got {r:?}"),
        }
        let kept = store
            .get_batch(&store.batch_key(5))
            .await
            .expect("get")
            .to_owned()
            .expect("owned");
        assert_eq!(kept.generator_id, 3, "the first batch must be untouched");
    })
    .await;
}

#[tokio::test]
async fn st4_corrupt_batch_names_its_key() {
    each_backend("st4", |store| async move {
        store.put_batch(&sample_batch(1)).await.expect("put");
        flip_byte(&store, "batches/0000000001.krb", usize::MAX).await;
        match store.get_batch(&store.batch_key(1)).await {
            Err(e @ StoreError::CorruptBatch { .. }) => {
                let StoreError::CorruptBatch { key, source } = &e else {
                    unreachable!()
                };
                assert!(key.ends_with("batches/0000000001.krb"), "{key}");
                assert!(
                    matches!(**source, StoreError::ChecksumMismatch { .. }),
                    "{source:?}"
                );
                assert!(e.to_string().contains("batches/0000000001.krb is corrupt"));
            }
            r => panic!("expected CorruptBatch, got {r:?}"),
        }
        assert!(matches!(
            store.get_batch(&store.batch_key(2)).await,
            Err(StoreError::NotFound { .. })
        ));
    })
    .await;
}

#[tokio::test]
async fn st1_invalid_batches_are_not_stored() {
    each_backend("st1b", |store| async move {
        let mut b = sample_batch(1);
        b.trajectories[0].loss_mask.clear();
        assert!(matches!(
            store.put_batch(&b).await,
            Err(StoreError::InvalidBatch { .. })
        ));
        assert!(store.list_batches().await.expect("list").is_empty());
    })
    .await;
}

#[tokio::test]
async fn st2_generic_objects_and_hostile_keys() {
    let (dir, store) = local();
    store
        .put_object("lineage/run.json", Bytes::from_static(b"{}"))
        .await
        .expect("put");
    store
        .put_object("lineage/run.json", Bytes::from_static(b"{\"a\":1}"))
        .await
        .expect("overwrite");
    assert_eq!(
        &store.get_object("lineage/run.json").await.expect("get")[..],
        b"{\"a\":1}"
    );
    assert!(matches!(
        store.get_object("nope").await,
        Err(StoreError::NotFound { .. })
    ));
    for key in ["../x", "/etc/passwd", "a//b", "a/../../b", "a\\b", ""] {
        assert!(
            matches!(
                store.put_object(key, Bytes::new()).await,
                Err(StoreError::InvalidKey { .. })
            ),
            "put {key:?}"
        );
        assert!(
            matches!(
                store.get_object(key).await,
                Err(StoreError::InvalidKey { .. })
            ),
            "get {key:?}"
        );
    }
    assert!(!dir.path().parent().expect("parent").join("x").exists());
    let hostile = BatchKey("../outside.krb".into());
    assert!(matches!(
        store.get_batch(&hostile).await,
        Err(StoreError::InvalidKey { .. })
    ));
}

#[test]
fn open_local_roots() {
    let dir = tempfile::tempdir().expect("tempdir");
    let nested = dir.path().join("a/b/run");
    let store = RunStore::open(nested.to_str().expect("utf-8")).expect("open creates dirs");
    assert!(nested.is_dir());
    assert_eq!(store.root_url(), nested.to_str().expect("utf-8"));
    let url = url::Url::from_directory_path(&nested)
        .expect("url")
        .to_string();
    RunStore::open(&url).expect("file:// url");
    assert!(format!("{store:?}").contains("LocalFileSystem"));

    // Relative roots are resolved against the current directory.
    let cwd_tmp = tempfile::Builder::new()
        .prefix(".keel-store-test-")
        .tempdir_in(".")
        .expect("tmp");
    let name = cwd_tmp
        .path()
        .file_name()
        .and_then(|n| n.to_str())
        .expect("utf-8 name");
    let rel = format!("{name}/run");
    RunStore::open(&rel).expect("relative root");
    assert!(cwd_tmp.path().join("run").is_dir());
}

#[test]
fn open_rejects_bad_roots() {
    for root in [
        "",
        "   ",
        "gs://bucket/x",
        "s3:///nobucket",
        "s3://bucket/a//b",
        "s3://b/x?y=1",
    ] {
        assert!(
            matches!(RunStore::open(root), Err(StoreError::InvalidRoot { .. })),
            "{root:?} was accepted"
        );
    }
}

#[test]
fn st6_credentials_in_the_url_are_rejected_and_not_echoed() {
    match RunStore::open("s3://AKIAKEY:s3cr3t@bucket/run") {
        Err(e @ StoreError::InvalidRoot { .. }) => {
            let msg = e.to_string();
            assert!(!msg.contains("s3cr3t") && !msg.contains("AKIAKEY"), "{msg}");
        }
        r => panic!("expected InvalidRoot, got {r:?}"),
    }
}

#[test]
fn open_s3_builds_a_prefixed_store() {
    let store = RunStore::open("s3://bucket/runs/r1/").expect("s3 root");
    assert_eq!(store.root_url(), "s3://bucket/runs/r1/");
    assert_eq!(store.batch_key(12).0, "runs/r1/batches/0000000012.krb");
    let debug = format!("{store:?}");
    assert!(
        debug.contains("bucket") && debug.contains("runs/r1"),
        "{debug}"
    );
    let bare = RunStore::open("s3://bucket").expect("no prefix");
    assert_eq!(bare.batch_key(1).0, "batches/0000000001.krb");
}

#[test]
fn s3_http_endpoints_use_plain_http_and_path_style() {
    let local = configure_s3(
        AmazonS3Builder::new().with_endpoint("http://127.0.0.1:8333"),
        "b",
    );
    assert_eq!(
        local
            .get_config_value(&AmazonS3ConfigKey::Bucket)
            .as_deref(),
        Some("b")
    );
    assert_eq!(
        local
            .get_config_value(&AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp))
            .as_deref(),
        Some("true")
    );
    assert_eq!(
        local
            .get_config_value(&AmazonS3ConfigKey::VirtualHostedStyleRequest)
            .as_deref(),
        Some("false")
    );
    local.build().expect("builds");

    let aws = configure_s3(AmazonS3Builder::new().with_region("eu-west-1"), "b");
    assert_ne!(
        aws.get_config_value(&AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp))
            .as_deref(),
        Some("true")
    );
}

#[tokio::test]
async fn st10_interrupted_local_writes_are_unlisted_and_removable() {
    let (dir, store) = local();
    store
        .create_object("tb/main/a.keel", Bytes::from_static(b"a"))
        .await
        .expect("create");
    // What a process killed between object_store's staging write and its rename leaves.
    let folder = dir.path().join("tb/main");
    std::fs::write(folder.join("b.keel#1"), b"partial").expect("staging file");
    assert_eq!(
        store.list_objects("tb/main").await.expect("list"),
        vec!["tb/main/a.keel".to_string()],
        "listings never show a staging file"
    );
    assert!(store
        .list_objects("tb/none")
        .await
        .expect("list")
        .is_empty());
    assert_eq!(
        store.remove_interrupted_writes("tb/main").expect("clean"),
        1
    );
    assert!(!folder.join("b.keel#1").exists());
    assert!(folder.join("a.keel").exists(), "objects stay");
    assert_eq!(
        store.remove_interrupted_writes("tb/none").expect("absent"),
        0
    );
    assert!(matches!(
        store.remove_interrupted_writes("../x"),
        Err(StoreError::InvalidKey { .. })
    ));
}

#[test]
fn st11_plaintext_endpoints_off_this_machine_are_flagged() {
    for remote in [
        "http://10.0.0.5:8333",
        "http://s3.example.com",
        "http://[2001:db8::1]:9000",
    ] {
        assert!(plaintext_remote(remote), "{remote}");
    }
    for fine in [
        "http://127.0.0.1:8333",
        "http://localhost:9000",
        "http://[::1]:9000",
        "https://s3.example.com",
        "not a url",
    ] {
        assert!(!plaintext_remote(fine), "{fine}");
    }
}

#[tokio::test]
async fn st12_tagged_writers_never_share_a_batch_key() {
    each_backend("st12", |store| async move {
        let a = store.clone().with_writer("l0000000001").expect("writer");
        let b = store.clone().with_writer("l0000000002").expect("writer");
        let ka = a.put_batch(&sample_batch(4)).await.expect("a");
        let kb = b
            .put_batch(&sample_batch(4))
            .await
            .expect("b: same seq, own key");
        assert_ne!(ka, kb);
        assert!(ka.0.ends_with("batches/0000000004-l0000000001.krb"), "{ka}");
        assert_eq!((ka.batch_seq(), kb.batch_seq()), (Some(4), Some(4)));
        assert_eq!(store.list_batches().await.expect("list").len(), 2);
        assert!(store.clone().with_writer("../x").is_err());
    })
    .await;
}

#[tokio::test]
async fn st13_qu3_a_planted_link_is_refused_and_quarantined_without_reading_its_target() {
    let (dir, store) = local();
    let outside = tempfile::tempdir().expect("outside");
    let secret = outside.path().join("secret.txt");
    std::fs::write(&secret, b"outside the run root").expect("secret");
    store.put_batch(&sample_batch(1)).await.expect("put");
    // A link named like a batch, and a linked folder holding a file.
    let batches = dir.path().join("batches");
    std::os::unix::fs::symlink(&secret, batches.join("0000000002.krb")).expect("link");
    std::os::unix::fs::symlink(outside.path(), dir.path().join("linked")).expect("dir link");
    let err = store
        .get_object("linked/secret.txt")
        .await
        .expect_err("a linked folder is not followed");
    assert!(matches!(err, StoreError::Link { .. }), "{err}");
    let key = store.batch_key(2);
    let err = store.get_batch(&key).await.expect_err("a linked batch");
    assert!(matches!(err, StoreError::CorruptBatch { .. }), "{err}");
    let moved = store
        .quarantine_batch(&key, "a link")
        .await
        .expect("quarantined by name")
        .expect("moved");
    assert_eq!(moved, "quarantine/batches/0000000002.krb");
    let there = dir.path().join(&moved);
    let meta = std::fs::symlink_metadata(&there).expect("moved link");
    assert!(
        meta.file_type().is_symlink(),
        "the link itself was moved, not its target's bytes"
    );
    assert!(!batches.join("0000000002.krb").exists());
    assert_eq!(
        std::fs::read(&secret).expect("target"),
        b"outside the run root"
    );
    // The real batch is untouched.
    assert!(store.get_batch(&store.batch_key(1)).await.is_ok());
}

#[tokio::test]
async fn st14_a_name_keel_never_writes_is_skipped_in_a_local_listing() {
    let (dir, store) = local();
    store.put_batch(&sample_batch(1)).await.expect("put");
    std::fs::write(dir.path().join("batches/evil\nname.krb"), b"x").expect("plant");
    let keys = store
        .list_batches()
        .await
        .expect("the listing survives the odd name");
    assert_eq!(keys, vec![store.batch_key(1)]);
    assert_eq!(
        store.list_objects("batches").await.expect("objects").len(),
        1
    );
    // On S3 the same name fails its listing page: the error names the fix, not credentials.
    let e = StoreError::from_object_store(
        "run/batches",
        object_store::Error::InvalidPath {
            source: object_store::path::Path::parse("a\nb").expect_err("bad"),
        },
    );
    let text = e.to_string();
    assert!(
        text.contains("remove that object") && !text.contains("credentials"),
        "{text}"
    );
}
