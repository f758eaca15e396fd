//! Pins the training engine's numbers: for fixed seeds, MLM (+NSP)
//! pre-training and classification / NER / QA fine-tuning on the tiny
//! fixtures give exactly the losses, gradient norms, evaluations and
//! checkpoint tensors recorded in `tests/fixtures/pinned-training.json`.
//!
//! The record was made before the training loops were merged into one
//! engine (issue 13), so any refactoring of the loop that changes a single
//! bit of a loss or a weight fails here. Re-record only for an intended
//! change of the numbers: `BERTHA_PIN_RECORD=1 cargo test --test
//! training_pin`, and say why in the commit.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bertha::data::{Corpus, CorpusOptions, DataOptions, MaskSplit, Masker, Task};
use bertha::training::{
    AdamWConfig, FinetuneOptions, Finetuner, PretrainOptions, Pretrainer, RunLength, ScheduleKind,
    Warmup,
};
use bertha::{BertConfig, Tokenizer, Weights};
use common::fixtures;
use serde_json::{json, Value};

/// One run's record: every metrics line and a digest of every tensor the
/// final model folder and the last checkpoint hold.
fn record(out: &Path) -> Value {
    let metrics = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let lines: Vec<Value> = metrics
        .lines()
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).unwrap();
            // Wall-clock figures differ from run to run.
            let o = v.as_object_mut().unwrap();
            o.remove("tokens_per_s");
            o.remove("elapsed_s");
            v
        })
        .collect();
    let mut checkpoints: Vec<PathBuf> = std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("checkpoint-"))
        })
        .collect();
    checkpoints.sort();
    let last = checkpoints.last().expect("a checkpoint");
    json!({
        "metrics": lines,
        "model": digests(&out.join("model.safetensors")),
        "checkpoint": last.file_name().unwrap().to_str().unwrap(),
        "checkpoint_model": digests(&last.join("model.safetensors")),
        "checkpoint_optimizer": digests(&last.join("optimizer.safetensors")),
    })
}

/// FNV-1a over dtype, shape and raw bytes of each tensor, by name.
fn digests(path: &Path) -> BTreeMap<String, String> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut out = BTreeMap::new();
    for (name, view) in st.tensors() {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |b: &[u8]| {
            for &x in b {
                h ^= u64::from(x);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        };
        eat(format!("{:?}{:?}", view.dtype(), view.shape()).as_bytes());
        eat(view.data());
        out.insert(name, format!("{h:016x}"));
    }
    out
}

// ---------------------------------------------------------------- the runs

fn tiny(name: &str) -> PathBuf {
    fixtures().join("tiny").join(name)
}

/// A copy of a tiny fixture with dropout switched on, so that the pinned
/// numbers cover the seeded dropout masks too.
fn with_dropout(src: &Path, dst: &Path) -> PathBuf {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
    }
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(dst.join("config.json")).unwrap()).unwrap();
    config["hidden_dropout_prob"] = json!(0.1);
    config["attention_probs_dropout_prob"] = json!(0.1);
    std::fs::write(dst.join("config.json"), config.to_string()).unwrap();
    dst.to_path_buf()
}

fn pretrain(out: &Path, nsp: bool) -> Value {
    let fixture = tiny(if nsp { "bert-pretraining" } else { "bert-mlm" });
    let tmp = out.with_extension("model");
    let model = with_dropout(&fixture, &tmp);
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
    let masker = Masker::for_tokenizer(&tok, 0.15, MaskSplit::default(), false).unwrap();
    let opts = PretrainOptions {
        batch_size: 4,
        grad_accum: 2,
        length: RunLength::Steps(6),
        warmup: Warmup::Steps(2),
        schedule: ScheduleKind::Linear,
        lr: 2e-3,
        adamw: AdamWConfig {
            max_grad_norm: Some(1.0),
            ..AdamWConfig::default()
        },
        weight_decay: 0.01,
        seed: 17,
        nsp,
        eval_every: Some(3),
        save_every: Some(4),
        save_total_limit: None,
        early_stop: None,
        out: out.to_path_buf(),
    };
    // MLM continues from the fixture's weights; NSP starts from the seed.
    let init = (!nsp).then(|| Weights::from_model_dir(&model).unwrap());
    let mut t = Pretrainer::new(
        config,
        init,
        masker,
        train,
        eval,
        opts,
        tok.pad_id(),
        &model,
    )
    .unwrap();
    t.run(|_| {}).unwrap();
    record(out)
}

