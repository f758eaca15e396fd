//! The training engine: masking statistics, the schedule and AdamW against
//! their definitions, exact resume, overfitting a few sentences, and
//! checkpoints with transformers' tensor names.

mod common;

use std::path::{Path, PathBuf};

use bertha::data::{Corpus, CorpusOptions, MaskSplit, Masker};
use bertha::model::IGNORE_INDEX as IGNORE;
use bertha::rng::rng_for;
use bertha::training::optim::GradAccumulator;
use bertha::training::{
    AdamW, AdamWConfig, Engine, Event, LoopOptions, LrSchedule, ModelSetup, ParamStore,
    PretrainData, PretrainOptions, Pretrainer, RunLength, ScheduleKind, StepMetrics, Warmup,
};
use bertha::{BertConfig, Device, Tensor, Tokenizer};
use common::{fixtures, load_safetensors};

fn masker(split: MaskSplit) -> Masker {
    let mut m = Masker::new(0.15, split, 103, 30522).unwrap();
    m.special = vec![0, 101, 102, 103];
    m
}

/// Sequences shaped like BERT inputs: [CLS] … [SEP] with padding.
fn sample_sequences(n: usize) -> Vec<Vec<u32>> {
    let mut rng = rng_for(7, 0, 0);
    (0..n)
        .map(|_| {
            use rand::Rng;
            let len = rng.random_range(20..126);
            let mut s = vec![101];
            s.extend((0..len).map(|_| rng.random_range(1000..30000u32)));
            s.push(102);
            s.resize(128, 0);
            s
        })
        .collect()
}

#[test]
fn masking_statistics_match_bert() {
    let seqs = sample_sequences(4000);
    let m = masker(MaskSplit::default());
    let mut rng = rng_for(1, 2, 3);
    let (mut maskable, mut chosen, mut to_mask, mut to_random, mut kept) = (0, 0, 0, 0, 0);
    for s in &seqs {
        let out = m.mask(s, &mut rng);
        assert_eq!(out.input_ids.len(), s.len());
        #[allow(clippy::needless_range_loop)] // three arrays, one index
        for i in 0..s.len() {
            let special = [0, 101, 102, 103].contains(&s[i]);
            if special {
                assert_eq!(out.labels[i], IGNORE, "special token {} chosen", s[i]);
                assert_eq!(out.input_ids[i], s[i], "special token replaced");
                continue;
            }
            maskable += 1;
            if out.labels[i] == IGNORE {
                assert_eq!(out.input_ids[i], s[i], "an unchosen token changed");
                continue;
            }
            chosen += 1;
            assert_eq!(out.labels[i], i64::from(s[i]));
            if out.input_ids[i] == 103 {
                to_mask += 1;
            } else if out.input_ids[i] == s[i] {
                kept += 1;
            } else {
                assert!(![0, 101, 102].contains(&out.input_ids[i]));
                to_random += 1;
            }
        }
    }
    let rate = chosen as f64 / maskable as f64;
    println!("{maskable} maskable, {chosen} chosen ({rate:.4}), {to_mask}/{to_random}/{kept}");
    assert!(maskable > 200_000);
    assert!((rate - 0.15).abs() < 0.005, "chosen {rate}");
    let c = chosen as f64;
    assert!((to_mask as f64 / c - 0.80).abs() < 0.01);
    assert!((to_random as f64 / c - 0.10).abs() < 0.01);
    assert!((kept as f64 / c - 0.10).abs() < 0.01);
}

