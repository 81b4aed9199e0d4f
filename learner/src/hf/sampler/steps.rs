//! The two forward passes of the sampler: prefill (whole prompts, right-padded, causal) and
//! decode (one token per occupied slot against the cache).

use tch::{Device, Kind, Tensor};

use super::{uniform, Sampler, Slot};
use crate::hf::error::HfError;
use crate::hf::layers::attention;
use crate::hf::model::HfModel;
use crate::hf::sampling::{choose, Choice, RowParams};

/// Copies chosen tokens and both log-probs to the host in one transfer.
pub(super) fn to_host(c: &Choice) -> Result<Vec<(u32, f32, f32)>, HfError> {
    let packed = Tensor::f_stack(
        &[
            c.tokens.f_to_kind(Kind::Double)?,
            c.logprobs.f_to_kind(Kind::Double)?,
            c.sampling_logprobs.f_to_kind(Kind::Double)?,
        ],
        1,
    )?
    .f_to_device(Device::Cpu)?;
    let rows = Vec::<Vec<f64>>::try_from(&packed)?;
    Ok(rows
        .into_iter()
        .map(|r| (r[0] as u32, r[1] as f32, r[2] as f32))
        .collect())
}

impl Sampler {
    /// Prefills admitted `(slot, prompt)` pairs in groups of at most `prefill_budget` padded
    /// tokens and samples each one's first token.
    pub(super) fn prefill(
        &mut self,
        model: &HfModel,
        admitted: &[(usize, Vec<u32>)],
        slots: &mut [Option<Slot>],
    ) -> Result<(), HfError> {
        if self.batch_invariant {
            return self.prefill_invariant(model, admitted, slots);
        }
        let mut start = 0;
        while start < admitted.len() {
            let mut end = start + 1;
            let mut pmax = admitted[start].1.len();
            while end < admitted.len() {
                let p = pmax.max(admitted[end].1.len());
                if (end + 1 - start) * p > self.prefill_budget {
                    break;
                }
                pmax = p;
                end += 1;
            }
            self.prefill_group(model, &admitted[start..end], pmax, slots)?;
            start = end;
        }
        Ok(())
    }

    pub(super) fn prefill_group(
        &mut self,
        model: &HfModel,
        group: &[(usize, Vec<u32>)],
        pmax: usize,
        slots: &mut [Option<Slot>],
    ) -> Result<(), HfError> {
        let _guard = tch::no_grad_guard();
        let dev = model.device();
        let (n, p) = (group.len() as i64, pmax as i64);
        let mut flat = vec![0i64; group.len() * pmax];
        for (i, (_, prompt)) in group.iter().enumerate() {
            for (j, &t) in prompt.iter().enumerate() {
                flat[i * pmax + j] = i64::from(t);
            }
        }
        let tokens = Tensor::f_from_slice(&flat)?
            .f_view([n, p])?
            .f_to_device(dev)?;
        let slot_ids: Vec<i64> = group.iter().map(|(s, _)| *s as i64).collect();
        let rows = Tensor::f_from_slice(&slot_ids)?
            .f_to_device(dev)?
            .f_mul_scalar(self.cache.max_len())?
            .f_view([n, 1])?
            .f_add(&Tensor::f_arange(p, (Kind::Int64, dev))?.f_view([1, p])?)?
            .f_reshape([-1])?;
        let (cos, sin) = self.rope.prefix(p)?;
        let cache = &mut self.cache;
        let mut attend = |l: usize, q: Tensor, k: Tensor, v: Tensor| -> Result<Tensor, HfError> {
            cache.write(l, &rows, &k, &v)?;
            attention(&q, &k, &v, None, true)
        };
        let hidden = model.run_layers(model.embed(&tokens)?, &cos, &sin, &mut attend)?;
        let h = hidden.size()[2];
        let last: Vec<i64> = group
            .iter()
            .map(|(_, prompt)| prompt.len() as i64 - 1)
            .collect();
        let idx = Tensor::f_from_slice(&last)?
            .f_to_device(dev)?
            .f_view([n, 1, 1])?
            .f_expand([n, 1, h], false)?;
        let logits = model.logits(&hidden.f_gather(1, &idx, false)?.f_squeeze_dim(1)?)?;
        let mut rows_params = Vec::with_capacity(group.len());
        let mut u = Vec::with_capacity(group.len());
        for (s, _) in group {
            // The scratch slot (SA-7 padding) has no sequence: greedy, nothing recorded.
            if *s >= slots.len() {
                rows_params.push((0.0, 1.0, 0));
                u.push(0.5);
                continue;
            }
            let slot = slots[*s]
                .as_mut()
                .ok_or_else(|| HfError::input("internal: prefill of an empty slot"))?;
            rows_params.push((
                slot.params.temperature,
                slot.params.top_p,
                slot.params.top_k,
            ));
            u.push(uniform(&mut slot.rng));
        }
        let params = RowParams::new(&rows_params, model.config().vocab_size as i64, dev)?;
        let chosen = to_host(&choose(&logits, &params, &Tensor::f_from_slice(&u)?)?)?;
        for ((s, _), (tok, lp, slp)) in group.iter().zip(chosen) {
            if let Some(slot) = slots.get_mut(*s).and_then(Option::as_mut) {
                self.record(slot, tok, lp, slp)?;
            }
        }
        self.stats.prefill_tokens += (n * p) as u64;
        Ok(())
    }

