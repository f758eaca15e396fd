//! The task pipelines against transformers' pipelines on the tiny
//! checkpoints (`tests/fixtures/pipelines.json`, made by
//! `make_pipeline_fixtures.py`) and against values computed by hand from
//! the heads' logits.

mod common;

use std::path::PathBuf;

use bertha::model::{
    BertForMaskedLM, BertForPreTraining, BertForQuestionAnswering, BertForSequenceClassification,
};
use bertha::tasks::{
    Aggregation, Classifier, FillMask, NextSentence, PipelineOptions, QaOptions, QuestionAnswerer,
    ScoreFunction, TokenClassifier,
};
use bertha::{BertHead, BertInput, Device, ForwardOptions, HeadInit, Precision, Tokenizer};
use common::{fixtures, read_json};
use serde_json::Value;

/// Probabilities are compared within 1e-5 (the logits agree to 1e-4).
const SCORE_TOL: f64 = 1e-5;

fn tiny(name: &str) -> PathBuf {
    fixtures().join("tiny").join(name)
}

fn pipelines() -> Value {
    read_json(&fixtures().join("pipelines.json"))
}

fn close(what: &str, got: f64, want: &Value) {
    let want = want.as_f64().unwrap();
    assert!(
        (got - want).abs() <= SCORE_TOL,
        "{what}: got {got}, want {want}"
    );
}

