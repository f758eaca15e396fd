//! The task pipelines (transformers' `pipeline(...)` tasks) and the
//! cross-encoder, one Python class per library type. Results leave as the
//! library serialises them, so field names are transformers'.

use bertha::tasks::{self, Aggregation, PipelineOptions, QaOptions, ScoreFunction};
use bertha::Device;
use numpy::PyArray1;
use pyo3::prelude::*;

use crate::{bad_arg, open_dir, precision, to_object, IntoPyResult};

/// A pipeline of the folder `path` at `precision`, loaded by `load` with
/// the GIL released.
fn load_pipeline<T: Send>(
    py: Python<'_>,
    path: &str,
    precision_name: &str,
    load: fn(&std::path::Path, &Device, &PipelineOptions) -> bertha::Result<T>,
) -> PyResult<T> {
    let dir = open_dir(path)?;
    let opts = PipelineOptions {
        precision: precision(precision_name)?,
        ..Default::default()
    };
    py.allow_threads(|| load(&dir, &Device::Cpu, &opts)).py()
}

/// transformers' `fill-mask`.
#[pyclass(frozen, module = "bertha._bertha")]
pub struct FillMask(tasks::FillMask);

#[pymethods]
impl FillMask {
    #[new]
    #[pyo3(signature = (path, precision="float32"))]
    fn new(py: Python<'_>, path: &str, precision: &str) -> PyResult<Self> {
        load_pipeline(py, path, precision, tasks::FillMask::from_dir_with).map(Self)
    }

    /// One list of `top_k` predictions per mask of `text`.
    #[pyo3(signature = (text, top_k=5))]
    fn fill<'py>(&self, py: Python<'py>, text: &str, top_k: usize) -> PyResult<Bound<'py, PyAny>> {
        let out = py.allow_threads(|| self.0.fill(text, top_k)).py()?;
        to_object(py, &out)
    }

    #[getter]
    fn mask_token(&self) -> String {
        self.0.mask_token().to_string()
    }
}

/// transformers' `text-classification`.
#[pyclass(frozen, module = "bertha._bertha")]
pub struct TextClassifier(tasks::Classifier);

#[pymethods]
impl TextClassifier {
    #[new]
    #[pyo3(signature = (path, precision="float32"))]
    fn new(py: Python<'_>, path: &str, precision: &str) -> PyResult<Self> {
        load_pipeline(py, path, precision, tasks::Classifier::from_dir_with).map(Self)
    }

    /// Labels with scores, best first (`top_k=None`: all of them).
    #[pyo3(signature = (text, text_pair=None, top_k=None, function_to_apply=None))]
    fn classify<'py>(
        &self,
        py: Python<'py>,
        text: &str,
        text_pair: Option<&str>,
        top_k: Option<usize>,
        function_to_apply: Option<&str>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let function = match function_to_apply {
            Some(f) => f.parse::<ScoreFunction>().py()?,
            None => self.0.function(),
        };
        let out = py
            .allow_threads(|| self.0.classify_with(text, text_pair, top_k, function))
            .py()?;
        to_object(py, &out)
    }

    /// `classify` of each `(text, text_pair or None)`, in order: texts of
    /// similar length batched, the batches side by side on the cores.
    #[pyo3(signature = (inputs, top_k=None, function_to_apply=None))]
    fn classify_many<'py>(
        &self,
        py: Python<'py>,
        inputs: Vec<(String, Option<String>)>,
        top_k: Option<usize>,
        function_to_apply: Option<&str>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let function = match function_to_apply {
            Some(f) => f.parse::<ScoreFunction>().py()?,
            None => self.0.function(),
        };
        let out = py
            .allow_threads(|| self.0.classify_many(&inputs, top_k, function))
            .py()?;
        to_object(py, &out)
    }

    #[getter]
    fn labels(&self) -> Vec<String> {
        self.0.labels()
    }
}

/// transformers' `token-classification` (NER).
#[pyclass(frozen, module = "bertha._bertha")]
pub struct TokenClassifier(tasks::TokenClassifier);

#[pymethods]
impl TokenClassifier {
    #[new]
    #[pyo3(signature = (path, precision="float32"))]
    fn new(py: Python<'_>, path: &str, precision: &str) -> PyResult<Self> {
        load_pipeline(py, path, precision, tasks::TokenClassifier::from_dir_with).map(Self)
    }

    /// Entities of `text` (`aggregation`: none, simple, first, average, max).
    #[pyo3(signature = (text, aggregation="none"))]
    fn entities<'py>(
        &self,
        py: Python<'py>,
        text: &str,
        aggregation: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let aggregation: Aggregation = aggregation.parse().py()?;
        let out = py
            .allow_threads(|| self.0.entities(text, aggregation))
            .py()?;
        to_object(py, &out)
    }

    /// `entities` of each text, in order: texts of similar length batched,
    /// the batches side by side on the cores.
    #[pyo3(signature = (texts, aggregation="none"))]
    fn entities_many<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<String>,
        aggregation: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let aggregation: Aggregation = aggregation.parse().py()?;
        let out = py
            .allow_threads(|| self.0.entities_many(&texts, aggregation))
            .py()?;
        to_object(py, &out)
    }
}

