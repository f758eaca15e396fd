//! Embeddings of a sentence-transformers 6 folder against
//! sentence-transformers' own (`tests/fixtures/st-embedding`): plain, with
//! the folder's `query` prompt, and truncated to 16 dimensions; and the
//! prompt and dimension options' errors.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;

use bertha::tasks::{EncodeOptions, Prompt};
use bertha::{BertInput, BertModel, Device, EmbedOptions, Embedder, ForwardOptions, Tensor};
use common::{assert_close, err_text, fixtures, load_safetensors, read_json};

fn dir() -> PathBuf {
    fixtures().join("st-embedding")
}

fn anchors() -> Vec<String> {
    serde_json::from_value(read_json(&dir().join("inputs.json"))["anchors"].clone()).unwrap()
}

fn expected(name: &str) -> Tensor {
    load_safetensors(&dir().join("expected.safetensors"))
        .remove(name)
        .unwrap_or_else(|| panic!("no {name} in expected.safetensors"))
}

fn embedder() -> Embedder {
    Embedder::from_dir(&dir(), &Device::Cpu, &EmbedOptions::default()).unwrap()
}

fn rows(v: Vec<Vec<f32>>) -> Tensor {
    let (n, d) = (v.len(), v[0].len());
    Tensor::from_vec(v.concat(), (n, d), &Device::Cpu).unwrap()
}

/// `opts` on both paths (packed fast path and candle modules) against
/// the fixture's tensor `name`, within 1e-5.
#[track_caller]
fn assert_matches(e: &mut Embedder, opts: &EncodeOptions, name: &str) {
    let want = expected(name);
    for fast in [true, false] {
        e.set_fast_path(fast).unwrap();
        let got = e.embed_with(&anchors(), opts, 3, &mut |_| {}).unwrap();
        assert_close(
            &format!("{name} (fast path {fast})"),
            &rows(got),
            &want,
            1e-5,
        );
    }
}

#[test]
fn embeddings_match_sentence_transformers() {
    let mut e = embedder();
    assert!(e.normalizes());
    assert_eq!(e.tokenizer().max_length(), 32);
    assert_matches(&mut e, &EncodeOptions::default(), "embeddings.anchor");
    let plain = e.embed(&anchors(), 8, &mut |_| {}).unwrap();
    assert_close("embed", &rows(plain), &expected("embeddings.anchor"), 1e-5);
}

#[test]
fn the_query_prompt_matches_by_name_and_by_text() {
    let prompted = expected("embeddings.query_prompt.anchor");
    assert!(common::max_abs_diff(&prompted, &expected("embeddings.anchor")) > 1e-2);
    let mut e = embedder();
    let by_name = EncodeOptions {
        prompt_name: Some("query".into()),
        ..Default::default()
    };
    assert_matches(&mut e, &by_name, "embeddings.query_prompt.anchor");
    let by_text = EncodeOptions {
        prompt: Some("query: ".into()),
        ..Default::default()
    };
    assert_matches(&mut e, &by_text, "embeddings.query_prompt.anchor");
}

#[test]
fn the_default_prompt_applies_when_a_call_names_none() {
    let mut e = embedder();
    let prompts = e.prompts().clone();
    e.set_prompts(prompts, Some("query".into())).unwrap();
    let got = e.embed(&anchors(), 8, &mut |_| {}).unwrap();
    assert_close(
        "default prompt",
        &rows(got),
        &expected("embeddings.query_prompt.anchor"),
        1e-5,
    );
    // An explicit empty prompt is no prompt, as in sentence-transformers.
    let none = EncodeOptions {
        prompt: Some(String::new()),
        ..Default::default()
    };
    let got = e.embed_with(&anchors(), &none, 8, &mut |_| {}).unwrap();
    assert_close(
        "empty prompt",
        &rows(got),
        &expected("embeddings.anchor"),
        1e-5,
    );
}

