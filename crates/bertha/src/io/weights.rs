//! Checkpoint weights: `model.safetensors` (memory-mapped), sharded
//! safetensors (`model.safetensors.index.json`) or `pytorch_model.bin`
//! (read by candle's pickle reader, which only interprets the tensor
//! records and never executes pickle code).
//!
//! [`Weights`] is a candle `VarBuilder` backend, so model modules load
//! with the checkpoint's own names, and every missing tensor or shape
//! mismatch is reported with the tensor's name, the file and both shapes.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use candle_core::pickle::PthTensors;
use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::{Error, Result};

/// A tensor's little-endian bytes with its safetensors dtype and shape:
/// what `safetensors::serialize` writes (checkpoints, packed folders).
pub(crate) struct RawTensor {
    pub dtype: safetensors::Dtype,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

impl RawTensor {
    /// f32 values of the given shape.
    pub fn f32(shape: Vec<usize>, values: &[f32]) -> Self {
        Self {
            dtype: safetensors::Dtype::F32,
            shape,
            bytes: values.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }
}

impl safetensors::View for &RawTensor {
    fn dtype(&self) -> safetensors::Dtype {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.bytes)
    }

    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

enum Source {
    Safetensors(MmapedSafetensors),
    Pth(PthTensors),
    Memory(HashMap<String, Tensor>),
}

/// Named tensors from one checkpoint.
pub struct Weights {
    source: Source,
    /// Every tensor name with its shape, read from the headers up front.
    shapes: HashMap<String, Vec<usize>>,
    /// Where the tensors came from, for messages.
    origin: PathBuf,
    /// The shard holding each tensor of a sharded checkpoint, so a message
    /// names that file rather than the index.
    shards: HashMap<String, PathBuf>,
}

impl Weights {
    /// Finds the weights of a Hugging Face model folder.
    pub fn from_model_dir(dir: &Path) -> Result<Self> {
        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        let pth = dir.join("pytorch_model.bin");
        if single.is_file() {
            Self::from_safetensors(&[single])
        } else if index.is_file() {
            Self::from_safetensors_index(&index)
        } else if pth.is_file() {
            Self::from_pytorch(&pth)
        } else {
            Err(Error::ModelDir {
                path: dir.to_path_buf(),
                reason: "no weights found (expected model.safetensors, \
                         model.safetensors.index.json or pytorch_model.bin)"
                    .into(),
            })
        }
    }

    /// Memory-maps one or more safetensors files.
    pub fn from_safetensors(files: &[PathBuf]) -> Result<Self> {
        let origin = files.first().cloned().unwrap_or_default();
        for f in files {
            // Validate each file up front so the error names the bad one.
            let bytes = std::fs::File::open(f).map_err(|e| Error::io(f, e))?;
            drop(bytes);
        }
        // SAFETY: the files are mapped read-only; like every mmap-based
        // loader we rely on nobody truncating them while the model lives.
        let st = unsafe { MmapedSafetensors::multi(files) }.map_err(|e| Error::Weights {
            path: origin.clone(),
            reason: format!("not a valid safetensors file: {}", strip_backtrace(&e)),
        })?;
        let shapes = st
            .tensors()
            .into_iter()
            .map(|(name, view)| (name, view.shape().to_vec()))
            .collect();
        Ok(Self {
            source: Source::Safetensors(st),
            shapes,
            origin,
            shards: HashMap::new(),
        })
    }

    /// Reads a sharded checkpoint through its index file.
    pub fn from_safetensors_index(index: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(index).map_err(|e| Error::io(index, e))?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|source| Error::Json {
                path: index.to_path_buf(),
                source,
            })?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| Error::config(index, "weight_map", "missing or not an object"))?;
        let dir = index.parent().unwrap_or(Path::new("."));
        let mut shards = HashMap::with_capacity(map.len());
        for (tensor, file) in map {
            let file = file.as_str().ok_or_else(|| {
                Error::config(
                    index,
                    "weight_map",
                    format!("entry `{tensor}` is not a file name"),
                )
            })?;
            shards.insert(tensor.clone(), dir.join(file));
        }
        let files: Vec<PathBuf> = shards
            .values()
            .cloned()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut w = Self::from_safetensors(&files)?;
        w.origin = index.to_path_buf();
        w.shards = shards;
        Ok(w)
    }