/// transformers' `question-answering`.
#[pyclass(frozen, module = "bertha._bertha")]
pub struct QuestionAnswerer(tasks::QuestionAnswerer);

#[pymethods]
impl QuestionAnswerer {
    #[new]
    #[pyo3(signature = (path, precision="float32"))]
    fn new(py: Python<'_>, path: &str, precision: &str) -> PyResult<Self> {
        load_pipeline(py, path, precision, tasks::QuestionAnswerer::from_dir_with).map(Self)
    }

    /// The `top_k` best answers, best first.
    #[pyo3(signature = (question, context, top_k=1, max_answer_len=15, doc_stride=None, max_seq_len=None))]
    // Python keyword arguments, transformers' names: one per option.
    #[allow(clippy::too_many_arguments)]
    fn answer<'py>(
        &self,
        py: Python<'py>,
        question: &str,
        context: &str,
        top_k: usize,
        max_answer_len: usize,
        doc_stride: Option<usize>,
        max_seq_len: Option<usize>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let opts = QaOptions {
            top_k,
            max_answer_len,
            doc_stride,
            max_seq_len,
        };
        let out = py
            .allow_threads(|| self.0.answer(question, context, &opts))
            .py()?;
        to_object(py, &out)
    }
}

/// A cross-encoder ([`tasks::CrossEncoder`]): a sentence-transformers
/// CrossEncoder folder, or any sequence-classification folder, scoring
/// pairs through the activation the folder names.
#[pyclass(frozen, module = "bertha._bertha")]
pub struct CrossEncoder(tasks::CrossEncoder);

/// An activation by name, or by the torch class path sentence-transformers
/// writes (`torch.nn.modules.activation.Sigmoid`).
fn activation(name: &str) -> PyResult<tasks::Activation> {
    use tasks::Activation as A;
    match name.to_ascii_lowercase().as_str() {
        "sigmoid" => Ok(A::Sigmoid),
        "identity" | "none" => Ok(A::Identity),
        "tanh" => Ok(A::Tanh),
        "softmax" => Ok(A::Softmax),
        _ => A::from_torch_path(name).ok_or_else(|| {
            bad_arg(
                "activation_fn",
                format!("`{name}` is not one of sigmoid, identity, tanh, softmax"),
            )
        }),
    }
}

#[pymethods]
impl CrossEncoder {
    #[new]
    #[pyo3(signature = (path, precision="float32", max_length=None, batch_size=32))]
    fn new(
        py: Python<'_>,
        path: &str,
        precision: &str,
        max_length: Option<usize>,
        batch_size: usize,
    ) -> PyResult<Self> {
        let dir = open_dir(path)?;
        if batch_size == 0 {
            return Err(bad_arg("batch_size", "must be at least 1"));
        }
        let opts = tasks::CrossEncoderOptions {
            precision: crate::precision(precision)?,
            max_length,
            batch_size,
            ..Default::default()
        };
        let inner = py
            .allow_threads(|| tasks::CrossEncoder::from_dir(&dir, &Device::Cpu, &opts))
            .py()?;
        Ok(Self(inner))
    }

    /// Each pair's scores (`firsts[i]`, `seconds[i]`): (n,) for a one-label
    /// model, else (n, labels), as sentence-transformers' `predict`.
    #[pyo3(signature = (firsts, seconds, activation=None))]
    fn predict<'py>(
        &self,
        py: Python<'py>,
        firsts: Vec<String>,
        seconds: Vec<String>,
        activation: Option<&str>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if firsts.len() != seconds.len() {
            return Err(bad_arg(
                "pairs",
                format!(
                    "have {} first texts and {} second texts",
                    firsts.len(),
                    seconds.len()
                ),
            ));
        }
        let function = activation.map(self::activation).transpose()?;
        let pairs: Vec<(&str, &str)> = firsts
            .iter()
            .zip(&seconds)
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        let rows = py
            .allow_threads(|| match function {
                None => self.0.predict(&pairs),
                Some(f) => Ok(self.0.logits(&pairs)?.iter().map(|l| f.apply(l)).collect()),
            })
            .py()?;
        let labels = self.0.num_labels();
        if labels == 1 {
            let flat: Vec<f32> = rows.into_iter().flatten().collect();
            return Ok(PyArray1::from_vec(py, flat).into_any());
        }
        let n = rows.len();
        let flat: Vec<f32> = rows.into_iter().flatten().collect();
        let array = numpy::ndarray::Array2::from_shape_vec((n, labels), flat)
            .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))?;
        Ok(numpy::PyArray2::from_owned_array(py, array).into_any())
    }

    /// The documents by their score with `query`, best first: dicts with
    /// `corpus_id` and `score`, at most `top_k`.
    #[pyo3(signature = (query, documents, top_k=None))]
    fn rank<'py>(
        &self,
        py: Python<'py>,
        query: &str,
        documents: Vec<String>,
        top_k: Option<usize>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let ranked = py
            .allow_threads(|| self.0.rank(query, &documents, top_k))
            .py()?;
        to_object(py, &ranked)
    }

    #[getter]
    fn num_labels(&self) -> usize {
        self.0.num_labels()
    }

    #[getter]
    fn max_length(&self) -> usize {
        self.0.tokenizer().max_length()
    }
}
