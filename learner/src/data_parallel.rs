//! Data-parallel learner ranks over a [`RankGroup`]: which rows of a mini-batch a rank trains,
//! the gradient all-reduce in buckets, and the sharded optimizer's owners and weight broadcast
//! (ZeRO-1: every rank holds the weights and the whole gradient, each steps only its share).
//!
//! Invariants:
//! - DDP-1 (the same update): the ranks split each mini-batch's rows ([`row_shares`], balanced
//!   by loss tokens), compute their losses under the whole mini-batch's denominators and sum
//!   their gradients, so the update is the one-rank update up to float reassociation.
//! - DDP-2 (owners): parameter `i`'s owner is fixed by a greedy balance of parameter sizes in
//!   state order ([`owners`]); only the owner keeps its optimizer state and steps it (OP-7);
//!   after every step each parameter is broadcast from its owner, so all ranks hold the same
//!   weights.
//! - DDP-3 (fail together): a rank whose micro-batch failed (a non-finite loss) still takes part
//!   in the reduce with its failure flagged; then every rank drops the gradients and returns an
//!   error, so no rank waits for another in a later collective.
//! - DDP-4 (defined gradients): a parameter with a gradient on some rank gets one on every rank
//!   before the sum; one with a gradient on none stays without, and is skipped as with one rank
//!   (OP-3).
//! - DDP-5 (shards meet on rank 0 only): at a checkpoint every rank's optimizer shard goes to
//!   rank 0, which writes them all; another rank holds its own shard and at most one other at a
//!   time, so no rank but 0 ever holds the whole optimizer state.
//! - DDP-6 (reduce dtype): gradients are summed in [`ReduceDtype`] (f32 by default; bf16 halves
//!   the bytes); the optimizer's master weights and moments stay f32 either way, and every rank
//!   ends the reduce with the same (rounded) sum, so the ranks' weights stay equal.
//! - DDP-7 (one report): a step's statistics are every rank's parts folded as one rank folds
//!   its micro-batches (token-weighted means, summed losses, extremes), so `loss`, `entropy`,
//!   `clip_frac`... with N ranks are the one-rank values, not rank 0's share.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tch::{Kind, Tensor};

use crate::collective::{CollectiveError, RankGroup};
use crate::error::LearnerError;
use crate::optimizer::AdamW;

/// Gradients are summed in buckets of at most this many elements (f32: 64 MiB).
const BUCKET_ELEMENTS: i64 = 16 << 20;

/// The element type gradients travel in (`learner.reduce_dtype`, DDP-6).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReduceDtype {
    /// f32: the sum is the one-rank gradient up to reassociation (DDP-1).
    #[default]
    F32,
    /// bf16: half the bytes on the wire; each rank's gradient is rounded to bf16 before the
    /// sum and the sum is rounded again, then widened back.
    Bf16,
}

impl ReduceDtype {
    fn kind(self) -> Kind {
        match self {
            ReduceDtype::F32 => Kind::Float,
            ReduceDtype::Bf16 => Kind::BFloat16,
        }
    }
}

/// Each rank's rows of `rows` (DDP-1): greedy by decreasing `tokens[i]` (the row's loss
/// tokens) onto the least-loaded rank, then back in mini-batch order. A rank gets no row when
/// there are fewer rows than ranks.
pub fn row_shares(rows: &[i64], tokens: &[i64], ranks: usize) -> Vec<Vec<i64>> {
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(tokens[i]));
    let mut load = vec![(0i64, 0usize); ranks];
    let mut picked = vec![Vec::new(); ranks];
    for i in order {
        let r = (0..ranks).min_by_key(|&r| (load[r], r)).unwrap_or(0);
        load[r].0 += tokens[i];
        load[r].1 += 1;
        picked[r].push(i);
    }
    picked
        .into_iter()
        .map(|mut idx| {
            idx.sort_unstable();
            idx.into_iter().map(|i| rows[i]).collect()
        })
        .collect()
}

/// The owner rank of each parameter (DDP-2): greedy onto the rank with the fewest elements so
/// far, in state order.
pub fn owners(sizes: &[i64], ranks: usize) -> Vec<usize> {
    let mut load = vec![0i64; ranks];
    sizes
        .iter()
        .map(|&n| {
            let r = (0..ranks).min_by_key(|&r| (load[r], r)).unwrap_or(0);
            load[r] += n;
            r
        })
        .collect()
}

/// A rank group shared by the learners of one process (Dr. MAS agent models) and the
/// process's command stream: collectives run in the same order on every rank, one at a time.
pub type SharedGroup = Arc<Mutex<RankGroup>>;

