//! ELECTRA pre-training on the one training loop: the loss is the
//! generator's MLM loss plus 50 × the discriminator's, both parts and the
//! discriminator's accuracy are logged, a resumed run repeats the
//! uninterrupted one bit for bit, and the output holds the discriminator
//! (`ElectraForPreTraining`) and `generator/` (`ElectraForMaskedLM`) over
//! the same shared embeddings, which load back with the trained outputs.

mod common;

use std::path::{Path, PathBuf};

use bertha::data::{Corpus, CorpusOptions, MaskSplit, Masker};
use bertha::training::electra::{as_electra, generator_config, GENERATOR_DIR};
use bertha::training::{
    ElectraPretrainer, ElectraRunOptions, Engine, Event, LoopOptions, ModelSetup, PretrainData,
    RunLength, StepMetrics, Warmup,
};
use bertha::{
    BertConfig, BertForTask, BertInput, Device, ForwardOptions, HeadInit, HeadKind, HeadLabels,
    Tokenizer,
};
use common::{fixtures, load_safetensors};

fn tokenizer() -> (Tokenizer, PathBuf) {
    let dir = fixtures().join("minilm-tokenizer");
    (Tokenizer::from_dir(&dir, 512).unwrap(), dir)
}

/// A micro discriminator with narrower embeddings (so both models project).
fn discriminator(vocab: usize) -> BertConfig {
    let mut c = as_electra(&BertConfig {
        vocab_size: vocab,
        hidden_size: 32,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        intermediate_size: 64,
        max_position_embeddings: 64,
        ..BertConfig::default()
    });
    c.family = bertha::Family::Electra(bertha::config::ElectraOptions {
        embedding_size: 16,
        summary: Default::default(),
    });
    c
}

fn options(out: &Path, steps: u64) -> ElectraRunOptions {
    ElectraRunOptions {
        disc_weight: 50.0,
        train: LoopOptions {
            batch_size: 4,
            grad_accum: 2,
            length: RunLength::Steps(steps),
            warmup: Warmup::Steps(2),
            lr: 1e-3,
            seed: 5,
            drop_last: true,
            ..LoopOptions::new(out)
        },
    }
}

