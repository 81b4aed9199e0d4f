//! The on-store byte format of a rollout batch (`.krb`).
//!
//! ```text
//! offset  size  field
//! 0       8     magic  b"KEELRB\0\0"
//! 8       4     format version, u32 little-endian (= 6; 2 added per-turn agent id and
//!                     anchor key, the scaffold version and RTPO's trained turn; 3 the
//!                     anchor-state text; 4 each trajectory's episode id, for segments; 5 each
//!                     turn's weights digest; 6 the version changes inside a turn)
//! 12      8     payload length in bytes, u64 little-endian
//! 20      4     crc32 (IEEE, crc32fast) of the payload, u32 little-endian
//! 24      n     payload = zstd(rkyv 0.8 archive of a RolloutBatch)
//! ```
//!
//! Invariants:
//! - FR-1: [`decode_batch`] never panics, whatever the bytes; every failure is a typed
//!   [`StoreError`] (`BadMagic`, `UnsupportedVersion`, `Truncated`, `TrailingBytes`,
//!   `ChecksumMismatch`, `Decompress`, `InvalidArchive`).
//! - FR-2: a frame is accepted only if its length is exactly `24 + payload length` and the crc32
//!   of the payload matches the header; the checksum is verified before decompressing.
//! - FR-3: decompression is bounded by [`MAX_ARCHIVE_BYTES`] (1 GiB), so hostile input cannot
//!   exhaust memory.
//! - FR-4: a decoded batch has passed bytecheck validation (see RB-3 in `batch`).
//! - FR-5: [`encode_batch`] only encodes batches that pass `RolloutBatch::validate`, and
//!   `decode_batch(encode_batch(b))` deserializes to a value equal to `b`, bit for bit.

use std::io::Read;

use rkyv::rancor;
use rkyv::util::AlignedVec;

use crate::batch::{BatchBuf, RolloutBatch};
use crate::error::StoreError;

/// The first 8 bytes of every rollout-batch object.
pub const BATCH_MAGIC: [u8; 8] = *b"KEELRB\0\0";
/// The frame format version this build writes and reads.
pub const BATCH_FORMAT_VERSION: u32 = 6;
/// Header size in bytes: magic, version, payload length, crc32.
pub const HEADER_LEN: usize = 8 + 4 + 8 + 4;
/// Upper bound on the decompressed archive size (FR-3).
pub const MAX_ARCHIVE_BYTES: u64 = 1 << 30;

/// Validates `batch`, archives it with rkyv, compresses it with zstd at `zstd_level` and frames it.
pub fn encode_batch(batch: &RolloutBatch, zstd_level: i32) -> Result<Vec<u8>, StoreError> {
    frame_archive(&archive_batch(batch)?, zstd_level)
}

/// Validates `batch` and archives it with rkyv (the payload before compression).
pub fn archive_batch(batch: &RolloutBatch) -> Result<AlignedVec, StoreError> {
    batch.validate()?;
    rkyv::to_bytes::<rancor::Error>(batch)
        .map_err(|e| StoreError::Encode(format!("rkyv serialization failed: {e}")))
}

/// Compresses archive bytes with zstd at `zstd_level` and frames them (header with the crc32).
/// The bytes are not checked: [`decode_batch`] validates whatever a frame holds (FR-1).
pub fn frame_archive(archive: &[u8], zstd_level: i32) -> Result<Vec<u8>, StoreError> {
    if archive.len() as u64 > MAX_ARCHIVE_BYTES {
        return Err(StoreError::Encode(format!(
            "archive is {} bytes, more than the {MAX_ARCHIVE_BYTES}-byte limit; split the batch",
            archive.len()
        )));
    }
    let payload = zstd::bulk::compress(archive, zstd_level)
        .map_err(|e| StoreError::Encode(format!("zstd level {zstd_level} failed: {e}")))?;
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&BATCH_MAGIC);
    out.extend_from_slice(&BATCH_FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
    Ok(out)
}

