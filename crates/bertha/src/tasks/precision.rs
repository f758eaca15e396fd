//! The number format a task runs at, for the embedders and every head
//! pipeline alike: the encoder runs on the packed CPU fast path
//! ([`PackedBert`]) where it takes the model, at f32 (rounding apart, the
//! candle modules' numbers, which run it elsewhere and on request), bf16
//! or int8, and the task head on its last hidden states in fp32.

use candle_core::Tensor;

use crate::error::{Error, Result};
use crate::fast::{cpu, PackedBert, Precision};
use crate::io::tokenizer::Tokenizer;
use crate::model::{BertInput, BertModel, BertOutput, ForwardOptions};

/// Calibration texts of int8 quantization: 256 sentences from the lead
/// sections of English Wikipedia articles (CC BY-SA 4.0), taken from
/// `tests/fixtures/corpus-wiki-slice.txt`.
const CALIBRATION_EN: &str = include_str!("calibration-en.txt");

/// What the task pipelines (fill-mask, classify, NER, QA, NSP, and
/// evaluate / predict of fine-tuned checkpoints) are built with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipelineOptions {
    /// `F32`: fp32 (see `fast_f32`). `Bf16` / `Int8`: the encoder on the
    /// packed CPU fast path at that precision, the head in fp32; on the
    /// CPU, for every family but DeBERTa-v2 (`fast::bert_layout`; other
    /// models and devices are refused with an error).
    /// bf16 on a CPU without fast bf16 products (no AVX512-BF16, or
    /// slower than fp32's: [`cpu::has_bf16`]) runs in fp32, with a notice.
    pub precision: Precision,
    /// Run fp32 on the packed fast path where it takes the model (its
    /// products differ from the candle modules' by rounding only; on
    /// all-MiniLM-L6-v2 `bertha classify` of SST-2 dev ran 3.5-6x
    /// faster), as the embedders and the cross-encoder do. `false`: the
    /// candle modules, exactly.
    pub fast_f32: bool,
}

impl Default for PipelineOptions {
    fn default() -> Self {
        Self {
            precision: Precision::F32,
            fast_f32: true,
        }
    }
}

/// The precision that runs when `precision` is asked: bf16 without fast
/// bf16 products ([`cpu::has_bf16`]) is fp32, with a notice.
pub(crate) fn runnable(precision: Precision) -> Precision {
    if precision == Precision::Bf16 && !cpu::has_bf16() {
        tracing::warn!("{}: --precision bf16 runs in fp32", cpu::no_bf16_reason());
        return Precision::F32;
    }
    precision
}

/// The fast path of `model` in `precision` as this CPU runs it (`None`
/// when the model cannot take it: DeBERTa-v2, or not on the CPU);
/// int8 calibrates on the built-in texts (see [`pack`]).
pub(crate) fn packed_model(
    model: &BertModel,
    tokenizer: &Tokenizer,
    precision: Precision,
) -> Result<Option<PackedBert>> {
    pack(model, tokenizer, runnable(precision), None)
}

/// The fast path of `model` packed in `precision` (bf16 whatever the
/// CPU); int8 calibrates on `calibration`, by default a built-in set of
/// English sentences (lead sentences of Wikipedia articles, not from any
/// evaluation set), tokenized by `tokenizer`.
pub(crate) fn pack(
    model: &BertModel,
    tokenizer: &Tokenizer,
    precision: Precision,
    calibration: Option<&[String]>,
) -> Result<Option<PackedBert>> {
    let Some(mut packed) = PackedBert::from_model(model)? else {
        return Ok(None);
    };
    match precision {
        Precision::F32 => {}
        Precision::Bf16 => packed.to_bf16(),
        Precision::Int8 => {
            let texts: Vec<&str> = match calibration {
                Some(t) => t.iter().map(String::as_str).collect(),
                None => CALIBRATION_EN.lines().collect(),
            };
            let encs = tokenizer.encode_batch(&texts)?;
            let seqs: Vec<(&[u32], &[u32])> = encs
                .iter()
                .map(|e| (&e.input_ids[..], &e.token_type_ids[..]))
                .collect();
            packed.quantize_int8(&seqs)?;
        }
    }
    Ok(Some(packed))
}

