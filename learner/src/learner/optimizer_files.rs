//! The optimizers' state files in a learner checkpoint: the policy's (`optimizer`) and the
//! separate critic's (`critic_optimizer`), one path for both.
//!
//! Invariants:
//! - OF-1 (names): an optimizer of stem `S` is written as `S.safetensors` by one rank, and as
//!   `S.rank-R-of-N.safetensors` for every rank R of N ranks, all of them in rank 0's files
//!   (DDP-5: the other ranks' checkpoint files hold no optimizer state).
//! - OF-2 (any N): a rank restores its owned state from every file of its stem, whichever N wrote
//!   them, or from the one unsharded file (OP-7: resharding is picking by name); a checkpoint
//!   with neither is refused, naming both forms.

use tch::Tensor;

use crate::data_parallel::DataParallel;
use crate::error::LearnerError;
use crate::optimizer::AdamW;

/// The policy's optimizer.
pub(crate) const POLICY: &str = "optimizer";
/// The separate critic's optimizer.
pub(crate) const CRITIC: &str = "critic_optimizer";

/// `opt`'s state files under `stem` (OF-1): one, or with `ranks` one shard per rank gathered on
/// rank 0 (a collective then; the other ranks get none).
pub(crate) fn write(
    stem: &str,
    opt: &AdamW,
    ranks: Option<&mut DataParallel>,
) -> Result<Vec<(String, Vec<u8>)>, LearnerError> {
    let mine = opt.to_safetensors()?;
    let Some(dp) = ranks else {
        return Ok(vec![(format!("{stem}.safetensors"), mine)]);
    };
    let n = dp.ranks();
    Ok(dp
        .gather_to_root(&mine)?
        .into_iter()
        .enumerate()
        .map(|(r, bytes)| (format!("{stem}.rank-{r}-of-{n}.safetensors"), bytes))
        .collect())
}

/// `opt`'s owned state and step count from a checkpoint's `files` (OF-2), checked, nothing
/// changed. An unsharded optimizer reading one unsharded file checks it whole.
pub(crate) fn read(
    stem: &str,
    opt: &AdamW,
    sharded: bool,
    files: &[(String, Vec<u8>)],
) -> Result<(Vec<Tensor>, u64), LearnerError> {
    let whole = format!("{stem}.safetensors");
    if !sharded {
        if let Some((_, bytes)) = files.iter().find(|(n, _)| *n == whole) {
            return opt.decode_state(bytes);
        }
    }
    let parts: Vec<&[u8]> = files
        .iter()
        .filter(|(n, _)| *n == whole || is_shard(stem, n))
        .map(|(_, b)| b.as_slice())
        .collect();
    if parts.is_empty() {
        return Err(LearnerError::mismatch(
            &whole,
            format!("missing from the checkpoint, and so are {stem}.rank-R-of-N shards"),
        ));
    }
    opt.decode_shards(&parts)
}

/// Whether `name` is one rank's state file of the optimizer `stem` (OF-1).
pub(crate) fn is_shard(stem: &str, name: &str) -> bool {
    name.strip_prefix(stem)
        .and_then(|rest| rest.strip_prefix(".rank-"))
        .is_some_and(|rest| rest.ends_with(".safetensors"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn of1_shard_names_belong_to_one_stem() {
        assert!(is_shard(POLICY, "optimizer.rank-0-of-2.safetensors"));
        assert!(is_shard(CRITIC, "critic_optimizer.rank-1-of-3.safetensors"));
        assert!(!is_shard(
            POLICY,
            "critic_optimizer.rank-1-of-3.safetensors"
        ));
        assert!(!is_shard(CRITIC, "optimizer.rank-1-of-3.safetensors"));
        assert!(!is_shard(POLICY, "optimizer.safetensors"));
    }
}