#[test]
fn masking_ablation_splits() {
    let seqs = sample_sequences(500);
    for (split, want) in [
        ("100,0,0", [1.0, 0.0, 0.0]),
        ("0,0,100", [0.0, 0.0, 1.0]),
        ("50,50,0", [0.5, 0.5, 0.0]),
    ] {
        let m = masker(MaskSplit::parse(split).unwrap());
        let mut rng = rng_for(3, 0, 0);
        let mut counts = [0usize; 3];
        for s in &seqs {
            let out = m.mask(s, &mut rng);
            for i in (0..s.len()).filter(|&i| out.labels[i] != IGNORE) {
                let k = if out.input_ids[i] == 103 {
                    0
                } else if out.input_ids[i] == s[i] {
                    2
                } else {
                    1
                };
                counts[k] += 1;
            }
        }
        let n = counts.iter().sum::<usize>() as f64;
        for k in 0..3 {
            assert!(
                (counts[k] as f64 / n - want[k]).abs() < 0.03,
                "{split}: {counts:?}"
            );
        }
    }
    for bad in ["80,10", "80,10,20", "a,b,c", "-10,60,50"] {
        let err = MaskSplit::parse(bad).unwrap_err().to_string();
        assert!(err.contains("mask_split"), "{err}");
    }
}

#[test]
fn whole_word_masking_takes_every_piece_of_a_word() {
    // ids 10..20 start words, 20..30 are `##` pieces.
    let mut m = Masker::new(0.3, MaskSplit::parse("100,0,0").unwrap(), 3, 40).unwrap();
    m.special = vec![0, 1, 2, 3];
    m.continuation = Some((0..40).map(|id| (20..30).contains(&id)).collect());
    let seq = [1, 10, 20, 21, 11, 12, 22, 13, 2];
    let words: [&[usize]; 4] = [&[1, 2, 3], &[4], &[5, 6], &[7]];
    let mut rng = rng_for(5, 0, 0);
    let mut any = 0;
    for _ in 0..200 {
        let out = m.mask(&seq, &mut rng);
        for w in words {
            let picked: Vec<bool> = w.iter().map(|&i| out.labels[i] != IGNORE).collect();
            assert!(
                picked.iter().all(|&p| p == picked[0]),
                "a word split: {:?}",
                out.labels
            );
            any += picked[0] as usize;
        }
        assert_eq!(out.labels[0], IGNORE);
        assert_eq!(out.labels[8], IGNORE);
    }
    assert!(any > 100 && any < 400, "{any}");
}

#[test]
fn schedules_follow_transformers() {
    let s = LrSchedule {
        peak: 1e-3,
        warmup: 10,
        total: 110,
        kind: ScheduleKind::Linear,
    };
    assert_eq!(s.lr(0), 0.0);
    assert!((s.lr(5) - 5e-4).abs() < 1e-15);
    assert!((s.lr(10) - 1e-3).abs() < 1e-15);
    assert!((s.lr(60) - 5e-4).abs() < 1e-15);
    assert_eq!(s.lr(110), 0.0);
    let c = LrSchedule {
        kind: ScheduleKind::Cosine,
        ..s
    };
    assert!((c.lr(60) - 5e-4).abs() < 1e-12);
    assert!(c.lr(110).abs() < 1e-15);
    let k = LrSchedule {
        kind: ScheduleKind::Constant,
        ..s
    };
    assert_eq!(k.lr(100), 1e-3);
}

