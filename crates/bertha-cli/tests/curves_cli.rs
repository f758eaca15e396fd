//! `bertha curves`: one chart of a metric from several runs'
//! `metrics.jsonl`, with a JSON line per run; bad inputs are named.

mod common;

use std::path::Path;

fn run_dir(root: &Path, name: &str, lines: &[&str]) -> String {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("metrics.jsonl"), lines.join("\n") + "\n").unwrap();
    dir.display().to_string()
}

#[test]
fn curves_draw_each_run_and_report_its_figures() {
    let tmp = tempfile::tempdir().unwrap();
    // Step lines and evaluation lines interleaved, as a run writes them.
    let a = run_dir(
        tmp.path(),
        "a",
        &[
            r#"{"step":1,"loss":9.0,"lr":0.1,"grad_norm":1.0,"tokens_per_s":1.0,"elapsed_s":1.0}"#,
            r#"{"step":2,"eval_loss":7.5,"eval_mlm_loss":7.5}"#,
            r#"{"step":3,"loss":8.0,"lr":0.1,"grad_norm":1.0,"tokens_per_s":1.0,"elapsed_s":2.0}"#,
            r#"{"step":4,"eval_loss":7.0,"eval_mlm_loss":7.0}"#,
            r#"{"step":6,"eval_loss":7.25,"eval_mlm_loss":7.25}"#,
        ],
    );
    let b = run_dir(
        tmp.path(),
        "b",
        &[
            r#"{"step":2,"eval_mlm_loss":8.0}"#,
            r#"{"step":4,"eval_mlm_loss":6.5}"#,
        ],
    );
    let png = tmp.path().join("chart.png");
    let out = common::run(&[
        "curves",
        "--metric",
        "eval_mlm_loss",
        "--out",
        png.to_str().unwrap(),
        &format!("80/10/10={a}"),
        &b,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["run"], "80/10/10");
    assert_eq!(lines[0]["points"], 3);
    assert_eq!(lines[0]["last_step"], 6.0);
    assert_eq!(lines[0]["last"], 7.25);
    assert_eq!(lines[0]["min_step"], 4.0);
    assert_eq!(lines[0]["min"], 7.0);
    assert_eq!(lines[1]["run"], "b");
    assert_eq!(lines[1]["min"], 6.5);
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[1..4], b"PNG");

    // The axis is labelled as asked (in an SVG the label is text).
    let svg = tmp.path().join("chart.svg");
    let out = common::run(&[
        "curves",
        "--metric",
        "eval_mlm_loss",
        "--x-label",
        "pre-training minutes",
        "--out",
        svg.to_str().unwrap(),
        &b,
    ]);
    assert!(out.status.success());
    let text = std::fs::read_to_string(&svg).unwrap();
    // plotters writes each text on a line of its own.
    assert!(text.contains(">\npre-training minutes\n</text>"), "{text}");
    assert!(!text.contains(">\nstep\n</text>"));

    // A metric no line has, a missing folder and a broken line are named.
    let err = |args: &[&str]| {
        let out = common::run(&[&["curves", "--out", png.to_str().unwrap()], args].concat());
        assert!(!out.status.success());
        String::from_utf8(out.stderr).unwrap()
    };
    let e = err(&["--metric", "accuracy", &b]);
    assert!(e.contains("no line has the metric `accuracy`"), "{e}");
    let missing = tmp.path().join("nowhere").display().to_string();
    let e = err(&[&missing]);
    assert!(e.contains("nowhere/metrics.jsonl"), "{e}");
    let broken = run_dir(
        tmp.path(),
        "broken",
        &[r#"{"step":1,"eval_loss":2.0}"#, "{oops"],
    );
    let e = err(&[&broken]);
    assert!(e.contains("line 2: not JSON"), "{e}");
}
