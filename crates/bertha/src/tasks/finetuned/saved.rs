//! A fine-tuned checkpoint in use (`bertha evaluate` / `predict`): its
//! task head loaded from the folder, inputs cut as its run cut them (the
//! folder's `training_args.json`), predictions and scores on a data file.

use std::path::Path;

use candle_core::Device;

use super::{infer, Evaluation, Outputs, Predictions, Scorer, TaskHead, TRAINING_ARGS_FILE};
use crate::config::BertConfig;
use crate::data::{
    DataOptions, LabelSet, PostprocessOptions, Task, TaskData, TaskInputBuilder, TaskInputs,
};
use crate::error::{Error, Result};
use crate::fast::Precision;
use crate::io::tokenizer::Tokenizer;

/// What scoring a saved model takes from its `training_args.json`: the
/// input shapes it was trained with.
#[derive(Debug, Clone, Copy, serde::Deserialize)]
struct TrainedShapes {
    max_length: usize,
    doc_stride: usize,
    max_answer_length: usize,
}

fn read_trained_shapes(dir: &Path) -> Result<Option<TrainedShapes>> {
    let p = dir.join(TRAINING_ARGS_FILE);
    if !p.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&p).map_err(|e| Error::io(&p, e))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|source| Error::Json { path: p, source })
}

/// Options for scoring a saved model; `None` takes the value the model was
/// trained with (its `training_args.json`), else the task's default.
#[derive(Debug, Clone)]
pub struct InferenceOptions {
    pub max_length: Option<usize>,
    pub doc_stride: Option<usize>,
    pub max_answer_length: Option<usize>,
    pub batch_size: Option<usize>,
    /// The encoder's number format, as [`super::PipelineOptions::precision`]
    /// (the head stays fp32; the loss at bf16 / int8 reads zeros at padded
    /// positions, which only QA's loss covers).
    pub precision: Precision,
    /// fp32 on the packed fast path where it takes the model, as
    /// [`super::PipelineOptions::fast_f32`] (default on), but for QA (whose
    /// loss reads the padding rows) and a multiple-choice head that reads
    /// them; `false`: the candle modules, bit for bit the numbers a
    /// fine-tuning run's evaluation gives.
    pub fast_f32: bool,
}

impl Default for InferenceOptions {
    fn default() -> Self {
        Self {
            max_length: None,
            doc_stride: None,
            max_answer_length: None,
            batch_size: None,
            precision: Precision::F32,
            fast_f32: true,
        }
    }
}

/// A fine-tuned checkpoint, for `evaluate` and `predict`.
pub struct FinetunedModel {
    task: Task,
    head: TaskHead,
    inputs: TaskInputBuilder,
    /// The checkpoint's own label names (`None`: transformers'
    /// placeholders, so the data's sorted labels give the ids).
    labels: Option<LabelSet>,
    post: PostprocessOptions,
    batch_size: usize,
    device: Device,
}

impl FinetunedModel {
    /// Loads a folder written by a fine-tuning run (or transformers'
    /// `save_pretrained` of the task's head class): the head's tensors
    /// must be there.
    pub fn from_dir(
        task: Task,
        dir: &Path,
        opts: &InferenceOptions,
        device: &Device,
    ) -> Result<Self> {
        let mut head = TaskHead::from_dir(task, dir, device)?;
        let config = head.config().clone();
        let origin = dir.join("config.json");
        let trained = read_trained_shapes(dir)?;
        let max_length = opts
            .max_length
            .or(trained.as_ref().map(|t| t.max_length))
            .unwrap_or_else(|| task.default_max_length())
            .min(config.max_sequence_length());
        let doc_stride = opts
            .doc_stride
            .or(trained.as_ref().map(|t| t.doc_stride))
            .unwrap_or(128)
            .min(max_length / 2);
        let max_answer_length = opts
            .max_answer_length
            .or(trained.as_ref().map(|t| t.max_answer_length))
            .unwrap_or(30);
        let tokenizer = Tokenizer::from_dir(dir, max_length)?;
        head.set_precision(&tokenizer, opts.precision, opts.fast_f32)?;
        let labels = match task.has_label_names() {
            false => None,
            true => LabelSet::from_config(&config)
                .map_err(|e| Error::config(&origin, "id2label", e.to_string()))?,
        };
        if task.has_label_names() && config.num_labels() < 2 {
            return Err(Error::config(
                &origin,
                "id2label",
                format!(
                    "{} label(s): `{task}` needs a classifier over at least two",
                    config.num_labels()
                ),
            ));
        }
        Ok(Self {
            task,
            head,
            inputs: TaskInputBuilder::new(&tokenizer, max_length, doc_stride)?,
            labels,
            post: PostprocessOptions {
                max_answer_length,
                ..PostprocessOptions::default()
            },
            batch_size: opts.batch_size.unwrap_or(64).max(1),
            device: device.clone(),
        })
    }