fn softmax(v: &[f32]) -> Vec<f64> {
    let m = v.iter().cloned().fold(f32::MIN, f32::max) as f64;
    let e: Vec<f64> = v.iter().map(|&x| (x as f64 - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|x| x / s).collect()
}

fn one(enc: &bertha::Encoded) -> BertInput {
    BertInput::from_ids(
        std::slice::from_ref(&enc.input_ids),
        std::slice::from_ref(&enc.token_type_ids),
        0,
        &Device::Cpu,
    )
    .unwrap()
}

#[test]
fn fill_mask_matches_transformers() {
    let fx = pipelines();
    // fp32 on the packed fast path (the default) and on the candle modules.
    for fast_f32 in [true, false] {
        let opts = PipelineOptions {
            fast_f32,
            ..Default::default()
        };
        let fm = FillMask::from_dir_with(&tiny("bert-mlm"), &Device::Cpu, &opts).unwrap();
        fill_mask_cases(&fx, &fm);
    }
}

fn fill_mask_cases(fx: &Value, fm: &FillMask) {
    let top_k = fx["fill_mask"]["top_k"].as_u64().unwrap() as usize;
    for case in fx["fill_mask"]["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let got = fm.fill(text, top_k).unwrap();
        assert_eq!(got.len(), 1, "{text}: one mask");
        let want = case["expected"].as_array().unwrap();
        assert_eq!(got[0].len(), want.len(), "{text}");
        for (g, w) in got[0].iter().zip(want) {
            assert_eq!(g.token as u64, w["token"].as_u64().unwrap(), "{text}");
            assert_eq!(g.token_str, w["token_str"].as_str().unwrap(), "{text}");
            assert_eq!(g.sequence, w["sequence"].as_str().unwrap(), "{text}");
            close(text, g.score as f64, &w["score"]);
        }
    }
}

#[test]
fn fill_mask_several_masks_and_hand_computed_scores() {
    let dir = tiny("bert-mlm");
    let fm = FillMask::from_dir(&dir, &Device::Cpu).unwrap();
    let text = "the [MASK] of the year was [MASK]";
    let got = fm.fill(text, 3).unwrap();
    assert_eq!(got.len(), 2);

    // By hand: the MLM logits at the two mask positions, softmaxed.
    let mlm = BertForMaskedLM::from_dir(&dir, HeadInit::FromCheckpoint, &Device::Cpu).unwrap();
    let tok = Tokenizer::from_dir(&dir, 64).unwrap();
    let enc = tok.encode(text).unwrap();
    let mask_id = tok.token_to_id("[MASK]").unwrap();
    let positions: Vec<usize> = (0..enc.len())
        .filter(|&i| enc.input_ids[i] == mask_id)
        .collect();
    assert_eq!(positions.len(), 2);
    let logits = mlm
        .forward(&one(&enc), None, ForwardOptions::default())
        .unwrap()
        .logits;
    for (m, &pos) in positions.iter().enumerate() {
        let row: Vec<f32> = logits.get(0).unwrap().get(pos).unwrap().to_vec1().unwrap();
        let p = softmax(&row);
        let mut order: Vec<usize> = (0..p.len()).collect();
        order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
        for (k, g) in got[m].iter().enumerate() {
            assert_eq!(g.token as usize, order[k]);
            assert!((g.score as f64 - p[order[k]]).abs() <= 1e-6);
            // With several masks the other mask stays in the sequence, and
            // special tokens are kept, as transformers does.
            assert!(g.sequence.starts_with("[CLS] "), "{}", g.sequence);
            assert_eq!(g.sequence.matches("[MASK]").count(), 1, "{}", g.sequence);
        }
    }
    // top_k larger than the vocabulary gives the whole vocabulary.
    let all = fm.fill("[MASK]", 5000).unwrap();
    assert_eq!(all[0].len(), 1024);
    let total: f64 = all[0].iter().map(|p| p.score as f64).sum();
    assert!((total - 1.0).abs() < 1e-4, "{total}");
}

#[test]
fn fill_mask_bad_input() {
    let fm = FillMask::from_dir(&tiny("bert-mlm"), &Device::Cpu).unwrap();
    let err = fm.fill("no mask here", 5).unwrap_err().to_string();
    assert!(err.contains("no mask token [MASK]"), "{err}");
    let err = fm.fill("a [MASK]", 0).unwrap_err().to_string();
    assert!(err.contains("top_k"), "{err}");
    // The mask is past the truncation point.
    let long = format!("{} [MASK]", "the year ".repeat(80));
    let err = fm.fill(&long, 5).unwrap_err().to_string();
    assert!(err.contains("truncation"), "{err}");
    // Masks past the truncation point are an error naming them, even when
    // others survive (never an answer with fewer masks than the text has).
    let words = "the year ".repeat(28);
    let some = format!("[MASK] {words} [MASK] [MASK] [MASK] [MASK] [MASK] [MASK] [MASK] [MASK]");
    let err = fm.fill(&some, 5).unwrap_err().to_string();
    assert!(
        err.contains("masks 7 to 9 of 9 were cut off by truncation at 64 tokens"),
        "{err}"
    );
    let last = format!("[MASK] {words} [MASK] [MASK] [MASK] the year the [MASK]");
    let err = fm.fill(&last, 5).unwrap_err().to_string();
    assert!(
        err.contains("mask 5 of 5 was cut off by truncation"),
        "{err}"
    );
    // A checkpoint without an MLM head.
    let err = common::err_text(FillMask::from_dir(&tiny("bert-seqcls"), &Device::Cpu));
    assert!(
        err.contains("BertForMaskedLM") && err.contains("cls.predictions"),
        "{err}"
    );
    let err = common::err_text(FillMask::from_dir(&common::minilm_dir(), &Device::Cpu));
    assert!(err.contains("no BertForMaskedLM head"), "{err}");
}

#[test]
fn classify_matches_transformers() {
    let fx = pipelines();
    let cl = Classifier::from_dir(&tiny("bert-seqcls"), &Device::Cpu).unwrap();
    assert_eq!(cl.function(), ScoreFunction::Softmax);
    for key in ["classify", "classify_pair"] {
        for case in fx[key]["cases"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let pair = case.get("pair").and_then(Value::as_str);
            let got = cl.classify(text, pair, None).unwrap();
            let want = case["expected"].as_array().unwrap();
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(want) {
                assert_eq!(g.label, w["label"].as_str().unwrap(), "{text}");
                close(text, g.score as f64, &w["score"]);
            }
            // top_k 1 is the best label.
            let top = cl.classify(text, pair, Some(1)).unwrap();
            assert_eq!(top.len(), 1);
            assert_eq!(top[0], got[0]);
        }
    }
    let err = cl.classify("x", None, Some(0)).unwrap_err().to_string();
    assert!(err.contains("top_k"), "{err}");
}

/// Many texts at once (pairs and single texts mixed, in batches of 3 so
/// that a batch holds several lengths, and batches side by side where the
/// fast path has more than one core) score as transformers scores each,
/// and as each alone.
#[test]
fn classify_many_scores_each_text_as_alone_and_as_transformers() {
    let fx = pipelines();
    let cl = Classifier::from_dir(&tiny("bert-seqcls"), &Device::Cpu)
        .unwrap()
        .with_batch_size(3);
    let mut inputs: Vec<(&str, Option<&str>)> = Vec::new();
    let mut want: Vec<&Value> = Vec::new();
    for _ in 0..3 {
        for key in ["classify", "classify_pair"] {
            for case in fx[key]["cases"].as_array().unwrap() {
                let pair = case.get("pair").and_then(Value::as_str);
                inputs.push((case["text"].as_str().unwrap(), pair));
                want.push(&case["expected"]);
            }
        }
    }
    assert!(inputs.len() > 6, "{} cases", inputs.len());
    let got = cl.classify_many(&inputs, None, cl.function()).unwrap();
    assert_eq!(got.len(), inputs.len());
    for (((text, pair), got), want) in inputs.iter().zip(&got).zip(&want) {
        let want = want.as_array().unwrap();
        assert_eq!(got.len(), want.len(), "{text}");
        for (g, w) in got.iter().zip(want) {
            assert_eq!(g.label, w["label"].as_str().unwrap(), "{text}");
            close(text, g.score as f64, &w["score"]);
        }
        let alone = cl.classify(text, *pair, None).unwrap();
        for (g, a) in got.iter().zip(&alone) {
            assert_eq!(g.label, a.label, "{text}");
            assert!(
                (g.score - a.score).abs() <= 1e-6,
                "{text}: {} vs {}",
                g.score,
                a.score
            );
        }
    }
    let top = cl.classify_many(&inputs, Some(1), cl.function()).unwrap();
    assert!(top
        .iter()
        .zip(&got)
        .all(|(t, g)| t.len() == 1 && t[0] == g[0]));
    assert!(cl
        .classify_many::<&str>(&[], None, cl.function())
        .unwrap()
        .is_empty());
    let err = cl
        .classify_many(&inputs, Some(0), cl.function())
        .unwrap_err();
    assert!(err.to_string().contains("top_k"), "{err}");
}

#[test]
fn classify_multi_label_uses_sigmoid() {
    let dir = tiny("bert-seqcls");
    let weights = bertha::Weights::from_model_dir(&dir).unwrap();
    let mut cfg = bertha::BertConfig::from_file(&dir.join("config.json")).unwrap();
    cfg.problem_type = Some(bertha::ProblemType::MultiLabelClassification);
    let model = BertForSequenceClassification::from_weights(
        weights,
        cfg,
        HeadInit::FromCheckpoint,
        &Device::Cpu,
    )
    .unwrap();
    let tok = Tokenizer::from_dir(&dir, 64).unwrap();
    let enc = tok.encode("the album was very good").unwrap();
    let logits: Vec<f32> = model
        .forward(&one(&enc), None, ForwardOptions::default())
        .unwrap()
        .logits
        .get(0)
        .unwrap()
        .to_vec1()
        .unwrap();
    let cl = Classifier::new(model, tok);
    assert_eq!(cl.function(), ScoreFunction::Sigmoid);
    let got = cl.classify("the album was very good", None, None).unwrap();
    let names = ["negative", "neutral", "positive"];
    for g in &got {
        let i = names.iter().position(|n| *n == g.label).unwrap();
        let want = 1.0 / (1.0 + (-(logits[i] as f64)).exp());
        assert!((g.score as f64 - want).abs() <= 1e-6, "{}", g.label);
    }
    assert!(got.windows(2).all(|w| w[0].score >= w[1].score));
}

#[test]
fn classifier_shape_and_label_errors_are_clear() {
    // A config whose id2label disagrees with the classifier's rows.
    let src = tiny("bert-seqcls");
    let tmp = tempfile::tempdir().unwrap();
    for f in ["model.safetensors", "vocab.txt"] {
        std::fs::copy(src.join(f), tmp.path().join(f)).unwrap();
    }
    let cfg = std::fs::read_to_string(src.join("config.json")).unwrap();
    let mut cfg: Value = serde_json::from_str(&cfg).unwrap();
    cfg["id2label"] = serde_json::json!({"0": "a", "1": "b"});
    cfg.as_object_mut().unwrap().remove("label2id");
    std::fs::write(tmp.path().join("config.json"), cfg.to_string()).unwrap();
    let err = common::err_text(Classifier::from_dir(tmp.path(), &Device::Cpu));
    assert!(
        err.contains("classifier.weight") && err.contains("[3, 32]") && err.contains("[2, 32]"),
        "{err}"
    );
    // Label ids with a gap.
    cfg["id2label"] = serde_json::json!({"0": "a", "1": "b", "5": "c"});
    std::fs::write(tmp.path().join("config.json"), cfg.to_string()).unwrap();
    let err = common::err_text(Classifier::from_dir(tmp.path(), &Device::Cpu));
    assert!(err.contains("id2label") && err.contains("id 2"), "{err}");
}

#[test]
fn ner_matches_transformers_for_every_aggregation() {
    let fx = pipelines();
    let ner = TokenClassifier::from_dir(&tiny("bert-tokcls"), &Device::Cpu).unwrap();
    for case in fx["ner"]["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let agg_name = case["aggregation"].as_str().unwrap();
        let agg: Aggregation = agg_name.parse().unwrap();
        let got = ner.entities(text, agg).unwrap();
        let want = case["expected"].as_array().unwrap();
        let what = format!("{agg_name}: {text}");
        assert_eq!(got.len(), want.len(), "{what}: {got:?}");
        for (g, w) in got.iter().zip(want) {
            let g = serde_json::to_value(g).unwrap();
            for key in ["entity", "entity_group", "index", "word", "start", "end"] {
                assert_eq!(g.get(key), w.get(key), "{what}: `{key}`");
            }
            close(&what, g["score"].as_f64().unwrap(), &w["score"]);
        }
    }
    let err = "biggest".parse::<Aggregation>().unwrap_err().to_string();
    assert!(err.contains("biggest"), "{err}");
}

/// Many texts at once (in batches of up to 32 of similar length, side by
/// side where the fast path has more than one core; more texts than a
/// batch, of several lengths) give each text's entities alone, and
/// transformers' for the fixture's texts.
#[test]
fn ner_of_many_texts_is_each_alone_and_transformers() {
    let fx = pipelines();
    let ner = TokenClassifier::from_dir(&tiny("bert-tokcls"), &Device::Cpu).unwrap();
    for agg_name in ["none", "simple", "average"] {
        let agg: Aggregation = agg_name.parse().unwrap();
        let cases: Vec<&Value> = fx["ner"]["cases"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["aggregation"] == agg_name)
            .collect();
        assert!(!cases.is_empty(), "{agg_name}");
        let mut texts: Vec<String> = cases
            .iter()
            .map(|c| c["text"].as_str().unwrap().to_string())
            .collect();
        let fixture = texts.len();
        // Sentences of growing length: more than one batch.
        let words = "john smith flew from paris to the offices of acme corp in new york";
        for i in 0..40 {
            let n = 1 + i % 14;
            texts.push(
                words
                    .split(' ')
                    .cycle()
                    .skip(i)
                    .take(n)
                    .collect::<Vec<_>>()
                    .join(" "),
            );
        }
        let got = ner.entities_many(&texts, agg).unwrap();
        assert_eq!(got.len(), texts.len());
        for (i, (text, got)) in texts.iter().zip(&got).enumerate() {
            let alone = ner.entities(text, agg).unwrap();
            assert_eq!(got.len(), alone.len(), "{agg_name}: {text}");
            for (g, a) in got.iter().zip(&alone) {
                assert_eq!((&g.entity, &g.entity_group), (&a.entity, &a.entity_group));
                assert_eq!((g.start, g.end, g.index), (a.start, a.end, a.index));
                assert!((g.score - a.score).abs() <= 1e-6, "{text}");
            }
            if i < fixture {
                let want = cases[i]["expected"].as_array().unwrap();
                assert_eq!(got.len(), want.len(), "{agg_name}: {text}");
                for (g, w) in got.iter().zip(want) {
                    close(text, g.score as f64, &w["score"]);
                }
            }
        }
    }
}

#[test]
fn ner_groups_by_hand() {
    // Character offsets of a text with capitals, accents and punctuation
    // point back into the original text.
    let ner = TokenClassifier::from_dir(&tiny("bert-tokcls"), &Device::Cpu).unwrap();
    let text = "John, élan of the Company!";
    for agg in [Aggregation::None, Aggregation::Simple, Aggregation::First] {
        for e in ner.entities(text, agg).unwrap() {
            let span: String = text.chars().skip(e.start).take(e.end - e.start).collect();
            // [UNK] tokens show the text itself, others the lowercased,
            // accent-stripped WordPiece tokens.
            let norm = span.to_lowercase().replace('é', "e");
            let word = e.word.replace("##", "").replace(' ', "");
            assert!(
                norm.replace(' ', "") == word || span.replace(' ', "") == word,
                "{agg:?}: span {span:?} vs word {:?}",
                e.word
            );
        }
    }
}

#[test]
fn qa_matches_transformers_rule() {
    let fx = pipelines();
    let qa = QuestionAnswerer::from_dir(&tiny("bert-qa"), &Device::Cpu).unwrap();
    let max_answer_len = fx["qa"]["max_answer_len"].as_u64().unwrap() as usize;
    for case in fx["qa"]["cases"].as_array().unwrap() {
        let q = case["question"].as_str().unwrap();
        let c = case["context"].as_str().unwrap();
        let opts = QaOptions {
            max_answer_len,
            ..QaOptions::default()
        };
        assert_eq!(qa.windows(q, c, &opts).unwrap().len(), 1);
        let got = qa.answer(q, c, &opts).unwrap();
        let w = &case["expected"];
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].answer, w["answer"].as_str().unwrap(), "{q}");
        assert_eq!(got[0].start as u64, w["start"].as_u64().unwrap(), "{q}");
        assert_eq!(got[0].end as u64, w["end"].as_u64().unwrap(), "{q}");
        close(q, got[0].score as f64, &w["score"]);
        // top_k: distinct spans, best first, the first the same answer.
        let top = qa.answer(q, c, &QaOptions { top_k: 4, ..opts }).unwrap();
        assert_eq!(top.len(), 4);
        assert_eq!(top[0], got[0]);
        assert!(top.windows(2).all(|p| p[0].score >= p[1].score));
    }
}