/// AdamW against torch.optim.AdamW's update written out in f64.
#[test]
fn adamw_matches_the_torch_update() {
    let dev = Device::Cpu;
    let (mut store, vb) = ParamStore::builder(None, "bert.", 0, &dev);
    let w = vb
        .get_with_hints(3, "dense.weight", candle_nn::Init::Const(0.5))
        .unwrap();
    let b = vb
        .get_with_hints(3, "dense.bias", candle_nn::Init::Const(0.5))
        .unwrap();
    store.freeze().unwrap();
    let cfg = AdamWConfig {
        weight_decay: 0.1,
        max_grad_norm: None,
        ..AdamWConfig::default()
    };
    let mut opt = AdamW::new(cfg);
    let x = Tensor::new(&[1.0f32, -2.0, 3.0], &dev).unwrap();
    let (mut pw, mut pb) = (vec![0.5f64; 3], vec![0.5f64; 3]);
    let (mut m, mut v) = (vec![0.0f64; 6], vec![0.0f64; 6]);
    for t in 1..=3 {
        let lr = 0.01 * t as f64;
        // loss = sum((w * x)^2) + sum(b): dL/dw = 2 w x², dL/db = 1
        let loss =
            ((&w * &x).unwrap().sqr().unwrap().sum_all().unwrap() + b.sum_all().unwrap()).unwrap();
        let mut acc = GradAccumulator::new(&store);
        acc.add(&store, &loss.backward().unwrap()).unwrap();
        opt.step(&store, acc, lr).unwrap();
        let xs = [1.0f64, -2.0, 3.0];
        for i in 0..6 {
            let (p, decay) = if i < 3 {
                (&mut pw[i], 0.1)
            } else {
                (&mut pb[i - 3], 0.0)
            };
            let g = if i < 3 { 2.0 * *p * xs[i] * xs[i] } else { 1.0 };
            m[i] = 0.9 * m[i] + 0.1 * g;
            v[i] = 0.999 * v[i] + 0.001 * g * g;
            *p *= 1.0 - lr * decay;
            let mhat = m[i] / (1.0 - 0.9f64.powi(t));
            let vhat = v[i] / (1.0 - 0.999f64.powi(t));
            *p -= lr * mhat / (vhat.sqrt() + 1e-8);
        }
    }
    let got_w = w.to_vec1::<f32>().unwrap();
    let got_b = b.to_vec1::<f32>().unwrap();
    for i in 0..3 {
        assert!(
            (got_w[i] as f64 - pw[i]).abs() < 1e-6,
            "w{i}: {} vs {}",
            got_w[i],
            pw[i]
        );
        assert!(
            (got_b[i] as f64 - pb[i]).abs() < 1e-6,
            "b{i}: {} vs {}",
            got_b[i],
            pb[i]
        );
    }
}

#[test]
fn gradient_clipping_bounds_the_global_norm() {
    let dev = Device::Cpu;
    let (mut store, vb) = ParamStore::builder(None, "bert.", 0, &dev);
    let w = vb
        .get_with_hints(4, "w", candle_nn::Init::Const(0.0))
        .unwrap();
    store.freeze().unwrap();
    let mut opt = AdamW::new(AdamWConfig {
        weight_decay: 0.0,
        max_grad_norm: Some(1.0),
        ..AdamWConfig::default()
    });
    let target = Tensor::new(&[3.0f32, 4.0, 0.0, 0.0], &dev).unwrap();
    let loss = (&w * &target).unwrap().sum_all().unwrap();
    let mut acc = GradAccumulator::new(&store);
    acc.add(&store, &loss.backward().unwrap()).unwrap();
    let norm = opt.step(&store, acc, 0.1).unwrap();
    assert!((norm - 5.0).abs() < 1e-9, "norm {norm}");
}

