//! The number formats the fast path's matrix multiplies run in.

#[cfg(doc)]
use super::PackedBert;
use crate::error::{Error, Result};

/// Number format of the fast path's matrix multiplies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Precision {
    /// fp32 throughout: matches transformers to ~1e-5.
    #[default]
    F32,
    /// bf16 weights and multiply inputs with fp32 sums (AVX512-BF16), in
    /// all four linear layers; LayerNorm, softmax, GELU and the attention
    /// products in fp32 (see [`PackedBert::to_bf16`]).
    Bf16,
    /// int8 weights (per output column and group of 64 input channels)
    /// and activations (per token and channel group) in all four linear
    /// layers, int32 sums; embeddings, LayerNorm, softmax, GELU, the
    /// attention products and the pooler in fp32 (see
    /// [`PackedBert::quantize_int8`]).
    Int8,
}

impl Precision {
    /// The name `--precision` takes (and a quantised checkpoint records).
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::Int8 => "int8",
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "f32" | "fp32" | "none" => Ok(Self::F32),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            "int8" | "i8" => Ok(Self::Int8),
            other => Err(Error::option(
                "precision",
                format!("`{other}` is unknown: use f32, bf16 or int8"),
            )),
        }
    }
}
