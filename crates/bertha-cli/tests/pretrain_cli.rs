//! `bertha pretrain` end to end: a short run on the committed corpus slice
//! writes metrics, a loss curve and checkpoints; `--resume` continues it
//! exactly; the result loads in `bertha fill-mask`.

mod common;

use common::{
    failure, ok, prepare_tiny_corpus, read_json, read_jsonl, repo, run, run_model, s, tiny_dir,
    with_key,
};

use std::path::Path;
use std::process::Output;

use serde_json::Value;

/// `bertha pretrain` of `corpus` with the `config` (a file or a preset)
/// into `out`, then `extra` flags.
fn pretrain_with(corpus: &str, config: &str, out: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "pretrain",
        "--corpus",
        corpus,
        "--config",
        config,
        "--out",
        s(out),
    ];
    args.extend_from_slice(extra);
    run(&args)
}

/// Four steps on the corpus slice from the tiny MLM checkpoint's config
/// and tokenizer, evaluated and saved every two, then `extra` flags.
fn pretrain(out: &Path, extra: &[&str]) -> Output {
    let corpus = repo().join("tests/fixtures/corpus-wiki-slice.txt");
    pretrain_corpus(s(&corpus), out, extra)
}

/// [`pretrain`] on `corpus` (text or a prepared folder).
fn pretrain_corpus(corpus: &str, out: &Path, extra: &[&str]) -> Output {
    let tiny = tiny_dir("bert-mlm");
    let config = tiny.join("config.json");
    let mut args = vec![
        "--tokenizer",
        s(&tiny),
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
    pretrain_with(corpus, s(&config), out, &args)
}

fn metrics(dir: &Path) -> Vec<Value> {
    read_jsonl(&dir.join("metrics.jsonl"))
}

#[test]
fn pretrain_writes_a_model_that_fill_mask_loads_and_resumes_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    let out = pretrain(&a, &[]);
    ok(&out);
    let m = metrics(&a);
    let steps = with_key(&m, "loss");
    let evals = with_key(&m, "eval_mlm_loss");
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
    let v: Value =
        serde_json::from_str(&ok(&run_model("fill-mask", &a, &["the [MASK] is here."]))).unwrap();
    let preds = v.as_array().unwrap();
    assert_eq!(preds.len(), 5);
    let total: f64 = preds.iter().map(|p| p["score"].as_f64().unwrap()).sum();
    assert!(total > 0.0 && total <= 1.0 + 1e-6);

    // Resume: copy the output folder as it stood after step 2, continue.
    let b = tmp.path().join("b");
    std::fs::create_dir_all(&b).unwrap();
    let ck = a.join("checkpoint-2");
    let out = pretrain(&b, &["--resume", ck.to_str().unwrap()]);
    ok(&out);
    let m = metrics(&b);
    let resumed = with_key(&m, "loss");
    assert_eq!(resumed.len(), 2);
    for (r, s) in resumed.into_iter().zip(&steps[2..]) {
        for key in ["step", "loss", "mlm_accuracy", "grad_norm", "lr"] {
            assert_eq!(r[key], s[key], "{key}");
        }
    }
}

/// An output folder belongs to one run: a second run refuses it (or
/// replaces it with --overwrite), and --resume refuses changed options
/// unless --allow-changes names them.
#[test]
fn pretrain_keeps_runs_apart() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    ok(&pretrain(&a, &[]));
    let err = failure(&pretrain(&a, &[]));
    assert!(
        err.contains(&format!("--out {} holds another run", a.display())),
        "{err}"
    );
    ok(&pretrain(&a, &["--overwrite"]));
    assert_eq!(with_key(&metrics(&a), "loss").len(), 4);
    let ck = a.join("checkpoint-2");
    let resume = ["--resume", s(&ck), "--weight-decay", "0.1"];
    let err = failure(&pretrain(&a, &resume));
    assert!(
        err.contains("--resume") && err.contains("adamw.weight_decay (was 0.01, now 0.1)"),
        "{err}"
    );
    let allowed = [&resume[..], &["--allow-changes", "weight_decay"]].concat();
    ok(&pretrain(&a, &allowed));
    let err = failure(&pretrain(&a, &["--max-grad-norm", "-1"]));
    assert!(err.contains("--max-grad-norm -1"), "{err}");
}

#[test]
fn pretrain_rejects_bad_options_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let err = failure(&pretrain(
        &tmp.path().join("x"),
        &["--mask-split", "90,20,0"],
    ));
    assert!(err.contains("--mask-split"));
    let one = tmp.path().join("one.txt");
    std::fs::write(&one, "just one document.\n").unwrap();
    let err = failure(&pretrain_with(
        s(&one),
        "tiny",
        &tmp.path().join("z"),
        &["--nsp"],
    ));
    assert!(err.contains("--nsp needs at least two documents"), "{err}");
    let err = failure(&pretrain_with(
        "/nonexistent/corpus.txt",
        "tiny",
        &tmp.path().join("y"),
        &[],
    ));
    assert!(err.contains("/nonexistent/corpus.txt"), "{err}");
    let err = failure(&pretrain_with("x", "huge", Path::new("y"), &[]));
    assert!(err.contains("preset"));
}

