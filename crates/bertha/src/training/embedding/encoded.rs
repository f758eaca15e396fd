//! The columns of an embedding data set, tokenized once with each
//! column's prompt prepended, and their gold scores.

use candle_core::{Device, Tensor};

use super::EmbeddingOptions;
use crate::data::EmbeddingData;
use crate::error::Result;
use crate::io::tokenizer::Tokenizer;
use crate::training::distributed::ProcessGroup;

/// Pairs or scored pairs, tokenized once, prompts included.
pub(super) struct EncodedRows {
    pub(super) data: EmbeddingData,
    /// The same rows with each column's prompt prepended (what is encoded).
    pub(super) prompted: EmbeddingData,
    /// [column][row] token ids.
    pub(super) ids: Vec<Vec<Vec<u32>>>,
}

impl EncodedRows {
    pub(super) fn new(
        data: EmbeddingData,
        tokenizer: &Tokenizer,
        opts: &EmbeddingOptions,
    ) -> Result<Self> {
        let mut prompted = data.clone();
        for (j, name) in data.columns.iter().enumerate() {
            let prompt = opts.prompt(j, name);
            if !prompt.is_empty() {
                for row in &mut prompted.rows {
                    row[j] = format!("{prompt}{}", row[j]);
                }
            }
        }
        let ids = (0..data.columns.len())
            .map(|j| {
                let column: Vec<&str> = prompted.column(j).collect();
                let enc = tokenizer.encode_batch(&column)?;
                Ok(enc.into_iter().map(|e| e.input_ids).collect())
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            data,
            prompted,
            ids,
        })
    }

    pub(super) fn len(&self) -> usize {
        self.data.rows.len()
    }

    pub(super) fn columns(&self) -> usize {
        self.ids.len()
    }

    /// Gold scores of `rows`, [n].
    pub(super) fn scores(&self, rows: &[usize], device: &Device) -> Result<Option<Tensor>> {
        self.picked_scores(rows)
            .map(|s| Ok(Tensor::from_vec(s, rows.len(), device)?))
            .transpose()
    }

    pub(super) fn picked_scores(&self, rows: &[usize]) -> Option<Vec<f32>> {
        let s = self.data.scores.as_ref()?;
        Some(rows.iter().map(|&i| s[i]).collect())
    }

    /// Gold scores of the whole micro-batch whose rows `rows` are this
    /// process's (every process's, gathered), [B].
    pub(super) fn gathered_scores(
        &self,
        rows: &[usize],
        group: &dyn ProcessGroup,
        device: &Device,
    ) -> Result<Option<Tensor>> {
        let Some(picked) = self.picked_scores(rows) else {
            return Ok(None);
        };
        let all: Vec<f32> = group.gather_f32(&picked)?.concat();
        let n = all.len();
        Ok(Some(Tensor::from_vec(all, n, device)?))
    }
}
