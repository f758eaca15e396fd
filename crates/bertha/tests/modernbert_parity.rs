//! ModernBERT on the candle modules against transformers 5.24
//! (`tests/fixtures/families/modernbert-*`, made by
//! `make_family_fixtures.py`): logits, every hidden state and attention
//! map at non-padded positions within 1e-4, losses within 1e-5 relative,
//! the gradients of the listed parameters within 1e-4 of the tensor's max
//! abs value; both config layouts, every head, a 200-token input whose
//! sliding window matters; the byte-level BPE tokenizer's ids exactly.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;

use bertha::fast::train::{FinetuneHead, MlmHead};
use bertha::fast::{PackedBert, Precision};
use bertha::tasks::{FillMask, PipelineOptions};
use bertha::training::checkpoint::CheckpointParts;
use bertha::training::{Checkpoint, ParamStore};
use bertha::{
    BertConfig, BertForTask, BertInput, BertModel, DType, Device, ForwardOptions, HeadInit,
    HeadKind, HeadLabels, HeadOptions, Tensor, Tokenizer, Weights,
};
use candle_nn::{VarBuilder, VarMap};
use common::{fixtures, load_safetensors, read_json};

const HEADS: [&str; 4] = [
    "modernbert-mlm",
    "modernbert-mlm-legacy",
    "modernbert-seqcls",
    "modernbert-tokcls",
];

fn dir_of(name: &str) -> PathBuf {
    fixtures().join("families").join(name)
}

struct Case {
    input: BertInput,
    lens: Vec<usize>,
    /// `None` for the bare encoder (`modernbert-long`).
    labels: Option<Tensor>,
    expected: HashMap<String, Tensor>,
    grad_params: Vec<String>,
    dir: PathBuf,
}

fn case(name: &str) -> Case {
    let dir = dir_of(name);
    let inputs = read_json(&dir.join("inputs.json"));
    let get =
        |k: &str| -> Vec<Vec<u32>> { serde_json::from_value(inputs["inputs"][k].clone()).unwrap() };
    let (ids, mask) = (get("input_ids"), get("attention_mask"));
    let (b, t) = (ids.len(), ids[0].len());
    let flat = |v: &Vec<Vec<u32>>| Tensor::from_vec(v.concat(), (b, t), &Device::Cpu).unwrap();
    let labels = inputs.get("labels").map(|l| {
        let l = &l["labels"];
        // [B] class ids, or [B, T] token labels (-100 where none).
        match serde_json::from_value::<Vec<Vec<i64>>>(l.clone()) {
            Ok(rows) => Tensor::from_vec(rows.concat(), (b, t), &Device::Cpu).unwrap(),
            Err(_) => {
                let ids: Vec<i64> = serde_json::from_value(l.clone()).unwrap();
                Tensor::from_vec(ids, b, &Device::Cpu).unwrap()
            }
        }
    });
    Case {
        input: BertInput {
            input_ids: flat(&ids),
            token_type_ids: None,
            attention_mask: Some(flat(&mask)),
        },
        lens: mask
            .iter()
            .map(|m| m.iter().filter(|&&x| x == 1).count())
            .collect(),
        labels,
        expected: load_safetensors(&dir.join("expected.safetensors")),
        grad_params: inputs
            .get("grad_params")
            .map(|g| serde_json::from_value(g.clone()).unwrap())
            .unwrap_or_default(),
        dir,
    }
}

fn all_outputs() -> ForwardOptions {
    ForwardOptions {
        output_hidden_states: true,
        output_attentions: true,
        train: false,
    }
}

/// The worst differences of hidden states and attentions [L(+1), B, ...]
/// against the fixture's, at non-padded positions.
fn diff_layers(c: &Case, hidden: Vec<Tensor>, att: Vec<Tensor>) -> (f32, f32) {
    let want_hidden = &c.expected["hidden_states"];
    let want_att = &c.expected["attentions"];
    assert_eq!(hidden.len(), want_hidden.dim(0).unwrap(), "hidden states");
    assert_eq!(att.len(), want_att.dim(0).unwrap(), "attentions");
    let hidden = Tensor::stack(&hidden, 0).unwrap().transpose(0, 1).unwrap();
    let att = Tensor::stack(&att, 0).unwrap().transpose(0, 1).unwrap();
    let want_hidden = want_hidden.transpose(0, 1).unwrap();
    let want_att = want_att.transpose(0, 1).unwrap();
    assert_eq!(hidden.dims(), want_hidden.dims());
    assert_eq!(att.dims(), want_att.dims());
    let (mut dh, mut da) = (0f32, 0f32);
    for (b, &n) in c.lens.iter().enumerate() {
        dh = dh.max(common::diff_unpadded(&hidden, &want_hidden, b, n, &[1]));
        da = da.max(common::diff_unpadded(&att, &want_att, b, n, &[2, 3]));
    }
    (dh, da)
}

