//! What the task pipelines share: loading a head with its tokenizer,
//! building inputs, softmax, turning tokens back into words.

use std::path::Path;

use candle_core::{Device, Tensor};
use tokenizers::Decoder;

use super::precision::{HeadEncoder, PipelineOptions};
use super::side_by_side;
use crate::error::{Error, Result};
use crate::fast::Precision;
use crate::io::tokenizer::{default_max_length, Encoded, Tokenizer};
use crate::io::ModelDir;
use crate::model::{
    BertHead, ForwardOptions, HeadInit, HeadKind, HeadLabels, HeadOptions, HeadOutput,
};

/// A task head with the encoder under it run at the pipeline's precision.
pub(crate) struct PipelineHead<H> {
    head: H,
    encoder: HeadEncoder,
}

impl<H: BertHead> PipelineHead<H> {
    /// `head` in fp32: the candle modules, exactly.
    pub(crate) fn f32(head: H) -> Self {
        Self {
            head,
            encoder: HeadEncoder::f32(),
        }
    }

    /// `head` with the encoder `opts` ask for (int8 calibrates with
    /// `tokenizer`).
    pub(crate) fn new(head: H, tokenizer: &Tokenizer, opts: &PipelineOptions) -> Result<Self> {
        let encoder = HeadEncoder::of_options(head.bert(), tokenizer, opts)?;
        Ok(Self { head, encoder })
    }

    /// `head` over an encoder built by the caller.
    pub(crate) fn with_encoder(head: H, encoder: HeadEncoder) -> Self {
        Self { head, encoder }
    }

    pub(crate) fn head(&self) -> &H {
        &self.head
    }

    /// The precision that runs.
    pub(crate) fn precision(&self) -> Precision {
        self.encoder.precision()
    }

    /// Whether the encoder runs on the packed CPU fast path.
    pub(crate) fn is_packed(&self) -> bool {
        self.encoder.is_packed()
    }

    /// The head's outputs on unpadded sequences (`ids`, `type_ids`),
    /// padded with `pad_id` into one batch.
    pub(crate) fn forward(
        &self,
        ids: &[Vec<u32>],
        type_ids: &[Vec<u32>],
        pad_id: u32,
    ) -> Result<H::Output> {
        self.forward_labelled(ids, type_ids, pad_id, &HeadLabels::default(), false)
    }

    /// As [`PipelineHead::forward`], with `labels`, and with an MLM head's
    /// `labelled_rows_only` (its vocabulary-sized decoder at the labelled
    /// rows alone).
    pub(crate) fn forward_labelled(
        &self,
        ids: &[Vec<u32>],
        type_ids: &[Vec<u32>],
        pad_id: u32,
        labels: &HeadLabels,
        labelled_rows_only: bool,
    ) -> Result<H::Output> {
        let opts = ForwardOptions::default();
        // The pooler's heads read each sequence's first row alone.
        let first_row_only = matches!(
            H::KIND,
            HeadKind::SequenceClassification | HeadKind::NextSentencePrediction
        );
        let (input, out) = self.encoder.encode(
            self.head.bert(),
            (ids, type_ids),
            (pad_id, 0),
            opts,
            first_row_only,
        )?;
        let opts = HeadOptions {
            forward: opts,
            labelled_rows_only,
        };
        self.head.forward_encoded(&input, &out, labels, opts)
    }
}

impl<H: BertHead<Output = HeadOutput> + Sync> PipelineHead<H> {
    /// The logits of many unpadded sequences (`ids`, `type_ids`), in their
    /// order: a sequence head's one row (`[batch, labels]` logits), or a
    /// token head's row per token (`[batch, tokens, labels]`, the padding's
    /// rows left out), each sequence's rows one after the other. Sequences
    /// of similar length share a batch of up to `batch_size` (little
    /// padding), and on the packed path batches run side by side, one per
    /// core ([`side_by_side`]). A sequence's logits do not depend on the
    /// batch it lands in beyond fp32 rounding.
    pub(crate) fn many_logits(
        &self,
        seqs: &[(&[u32], &[u32])],
        batch_size: usize,
        pad_id: u32,
    ) -> Result<Vec<Vec<f32>>> {
        let mut order: Vec<usize> = (0..seqs.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(seqs[i].0.len()));
        let tokens = seqs.iter().map(|s| s.0.len()).sum();
        let (concurrent, batch_size) =
            side_by_side::plan(self.is_packed(), batch_size.max(1), seqs.len(), tokens);
        let batches: Vec<Vec<usize>> = order.chunks(batch_size).map(<[usize]>::to_vec).collect();
        let run = |batch: &[usize]| -> Result<Vec<Vec<f32>>> {
            let ids: Vec<Vec<u32>> = batch.iter().map(|&i| seqs[i].0.to_vec()).collect();
            let types: Vec<Vec<u32>> = batch.iter().map(|&i| seqs[i].1.to_vec()).collect();
            let logits = self.forward(&ids, &types, pad_id)?.logits;
            let per_seq = (logits.elem_count() / batch.len().max(1)).max(1);
            let labels = logits.dims().last().copied().unwrap_or(1);
            let flat = logits.flatten_all()?.to_vec1::<f32>()?;
            Ok(batch
                .iter()
                .zip(flat.chunks_exact(per_seq))
                .map(|(&i, seq)| match logits.rank() {
                    2 => seq.to_vec(),
                    // Right-padded: the sequence's own tokens come first.
                    _ => seq[..seqs[i].0.len() * labels].to_vec(),
                })
                .collect())
        };
        let mut out = vec![Vec::new(); seqs.len()];
        side_by_side::run_batches(&batches, concurrent, run, |batch, rows| {
            for (&i, row) in batch.iter().zip(rows) {
                out[i] = row;
            }
        })?;
        Ok(out)
    }