/// The best span of one window, by brute force over its context tokens.
fn best_in_window(
    model: &BertForQuestionAnswering,
    ids: &[u32],
    types: &[u32],
    ctx: std::ops::Range<usize>,
    max_len: usize,
) -> (f64, usize, usize) {
    let input = BertInput::from_ids(&[ids.to_vec()], &[types.to_vec()], 0, &Device::Cpu).unwrap();
    let out = model
        .forward(&input, None, None, ForwardOptions::default())
        .unwrap();
    let s: Vec<f32> = out.start_logits.get(0).unwrap().to_vec1().unwrap();
    let e: Vec<f32> = out.end_logits.get(0).unwrap().to_vec1().unwrap();
    let (ps, pe) = (softmax(&s[ctx.clone()]), softmax(&e[ctx.clone()]));
    let mut best = (f64::MIN, 0, 0);
    for (i, &s) in ps.iter().enumerate() {
        for (j, &e) in pe.iter().enumerate().take(i + max_len).skip(i) {
            if s * e > best.0 {
                best = (s * e, i, j);
            }
        }
    }
    best
}

#[test]
fn qa_long_context_uses_overlapping_windows() {
    let dir = tiny("bert-qa");
    let qa = QuestionAnswerer::from_dir(&dir, &Device::Cpu).unwrap();
    let model =
        BertForQuestionAnswering::from_dir(&dir, HeadInit::FromCheckpoint, &Device::Cpu).unwrap();
    let question = "who released the album";
    let context = "the best album of the year was released by the company in the district. \
        john played the music and the company released the album. \
        several districts began to play the game, and the leader told europe \
        that the table was out. however the year was long and the music was good, \
        so john left home and played music in the district with the company. \
        the leader of the company told john that the album of the year was the best, \
        and several districts played the music of the album for the whole year.";
    let opts = QaOptions {
        max_answer_len: 15,
        doc_stride: Some(30),
        ..QaOptions::default()
    };
    let windows = qa.windows(question, context, &opts).unwrap();
    assert!(
        windows.len() >= 3,
        "{} windows: {:?}",
        windows.len(),
        windows.iter().map(|w| (w.from, w.len)).collect::<Vec<_>>()
    );

    // Windows by hand: [CLS] q [SEP] ctx[from..from+room] [SEP], 64 tokens
    // at most, consecutive windows sharing 30 tokens, covering everything.
    let mut raw = Tokenizer::from_dir(&dir, 64).unwrap().inner().clone();
    raw.with_truncation(None).unwrap();
    let q = raw.encode_char_offsets(question, false).unwrap();
    let c = raw.encode_char_offsets(context, false).unwrap();
    let room = 64 - q.get_ids().len() - 3;
    assert!(
        c.get_ids().len() > room,
        "the context must not fit one window"
    );
    let mut from = 0;
    let mut best = (f64::MIN, 0, 0);
    for w in &windows {
        assert_eq!(w.from, from);
        assert!(w.input_ids.len() <= 64);
        let len = room.min(c.get_ids().len() - from);
        let mut ids = vec![2u32];
        ids.extend(q.get_ids());
        ids.push(3);
        let ctx_start = ids.len();
        ids.extend(&c.get_ids()[from..from + len]);
        ids.push(3);
        let mut types = vec![0u32; ctx_start];
        types.resize(ids.len(), 1);
        assert_eq!(w.input_ids, ids);
        assert_eq!(w.token_type_ids, types);
        let (score, i, j) = best_in_window(&model, &ids, &types, ctx_start..ctx_start + len, 15);
        if score > best.0 {
            best = (score, from + i, from + j);
        }
        from += room - 30;
    }
    assert_eq!(
        windows.last().map(|w| w.from + w.len),
        Some(c.get_ids().len())
    );
    let got = &qa.answer(question, context, &opts).unwrap()[0];
    let offs = c.get_offsets();
    assert_eq!((got.start, got.end), (offs[best.1].0, offs[best.2].1));
    assert!((got.score as f64 - best.0).abs() <= 1e-6);
    let chars: String = context
        .chars()
        .skip(got.start)
        .take(got.end - got.start)
        .collect();
    assert_eq!(got.answer, chars);

    // The default stride works too and gives an answer inside the context.
    let a = &qa.answer(question, context, &QaOptions::default()).unwrap()[0];
    assert!(a.end <= context.chars().count() && a.start < a.end);
}

