//! SA-7's forwards: shapes that depend only on the sequence they serve, so its tokens and
//! log-probs are bit-identical whatever shares the sampler, and the cost follows the tokens in
//! flight rather than the cache's size.
//!
//! - A prompt is prefilled alone, right-padded to its length bucket ([`bucket`]).
//! - A decode step groups the occupied slots by the bucket of their attended length
//!   (`pos + 1`) and runs each group as forwards of exactly [`INVARIANT_ROWS`] rows (padding
//!   rows write to the scratch slot), attending the bucket's length under an explicit mask.
//!
//! A row's result depends on the forward's shape and its own inputs, never on another row's
//! values or its place among them (checked by `sa7_*` in `hf::tests`), and each shape here is a
//! function of the row's own length alone.

use tch::{Kind, Tensor};

use super::{uniform, Sampler, Slot};
use crate::hf::error::HfError;
use crate::hf::layers::attention;
use crate::hf::model::HfModel;
use crate::hf::sampling::{choose, RowParams};

/// Rows of every batch-invariant decode forward.
pub const INVARIANT_ROWS: usize = 8;

/// Shortest length bucket.
const MIN_BUCKET: usize = 16;

/// The padded length of a sequence of `len` tokens: the next power of two (at least
/// [`MIN_BUCKET`]), capped at the cache length.
pub(super) fn bucket(len: usize, max_len: usize) -> usize {
    len.next_power_of_two().max(MIN_BUCKET).min(max_len)
}

impl Sampler {
    /// Prefills each admitted `(slot, prompt)` alone, padded to its bucket.
    pub(super) fn prefill_invariant(
        &mut self,
        model: &HfModel,
        admitted: &[(usize, Vec<u32>)],
        slots: &mut [Option<Slot>],
    ) -> Result<(), HfError> {
        let max_len = self.cache.max_len() as usize;
        for one in admitted {
            let padded = bucket(one.1.len(), max_len);
            self.prefill_group(model, std::slice::from_ref(one), padded, slots)?;
        }
        Ok(())
    }

    /// One decode step of every occupied slot, in groups of one bucket each.
    pub(super) fn decode_invariant(
        &mut self,
        model: &HfModel,
        slots: &mut [Option<Slot>],
    ) -> Result<(), HfError> {
        let max_len = self.cache.max_len() as usize;
        let mut busy: Vec<(usize, usize)> = slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|s| (bucket(s.len as usize + 1, max_len), i)))
            .collect();
        busy.sort_unstable();
        let scratch = (self.cache.slots() - 1) as usize;
        for same in busy.chunk_by(|a, b| a.0 == b.0) {
            for chunk in same.chunks(INVARIANT_ROWS) {
                let mut rows: Vec<usize> = chunk.iter().map(|&(_, i)| i).collect();
                rows.resize(INVARIANT_ROWS, scratch);
                self.decode_rows(model, &rows, chunk[0].0 as i64, slots)?;
            }
        }
        self.stats.decode_steps += 1;
        let occupied = busy.len() as i64;
        if occupied * 10 >= (self.cache.slots() - 1) * 9 {
            self.stats.busy_decode_steps += 1;
        }
        Ok(())
    }

    /// One decode forward of the slots `rows` (the scratch slot for padding), attending
    /// `attn_len` cached positions under a mask.
    fn decode_rows(
        &mut self,
        model: &HfModel,
        rows: &[usize],
        attn_len: i64,
        slots: &mut [Option<Slot>],
    ) -> Result<(), HfError> {
        let _guard = tch::no_grad_guard();
        let dev = model.device();
        let n = rows.len() as i64;
        let (mut toks, mut pos, mut u) = (
            vec![0i64; rows.len()],
            vec![0i64; rows.len()],
            vec![0f32; rows.len()],
        );
        let mut params = Vec::with_capacity(rows.len());
        for (i, &r) in rows.iter().enumerate() {
            match slots.get_mut(r).and_then(Option::as_mut) {
                Some(s) => {
                    toks[i] = s.out.tokens.last().map_or(0, |&t| i64::from(t));
                    pos[i] = s.len;
                    u[i] = uniform(&mut s.rng);
                    params.push((s.params.temperature, s.params.top_p, s.params.top_k));
                }
                // A padding row: greedy, nothing recorded (as in the prefill's scratch rows).
                None => params.push((0.0, 1.0, 0)),
            }
        }
        let ids: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
        let ids = Tensor::f_from_slice(&ids)?.f_to_device(dev)?;
        let pos_t = Tensor::f_from_slice(&pos)?.f_to_device(dev)?;
        let flat_rows = ids.f_mul_scalar(self.cache.max_len())?.f_add(&pos_t)?;
        let tokens = Tensor::f_from_slice(&toks)?
            .f_to_device(dev)?
            .f_view([n, 1])?;
        let (cos, sin) = self.rope.at(&pos_t.f_view([n, 1])?)?;
        let keys = Tensor::f_arange(attn_len, (Kind::Int64, dev))?.f_view([1, attn_len])?;
        let mask = keys
            .f_le_tensor(&pos_t.f_view([n, 1])?)?
            .f_view([n, 1, 1, attn_len])?;
        let cache = &mut self.cache;
        let mut attend = |l: usize, q: Tensor, k: Tensor, v: Tensor| -> Result<Tensor, HfError> {
            cache.write(l, &flat_rows, &k, &v)?;
            let (kc, vc) = cache.gather(l, &ids, attn_len)?;
            attention(&q, &kc, &vc, Some(&mask), false)
        };
        let hidden = model.run_layers(model.embed(&tokens)?, &cos, &sin, &mut attend)?;
        let logits = model.logits(&hidden.f_squeeze_dim(1)?)?;
        let params = RowParams::new(&params, model.config().vocab_size as i64, dev)?;
        let chosen = super::steps::to_host(&choose(&logits, &params, &Tensor::f_from_slice(&u)?)?)?;
        for (&r, (tok, lp, slp)) in rows.iter().zip(chosen) {
            if let Some(s) = slots.get_mut(r).and_then(Option::as_mut) {
                s.len += 1;
                self.record(s, tok, lp, slp)?;
            }
        }
        Ok(())
    }
}