/// One learner rank's part in a data-parallel group.
pub struct DataParallel {
    group: SharedGroup,
    rank: usize,
    ranks: usize,
    /// Seconds spent in the gradient reduce and the weight broadcast, packing included.
    collective_seconds: f64,
    /// The element type of the gradient buckets (DDP-6).
    reduce: ReduceDtype,
    /// Bytes of gradient buckets this rank has all-reduced.
    reduced_bytes: u64,
}

impl DataParallel {
    /// This process's part in `group`; gradients will travel as `reduce`. Every optimizer the
    /// ranks train is then [`Self::shard`]ed.
    pub fn new(group: SharedGroup, reduce: ReduceDtype) -> Result<Self, LearnerError> {
        let (rank, ranks) = {
            let g = lock(&group)?;
            (g.rank(), g.world())
        };
        Ok(DataParallel {
            group,
            rank,
            ranks,
            collective_seconds: 0.0,
            reduce,
            reduced_bytes: 0,
        })
    }

    /// Assigns `opt`'s parameters to owners (DDP-2) and frees the state this rank does not own
    /// (OP-7). The owners depend on the parameter sizes and the number of ranks only, so every
    /// rank computes the same map.
    pub fn shard(&self, opt: &mut AdamW) {
        let sizes: Vec<i64> = opt.parameters().map(|(_, p, _)| p.numel() as i64).collect();
        opt.shard(&owners(&sizes, self.ranks), (self.rank, self.ranks));
    }

    /// Bytes of gradient buckets this rank has all-reduced so far (DDP-6).
    pub fn reduced_bytes(&self) -> u64 {
        self.reduced_bytes
    }

    /// Seconds this rank spent so far in [`Self::reduce_grads`] and
    /// [`Self::broadcast_weights`] (waiting for the slowest rank included).
    pub fn collective_seconds(&self) -> f64 {
        self.collective_seconds
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    fn group(&self) -> Result<MutexGuard<'_, RankGroup>, LearnerError> {
        lock(&self.group)
    }

    /// Sums the gradients over the ranks (DDP-1, DDP-4) and says whether any rank failed its
    /// micro-batches (DDP-3); on `true` the caller drops the gradients.
    pub fn reduce_grads(&mut self, opt: &AdamW, failed_here: bool) -> Result<bool, LearnerError> {
        let start = Instant::now();
        let result = self.reduce_grads_untimed(opt, failed_here);
        self.collective_seconds += start.elapsed().as_secs_f64();
        result
    }

    fn reduce_grads_untimed(
        &mut self,
        opt: &AdamW,
        failed_here: bool,
    ) -> Result<bool, LearnerError> {
        let params: Vec<Tensor> = opt
            .parameters()
            .map(|(_, p, _)| p.shallow_clone())
            .collect();
        let mut flags: Vec<f32> = params
            .iter()
            .map(|p| p.grad().defined() as u8 as f32)
            .collect();
        flags.push(failed_here as u8 as f32);
        let mut flags_t = Tensor::f_from_slice(&flags)?;
        self.group()?.all_reduce_sum(&mut flags_t)?;
        let flags = Vec::<f32>::try_from(&flags_t)?;
        if flags[params.len()] > 0.0 {
            return Ok(true);
        }
        let missing: Vec<&Tensor> = params
            .iter()
            .zip(&flags)
            .filter(|(p, &f)| f > 0.0 && !p.grad().defined())
            .map(|(p, _)| p)
            .collect();
        if !missing.is_empty() {
            // DDP-4: a zero contribution defines the gradient without changing it.
            let zero = missing
                .iter()
                .map(|p| p.f_sum(Kind::Float).and_then(|s| s.f_mul_scalar(0.0)))
                .collect::<Result<Vec<_>, _>>()?;
            Tensor::f_stack(&zero, 0)?
                .f_sum(Kind::Float)?
                .f_backward()?;
        }
        let grads: Vec<Tensor> = params
            .iter()
            .map(|p| p.grad())
            .filter(|g| g.defined())
            .collect();
        for bucket in buckets(&grads) {
            self.all_reduce_bucket(bucket)?;
        }
        Ok(false)
    }

    fn all_reduce_bucket(&mut self, grads: &[Tensor]) -> Result<(), LearnerError> {
        let flat: Vec<Tensor> = grads
            .iter()
            .map(|g| {
                g.f_to_kind(self.reduce.kind())
                    .and_then(|g| g.f_flatten(0, -1))
            })
            .collect::<Result<_, _>>()?;
        let mut sum = Tensor::f_cat(&flat, 0)?;
        self.group()?.all_reduce_sum(&mut sum)?;
        self.reduced_bytes += (sum.numel() * sum.kind().elt_size_in_bytes()) as u64;
        scatter_back(&sum, grads)
    }

