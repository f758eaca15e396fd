//! The one training loop, for every objective (MLM, MLM + NSP,
//! classification, NER, QA, multiple choice): gradient accumulation, checkpoint pruning,
//! `best/` with early stopping and the non-finite-loss stop.

mod common;

use std::path::Path;

use bertha::data::Task;
use bertha::training::{Event, Objective, StepMetrics, Trainer, EVAL_RESULTS_FILE};
use bertha::Error;
use common::runs::{finetuner, pretrainer, Tweak};

/// The six objectives, each built into `out` with `tweak`, run to the
/// end; returns the steps and the other events, or the run's error.
fn each_objective(test: impl Fn(&str, &dyn Fn(&Path, &Tweak) -> Outcome)) {
    test("mlm", &|out, t| outcome(pretrainer(out, false, t)));
    test("nsp", &|out, t| outcome(pretrainer(out, true, t)));
    test("classification", &|out, t| {
        outcome(finetuner(out, Task::Classification, t))
    });
    test("ner", &|out, t| outcome(finetuner(out, Task::Ner, t)));
    test("qa", &|out, t| outcome(finetuner(out, Task::Qa, t)));
    test("multiple-choice", &|out, t| {
        outcome(finetuner(out, Task::MultipleChoice, t))
    });
}

/// Runs every objective into a fresh folder with `tweak`, then checks
/// the outcome.
fn check_each(tweak: Tweak, check: impl Fn(&str, &Path, Outcome)) {
    each_objective(|name, run| {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        check(name, &out, run(&out, &tweak));
    });
}

struct Outcome {
    steps: Vec<StepMetrics>,
    events: Vec<Event>,
    total_steps: u64,
    result: Result<(), Error>,
}

fn outcome<O: Objective>(mut t: Trainer<O>) -> Outcome {
    let (mut steps, mut events) = (Vec::new(), Vec::new());
    let total_steps = t.total_steps();
    let result = t.run(|e| match e {
        Event::Step(m) => steps.push(m.clone()),
        other => events.push(other.clone()),
    });
    Outcome {
        steps,
        events,
        total_steps,
        result,
    }
}

fn checkpoints(out: &Path) -> Vec<u64> {
    let mut v: Vec<u64> = std::fs::read_dir(out)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.strip_prefix("checkpoint-")?.parse().ok()
        })
        .collect();
    v.sort();
    v
}

/// With the weights frozen (lr 0), a step of two accumulated micro-batches
/// reports the mean of the losses those micro-batches give one by one,
/// reads them in the same order, and the run takes half the steps.
#[test]
fn gradient_accumulation_averages_micro_batches() {
    each_objective(|name, run| {
        let tmp = tempfile::tempdir().unwrap();
        let frozen = Tweak {
            lr: 0.0,
            ..Tweak::default()
        };
        let one = run(&tmp.path().join("one"), &frozen);
        let two = run(
            &tmp.path().join("two"),
            &Tweak {
                grad_accum: 2,
                ..frozen.clone()
            },
        );
        one.result.unwrap();
        two.result.unwrap();
        if name == "mlm" || name == "nsp" {
            // Pre-training counts steps, not epochs.
            assert_eq!(one.total_steps, two.total_steps, "{name}");
        } else {
            assert_eq!(two.total_steps, one.total_steps.div_ceil(2), "{name}");
        }
        for (k, m) in two.steps.iter().enumerate() {
            let Some(pair) = one.steps.get(2 * k..2 * k + 2) else {
                continue; // past the single-batch run's last step
            };
            let mean = (pair[0].loss + pair[1].loss) / 2.0;
            assert!(
                (m.loss - mean).abs() <= 1e-12 * mean.abs(),
                "{name} step {}: {} vs mean {mean}",
                m.step,
                m.loss
            );
            assert!(m.grad_norm > 0.0, "{name}");
        }
    });
}

/// Two micro-batches of 2 give the gradient one batch of 4 gives when the
/// loss is a mean over examples and padding changes nothing (sequence
/// classification; QA's span loss, as transformers', also ranges over
/// padding positions): the same loss and gradient norm at the first step.
#[test]
fn accumulated_batches_match_one_large_batch() {
    let task = Task::Classification;
    let tmp = tempfile::tempdir().unwrap();
    let plain = Tweak {
        dropout: 0.0,
        batch_size: 4,
        ..Tweak::default()
    };
    let first_step = |dir: &str, t: &Tweak| {
        let mut run = finetuner(&tmp.path().join(dir), task, t);
        let mut first = None;
        run.run_until(1, |e| {
            if let Event::Step(m) = e {
                first = Some(m.clone());
            }
        })
        .unwrap();
        first.unwrap()
    };
    let big = first_step("big", &plain);
    let acc = first_step(
        "acc",
        &Tweak {
            batch_size: 2,
            grad_accum: 2,
            ..plain
        },
    );
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-5 * a.abs().max(1e-6);
    assert!(close(big.loss, acc.loss), "{task}: {big:?} {acc:?}");
    assert!(
        close(big.grad_norm, acc.grad_norm),
        "{task}: {big:?} {acc:?}"
    );
}

