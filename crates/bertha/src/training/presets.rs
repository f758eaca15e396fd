//! Model sizes for pre-training from scratch: Google's small BERTs
//! (Turc et al., 2019), the seed's pre-LN mini BERT, and a ModernBERT of
//! BERT mini's size.

use std::path::Path;

use crate::config::BertConfig;
use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// L=2, H=128, A=2
    Tiny,
    /// L=4, H=256, A=4
    Mini,
    /// L=4, H=512, A=8
    Small,
    /// L=12, H=768, A=12 (bert-base)
    Base,
    /// The seed's pre-LN, ReLU mini BERT, widened to the tokenizer.
    MiniBertSeed,
    /// ModernBERT at BERT mini's size: L=4, H=256, A=4, GeGLU width 384
    /// (ModernBERT-base's 1.5 H), global attention in layers 0 and 3.
    ModernBertMini,
}

impl Preset {
    pub const NAMES: &'static str =
        "tiny, mini, small, base, mini-bert-seed, modernbert-mini, electra-mini, electra-small";

    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "tiny" => Self::Tiny,
            "mini" => Self::Mini,
            "small" => Self::Small,
            "base" => Self::Base,
            "mini-bert-seed" => Self::MiniBertSeed,
            "modernbert-mini" => Self::ModernBertMini,
            _ => return None,
        })
    }

    /// Position-table size of Google's presets (BERT's 512).
    pub const MAX_POSITIONS: usize = 512;

    /// The config for a vocabulary of `vocab_size` and sequences of
    /// `seq_len` tokens (at most [`Preset::MAX_POSITIONS`]; the seed's mini
    /// BERT, with 4 positions of its own, gets `seq_len` of them).
    pub fn config(self, vocab_size: usize, seq_len: usize) -> BertConfig {
        let (layers, hidden, heads) = match self {
            Self::Tiny => (2, 128, 2),
            Self::Mini => (4, 256, 4),
            Self::Small => (4, 512, 8),
            Self::Base => (12, 768, 12),
            Self::MiniBertSeed => {
                return BertConfig {
                    vocab_size,
                    max_position_embeddings: seq_len.max(4),
                    ..BertConfig::mini_bert_seed()
                }
            }
            Self::ModernBertMini => {
                return BertConfig::modernbert(vocab_size, (4, 256, 4, 384), Self::MAX_POSITIONS)
            }
        };
        BertConfig {
            vocab_size,
            hidden_size: hidden,
            num_hidden_layers: layers,
            num_attention_heads: heads,
            intermediate_size: 4 * hidden,
            max_position_embeddings: Self::MAX_POSITIONS,
            ..BertConfig::default()
        }
    }
}

/// `--config`: a preset name or a `config.json`-shaped file. `electra-NAME`
/// is BERT preset NAME as an ELECTRA discriminator of the same shape
/// (embeddings as wide as the hidden states, no pooler).
pub fn resolve_config(spec: &str, vocab_size: usize, seq_len: usize) -> Result<BertConfig> {
    if let Some(bert) = spec
        .strip_prefix("electra-")
        .filter(|n| matches!(Preset::parse(n), Some(Preset::Mini | Preset::Small)))
    {
        let config = resolve_config(bert, vocab_size, seq_len)?;
        return Ok(super::electra::as_electra(&config));
    }
    if let Some(p) = Preset::parse(spec) {
        if seq_len > Preset::MAX_POSITIONS {
            return Err(Error::option(
                "seq_len",
                format!(
                    "{seq_len}: longer than the presets' {} positions (max_position_embeddings); give a config.json for longer sequences",
                    Preset::MAX_POSITIONS
                ),
            ));
        }
        return Ok(p.config(vocab_size, seq_len));
    }
    let path = Path::new(spec);
    if !path.is_file() {
        return Err(Error::option(
            "config",
            format!(
                "`{spec}`: neither a preset ({}) nor a config.json file",
                Preset::NAMES
            ),
        ));
    }
    let config = BertConfig::from_file(path)?;
    if config.vocab_size != vocab_size {
        return Err(Error::config(
            path,
            "vocab_size",
            format!(
                "{} but the tokenizer has {vocab_size} tokens",
                config.vocab_size
            ),
        ));
    }
    if config.max_position_embeddings < seq_len {
        return Err(Error::config(
            path,
            "max_position_embeddings",
            format!(
                "{} is shorter than seq_len {seq_len}",
                config.max_position_embeddings
            ),
        ));
    }
    Ok(config)
}