/// The optimiser's flat buffers: a parameter without a gradient gets no
/// moments (and no checkpoint entry); moments saved and loaded into a new
/// optimiser continue bit for bit; a gradient for an unknown name or of
/// the wrong length is refused.
#[test]
fn adamw_state_round_trips_through_its_flat_buffers() {
    let dev = Device::Cpu;
    let build = || {
        let (mut store, vb) = ParamStore::builder(None, "", 0, &dev);
        let a = vb
            .get_with_hints(5, "a.weight", candle_nn::Init::Const(0.25))
            .unwrap();
        vb.get_with_hints(3, "b.bias", candle_nn::Init::Const(1.0))
            .unwrap();
        store.freeze().unwrap();
        (store, a)
    };
    let cfg = AdamWConfig::default();
    let grad = |store: &ParamStore, a: &Tensor, t: f32| {
        let coef = Tensor::new(&[1.0f32, -2.0, 3.0, 0.5, t], &dev).unwrap();
        let loss = (a * &coef).unwrap().sqr().unwrap().sum_all().unwrap();
        let mut acc = GradAccumulator::new(store);
        acc.add(store, &loss.backward().unwrap()).unwrap();
        acc
    };
    let (s1, a1) = build();
    let mut o1 = AdamW::new(cfg);
    for t in 0..3 {
        o1.step(&s1, grad(&s1, &a1, t as f32), 1e-2).unwrap();
    }
    let state = o1.state_tensors().unwrap();
    let mut keys: Vec<_> = state.keys().cloned().collect();
    keys.sort();
    assert_eq!(keys, ["a.weight.exp_avg", "a.weight.exp_avg_sq"]);

    // A second optimiser from the saved state and weights.
    let (s2, a2) = build();
    s2.load(&s1.tensors(), Path::new("test")).unwrap();
    let mut o2 = AdamW::new(cfg);
    o2.load_state(3, &state).unwrap();
    // Saved again before any step: the same moments.
    let again = o2.state_tensors().unwrap();
    for k in &keys {
        assert_eq!(
            again[k].to_vec1::<f32>().unwrap(),
            state[k].to_vec1::<f32>().unwrap()
        );
    }
    for t in 3..5 {
        let n1 = o1.step(&s1, grad(&s1, &a1, t as f32), 1e-2).unwrap();
        let n2 = o2.step(&s2, grad(&s2, &a2, t as f32), 1e-2).unwrap();
        assert_eq!(n1.to_bits(), n2.to_bits());
    }
    let (w1, w2) = (a1.to_vec1::<f32>().unwrap(), a2.to_vec1::<f32>().unwrap());
    assert_eq!(w1, w2);
    assert_ne!(w1, vec![0.25f32; 5]);
    // b never had a gradient: untouched, no decay.
    for (name, var) in s1.vars() {
        if name == "b.bias" {
            assert_eq!(var.to_vec1::<f32>().unwrap(), vec![1.0f32; 3]);
        }
    }

    let mut acc = GradAccumulator::new(&s1);
    let err = acc.set_from("c.weight", &[0.0; 2]).unwrap_err().to_string();
    assert!(err.contains("`c.weight`"), "{err}");
    let err = acc.set_from("a.weight", &[0.0; 2]).unwrap_err().to_string();
    assert!(err.contains("5 values but a gradient of 2"), "{err}");
    acc.set_from("b.bias", &[1.0, 2.0, 2.0]).unwrap();
    assert_eq!(acc.get("b.bias").as_deref(), Some(&[1.0f32, 2.0, 2.0][..]));
    assert!(acc.get("a.weight").is_none());

    // One pass's gradient (held as its tensor), then a second one summed
    // into the buffer; a walk after a single pass sees the same values.
    let backward = |t: f32| {
        let coef = Tensor::new(&[1.0f32, -2.0, 3.0, 0.5, t], &dev).unwrap();
        let loss = (&a1 * &coef).unwrap().sum_all().unwrap();
        loss.backward().unwrap()
    };
    let mut acc = GradAccumulator::new(&s1);
    acc.add(&s1, &backward(4.0)).unwrap();
    assert_eq!(
        acc.get("a.weight").as_deref(),
        Some(&[1.0f32, -2.0, 3.0, 0.5, 4.0][..])
    );
    assert!(acc.get("b.bias").is_none());
    acc.add(&s1, &backward(-1.0)).unwrap();
    assert_eq!(
        acc.get("a.weight").as_deref(),
        Some(&[2.0f32, -4.0, 6.0, 1.0, 3.0][..])
    );
    assert!(acc.get("b.bias").is_none());
    let mut single = GradAccumulator::new(&s1);
    single.add(&s1, &backward(2.0)).unwrap();
    let walked: Vec<(String, Vec<f32>)> = single
        .iter_mut()
        .map(|(n, g)| (n.to_string(), g.to_vec()))
        .collect();
    assert_eq!(
        walked,
        [("a.weight".to_string(), vec![1.0f32, -2.0, 3.0, 0.5, 2.0])]
    );
}

