//! Short training runs on the tiny fixtures, one per objective (MLM, MLM +
//! NSP, classification, NER, QA), for the tests of the training loop.

use std::path::{Path, PathBuf};

use bertha::data::{Corpus, CorpusOptions, DataOptions, MaskSplit, Masker, Task};
use bertha::training::{
    Engine, FinetuneOptions, Finetuner, LoopOptions, ModelSetup, PretrainData, PretrainOptions,
    Pretrainer, RunLength, Warmup,
};
use bertha::{BertConfig, Tensor, Tokenizer, Weights};
use serde_json::{json, Value};

use super::fixtures;

/// The loop options a test varies, applied to either objective's options.
#[derive(Debug, Clone)]
pub struct Tweak {
    pub batch_size: usize,
    pub grad_accum: usize,
    pub lr: f64,
    pub dropout: f64,
    pub eval_every: Option<u64>,
    pub save_every: Option<u64>,
    pub save_total_limit: Option<usize>,
    pub early_stop: Option<usize>,
    /// A tensor of the initial weights set to NaN.
    pub poison: Option<&'static str>,
    pub overwrite: bool,
    pub allow_changes: Vec<String>,
    pub engine: Engine,
    /// The corruption split of training, and of held-out scoring when
    /// given (`PretrainData::eval_masker`).
    pub mask_split: MaskSplit,
    pub eval_mask_split: Option<MaskSplit>,
}

impl Default for Tweak {
    fn default() -> Self {
        Self {
            batch_size: 2,
            grad_accum: 1,
            lr: 5e-3,
            dropout: 0.1,
            eval_every: None,
            save_every: None,
            save_total_limit: None,
            early_stop: None,
            poison: None,
            overwrite: false,
            allow_changes: Vec::new(),
            engine: Engine::Auto,
            mask_split: MaskSplit::default(),
            eval_mask_split: None,
        }
    }
}

pub fn tiny(name: &str) -> PathBuf {
    fixtures().join("tiny").join(name)
}

/// A copy of a tiny fixture into `dst` with dropout `p` and, if asked, one
/// tensor poisoned with `f32::MAX` (finite, so the checkpoint loads; its
/// activations overflow, so the first loss is NaN).
pub fn tiny_copy(src: &Path, dst: &Path, p: f64, poison: Option<&str>) -> PathBuf {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
    }
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(dst.join("config.json")).unwrap()).unwrap();
    config["hidden_dropout_prob"] = json!(p);
    config["attention_probs_dropout_prob"] = json!(p);
    std::fs::write(dst.join("config.json"), config.to_string()).unwrap();
    if let Some(name) = poison {
        let path = dst.join("model.safetensors");
        let mut tensors = super::load_safetensors(&path);
        let t = &tensors[name];
        let huge = Tensor::full(f32::MAX, t.dims(), t.device()).unwrap();
        tensors.insert(name.to_string(), huge);
        candle_core::safetensors::save(&tensors, &path).unwrap();
    }
    dst.to_path_buf()
}

/// MLM (+NSP) on the wiki slice: 6 steps of batch `t.batch_size`, the MLM
/// run continuing from the fixture's weights, the NSP run from the seed.
pub fn pretrainer(out: &Path, nsp: bool, t: &Tweak) -> Pretrainer {
    let fixture = tiny(if nsp { "bert-pretraining" } else { "bert-mlm" });
    let model = tiny_copy(&fixture, &out.with_extension("model"), t.dropout, t.poison);
    let tok = Tokenizer::from_dir(&model, 64).unwrap();
    let config = BertConfig::from_file(&model.join("config.json")).unwrap();
    let corpus_opts = CorpusOptions {
        seq_len: 32,
        nsp,
        seed: 5,
    };
    let corpus = fixtures().join("corpus-wiki-slice.txt");
    let mut train = Corpus::read(&[corpus], &tok, &corpus_opts).unwrap();
    let eval = train.split_off_last(6);
    let masker = Masker::for_tokenizer(&tok, 0.15, t.mask_split, false).unwrap();
    let eval_masker = t.eval_mask_split.map(|split| Masker {
        split,
        ..masker.clone()
    });
    let opts = PretrainOptions {
        nsp,
        train: LoopOptions {
            batch_size: t.batch_size,
            grad_accum: t.grad_accum,
            length: RunLength::Steps(6),
            warmup: Warmup::Steps(2),
            lr: t.lr,
            seed: 17,
            drop_last: true,
            eval_every: t.eval_every,
            save_every: t.save_every,
            save_total_limit: t.save_total_limit,
            early_stop: t.early_stop,
            overwrite: t.overwrite,
            allow_changes: t.allow_changes.clone(),
            engine: t.engine,
            ..LoopOptions::new(out)
        },
    };
    let init = (!nsp || t.poison.is_some()).then(|| Weights::from_model_dir(&model).unwrap());
    Pretrainer::new(
        ModelSetup {
            config,
            init,
            tokenizer_source: model,
        },
        PretrainData {
            train: train.into(),
            eval: eval.into(),
            masker,
            eval_masker,
            pad_id: tok.pad_id(),
        },
        opts,
    )
    .unwrap()
}

