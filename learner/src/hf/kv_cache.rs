//! A preallocated key/value cache: one `[slots · max_len, Hkv, D]` buffer per layer for keys
//! and one for values, written in place.
//!
//! Invariants:
//! - KV-1: the buffers are allocated once, at construction; writes are `index_copy_` into them
//!   and reads are views (`narrow`/`transpose`), so decoding allocates no per-step cache memory.
//! - KV-2: slot `s`, position `p` lives at flat row `s · max_len + p`; a write never touches
//!   another slot's rows.
//! - KV-3: a slot's content is meaningful only below the length its owner tracks; stale rows
//!   from an earlier occupant are overwritten by the next prefill before they can be attended.

use tch::{Device, Kind, Tensor};

use super::config::HfConfig;
use super::error::HfError;

/// Keys and values of `slots` sequences of up to `max_len` tokens, for every layer.
pub struct KvCache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    slots: i64,
    max_len: i64,
    hkv: i64,
    d: i64,
}

impl KvCache {
    /// Allocates the cache (KV-1); its size is `2 · layers · slots · max_len · Hkv · D` elements.
    pub fn new(
        cfg: &HfConfig,
        slots: usize,
        max_len: usize,
        device: Device,
        kind: Kind,
    ) -> Result<Self, HfError> {
        let (hkv, d) = (cfg.num_key_value_heads as i64, cfg.head_dim as i64);
        let (slots, max_len) = (slots as i64, max_len as i64);
        let mut k = Vec::with_capacity(cfg.num_hidden_layers);
        let mut v = Vec::with_capacity(cfg.num_hidden_layers);
        for _ in 0..cfg.num_hidden_layers {
            k.push(Tensor::f_zeros([slots * max_len, hkv, d], (kind, device))?);
            v.push(Tensor::f_zeros([slots * max_len, hkv, d], (kind, device))?);
        }
        Ok(KvCache {
            k,
            v,
            slots,
            max_len,
            hkv,
            d,
        })
    }

    /// Number of slots.
    pub fn slots(&self) -> i64 {
        self.slots
    }

    /// Longest sequence a slot holds.
    pub fn max_len(&self) -> i64 {
        self.max_len
    }

    /// Writes `k`, `v` `[n, Hkv, T, D]` at flat rows `rows` `[n · T]` (KV-2), row-major over
    /// `(n, T)`.
    pub(crate) fn write(
        &mut self,
        layer: usize,
        rows: &Tensor,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<(), HfError> {
        let flat = |x: &Tensor| -> Result<Tensor, HfError> {
            Ok(x.f_transpose(1, 2)?.f_reshape([-1, self.hkv, self.d])?)
        };
        let (kf, vf) = (flat(k)?, flat(v)?);
        let _ = self.k[layer].f_index_copy_(0, rows, &kf)?;
        let _ = self.v[layer].f_index_copy_(0, rows, &vf)?;
        Ok(())
    }

    /// Copies of slots `ids` `[n]` (i64), positions `0..len`: `[n, Hkv, len, D]` keys and
    /// values (only those positions are copied).
    pub(crate) fn gather(
        &self,
        layer: usize,
        ids: &Tensor,
        len: i64,
    ) -> Result<(Tensor, Tensor), HfError> {
        let pick = |x: &Tensor| -> Result<Tensor, HfError> {
            Ok(x.f_view([self.slots, self.max_len, self.hkv, self.d])?
                .f_narrow(1, 0, len)?
                .f_index_select(0, ids)?
                .f_transpose(1, 2)?)
        };
        Ok((pick(&self.k[layer])?, pick(&self.v[layer])?))
    }

    /// Views of slots `0..n`, positions `0..len`: `[n, Hkv, len, D]` keys and values.
    pub(crate) fn view(&self, layer: usize, n: i64, len: i64) -> Result<(Tensor, Tensor), HfError> {
        let pick = |x: &Tensor| -> Result<Tensor, HfError> {
            Ok(x.f_view([self.slots, self.max_len, self.hkv, self.d])?
                .f_narrow(0, 0, n)?
                .f_narrow(1, 0, len)?
                .f_transpose(1, 2)?)
        };
        Ok((pick(&self.k[layer])?, pick(&self.v[layer])?))
    }
}