#[test]
fn qa_bad_input() {
    let qa = QuestionAnswerer::from_dir(&tiny("bert-qa"), &Device::Cpu).unwrap();
    let long_q = "who played the music ".repeat(20);
    let default = QaOptions::default;
    let cases = [
        (
            long_q.as_str(),
            "john played",
            default(),
            "does not leave room for the context",
        ),
        (
            "who",
            "john played the music",
            QaOptions {
                doc_stride: Some(100),
                ..default()
            },
            "doc_stride 100",
        ),
        (
            "who",
            "john",
            QaOptions {
                max_seq_len: Some(1000),
                ..default()
            },
            "max_position_embeddings",
        ),
        ("who", "", default(), "context is empty"),
    ];
    for (question, context, options, want) in cases {
        let err = qa
            .answer(question, context, &options)
            .unwrap_err()
            .to_string();
        assert!(err.contains(want), "{err}");
    }
    let err = common::err_text(QuestionAnswerer::from_dir(&tiny("bert-mlm"), &Device::Cpu));
    assert!(err.contains("qa_outputs.weight"), "{err}");
}

#[test]
fn nsp_is_the_softmax_of_the_seq_relationship_logits() {
    let dir = tiny("bert-pretraining");
    let nsp = NextSentence::from_dir(&dir, &Device::Cpu).unwrap();
    let (a, b) = ("john played the music", "the company released the album");
    let got = nsp.predict(a, b).unwrap();
    let pt = BertForPreTraining::from_dir(&dir, HeadInit::FromCheckpoint, &Device::Cpu).unwrap();
    let tok = Tokenizer::from_dir(&dir, 64).unwrap();
    let enc = tok.encode_pair(a, b).unwrap();
    let logits: Vec<f32> = pt
        .forward(&one(&enc), None, None, ForwardOptions::default())
        .unwrap()
        .seq_relationship_logits
        .get(0)
        .unwrap()
        .to_vec1()
        .unwrap();
    let p = softmax(&logits);
    assert!((got.is_next as f64 - p[0]).abs() <= 1e-6);
    assert!((got.not_next as f64 - p[1]).abs() <= 1e-6);
    let err = common::err_text(NextSentence::from_dir(&tiny("bert-mlm"), &Device::Cpu));
    assert!(err.contains("cls.seq_relationship.weight"), "{err}");
}