    pub fn task(&self) -> Task {
        self.task
    }

    pub fn config(&self) -> &BertConfig {
        self.head.config()
    }

    /// The precision the encoder runs at.
    pub fn precision(&self) -> Precision {
        self.head.encoder.precision()
    }

    /// The token budget inputs are cut to.
    pub fn max_length(&self) -> usize {
        self.inputs.max_length
    }

    /// Reads a labelled data file for [`FinetunedModel::evaluate`], with the
    /// checkpoint's label ids (an unknown label is an error naming its
    /// line). A checkpoint with transformers' placeholder names
    /// (`LABEL_0`, ...) takes the file's sorted labels as ids, as
    /// `run_glue.py` does.
    pub fn read_labelled(&self, path: &Path, data: &DataOptions) -> Result<TaskData> {
        let labels = self.labels.as_ref().filter(|_| self.task.has_label_names());
        let d = TaskData::read(self.task, path, labels, false, data)?;
        if let (Some(l), None) = (d.labels(), &self.labels) {
            let n = self.config().num_labels();
            if l.len() > n {
                return Err(Error::Input(format!(
                    "{}: {} labels ({}), but the model has {n} classes",
                    path.display(),
                    l.len(),
                    l.listed()
                )));
            }
        }
        Ok(d)
    }

    /// Reads a data file for [`FinetunedModel::predict`]: a classification
    /// file may lack its label column, and labels are not checked.
    pub fn read_unlabelled(&self, path: &Path, data: &DataOptions) -> Result<TaskData> {
        TaskData::read(self.task, path, None, true, data)
    }

    fn check_task(&self, data: &TaskData) -> Result<()> {
        if data.task() != self.task {
            return Err(Error::Input(format!(
                "{}: read as {} data, but the model is for {}",
                data.path().display(),
                data.task(),
                self.task
            )));
        }
        Ok(())
    }

    /// The label names predictions are given by.
    fn label_names(&self, data: Option<&LabelSet>) -> Result<LabelSet> {
        Ok(match (&self.labels, data) {
            (Some(l), _) => l.clone(),
            (None, Some(l)) if !l.is_empty() => l.clone(),
            _ => {
                let c = self.config();
                LabelSet::from_names((0..c.num_labels()).map(|i| c.label_name(i)).collect())?
            }
        })
    }

    /// The model's outputs on `data` (with its targets, or ignoring them).
    fn infer(&self, data: &TaskData, targets: bool) -> Result<(TaskInputs, Outputs, Option<f64>)> {
        self.check_task(data)?;
        let prepared = self.inputs.build(data, targets)?;
        let pad_id = self.inputs.tokenizer.pad_id();
        let (outputs, loss) = infer(
            &self.head,
            &prepared.items,
            self.batch_size,
            pad_id,
            &self.device,
        )?;
        Ok((prepared, outputs, loss))
    }

    fn scorer<'a>(&'a self, labels: &'a LabelSet) -> Scorer<'a> {
        Scorer {
            labels,
            config: self.config(),
            post: self.post,
        }
    }

    /// Scores on a file read by [`FinetunedModel::read_labelled`], with the
    /// predictions they were computed from.
    pub fn evaluate(&self, data: &TaskData) -> Result<Evaluation> {
        let (prepared, outputs, loss) = self.infer(data, true)?;
        let labels = self.label_names(data.labels())?;
        self.scorer(&labels).score(data, &prepared, outputs, loss)
    }

    /// Predictions for every example of `data`, in file order (labels, if
    /// the file has them, are ignored).
    pub fn predict(&self, data: &TaskData) -> Result<Predictions> {
        let (prepared, outputs, _) = self.infer(data, false)?;
        let labels = self.label_names(None)?;
        self.scorer(&labels).predictions(data, &prepared, outputs)
    }
}