fn trainer(opts: ElectraRunOptions) -> ElectraPretrainer {
    let (tok, dir) = tokenizer();
    let corpus_opts = CorpusOptions {
        seq_len: 48,
        nsp: false,
        seed: 5,
    };
    let corpus = fixtures().join("corpus-wiki-slice.txt");
    let mut train = Corpus::read(&[corpus], &tok, &corpus_opts).unwrap();
    let eval = train.split_off_last(8);
    let split = MaskSplit::parse("100,0,0").unwrap();
    let masker = Masker::for_tokenizer(&tok, 0.15, split, false).unwrap();
    let disc = discriminator(tok.vocab_size());
    let generator = generator_config(&disc, 0.25).unwrap();
    assert_eq!(
        (generator.hidden_size, generator.num_attention_heads),
        (8, 1)
    );
    ElectraPretrainer::new(
        ModelSetup {
            config: disc,
            init: None,
            tokenizer_source: dir,
        },
        generator,
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

fn steps(t: &mut ElectraPretrainer, stop: u64) -> Vec<StepMetrics> {
    let mut out = Vec::new();
    t.run_until(stop, |e| {
        if let Event::Step(m) = e {
            out.push(m.clone());
        }
    })
    .unwrap();
    out
}

#[test]
fn electra_run_logs_its_parts_and_resumes_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let straight = steps(&mut trainer(options(&tmp.path().join("a"), 6)), 6);
    assert_eq!(straight.len(), 6);
    for m in &straight {
        let f = |k: &str| m.figures[k];
        // The step loss is the micro-batches' mean of gen + 50 × disc.
        let total = f("generator_loss") + 50.0 * f("discriminator_loss");
        assert!(
            (m.loss - total).abs() <= 1e-9 * total,
            "{} vs {total}",
            m.loss
        );
        assert!(f("discriminator_accuracy") > 0.0 && f("discriminator_accuracy") <= 1.0);
        // Almost every sample from a 30k-word softmax differs from the
        // original at first.
        assert!(f("replaced_fraction") > 0.5, "{}", f("replaced_fraction"));
    }
    // Learning: the discriminator soon beats its first step.
    assert!(
        straight[5].figures["discriminator_loss"] < straight[0].figures["discriminator_loss"],
        "{:?}",
        straight
            .iter()
            .map(|m| m.figures["discriminator_loss"])
            .collect::<Vec<_>>()
    );

    let mut first = options(&tmp.path().join("b"), 6);
    first.train.save_every = Some(3);
    let before = steps(&mut trainer(first.clone()), 3);
    let mut resumed = trainer(first);
    resumed
        .resume(&tmp.path().join("b").join("checkpoint-3"))
        .unwrap();
    let after = steps(&mut resumed, 6);
    let key = |m: &StepMetrics| {
        (
            m.step,
            m.loss,
            m.figures["discriminator_accuracy"],
            m.grad_norm,
        )
    };
    let joined: Vec<_> = before.iter().chain(&after).map(key).collect();
    let want: Vec<_> = straight.iter().map(key).collect();
    assert_eq!(joined, want);
    let a = load_safetensors(&tmp.path().join("a").join("model.safetensors"));
    let b = load_safetensors(&tmp.path().join("b").join("model.safetensors"));
    assert_eq!(a.len(), b.len());
    for (name, t) in &a {
        assert_eq!(common::max_abs_diff(t, &b[name]), 0.0, "{name}");
    }
}

/// The output's two folders: the discriminator and the generator, with
/// the same embedding tensors, each loading as its transformers class.
#[test]
fn electra_output_holds_both_models_over_shared_embeddings() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let mut t = trainer(options(&out, 2));
    t.run(|_| {}).unwrap();
    let root = load_safetensors(&out.join("model.safetensors"));
    let gen = load_safetensors(&out.join(GENERATOR_DIR).join("model.safetensors"));
    for name in [
        "electra.embeddings.word_embeddings.weight",
        "electra.embeddings.position_embeddings.weight",
        "electra.embeddings.token_type_embeddings.weight",
        "electra.embeddings.LayerNorm.weight",
    ] {
        assert_eq!(common::max_abs_diff(&root[name], &gen[name]), 0.0, "{name}");
    }
    // The generator keeps its own encoder and head, its decoder tied.
    assert!(gen.contains_key("electra.embeddings_project.weight"));
    assert!(gen.contains_key("generator_lm_head.bias"));
    assert!(!gen.keys().any(|k| k.starts_with("generator.")));
    assert!(!gen.contains_key("generator_lm_head.weight"));

    let dev = Device::Cpu;
    let disc = BertForTask::from_dir(&out, None, HeadInit::FromCheckpoint, &dev).unwrap();
    assert_eq!(disc.kind(), HeadKind::ReplacedTokenDetection);
    let generator = BertForTask::from_dir(
        &out.join(GENERATOR_DIR),
        None,
        HeadInit::FromCheckpoint,
        &dev,
    )
    .unwrap();
    assert_eq!(generator.kind(), HeadKind::MaskedLM);
    assert_eq!(generator.config().hidden_size, 8);
    // Their outputs on a sentence are the trained pair's.
    let (tok, _) = tokenizer();
    let enc = tok
        .encode("the quick brown fox [MASK] over the dog")
        .unwrap();
    let input = BertInput::from_ids(
        std::slice::from_ref(&enc.input_ids),
        std::slice::from_ref(&enc.token_type_ids),
        tok.pad_id(),
        &dev,
    )
    .unwrap();
    let opts = ForwardOptions::default().into();
    let logits = |m: &BertForTask| match m.forward(&input, &HeadLabels::default(), opts).unwrap() {
        bertha::TaskOutput::Logits(o) => o.logits,
        _ => panic!("one-logits output expected"),
    };
    let pair = t.objective().pair();
    use bertha::BertHead;
    let want_disc = BertHead::forward(&pair.discriminator, &input, &HeadLabels::default(), opts)
        .unwrap()
        .logits;
    let want_gen = BertHead::forward(&pair.generator, &input, &HeadLabels::default(), opts)
        .unwrap()
        .logits;
    assert!(common::max_abs_diff(&logits(&disc), &want_disc) < 1e-5);
    assert!(common::max_abs_diff(&logits(&generator), &want_gen) < 1e-5);
}