// Reduced precision: bf16 and int8 run the encoder on the packed fast path
// and the head in fp32 on its states. On the fixtures' texts they must
// give f32's answers (top-1 token, labels, entities, spans) with
// probabilities close to f32's.

/// Bounds on |bf16 − f32| and |int8 − f32| of a probability on the tiny
/// checkpoints' fixture texts: about twice the largest measured (bf16
/// 2.3e-3, int8 3.8e-3, both in NER; fill-mask and QA ~4e-4).
fn prob_tol(p: Precision) -> f64 {
    match p {
        Precision::F32 => 0.0,
        Precision::Bf16 => BF16_PROB_TOL,
        Precision::Int8 => INT8_PROB_TOL,
    }
}
const BF16_PROB_TOL: f64 = 5e-3;
const INT8_PROB_TOL: f64 = 1e-2;

const REDUCED: [Precision; 2] = [Precision::Bf16, Precision::Int8];

fn at(p: Precision) -> PipelineOptions {
    PipelineOptions {
        precision: p,
        ..Default::default()
    }
}

/// What runs when `p` is asked: bf16 without fast bf16 products is fp32.
fn runs(p: Precision) -> Precision {
    if p == Precision::Bf16 && !bertha::fast::cpu::has_bf16() {
        Precision::F32
    } else {
        p
    }
}