#[test]
fn sixteen_dimensions_match_truncate_dim_then_normalize() {
    let mut e = embedder();
    let opts = EncodeOptions {
        dimensions: Some(16),
        ..Default::default()
    };
    assert_matches(&mut e, &opts, "embeddings.anchor_dim16");
    // The query prompt and 16 dimensions together: the prompted vectors'
    // first 16 values, renormalised.
    let both = EncodeOptions {
        prompt_name: Some("query".into()),
        dimensions: Some(16),
        ..Default::default()
    };
    let got = rows(e.embed_with(&anchors(), &both, 8, &mut |_| {}).unwrap());
    let full = expected("embeddings.query_prompt.anchor")
        .narrow(1, 0, 16)
        .unwrap();
    let norm = full.sqr().unwrap().sum_keepdim(1).unwrap().sqrt().unwrap();
    assert_close(
        "prompt + dims",
        &got,
        &full.broadcast_div(&norm).unwrap(),
        1e-5,
    );
}

/// With `include_prompt: false` the pooled vector is the mean of the
/// states after `[CLS]` and the prompt's tokens, computed here from the
/// encoder's own output.
#[test]
fn include_prompt_false_pools_past_the_prompt() {
    let mut e = embedder();
    e.set_include_prompt(false);
    let opts = EncodeOptions {
        prompt_name: Some("query".into()),
        ..Default::default()
    };
    let Some(Prompt { text, pool_start }) = e.prompt(&opts).unwrap() else {
        panic!("the query prompt resolves");
    };
    let alone = e.tokenizer().encode(&text).unwrap();
    assert_eq!(pool_start, alone.len() - 1, "[CLS] + prompt, without [SEP]");
    assert!(pool_start >= 2);

    let model = BertModel::from_dir(&dir(), &Device::Cpu).unwrap();
    let mut want = Vec::new();
    for a in anchors() {
        let enc = e.tokenizer().encode(&format!("{text}{a}")).unwrap();
        let input = BertInput::from_ids(
            std::slice::from_ref(&enc.input_ids),
            std::slice::from_ref(&enc.token_type_ids),
            0,
            &Device::Cpu,
        )
        .unwrap();
        let states = model
            .forward(&input, ForwardOptions::default())
            .unwrap()
            .last_hidden_state
            .squeeze(0)
            .unwrap();
        let kept = states
            .narrow(0, pool_start, enc.len() - pool_start)
            .unwrap();
        let mean = kept.mean_keepdim(0).unwrap();
        let norm = mean.sqr().unwrap().sum_all().unwrap().sqrt().unwrap();
        want.push(mean.broadcast_div(&norm).unwrap());
    }
    let want = Tensor::cat(&want, 0).unwrap();
    for fast in [true, false] {
        e.set_fast_path(fast).unwrap();
        let got = e.embed_with(&anchors(), &opts, 3, &mut |_| {}).unwrap();
        assert_close(&format!("fast path {fast}"), &rows(got), &want, 1e-5);
    }
    // And it differs from pooling the prompt too.
    let with = rows(
        embedder()
            .embed_with(&anchors(), &opts, 8, &mut |_| {})
            .unwrap(),
    );
    assert!(common::max_abs_diff(&with, &want) > 1e-3);
}

#[test]
fn prompt_and_dimension_errors_name_the_option() {
    let e = embedder();
    let texts = ["a text"];
    let err = |opts: EncodeOptions| err_text(e.embed_with(&texts, &opts, 8, &mut |_| {}));

    let msg = err(EncodeOptions {
        prompt_name: Some("passage".into()),
        ..Default::default()
    });
    assert!(
        msg.contains("prompt_name") && msg.contains("`passage`"),
        "{msg}"
    );
    assert!(msg.contains("`document`, `query`"), "{msg}");

    let msg = err(EncodeOptions {
        prompt_name: Some("query".into()),
        prompt: Some("q: ".into()),
        ..Default::default()
    });
    assert!(msg.contains("prompt") && msg.contains("both"), "{msg}");

    for d in [0, 65] {
        let msg = err(EncodeOptions {
            dimensions: Some(d),
            ..Default::default()
        });
        assert!(
            msg.starts_with("dimensions") && msg.contains(&d.to_string()) && msg.contains("64"),
            "{msg}"
        );
    }

    let long = "word ".repeat(40);
    let msg = err(EncodeOptions {
        prompt: Some(long),
        ..Default::default()
    });
    assert!(
        msg.contains("prompt") && msg.contains("max length 32"),
        "{msg}"
    );

    let mut e = embedder();
    let err = err_text(e.set_prompts(BTreeMap::new(), Some("query".into())));
    assert!(
        err.contains("default_prompt_name") && err.contains("`query`"),
        "{err}"
    );
}