#[test]
fn checkpoints_are_pruned_to_the_newest() {
    let tweak = Tweak {
        save_every: Some(1),
        save_total_limit: Some(2),
        ..Tweak::default()
    };
    check_each(tweak, |name, out, o| {
        o.result.unwrap();
        let saved = o
            .events
            .iter()
            .filter(|e| matches!(e, Event::Saved(_)))
            .count();
        assert!(saved >= 3, "{name}: {saved} saves");
        let last = o.steps.last().unwrap().step;
        assert_eq!(checkpoints(out), [last - 1, last], "{name}");
    });
}

/// With frozen weights every evaluation equals the first, so none is
/// better: the run stops after `patience` evaluations and its final model
/// is the first evaluation's, kept in `best/`.
#[test]
fn early_stopping_keeps_the_best_model() {
    let tweak = Tweak {
        lr: 0.0,
        eval_every: Some(1),
        early_stop: Some(2),
        ..Tweak::default()
    };
    check_each(tweak, |name, out, o| {
        o.result.unwrap();
        assert_eq!(o.steps.len(), 3, "{name}: stops after 1 + 2 evaluations");
        let best: Vec<u64> = o
            .events
            .iter()
            .filter_map(|e| match e {
                Event::Best(b) => Some(b.step),
                _ => None,
            })
            .collect();
        assert_eq!(best, [1], "{name}");
        assert!(
            o.events.iter().any(|e| matches!(
                e,
                Event::EarlyStop {
                    step: 3,
                    best_step: 1
                }
            )),
            "{name}: {:?}",
            o.events
        );
        for dir in [out.join("best"), out.to_path_buf()] {
            assert!(dir.join("model.safetensors").is_file(), "{name}");
            let results = common::read_json(&dir.join(EVAL_RESULTS_FILE));
            assert_eq!(results["step"], 1, "{name}: {}", dir.display());
        }
        assert_eq!(
            std::fs::read(out.join("model.safetensors")).unwrap(),
            std::fs::read(out.join("best").join("model.safetensors")).unwrap(),
            "{name}"
        );
    });
}

#[test]
fn a_non_finite_loss_stops_the_run() {
    let tweak = Tweak {
        poison: Some("bert.embeddings.LayerNorm.weight"),
        ..Tweak::default()
    };
    check_each(tweak, |name, _, o| {
        assert!(o.steps.is_empty(), "{name}");
        match o.result {
            Err(Error::Diverged { step, value, .. }) => {
                assert_eq!(step, 1, "{name}");
                assert!(value.is_nan(), "{name}: {value}");
            }
            other => panic!("{name}: {other:?}"),
        }
    });
}