/// The largest difference seen, which is no difference only when the
/// precision fell back to fp32 (the reduced path did run).
fn report(what: &str, p: Precision, worst: f64) {
    eprintln!("{what} {p:?}: max |Δp| {worst:.2e}");
    assert_eq!(worst == 0.0, runs(p) == Precision::F32, "{what} {p:?}");
}

fn close_at(p: Precision, what: &str, got: f32, want: f32) -> f64 {
    let d = (got as f64 - want as f64).abs();
    assert!(d <= prob_tol(p), "{p:?} {what}: {got} vs f32 {want}");
    d
}

#[test]
fn fill_mask_at_reduced_precision_agrees_with_f32() {
    let fx = pipelines();
    let dir = tiny("bert-mlm");
    let exact = FillMask::from_dir(&dir, &Device::Cpu).unwrap();
    let mut texts: Vec<&str> = fx["fill_mask"]["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    texts.push("the [MASK] of the year was [MASK]");
    for p in REDUCED {
        let fm = FillMask::from_dir_with(&dir, &Device::Cpu, &at(p)).unwrap();
        assert_eq!(fm.precision(), runs(p));
        let mut worst = 0f64;
        for text in &texts {
            // The whole vocabulary's probabilities at every mask.
            let want = exact.fill(text, 1024).unwrap();
            let got = fm.fill(text, 1024).unwrap();
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(g[0].token, w[0].token, "{p:?} top-1 of {text}");
                assert_eq!(g[0].sequence, w[0].sequence);
                let mut by_token = vec![0f32; 1024];
                for c in g {
                    by_token[c.token as usize] = c.score;
                }
                for c in w {
                    worst = worst.max(close_at(p, text, by_token[c.token as usize], c.score));
                }
            }
        }
        report("fill-mask", p, worst);
    }
}

