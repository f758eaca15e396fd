//! `bertha._bertha.train`: the library's training loop (the one `bertha
//! finetune` runs) from Python, for every task `bertha finetune` trains:
//! classification, ner, qa, multiple-choice, embedding (a bi-encoder)
//! and rerank (a cross-encoder). Options are `bertha finetune`'s, by their field names,
//! over the same defaults ([`FinetuneOptions::default`]).

use std::path::{Path, PathBuf};

use bertha::data::{DataOptions, EmbeddingData, PairLayout, PairOptions, Task};
use bertha::training::checkpoint::Checkpoint;
use bertha::training::{
    EmbeddingLoss, EmbeddingOptions, EmbeddingTrainer, Event, FinetuneOptions, Finetuner, LossKind,
    Objective, RerankLoss, RerankOptions, RerankTrainer, Trainer,
};
use bertha::BertConfig;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde_json::{json, Map, Value};

use crate::{bad_arg, json_to_py, open_dir, py_to_json, IntoPyResult};

/// Options that are not fields of [`FinetuneOptions`]: the data reader's,
/// the run's, and those the CLI resolves before building the options.
const OTHER_OPTIONS: &[&str] = &[
    "max_length",
    "doc_stride",
    "max_grad_norm",
    "engine",
    "precision",
    "resume",
    "text_column",
    "pair_column",
    "label_column",
    "skip_bad_rows",
    "loss",
    "scale",
    "pos_weight",
];

/// What `task` names: a head, or the embedding or rerank objectives.
enum Kind {
    Head(Task),
    Embedding,
    Rerank,
}

/// What a run is asked, read from Python's keyword arguments.
struct Request {
    options: FinetuneOptions,
    data: DataOptions,
    max_length: Option<usize>,
    doc_stride: Option<usize>,
    resume: Option<PathBuf>,
    /// embedding / rerank: the loss by name, mnrl's scale, bce's weight.
    loss: Option<String>,
    scale: Option<f64>,
    pos_weight: Option<f64>,
}

fn take<T: serde::de::DeserializeOwned>(
    map: &mut Map<String, Value>,
    name: &str,
) -> PyResult<Option<T>> {
    match map.remove(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v)
            .map(Some)
            .map_err(|e| bad_arg(name, format!("is not valid: {e}"))),
    }
}

fn read_request(out: PathBuf, options: Map<String, Value>) -> PyResult<Request> {
    let mut given = options;
    let mut base =
        serde_json::to_value(FinetuneOptions::default()).map_err(|e| bad_arg("options", e))?;
    let fields = base
        .as_object_mut()
        .ok_or_else(|| bad_arg("options", "are not an object"))?;
    for name in given.keys() {
        if !fields.contains_key(name) && !OTHER_OPTIONS.contains(&name.as_str()) {
            return Err(bad_arg(
                name,
                "is not an option of bertha.train (see `bertha finetune --help`: options by their field names, e.g. batch_size)",
            ));
        }
    }
    let max_length = take(&mut given, "max_length")?;
    let doc_stride = take(&mut given, "doc_stride")?;
    // As the CLI: a norm of 0 turns clipping off.
    let max_grad_norm: Option<f64> = take(&mut given, "max_grad_norm")?;
    let engine: Option<String> = take(&mut given, "engine")?;
    let precision: Option<String> = take(&mut given, "precision")?;
    let resume: Option<PathBuf> = take(&mut given, "resume")?;
    let loss: Option<String> = take(&mut given, "loss")?;
    let scale: Option<f64> = take(&mut given, "scale")?;
    let pos_weight: Option<f64> = take(&mut given, "pos_weight")?;
    let data = DataOptions {
        text_column: take(&mut given, "text_column")?,
        pair_column: take(&mut given, "pair_column")?,
        label_column: take(&mut given, "label_column")?,
        skip_bad_rows: take(&mut given, "skip_bad_rows")?.unwrap_or(false),
    };
    for (k, v) in given {
        fields.insert(k.clone(), v);
        // One option at a time, so that a bad value is named.
        if let Err(e) = serde_json::from_value::<FinetuneOptions>(Value::Object(fields.clone())) {
            return Err(bad_arg(&k, format!("is not valid: {e}")));
        }
    }
    fields.insert("out".into(), json!(out));
    let mut options: FinetuneOptions = serde_json::from_value(base)
        .map_err(|e| bad_arg("options", format!("are not valid: {e}")))?;
    if let Some(n) = max_grad_norm {
        options.max_grad_norm = (n != 0.0).then_some(n);
    }
    if let Some(e) = engine {
        options.engine = e.parse().py()?;
    }
    if let Some(p) = precision {
        options.precision = p.parse().py()?;
    }
    Ok(Request {
        options,
        data,
        max_length,
        doc_stride,
        resume,
        loss,
        scale,
        pos_weight,
    })
}

