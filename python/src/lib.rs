//! The Python extension `bertha._bertha`: a thin PyO3 layer over the
//! `bertha` library. Conversions, GIL release and error mapping live here;
//! every decision about models and numbers stays in the library, so the
//! Python API gives the CLI's and the server's results.
//!
//! The pure-Python package (`python/bertha/`) adds sentence-transformers'
//! and transformers' call shapes on top.

use std::path::Path;

use pyo3::exceptions::{PyFileNotFoundError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

mod embed;
mod pipelines;
mod train;

/// The Python exception for a library error, carrying its message: a
/// missing file or folder is `FileNotFoundError`, a bad option, input,
/// config or model folder `ValueError`; what the caller cannot fix
/// (numerics, a diverged run) `RuntimeError`.
pub(crate) fn to_py(e: bertha::Error) -> PyErr {
    use bertha::Error as E;
    let msg = e.to_string();
    match &e {
        E::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            PyFileNotFoundError::new_err(msg)
        }
        E::ModelDir { path, .. } if !path.exists() => PyFileNotFoundError::new_err(msg),
        E::Io { .. }
        | E::ModelDir { .. }
        | E::Config { .. }
        | E::Json { .. }
        | E::Weights { .. }
        | E::Tokenizer(_)
        | E::Input(_)
        | E::Option { .. } => PyValueError::new_err(msg),
        _ => PyRuntimeError::new_err(msg),
    }
}

/// The library's `Result` as Python's.
pub(crate) trait IntoPyResult<T> {
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for bertha::Result<T> {
    fn py(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

/// A `ValueError` for an argument, worded as the library words options.
pub(crate) fn bad_arg(name: &str, reason: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(format!("{name} {reason}"))
}

/// Fails early, with `FileNotFoundError`, on a model path that does not
/// exist: the library's own message (it names hub ids too).
pub(crate) fn open_dir(path: &str) -> PyResult<std::path::PathBuf> {
    bertha::ModelDir::open(Path::new(path)).py()?;
    Ok(Path::new(path).to_path_buf())
}

/// A library result serialised by serde, as Python dicts and lists:
/// transformers' field names come from the library's serde names.
pub(crate) fn to_object<'py, T: serde::Serialize>(
    py: Python<'py>,
    value: &T,
) -> PyResult<Bound<'py, PyAny>> {
    let json = serde_json::to_value(value)
        .map_err(|e| PyRuntimeError::new_err(format!("serialising a result: {e}")))?;
    json_to_py(py, &json)
}

pub(crate) fn json_to_py<'py>(
    py: Python<'py>,
    v: &serde_json::Value,
) -> PyResult<Bound<'py, PyAny>> {
    use serde_json::Value;
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => i.into_pyobject(py)?.into_any(),
            (None, Some(u)) => u.into_pyobject(py)?.into_any(),
            _ => n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any(),
        },
        Value::String(s) => s.into_pyobject(py)?.into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(json_to_py(py, item)?)?;
            }
            list.into_any()
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (k, item) in map {
                dict.set_item(k, json_to_py(py, item)?)?;
            }
            dict.into_any()
        }
    })
}

/// A Python value (dicts, lists, numbers, strings, paths as `str`) as JSON,
/// for options the library reads with serde.
pub(crate) fn py_to_json(v: &Bound<'_, PyAny>) -> PyResult<serde_json::Value> {
    use serde_json::Value;
    if v.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(b) = v.downcast::<pyo3::types::PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if let Ok(i) = v.extract::<i64>() {
        return Ok(Value::from(i));
    }
    if let Ok(f) = v.extract::<f64>() {
        return Ok(serde_json::Number::from_f64(f)
            .map(Value::Number)
            .unwrap_or(Value::Null));
    }
    if let Ok(s) = v.extract::<String>() {
        return Ok(Value::String(s));
    }
    if let Ok(d) = v.downcast::<PyDict>() {
        let mut map = serde_json::Map::new();
        for (k, item) in d.iter() {
            map.insert(k.extract::<String>()?, py_to_json(&item)?);
        }
        return Ok(Value::Object(map));
    }
    if let Ok(items) = v.extract::<Vec<Bound<'_, PyAny>>>() {
        return items
            .iter()
            .map(py_to_json)
            .collect::<PyResult<_>>()
            .map(Value::Array);
    }
    // os.PathLike
    if let Ok(p) = v.call_method0("__fspath__") {
        return py_to_json(&p);
    }
    Err(PyValueError::new_err(format!(
        "cannot pass a {} as an option value",
        v.get_type().name()?
    )))
}

/// A precision by its Python name: sentence-transformers' `float32`, or
/// the library's names (`f32`, `bf16`, `int8`).
pub(crate) fn precision(name: &str) -> PyResult<bertha::Precision> {
    match name {
        "float32" => Ok(bertha::Precision::F32),
        "bfloat16" => Ok(bertha::Precision::Bf16),
        other => other.parse().py(),
    }
}

#[pymodule]
fn _bertha(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<embed::Embedder>()?;
    m.add_class::<pipelines::FillMask>()?;
    m.add_class::<pipelines::TextClassifier>()?;
    m.add_class::<pipelines::TokenClassifier>()?;
    m.add_class::<pipelines::QuestionAnswerer>()?;
    m.add_class::<pipelines::CrossEncoder>()?;
    m.add_function(wrap_pyfunction!(train::train, m)?)?;
    Ok(())
}
