//! Data-parallel training under `mpiexec -np N` on loopback (an MPI build;
//! `scripts/test.sh` enables the feature where an MPI is installed): N
//! processes with global batch B give one process's per-step losses and
//! final weights, resume works with another process count, a process with
//! other options is refused at start, and a killed process ends the job.
#![cfg(feature = "mpi")]

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{failure, ok, prepare_tiny_corpus, read_jsonl, repo, run, s, tiny_dir};
use serde_json::Value;

/// `bertha ARGS` under `mpiexec -np n` (`n` = 1: the plain binary).
fn launch(n: usize, args: &[String]) -> Command {
    let bin = env!("CARGO_BIN_EXE_bertha");
    let mut c = if n == 1 {
        Command::new(bin)
    } else {
        let mut c = Command::new("mpiexec");
        c.args(["-np", &n.to_string(), bin]);
        c
    };
    c.args(args)
        .env_remove("BERTHA_MODEL")
        .env("RAYON_NUM_THREADS", "1")
        .stdin(Stdio::null());
    c
}

fn train(n: usize, args: &[String]) -> Output {
    launch(n, args).output().unwrap()
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

/// Pre-training arguments on the committed corpus slice, 20 steps of 8,
/// dropout and masking on (the tiny checkpoints' configs).
fn pretrain_args(tiny: &str, nsp: bool, out: &Path) -> Vec<String> {
    let dir = tiny_dir(tiny);
    let corpus = repo().join("tests/fixtures/corpus-wiki-slice.txt");
    let mut a = strings(&[
        "pretrain",
        "--corpus",
        s(&corpus),
        "--config",
        s(&dir.join("config.json")),
        "--tokenizer",
        s(&dir),
        "--steps",
        "20",
        "--batch-size",
        "8",
        "--seq-len",
        "32",
        "--eval-every",
        "10",
        "--save-every",
        "10",
        "--lr",
        "1e-3",
        "--out",
        s(out),
    ]);
    if nsp {
        a.push("--nsp".into());
    }
    a
}

/// Classification fine-tuning of the tiny classifier on 40 SST-2 rows:
/// 24 steps of 7 (the last batch of an epoch short), scored on the same
/// rows at every epoch in batches of 8 (each process scores its share).
fn finetune_args(out: &Path) -> Vec<String> {
    let data = repo().join("tests/fixtures/finetune/sst2-dev-head.tsv");
    task_args(
        "classification",
        &tiny_dir("bert-seqcls"),
        &data,
        out,
        &["--epochs", "4", "--batch-size", "7", "--max-length", "32"],
    )
}

/// Fine-tuning `task` from checkpoint `model` on `data`, scored on the
/// same file at every epoch in batches of 8 (each process its share).
fn task_args(task: &str, model: &Path, data: &Path, out: &Path, extra: &[&str]) -> Vec<String> {
    let mut a = strings(&[
        "finetune",
        "--task",
        task,
        "--model",
        s(model),
        "--train",
        s(data),
        "--dev",
        s(data),
        "--eval-batch-size",
        "8",
        "--lr",
        "1e-3",
        "--out",
        s(out),
    ]);
    a.extend(strings(extra));
    a
}

fn metrics(dir: &Path) -> Vec<Value> {
    read_jsonl(&dir.join("metrics.jsonl"))
}

/// The largest relative difference of the figures of two metrics files,
/// line by line (steps and evaluations alike: losses, gradient norms,
/// every evaluation score; timings aside).
fn max_rel_diff(a: &[Value], b: &[Value]) -> f64 {
    assert_eq!(a.len(), b.len(), "metrics lines");
    let mut worst = 0f64;
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x["step"], y["step"]);
        // Spearman correlations are rank statistics: where two dev cosines
        // nearly tie, rounding-level differences (another summation order)
        // swap their ranks and the statistic jumps. The continuous figures
        // (losses, Pearson) carry the equality.
        let figures = x.as_object().unwrap().iter().filter(|(k, _)| {
            !matches!(k.as_str(), "step" | "epoch" | "elapsed_s" | "tokens_per_s")
                && !k.contains("spearman")
        });
        for (key, p) in figures {
            if let Some(p) = p.as_f64() {
                let q = y[key]
                    .as_f64()
                    .unwrap_or_else(|| panic!("{key} missing at step {}", x["step"]));
                worst = worst.max((p - q).abs() / p.abs().max(1e-12));
            }
        }
        if let (Some(p), Some(q)) = (x["mlm_accuracy"].as_f64(), y["mlm_accuracy"].as_f64()) {
            assert_eq!(p, q, "MLM accuracy at step {}", x["step"]);
        }
    }
    worst
}

