//! The task pipelines (transformers' `pipeline(...)` tasks) and the
//! cross-encoder, one Python class per library type. Results leave as the
//! library serialises them, so field names are transformers'.

use bertha::tasks::{self, Aggregation, PipelineOptions, QaOptions, ScoreFunction};
use bertha::Device;
use numpy::PyArray1;
use pyo3::prelude::*;

use crate::{bad_arg, open_dir, precision, to_object, IntoPyResult};

fn options(p: &str) -> PyResult<PipelineOptions> {
    Ok(PipelineOptions {
        precision: precision(p)?,
    })
}

/// transformers' `fill-mask`.
#[pyclass(frozen, module = "bertha._bertha")]
pub struct FillMask(tasks::FillMask);

#[pymethods]
impl FillMask {
    #[new]
    #[pyo3(signature = (path, precision="float32"))]
    fn new(py: Python<'_>, path: &str, precision: &str) -> PyResult<Self> {
        let dir = open_dir(path)?;
        let opts = options(precision)?;
        let inner = py
            .allow_threads(|| tasks::FillMask::from_dir_with(&dir, &Device::Cpu, &opts))
            .py()?;
        Ok(Self(inner))
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
        let dir = open_dir(path)?;
        let opts = options(precision)?;
        let inner = py
            .allow_threads(|| tasks::Classifier::from_dir_with(&dir, &Device::Cpu, &opts))
            .py()?;
        Ok(Self(inner))
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
        let dir = open_dir(path)?;
        let opts = options(precision)?;
        let inner = py
            .allow_threads(|| tasks::TokenClassifier::from_dir_with(&dir, &Device::Cpu, &opts))
            .py()?;
        Ok(Self(inner))
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
}

/// transformers' `question-answering`.
#[pyclass(frozen, module = "bertha._bertha")]
pub struct QuestionAnswerer(tasks::QuestionAnswerer);

#[pymethods]
impl QuestionAnswerer {
    #[new]
    #[pyo3(signature = (path, precision="float32"))]
    fn new(py: Python<'_>, path: &str, precision: &str) -> PyResult<Self> {
        let dir = open_dir(path)?;
        let opts = options(precision)?;
        let inner = py
            .allow_threads(|| tasks::QuestionAnswerer::from_dir_with(&dir, &Device::Cpu, &opts))
            .py()?;
        Ok(Self(inner))
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

/// A cross-encoder: one score per (query, document) pair, from a
/// sequence-classification head with one output, through the function the
/// folder names (sigmoid for one label, as sentence-transformers).
#[pyclass(frozen, module = "bertha._bertha")]
pub struct CrossEncoder(tasks::Classifier);

#[pymethods]
impl CrossEncoder {
    #[new]
    #[pyo3(signature = (path, precision="float32"))]
    fn new(py: Python<'_>, path: &str, precision: &str) -> PyResult<Self> {
        let dir = open_dir(path)?;
        let opts = options(precision)?;
        let inner = py
            .allow_threads(|| tasks::Classifier::from_dir_with(&dir, &Device::Cpu, &opts))
            .py()?;
        if inner.labels().len() != 1 {
            return Err(bad_arg(
                "model",
                format!(
                    "has {} labels: a cross-encoder scores with one",
                    inner.labels().len()
                ),
            ));
        }
        Ok(Self(inner))
    }

    /// One score per pair (`firsts[i]`, `seconds[i]`).
    #[pyo3(signature = (firsts, seconds, activation=None))]
    fn predict<'py>(
        &self,
        py: Python<'py>,
        firsts: Vec<String>,
        seconds: Vec<String>,
        activation: Option<&str>,
    ) -> PyResult<Bound<'py, PyArray1<f32>>> {
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
        let function = match activation {
            Some(f) => f.parse::<ScoreFunction>().py()?,
            None => self.0.function(),
        };
        let scores = py
            .allow_threads(|| {
                firsts
                    .iter()
                    .zip(&seconds)
                    .map(|(a, b)| {
                        let s = self.0.classify_with(a, Some(b), Some(1), function)?;
                        Ok(s.first().map_or(f32::NAN, |l| l.score))
                    })
                    .collect::<bertha::Result<Vec<f32>>>()
            })
            .py()?;
        Ok(PyArray1::from_vec(py, scores))
    }
}
