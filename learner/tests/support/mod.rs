//! What the parity tests share: JSON vectors as tensors, and a record of the largest difference
//! per reference function that fails on the first value out of tolerance.
#![allow(dead_code)] // each test binary uses a part

use serde_json::Value;
use tch::{Kind, Tensor};

/// Tolerance: `|keel − reference| ≤ REL·max(1, |reference|)`.
pub const REL: f64 = 1e-7;

/// A `[B, T]` JSON matrix as a float64 tensor.
pub fn matrix(v: &Value) -> Tensor {
    let rows: Vec<Vec<f64>> = serde_json::from_value(v.clone()).expect("a [B, T] matrix");
    let (b, t) = (rows.len() as i64, rows[0].len() as i64);
    let flat: Vec<f64> = rows.into_iter().flatten().collect();
    Tensor::from_slice(&flat).view([b, t])
}

/// A tensor's values, flattened, as f64.
pub fn values(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(&t.detach().to_kind(Kind::Double).reshape([-1])).expect("values")
}

/// A JSON number.
pub fn num(v: &Value) -> f64 {
    v.as_f64().expect("a number")
}

/// Largest difference seen per reference function, relative as the tolerance
/// (`|keel − ref| / max(1, |ref|)`), for the report at the end of each test.
pub struct Diffs {
    reference: &'static str,
    worst: Vec<(String, f64)>,
}

impl Diffs {
    /// An empty record for comparisons with `reference` (named in messages and the report).
    pub fn new(reference: &'static str) -> Self {
        Diffs {
            reference,
            worst: Vec::new(),
        }
    }

    /// Compares two scalars.
    pub fn scalar(&mut self, what: &str, keel: f64, verl: f64) {
        let d = (keel - verl).abs();
        assert!(
            d <= REL * verl.abs().max(1.0),
            "{what}: keel {keel} vs {} {verl} (diff {d:e})",
            self.reference
        );
        self.note(what, d / verl.abs().max(1.0));
    }

    /// Compares `keel` with `verl` where `mask` (if any) is 1.
    pub fn tensor(&mut self, what: &str, keel: &Tensor, verl: &Value, mask: Option<&Tensor>) {
        self.tensors(what, keel, &matrix(verl), mask);
    }

    /// [`Diffs::tensor`] with verl's values already a tensor.
    pub fn tensors(&mut self, what: &str, keel: &Tensor, verl: &Tensor, mask: Option<&Tensor>) {
        let (k, v) = (values(keel), values(verl));
        assert_eq!(k.len(), v.len(), "{what}: shapes");
        let m = mask.map(values);
        let mut worst: f64 = 0.0;
        for i in 0..k.len() {
            if m.as_ref().is_some_and(|m| m[i] == 0.0) {
                continue;
            }
            let d = (k[i] - v[i]).abs();
            assert!(
                d <= REL * v[i].abs().max(1.0),
                "{what}[{i}]: keel {} vs {} {} (diff {d:e})",
                k[i],
                self.reference,
                v[i]
            );
            worst = worst.max(d / v[i].abs().max(1.0));
        }
        self.note(what, worst);
    }

    /// Compares the scalar `loss` with the reference's `verl_loss` and its gradient with respect to `wrt` with
    /// `verl_grad`, as `<what>` and `<what> gradient`.
    pub fn loss_and_grad(
        &mut self,
        what: &str,
        name: &str,
        loss: &Tensor,
        wrt: &Tensor,
        verl_loss: &Value,
        verl_grad: &Value,
    ) {
        self.scalar(
            &format!("{what}:{name}"),
            loss.double_value(&[]),
            num(verl_loss),
        );
        let grad = Tensor::run_backward(&[loss], &[wrt], false, false);
        self.tensor(
            &format!("{what} gradient:{name}"),
            &grad[0],
            verl_grad,
            None,
        );
    }

    /// Records `d` (relative) as a difference of `what` (up to its first `:`).
    pub fn note(&mut self, what: &str, d: f64) {
        let key = what.split(':').next().unwrap_or(what).to_string();
        match self.worst.iter_mut().find(|(k, _)| *k == key) {
            Some((_, w)) => *w = w.max(d),
            None => self.worst.push((key, d)),
        }
    }

    /// Prints the largest difference per function.
    pub fn report(&self) {
        for (k, d) in &self.worst {
            println!(
                "{} parity: {k:<40} max |diff|/max(1, |ref|) {d:.3e}",
                self.reference
            );
        }
    }
}
