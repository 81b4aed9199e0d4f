//! Tests of `listing` (LI-1..4), on local disk and on the real S3 server.

use std::path::Path as FsPath;

use super::*;
use crate::batch::tests::sample_batch;
use crate::checkpoint::tests::new_ckpt;
use crate::test_backends::each_backend;

/// Stores `bytes` under the raw relative key `rel` (any name, a newline included), bypassing
/// keel's key checks: a file in a local root, or a signed PUT (curl) on S3.
fn plant(store: &RunStore, rel: &str, bytes: &[u8]) {
    if let Some(dir) = store.local_dir() {
        let path = dir.join(rel);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, bytes).expect("plant");
        return;
    }
    let endpoint = std::env::var("KEEL_TEST_S3_ENDPOINT").expect("the test S3 server");
    let root = store.root_url().strip_prefix("s3://").expect("an s3 root");
    let (bucket, prefix) = root.split_once('/').expect("bucket/prefix");
    let encoded: String = format!("{prefix}/{rel}")
        .split('/')
        .map(percent_encode)
        .collect::<Vec<_>>()
        .join("/");
    let body = tempfile::NamedTempFile::new().expect("body");
    std::fs::write(body.path(), bytes).expect("body");
    let user = format!(
        "{}:{}",
        std::env::var("AWS_ACCESS_KEY_ID").expect("key id"),
        std::env::var("AWS_SECRET_ACCESS_KEY").expect("secret")
    );
    let out = std::process::Command::new("curl")
        .args([
            "-s",
            "-f",
            "--aws-sigv4",
            "aws:amz:us-east-1:s3",
            "--user",
            &user,
            "-T",
        ])
        .arg(body.path())
        .arg(format!("{endpoint}/{bucket}/{encoded}"))
        .output()
        .expect("run curl");
    assert!(out.status.success(), "plant {rel:?}: {out:?}");
}