    /// Reads a PyTorch `pytorch_model.bin` (zip + pickle) without running
    /// any pickle code.
    pub fn from_pytorch(path: &Path) -> Result<Self> {
        let pth = PthTensors::new(path, None).map_err(|e| Error::Weights {
            path: path.to_path_buf(),
            reason: format!("not a readable PyTorch checkpoint: {}", strip_backtrace(&e)),
        })?;
        let shapes = pth
            .tensor_infos()
            .iter()
            .map(|(name, info)| (name.clone(), info.layout.shape().dims().to_vec()))
            .collect();
        Ok(Self {
            source: Source::Pth(pth),
            shapes,
            origin: path.to_path_buf(),
            shards: HashMap::new(),
        })
    }

    /// Wraps tensors already in memory (tests, freshly trained models).
    pub fn from_tensors(tensors: HashMap<String, Tensor>, origin: impl Into<PathBuf>) -> Self {
        let shapes = tensors
            .iter()
            .map(|(k, t)| (k.clone(), t.dims().to_vec()))
            .collect();
        Self {
            source: Source::Memory(tensors),
            shapes,
            origin: origin.into(),
            shards: HashMap::new(),
        }
    }

    pub fn origin(&self) -> &Path {
        &self.origin
    }

    pub fn contains(&self, name: &str) -> bool {
        self.resolve(name).is_some()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.shapes.keys().map(String::as_str)
    }

    /// The prefix under which the base model's tensors live: checkpoints
    /// saved from a head class (`BertForMaskedLM`, ...) store the encoder
    /// under `bert.`, a bare `BertModel` stores it at the root.
    pub fn base_prefix(&self, model_type: &str) -> Option<String> {
        // BERT's word embeddings, or ModernBERT's `tok_embeddings`.
        let probes = [
            "embeddings.word_embeddings.weight",
            "embeddings.tok_embeddings.weight",
        ];
        if probes.iter().any(|p| self.contains(p)) {
            Some(String::new())
        } else if probes
            .iter()
            .any(|p| self.contains(&format!("{model_type}.{p}")))
        {
            Some(format!("{model_type}."))
        } else {
            None
        }
    }

    /// Maps a requested name to the stored one. Old TF-converted
    /// checkpoints call LayerNorm parameters `gamma`/`beta`.
    fn resolve<'a>(&'a self, name: &'a str) -> Option<std::borrow::Cow<'a, str>> {
        if self.shapes.contains_key(name) {
            return Some(name.into());
        }
        let alias = if let Some(stem) = name.strip_suffix(".weight") {
            format!("{stem}.gamma")
        } else if let Some(stem) = name.strip_suffix(".bias") {
            format!("{stem}.beta")
        } else {
            return None;
        };
        self.shapes.contains_key(&alias).then(|| alias.into())
    }

    fn load(&self, name: &str, dev: &Device) -> candle_core::Result<Tensor> {
        let stored = self.resolve(name).ok_or_else(|| self.missing(name, None))?;
        let t = match &self.source {
            Source::Safetensors(st) => st.load(&stored, dev)?,
            Source::Pth(pth) => pth.get(&stored)?.ok_or_else(|| self.missing(name, None))?,
            Source::Memory(m) => m
                .get(stored.as_ref())
                .cloned()
                .ok_or_else(|| self.missing(name, None))?,
        };
        self.check_finite(&stored, &t)?;
        t.to_device(dev)
    }

    /// Refuses a tensor holding NaN or ±Inf: every model path reads its
    /// tensors here, and a model loaded with one would answer `null`
    /// embeddings and scores instead of failing.
    fn check_finite(&self, stored: &str, t: &Tensor) -> candle_core::Result<()> {
        if !t.dtype().is_float() {
            return Ok(());
        }
        let values = t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
        let Some(first) = values.iter().position(|v| !v.is_finite()) else {
            return Ok(());
        };
        let bad = values.iter().filter(|v| !v.is_finite()).count();
        let file = self.shards.get(stored).unwrap_or(&self.origin);
        Err(candle_core::Error::Msg(format!(
            "tensor `{stored}` in {} holds non-finite values ({bad} of {}, the first {} at index \
             {first}): the checkpoint is corrupt or was saved from a diverged run",
            file.display(),
            values.len(),
            values[first],
        )))
    }