/// (logits, hidden, attentions, loss rel) of a head fixture, its head
/// picked by `architectures`.
fn check_head(name: &str) -> (f32, f32, f32, f32) {
    let c = case(name);
    let m = BertForTask::from_dir(&c.dir, None, HeadInit::FromCheckpoint, &Device::Cpu)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let labels = HeadLabels::labels(c.labels.as_ref());
    let out = m
        .forward(&c.input, &labels, HeadOptions::from(all_outputs()))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let bertha::model::TaskOutput::Logits(out) = out else {
        panic!("{name}: not a logits head")
    };
    let want_logits = &c.expected["logits"];
    assert_eq!(out.logits.dims(), want_logits.dims(), "{name}: logits");
    let mut dl = 0f32;
    if out.logits.rank() == 3 {
        for (b, &n) in c.lens.iter().enumerate() {
            dl = dl.max(common::diff_unpadded(&out.logits, want_logits, b, n, &[0]));
        }
    } else {
        dl = common::max_abs_diff(&out.logits, want_logits);
    }
    let (dh, da) = diff_layers(&c, out.hidden_states.unwrap(), out.attentions.unwrap());
    let got_loss = common::scalar(&out.loss.expect("loss"));
    let want_loss = common::scalar(&c.expected["loss"]);
    (dl, dh, da, ((got_loss - want_loss) / want_loss).abs())
}