#[test]
fn classify_and_nsp_at_reduced_precision_agree_with_f32() {
    let fx = pipelines();
    let dir = tiny("bert-seqcls");
    let exact = Classifier::from_dir(&dir, &Device::Cpu).unwrap();
    let nsp_dir = tiny("bert-pretraining");
    let nsp_exact = NextSentence::from_dir(&nsp_dir, &Device::Cpu).unwrap();
    for p in REDUCED {
        let cl = Classifier::from_dir_with(&dir, &Device::Cpu, &at(p)).unwrap();
        assert_eq!(cl.precision(), runs(p));
        let mut worst = 0f64;
        for key in ["classify", "classify_pair"] {
            for case in fx[key]["cases"].as_array().unwrap() {
                let text = case["text"].as_str().unwrap();
                let pair = case.get("pair").and_then(Value::as_str);
                let want = exact.classify(text, pair, None).unwrap();
                let got = cl.classify(text, pair, None).unwrap();
                assert_eq!(got[0].label, want[0].label, "{p:?} {text}");
                for w in &want {
                    let g = got.iter().find(|g| g.label == w.label).unwrap();
                    worst = worst.max(close_at(p, text, g.score, w.score));
                }
            }
        }
        let nsp = NextSentence::from_dir_with(&nsp_dir, &Device::Cpu, &at(p)).unwrap();
        assert_eq!(nsp.precision(), runs(p));
        let (a, b) = ("john played the music", "the company released the album");
        let (g, w) = (nsp.predict(a, b).unwrap(), nsp_exact.predict(a, b).unwrap());
        worst = worst.max(close_at(p, "nsp", g.is_next, w.is_next));
        report("classify + nsp", p, worst);
    }
}

