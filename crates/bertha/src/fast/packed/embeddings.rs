//! The packed model's embeddings: word + position (+ token type) at the
//! embedding width, LayerNorm, then the projection to the hidden size
//! where the family has one (ELECTRA, ALBERT). RoBERTa counts positions
//! from its padding id; ModernBERT has no position table (its positions
//! are rotary, in the layers).

use super::{run, Linear, Norm};
use crate::error::{Error, Result};
use crate::fast::bert_layout;
use crate::fast::buffers::add;
use crate::fast::kernels;
use crate::fast::matmul::QuantScratch;

pub(crate) struct PackedEmbeddings {
    pub(in crate::fast) word: Vec<f32>,
    pub(in crate::fast) vocab: usize,
    /// The tables' width: `embedding_size` (below the hidden size for
    /// ALBERT and the smaller ELECTRAs), else the hidden size.
    pub(in crate::fast) width: usize,
    /// Absolute position embeddings (`None`: rotary positions, ModernBERT).
    pub(in crate::fast) position: Option<Vec<f32>>,
    pub(in crate::fast) max_positions: usize,
    /// RoBERTa's positions: from `padding_idx + 1` over the tokens that
    /// are not the padding id (see `fast::bert_layout`).
    pub(in crate::fast) positions_from: Option<u32>,
    pub(in crate::fast) token_type: Option<(Vec<f32>, usize)>,
    /// Every token type read as 0 (RoBERTa with one type: its tokenizer
    /// gives none, a WordPiece pair encoding's are ignored as in candle's).
    pub(in crate::fast) ignore_types: bool,
    pub(in crate::fast) norm: Option<Norm>,
    /// `[width, hidden]`, after the LayerNorm.
    pub(in crate::fast) projection: Option<Linear>,
}

impl PackedEmbeddings {
    /// The most tokens a text may have: every position it needs must be in
    /// the table (RoBERTa's start after the padding id).
    pub(super) fn max_tokens(&self) -> usize {
        match self.positions_from {
            Some(pad) => self.max_positions.saturating_sub(pad as usize + 1),
            None => self.max_positions,
        }
    }

    /// The embeddings of every token of `sequences` into `x` `[n, hidden]`
    /// (`n` the total tokens).
    pub(super) fn embed(&self, sequences: &[(&[u32], &[u32])], x: &mut [f32]) -> Result<()> {
        let Some(p) = &self.projection else {
            return self.sum_and_norm(sequences, x);
        };
        let n = sequences.iter().map(|(ids, _)| ids.len()).sum::<usize>();
        let mut sums = vec![0f32; n * self.width];
        self.sum_and_norm(sequences, &mut sums)?;
        run(&mut QuantScratch::default(), p, &sums, x, n);
        Ok(())
    }

    /// The sums of the tables' rows at the embedding width into `out`,
    /// then the LayerNorm.
    fn sum_and_norm(&self, sequences: &[(&[u32], &[u32])], out: &mut [f32]) -> Result<()> {
        let e = self.width;
        let mut row = 0;
        for (s, (ids, types)) in sequences.iter().enumerate() {
            let mut rank = 0;
            for (pos, &id) in ids.iter().enumerate() {
                let token = id as usize;
                if token >= self.vocab {
                    return Err(Error::Input(format!(
                        "text {s}: token id {id} is outside the vocabulary ({})",
                        self.vocab
                    )));
                }
                let o = &mut out[row * e..(row + 1) * e];
                o.copy_from_slice(&self.word[token * e..(token + 1) * e]);
                if let Some(position) = &self.position {
                    let p = bert_layout::position(self.positions_from, id, pos, &mut rank);
                    add(o, &position[p * e..(p + 1) * e]);
                }
                if let Some((table, n_types)) = &self.token_type {
                    let t = match self.ignore_types {
                        true => 0,
                        false => types.get(pos).copied().unwrap_or(0) as usize,
                    };
                    if t >= *n_types {
                        return Err(Error::Input(format!(
                            "text {s}: token type {t} is not below type_vocab_size {n_types}"
                        )));
                    }
                    add(o, &table[t * e..(t + 1) * e]);
                }
                row += 1;
            }
        }
        if let Some(f) = &self.norm {
            kernels::add_layer_norm(out, None, &f.gamma, &f.beta, f.eps);
        }
        Ok(())
    }
}