pub const SENTIMENT: &str = "sentence\tlabel\n\
    the album was very good\tpositive\n\
    i love this great song\tpositive\n\
    the best film of the year\tpositive\n\
    a bad and dark story\tnegative\n\
    the game was lost again\tnegative\n\
    nothing was good about the war\tnegative\n\
    it was fine i guess\tneutral\n";

pub const CONLL: &str = "-DOCSTART- O\n\n\
    john B-PER\nwent O\nto O\nparis B-LOC\n\n\
    paul B-PER\nand O\njames B-PER\nlive O\nin O\nlondon B-LOC\n\n\
    the O\nking O\nof O\nfrance B-LOC\nmet O\nmary B-PER\n\n\
    peter B-PER\nsmith I-PER\nplayed O\nin O\nthe O\npark O\n\n\
    david B-PER\nwas O\nborn O\nin O\nnew B-LOC\nyork I-LOC\n";

/// SWAG's columns, as `run_swag.py` reads them
/// (`tests/fixtures/finetune/swag-style.csv`): the right ending names what
/// the context's first word does.
pub fn swag() -> String {
    std::fs::read_to_string(fixtures().join("finetune/swag-style.csv")).unwrap()
}

pub fn squad_json() -> String {
    let qa = |id: &str, q: &str, context: &str, answer: &str| {
        let start = context.find(answer).unwrap();
        json!({"id": id, "question": q,
            "answers": [{"text": answer, "answer_start": start}]})
    };
    let c1 = "john played the music in the park with his band and the band was founded in london by paul";
    let c2 = "the company released the album in june and it was the best song of the year";
    json!({"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": c1, "qas": [
            qa("q1", "who played the music", c1, "john"),
            qa("q2", "where was the band founded", c1, "london"),
            qa("q3", "who founded the band", c1, "paul"),
        ]},
        {"context": c2, "qas": [
            qa("q4", "what did the company release", c2, "the album"),
            qa("q5", "when was the album released", c2, "june"),
        ]},
    ]}]})
    .to_string()
}

/// Fine-tuning `task` for 2.5 epochs on its small data set (dev = train).
pub fn finetuner(out: &Path, task: Task, t: &Tweak) -> Finetuner {
    let (fixture, name, body) = match task {
        Task::Classification => ("bert-seqcls", "train.tsv", SENTIMENT.to_string()),
        Task::Ner => ("bert-tokcls", "train.conll", CONLL.to_string()),
        Task::Qa => ("bert-qa", "squad.json", squad_json()),
        Task::MultipleChoice => ("bert-multiple-choice", "swag.csv", swag()),
    };
    let model = tiny_copy(
        &tiny(fixture),
        &out.with_extension("model"),
        t.dropout,
        t.poison,
    );
    let data = out.with_extension(name);
    std::fs::write(&data, body).unwrap();
    let opts = FinetuneOptions {
        epochs: 2.5,
        lr: t.lr,
        batch_size: t.batch_size,
        grad_accum: t.grad_accum,
        eval_batch_size: 3,
        max_length: if task == Task::Qa { 24 } else { 32 },
        doc_stride: 8,
        warmup_ratio: 0.2,
        weight_decay: 0.01,
        seed: 3,
        eval_every: t.eval_every,
        save_every: t.save_every.or(Some(4)),
        save_total_limit: t.save_total_limit.or(Some(1)),
        early_stop: t.early_stop,
        out: out.to_path_buf(),
        overwrite: t.overwrite,
        allow_changes: t.allow_changes.clone(),
        engine: t.engine,
        ..FinetuneOptions::default()
    };
    Finetuner::new(
        task,
        &model,
        &data,
        Some(&data),
        &DataOptions::default(),
        opts,
    )
    .unwrap()
}
