//! Trainable parameters: a `VarBuilder` backend that hands every module a
//! [`Var`] (so gradients reach it) and remembers it by checkpoint name.
//!
//! Values come from a checkpoint when it has the tensor, else from a
//! seeded initialiser (BERT's normal(0, initializer_range)). A tensor asked
//! for twice (ALBERT's shared layers) is one `Var`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use candle_core::{DType, Device, Shape, Tensor, Var};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder};

use crate::error::{Error, Result};
use crate::io::weights::{SeededInit, Weights};

struct Backend {
    source: Option<Weights>,
    /// The checkpoint's encoder prefix differs from ours (`""` vs `bert.`).
    rename: Option<(String, String)>,
    init: SeededInit,
    vars: Arc<Mutex<BTreeMap<String, Var>>>,
}

impl Backend {
    fn source_name(&self, name: &str) -> String {
        match &self.rename {
            Some((ours, theirs)) => match name.strip_prefix(ours.as_str()) {
                Some(rest) => format!("{theirs}{rest}"),
                None => name.to_string(),
            },
            None => name.to_string(),
        }
    }

    fn in_source(&self, name: &str) -> bool {
        self.source
            .as_ref()
            .is_some_and(|w| w.contains(&self.source_name(name)))
    }
}

fn lock_err() -> candle_core::Error {
    candle_core::Error::Msg("parameter store lock poisoned".into())
}

impl SimpleBackend for Backend {
    fn get(
        &self,
        s: Shape,
        name: &str,
        h: Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        let mut vars = self.vars.lock().map_err(|_| lock_err())?;
        if let Some(v) = vars.get(name) {
            if v.shape() != &s {
                return Err(candle_core::Error::Msg(format!(
                    "parameter `{name}` requested as {:?} and as {:?}",
                    v.dims(),
                    s.dims()
                )));
            }
            return Ok(v.as_tensor().clone());
        }
        let value = match (&self.source, self.in_source(name)) {
            (Some(w), true) => w.get(s, &self.source_name(name), h, dtype, dev)?,
            _ => self.init.get(s, name, h, dtype, dev)?,
        };
        let var = Var::from_tensor(&value.to_dtype(DType::F32)?)?;
        let t = var.as_tensor().clone();
        vars.insert(name.to_string(), var);
        Ok(t)
    }

    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        match &self.source {
            Some(w) => w.get_unchecked(&self.source_name(name), dtype, dev),
            None => self.init.get_unchecked(name, dtype, dev),
        }
    }

    /// Only tensors that exist (so a tied decoder stays tied).
    fn contains_tensor(&self, name: &str) -> bool {
        self.vars.lock().is_ok_and(|v| v.contains_key(name)) || self.in_source(name)
    }
}

/// The parameters of a model being trained, by checkpoint name.
#[derive(Clone)]
pub struct ParamStore {
    vars: Arc<Mutex<BTreeMap<String, Var>>>,
    snapshot: Vec<(String, Var)>,
}

impl ParamStore {
    /// A `VarBuilder` rooted at the checkpoint root; build the model with
    /// it, then call [`ParamStore::freeze`]. `source` supplies initial
    /// values (a pre-trained checkpoint), `prefix` is our encoder prefix
    /// (`bert.`) which the checkpoint may lack.
    pub fn builder(
        source: Option<Weights>,
        prefix: &str,
        seed: u64,
        device: &Device,
    ) -> (Self, VarBuilder<'static>) {
        let rename = source.as_ref().and_then(|w| {
            let theirs = w.base_prefix(prefix.trim_end_matches('.'))?;
            (theirs != prefix).then(|| (prefix.to_string(), theirs))
        });
        let vars: Arc<Mutex<BTreeMap<String, Var>>> = Arc::default();
        let backend = Backend {
            source,
            rename,
            init: SeededInit::new(seed),
            vars: vars.clone(),
        };
        let vb = VarBuilder::from_backend(Box::new(backend), DType::F32, device.clone());
        (
            Self {
                vars,
                snapshot: Vec::new(),
            },
            vb,
        )
    }

    /// Takes the list of parameters once the model is built.
    pub fn freeze(&mut self) -> Result<()> {
        let vars = self
            .vars
            .lock()
            .map_err(|_| Error::Input("parameter store lock poisoned".into()))?;
        self.snapshot = vars.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        Ok(())
    }

    /// (name, var) in name order.
    pub fn vars(&self) -> impl Iterator<Item = (&str, &Var)> {
        self.snapshot.iter().map(|(n, v)| (n.as_str(), v))
    }

    pub fn len(&self) -> usize {
        self.snapshot.len()
    }

    pub fn is_empty(&self) -> bool {
        self.snapshot.is_empty()
    }

    /// The number of scalar parameters.
    pub fn num_values(&self) -> usize {
        self.snapshot.iter().map(|(_, v)| v.elem_count()).sum()
    }

    /// The first weight that is NaN or infinite, if any (checkpoints
    /// refuse to keep a diverged model).
    pub fn first_non_finite(&self) -> Result<Option<f64>> {
        for (_, var) in &self.snapshot {
            let values = var.as_tensor().flatten_all()?.to_vec1::<f32>()?;
            if let Some(v) = values.iter().find(|v| !v.is_finite()) {
                return Ok(Some(f64::from(*v)));
            }
        }
        Ok(None)
    }

    /// The current values, by name, for a checkpoint.
    pub fn tensors(&self) -> HashMap<String, Tensor> {
        self.snapshot
            .iter()
            .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
            .collect()
    }

    /// Overwrites every parameter from `tensors` (a resumed checkpoint);
    /// a missing tensor or a shape mismatch is an error naming it.
    pub fn load(&self, tensors: &HashMap<String, Tensor>, origin: &std::path::Path) -> Result<()> {
        for (name, var) in &self.snapshot {
            let t = tensors.get(name).ok_or_else(|| Error::Weights {
                path: origin.to_path_buf(),
                reason: format!("missing tensor `{name}`"),
            })?;
            if t.dims() != var.dims() {
                return Err(Error::Weights {
                    path: origin.to_path_buf(),
                    reason: format!(
                        "tensor `{name}` has shape {:?}, the model expects {:?}",
                        t.dims(),
                        var.dims()
                    ),
                });
            }
            super::optim::weight_written(var.as_tensor());
            var.set(&t.to_dtype(DType::F32)?)?;
        }
        Ok(())
    }
}
