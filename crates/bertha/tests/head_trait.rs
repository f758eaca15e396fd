//! `BertHead::forward` and the `BertForTask` dispatch: the same numbers
//! as the heads' own forwards, and pre-training's labelled-rows path the
//! same, bit for bit, as decoding the gathered masked rows by hand (what
//! `training::pretrain` does).

use bertha::io::weights::SeededInit;
use bertha::model::{
    cross_entropy_with_ignore, BertForMaskedLM, BertForPreTraining, BertForTask,
    BertForTokenClassification, BertHead, HeadKind, HeadLabels, HeadOptions, TaskOutput,
    IGNORE_INDEX,
};
use bertha::{BertConfig, BertInput, DType, Device, ForwardOptions, Tensor};

fn config() -> BertConfig {
    BertConfig {
        vocab_size: 40,
        hidden_size: 16,
        num_hidden_layers: 2,
        num_attention_heads: 2,
        intermediate_size: 32,
        max_position_embeddings: 16,
        ..BertConfig::default()
    }
}

fn load<H: BertHead>() -> H {
    let vb = SeededInit::new(7).var_builder(DType::F32, &Device::Cpu);
    H::load(vb, config()).unwrap()
}

/// Two sequences (the second padded) and MLM labels, -100 off the masks.
fn batch() -> (BertInput, Vec<Vec<i64>>) {
    let ids = vec![vec![2, 5, 9, 11, 3], vec![2, 7, 4, 3]];
    let input = BertInput::from_ids(&ids, &[vec![0; 5], vec![0; 4]], 0, &Device::Cpu).unwrap();
    let labels = vec![
        vec![-100, 5, -100, 11, -100],
        vec![-100, -100, 4, -100, -100],
    ];
    (input, labels)
}

