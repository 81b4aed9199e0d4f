//! A rollout batch round-trips through the store bit-exactly, on local disk and on a real S3
//! server (SeaweedFS); a flipped byte in a stored batch is reported as corrupt, never a panic.

use keel_integration::s3_root;
use keel_store::{RolloutBatch, RunStore, Source, StoreError, Trajectory, Turn};

fn sample_batch(seq: u64) -> RolloutBatch {
    let trajectories = (0..6u64)
        .map(|i| {
            let tokens: Vec<u32> = (0..40).map(|t| ((t * 31 + i * 7) % 1116) as u32).collect();
            let loss_mask: Vec<u8> = (0..40)
                .map(|t| u8::from((8..14).contains(&t) || (15..21).contains(&t)))
                .collect();
            let behaviour_logprobs = loss_mask
                .iter()
                .enumerate()
                .map(|(t, &m)| if m == 1 { -0.01 * t as f32 - 1e-7 } else { 0.0 })
                .collect();
            Trajectory {
                trajectory_id: seq * 1000 + i,
                episode_id: seq * 1000 + i,
                group_id: i / 2,
                task_id: 100 + i / 2,
                env_name: "calc".into(),
                agent_id: (i % 2) as u32,
                tokens,
                loss_mask,
                behaviour_logprobs,
                turns: vec![
                    Turn {
                        start: 8,
                        end: 14,
                        policy_version: 3,
                        weights_digest: 0,
                        reward: 0.0,
                        invalid_action: false,
                        agent_id: 0,
                        anchor_key: 5,
                        anchor_state: String::new(),
                        version_changes: Vec::new(),
                    },
                    Turn {
                        start: 15,
                        end: 21,
                        policy_version: 4,
                        weights_digest: 0,
                        reward: 1.0,
                        invalid_action: i == 3,
                        agent_id: 1,
                        anchor_key: 6 + i,
                        anchor_state: String::new(),
                        version_changes: Vec::new(),
                    },
                ],
                final_reward: if i % 2 == 0 { 1.0 } else { 0.0 },
                source: if i == 5 {
                    Source::Anchor
                } else {
                    Source::OnPolicy
                },
                scaffold_version: i % 3,
                trained_turn: if i == 4 { Some(1) } else { None },
            }
        })
        .collect();
    RolloutBatch {
        run_id: "it".into(),
        batch_seq: seq,
        generator_id: 1,
        policy_version: 4,
        created_unix_ms: 1_700_000_000_000,
        trajectories,
    }
}

async fn roundtrip(store: &RunStore) {
    let batch = sample_batch(7);
    let key = store.put_batch(&batch).await.expect("put");
    let buf = store.get_batch(&key).await.expect("get");
    // Zero-copy view of the archive.
    let a = buf.archived();
    assert_eq!(a.batch_seq.to_native(), 7);
    assert_eq!(a.trajectories.len(), 6);
    assert_eq!(
        a.trajectories[2].tokens[5].to_native(),
        batch.trajectories[2].tokens[5]
    );
    assert_eq!(
        a.trajectories[4].behaviour_logprobs[20]
            .to_native()
            .to_bits(),
        batch.trajectories[4].behaviour_logprobs[20].to_bits()
    );
    // Full deserialisation is bit-exact.
    assert_eq!(buf.to_owned().expect("deserialize"), batch);
    assert_eq!(store.list_batches().await.expect("list"), vec![key.clone()]);
    // Batches are immutable: a second put of the same sequence number is refused.
    assert!(matches!(
        store.put_batch(&batch).await,
        Err(StoreError::AlreadyExists { .. })
    ));
}

#[tokio::test]
async fn batch_roundtrips_bit_exactly_on_local_disk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = RunStore::open(dir.path().to_str().expect("utf8")).expect("open");
    roundtrip(&store).await;
}

#[tokio::test]
async fn batch_roundtrips_bit_exactly_on_s3() {
    let store = RunStore::open(&s3_root("roundtrip")).expect("open s3");
    roundtrip(&store).await;
}

#[tokio::test]
async fn flipped_byte_on_disk_is_reported_corrupt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = RunStore::open(dir.path().to_str().expect("utf8")).expect("open");
    let key = store.put_batch(&sample_batch(1)).await.expect("put");
    let path = dir.path().join("batches").join("0000000001.krb");
    let mut bytes = std::fs::read(&path).expect("batch file on disk");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&path, &bytes).expect("rewrite");
    let err = store
        .get_batch(&key)
        .await
        .expect_err("corruption must be detected");
    assert_checksum_mismatch(&err);
    assert!(
        err.to_string().contains("0000000001.krb"),
        "the error names the object: {err}"
    );
}

#[tokio::test]
async fn flipped_byte_on_s3_is_reported_corrupt() {
    let store = RunStore::open(&s3_root("corrupt")).expect("open s3");
    let key = store.put_batch(&sample_batch(2)).await.expect("put");
    let rel = "batches/0000000002.krb";
    let mut bytes = store.get_object(rel).await.expect("raw get").to_vec();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    store
        .put_object(rel, bytes.into())
        .await
        .expect("overwrite with a corrupt copy");
    let err = store
        .get_batch(&key)
        .await
        .expect_err("corruption must be detected");
    assert_checksum_mismatch(&err);
}

fn assert_checksum_mismatch(err: &StoreError) {
    match err {
        StoreError::CorruptBatch { source, .. } => {
            assert!(
                matches!(**source, StoreError::ChecksumMismatch { .. }),
                "{source:?}"
            )
        }
        other => panic!("expected CorruptBatch(ChecksumMismatch), got {other:?}"),
    }
}