/// Held-out scoring masks with `eval_mask_split` when given: a model
/// trained with 100/0/0 corruption scored with 80/10/10 gets the score of
/// the same weights under an 80/10/10 run's own evaluation, and a
/// different one under its own 100/0/0 evaluation.
#[test]
fn held_out_scoring_takes_its_own_mask_split() {
    let dir = tempfile::tempdir().unwrap();
    let all_mask = MaskSplit::parse("100,0,0").unwrap();
    let eval_loss = |name: &str, split: MaskSplit, eval_split: Option<MaskSplit>| {
        let t = common::runs::Tweak {
            mask_split: split,
            eval_mask_split: eval_split,
            ..common::runs::Tweak::default()
        };
        let trainer = common::runs::pretrainer(&dir.path().join(name), false, &t);
        trainer.evaluate().unwrap().unwrap().eval_loss
    };
    let standard = eval_loss("a", MaskSplit::default(), None);
    let scored_standard = eval_loss("b", all_mask, Some(MaskSplit::default()));
    let own = eval_loss("c", all_mask, None);
    assert!(standard.is_finite() && standard > 0.0);
    assert_eq!(standard.to_bits(), scored_standard.to_bits());
    assert!((own - standard).abs() > 1e-6, "{own} vs {standard}");
}

fn tokenizer() -> (Tokenizer, PathBuf) {
    let dir = fixtures().join("minilm-tokenizer");
    (Tokenizer::from_dir(&dir, 512).unwrap(), dir)
}

fn micro_config(vocab: usize) -> BertConfig {
    BertConfig {
        vocab_size: vocab,
        hidden_size: 32,
        num_hidden_layers: 2,
        num_attention_heads: 2,
        intermediate_size: 64,
        max_position_embeddings: 64,
        ..BertConfig::default()
    }
}

fn options(out: &Path, steps: u64, nsp: bool) -> PretrainOptions {
    PretrainOptions {
        nsp,
        train: LoopOptions {
            batch_size: 4,
            grad_accum: 2,
            length: RunLength::Steps(steps),
            warmup: Warmup::Steps(2),
            lr: 1e-3,
            seed: 11,
            drop_last: true,
            ..LoopOptions::new(out)
        },
    }
}

fn trainer(corpus_text: &Path, opts: PretrainOptions, seq_len: usize) -> Pretrainer {
    let (tok, dir) = tokenizer();
    let corpus_opts = CorpusOptions {
        seq_len,
        nsp: opts.nsp,
        seed: opts.train.seed,
    };
    let mut train = Corpus::read(&[corpus_text.to_path_buf()], &tok, &corpus_opts).unwrap();
    let eval = train.split_off_last(8);
    let masker = Masker::for_tokenizer(&tok, 0.15, MaskSplit::default(), false).unwrap();
    Pretrainer::new(
        ModelSetup {
            config: micro_config(tok.vocab_size()),
            init: None,
            tokenizer_source: dir,
        },
        PretrainData {
            train: train.into(),
            eval: eval.into(),
            masker,
            eval_masker: None,
            pad_id: tok.pad_id(),
        },
        opts,
    )
    .unwrap()
}

fn losses(trainer: &mut Pretrainer) -> Vec<StepMetrics> {
    let mut out = Vec::new();
    trainer
        .run(|e| {
            if let Event::Step(m) = e {
                out.push(m.clone());
            }
        })
        .unwrap();
    out
}

