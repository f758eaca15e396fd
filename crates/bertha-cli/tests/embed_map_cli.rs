//! `bertha embed-map` end to end with the tiny test checkpoint: the same
//! seed writes the same coordinates, pictures have one point per input,
//! and bad inputs fail with messages naming the file and column.

mod common;

use common::{failure, tiny};

use std::path::{Path, PathBuf};
use std::process::Output;

fn run(args: &[&str]) -> Output {
    common::run(&[&["embed-map"], args].concat())
}

fn summary(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    assert_eq!(stdout.lines().count(), 1, "one JSON line: {stdout}");
    serde_json::from_str(stdout.trim()).unwrap()
}

/// 30 rows per label (labels `neg` / `pos`), with quotes and commas in the texts.
fn dataset(dir: &Path) -> PathBuf {
    let words = [
        "good", "great", "fine", "bad", "awful", "dull", "warm", "cold", "funny", "slow",
    ];
    let mut body = String::from("id\tsentence\tlabel\n");
    for i in 0..60 {
        let label = if i % 2 == 0 { "pos" } else { "neg" };
        let w = words[(i * 7) % words.len()];
        body.push_str(&format!(
            "{i}\tthe film , \"{w}\" and {} {w} .\t{label}\n",
            words[i % words.len()]
        ));
    }
    let p = dir.join("data.tsv");
    std::fs::write(&p, body).unwrap();
    p
}

#[test]
fn same_seed_same_coordinates_and_a_valid_png() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path());
    let data = data.to_str().unwrap();
    let args = |png: &str, csv: &str, seed: &str| {
        let png = dir.path().join(png).display().to_string();
        let csv = dir.path().join(csv).display().to_string();
        vec![
            "--model".to_string(),
            tiny("bert-mlm"),
            "--input".into(),
            data.into(),
            "--per-label".into(),
            "20".into(),
            "--perplexity".into(),
            "8".into(),
            "--seed".into(),
            seed.into(),
            "--out".into(),
            png,
            "--coords".into(),
            csv,
            "--size".into(),
            "600x500".into(),
        ]
    };
    let a = args("a.png", "a.csv", "3");
    let b = args("b.png", "b.csv", "3");
    let c = args("c.png", "c.csv", "4");
    let run_s = |v: &Vec<String>| run(&v.iter().map(String::as_str).collect::<Vec<_>>());
    let sa = summary(&run_s(&a));
    summary(&run_s(&b));
    summary(&run_s(&c));

    let csv_a = std::fs::read(dir.path().join("a.csv")).unwrap();
    let csv_b = std::fs::read(dir.path().join("b.csv")).unwrap();
    let csv_c = std::fs::read(dir.path().join("c.csv")).unwrap();
    assert_eq!(csv_a, csv_b, "the same seed gives the same coordinates");
    assert_ne!(csv_a, csv_c, "another seed gives other coordinates");
    assert_eq!(
        std::fs::read(dir.path().join("a.png")).unwrap(),
        std::fs::read(dir.path().join("b.png")).unwrap(),
        "and the same picture"
    );

    // The CSV: a header, one properly quoted row per point, 20 per label.
    let mut reader = csv::Reader::from_reader(&csv_a[..]);
    assert_eq!(
        reader.headers().unwrap(),
        vec!["line", "x", "y", "label", "text"]
    );
    let rows: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
    assert_eq!(rows.len(), 40);
    assert_eq!(rows.iter().filter(|r| &r[3] == "pos").count(), 20);
    assert_eq!(&rows[0][0], "2", "input line of the first row");
    assert!(rows[0][4].starts_with("the film , \""), "{:?}", &rows[0]);
    for r in &rows {
        assert!(r[1].parse::<f64>().unwrap().is_finite());
        assert!(r[2].parse::<f64>().unwrap().is_finite());
    }

    assert_eq!(sa["n"], 40);
    assert_eq!(sa["labels"]["neg"], 20);
    assert_eq!(sa["method"], "tsne");
    assert_eq!(sa["pooling"], "mean");
    assert_eq!(sa["model"], "bert-mlm");
    assert_eq!(sa["knn_k"], 10);
    assert_eq!(sa["knn_metric"], "cosine");
    let sil = sa["silhouette"].as_f64().unwrap();
    assert!((-1.0..=1.0).contains(&sil), "{sil}");
    let acc = sa["knn_accuracy"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&acc), "{acc}");

    let png = std::fs::read(dir.path().join("a.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let reader = png::Decoder::new(std::io::Cursor::new(&png))
        .read_info()
        .unwrap();
    assert_eq!((reader.info().width, reader.info().height), (600, 500));
}

#[test]
fn svg_has_one_circle_per_text_with_pca_and_a_labels_file() {
    let dir = tempfile::tempdir().unwrap();
    let texts = dir.path().join("texts.txt");
    let labels = dir.path().join("labels.txt");
    let lines: Vec<String> = (0..25).map(|i| format!("sentence number {i}")).collect();
    std::fs::write(&texts, lines.join("\n")).unwrap();
    let names: Vec<&str> = (0..25).map(|i| ["a", "b", "c"][i % 3]).collect();
    std::fs::write(&labels, names.join("\n") + "\n").unwrap();
    let svg = dir.path().join("map.svg");
    let out = run(&[
        "--model",
        &tiny("bert-mlm"),
        "--input",
        texts.to_str().unwrap(),
        "--labels",
        labels.to_str().unwrap(),
        "--method",
        "pca",
        "--label-names",
        "a=alpha,c=gamma",
        "--pooling",
        "cls",
        "--out",
        svg.to_str().unwrap(),
    ]);
    let s = summary(&out);
    assert_eq!(s["method"], "pca");
    assert_eq!(s["pooling"], "cls");
    let ratio = s["explained_variance_ratio"].as_array().unwrap();
    assert!(ratio[0].as_f64().unwrap() >= ratio[1].as_f64().unwrap());
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<circle").count(), 25);
    assert!(
        svg.contains("bert-mlm · cls pooling · PCA"),
        "title names model, pooling, method"
    );
    assert!(
        svg.contains("gamma (n=8)"),
        "legend with named labels and counts"
    );
    assert!(svg.contains("b (n=8)") && svg.contains("alpha (n=9)"));
}

#[test]
fn bad_inputs_fail_clearly_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path());
    let png = dir.path().join("x.png");
    let base = |extra: &[&str]| {
        let mut v = vec![
            "--model".to_string(),
            tiny("bert-mlm"),
            "--out".into(),
            png.display().to_string(),
        ];
        v.extend(extra.iter().map(|s| s.to_string()));
        run(&v.iter().map(String::as_str).collect::<Vec<_>>())
    };

    let err = failure(&base(&[
        "--input",
        data.to_str().unwrap(),
        "--label-column",
        "sentiment",
    ]));
    assert!(
        err.contains("data.tsv") && err.contains("no label column `sentiment`"),
        "{err}"
    );

    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    let err = failure(&base(&["--input", empty.to_str().unwrap()]));
    assert!(err.contains("empty.txt: the input is empty"), "{err}");

    let err = failure(&base(&["--input", data.to_str().unwrap(), "--limit", "10"]));
    assert!(
        err.contains("perplexity 30 is too large for 10 points"),
        "{err}"
    );

    let err = failure(&run(&[
        "--model",
        &tiny("bert-mlm"),
        "--input",
        data.to_str().unwrap(),
        "--out",
        dir.path().join("x.gif").to_str().unwrap(),
    ]));
    assert!(err.contains(".png or .svg"), "{err}");
    assert!(!png.exists());
}