fn weights(dir: &Path) -> HashMap<String, Vec<f32>> {
    let t =
        candle_core::safetensors::load(dir.join("model.safetensors"), &candle_core::Device::Cpu)
            .unwrap();
    t.into_iter()
        .map(|(k, v)| (k, v.flatten_all().unwrap().to_vec1::<f32>().unwrap()))
        .collect()
}

/// Per tensor, the largest difference of two models' weights relative to
/// the tensor's largest magnitude.
fn weight_diffs(a: &Path, b: &Path) -> HashMap<String, f64> {
    let (wa, wb) = (weights(a), weights(b));
    assert_eq!(wa.len(), wb.len());
    wa.iter()
        .map(|(name, x)| {
            let scale = x.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12) as f64;
            let d = x
                .iter()
                .zip(&wb[name])
                .fold(0f64, |m, (p, q)| m.max((p - q).abs() as f64 / scale));
            (name.clone(), d)
        })
        .collect()
}

/// Runs `args_for(model, out)` on one process from `model` with its
/// weights nudged by 1e-7 (rounding-sized; three draws), and gives, per
/// tensor, the most that moves the final weights of the run in `one`. Some runs amplify
/// rounding past 1e-5 in 20 steps: a word-embedding row seen in one batch
/// moves by Adam steps set by one gradient sum; a parameter whose gradient
/// is zero in exact arithmetic (attention key biases; a QA head's bias and
/// the last layer's output bias, which shift every position's logit alike)
/// moves by Adam steps of its rounding noise alone.
fn rounding_diffs(
    tmp: &Path,
    model: &Path,
    one: &Path,
    args_for: impl Fn(&Path, &Path) -> Vec<String>,
) -> HashMap<String, f64> {
    let name = one.file_name().unwrap().to_str().unwrap();
    let mut worst: HashMap<String, f64> = HashMap::new();
    // The largest of three nudges (one draw says little).
    for seed in 1..=3u64 {
        let nudged_model = tmp.join(format!("{name}-nudged-model-{seed}"));
        copy_dir(model, &nudged_model);
        nudge_weights(&nudged_model.join("model.safetensors"), 1e-7, seed);
        let nudged = tmp.join(format!("{name}-nudged-{seed}"));
        ok(&train(1, &args_for(&nudged_model, &nudged)));
        for (tensor, d) in weight_diffs(one, &nudged) {
            let w = worst.entry(tensor).or_insert(0.0);
            *w = w.max(d);
        }
    }
    worst
}

/// Asserts the run in `b` equals the one-process run in `a`: every step's
/// figures and every evaluation within 1e-5, and each final weight tensor
/// within the larger of 1e-5 and 4 × what rounding alone does to it
/// (`rounding`, from [`rounding_diffs`]).
#[track_caller]
fn assert_same_run_up_to_rounding(a: &Path, b: &Path, rounding: &HashMap<String, f64>, what: &str) {
    let d = max_rel_diff(&metrics(a), &metrics(b));
    assert!(d <= 1e-5, "{what}: losses differ by {d:e}");
    for (name, w) in weight_diffs(a, b) {
        let bound = (4.0 * rounding[&name]).max(1e-5);
        assert!(
            w <= bound,
            "{what}: {name} differs by {w:e} (bound {bound:e})"
        );
    }
}

/// Runs `args_for(model, out)` on 2 and 3 processes; each equals the
/// one-process run in `one` as [`assert_same_run_up_to_rounding`] says.
fn same_on_2_and_3_up_to_rounding(
    tmp: &Path,
    model: &Path,
    one: &Path,
    name: &str,
    args_for: impl Fn(&Path, &Path) -> Vec<String>,
) {
    let rounding = rounding_diffs(tmp, model, one, &args_for);
    for n in [2, 3] {
        let dir = tmp.join(format!("{name}-np{n}"));
        ok(&train(n, &args_for(model, &dir)));
        let what = format!("{name} on {n} processes");
        assert_same_run_up_to_rounding(one, &dir, &rounding, &what);
    }
}