/// Both engines give the same steps: per-step losses and figures (the
/// same masks, draws and dropout), and the same weights after them.
#[test]
fn fast_engine_steps_equal_the_candle_engine() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |engine: Engine| {
        let out = tmp.path().join(format!("{engine:?}"));
        let mut opts = options(&out, 4);
        opts.train.engine = engine;
        let mut t = trainer(opts);
        assert_eq!(t.objective().on_fast_path(), engine == Engine::Fast);
        let history = steps(&mut t, 4);
        (history, load_safetensors(&out.join("model.safetensors")))
    };
    let (want, want_weights) = run(Engine::Candle);
    let (got, got_weights) = run(Engine::Fast);
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        let rel = |a: f64, b: f64| (a - b).abs() / b.abs().max(1e-12);
        assert!(
            rel(g.loss, w.loss) <= 1e-5,
            "step {}: loss {} vs {}",
            w.step,
            g.loss,
            w.loss
        );
        for key in ["generator_loss", "discriminator_loss"] {
            let (a, b) = (g.figures[key], w.figures[key]);
            assert!(rel(a, b) <= 1e-5, "step {}: {key} {a} vs {b}", w.step);
        }
        // The same draws: the same replaced tokens.
        assert_eq!(
            g.figures["replaced_fraction"], w.figures["replaced_fraction"],
            "step {}",
            w.step
        );
    }
    assert!(want.windows(2).any(|w| w[0].loss != w[1].loss));
    // Attention key biases aside: their gradient is rounding noise, which
    // AdamW's m / sqrt(v) turns into full-size steps of either sign.
    for (name, w) in want_weights
        .iter()
        .filter(|(n, _)| !n.ends_with("attention.self.key.bias"))
    {
        let err = common::max_abs_diff(&got_weights[name], w) / common::max_abs(w).max(1e-30);
        assert!(err <= 1e-4, "weight {name} off by {err:e}");
    }
}

/// `--precision bf16` runs both models' products in bf16 on the fast
/// engine: the first step's parts track fp32's (the generator's closely;
/// the discriminator's within the few draws that bf16 logits change).
#[test]
fn bf16_steps_track_the_fp32_steps() {
    if !bertha::fast::cpu::has_bf16() {
        println!("no fast bf16 products here (cpu::has_bf16): bf16 training runs in fp32");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let run = |precision: bertha::fast::train::Compute| {
        let mut opts = options(&tmp.path().join(format!("{precision:?}")), 2);
        opts.train.precision = precision;
        let mut t = trainer(opts);
        assert!(t.objective().on_fast_path());
        steps(&mut t, 2)
    };
    let exact = run(bertha::fast::train::Compute::F32);
    let bf16 = run(bertha::fast::train::Compute::Bf16);
    let part = |m: &StepMetrics, k: &str| m.figures[k];
    let rel = |a: f64, b: f64| (a - b).abs() / b.abs();
    let (g, w) = (&bf16[0], &exact[0]);
    assert_ne!(g.loss, w.loss, "the bf16 products did not run");
    let gen = rel(part(g, "generator_loss"), part(w, "generator_loss"));
    assert!(gen <= 5e-3, "generator loss off by {gen:e}");
    let disc = rel(part(g, "discriminator_loss"), part(w, "discriminator_loss"));
    assert!(disc <= 5e-2, "discriminator loss off by {disc:e}");
}

#[test]
fn bad_electra_options_are_refused_by_name() {
    let disc = discriminator(100);
    let err = generator_config(&disc, 0.0).unwrap_err().to_string();
    assert!(err.contains("generator_size"), "{err}");
    // 0.4 × 32 = 13 (rounded) over 0.4 × 4 = 2 heads: not a multiple.
    let err = generator_config(&disc, 0.4).unwrap_err().to_string();
    assert!(
        err.contains("generator_size") && err.contains("13"),
        "{err}"
    );
}

/// With early stopping the best model becomes the output, generator and
/// all (the generator is rewritten from the best model's file).
#[test]
fn early_stopping_keeps_the_best_generator() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let mut opts = options(&out, 4);
    opts.train.eval_every = Some(2);
    opts.train.early_stop = Some(5);
    trainer(opts).run(|_| {}).unwrap();
    let root = load_safetensors(&out.join("model.safetensors"));
    let best = load_safetensors(&out.join("best").join("model.safetensors"));
    let gen = load_safetensors(&out.join(GENERATOR_DIR).join("model.safetensors"));
    let name = "electra.embeddings.word_embeddings.weight";
    assert_eq!(common::max_abs_diff(&root[name], &best[name]), 0.0);
    assert_eq!(common::max_abs_diff(&root[name], &gen[name]), 0.0);
    let own = "electra.encoder.layer.0.attention.self.query.weight";
    assert_eq!(
        common::max_abs_diff(&gen[own], &best[&format!("generator.{own}")]),
        0.0
    );
}