#[test]
fn pretrain_can_learn_its_own_vocabulary() {
    let tmp = tempfile::tempdir().unwrap();
    let out_dir = tmp.path().join("v");
    let corpus = repo().join("tests/fixtures/corpus-wiki-slice.txt");
    let out = pretrain_with(
        s(&corpus),
        "tiny",
        &out_dir,
        &[
            "--train-tokenizer",
            "700",
            "--steps",
            "2",
            "--batch-size",
            "2",
            "--seq-len",
            "32",
        ],
    );
    ok(&out);
    let vocab = std::fs::read_to_string(out_dir.join("tokenizer/vocab.txt")).unwrap();
    let n = vocab.lines().count();
    assert!((500..=700).contains(&n), "{n} tokens");
    assert!(vocab.starts_with("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n"));
    // The model is sized to the new vocabulary and ships it.
    let config = read_json(&out_dir.join("config.json"));
    assert_eq!(config["vocab_size"].as_u64(), Some(n as u64));
    assert_eq!(
        std::fs::read_to_string(out_dir.join("vocab.txt")).unwrap(),
        vocab
    );
}

/// `prepare-corpus` then `pretrain --corpus DIR` trains on the very
/// sequences the text corpus gives: the same metrics, line for line; a
/// prepared corpus refuses another tokenizer.
#[test]
fn pretraining_from_a_prepared_corpus_equals_pretraining_from_text() {
    let tmp = tempfile::tempdir().unwrap();
    let prepared = tmp.path().join("prepared");
    let out = prepare_tiny_corpus(&prepared, 2000);
    let header: Value = serde_json::from_str(ok(&out).trim()).unwrap();
    assert!(header["shards"].as_array().unwrap().len() > 2, "{header}");
    assert_eq!(header["token_bytes"], 2);

    let from_text = tmp.path().join("text");
    ok(&pretrain(&from_text, &[]));
    let from_prepared = tmp.path().join("shards");
    let out = pretrain_corpus(s(&prepared), &from_prepared, &[]);
    ok(&out);
    let (a, b) = (metrics(&from_text), metrics(&from_prepared));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        for key in ["loss", "mlm_loss", "mlm_accuracy", "grad_norm", "eval_loss"] {
            assert_eq!(x.get(key), y.get(key), "{key}: {x} vs {y}");
        }
    }
    // Another tokenizer than the one it was prepared with.
    let other = repo().join("tests/fixtures/minilm-tokenizer");
    let err = failure(&pretrain_with(
        s(&prepared),
        "tiny",
        &tmp.path().join("other"),
        &["--tokenizer", s(&other), "--steps", "1"],
    ));
    assert!(err.contains("another tokenizer"), "{err}");
}

/// `--objective electra` from the tiny BERT config: the discriminator at
/// the root (ElectraForPreTraining), the generator in generator/, both
/// parts of the loss and the discriminator's accuracy in metrics.jsonl,
/// the held-out loss at each evaluation, and a discriminator that
/// `finetune` and `classify` take.
#[test]
fn pretrain_electra_writes_discriminator_and_generator() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("electra");
    ok(&pretrain(
        &out,
        &["--objective", "electra", "--generator-size", "0.5"],
    ));
    let config = read_json(&out.join("config.json"));
    assert_eq!(config["model_type"], "electra");
    assert_eq!(config["architectures"][0], "ElectraForPreTraining");
    let gen = read_json(&out.join("generator").join("config.json"));
    assert_eq!(gen["architectures"][0], "ElectraForMaskedLM");
    assert_eq!(
        gen["hidden_size"].as_u64().unwrap() * 2,
        config["hidden_size"].as_u64().unwrap()
    );
    let m = metrics(&out);
    let steps: Vec<&Value> = m.iter().filter(|l| l.get("loss").is_some()).collect();
    assert_eq!(steps.len(), 4);
    for l in &steps {
        let f = |k: &str| l[k].as_f64().unwrap();
        let total = f("generator_loss") + 50.0 * f("discriminator_loss");
        assert!((f("loss") - total).abs() < 1e-6 * total, "{l}");
        assert!(f("discriminator_accuracy") > 0.0);
    }
    let evals: Vec<&Value> = m
        .iter()
        .filter(|l| l.get("eval_total_loss").is_some())
        .collect();
    assert_eq!(evals.len(), 2);
    assert!(evals[0]["eval_discriminator_accuracy"].as_f64().unwrap() > 0.0);
    // The discriminator fine-tunes as a classifier.
    let ft = tmp.path().join("ft");
    let sst = repo().join("tests/fixtures/finetune/sst2-dev-head.tsv");
    ok(&run(&[
        "finetune",
        "--task",
        "classification",
        "--model",
        s(&out),
        "--train",
        s(&sst),
        "--out",
        s(&ft),
        "--epochs",
        "1",
        "--max-train",
        "8",
        "--batch-size",
        "4",
    ]));
    let ft_config = read_json(&ft.join("config.json"));
    assert_eq!(
        ft_config["architectures"][0],
        "ElectraForSequenceClassification"
    );
    // Options ELECTRA has no use for are refused by name.
    let err = failure(&pretrain(
        &tmp.path().join("x"),
        &["--objective", "electra", "--nsp"],
    ));
    assert!(err.contains("--nsp"), "{err}");
    let err = failure(&pretrain(&tmp.path().join("y"), &["--objective", "bart"]));
    assert!(err.contains("--objective"), "{err}");
}