const SENTIMENT: &str = "sentence\tlabel\n\
    the album was very good\tpositive\n\
    i love this great song\tpositive\n\
    the best film of the year\tpositive\n\
    a bad and dark story\tnegative\n\
    the game was lost again\tnegative\n\
    nothing was good about the war\tnegative\n\
    it was fine i guess\tneutral\n";

const CONLL: &str = "-DOCSTART- O\n\n\
    john B-PER\nwent O\nto O\nparis B-LOC\n\n\
    paul B-PER\nand O\njames B-PER\nlive O\nin O\nlondon B-LOC\n\n\
    the O\nking O\nof O\nfrance B-LOC\nmet O\nmary B-PER\n\n\
    peter B-PER\nsmith I-PER\nplayed O\nin O\nthe O\npark O\n\n\
    david B-PER\nwas O\nborn O\nin O\nnew B-LOC\nyork I-LOC\n";

fn squad_json() -> String {
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

fn finetune(out: &Path, task: Task) -> Value {
    let (fixture, name, body) = match task {
        Task::Classification => ("bert-seqcls", "train.tsv", SENTIMENT.to_string()),
        Task::Ner => ("bert-tokcls", "train.conll", CONLL.to_string()),
        Task::Qa => ("bert-qa", "squad.json", squad_json()),
    };
    let model = with_dropout(&tiny(fixture), &out.with_extension("model"));
    let data = out.with_extension(name);
    std::fs::write(&data, body).unwrap();
    let opts = FinetuneOptions {
        epochs: 2.5,
        lr: 5e-3,
        batch_size: 2,
        eval_batch_size: 3,
        max_length: if task == Task::Qa { 24 } else { 32 },
        doc_stride: 8,
        warmup_ratio: 0.2,
        weight_decay: 0.01,
        seed: 3,
        save_every: Some(4),
        out: out.to_path_buf(),
        ..FinetuneOptions::default()
    };
    let mut t = Finetuner::new(
        task,
        &model,
        &data,
        Some(&data),
        &DataOptions::default(),
        opts,
    )
    .unwrap();
    t.run(|_| {}).unwrap();
    record(out)
}

// ---------------------------------------------------------------- the pin

fn pinned_path() -> PathBuf {
    fixtures().join("pinned-training.json")
}

#[test]
fn training_numbers_are_pinned() {
    // The CPU mode the CLI and server run in (denormals flushed).
    bertha::cpu_mode::flush_denormals();
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path();
    let mut runs = BTreeMap::new();
    runs.insert("pretrain_mlm", pretrain(&p.join("mlm"), false));
    runs.insert("pretrain_nsp", pretrain(&p.join("nsp"), true));
    runs.insert(
        "finetune_classification",
        finetune(&p.join("cls"), Task::Classification),
    );
    runs.insert("finetune_ner", finetune(&p.join("ner"), Task::Ner));
    runs.insert("finetune_qa", finetune(&p.join("qa"), Task::Qa));
    let got = json!(runs);
    if std::env::var_os("BERTHA_PIN_RECORD").is_some() {
        let text = serde_json::to_string_pretty(&got).unwrap();
        std::fs::write(pinned_path(), text + "\n").unwrap();
        return;
    }
    let want = common::read_json(&pinned_path());
    for (name, run) in want.as_object().unwrap() {
        let ours = &got[name];
        for key in [
            "checkpoint",
            "model",
            "checkpoint_model",
            "checkpoint_optimizer",
        ] {
            assert_eq!(ours[key], run[key], "{name}: {key}");
        }
        let (a, b) = (
            ours["metrics"].as_array().unwrap(),
            run["metrics"].as_array().unwrap(),
        );
        assert_eq!(a.len(), b.len(), "{name}: metrics lines");
        for (x, y) in a.iter().zip(b) {
            // Every recorded key with the same value, bit for bit (JSON
            // numbers are written in their shortest exact form).
            for (k, v) in y.as_object().unwrap() {
                assert_eq!(&x[k], v, "{name}: `{k}` in {x}");
            }
        }
    }
}