    fn missing(&self, name: &str, shape: Option<&Shape>) -> candle_core::Error {
        let expected = shape
            .map(|s| format!(" (expected shape {:?})", s.dims()))
            .unwrap_or_default();
        candle_core::Error::Msg(format!(
            "missing tensor `{name}`{expected} in {}",
            self.origin.display()
        ))
    }

    /// A `VarBuilder` over these weights, in f32 on `device`.
    pub fn var_builder(self, dtype: DType, device: &Device) -> VarBuilder<'static> {
        VarBuilder::from_backend(Box::new(self), dtype, device.clone())
    }
}

impl SimpleBackend for Weights {
    fn get(
        &self,
        s: Shape,
        name: &str,
        _: Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        let Some(stored) = self.resolve(name) else {
            return Err(self.missing(name, Some(&s)));
        };
        let have = &self.shapes[stored.as_ref()];
        if have.as_slice() != s.dims() {
            return Err(candle_core::Error::Msg(format!(
                "tensor `{name}` in {} has shape {:?}, but the config expects {:?}",
                self.origin.display(),
                have,
                s.dims()
            )));
        }
        self.load(name, dev)?.to_dtype(dtype)
    }

    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        self.load(name, dev)?.to_dtype(dtype)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.contains(name)
    }
}

/// Fresh, seeded parameters: a `VarBuilder` backend that answers every
/// request with values drawn from the requested [`Init`] using a generator
/// seeded from `seed` and the tensor's name, so a model is the same for a
/// seed whatever order its modules are built in.
pub struct SeededInit {
    seed: u64,
}

impl SeededInit {
    pub fn new(seed: u64) -> Self {
        Self { seed }
    }

    pub fn var_builder(self, dtype: DType, device: &Device) -> VarBuilder<'static> {
        VarBuilder::from_backend(Box::new(self), dtype, device.clone())
    }

    fn rng_for(&self, name: &str) -> StdRng {
        // FNV-1a of the name, mixed with the seed: stable across runs and
        // platforms (unlike std's randomly keyed hasher).
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in name.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        StdRng::seed_from_u64(h ^ self.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }
}

impl SimpleBackend for SeededInit {
    fn get(
        &self,
        s: Shape,
        name: &str,
        h: Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        let n = s.elem_count();
        let mut rng = self.rng_for(name);
        let values: Vec<f32> = match h {
            Init::Const(c) => vec![c as f32; n],
            Init::Randn { mean, stdev } => (0..n)
                .map(|_| (mean + stdev * standard_normal(&mut rng)) as f32)
                .collect(),
            Init::Uniform { lo, up } => (0..n).map(|_| rng.random_range(lo..up) as f32).collect(),
            Init::Kaiming { .. } => {
                return Err(candle_core::Error::Msg(format!(
                    "tensor `{name}`: Kaiming init is not used by BERT"
                )))
            }
        };
        Tensor::from_vec(values, s, dev)?.to_dtype(dtype)
    }

    fn get_unchecked(&self, name: &str, _: DType, _: &Device) -> candle_core::Result<Tensor> {
        Err(candle_core::Error::Msg(format!(
            "tensor `{name}` has no shape to initialise from"
        )))
    }

    fn contains_tensor(&self, _: &str) -> bool {
        true
    }
}

/// Box-Muller: one standard normal sample.
fn standard_normal(rng: &mut StdRng) -> f64 {
    let u1: f64 = rng.random_range(f64::EPSILON..1.0);
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// candle errors carry a backtrace in their Display; users want the line.
pub(crate) fn strip_backtrace(e: &candle_core::Error) -> String {
    let s = e.to_string();
    s.lines().next().unwrap_or_default().to_string()
}
