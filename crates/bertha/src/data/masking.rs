//! BERT's masked-LM corruption: choose `mask_prob` of the maskable tokens,
//! replace them by `[MASK]` / a random token / themselves in the ratio of
//! the split, and predict the originals (label -100 everywhere else).

use rand::Rng;

use crate::error::{Error, Result};
use crate::io::tokenizer::Tokenizer;
use crate::model::IGNORE_INDEX as IGNORE;

/// What happens to a chosen token, in percent: `[MASK]`, random, kept.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MaskSplit {
    pub mask: f64,
    pub random: f64,
    pub keep: f64,
}

impl Default for MaskSplit {
    fn default() -> Self {
        Self {
            mask: 80.0,
            random: 10.0,
            keep: 10.0,
        }
    }
}

impl MaskSplit {
    /// Parses `"80,10,10"`; the three parts must sum to 100.
    pub fn parse(text: &str) -> Result<Self> {
        let parts: Vec<f64> = text
            .split(',')
            .map(|p| p.trim().parse::<f64>())
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| bad_split(text))?;
        let [mask, random, keep] = parts[..] else {
            return Err(bad_split(text));
        };
        if [mask, random, keep].iter().any(|p| *p < 0.0)
            || (mask + random + keep - 100.0).abs() > 1e-6
        {
            return Err(bad_split(text));
        }
        Ok(Self { mask, random, keep })
    }
}

fn bad_split(text: &str) -> Error {
    Error::option(
        "mask_split",
        format!("`{text}`: expected three non-negative percentages MASK,RANDOM,KEEP summing to 100 (e.g. 80,10,10)"),
    )
}

/// Dynamic masking: call [`Masker::mask`] every time a sequence is seen.
#[derive(Debug, Clone)]
pub struct Masker {
    pub mask_prob: f64,
    pub split: MaskSplit,
    pub mask_id: u32,
    pub vocab_size: u32,
    /// Ids never chosen and never drawn as random replacements
    /// (`[CLS]`, `[SEP]`, `[PAD]`, `[MASK]`, `[UNK]`…).
    pub special: Vec<u32>,
    /// Per vocabulary id: whether the token continues a word (`##…`);
    /// `Some` turns on whole-word masking.
    pub continuation: Option<Vec<bool>>,
}

/// One masked sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct Masked {
    pub input_ids: Vec<u32>,
    /// The original id at chosen positions, [`IGNORE`] elsewhere.
    pub labels: Vec<i64>,
}

impl Masker {
    pub fn new(mask_prob: f64, split: MaskSplit, mask_id: u32, vocab_size: u32) -> Result<Self> {
        if !(mask_prob > 0.0 && mask_prob <= 1.0) {
            return Err(Error::option(
                "mask_prob",
                format!("{mask_prob}: must lie in (0, 1] (nothing masked, nothing learnt)"),
            ));
        }
        Ok(Self {
            mask_prob,
            split,
            mask_id,
            vocab_size,
            special: vec![mask_id],
            continuation: None,
        })
    }

    /// A masker for `tokenizer`'s vocabulary: its mask token, its special
    /// tokens excluded, `##` continuation pieces for whole-word masking.
    pub fn for_tokenizer(
        tokenizer: &Tokenizer,
        mask_prob: f64,
        split: MaskSplit,
        whole_word: bool,
    ) -> Result<Self> {
        let mask_id = ["[MASK]", "<mask>"]
            .iter()
            .find_map(|t| tokenizer.token_to_id(t))
            .ok_or_else(|| {
                Error::Tokenizer("the vocabulary has no [MASK] or <mask> token".into())
            })?;
        let vocab_size = tokenizer.vocab_size() as u32;
        let mut m = Self::new(mask_prob, split, mask_id, vocab_size)?;
        m.special = [
            "[CLS]", "[SEP]", "[PAD]", "[MASK]", "<s>", "</s>", "<pad>", "<mask>",
        ]
        .iter()
        .filter_map(|t| tokenizer.token_to_id(t))
        .collect();
        if whole_word {
            m.continuation = Some(
                (0..vocab_size)
                    .map(|id| {
                        tokenizer
                            .id_to_token(id)
                            .is_some_and(|t| t.starts_with("##"))
                    })
                    .collect(),
            );
        }
        Ok(m)
    }

    fn is_special(&self, id: u32) -> bool {
        self.special.contains(&id)
    }

    /// Masks `ids`; positions whose `attention` is 0 (padding) and special
    /// tokens are never chosen.
    pub fn mask(&self, ids: &[u32], rng: &mut impl Rng) -> Masked {
        let n = ids.len();
        let mut chosen = vec![false; n];
        match &self.continuation {
            None => {
                for (c, &id) in chosen.iter_mut().zip(ids) {
                    *c = !self.is_special(id) && rng.random::<f64>() < self.mask_prob;
                }
            }
            Some(cont) => {
                // One draw per word: a word is a first piece and the `##`
                // pieces after it.
                let mut i = 0;
                while i < n {
                    if self.is_special(ids[i]) {
                        i += 1;
                        continue;
                    }
                    let mut j = i + 1;
                    while j < n
                        && !self.is_special(ids[j])
                        && cont.get(ids[j] as usize).copied().unwrap_or(false)
                    {
                        j += 1;
                    }
                    let pick = rng.random::<f64>() < self.mask_prob;
                    chosen[i..j].iter_mut().for_each(|c| *c = pick);
                    i = j;
                }
            }
        }
        let mut input_ids = ids.to_vec();
        let mut labels = vec![IGNORE; n];
        let (p_mask, p_random) = (self.split.mask / 100.0, self.split.random / 100.0);
        for i in (0..n).filter(|&i| chosen[i]) {
            labels[i] = i64::from(ids[i]);
            let u: f64 = rng.random();
            if u < p_mask {
                input_ids[i] = self.mask_id;
            } else if u < p_mask + p_random {
                input_ids[i] = self.random_token(rng);
            }
        }
        Masked { input_ids, labels }
    }

    fn random_token(&self, rng: &mut impl Rng) -> u32 {
        // Special tokens are redrawn: a random `[CLS]` would teach nothing.
        loop {
            let id = rng.random_range(0..self.vocab_size);
            if !self.is_special(id) {
                return id;
            }
        }
    }
}