/// The largest difference of two models' weights, relative to each
/// tensor's largest magnitude. Attention key biases aside: their gradient
/// is zero in exact arithmetic (a softmax row does not change when one
/// number is added to all its scores), so they move only by what AdamW
/// makes of rounding noise (m / √v scales noise up to lr-sized steps),
/// which any other summation order changes, one process or many.
fn max_weight_diff(a: &Path, b: &Path) -> f64 {
    let (wa, wb) = (weights(a), weights(b));
    assert_eq!(wa.len(), wb.len());
    let mut worst = 0f64;
    for (name, x) in wa
        .iter()
        .filter(|(n, _)| !n.ends_with("attention.self.key.bias"))
    {
        let y = &wb[name];
        let scale = x.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12) as f64;
        for (p, q) in x.iter().zip(y) {
            worst = worst.max((p - q).abs() as f64 / scale);
        }
    }
    worst
}

/// Asserts the run in `b` equals the run in `a` within 1e-5: every
/// per-step loss and the final weights.
#[track_caller]
fn assert_same_run(a: &Path, b: &Path, what: &str) {
    let d = max_rel_diff(&metrics(a), &metrics(b));
    assert!(d <= 1e-5, "{what}: losses differ by {d:e}");
    let w = max_weight_diff(a, b);
    assert!(w <= 1e-5, "{what}: weights differ by {w:e}");
}

/// Runs `args_for(out)` on 1, 2 and 3 processes; every run equals the
/// one-process run's losses and final weights within 1e-5.
fn same_on_1_2_3(args_for: impl Fn(&Path) -> Vec<String>) {
    let tmp = tempfile::tempdir().unwrap();
    let one = tmp.path().join("np1");
    ok(&train(1, &args_for(&one)));
    for n in [2, 3] {
        let dir = tmp.path().join(format!("np{n}"));
        let out = train(n, &args_for(&dir));
        ok(&out);
        let m = metrics(&dir);
        assert!(m.len() >= 20, "{} metrics lines", m.len());
        assert_same_run(&one, &dir, &format!("{n} processes"));
        // Process 0 alone wrote: one set of checkpoints, one final model.
        assert!(dir.join("checkpoint-10").is_dir() && dir.join("checkpoint-20").is_dir());
    }
}

#[test]
fn mlm_pretraining_on_2_and_3_processes_equals_one() {
    same_on_1_2_3(|out| pretrain_args("bert-mlm", false, out));
}

#[test]
fn mlm_nsp_pretraining_on_2_and_3_processes_equals_one() {
    same_on_1_2_3(|out| pretrain_args("bert-pretraining", true, out));
}

#[test]
fn electra_pretraining_on_2_and_3_processes_equals_one() {
    same_on_1_2_3(|out| {
        let mut a = pretrain_args("bert-mlm", false, out);
        a.extend(["--objective".into(), "electra".into()]);
        a
    });
}

#[test]
fn classification_finetuning_on_2_and_3_processes_equals_one() {
    let tmp = tempfile::tempdir().unwrap();
    let one = tmp.path().join("np1");
    ok(&train(1, &finetune_args(&one)));
    let steps = metrics(&one)
        .iter()
        .filter(|m| m.get("loss").is_some())
        .count();
    assert_eq!(steps, 24, "6 batches (the last of 5 rows) × 4 epochs");
    for n in [2, 3] {
        let dir = tmp.path().join(format!("np{n}"));
        ok(&train(n, &finetune_args(&dir)));
        assert_same_run(&one, &dir, &format!("{n} processes"));
    }
}

/// NER (entity scores from every process's tags) and extractive QA (span
/// logits of every window, answers picked across windows) on 2 and 3
/// processes equal one, evaluations included.
#[test]
fn ner_and_qa_finetuning_on_2_and_3_processes_equal_one() {
    let tmp = tempfile::tempdir().unwrap();
    let fixtures = repo().join("tests/fixtures/finetune");
    let conll = fixtures.join("conll-valid-head.txt");
    let squad = fixtures.join("squad-dev-slice.json");
    let runs: [(&str, &str, &Path, &[&str]); 2] = [
        (
            "ner",
            "bert-tokcls",
            &conll,
            &["--epochs", "3", "--batch-size", "2", "--max-length", "32"],
        ),
        (
            "qa",
            "bert-qa",
            &squad,
            &[
                "--max-train",
                "12",
                "--epochs",
                "2",
                "--batch-size",
                "5",
                "--doc-stride",
                "16",
                "--max-length",
                "64",
            ],
        ),
    ];
    for (task, tiny, data, extra) in runs {
        let model = tmp.path().join(format!("{task}-model"));
        copy_dir(&tiny_dir(tiny), &model);
        let args_for = |model: &Path, out: &Path| task_args(task, model, data, out, extra);
        let one = tmp.path().join(format!("{task}-np1"));
        ok(&train(1, &args_for(&model, &one)));
        assert!(
            metrics(&one).iter().any(|l| l.get("eval_loss").is_some()),
            "{task}: evaluated"
        );
        same_on_2_and_3_up_to_rounding(tmp.path(), &model, &one, task, args_for);
    }
}

