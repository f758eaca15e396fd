//! `bertha embed` on SPLADE models: one `{"embedding": [{index, value}]}`
//! line per text, equal to the library's sparse vectors, streamed and
//! resumable as dense output is; and the errors of SPLADE options.

mod common;

use std::path::Path;

use bertha::{EmbedOptions, Embedder, Pooling, SparseVector};
use common::*;

fn st_folder() -> String {
    fixtures()
        .join("splade/st-folder")
        .to_string_lossy()
        .into_owned()
}

fn library(dir: &Path, pooling: Option<Pooling>) -> Embedder {
    let opts = EmbedOptions {
        pooling,
        ..EmbedOptions::default()
    };
    Embedder::from_dir(dir, &candle_core::Device::Cpu, &opts).unwrap()
}

fn sparse_lines(lines: &[serde_json::Value]) -> Vec<SparseVector> {
    lines
        .iter()
        .map(|l| serde_json::from_value(l["embedding"].clone()).unwrap())
        .collect()
}

#[track_caller]
fn assert_same(got: &[SparseVector], want: &[SparseVector]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.indices(), w.indices(), "text {}", i + 1);
        let d = g
            .values()
            .iter()
            .zip(w.values())
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(d <= 1e-5, "text {}: {d:e}", i + 1);
    }
}

#[test]
fn a_sparse_encoder_folder_writes_sparse_lines() {
    let texts = ["the city was known for its university", "he said", ""];
    let mut args = vec!["embed", "--model"];
    let model = st_folder();
    args.push(&model);
    args.extend(texts);
    let lines = ok_lines(&run(&args));
    // TEI's shape: {index, value} entries by increasing index.
    let first = &lines[0]["embedding"][0];
    assert!(
        first["index"].is_u64() && first["value"].is_f64(),
        "{first}"
    );
    let want = library(Path::new(&model), None)
        .embed_sparse(&texts, 8, &mut |_| {})
        .unwrap();
    assert_same(&sparse_lines(&lines), &want);
}

/// `--pooling splade` on a masked-LM checkpoint, over several chunks of
/// texts into a file, and resumed after an interruption.
#[test]
fn pooling_splade_streams_and_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let words = ["the", "city", "was", "known", "for", "its", "university"];
    let texts: Vec<String> = (0..1100)
        .map(|i| {
            (0..1 + (i * 5) % 17)
                .map(|k| words[(i + k) % words.len()])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let input = tmp.path().join("in.txt");
    std::fs::write(&input, texts.join("\n")).unwrap();
    let output = tmp.path().join("out.jsonl");
    let model = tiny("bert-mlm");
    let embed = |extra: &[&str]| {
        let mut args = vec![
            "embed",
            "--model",
            &model,
            "--pooling",
            "splade",
            "--batch-size",
            "4",
            "--input",
            s(&input),
            "--output",
            s(&output),
        ];
        args.extend(extra);
        run(&args)
    };
    ok(&embed(&[]));
    let want = library(&tiny_dir("bert-mlm"), Some(Pooling::Splade))
        .embed_sparse(&texts, 32, &mut |_| {})
        .unwrap();
    assert_same(&sparse_lines(&read_jsonl(&output)), &want);

    let whole = std::fs::read_to_string(&output).unwrap();
    let lines: Vec<&str> = whole.lines().collect();
    let partial = tmp.path().join("out.jsonl.partial");
    std::fs::remove_file(&output).unwrap();
    std::fs::write(&partial, format!("{}\n{{\"embed", lines[..1050].join("\n"))).unwrap();
    let out = embed(&["--resume-output"]);
    assert_stderr_has(&out, "resuming after the 1050 lines already written");
    let resumed = std::fs::read_to_string(&output).unwrap();
    // The lines kept are the same bytes; the texts run again share their
    // batches with other texts than before, and the MLM head's matrix
    // product can differ in the last bit with its row count.
    assert!(resumed.starts_with(&format!("{}\n", lines[..1050].join("\n"))));
    assert_same(&sparse_lines(&read_jsonl(&output)), &want);
}

#[test]
fn splade_option_errors_leave_no_output() {
    let tmp = tempfile::tempdir().unwrap();
    let output = tmp.path().join("out.jsonl");
    let model = st_folder();
    let out = run(&[
        "embed",
        "--model",
        &model,
        "--dimensions",
        "8",
        "--output",
        s(&output),
        "a text",
    ]);
    assert_mentions(&failure(&out), &["--dimensions", "dense"]);
    assert!(!output.exists() && !tmp.path().join("out.jsonl.partial").exists());

    let out = run(&[
        "embed",
        "--model",
        &tiny("bert-seqcls"),
        "--pooling",
        "splade",
        "a text",
    ]);
    assert_mentions(
        &failure(&out),
        &[
            "bert-seqcls",
            "splade",
            "missing tensor `cls.predictions.transform.dense.weight`",
        ],
    );
    let out = run(&[
        "embed",
        "--model",
        &tiny("bert-mlm"),
        "--pooling",
        "sparse",
        "a",
    ]);
    assert_mentions(&failure(&out), &["--pooling", "`sparse`", "splade"]);
}
