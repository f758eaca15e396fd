//! `bertha pretrain` end to end: a short run on the committed corpus slice
//! writes metrics, a loss curve and checkpoints; `--resume` continues it
//! exactly; the result loads in `bertha fill-mask`.

mod common;

use common::{repo, run};

use std::path::Path;
use std::process::Output;

use serde_json::Value;

fn pretrain(out: &Path, extra: &[&str]) -> Output {
    let corpus = repo().join("tests/fixtures/corpus-wiki-slice.txt");
    let tiny = repo().join("tests/fixtures/tiny/bert-mlm");
    let config = tiny.join("config.json");
    let mut args = vec![
        "pretrain",
        "--corpus",
        corpus.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
        "--tokenizer",
        tiny.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--steps",
        "4",
        "--batch-size",
        "4",
        "--seq-len",
        "32",
        "--save-every",
        "2",
        "--eval-every",
        "2",
        "--lr",
        "1e-3",
    ];
    args.extend_from_slice(extra);
    run(&args)
}

fn metrics(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn pretrain_writes_a_model_that_fill_mask_loads_and_resumes_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    let out = pretrain(&a, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = metrics(&a);
    let steps: Vec<&Value> = m.iter().filter(|v| v.get("loss").is_some()).collect();
    let evals: Vec<&Value> = m
        .iter()
        .filter(|v| v.get("eval_mlm_loss").is_some())
        .collect();
    assert_eq!(steps.len(), 4);
    assert_eq!(evals.len(), 2);
    for s in &steps {
        for key in [
            "loss",
            "mlm_loss",
            "mlm_accuracy",
            "lr",
            "grad_norm",
            "tokens_per_s",
        ] {
            assert!(s[key].as_f64().unwrap().is_finite(), "{key} in {s}");
        }
    }
    // Near ln(1024) = 6.9 for a fresh 1,024-token vocabulary (a little
    // above: this config initialises with std 0.2, not 0.02).
    let first = steps[0]["mlm_loss"].as_f64().unwrap();
    assert!((6.0..9.0).contains(&first), "{first}");
    for f in ["config.json", "model.safetensors", "vocab.txt", "loss.png"] {
        assert!(a.join(f).is_file(), "{f} missing");
    }
    let png = std::fs::read(a.join("loss.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    for ck in ["checkpoint-2", "checkpoint-4"] {
        for f in [
            "model.safetensors",
            "optimizer.safetensors",
            "trainer_state.json",
            "config.json",
        ] {
            assert!(a.join(ck).join(f).is_file(), "{ck}/{f} missing");
        }
    }

    // The result is a BertForMaskedLM checkpoint fill-mask can use.
    let out = run(&[
        "fill-mask",
        "--model",
        a.to_str().unwrap(),
        "the [MASK] is here.",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let preds = v.as_array().unwrap();
    assert_eq!(preds.len(), 5);
    let total: f64 = preds.iter().map(|p| p["score"].as_f64().unwrap()).sum();
    assert!(total > 0.0 && total <= 1.0 + 1e-6);

    // Resume: copy the output folder as it stood after step 2, continue.
    let b = tmp.path().join("b");
    std::fs::create_dir_all(&b).unwrap();
    let ck = a.join("checkpoint-2");
    let out = pretrain(&b, &["--resume", ck.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let resumed: Vec<Value> = metrics(&b)
        .into_iter()
        .filter(|v| v.get("loss").is_some())
        .collect();
    assert_eq!(resumed.len(), 2);
    for (r, s) in resumed.iter().zip(&steps[2..]) {
        for key in ["step", "loss", "mlm_accuracy", "grad_norm", "lr"] {
            assert_eq!(r[key], s[key], "{key}");
        }
    }
}

#[test]
fn pretrain_rejects_bad_options_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let out = pretrain(&tmp.path().join("x"), &["--mask-split", "90,20,0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--mask-split"));
    let one = tmp.path().join("one.txt");
    std::fs::write(&one, "just one document.\n").unwrap();
    let out = run(&[
        "pretrain",
        "--corpus",
        one.to_str().unwrap(),
        "--config",
        "tiny",
        "--nsp",
        "--out",
        tmp.path().join("z").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--nsp needs at least two documents"), "{err}");
    let out = run(&[
        "pretrain",
        "--corpus",
        "/nonexistent/corpus.txt",
        "--config",
        "tiny",
        "--out",
        tmp.path().join("y").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/corpus.txt"), "{err}");
    let out = run(&[
        "pretrain", "--corpus", "x", "--config", "huge", "--out", "y",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("preset"));
}

#[test]
fn pretrain_can_learn_its_own_vocabulary() {
    let tmp = tempfile::tempdir().unwrap();
    let out_dir = tmp.path().join("v");
    let corpus = repo().join("tests/fixtures/corpus-wiki-slice.txt");
    let out = run(&[
        "pretrain",
        "--corpus",
        corpus.to_str().unwrap(),
        "--config",
        "tiny",
        "--train-tokenizer",
        "700",
        "--out",
        out_dir.to_str().unwrap(),
        "--steps",
        "2",
        "--batch-size",
        "2",
        "--seq-len",
        "32",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let vocab = std::fs::read_to_string(out_dir.join("tokenizer/vocab.txt")).unwrap();
    let n = vocab.lines().count();
    assert!((500..=700).contains(&n), "{n} tokens");
    assert!(vocab.starts_with("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n"));
    // The model is sized to the new vocabulary and ships it.
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("config.json")).unwrap())
            .unwrap();
    assert_eq!(config["vocab_size"].as_u64(), Some(n as u64));
    assert_eq!(
        std::fs::read_to_string(out_dir.join("vocab.txt")).unwrap(),
        vocab
    );
}