/// Sentence-embedding training of the tiny sentence-transformers fixture,
/// dropout on, scored on an STS dev file every 5 steps, on `engine`:
/// `extra` picks the loss and data. Runs are compared on one engine: the
/// fast engine equals candle step by step
/// (`crates/bertha/tests/fast_embedding_training.rs`), but not to the
/// dev Spearman of 20 steps later: a rank statistic, it jumps where two
/// dev cosines nearly tie and rounding orders them.
fn embedding_args(
    engine: &str,
    model: &Path,
    train: &Path,
    out: &Path,
    extra: &[&str],
) -> Vec<String> {
    let dev = repo().join("tests/fixtures/pairs/sts-test-slice.tsv");
    let mut a = strings(&[
        "finetune",
        "--task",
        "embedding",
        "--engine",
        engine,
        "--model",
        s(model),
        "--train",
        s(train),
        "--dev",
        s(&dev),
        "--max-length",
        "32",
        "--lr",
        "1e-3",
        "--eval-every",
        "5",
        "--out",
        s(out),
    ]);
    a.extend(strings(extra));
    a
}

/// MNRL (in-batch negatives gathered across processes), CoSENT (scores
/// gathered too) and GradCache MNRL with hard negatives (a last batch of 2
/// rows: one of 3 processes has none) on 2 and 3 processes equal one (as
/// [`assert_same_run_up_to_rounding`] says), dropout on, on candle and on
/// the fast engine (each process packs its slice).
#[test]
fn embedding_training_on_2_and_3_processes_equals_one() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    copy_dir(&repo().join("tests/fixtures/st-embedding"), &model);
    let path = model.join("config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["hidden_dropout_prob"] = 0.1.into();
    config["attention_probs_dropout_prob"] = 0.1.into();
    std::fs::write(&path, config.to_string()).unwrap();
    let pairs = repo().join("tests/fixtures/pairs");
    let flickr = pairs.join("flickr8k-train-head.tsv");
    let sts = pairs.join("sts-test-slice.tsv");
    let snli = pairs.join("snli-triplets-head.tsv");
    let runs: [(&str, &Path, &[&str]); 3] = [
        (
            "mnrl",
            &flickr,
            &["--loss", "mnrl", "--batch-size", "10", "--epochs", "1"],
        ),
        (
            "cosent",
            &sts,
            &["--loss", "cosent", "--batch-size", "8", "--epochs", "2"],
        ),
        (
            "cached-mnrl",
            &snli,
            &[
                "--loss",
                "cached-mnrl",
                "--mini-batch-size",
                "3",
                "--batch-size",
                "4",
                "--epochs",
                "7",
            ],
        ),
    ];
    for engine in ["candle", "fast"] {
        for (loss, data, extra) in runs {
            let name = &format!("{loss}-{engine}");
            let args_for =
                |model: &Path, out: &Path| embedding_args(engine, model, data, out, extra);
            embedding_runs_equal(tmp.path(), &model, name, args_for);
        }
    }
}

/// The one-process run of `args_for` is the one [`rounding_diffs`] nudges,
/// and the 2- and 3-process runs equal it.
fn embedding_runs_equal(
    tmp: &Path,
    model: &Path,
    name: &str,
    args_for: impl Fn(&Path, &Path) -> Vec<String>,
) {
    let one = tmp.join(format!("{name}-np1"));
    ok(&train(1, &args_for(model, &one)));
    let m = metrics(&one);
    let steps = m.iter().filter(|l| l.get("loss").is_some()).count();
    assert!((20..=22).contains(&steps), "{name}: {steps} steps");
    assert!(
        m.iter().filter(|l| l.get("eval_loss").is_some()).count() >= 4,
        "{name}: evaluations"
    );
    same_on_2_and_3_up_to_rounding(tmp, model, &one, name, args_for);
}