/// Fine-tunes `model` for `task` on `train` (scored on `dev`), writing to
/// `out`; `on_event(kind, data)` hears `start`, `step`, `eval`, `best`,
/// `saved`, `early_stop`. Returns the run's metrics.
#[pyfunction]
#[pyo3(signature = (task, model, train, out, dev=None, options=None, on_event=None))]
// Python keyword arguments, one per option.
#[allow(clippy::too_many_arguments)]
pub fn train<'py>(
    py: Python<'py>,
    task: &str,
    model: &str,
    train: PathBuf,
    out: PathBuf,
    dev: Option<PathBuf>,
    options: Option<Bound<'py, PyDict>>,
    on_event: Option<PyObject>,
) -> PyResult<Bound<'py, PyAny>> {
    let kind = match task {
        "embedding" => Kind::Embedding,
        "rerank" => Kind::Rerank,
        other => Kind::Head(other.parse().py()?),
    };
    let dir = open_dir(model)?;
    let given = match options {
        Some(d) => match py_to_json(d.as_any())? {
            Value::Object(m) => m,
            _ => Map::new(),
        },
        None => Map::new(),
    };
    let req = read_request(out.clone(), given)?;
    if let Kind::Head(t) = kind {
        for (name, set) in [
            ("loss", req.loss.is_some()),
            ("scale", req.scale.is_some()),
            ("pos_weight", req.pos_weight.is_some()),
        ] {
            if set {
                return Err(bad_arg(
                    name,
                    format!("applies to embedding and rerank, not {t}"),
                ));
            }
        }
    }
    let result = py.allow_threads(move || -> bertha::Result<Value> {
        let config = BertConfig::from_file(&dir.join("config.json"))?;
        // The CLI's length for the embedding and rerank objectives.
        let pair_length = req
            .max_length
            .unwrap_or_else(|| 128.min(config.max_sequence_length()));
        match kind {
            Kind::Head(task) => {
                let opts =
                    req.options
                        .clone()
                        .with_lengths(task, &config, req.max_length, req.doc_stride);
                let mut trainer =
                    Finetuner::new(task, &dir, &train, dev.as_deref(), &req.data, opts)?;
                let mut out = drive(&mut trainer, &req, &out, &on_event)?;
                out["labels"] = json!(trainer.labels().names());
                Ok(out)
            }
            Kind::Embedding => {
                let read = PairOptions {
                    skip_bad_rows: req.data.skip_bad_rows,
                    ..PairOptions::default()
                };
                let data = EmbeddingData::read(&train, &read)?;
                let dev = dev
                    .as_deref()
                    .map(|p| EmbeddingData::read(p, &read))
                    .transpose()?;
                let kind = match req.loss.as_deref() {
                    Some(name) => name.parse::<LossKind>()?,
                    None if data.layout == PairLayout::Scored => LossKind::Cosent,
                    None => LossKind::Mnrl,
                };
                let mut loss = EmbeddingLoss::new(kind);
                if let Some(s) = req.scale {
                    loss.scale = s;
                }
                let mut opts = req.options.clone();
                opts.max_length = pair_length;
                let opts = EmbeddingOptions::new(loss, opts);
                let mut trainer = EmbeddingTrainer::new(&dir, data, dev, opts)?;
                drive(&mut trainer, &req, &out, &on_event)
            }
            Kind::Rerank => {
                let mut loss: RerankLoss = req.loss.as_deref().unwrap_or("bce").parse()?;
                match &mut loss {
                    RerankLoss::Bce { pos_weight } => *pos_weight = req.pos_weight,
                    RerankLoss::Mnrl { scale } => *scale = req.scale.unwrap_or(*scale),
                    _ => {}
                }
                let mut opts = req.options.clone();
                opts.max_length = pair_length;
                let opts = RerankOptions { loss, train: opts };
                let mut trainer = RerankTrainer::new(&dir, &train, dev.as_deref(), opts)?;
                drive(&mut trainer, &req, &out, &on_event)
            }
        }
    });
    json_to_py(py, &result.py()?)
}

/// Runs `trainer` (resumed as asked), telling `on_event` what happens;
/// the run's metrics.
fn drive<O: Objective>(
    trainer: &mut Trainer<O>,
    req: &Request,
    out: &Path,
    on_event: &Option<PyObject>,
) -> bertha::Result<Value> {
    if let Some(from) = &req.resume {
        trainer.resume(&Checkpoint::find(from)?)?;
    }
    let tell = |kind: &str, data: Value| {
        if let Some(f) = on_event {
            Python::with_gil(|py| {
                if let Ok(obj) = json_to_py(py, &data) {
                    // A failing progress bar must not stop the run.
                    let _ = f.call1(py, (kind, obj));
                }
            });
        }
    };
    tell(
        "start",
        json!({"total_steps": trainer.total_steps(), "step": trainer.step()}),
    );
    let mut steps = Vec::new();
    trainer.run(|event| {
        let (kind, data) = match event {
            Event::Step(m) => {
                steps.push(m.clone());
                ("step", serde_json::to_value(m).unwrap_or(Value::Null))
            }
            Event::Eval(e) => ("eval", serde_json::to_value(e).unwrap_or(Value::Null)),
            Event::Best(e) => ("best", serde_json::to_value(e).unwrap_or(Value::Null)),
            Event::Saved(dir) => ("saved", json!({"path": dir})),
            Event::EarlyStop { step, best_step } => {
                ("early_stop", json!({"step": step, "best_step": best_step}))
            }
        };
        tell(kind, data);
    })?;
    let last = steps.last();
    Ok(json!({
        "out": out,
        "total_steps": trainer.total_steps(),
        "step": trainer.step(),
        "loss": last.map(|m| m.loss),
        "labels": [],
        "steps": steps,
        "evals": trainer.evals(),
    }))
}