/// The gradient hook sees every step's summed gradients before the update
/// and what it does to them is what the optimiser applies: doubled
/// gradients give a doubled norm.
#[test]
fn the_gradient_hook_transforms_every_step() {
    use bertha::training::optim::GradAccumulator;
    use bertha::training::GradientHook;
    use std::sync::{Arc, Mutex};

    struct Double(Arc<Mutex<Vec<u64>>>);
    impl GradientHook for Double {
        fn on_gradients(&mut self, step: u64, grads: &mut GradAccumulator) -> bertha::Result<()> {
            self.0.lock().unwrap().push(step);
            for (_, g) in grads.iter_mut() {
                g.iter_mut().for_each(|x| *x *= 2.0);
            }
            Ok(())
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let frozen = Tweak {
        lr: 0.0,
        dropout: 0.0,
        ..Tweak::default()
    };
    let norms = |dir: &str, hook: Option<Arc<Mutex<Vec<u64>>>>| {
        let mut t = finetuner(&tmp.path().join(dir), Task::Classification, &frozen);
        if let Some(calls) = hook {
            t.set_gradient_hook(Box::new(Double(calls)));
        }
        let mut norms = Vec::new();
        t.run_until(3, |e| {
            if let Event::Step(m) = e {
                norms.push(m.grad_norm);
            }
        })
        .unwrap();
        norms
    };
    let calls = Arc::new(Mutex::new(Vec::new()));
    let plain = norms("plain", None);
    let doubled = norms("doubled", Some(calls.clone()));
    assert_eq!(*calls.lock().unwrap(), [0, 1, 2]);
    for (p, d) in plain.iter().zip(&doubled) {
        assert!((d - 2.0 * p).abs() <= 1e-9 * p, "{p} {d}");
    }
}

/// An output folder belongs to one run: a fresh run refuses a folder with
/// another run's metrics and checkpoints, and with `overwrite` replaces
/// them (and the temporaries a killed write left).
#[test]
fn a_fresh_run_refuses_another_runs_folder() {
    each_objective(|name, run| {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        let once = Tweak {
            save_every: Some(1),
            ..Tweak::default()
        };
        run(&out, &once).result.unwrap();
        match run(&out, &once).result {
            Err(Error::Option {
                name: option,
                reason,
            }) => {
                assert_eq!(option, "out", "{name}");
                assert!(reason.contains("holds another run"), "{name}: {reason}");
            }
            other => panic!("{name}: {other:?}"),
        }
        let stale = out.join(".checkpoint-7.tmp-12345");
        std::fs::create_dir_all(&stale).unwrap();
        let again = run(
            &out,
            &Tweak {
                overwrite: true,
                ..once
            },
        );
        again.result.unwrap();
        assert!(!stale.exists(), "{name}");
        let metrics = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
        let steps = metrics.lines().filter(|l| l.contains("\"loss\"")).count();
        assert_eq!(steps, again.steps.len(), "{name}: only the new run's steps");
    });
}

/// `resume` refuses a run whose options, data or model config differ from
/// the checkpoint's, naming each change, unless `allow_changes` names it.
#[test]
fn resume_refuses_changes_it_was_not_allowed() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let saving = Tweak {
        save_every: Some(1),
        ..Tweak::default()
    };
    let mut first = finetuner(&out, Task::Classification, &saving);
    first.run_until(2, |_| {}).unwrap();
    let checkpoint = out.join("checkpoint-2");
    let resume = |t: &Tweak| {
        let mut again = finetuner(&out, Task::Classification, t);
        again.resume(&checkpoint).map(|_| again.step())
    };
    assert_eq!(resume(&saving).unwrap(), 2);
    let changed = Tweak {
        lr: 1e-3,
        ..saving.clone()
    };
    match resume(&changed) {
        Err(Error::Option { name, reason }) => {
            assert_eq!(name, "resume");
            assert!(reason.contains("lr (was 0.005, now 0.001)"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    let allowed = Tweak {
        allow_changes: vec!["lr".into()],
        ..changed
    };
    assert_eq!(resume(&allowed).unwrap(), 2);
    // Other model settings are a change of `config`.
    let other_model = Tweak {
        dropout: 0.3,
        ..saving
    };
    let err = resume(&other_model).unwrap_err().to_string();
    assert!(
        err.contains("config.hidden_dropout_prob (was 0.1, now 0.3)"),
        "{err}"
    );
}

/// The non-finite stop names the newest checkpoint when there is one.
#[test]
fn a_diverged_run_names_its_last_good_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let exploding = Tweak {
        lr: 1e38,
        save_every: Some(1),
        ..Tweak::default()
    };
    let mut t = finetuner(&out, Task::Classification, &exploding);
    match t.run(|_| {}) {
        Err(Error::Diverged {
            step, last_good, ..
        }) => {
            let last_good = last_good.expect("a checkpoint before the divergence");
            assert_eq!(last_good, out.join(format!("checkpoint-{}", step - 1)));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn options_out_of_range_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let mut opts = bertha::training::LoopOptions::new(tmp.path());
    opts.adamw.max_grad_norm = Some(-1.0);
    let err = bertha::training::Trainer::build(
        bertha::training::ModelSetup {
            config: bertha::BertConfig::default(),
            init: None,
            tokenizer_source: tmp.path().to_path_buf(),
        },
        opts,
        |_| -> bertha::Result<bertha::training::Finetuning> { unreachable!() },
    )
    .err()
    .unwrap()
    .to_string();
    assert!(err.starts_with("max_grad_norm -1"), "{err}");
    let err = bertha::data::Masker::new(0.0, Default::default(), 103, 1024)
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("mask_prob 0"), "{err}");
    let err = bertha::training::presets::resolve_config("mini", 1024, 100_000)
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("seq_len 100000"), "{err}");
}