/// Checks the frame (FR-2), decompresses (FR-3) and validates (FR-4) a rollout-batch object.
pub fn decode_batch(bytes: &[u8]) -> Result<BatchBuf, StoreError> {
    let found = bytes.len() as u64;
    let magic_len = bytes.len().min(BATCH_MAGIC.len());
    if bytes[..magic_len] != BATCH_MAGIC[..magic_len] {
        return Err(StoreError::BadMagic);
    }
    let Some(header) = bytes.get(..HEADER_LEN) else {
        return Err(StoreError::Truncated {
            expected: HEADER_LEN as u64,
            found,
        });
    };
    let version = u32::from_le_bytes(field(header, 8));
    if version != BATCH_FORMAT_VERSION {
        return Err(StoreError::UnsupportedVersion { found: version });
    }
    let payload_len = u64::from_le_bytes(field(header, 12));
    let expected_crc = u32::from_le_bytes(field(header, 20));
    let expected = payload_len.saturating_add(HEADER_LEN as u64);
    if found < expected {
        return Err(StoreError::Truncated { expected, found });
    }
    if found > expected {
        return Err(StoreError::TrailingBytes { expected, found });
    }
    let payload = &bytes[HEADER_LEN..];
    let actual_crc = crc32fast::hash(payload);
    if actual_crc != expected_crc {
        return Err(StoreError::ChecksumMismatch {
            expected: expected_crc,
            found: actual_crc,
        });
    }
    BatchBuf::from_archive_bytes(decompress(payload, MAX_ARCHIVE_BYTES)?)
}

/// Copies `N` header bytes starting at `at`; `header` is always `HEADER_LEN` long.
fn field<const N: usize>(header: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&header[at..at + N]);
    out
}

