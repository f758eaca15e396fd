//! The bf16 panels of the weights a bf16 training step multiplies, kept
//! from one step to the next: the optimizer writes them block of rows by
//! block as it updates the weights ([`UpdateSink`]), while the rows are in
//! cache, and the next step's products read them. Packed in the step
//! instead, each weight was read from memory once more per layout (the
//! forward's and the input gradient's): ~2 % of a `small` bf16 step.
//!
//! A pack is used only while its stamp is its weight's write count
//! ([`weight_version`]): every optimizer step and every wholesale write of
//! the weight (a checkpoint loaded, process 0's broadcast) counts, so a
//! pack the optimizer did not rewrite with the weight is never read.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use candle_core::{Tensor, TensorId};

use crate::fast::matmul::{PanelWriter, WeightPanels};
use crate::training::optim::{weight_version, RowWriter, UpdateSink};

/// One weight's panels and the weight's write count they were made from
/// (0: none yet, or being written).
struct Pack {
    version: AtomicU64,
    panels: RwLock<WeightPanels>,
}

/// The packs of a fixed set of weights (the matrices a model's bf16 step
/// multiplies the most: its embeddings-tied decoder, its layers' linear
/// weights), empty until the optimizer first writes them.
pub struct WeightPacks {
    packs: HashMap<TensorId, Pack>,
}

impl WeightPacks {
    /// Packs for these weights (`[n, k]` each; other shapes are left out).
    pub(crate) fn of<'t>(weights: impl IntoIterator<Item = &'t Tensor>) -> Self {
        let packs = weights
            .into_iter()
            .filter_map(|t| match t.dims() {
                &[n, k] => Some((t.id(), (n, k))),
                _ => None,
            })
            .map(|(id, (n, k))| {
                let pack = Pack {
                    version: AtomicU64::new(0),
                    panels: RwLock::new(WeightPanels::new(n, k)),
                };
                (id, pack)
            })
            .collect();
        Self { packs }
    }

    /// `t`'s panels, when made from its values as they are now.
    pub(crate) fn current(&self, t: &Tensor) -> Option<RwLockReadGuard<'_, WeightPanels>> {
        let pack = self.packs.get(&t.id())?;
        let panels = pack.panels.read().ok()?;
        let stamp = pack.version.load(Ordering::Acquire);
        (stamp != 0 && stamp == weight_version(t)).then_some(panels)
    }
}

impl UpdateSink for WeightPacks {
    fn writer<'s>(&'s self, t: &Tensor, version: u64) -> Option<Box<dyn RowWriter + 's>> {
        let pack = self.packs.get(&t.id())?;
        let mut panels = pack.panels.write().ok()?;
        // Stale until every row is written again.
        pack.version.store(0, Ordering::Release);
        let row_len = panels.shape().1;
        // SAFETY: the writer's pointers address the panels the guard
        // holds, and the guard lives in the same struct, dropped after it
        // (field order).
        let writer =
            unsafe { std::mem::transmute::<PanelWriter<'_>, PanelWriter<'s>>(panels.writer()) };
        Some(Box::new(PackWriter {
            writer,
            _panels: panels,
            version: (&pack.version, version),
            row_len,
        }))
    }
}

/// Writes one weight's panels while holding them locked.
struct PackWriter<'s> {
    writer: PanelWriter<'s>,
    _panels: RwLockWriteGuard<'s, WeightPanels>,
    /// The pack's stamp, and the version to stamp once written.
    version: (&'s AtomicU64, u64),
    row_len: usize,
}

impl RowWriter for PackWriter<'_> {
    fn row_len(&self) -> usize {
        self.row_len
    }

    fn rows_written(&self, r0: usize, values: &[f32]) {
        self.writer.pack_rows(r0, values);
    }

    fn finish(self: Box<Self>) {
        let (stamp, version) = self.version;
        stamp.store(version, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fast::matmul::Right;
    use crate::training::optim::{weight_written, AdamW, AdamWConfig, GradAccumulator};
    use crate::training::params::ParamStore;
    use candle_core::{Device, Var};

    /// A weight `[100, 300]` (two of the optimizer's blocks of rows: 64
    /// and 36) and a bias, the loss `Σ (W·x + b)²`.
    fn model() -> (ParamStore, Var, Var) {
        let dev = Device::Cpu;
        let (mut store, vb) = ParamStore::builder(None, "", 7, &dev);
        let init = candle_nn::Init::Randn {
            mean: 0.0,
            stdev: 0.02,
        };
        vb.get_with_hints((100, 300), "dense.weight", init).unwrap();
        vb.get_with_hints(100, "dense.bias", init).unwrap();
        store.freeze().unwrap();
        let vars: Vec<Var> = store.vars().map(|(_, v)| v.clone()).collect();
        let (b, w) = (vars[0].clone(), vars[1].clone());
        assert_eq!((w.dims(), b.dims()), (&[100, 300][..], &[100][..]));
        (store, w, b)
    }

    fn step(store: &ParamStore, opt: &mut AdamW, (w, b): (&Var, &Var), sink: Option<&WeightPacks>) {
        let x = Tensor::arange(0f32, 300., &Device::Cpu).unwrap();
        let x = (x * 0.01)
            .unwrap()
            .sin()
            .unwrap()
            .reshape((300, 1))
            .unwrap();
        let y = w.as_tensor().matmul(&x).unwrap().squeeze(1).unwrap();
        let loss = (y + b.as_tensor())
            .unwrap()
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap();
        let mut acc = GradAccumulator::new(store);
        acc.add(store, &loss.backward().unwrap()).unwrap();
        let sink = sink.map(|s| s as &dyn UpdateSink);
        opt.step_with(store, acc, 1e-2, sink).unwrap();
    }

    /// The optimizer writing the packs leaves the weights' bits as without
    /// them (and another model's steps leave them current), and after each
    /// step the packs hold the new weights' panels (both layouts); once the
    /// weight is written otherwise, or for a weight not packed, there are
    /// none.
    #[test]
    fn the_optimizer_writes_the_panels_of_the_weights_it_updates() {
        let (store, w, b) = model();
        let (twin, w2, b2) = model();
        let packs = WeightPacks::of([w.as_tensor()]);
        assert!(packs.current(w.as_tensor()).is_none(), "nothing packed yet");
        let (mut opt, mut opt2) = (
            AdamW::new(AdamWConfig::default()),
            AdamW::new(AdamWConfig::default()),
        );
        for _ in 0..2 {
            step(&store, &mut opt, (&w, &b), Some(&packs));
            step(&twin, &mut opt2, (&w2, &b2), None);
            let values = |v: &Var| {
                v.as_tensor()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
            };
            let bits = |x: Vec<f32>| x.into_iter().map(f32::to_bits).collect::<Vec<_>>();
            assert_eq!(bits(values(&w)), bits(values(&w2)), "weights");
            let mut want = WeightPanels::new(100, 300);
            want.writer().pack_rows(0, &values(&w));
            let got = packs.current(w.as_tensor()).expect("packed by the step");
            for (got, want) in [
                (got.forward(), want.forward()),
                (got.backward(), want.backward()),
            ] {
                let (Right::Packed(got), Right::Packed(want)) = (got, want) else {
                    unreachable!("weight panels are packed operands")
                };
                assert_eq!(got, want);
            }
            assert!(
                packs.current(b.as_tensor()).is_none(),
                "the bias is not packed"
            );
        }
        weight_written(w.as_tensor());
        assert!(
            packs.current(w.as_tensor()).is_none(),
            "stale after another write"
        );
    }
}