/// A run resumed from its step-3 checkpoint repeats the uninterrupted one
/// bit for bit: MLM and MLM + NSP, in fp32 and in bf16 (where the straight
/// run's steps 2.. read the weights' bf16 panels the optimizer packed, and
/// the resumed run's first step packs them itself).
#[test]
fn resumed_run_repeats_the_uninterrupted_one() {
    use bertha::fast::train::Compute;
    let corpus = fixtures().join("corpus-wiki-slice.txt");
    // bf16 where the CPU has it (else it would train in fp32 again).
    let mut precisions = vec![Compute::F32, Compute::Bf16.on_this_cpu()];
    precisions.dedup();
    for (nsp, precision) in [false, true]
        .into_iter()
        .flat_map(|nsp| precisions.iter().map(move |&p| (nsp, p)))
    {
        let tmp = tempfile::tempdir().unwrap();
        let with = |mut o: PretrainOptions| {
            o.train.precision = precision;
            o
        };
        let straight = losses(&mut trainer(
            &corpus,
            with(options(&tmp.path().join("a"), 6, nsp)),
            48,
        ));
        let mut first = with(options(&tmp.path().join("b"), 6, nsp));
        first.train.save_every = Some(3);
        // Stop after 3 of 6 steps: a run whose checkpoint-3 is written and
        // whose steps 4..6 are then thrown away.
        let mut t = trainer(&corpus, first.clone(), 48);
        let mut before = Vec::new();
        t.run_until(3, |e| {
            if let Event::Step(m) = e {
                before.push(m.clone());
            }
        })
        .unwrap();
        drop(t);
        let mut resumed = trainer(&corpus, first, 48);
        resumed
            .resume(&tmp.path().join("b").join("checkpoint-3"))
            .unwrap();
        let after = losses(&mut resumed);
        let key = |m: &StepMetrics| (m.step, m.loss, m.figures["mlm_accuracy"], m.grad_norm, m.lr);
        let joined: Vec<_> = before.iter().chain(&after).map(key).collect();
        let want: Vec<_> = straight.iter().map(key).collect();
        assert_eq!(joined, want, "nsp {nsp}, {precision:?}");
        if nsp {
            assert!(straight.iter().all(|m| m.figures.contains_key("nsp_loss")));
        }
        // The final weights agree too.
        let a = load_safetensors(&tmp.path().join("a").join("model.safetensors"));
        let b = load_safetensors(&tmp.path().join("b").join("model.safetensors"));
        assert_eq!(a.len(), b.len());
        for (name, t) in &a {
            let d = (t - &b[name])
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert_eq!(d, 0.0, "{name}, {precision:?}");
        }
    }
}

/// The fast path and the candle modules train the same run: the same
/// losses, accuracies and gradient norms step by step (dropout on, MLM and
/// MLM + NSP, gradient accumulation), and the same final weights.
#[test]
fn fast_and_candle_engines_train_the_same_run() {
    let corpus = fixtures().join("corpus-wiki-slice.txt");
    for nsp in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let run = |engine: Engine, dir: &str| {
            let mut opts = options(&tmp.path().join(dir), 5, nsp);
            opts.train.engine = engine;
            let mut t = trainer(&corpus, opts, 48);
            losses(&mut t)
        };
        let fast = run(Engine::Fast, "fast");
        let candle = run(Engine::Candle, "candle");
        assert_eq!(fast.len(), candle.len());
        for (f, c) in fast.iter().zip(&candle) {
            let close = |a: f64, b: f64, what: &str| {
                assert!(
                    (a - b).abs() <= 1e-5 * b.abs().max(1e-3),
                    "nsp {nsp} step {}: {what} {a} (fast) vs {b} (candle)",
                    f.step
                )
            };
            close(f.loss, c.loss, "loss");
            close(f.grad_norm, c.grad_norm, "gradient norm");
            assert_eq!(f.figures["mlm_accuracy"], c.figures["mlm_accuracy"]);
        }
        let a = load_safetensors(&tmp.path().join("fast").join("model.safetensors"));
        let b = load_safetensors(&tmp.path().join("candle").join("model.safetensors"));
        for (name, t) in &a {
            let d = (t - &b[name]).unwrap().abs().unwrap().max_all().unwrap();
            let d = d.to_scalar::<f32>().unwrap();
            assert!(d <= 1e-4, "nsp {nsp} {name}: weights differ by {d:e}");
        }
    }
}