/// The error for a reduced precision on a model the fast path does not take.
pub(crate) fn fast_path_refused(precision: Precision, model: &BertModel) -> Error {
    Error::Input(format!(
        "{precision:?} runs only on the CPU fast path, which this model \
         ({} on {:?}) does not take",
        // The family's name, without its options.
        model.config().family.class_prefix(),
        model.device()
    ))
}

/// The encoder under a task head, at the precision it was built with.
pub(crate) struct HeadEncoder {
    /// The fast path (bf16 / int8; f32 only when built by
    /// [`HeadEncoder::fast`], else the candle modules).
    packed: Option<PackedBert>,
    precision: Precision,
}

impl HeadEncoder {
    /// fp32 on the candle modules: exactly [`BertModel::forward`].
    pub(crate) fn f32() -> Self {
        Self {
            packed: None,
            precision: Precision::F32,
        }
    }

    /// The encoder of `model` at `precision` (int8 calibrates with
    /// `tokenizer`): an error for bf16 / int8 when the model cannot take
    /// the fast path.
    pub(crate) fn new(
        model: &BertModel,
        tokenizer: &Tokenizer,
        precision: Precision,
    ) -> Result<Self> {
        let precision = runnable(precision);
        if precision == Precision::F32 {
            return Ok(Self::f32());
        }
        let packed = packed_model(model, tokenizer, precision)?
            .ok_or_else(|| fast_path_refused(precision, model))?;
        Ok(Self {
            packed: Some(packed),
            precision,
        })
    }

    /// As [`HeadEncoder::new`], with fp32 on the packed fast path too
    /// where it takes the model (its products differ from the candle
    /// modules' by rounding only); other models run fp32 on the candle
    /// modules.
    pub(crate) fn fast(
        model: &BertModel,
        tokenizer: &Tokenizer,
        precision: Precision,
    ) -> Result<Self> {
        let precision = runnable(precision);
        if precision != Precision::F32 {
            return Self::new(model, tokenizer, precision);
        }
        Ok(match packed_model(model, tokenizer, precision)? {
            Some(packed) => Self {
                packed: Some(packed),
                precision,
            },
            None => Self::f32(),
        })
    }

    /// The encoder `opts` ask for: [`HeadEncoder::fast`] with
    /// `fast_f32`, else [`HeadEncoder::new`].
    pub(crate) fn of_options(
        model: &BertModel,
        tokenizer: &Tokenizer,
        opts: &PipelineOptions,
    ) -> Result<Self> {
        match opts.fast_f32 {
            true => Self::fast(model, tokenizer, opts.precision),
            false => Self::new(model, tokenizer, opts.precision),
        }
    }

    /// Whether the encoder runs on the packed CPU fast path.
    pub(crate) fn is_packed(&self) -> bool {
        self.packed.is_some()
    }

    /// The precision that runs.
    pub(crate) fn precision(&self) -> Precision {
        self.precision
    }