/// Decompresses `payload` into aligned memory, failing once more than `limit` bytes come out.
fn decompress(payload: &[u8], limit: u64) -> Result<AlignedVec, StoreError> {
    let decoder = zstd::stream::read::Decoder::with_buffer(payload)
        .map_err(|e| StoreError::Decompress(e.to_string()))?;
    let mut out = AlignedVec::<16>::new();
    let mut limited = decoder.take(limit + 1);
    std::io::copy(&mut limited, &mut out).map_err(|e| StoreError::Decompress(e.to_string()))?;
    if out.len() as u64 > limit {
        return Err(StoreError::Decompress(format!(
            "payload decompresses to more than the {limit}-byte limit"
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::tests::sample_batch;
    use crate::batch::{ArchivedSource, Source};

    fn frame() -> Vec<u8> {
        encode_batch(&sample_batch(12), 3).expect("encode")
    }

    #[test]
    fn fr5_round_trip_is_bit_exact() {
        let batch = sample_batch(12);
        let buf = decode_batch(&encode_batch(&batch, 3).expect("encode")).expect("decode");
        let back = buf.to_owned().expect("deserialize");
        assert_eq!(back, batch);
        for (a, b) in back.trajectories.iter().zip(&batch.trajectories) {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a.behaviour_logprobs), bits(&b.behaviour_logprobs));
        }
        assert!(buf.archive_len() > 0);

        let a = buf.archived();
        assert_eq!(*a, batch);
        assert_eq!(a.run_id.as_str(), "run-α");
        assert_eq!(a.batch_seq.to_native(), 12);
        assert_eq!(a.generator_id.to_native(), 3);
        assert_eq!(a.policy_version.to_native(), 5);
        assert_eq!(a.created_unix_ms.to_native(), 1_700_000_000_123);
        let t = &a.trajectories[1];
        assert_eq!(t.trajectory_id.to_native(), 2);
        assert_eq!(t.env_name.as_str(), "gridworld");
        assert_eq!(
            t.tokens.iter().map(|x| x.to_native()).collect::<Vec<_>>(),
            batch.trajectories[1].tokens
        );
        assert_eq!(
            t.loss_mask.as_slice(),
            batch.trajectories[1].loss_mask.as_slice()
        );
        assert_eq!(t.behaviour_logprobs[3].to_native(), -0.125 * 5.0);
        assert_eq!(t.turns[1].end.to_native(), 10);
        assert!(t.turns[1].invalid_action);
        assert_eq!(t.final_reward.to_native(), 3.0);
        assert!(matches!(t.source, ArchivedSource::Anchor));
        assert_eq!(t.min_policy_version(), Some(4));
        assert_eq!(batch.trajectories[0].source, Source::OnPolicy);
    }

    #[test]
    fn fr5_invalid_batches_are_not_encoded() {
        let mut b = sample_batch(1);
        b.trajectories[0].tokens.push(5);
        assert!(matches!(
            encode_batch(&b, 3),
            Err(StoreError::InvalidBatch { .. })
        ));
    }

    #[test]
    fn fr2_flipped_payload_byte_is_a_checksum_mismatch() {
        let mut f = frame();
        let i = HEADER_LEN + (f.len() - HEADER_LEN) / 2;
        f[i] ^= 0x40;
        assert!(matches!(
            decode_batch(&f),
            Err(StoreError::ChecksumMismatch { .. })
        ));
    }

    #[test]
    fn fr2_truncation_and_trailing_bytes() {
        let f = frame();
        let n = f.len() as u64;
        match decode_batch(&f[..f.len() - 1]) {
            Err(StoreError::Truncated { expected, found }) => {
                assert_eq!((expected, found), (n, n - 1));
            }
            other => panic!("expected Truncated, got {other:?}"),
        }
        match decode_batch(&f[..10]) {
            Err(StoreError::Truncated { expected, found }) => {
                assert_eq!((expected, found), (24, 10))
            }
            other => panic!("expected Truncated, got {other:?}"),
        }
        assert!(matches!(
            decode_batch(&f[..3]),
            Err(StoreError::Truncated { .. })
        ));
        let mut long = f.clone();
        long.push(0);
        assert!(matches!(
            decode_batch(&long),
            Err(StoreError::TrailingBytes { .. })
        ));
    }

    #[test]
    fn fr1_bad_magic_and_version() {
        let mut f = frame();
        f[0] = b'X';
        assert!(matches!(decode_batch(&f), Err(StoreError::BadMagic)));
        assert!(matches!(
            decode_batch(b"PK\x03\x04"),
            Err(StoreError::BadMagic)
        ));
        let mut f = frame();
        f[8..12].copy_from_slice(&1u32.to_le_bytes());
        assert!(matches!(
            decode_batch(&f),
            Err(StoreError::UnsupportedVersion { found: 1 })
        ));
    }

    /// Re-frames `payload` with a correct header so that the checks after the crc are reached.
    fn reframe(payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&BATCH_MAGIC);
        out.extend_from_slice(&BATCH_FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn fr1_fr4_checksummed_garbage_is_rejected() {
        assert!(matches!(
            decode_batch(&reframe(b"not zstd")),
            Err(StoreError::Decompress(_))
        ));
        let junk = zstd::bulk::compress(&[0xa5u8; 256], 1).expect("compress");
        assert!(matches!(
            decode_batch(&reframe(&junk)),
            Err(StoreError::InvalidArchive(_))
        ));
    }

    #[test]
    fn fr3_decompression_is_bounded() {
        let bomb = zstd::bulk::compress(&vec![0u8; 1 << 20], 1).expect("compress");
        assert!(bomb.len() < 1024, "a zip bomb: {} bytes", bomb.len());
        assert_eq!(
            decompress(&bomb, 1 << 20).expect("at the limit").len(),
            1 << 20
        );
        match decompress(&bomb, (1 << 20) - 1) {
            Err(StoreError::Decompress(msg)) => assert!(msg.contains("limit"), "{msg}"),
            other => panic!("expected Decompress, got {other:?}"),
        }
    }

    /// xorshift64*: deterministic, dependency-free randomness for the fuzz-style test.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    #[test]
    fn fr1_random_flips_and_truncations_never_panic() {
        let f = frame();
        let payload = &f[HEADER_LEN..];
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..2000 {
            // Raw corruption: caught by the frame checks.
            let mut g = f.clone();
            for _ in 0..1 + rng.below(4) {
                let i = rng.below(g.len());
                g[i] ^= 1 << rng.below(8);
            }
            g.truncate(rng.below(g.len() + 1));
            let _ = decode_batch(&g);

            // Corruption behind a valid checksum: reaches zstd and bytecheck.
            let mut p = payload.to_vec();
            let i = rng.below(p.len());
            p[i] ^= 1 << rng.below(8);
            let _ = decode_batch(&reframe(&p));
        }
    }

    #[test]
    fn fr1_corrupt_archives_behind_valid_compression_never_panic() {
        let archive = rkyv::to_bytes::<rancor::Error>(&sample_batch(3)).expect("archive");
        let mut rng = Rng(12345);
        for _ in 0..2000 {
            let mut a = archive.to_vec();
            for _ in 0..1 + rng.below(3) {
                let i = rng.below(a.len());
                a[i] = rng.next() as u8;
            }
            let payload = zstd::bulk::compress(&a, 1).expect("compress");
            if let Ok(buf) = decode_batch(&reframe(&payload)) {
                // Whatever passed bytecheck must be readable without panicking.
                let _ = format!("{buf:?}");
                let _ = buf.to_owned();
            }
        }
    }
}