#[test]
fn tiny_model_overfits_a_few_sentences() {
    let tmp = tempfile::tempdir().unwrap();
    let text = tmp.path().join("few.txt");
    let sentences = "the cat sat on the mat and looked at the dog.\n\n\
                     a man is playing a guitar in the park today.\n\n\
                     paris is the capital and largest city of france.\n\n\
                     water boils at one hundred degrees celsius at sea level.\n";
    std::fs::write(&text, sentences.repeat(4)).unwrap();
    let mut opts = options(&tmp.path().join("out"), 800, false);
    opts.train.lr = 3e-3;
    opts.train.grad_accum = 1;
    opts.train.warmup = Warmup::Steps(10);
    opts.train.adamw.weight_decay = 0.0;
    let (tok, dir) = tokenizer();
    let corpus_opts = CorpusOptions {
        seq_len: 32,
        nsp: false,
        seed: 1,
    };
    let train = Corpus::read(&[text], &tok, &corpus_opts).unwrap();
    assert!(train.len() >= 4, "{}", train.len());
    let masker = Masker::for_tokenizer(&tok, 0.15, MaskSplit::default(), false).unwrap();
    let mut config = micro_config(tok.vocab_size());
    config.hidden_size = 64;
    config.num_attention_heads = 4;
    config.intermediate_size = 128;
    config.hidden_dropout_prob = 0.0;
    config.attention_probs_dropout_prob = 0.0;
    let mut t = Pretrainer::new(
        ModelSetup {
            config,
            init: None,
            tokenizer_source: dir,
        },
        PretrainData {
            train: train.clone().into(),
            eval: train.into(),
            masker,
            eval_masker: None,
            pad_id: tok.pad_id(),
        },
        opts,
    )
    .unwrap();
    let m = losses(&mut t);
    let first = m[..10].iter().map(|m| m.figures["mlm_loss"]).sum::<f64>() / 10.0;
    let last = m[m.len() - 50..]
        .iter()
        .map(|m| m.figures["mlm_loss"])
        .sum::<f64>()
        / 50.0;
    let eval = t.evaluate().unwrap().unwrap();
    println!("mean MLM loss: first 10 steps {first:.3}, last 50 {last:.4}; held-in eval {eval:?}");
    assert!(
        first > 9.0,
        "a fresh model starts near ln(30522) ≈ 10.3: {first}"
    );
    assert!(last < 0.5, "did not overfit: {last}");
    assert!(eval.scores["eval_mlm_loss"] < 0.1, "{eval:?}");
    assert!(eval.scores["eval_mlm_accuracy"] > 0.95, "{eval:?}");
}