/// Multiplies every weight of a safetensors file by 1 + `scale` × a
/// pseudo-random number in [-1, 1) drawn from `seed` (tensors in name
/// order, so the same seed nudges the same way).
fn nudge_weights(path: &Path, scale: f64, seed: u64) {
    let dev = candle_core::Device::Cpu;
    let mut tensors: Vec<_> = candle_core::safetensors::load(path, &dev)
        .unwrap()
        .into_iter()
        .collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ seed.wrapping_mul(0xd6e8_feb8_6659_fd93);
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    };
    let nudged: HashMap<String, candle_core::Tensor> = tensors
        .into_iter()
        .map(|(name, t)| {
            let values: Vec<f32> = t
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
                .into_iter()
                .map(|v| (v as f64 * (1.0 + scale * next())) as f32)
                .collect();
            let t = candle_core::Tensor::from_vec(values, t.shape(), &dev).unwrap();
            (name, t)
        })
        .collect();
    candle_core::safetensors::save(&nudged, path).unwrap();
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let p = entry.unwrap().path();
        let dest = to.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_dir(&p, &dest);
        } else {
            std::fs::copy(&p, &dest).unwrap();
        }
    }
}

/// `--grad-compression bf16`: the buckets travel as bf16, every process
/// keeps the same weights (the run compares their hashes at every
/// checkpoint and stops if they differ), and the losses stay within bf16's
/// rounding of the fp32 run's, without equalling them.
#[test]
fn bf16_compressed_gradients_train_close_to_fp32() {
    let tmp = tempfile::tempdir().unwrap();
    let one = tmp.path().join("np1");
    ok(&train(1, &pretrain_args("bert-mlm", false, &one)));
    for n in [2, 3] {
        let dir = tmp.path().join(format!("bf16-np{n}"));
        let mut args = pretrain_args("bert-mlm", false, &dir);
        args.extend(strings(&["--grad-compression", "bf16"]));
        ok(&train(n, &args));
        let d = max_rel_diff(&metrics(&one), &metrics(&dir));
        assert!(d > 1e-6, "{n} processes: bf16 changed nothing ({d:e})");
        assert!(d <= 2e-3, "{n} processes: losses differ by {d:e}");
        assert!(dir.join("checkpoint-20").is_dir(), "ran to the end");
    }
}

/// Two processes reading a prepared corpus's shards train as one process
/// reading the text.
#[test]
fn prepared_corpus_on_2_processes_equals_text_on_one() {
    let tmp = tempfile::tempdir().unwrap();
    let one = tmp.path().join("text");
    ok(&train(1, &pretrain_args("bert-mlm", false, &one)));
    let prepared = tmp.path().join("prepared");
    ok(&prepare_tiny_corpus(&prepared, 3000));
    let two = tmp.path().join("shards");
    let mut args = pretrain_args("bert-mlm", false, &two);
    let at = args.iter().position(|x| x == "--corpus").unwrap();
    args[at + 1] = s(&prepared).to_string();
    ok(&train(2, &args));
    assert_same_run(&one, &two, "prepared corpus on 2 processes");
}

/// A run stopped at step 10 and resumed on another number of processes
/// ends as the uninterrupted one-process run.
#[test]
fn resume_on_another_process_count_continues_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let whole = tmp.path().join("whole");
    ok(&train(1, &pretrain_args("bert-mlm", false, &whole)));

    let cut = tmp.path().join("cut");
    ok(&train(2, &pretrain_args("bert-mlm", false, &cut)));
    // Keep checkpoint-10 only, as if the job had died after it.
    std::fs::remove_dir_all(cut.join("checkpoint-20")).unwrap();
    let mut resumed = pretrain_args("bert-mlm", false, &cut);
    resumed.extend(strings(&["--resume", s(&cut.join("checkpoint-10"))]));
    let out = train(3, &resumed);
    ok(&out);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("resumed from"),
        "process 0 says where it resumed"
    );
    assert_same_run(&whole, &cut, "resumed run");
}