    /// One decode step over `slots` (occupied or not): every occupied slot feeds its last
    /// token at position `len` and samples the next.
    pub(super) fn decode(
        &mut self,
        model: &HfModel,
        slots: &mut [Option<Slot>],
        params: &RowParams,
    ) -> Result<(), HfError> {
        let _guard = tch::no_grad_guard();
        let dev = model.device();
        let rows = slots.len();
        let (mut toks, mut pos, mut u) = (vec![0i64; rows], vec![0i64; rows], vec![0f32; rows]);
        for (i, slot) in slots.iter_mut().enumerate() {
            if let Some(s) = slot {
                toks[i] = s.out.tokens.last().map_or(0, |&t| i64::from(t));
                pos[i] = s.len;
                u[i] = uniform(&mut s.rng);
            }
        }
        let n = rows as i64;
        let attn_len = pos.iter().copied().max().unwrap_or(0) + 1;
        let uniform_rows = slots.iter().all(Option::is_some) && pos.iter().all(|&p| p == pos[0]);
        let tokens = Tensor::f_from_slice(&toks)?
            .f_to_device(dev)?
            .f_view([n, 1])?;
        let pos_t = Tensor::f_from_slice(&pos)?.f_to_device(dev)?;
        let (cos, sin) = self.rope.at(&pos_t.f_view([n, 1])?)?;
        let flat_rows = self.row_base.f_narrow(0, 0, n)?.f_add(&pos_t)?;
        // Equal lengths in every row need no mask: all cached positions 0..=pos are valid.
        let mask = if uniform_rows {
            None
        } else {
            let keys = Tensor::f_arange(attn_len, (Kind::Int64, dev))?.f_view([1, attn_len])?;
            Some(
                keys.f_le_tensor(&pos_t.f_view([n, 1])?)?
                    .f_view([n, 1, 1, attn_len])?,
            )
        };
        let cache = &mut self.cache;
        let mut attend = |l: usize, q: Tensor, k: Tensor, v: Tensor| -> Result<Tensor, HfError> {
            cache.write(l, &flat_rows, &k, &v)?;
            let (kc, vc) = cache.view(l, n, attn_len)?;
            attention(&q, &kc, &vc, mask.as_ref(), false)
        };
        let hidden = model.run_layers(model.embed(&tokens)?, &cos, &sin, &mut attend)?;
        let logits = model.logits(&hidden.f_squeeze_dim(1)?)?;
        let chosen = to_host(&choose(&logits, params, &Tensor::f_from_slice(&u)?)?)?;
        for (slot, (tok, lp, slp)) in slots.iter_mut().zip(chosen) {
            if let Some(s) = slot {
                s.len += 1;
                self.record(s, tok, lp, slp)?;
            }
        }
        self.stats.decode_steps += 1;
        let busy = slots.iter().filter(|s| s.is_some()).count() as i64;
        if busy * 10 >= (self.cache.slots() - 1) * 9 {
            self.stats.busy_decode_steps += 1;
        }
        Ok(())
    }
}