/// The names and shapes written for `BertForPreTraining` (with NSP) and
/// `BertForMaskedLM` equal those of checkpoints saved by transformers.
#[test]
fn checkpoints_have_transformers_names_and_shapes() {
    let corpus = fixtures().join("corpus-wiki-slice.txt");
    for (fixture, nsp) in [("bert-pretraining", true), ("bert-mlm", false)] {
        let dir = fixtures().join("tiny").join(fixture);
        let config = BertConfig::from_file(&dir.join("config.json")).unwrap();
        let tok = Tokenizer::from_dir(&dir, 64).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let corpus_opts = CorpusOptions {
            seq_len: 32,
            nsp,
            seed: 0,
        };
        let train = Corpus::read(std::slice::from_ref(&corpus), &tok, &corpus_opts).unwrap();
        let masker = Masker::for_tokenizer(&tok, 0.15, MaskSplit::default(), false).unwrap();
        let mut opts = options(tmp.path(), 1, nsp);
        opts.train.grad_accum = 1;
        let mut t = Pretrainer::new(
            ModelSetup {
                config,
                init: None,
                tokenizer_source: dir.clone(),
            },
            PretrainData {
                train: train.into(),
                eval: Corpus::default().into(),
                masker,
                eval_masker: None,
                pad_id: tok.pad_id(),
            },
            opts,
        )
        .unwrap();
        losses(&mut t);
        let ours = load_safetensors(&tmp.path().join("model.safetensors"));
        let theirs = load_safetensors(&dir.join("model.safetensors"));
        let shapes = |m: &std::collections::HashMap<String, Tensor>| {
            let mut v: Vec<(String, Vec<usize>)> = m
                .iter()
                .map(|(k, t)| (k.clone(), t.dims().to_vec()))
                .collect();
            v.sort();
            v
        };
        assert_eq!(shapes(&ours), shapes(&theirs), "{fixture}");
        let written = BertConfig::from_file(&tmp.path().join("config.json")).unwrap();
        assert_eq!(
            written.architectures,
            vec![if nsp {
                "BertForPreTraining"
            } else {
                "BertForMaskedLM"
            }]
        );
        assert!(tmp.path().join("vocab.txt").is_file());
    }
}

#[test]
fn corpus_errors_name_the_input() {
    let (tok, _) = tokenizer();
    let tmp = tempfile::tempdir().unwrap();
    let opts = CorpusOptions {
        seq_len: 32,
        nsp: false,
        seed: 0,
    };
    let missing = tmp.path().join("nope.txt");
    let err = Corpus::read(&[missing], &tok, &opts)
        .unwrap_err()
        .to_string();
    assert!(err.contains("nope.txt"), "{err}");
    let empty = tmp.path().join("empty.txt");
    std::fs::write(&empty, "\n\n  \n").unwrap();
    let err = Corpus::read(&[empty], &tok, &opts).unwrap_err().to_string();
    assert!(err.contains("no text"), "{err}");
    let bad = tmp.path().join("bad.txt");
    std::fs::write(&bad, b"fine line\n\xff\xfe broken\n").unwrap();
    let err = Corpus::read(&[bad], &tok, &opts).unwrap_err().to_string();
    assert!(err.contains("bad.txt:2") && err.contains("UTF-8"), "{err}");
    let one = tmp.path().join("one.txt");
    std::fs::write(&one, "just one document.\n").unwrap();
    let nsp = CorpusOptions { nsp: true, ..opts };
    let err = Corpus::read(&[one], &tok, &nsp).unwrap_err().to_string();
    assert!(err.contains("nsp needs at least two documents"), "{err}");
}

#[test]
fn nsp_pairs_have_segments_and_balanced_labels() {
    let (tok, _) = tokenizer();
    let opts = CorpusOptions {
        seq_len: 64,
        nsp: true,
        seed: 3,
    };
    let c = Corpus::read(&[fixtures().join("corpus-wiki-slice.txt")], &tok, &opts).unwrap();
    assert!(c.len() > 50, "{}", c.len());
    let (cls, sep) = (
        tok.token_to_id("[CLS]").unwrap(),
        tok.token_to_id("[SEP]").unwrap(),
    );
    let mut random = 0;
    for e in &c.examples {
        assert!(e.input_ids.len() <= 64);
        assert_eq!(e.input_ids[0], cls);
        assert_eq!(*e.input_ids.last().unwrap(), sep);
        assert_eq!(e.input_ids.iter().filter(|&&t| t == sep).count(), 2);
        let first_b = e.token_type_ids.iter().position(|&t| t == 1).unwrap();
        assert_eq!(e.input_ids[first_b - 1], sep);
        assert!(e.token_type_ids[first_b..].iter().all(|&t| t == 1));
        random += e.next_sentence_label.unwrap() as usize;
    }
    let share = random as f64 / c.len() as f64;
    assert!((0.35..0.65).contains(&share), "random B share {share}");
}
