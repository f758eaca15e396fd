//! bf16 products with fp32 sums: weights rounded to bf16 once, at packing;
//! activations rounded at the multiply's input only. AVX512-BF16's
//! `vdpbf16ps` multiplies two bf16 pairs per 32-bit lane and adds both
//! products to an fp32 sum, so a tile does twice fp32's work per
//! instruction.
//!
//! `packed` holds the inference weight ([`PackedBf16`]); `products` and
//! `fused` a training step's products, which `driver` runs on what
//! `operands` names; `serial` attention's per-head products, on the
//! calling thread. Beneath them: `pairs` (rounding to bf16 pairs),
//! `panels` and `weight_panels` (right operands), `transposed`
//! (transposed left operands) and `tiles` (the AVX-512 and AMX kernels'
//! dispatch, and the scalar loop).

mod driver;
mod fused;
#[cfg(test)]
mod layout_tests;
mod operands;
mod packed;
mod pairs;
mod panels;
#[cfg(test)]
mod product_tests;
mod products;
mod serial;
mod tiles;
mod transposed;
mod weight_panels;

pub use driver::Sums;
pub use operands::Strided;
pub use packed::PackedBf16;
pub use products::{product_bf16, product_bf16_transposed_pairs};

pub(crate) use driver::Dst;
pub(crate) use fused::{product_bf16_act, product_bf16_act_grad, product_bf16_to_pairs_new};
pub(crate) use operands::{LeftIn, Right};
pub(crate) use pairs::{as_f32, as_f32_mut, as_halves, as_words, as_words_mut, round_row};
pub(crate) use panels::{pack_panels_into, pack_row_pairs, pack_transposed_pairs};
pub(crate) use products::{
    product_bf16_both_pairs, product_bf16_interleaved, product_bf16_new, product_bf16_pairs_new,
    product_bf16_pairs_right, product_bf16_right, product_bf16_transposed_pairs_packed,
};
pub(crate) use serial::{
    interleave_transposed, product_bf16_serial, product_pairs_serial,
    product_pairs_serial_to_pairs, round_rows_serial, LeftPairs,
};
pub(crate) use tiles::{tile_bf16, BF16_TILE_ROWS};
pub(crate) use weight_panels::{PanelWriter, WeightPanels};

// What the AVX-512 kernels read and store.
#[cfg(target_arch = "x86_64")]
pub(super) use tiles::{Blocks, PairsIn, TileOut};
#[cfg(target_arch = "x86_64")]
pub(super) use transposed::Source;