    /// The padded input of sequences `ids` / `types` (at least `pad_to`
    /// tokens) and the encoder's outputs on it. On the fast path the last
    /// hidden state holds zeros at padded positions and the pooler runs
    /// in fp32 on the candle module; it gives no hidden states or
    /// attentions and does not train. With `first_row_only` (a head that
    /// reads each sequence's first row alone: the pooler's sequence
    /// classification and NSP), the fast path runs its last layer at those
    /// rows and the other rows of the last hidden state are zeros.
    pub(crate) fn encode(
        &self,
        model: &BertModel,
        (ids, types): (&[Vec<u32>], &[Vec<u32>]),
        (pad_id, pad_to): (u32, usize),
        opts: ForwardOptions,
        first_row_only: bool,
    ) -> Result<(BertInput, BertOutput)> {
        let input = BertInput::padded_to(ids, types, pad_id, pad_to, model.device())?;
        let Some(packed) = &self.packed else {
            let out = model.forward(&input, opts)?;
            return Ok((input, out));
        };
        if opts.train || opts.output_hidden_states || opts.output_attentions {
            return Err(Error::Input(format!(
                "the {:?} fast path only infers: training, hidden states and attentions need f32",
                self.precision
            )));
        }
        let seqs: Vec<(&[u32], &[u32])> = ids
            .iter()
            .enumerate()
            .map(|(i, s)| (&s[..], types.get(i).map_or(&[][..], |t| &t[..])))
            .collect();
        // A family with its own layers pools its own way (ModernBERT: the
        // mean over tokens too), so it gets every row.
        let first_row_only =
            first_row_only && model.encoder.stack().is_none() && ids.iter().all(|s| !s.is_empty());
        let states = match first_row_only {
            true => packed.forward_at(&seqs, &vec![0; seqs.len()])?,
            false => packed.forward(&seqs)?,
        };
        let (b, t) = input.input_ids.dims2()?;
        let d = states.hidden;
        let mut padded = vec![0f32; b * t * d];
        for s in 0..b {
            let rows = states.sequence(s);
            padded[s * t * d..s * t * d + rows.len()].copy_from_slice(rows);
        }
        let last_hidden_state = Tensor::from_vec(padded, (b, t, d), model.device())?;
        let pooler_output = model.pooled(&last_hidden_state, input.attention_mask.as_ref())?;
        let out = BertOutput {
            last_hidden_state,
            pooler_output,
            hidden_states: None,
            attentions: None,
        };
        Ok((input, out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{BertForSequenceClassification, BertHead, HeadInit, HeadLabels};

    /// The fast path's plumbing (packing, padding back, pooler or the
    /// family's pooling) on its own: at f32 it gives the candle path's
    /// logits on a padded batch, for BERT's pooler and ModernBERT's mean
    /// over tokens.
    #[test]
    fn fast_path_at_f32_gives_the_candle_logits() {
        for fixture in ["tiny/bert-seqcls", "families/modernbert-seqcls"] {
            fast_head_gives_the_candle_logits(fixture);
        }
    }

    fn fast_head_gives_the_candle_logits(fixture: &str) {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures")
            .join(fixture);
        let device = candle_core::Device::Cpu;
        let head = BertForSequenceClassification::from_dir(&dir, HeadInit::FromCheckpoint, &device)
            .unwrap();
        let tok = Tokenizer::from_dir(&dir, 64).unwrap();
        let packed = PackedBert::from_model(head.bert()).unwrap().unwrap();
        let fast = HeadEncoder {
            packed: Some(packed),
            precision: Precision::F32,
        };
        let encs = tok
            .encode_batch(&["the album was very good", "john left"])
            .unwrap();
        let ids: Vec<Vec<u32>> = encs.iter().map(|e| e.input_ids.clone()).collect();
        let types: Vec<Vec<u32>> = encs.iter().map(|e| e.token_type_ids.clone()).collect();
        let run = |enc: &HeadEncoder, first_row_only: bool| {
            let opts = ForwardOptions::default();
            let (input, out) = enc
                .encode(
                    head.bert(),
                    (&ids, &types),
                    (tok.pad_id(), 0),
                    opts,
                    first_row_only,
                )
                .unwrap();
            let logits = head
                .forward_encoded(&input, &out, &HeadLabels::default(), opts.into())
                .unwrap()
                .logits;
            logits.to_vec2::<f32>().unwrap()
        };
        // The whole pass, and the last layer at the [CLS] rows only.
        let want = run(&HeadEncoder::f32(), false);
        for first_row_only in [false, true] {
            let got = run(&fast, first_row_only);
            for (w, g) in want.iter().flatten().zip(got.iter().flatten()) {
                assert!(
                    (w - g).abs() <= 1e-5,
                    "{fixture}: {w} vs {g} ({first_row_only})"
                );
            }
        }
        let opts = ForwardOptions {
            train: true,
            ..ForwardOptions::default()
        };
        let err = fast
            .encode(head.bert(), (&ids, &types), (0, 0), opts, false)
            .unwrap_err();
        assert!(err.to_string().contains("need f32"), "{err}");
    }
}