#[test]
fn one_row_poolings_on_the_fast_path_equal_the_candle_path() {
    // [CLS] pooling and the pooler read one row per text, so the fast path
    // runs its last layer at that row only; the candle modules run it
    // whole. With the query prompt left out of pooling, the row is the
    // first past the prompt.
    for pooling in [bertha::Pooling::Cls, bertha::Pooling::Pooler] {
        let opts = EmbedOptions {
            pooling: Some(pooling),
            ..Default::default()
        };
        let mut e = Embedder::from_dir(&dir(), &Device::Cpu, &opts).unwrap();
        for include_prompt in [true, false] {
            e.set_include_prompt(include_prompt);
            let encode = EncodeOptions {
                prompt_name: Some("query".into()),
                ..Default::default()
            };
            let mut got = Vec::new();
            for fast in [true, false] {
                e.set_fast_path(fast).unwrap();
                assert_eq!(e.uses_fast_path(), fast);
                got.push(rows(
                    e.embed_with(&anchors(), &encode, 3, &mut |_| {}).unwrap(),
                ));
            }
            let what = format!("{pooling:?}, include_prompt {include_prompt}");
            assert_close(&what, &got[0], &got[1], 1e-5);
        }
    }
}

#[test]
fn batches_side_by_side_give_the_vectors_of_batches_in_turn() {
    // Called from outside the thread pool, the fast path runs batches
    // side by side; inside a one-thread pool, one after another. A batch's
    // rows do not depend on which runs it, so the bits are the same, in
    // input order, and progress counts every text once.
    let words: Vec<String> = anchors()
        .iter()
        .flat_map(|a| a.split(' ').map(str::to_string).collect::<Vec<_>>())
        .collect();
    let texts: Vec<String> = (0..40)
        .map(|i| {
            let n = 1 + (i * 7) % 19;
            (0..n)
                .map(|j| words[(i + j * 3) % words.len()].as_str())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let e = embedder();
    assert!(e.uses_fast_path());
    let mut seen = Vec::new();
    let side_by_side = e.embed(&texts, 3, &mut |done| seen.push(done)).unwrap();
    assert_eq!(seen.len(), texts.len().div_ceil(3));
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    assert_eq!(seen.last(), Some(&texts.len()));
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let in_turn = one.install(|| e.embed(&texts, 3, &mut |_| {}).unwrap());
    assert_eq!(side_by_side, in_turn);
    // One batch's worth of texts (of 300 tokens and more) is cut into up
    // to one part a thread: the same rows again.
    let long: Vec<String> = texts.iter().map(|t| format!("{t} {t} {t}")).collect();
    let mut calls = 0;
    let whole = e.embed(&long, 40, &mut |_| calls += 1).unwrap();
    assert_eq!(
        whole,
        one.install(|| e.embed(&long, 40, &mut |_| {}).unwrap())
    );
    let tokens: usize = e
        .encode_texts(&long, &EncodeOptions::default())
        .unwrap()
        .iter()
        .map(|t| t.len())
        .sum();
    assert!(tokens >= 600, "{tokens} tokens");
    let parts = (tokens / 300).clamp(1, rayon::current_num_threads());
    assert_eq!(
        calls,
        40usize.div_ceil(40usize.div_ceil(parts)),
        "progress calls"
    );
    let tokens = e.embed_tokens(&texts, 3, &mut |_| {}).unwrap();
    let tokens_in_turn = one.install(|| e.embed_tokens(&texts, 3, &mut |_| {}).unwrap());
    for (a, b) in tokens.iter().zip(&tokens_in_turn) {
        assert_eq!(a.embeddings, b.embeddings);
    }
}
