//! `bertha._bertha.Embedder`: the library's [`bertha::Embedder`] behind
//! sentence-transformers' `encode`. Model work runs with the GIL released.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use bertha::tasks::{EmbedOptions, EncodeOptions};
use bertha::{Device, Pooling, Precision, SentenceTransformerSpec};
use numpy::ndarray::Array2;
use numpy::PyArray2;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::{bad_arg, open_dir, IntoPyResult};

/// A model folder's embedder, loaded once per precision asked.
#[pyclass(frozen, module = "bertha._bertha")]
pub struct Embedder {
    path: PathBuf,
    options: EmbedOptions,
    /// The precision of the load; `encode(precision=)` may ask others,
    /// each packed once and kept (packing is the costly part of a load).
    default_precision: Precision,
    embedders: Mutex<HashMap<&'static str, Arc<bertha::Embedder>>>,
    similarity_fn_name: Option<String>,
}

impl Embedder {
    fn get(&self, py: Python<'_>, p: Precision) -> PyResult<Arc<bertha::Embedder>> {
        if let Some(e) = self.lock().get(p.name()) {
            return Ok(e.clone());
        }
        let opts = EmbedOptions {
            precision: p,
            ..self.options.clone()
        };
        let loaded = py
            .allow_threads(|| bertha::Embedder::from_dir(&self.path, &Device::Cpu, &opts))
            .py()?;
        // Two threads may both load: the first kept wins, both are equal.
        let mut map = self.lock();
        Ok(map.entry(p.name()).or_insert(Arc::new(loaded)).clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<&'static str, Arc<bertha::Embedder>>> {
        // A panic elsewhere cannot leave the map half-written: take it.
        self.embedders.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn default(&self, py: Python<'_>) -> PyResult<Arc<bertha::Embedder>> {
        self.get(py, self.default_precision)
    }
}

#[pymethods]
impl Embedder {
    #[new]
    #[pyo3(signature = (path, precision="float32", pooling=None, normalize=None, max_seq_length=None))]
    fn new(
        py: Python<'_>,
        path: &str,
        precision: &str,
        pooling: Option<&str>,
        normalize: Option<bool>,
        max_seq_length: Option<usize>,
    ) -> PyResult<Self> {
        let dir = open_dir(path)?;
        let pooling: Option<Pooling> = pooling.map(|p| p.parse()).transpose().py()?;
        let spec = SentenceTransformerSpec::from_dir(&dir).py()?;
        let this = Self {
            path: dir,
            options: EmbedOptions {
                pooling,
                normalize,
                max_length: max_seq_length,
                ..EmbedOptions::default()
            },
            default_precision: crate::precision(precision)?,
            embedders: Mutex::new(HashMap::new()),
            similarity_fn_name: spec.and_then(|s| s.similarity_fn_name),
        };
        this.default(py)?;
        Ok(this)
    }

    /// Embeddings of `texts`, one row each, as a float32 array (n, dim)
    /// that owns the library's buffer. `truncate_dim` keeps the first
    /// values; `normalize` then L2-normalises each row (as
    /// sentence-transformers: truncation alone does not renormalise).
    #[pyo3(signature = (texts, batch_size=32, prompt_name=None, prompt=None, truncate_dim=None, normalize=false, precision=None, progress=None))]
    // Python keyword arguments, sentence-transformers' names.
    #[allow(clippy::too_many_arguments)]
    fn encode<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<String>,
        batch_size: usize,
        prompt_name: Option<String>,
        prompt: Option<String>,
        truncate_dim: Option<usize>,
        normalize: bool,
        precision: Option<&str>,
        progress: Option<PyObject>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        if batch_size == 0 {
            return Err(bad_arg("batch_size", "must be at least 1"));
        }
        let p = match precision {
            Some(name) => crate::precision(name)?,
            None => self.default_precision,
        };
        let embedder = self.get(py, p)?;
        embedder.check_dimensions(truncate_dim).py()?;
        let opts = EncodeOptions {
            prompt_name,
            prompt,
            dimensions: None,
        };
        let rows = py
            .allow_threads(|| {
                let mut done = 0;
                let mut report = |n: usize| {
                    if let Some(bar) = &progress {
                        Python::with_gil(|py| {
                            // A broken bar must not stop the embedding.
                            let _ = bar.call_method1(py, "update", (n - done,));
                        });
                    }
                    done = n;
                };
                embedder.embed_with(&texts, &opts, batch_size, &mut report)
            })
            .py()?;
        let dim = truncate_dim.unwrap_or(embedder.dimension());
        // One copy, into the buffer numpy then owns.
        let mut flat = Vec::with_capacity(rows.len() * dim);
        for row in &rows {
            let start = flat.len();
            flat.extend_from_slice(&row[..dim.min(row.len())]);
            if normalize {
                bertha::pooling::normalize_in_place(&mut flat[start..]);
            }
        }
        let array = Array2::from_shape_vec((rows.len(), dim), flat)
            .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))?;
        Ok(PyArray2::from_owned_array(py, array))
    }

    /// Token vectors of each text (the last hidden state, special tokens
    /// included): one float32 array (tokens, hidden) per text.
    #[pyo3(signature = (texts, batch_size=32))]
    fn embed_tokens<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<String>,
        batch_size: usize,
    ) -> PyResult<Vec<Bound<'py, PyArray2<f32>>>> {
        if batch_size == 0 {
            return Err(bad_arg("batch_size", "must be at least 1"));
        }
        let embedder = self.default(py)?;
        let out = py
            .allow_threads(|| embedder.embed_tokens(&texts, batch_size, &mut |_| {}))
            .py()?;
        out.into_iter()
            .map(|t| {
                let n = t.embeddings.len();
                let d = t.embeddings.first().map_or(0, Vec::len);
                let flat: Vec<f32> = t.embeddings.into_iter().flatten().collect();
                let a = Array2::from_shape_vec((n, d), flat)
                    .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))?;
                Ok(PyArray2::from_owned_array(py, a))
            })
            .collect()
    }

    /// Embedding size.
    #[getter]
    fn dimension(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.default(py)?.dimension())
    }

    /// Tokens per text (longer texts are truncated).
    #[getter]
    fn max_seq_length(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.default(py)?.tokenizer().max_length())
    }

    /// Whether the folder's Normalize module (or `normalize=True`) applies.
    #[getter]
    fn normalizes(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.default(py)?.normalizes())
    }

    #[getter]
    fn prompts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let e = self.default(py)?;
        let d = PyDict::new(py);
        for (k, v) in e.prompts() {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    #[getter]
    fn default_prompt_name(&self, py: Python<'_>) -> PyResult<Option<String>> {
        Ok(self.default(py)?.default_prompt_name().map(str::to_string))
    }

    /// The folder's `similarity_fn_name` (None when it names none).
    #[getter]
    fn similarity_fn_name(&self) -> Option<String> {
        self.similarity_fn_name.clone()
    }

    #[getter]
    fn precision(&self) -> &'static str {
        self.default_precision.name()
    }

    #[getter]
    fn path(&self) -> String {
        self.path.display().to_string()
    }
}