    /// The logits of one unpadded sequence (`ids`, `type_ids`) through a
    /// one-logits head, without the batch dimension.
    pub(crate) fn single_logits(
        &self,
        ids: &[u32],
        type_ids: &[u32],
        pad_id: u32,
    ) -> Result<Tensor> {
        let out = self.forward(&[ids.to_vec()], &[type_ids.to_vec()], pad_id)?;
        Ok(out.logits.get(0)?)
    }
}

/// Loads a head that must be in the checkpoint, at the precision `opts`
/// asks, and the folder's tokenizer truncating at `max_length` (default:
/// the model's own limit).
pub(crate) fn load<H: BertHead>(
    dir: &Path,
    device: &Device,
    max_length: Option<usize>,
    opts: &PipelineOptions,
) -> Result<(PipelineHead<H>, Tokenizer)> {
    let (head, tokenizer) = load_head::<H>(dir, device, max_length)?;
    let head = PipelineHead::new(head, &tokenizer, opts)?;
    Ok((head, tokenizer))
}

/// The head of [`load`] in fp32, with its tokenizer.
pub(crate) fn load_head<H: BertHead>(
    dir: &Path,
    device: &Device,
    max_length: Option<usize>,
) -> Result<(H, Tokenizer)> {
    let head = H::from_dir(dir, HeadInit::FromCheckpoint, device)?;
    let config = head.config();
    let max_length = match max_length {
        Some(n) if n > config.max_sequence_length() => {
            return Err(Error::Input(format!(
                "max length {n} is longer than the model's limit of {} tokens (max_position_embeddings {})",
                config.max_sequence_length(),
                config.max_position_embeddings
            )))
        }
        Some(n) => n,
        None => default_max_length(dir, config)?,
    };
    let tokenizer = ModelDir::open(dir)?.model_tokenizer(config, max_length)?;
    Ok((head, tokenizer))
}

/// Softmax of one row, computed in f64.
pub(crate) fn softmax(logits: &[f32]) -> Vec<f32> {
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let exps: Vec<f64> = logits.iter().map(|&x| (x as f64 - m).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.into_iter().map(|e| (e / sum) as f32).collect()
}

pub(crate) fn sigmoid(x: f32) -> f32 {
    (1.0 / (1.0 + (-(x as f64)).exp())) as f32
}

/// Index of the first largest value (numpy's argmax).
pub(crate) fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// Indices of the `k` largest values, largest first (stable for ties).
pub(crate) fn top_k(v: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[b].total_cmp(&v[a]));
    idx.truncate(k);
    idx
}

/// transformers' `convert_tokens_to_string`: the tokenizer's decoder
/// (WordPiece: `##` pieces glued to the previous token), else BERT's rule.
pub(crate) fn tokens_to_string(tokenizer: &Tokenizer, tokens: &[String]) -> String {
    if let Some(dec) = tokenizer.inner().get_decoder() {
        if let Ok(s) = dec.decode(tokens.to_vec()) {
            return s;
        }
    }
    tokens.join(" ").replace(" ##", "").trim().to_string()
}

/// The characters `start..end` of `text` (offsets count chars, not bytes).
pub(crate) fn char_slice(text: &str, start: usize, end: usize) -> String {
    text.chars()
        .skip(start)
        .take(end.saturating_sub(start))
        .collect()
}

/// A text that lost tokens to truncation.
pub(crate) fn warn_truncated(enc: &Encoded, max_length: usize) {
    if enc.truncated {
        tracing::warn!("a text was truncated to {max_length} tokens");
    }
}