fn tensor(labels: &[Vec<i64>]) -> Tensor {
    let flat: Vec<i64> = labels.iter().flatten().copied().collect();
    Tensor::from_vec(flat, (labels.len(), labels[0].len()), &Device::Cpu).unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

/// `training::pretrain::run_batch`'s MLM path, by hand.
fn gathered(m: &BertForPreTraining, input: &BertInput, labels: &[Vec<i64>]) -> (Tensor, Tensor) {
    let out = m.bert().forward(input, ForwardOptions::default()).unwrap();
    let t = labels[0].len();
    let mut rows = Vec::new();
    let mut targets = Vec::new();
    for (b, l) in labels.iter().enumerate() {
        for (j, &y) in l.iter().enumerate() {
            if y != IGNORE_INDEX {
                rows.push((b * t + j) as u32);
                targets.push(y);
            }
        }
    }
    let hidden = out
        .last_hidden_state
        .reshape((labels.len() * t, config().hidden_size))
        .unwrap();
    let n = rows.len();
    let idx = Tensor::from_vec(rows, n, &Device::Cpu).unwrap();
    let picked = hidden.index_select(&idx, 0).unwrap();
    let logits = m.predictions().forward(&picked).unwrap();
    let loss = cross_entropy_with_ignore(&logits, &targets, IGNORE_INDEX, "labels").unwrap();
    (logits, loss)
}

#[test]
fn labelled_rows_match_pretraining_by_hand() {
    let m: BertForPreTraining = load();
    let (input, labels) = batch();
    let (want_logits, want_loss) = gathered(&m, &input, &labels);
    let l = tensor(&labels);
    let nsp = Tensor::new(&[0i64, 1], &Device::Cpu).unwrap();
    let opts = HeadOptions {
        labelled_rows_only: true,
        ..HeadOptions::default()
    };
    let mlm_only = HeadLabels::labels(Some(&l));
    let out = BertHead::forward(&m, &input, &mlm_only, opts).unwrap();
    assert_eq!(bits(&out.prediction_logits), bits(&want_logits));
    assert_eq!(bits(&out.loss.unwrap()), bits(&want_loss));
    assert!(out.nsp_loss.is_none());

    let both = HeadLabels {
        next_sentence_label: Some(&nsp),
        ..mlm_only
    };
    let out = BertHead::forward(&m, &input, &both, opts).unwrap();
    let nsp_loss = out.nsp_loss.unwrap();
    let want = want_loss.add(&nsp_loss).unwrap();
    assert_eq!(bits(&out.mlm_loss.unwrap()), bits(&want_loss));
    assert_eq!(bits(&out.loss.unwrap()), bits(&want));

    let mlm: BertForMaskedLM = load();
    let out = BertHead::forward(&mlm, &input, &mlm_only, opts).unwrap();
    assert_eq!(out.logits.dims(), &[3, 40]);
}

#[test]
fn no_labelled_row_gives_no_loss() {
    let m: BertForMaskedLM = load();
    let (input, _) = batch();
    let none = tensor(&[vec![-100; 5], vec![-100; 5]]);
    let opts = HeadOptions {
        labelled_rows_only: true,
        ..HeadOptions::default()
    };
    let out = BertHead::forward(&m, &input, &HeadLabels::labels(Some(&none)), opts).unwrap();
    assert!(out.loss.is_none());
    assert_eq!(out.logits.dims(), &[0, 40]);
    let err = BertHead::forward(&m, &input, &HeadLabels::default(), opts).unwrap_err();
    assert!(err.to_string().contains("labels"), "{err}");
}

#[test]
fn dispatch_matches_the_heads_own_forward() {
    let m: BertForTokenClassification = load();
    let (input, _) = batch();
    let l = tensor(&[vec![0, 1, -100, 1, 0], vec![1, 1, 0, -100, -100]]);
    let direct = m
        .forward(&input, Some(&l), ForwardOptions::default())
        .unwrap();
    let task = BertForTask::TokenClassification(m);
    assert_eq!(task.kind(), BertForTokenClassification::KIND);
    let TaskOutput::Logits(out) = task
        .forward(
            &input,
            &HeadLabels::labels(Some(&l)),
            HeadOptions::default(),
        )
        .unwrap()
    else {
        panic!("token classification gives logits");
    };
    assert_eq!(bits(&out.logits), bits(&direct.logits));
    assert_eq!(bits(&out.loss.unwrap()), bits(&direct.loss.unwrap()));
}

/// Every tensor of a head's outputs that the encoder feeds.
fn output_bits(out: &TaskOutput) -> Vec<Vec<u32>> {
    let mut all = match out {
        TaskOutput::Logits(o) => vec![bits(&o.logits)],
        TaskOutput::PreTraining(o) => {
            vec![bits(&o.prediction_logits), bits(&o.seq_relationship_logits)]
        }
        TaskOutput::QuestionAnswering(o) => vec![bits(&o.start_logits), bits(&o.end_logits)],
    };
    all.extend(out.loss().map(bits));
    all
}

#[test]
fn forward_encoded_on_the_encoders_output_is_forward() {
    // What the pipelines' reduced-precision path relies on: a head run on
    // encoder outputs computed outside gives, on the encoder's own
    // outputs, the numbers of its forward, bit for bit, loss included.
    let (input, labels) = batch();
    let opts = HeadOptions::default();
    // Every head a BERT has (ELECTRA's discriminator is ELECTRA's own).
    for kind in HeadKind::ALL
        .into_iter()
        .filter(|k| k.supported_by(&bertha::Family::Bert))
    {
        let vb = SeededInit::new(7).var_builder(DType::F32, &Device::Cpu);
        let task = BertForTask::load(vb, config(), kind).unwrap();
        let (input, encoder_input, l) = match kind {
            HeadKind::MultipleChoice => {
                // [B, C, T] choices; the encoder sees them flattened.
                let ids = vec![vec![2u32, 5, 9, 3], vec![2, 7, 4, 3]];
                let flat =
                    BertInput::from_ids(&ids, &[vec![0; 4], vec![0; 4]], 0, &Device::Cpu).unwrap();
                let choices = BertInput {
                    input_ids: flat.input_ids.reshape((1, 2, 4)).unwrap(),
                    token_type_ids: None,
                    attention_mask: None,
                };
                let l = Tensor::new(&[1i64], &Device::Cpu).unwrap();
                let flat = BertInput {
                    token_type_ids: None,
                    attention_mask: None,
                    ..flat
                };
                (choices, flat, l)
            }
            HeadKind::MaskedLM | HeadKind::PreTraining | HeadKind::TokenClassification => (
                input.clone(),
                input.clone(),
                tensor(&labels).clamp(-100, 1).unwrap(),
            ),
            _ => (
                input.clone(),
                input.clone(),
                Tensor::new(&[0i64, 1], &Device::Cpu).unwrap(),
            ),
        };
        let (s, e) = (
            Tensor::new(&[1i64, 2], &Device::Cpu).unwrap(),
            Tensor::new(&[2i64, 3], &Device::Cpu).unwrap(),
        );
        let nsp = Tensor::new(&[0i64, 1], &Device::Cpu).unwrap();
        let labels = match kind {
            HeadKind::QuestionAnswering => HeadLabels::spans(&s, &e),
            HeadKind::PreTraining => HeadLabels {
                labels: Some(&l),
                next_sentence_label: Some(&nsp),
                ..HeadLabels::default()
            },
            _ => HeadLabels::labels(Some(&l)),
        };
        let want = task.forward(&input, &labels, opts).unwrap();
        let encoded = task.bert().forward(&encoder_input, opts.forward).unwrap();
        let got = task
            .forward_encoded(&input, &encoded, &labels, opts)
            .unwrap();
        let (want, got) = (output_bits(&want), output_bits(&got));
        assert!(want.len() >= 2, "{kind:?}: outputs and loss");
        assert_eq!(got, want, "{kind:?}");
        // The head reads the outputs it is given, not its own encoder's.
        let other = bertha::BertOutput {
            last_hidden_state: (encoded.last_hidden_state * 0.5).unwrap(),
            pooler_output: encoded.pooler_output.map(|p| (p * 0.5).unwrap()),
            ..encoded
        };
        let moved = task.forward_encoded(&input, &other, &labels, opts).unwrap();
        assert_ne!(output_bits(&moved)[0], want[0], "{kind:?}");
    }
}