#[test]
fn modernbert_heads_match_transformers() {
    let mut failures = Vec::new();
    for name in HEADS {
        let (dl, dh, da, rel) = check_head(name);
        println!(
            "{name}: logits {dl:.2e}, hidden {dh:.2e}, attentions {da:.2e}, loss rel {rel:.2e}"
        );
        if dl > 1e-4 || dh > 1e-4 || da > 1e-4 || rel > 1e-5 {
            failures.push(format!(
                "{name}: logits {dl:e}, hidden {dh:e}, attentions {da:e}, loss rel {rel:e}"
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// 200 tokens with a window of 16: most pairs lie outside the window of
/// the sliding layers.
#[test]
fn modernbert_long_input_matches_transformers() {
    let c = case("modernbert-long");
    let m = BertModel::from_dir(&c.dir, &Device::Cpu).unwrap();
    let out = m.forward(&c.input, all_outputs()).unwrap();
    let dl = common::max_abs_diff(&out.last_hidden_state, &c.expected["last_hidden_state"]);
    let att = out.attentions.unwrap();
    let (dh, da) = diff_layers(&c, out.hidden_states.unwrap(), att.clone());
    println!("modernbert-long: last {dl:.2e}, hidden {dh:.2e}, attentions {da:.2e}");
    assert!(
        dl <= 1e-4 && dh <= 1e-4 && da <= 1e-4,
        "last {dl:e}, hidden {dh:e}, attentions {da:e}"
    );
    // The window is real: a sliding layer gives no weight beyond ±8.
    let row = att[1]
        .get(0)
        .unwrap()
        .get(0)
        .unwrap()
        .get(100)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    // (The fused softmax's exp bottoms out at ~3e-39, not 0.)
    let outside = row[..92]
        .iter()
        .chain(&row[109..])
        .fold(0f32, |m, &p| m.max(p));
    assert!(outside < 1e-30, "{outside:e}");
    assert!(row[92..109].iter().all(|&p| p > 0.0));
}

/// Every listed parameter (embeddings, a fused `Wqkv`, a GeGLU `Wi`, the
/// norms, the head) gets transformers' gradient for the head's loss.
#[test]
fn modernbert_gradients_match_transformers() {
    let mut failures = Vec::new();
    for name in HEADS {
        let c = case(name);
        let config = BertConfig::from_file(&c.dir.join("config.json")).unwrap();
        let kind = BertForTask::kind_from_config(&config, &c.dir).unwrap();
        let mut varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let m = BertForTask::load(vb, config, kind).unwrap();
        varmap.load(c.dir.join("model.safetensors")).unwrap();
        let labels = HeadLabels::labels(c.labels.as_ref());
        let out = m
            .forward(&c.input, &labels, HeadOptions::default())
            .unwrap();
        let grads = out.loss().unwrap().backward().unwrap();
        let vars = varmap.data().lock().unwrap();
        assert!(!c.grad_params.is_empty(), "{name}");
        failures.extend(common::gradient_failures(
            name,
            &grads,
            &vars,
            &c.grad_params,
            &c.expected,
        ));
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The byte-level BPE `tokenizer.json` (no `vocab.txt`) gives
/// transformers' ids, pairs included.
#[test]
fn modernbert_tokenizer_matches_transformers() {
    let dir = dir_of("modernbert-mlm");
    assert!(!dir.join("vocab.txt").exists());
    let tok = Tokenizer::from_dir(&dir, 64).unwrap();
    assert_eq!(tok.pad_id(), 1);
    let cases = read_json(&dir.join("tokenizer_cases.json"));
    let cases = cases.as_array().unwrap();
    assert_eq!(cases.len(), 21);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = serde_json::from_value(case["input_ids"].clone()).unwrap();
        let got = match case.get("text_pair") {
            Some(pair) => tok.encode_pair(text, pair.as_str().unwrap()).unwrap(),
            None => tok.encode(text).unwrap(),
        };
        assert_eq!(got.input_ids, want, "{text:?}");
    }
}

/// ModernBERT takes the packed inference fast path (its parity:
/// `modernbert_fast.rs`), and a reduced precision with it; the training
/// fast path runs its MLM head and its classifiers (parity:
/// `fast_modernbert_training.rs`).
#[test]
fn modernbert_infers_and_trains_on_the_fast_paths() {
    for name in HEADS {
        let m = BertForTask::from_dir(&dir_of(name), None, HeadInit::FromCheckpoint, &Device::Cpu)
            .unwrap();
        assert!(
            PackedBert::from_model(m.bert()).unwrap().is_some(),
            "{name}"
        );
        let mlm = m.kind() == HeadKind::MaskedLM;
        assert_eq!(MlmHead::of(&m).unwrap().is_some(), mlm, "{name}");
        assert_eq!(FinetuneHead::of(&m).unwrap().is_some(), !mlm, "{name}");
    }
    let opts = PipelineOptions {
        precision: Precision::Int8,
        ..Default::default()
    };
    let fm = FillMask::from_dir_with(&dir_of("modernbert-mlm"), &Device::Cpu, &opts).unwrap();
    assert_eq!(fm.precision(), Precision::Int8);
    assert_eq!(fm.fill("the movie was [MASK] good", 3).unwrap()[0].len(), 3);
}

/// Both config layouts describe the same model, and a config written back
/// reads as the same config.
#[test]
fn modernbert_configs_agree_and_round_trip() {
    let new = BertConfig::from_file(&dir_of("modernbert-mlm").join("config.json")).unwrap();
    let legacy =
        BertConfig::from_file(&dir_of("modernbert-mlm-legacy").join("config.json")).unwrap();
    assert_eq!(new, legacy);
    for cfg in [&new, &legacy] {
        let text = cfg.to_json().to_string();
        let back = BertConfig::from_json_str(&text, std::path::Path::new("written.json")).unwrap();
        assert_eq!(&back, cfg);
    }
}

/// A ModernBERT built and saved by bertha (fresh weights) loads back with
/// the same outputs, and the saved tensors carry transformers' names: the
/// fused `Wqkv`, no `attn_norm` in layer 0, no bias where the config has
/// none, no `decoder.weight` (tied to `tok_embeddings`).
#[test]
fn modernbert_saved_by_bertha_loads_back() {
    for (name, kind) in [
        ("modernbert-mlm", HeadKind::MaskedLM),
        ("modernbert-seqcls", HeadKind::SequenceClassification),
        ("modernbert-tokcls", HeadKind::TokenClassification),
    ] {
        let src = dir_of(name);
        let config = BertConfig::from_file(&src.join("config.json")).unwrap();
        let (mut params, vb) = ParamStore::builder(None, "model.", 7, &Device::Cpu);
        let model = BertForTask::load(vb, config.clone(), kind).unwrap();
        params.freeze().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join(name);
        let parts = CheckpointParts {
            config: &config,
            params: &params,
            optimizer: None,
            state: None,
            tokenizer_source: &src,
        };
        Checkpoint::save_model_files(&out, &parts).unwrap();

        let saved = Weights::from_model_dir(&out).unwrap();
        let mut names: Vec<&str> = saved.names().collect();
        names.sort_unstable();
        let theirs = Weights::from_model_dir(&src).unwrap();
        let mut want: Vec<&str> = theirs.names().collect();
        want.sort_unstable();
        assert_eq!(
            names, want,
            "{name}: the saved tensors are transformers' own"
        );
        assert!(names.contains(&"model.layers.0.attn.Wqkv.weight"));
        assert!(!names.contains(&"model.layers.0.attn_norm.weight"));

        let back =
            BertForTask::from_dir(&out, None, HeadInit::FromCheckpoint, &Device::Cpu).unwrap();
        assert_eq!(back.kind(), kind, "{name}");
        let c = case(name);
        let logits = |m: &BertForTask| {
            let out = m
                .forward(&c.input, &HeadLabels::default(), HeadOptions::default())
                .unwrap();
            let bertha::model::TaskOutput::Logits(out) = out else {
                panic!("{name}: not a logits head")
            };
            out.logits
        };
        let d = common::max_abs_diff(&logits(&model), &logits(&back));
        assert_eq!(d, 0.0, "{name}: logits after the round trip");
        assert!(
            out.join("tokenizer.json").is_file(),
            "{name}: tokenizer copied"
        );
    }
}

/// Fine-tuning a ModernBERT classifier on the candle modules: its dev loss
/// falls on the examples it learns; `auto` and `fast` take the training
/// fast engine (question answering: modernbert_qa.rs).
#[test]
fn modernbert_finetunes_on_the_candle_path() {
    use bertha::data::{DataOptions, Task};
    use bertha::training::{Engine, FinetuneOptions, Finetuner};
    let tmp = tempfile::tempdir().unwrap();
    let sst2 = fixtures().join("finetune/sst2-dev-head.tsv");
    let model = dir_of("modernbert-seqcls");
    let options = |engine: Engine, name: &str| FinetuneOptions {
        epochs: 8.0,
        lr: 3e-3,
        batch_size: 8,
        eval_batch_size: 64,
        max_length: 32,
        seed: 0,
        engine,
        out: tmp.path().join(name),
        ..FinetuneOptions::default()
    };
    let new = |task: Task, engine: Engine, name: &str| {
        let opts = options(engine, name);
        Finetuner::new(
            task,
            &model,
            &sst2,
            Some(&sst2),
            &DataOptions::default(),
            opts,
        )
    };
    // `auto` and `fast` take the training fast engine (its parity:
    // fast_modernbert_training.rs); this run is the candle modules'.
    for engine in [Engine::Auto, Engine::Fast] {
        let t = new(Task::Classification, engine, "fast").unwrap();
        assert!(t.on_fast_path(), "{engine:?}");
    }

    let mut t = new(Task::Classification, Engine::Candle, "candle").unwrap();
    assert!(!t.on_fast_path());
    let before = t.evaluate().unwrap().unwrap();
    t.run(|_| {}).unwrap();
    let after = t.evaluate().unwrap().unwrap();
    let (b, a) = (before.loss.unwrap(), after.loss.unwrap());
    println!(
        "dev loss {b:.4} -> {a:.4}, scores {:?} -> {:?}",
        before.scores, after.scores
    );
    assert!(a < 0.5 * b, "dev loss {b} -> {a}");

    // The saved model scores the same when loaded back for `evaluate`.
    use bertha::data::TaskData;
    use bertha::tasks::{FinetunedModel, InferenceOptions};
    let saved = tmp.path().join("candle");
    let m = FinetunedModel::from_dir(
        Task::Classification,
        &saved,
        &InferenceOptions::default(),
        &Device::Cpu,
    )
    .unwrap();
    let data = TaskData::read(
        Task::Classification,
        &sst2,
        None,
        false,
        &DataOptions::default(),
    )
    .unwrap();
    let again = m.evaluate(&data).unwrap();
    assert_eq!(again.scores, after.scores);
    assert!(
        (again.loss.unwrap() - a).abs() <= 1e-5 * a.max(1e-3),
        "{:?} vs {a}",
        again.loss
    );
}

/// MLM pre-training from scratch runs a ModernBERT (the `modernbert-mini`
/// preset's family, at a test's size) on the fast engine: the loss falls
/// and the run saves `ModernBertForMaskedLM` under transformers' names.
#[test]
fn modernbert_pretrains_from_scratch() {
    use bertha::data::{Corpus, CorpusOptions, MaskSplit, Masker};
    use bertha::training::presets::Preset;
    use bertha::training::{
        Engine, Event, LoopOptions, ModelSetup, PretrainData, PretrainOptions, Pretrainer,
        RunLength, Warmup,
    };
    let preset = Preset::parse("modernbert-mini").unwrap().config(1000, 128);
    assert_eq!(preset.model_type, "modernbert");
    assert_eq!((preset.num_hidden_layers, preset.hidden_size), (4, 256));

    let tmp = tempfile::tempdir().unwrap();
    let text = tmp.path().join("few.txt");
    let sentences = "the cat sat on the mat and looked at the dog.\n\n\
                     a man is playing a guitar in the park today.\n\n\
                     paris is the capital and largest city of france.\n\n\
                     water boils at one hundred degrees celsius at sea level.\n";
    std::fs::write(&text, sentences.repeat(4)).unwrap();
    let dir = fixtures().join("minilm-tokenizer");
    let tok = Tokenizer::from_dir(&dir, 512).unwrap();
    let corpus_opts = CorpusOptions {
        seq_len: 32,
        nsp: false,
        seed: 1,
    };
    let train = Corpus::read(&[text], &tok, &corpus_opts).unwrap();
    let config = BertConfig::modernbert(tok.vocab_size(), (2, 64, 4, 96), 64);
    let build = |engine: Engine, out: &str| {
        let masker = Masker::for_tokenizer(&tok, 0.15, MaskSplit::default(), false).unwrap();
        let opts = PretrainOptions {
            nsp: false,
            train: LoopOptions {
                batch_size: 4,
                length: RunLength::Steps(150),
                warmup: Warmup::Steps(10),
                lr: 3e-3,
                seed: 11,
                engine,
                ..LoopOptions::new(tmp.path().join(out))
            },
        };
        let setup = ModelSetup {
            config: config.clone(),
            init: None,
            tokenizer_source: dir.clone(),
        };
        let data = PretrainData {
            train: train.clone().into(),
            eval: train.clone().into(),
            masker,
            eval_masker: None,
            pad_id: tok.pad_id(),
        };
        Pretrainer::new(setup, data, opts)
    };
    let mut t = build(Engine::Fast, "fast").unwrap();
    let mut losses = Vec::new();
    t.run(|e| {
        if let Event::Step(m) = e {
            losses.push(m.figures["mlm_loss"]);
        }
    })
    .unwrap();
    let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
    let (first, last) = (mean(&losses[..10]), mean(&losses[losses.len() - 20..]));
    println!("ModernBERT MLM loss: first 10 steps {first:.3}, last 20 {last:.3}");
    assert!(first > 9.0, "a fresh model starts near ln(30522): {first}");
    assert!(
        last < 0.5 * first,
        "the loss did not fall: {first} -> {last}"
    );

    let saved = tmp.path().join("fast");
    let back = BertConfig::from_file(&saved.join("config.json")).unwrap();
    assert_eq!(
        back.architectures,
        vec!["ModernBertForMaskedLM".to_string()]
    );
    let names: Vec<String> = Weights::from_model_dir(&saved)
        .unwrap()
        .names()
        .map(str::to_string)
        .collect();
    assert!(
        names.iter().any(|n| n == "model.layers.1.attn.Wqkv.weight"),
        "{names:?}"
    );
    let m = BertForTask::from_dir(&saved, None, HeadInit::FromCheckpoint, &Device::Cpu).unwrap();
    assert_eq!(m.kind(), HeadKind::MaskedLM);
}

/// The model's logits [1, T, C] (or [1, C]) on `text` encoded by the
/// folder's tokenizer, with the encoding.
fn direct_logits(name: &str, text: &str) -> (Tensor, bertha::Encoded) {
    let dir = dir_of(name);
    let tok = Tokenizer::from_dir(&dir, 64).unwrap();
    let enc = tok.encode(text).unwrap();
    let m = BertForTask::from_dir(&dir, None, HeadInit::FromCheckpoint, &Device::Cpu).unwrap();
    let n = enc.input_ids.len();
    let input = BertInput {
        input_ids: Tensor::from_vec(enc.input_ids.clone(), (1, n), &Device::Cpu).unwrap(),
        token_type_ids: None,
        attention_mask: None,
    };
    let out = m
        .forward(&input, &HeadLabels::default(), HeadOptions::default())
        .unwrap();
    let bertha::model::TaskOutput::Logits(out) = out else {
        panic!("{name}: not a logits head")
    };
    (out.logits.get(0).unwrap(), enc)
}

fn softmax(row: &[f32]) -> Vec<f32> {
    let max = row.iter().copied().fold(f32::MIN, f32::max) as f64;
    let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    row.iter()
        .map(|&x| ((x as f64 - max).exp() / sum) as f32)
        .collect()
}

/// fill-mask, classify, NER and embed run on ModernBERT folders (BPE
/// `tokenizer.json`, `[MASK]` from `tokenizer_config.json`), each answer
/// the softmax / pooling of the model's own outputs.
#[test]
fn modernbert_pipelines_answer_from_the_model() {
    use bertha::tasks::{Aggregation, Classifier, TokenClassifier};
    use bertha::{EmbedOptions, Embedder};
    let text = "the movie was [MASK] good";
    let fm = FillMask::from_dir(&dir_of("modernbert-mlm"), &Device::Cpu).unwrap();
    assert_eq!(fm.mask_token(), "[MASK]");
    let got = fm.fill(text, 5).unwrap();
    let (logits, enc) = direct_logits("modernbert-mlm", text);
    let pos = enc.input_ids.iter().position(|&id| id == 4).unwrap();
    let probs = softmax(&logits.get(pos).unwrap().to_vec1::<f32>().unwrap());
    assert_eq!(got[0].len(), 5);
    for p in &got[0] {
        assert!((p.score - probs[p.token as usize]).abs() < 1e-6, "{p:?}");
    }
    // The first candidate is the model's most probable token (the
    // pipeline's fp32 fast path and the candle modules differ by rounding).
    let best = (0..probs.len()).fold(0, |b, i| if probs[i] > probs[b] { i } else { b });
    assert_eq!(got[0][0].token as usize, best);

    let text = "a charming and often affecting journey";
    let cls = Classifier::from_dir(&dir_of("modernbert-seqcls"), &Device::Cpu).unwrap();
    let top = cls.classify(text, None, None).unwrap();
    let (logits, _) = direct_logits("modernbert-seqcls", text);
    let probs = softmax(&logits.to_vec1::<f32>().unwrap());
    let (arg, p) = probs
        .iter()
        .enumerate()
        .fold((0, 0f32), |b, (i, &p)| if p > b.1 { (i, p) } else { b });
    let names = ["negative", "neutral", "positive"];
    assert_eq!(top[0].label, names[arg]);
    assert!((top[0].score - p).abs() < 1e-6);

    let text = "john lives in paris";
    let ner = TokenClassifier::from_dir(&dir_of("modernbert-tokcls"), &Device::Cpu).unwrap();
    let entities = ner.entities(text, Aggregation::None).unwrap();
    let (logits, _) = direct_logits("modernbert-tokcls", text);
    assert!(!entities.is_empty());
    for e in &entities {
        let probs = softmax(
            &logits
                .get(e.index.unwrap())
                .unwrap()
                .to_vec1::<f32>()
                .unwrap(),
        );
        let best = probs.iter().copied().fold(0f32, f32::max);
        assert!((e.score - best).abs() < 1e-6, "{e:?}");
    }

    let dir = dir_of("modernbert-long");
    let embedder = Embedder::from_dir(&dir, &Device::Cpu, &EmbedOptions::default()).unwrap();
    let got = embedder.embed(&[text], 1, &mut |_| {}).unwrap();
    let enc = Tokenizer::from_dir(&dir, 64).unwrap().encode(text).unwrap();
    let n = enc.input_ids.len();
    let input = BertInput {
        input_ids: Tensor::from_vec(enc.input_ids, (1, n), &Device::Cpu).unwrap(),
        token_type_ids: None,
        attention_mask: None,
    };
    let m = BertModel::from_dir(&dir, &Device::Cpu).unwrap();
    let last = m
        .forward(&input, ForwardOptions::default())
        .unwrap()
        .last_hidden_state;
    let mean = last.mean(1).unwrap().get(0).unwrap();
    let want = Tensor::new(got[0].as_slice(), &Device::Cpu).unwrap();
    assert!(common::max_abs_diff(&want, &mean) < 1e-6);
}