#[test]
fn ner_at_reduced_precision_agrees_with_f32() {
    let fx = pipelines();
    let dir = tiny("bert-tokcls");
    let exact = TokenClassifier::from_dir(&dir, &Device::Cpu).unwrap();
    for p in REDUCED {
        let ner = TokenClassifier::from_dir_with(&dir, &Device::Cpu, &at(p)).unwrap();
        assert_eq!(ner.precision(), runs(p));
        let mut worst = 0f64;
        for case in fx["ner"]["cases"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let agg: Aggregation = case["aggregation"].as_str().unwrap().parse().unwrap();
            let want = exact.entities(text, agg).unwrap();
            let got = ner.entities(text, agg).unwrap();
            let key = |e: &bertha::tasks::Entity| {
                (
                    e.entity.clone(),
                    e.entity_group.clone(),
                    e.word.clone(),
                    e.start,
                    e.end,
                )
            };
            let (gk, wk): (Vec<_>, Vec<_>) = (
                got.iter().map(key).collect(),
                want.iter().map(key).collect(),
            );
            assert_eq!(gk, wk, "{p:?} {agg:?}: {text}");
            for (g, w) in got.iter().zip(&want) {
                worst = worst.max(close_at(p, text, g.score, w.score));
            }
        }
        report("ner", p, worst);
    }
}

#[test]
fn qa_at_reduced_precision_agrees_with_f32() {
    let fx = pipelines();
    let dir = tiny("bert-qa");
    let exact = QuestionAnswerer::from_dir(&dir, &Device::Cpu).unwrap();
    let opts = QaOptions {
        top_k: 3,
        ..QaOptions::default()
    };
    for p in REDUCED {
        let qa = QuestionAnswerer::from_dir_with(&dir, &Device::Cpu, &at(p)).unwrap();
        assert_eq!(qa.precision(), runs(p));
        let mut worst = 0f64;
        for case in fx["qa"]["cases"].as_array().unwrap() {
            let q = case["question"].as_str().unwrap();
            let c = case["context"].as_str().unwrap();
            let want = exact.answer(q, c, &opts).unwrap();
            let got = qa.answer(q, c, &opts).unwrap();
            assert_eq!(
                (got[0].start, got[0].end),
                (want[0].start, want[0].end),
                "{p:?} {q}"
            );
            // Every span both list has about the same score.
            for w in &want {
                if let Some(g) = got.iter().find(|g| (g.start, g.end) == (w.start, w.end)) {
                    worst = worst.max(close_at(p, q, g.score, w.score));
                }
            }
        }
        report("qa", p, worst);
    }
}