/// `mpiexec` with two programs (MPMD): the second has another learning
/// rate, and every process refuses to start, naming it.
#[test]
fn a_process_with_other_options_is_refused_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    let out_dir = tmp.path().join("run");
    let a = pretrain_args("bert-mlm", false, &out_dir);
    let mut b = a.clone();
    let lr = b.iter().position(|x| x == "--lr").unwrap();
    b[lr + 1] = "2e-3".into();
    let bin = env!("CARGO_BIN_EXE_bertha");
    let mut c = Command::new("mpiexec");
    c.args(["-np", "1", bin]).args(&a);
    c.args([":", "-np", "1", bin]).args(&b);
    let out = c
        .env("RAYON_NUM_THREADS", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = failure(&out);
    assert!(
        err.contains("process 1 differs from process 0 in its options"),
        "stderr: {err}"
    );
    assert!(!out_dir.join("checkpoint-10").exists(), "no step was taken");
}

/// The pid of process `rank` of the job writing into `out` (its command
/// line names the folder; MPICH gives each process `PMI_RANK`).
fn rank_pid(out: &Path, rank: usize) -> Option<u32> {
    let want = format!("PMI_RANK={rank}");
    for entry in std::fs::read_dir("/proc").ok()? {
        let path: PathBuf = entry.ok()?.path();
        let Some(pid) = path.file_name()?.to_str()?.parse::<u32>().ok() else {
            continue;
        };
        let cmdline = std::fs::read(path.join("cmdline")).unwrap_or_default();
        let env = std::fs::read(path.join("environ")).unwrap_or_default();
        let has = |hay: &[u8], needle: &[u8]| hay.windows(needle.len()).any(|w| w == needle);
        if has(&cmdline, s(out).as_bytes())
            && has(&cmdline, b"pretrain")
            && env.split(|&b| b == 0).any(|kv| kv == want.as_bytes())
        {
            return Some(pid);
        }
    }
    None
}

/// A long run on two processes; once it trains, `signal` is sent to
/// process 1. Returns the job's exit status and its output, which must
/// come within `limit` of the signal.
fn signal_process_1(signal: &str, extra: &[&str], limit: Duration) -> (Output, tempfile::TempDir) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let mut args = pretrain_args("bert-mlm", false, &dir);
    let steps = args.iter().position(|x| x == "--steps").unwrap();
    args[steps + 1] = "100000".into();
    args.extend(strings(extra));
    let mut child = launch(2, &args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until it trains, then kill process 1.
    let t0 = Instant::now();
    let victim = loop {
        let trained = std::fs::read_to_string(dir.join("metrics.jsonl"))
            .map(|m| m.lines().count() >= 2)
            .unwrap_or(false);
        if trained {
            if let Some(pid) = rank_pid(&dir, 1) {
                break pid;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the run never started"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let sent = Command::new("kill")
        .args([signal, &victim.to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let t1 = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if t1.elapsed() > limit {
            child.kill().ok();
            Command::new("kill")
                .args(["-9", &victim.to_string()])
                .status()
                .ok();
            panic!("the job still runs {limit:?} after kill {signal}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    (child.wait_with_output().unwrap(), tmp)
}

/// Process 1 killed mid-run: the job ends with an error within a bounded
/// time, and the launcher names the process that died.
#[test]
fn a_killed_process_ends_the_job_with_an_error() {
    let (out, tmp) = signal_process_1("-9", &[], Duration::from_secs(60));
    let dir = tmp.path().join("run");
    assert!(!out.status.success());
    let err =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(
        err.contains("KILLED BY SIGNAL: 9") || err.contains("EXIT CODE: 9"),
        "the launcher names the killed process: {err}"
    );
    // Every checkpoint under its final name is whole (temporaries aside,
    // which a resume removes).
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if name.starts_with("checkpoint-") {
            assert!(
                p.join("model.safetensors").is_file(),
                "{name} is incomplete"
            );
        }
    }
}

/// Process 1 stopped (alive, never answering): process 0's watchdog ends
/// the job after --dist-timeout, saying what it waited for.
#[test]
fn a_stalled_process_ends_the_job_after_the_timeout() {
    let (out, _) = signal_process_1("-STOP", &["--dist-timeout", "3"], Duration::from_secs(30));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("process 0 waited") && err.contains("stalled or died"),
        "stderr: {err}"
    );
}

#[test]
fn version_says_mpi_is_built_in() {
    let out = run(&["--version"]);
    assert!(ok(&out).contains("MPI: built in"));
}