    /// Broadcasts every parameter of the sharded `opt` from its owner after a step (DDP-2), one
    /// flat buffer per owner.
    pub fn broadcast_weights(&mut self, opt: &AdamW) -> Result<(), LearnerError> {
        let start = Instant::now();
        let result = self.broadcast_weights_untimed(opt);
        self.collective_seconds += start.elapsed().as_secs_f64();
        result
    }

    fn broadcast_weights_untimed(&mut self, opt: &AdamW) -> Result<(), LearnerError> {
        let mut group = self.group()?;
        for owner in 0..self.ranks {
            let mine: Vec<Tensor> = opt
                .parameters()
                .filter(|&(_, _, o)| o == owner)
                .map(|(_, p, _)| p.shallow_clone())
                .collect();
            if mine.is_empty() {
                continue;
            }
            let flat: Vec<Tensor> = mine
                .iter()
                .map(|p| p.f_detach()?.f_to_kind(Kind::Float)?.f_flatten(0, -1))
                .collect::<Result<_, _>>()?;
            let mut buffer = Tensor::f_cat(&flat, 0)?;
            group.broadcast(&mut buffer, owner)?;
            if owner != self.rank {
                tch::no_grad(|| scatter_back(&buffer, &mine))?;
            }
        }
        Ok(())
    }

    /// Every rank's `values` (the same length on every rank), in rank order.
    pub fn all_gather_values(&mut self, values: &[f64]) -> Result<Vec<Vec<f64>>, LearnerError> {
        let all = self.group()?.all_gather(&Tensor::f_from_slice(values)?)?;
        all.iter()
            .map(|t| Vec::<f64>::try_from(t).map_err(LearnerError::from))
            .collect()
    }

    /// The largest of every rank's `value` (each rank's peak memory).
    pub fn max_over_ranks(&mut self, value: f64) -> Result<f64, LearnerError> {
        let all = self.all_gather_values(&[value])?;
        Ok(all.iter().map(|v| v[0]).fold(0.0, f64::max))
    }

    /// Every rank's `bytes` in rank order on rank 0, nothing on the others (the optimizer's
    /// shards at a checkpoint, DDP-5). One broadcast per rank, so a rank other than 0 holds at
    /// most one other shard at a time, never the whole optimizer state.
    pub fn gather_to_root(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, LearnerError> {
        let mut group = self.group()?;
        let len = Tensor::from_slice(&[bytes.len() as i64]);
        let lens: Vec<i64> = group
            .all_gather(&len)?
            .iter()
            .map(|t| t.int64_value(&[0]))
            .collect();
        let mut shards = Vec::new();
        for (root, n) in lens.into_iter().enumerate() {
            let mut buffer = if root == self.rank {
                Tensor::from_slice(bytes)
            } else {
                Tensor::f_zeros([n], (Kind::Uint8, tch::Device::Cpu))?
            };
            group.broadcast(&mut buffer, root)?;
            if self.rank == 0 {
                let mut v = vec![0u8; n as usize];
                buffer.copy_data(&mut v, n as usize);
                shards.push(v);
            }
        }
        Ok(shards)
    }
}

/// The group, unless a thread panicked while holding it (then its collectives are out of step).
fn lock(group: &SharedGroup) -> Result<MutexGuard<'_, RankGroup>, LearnerError> {
    group.lock().map_err(|_| {
        LearnerError::Collective(CollectiveError::Invalid(
            "the rank group was poisoned by a panic during a collective".into(),
        ))
    })
}

/// Consecutive runs of `grads` of at most [`BUCKET_ELEMENTS`] elements (a larger tensor is a
/// bucket of its own).
fn buckets(grads: &[Tensor]) -> Vec<&[Tensor]> {
    let mut out = Vec::new();
    let (mut start, mut size) = (0, 0i64);
    for (i, g) in grads.iter().enumerate() {
        let n = g.numel() as i64;
        if i > start && size + n > BUCKET_ELEMENTS {
            out.push(&grads[start..i]);
            (start, size) = (i, 0);
        }
        size += n;
    }
    if start < grads.len() {
        out.push(&grads[start..]);
    }
    out
}

/// Copies consecutive slices of the flat `buffer` into `targets`, in place.
fn scatter_back(buffer: &Tensor, targets: &[Tensor]) -> Result<(), LearnerError> {
    let mut offset = 0i64;
    for t in targets {
        let n = t.numel() as i64;
        let part = buffer.f_narrow(0, offset, n)?.f_view(t.size().as_slice())?;
        t.shallow_clone().f_copy_(&part)?;
        offset += n;
    }
    Ok(())
}

#[cfg(test)]
#[path = "data_parallel_tests.rs"]
mod tests;