fn percent_encode(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Issue 32 item 7: a newline (or another name keel never writes) in any folder keel lists
/// blocked every resume ("invalid path … illegal character sequence").
#[tokio::test]
async fn li1_li2_names_keel_never_writes_are_skipped_in_every_listing() {
    each_backend("li1", |store| async move {
        store.put_batch(&sample_batch(1)).await.expect("put");
        store.put_batch(&sample_batch(2)).await.expect("put");
        let first = store
            .commit_checkpoint(new_ckpt(2, None))
            .await
            .expect("commit");
        for odd in [
            "batches/0000000003\nname.krb",
            "batches/odd\nfolder/0000000004.krb",
            "checkpoints/bad\nid/MANIFEST.json",
            "branches/main/HEAD.0000000009\n",
            "branches/bad\nbranch/HEAD.0000000001",
            "lives/0000000001\n.json",
            "quarantine/a\rb",
        ] {
            plant(&store, odd, b"planted by hand");
        }
        assert_eq!(
            store.list_batches().await.expect("batches"),
            vec![store.batch_key(1), store.batch_key(2)]
        );
        assert_eq!(
            store.list_objects("batches").await.expect("objects").len(),
            2
        );
        let resume = store
            .resume_point()
            .await
            .expect("resume")
            .expect("a point");
        assert_eq!(resume.manifest.id, first.id);
        let ids: Vec<String> = store
            .list_checkpoints()
            .await
            .expect("checkpoints")
            .into_iter()
            .map(|m| m.id)
            .collect();
        assert_eq!(ids, vec![first.id.clone()]);
        assert_eq!(store.branch_names().await.expect("branches"), vec!["main"]);
        assert_eq!(store.list_branches().await.expect("heads").len(), 1);
        assert!(store.lives().await.expect("lives").is_empty());
        assert!(store.list_quarantine().await.expect("q").is_empty());
        store.survey().await.expect("survey");
    })
    .await;
}

/// LI-2: on S3 a page holding an odd name is bisected; with small pages and odd names at page
/// edges, every good key is listed exactly once, folders too.
#[tokio::test]
async fn li2_s3_pages_around_odd_names_lose_and_repeat_nothing() {
    let store = RunStore::open(&crate::test_backends::s3_root("li2")).expect("open");
    let mut good = Vec::new();
    for i in 0..9 {
        let rel = format!("t/k{i:02}");
        store.put_object(&rel, "x".into()).await.expect("put");
        good.push(store.full_key(&rel));
        if i % 3 == 1 {
            plant(&store, &format!("t/k{i:02}\nodd"), b"odd");
        }
    }
    for f in ["a", "b", "c"] {
        store
            .put_object(&format!("t/{f}/inner"), "x".into())
            .await
            .expect("put");
    }
    plant(&store, "t/b\nodd/inner", b"odd");
    plant(&store, "t/c/odd\n", b"odd");
    let dir = store.full_key("t");
    for page_keys in [1, 2, 3, 1000] {
        let tree = list_s3(&store, &dir, None, false, page_keys)
            .await
            .expect("tree");
        let mut keys: Vec<String> = tree
            .objects
            .iter()
            .map(|m| m.location.to_string())
            .collect();
        keys.sort();
        let mut want = good.clone();
        want.extend(["a", "b", "c"].map(|f| store.full_key(&format!("t/{f}/inner"))));
        want.sort();
        assert_eq!(keys, want, "page of {page_keys}");
        let level = list_s3(&store, &dir, None, true, page_keys)
            .await
            .expect("level");
        let mut folders = level.folders.clone();
        folders.sort();
        assert_eq!(
            folders,
            ["a", "b", "c"].map(|f| store.full_key(&format!("t/{f}"))),
            "page of {page_keys}"
        );
        assert_eq!(level.objects.len(), good.len(), "page of {page_keys}");
    }
}

#[test]
fn li2_skip_past_an_odd_folder_skips_all_of_it() {
    assert_eq!(skip_past("r/batches/a\nb.krb"), "r/batches/a\nb.krb");
    assert_eq!(skip_past("r/a\nb/"), format!("r/a\nb/{}", char::MAX));
    assert_eq!(skip_past("r/a\nb/c/d"), format!("r/a\nb/{}", char::MAX));
    assert_eq!(skip_past("r//x"), format!("r//{}", char::MAX));
}

/// Issue 32 item 8: a planted link is listed by name only; linked folders are never walked, and
/// special files are left out, so nothing outside the root is listed or read.
#[tokio::test]
async fn li3_li4_a_local_listing_never_follows_links() {
    let dir = tempfile::tempdir().expect("root");
    let store = RunStore::open(dir.path().to_str().expect("utf-8")).expect("open");
    let outside = tempfile::tempdir().expect("outside");
    std::fs::create_dir_all(outside.path().join("sub")).expect("mkdir");
    std::fs::write(outside.path().join("sub/0000000007.krb"), b"secret").expect("secret");
    std::fs::create_dir_all(outside.path().join("ckpt")).expect("mkdir");
    std::fs::write(outside.path().join("ckpt/MANIFEST.json"), b"{}").expect("secret");
    store.put_batch(&sample_batch(1)).await.expect("put");
    let link = |target: &FsPath, at: &str| {
        let at = dir.path().join(at);
        std::fs::create_dir_all(at.parent().expect("parent")).expect("mkdir");
        std::os::unix::fs::symlink(target, at).expect("link");
    };
    link(&outside.path().join("sub"), "batches/linked");
    link(outside.path(), "checkpoints/0000000099-linked");
    link(outside.path(), "lives");
    link(outside.path(), "branches/evil");
    let fifo = dir.path().join("batches/0000000005.krb");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(made.success());
    // The linked folder is one object named by the link (LI-3); its content is never listed.
    assert_eq!(
        store.list_objects("batches").await.expect("objects"),
        vec![
            "batches/0000000001.krb".to_string(),
            "batches/linked".to_string()
        ]
    );
    assert_eq!(
        store.list_batches().await.expect("batches"),
        vec![store.batch_key(1)]
    );
    assert!(store
        .list_checkpoints()
        .await
        .expect("checkpoints")
        .is_empty());
    assert!(store.lives().await.expect("lives").is_empty());
    assert!(store.branch_names().await.expect("branches").is_empty());
    assert!(store.list_objects("lives").await.expect("lives").is_empty());
    // A staging file of an interrupted write is never listed (LI-4).
    std::fs::write(dir.path().join("batches/0000000003.krb#1"), b"half").expect("stage");
    assert_eq!(store.list_batches().await.expect("batches").len(), 1);
    // A missing folder is empty.
    assert!(store
        .list_objects("nothing/here")
        .await
        .expect("empty")
        .is_empty());
    // ST-13: nothing is written through a linked folder either.
    let err = store
        .put_object("lives/planted.json", "x".into())
        .await
        .expect_err("a write under a linked folder");
    assert!(matches!(err, StoreError::Link { .. }), "{err}");
    assert!(!outside.path().join("planted.json").exists());
}
