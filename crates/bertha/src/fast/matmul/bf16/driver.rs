//! The driver a training step's bf16 products run through: operands
//! rounded and packed into this thread's buffers (or read as they come),
//! tiles run over (panel, row block) tasks or on the calling thread, and
//! stored as [`Store`] says.

use super::operands::{Left, Right};
use super::pairs::{round_rows_strided, round_strided, stride_of};
use super::panels::{pack_panels_reusing, panels_len};
use super::tiles::{tiles, Blocks, PairsIn, TileOut, MR_BF16};
use super::transposed::{
    interleave_rows, transposed_left, transposed_len, transposed_stride, transposed_width, Source,
};
use crate::fast::buffers::Unwritten;
use crate::fast::cpu::features;
use crate::fast::kernels::Act;
use crate::fast::matmul::{for_each_task, SharedOut, NR, ROWS_PER_TASK};

/// Where a [`product_bf16`] puts its sums.
///
/// [`product_bf16`]: super::products::product_bf16
#[derive(Debug, Clone, Copy, Default)]
pub struct Sums<'a> {
    /// Added to every row (length `n`).
    pub bias: Option<&'a [f32]>,
    /// Add to what the output holds instead of overwriting it (gradients
    /// summed over products), in the tile's store.
    pub accumulate: bool,
}

/// A [`Sums`] product's fp32 output.
pub(crate) enum Dst<'a> {
    /// Rows it overwrites, or adds to ([`Sums::accumulate`]).
    Rows(&'a mut [f32]),
    /// A new buffer it writes whole (not accumulating): a weight
    /// gradient's first product of a step, with no pass zeroing it first.
    New(&'a mut Unwritten),
}

impl<'a> From<&'a mut [f32]> for Dst<'a> {
    fn from(c: &'a mut [f32]) -> Self {
        Self::Rows(c)
    }
}

impl<'a> From<&'a mut Vec<f32>> for Dst<'a> {
    fn from(c: &'a mut Vec<f32>) -> Self {
        Self::Rows(c)
    }
}

impl<'a> From<&'a mut Unwritten> for Dst<'a> {
    fn from(c: &'a mut Unwritten) -> Self {
        Self::New(c)
    }
}

/// The operands of the products on one thread, rounded and packed into
/// buffers kept between calls: a training step makes a few hundred
/// products, and fresh buffers cost a page fault and a zeroing each.
#[derive(Default)]
pub(super) struct ProductBuffers {
    pub(super) pairs: Vec<u32>,
    pub(super) panels: Vec<u16>,
}

thread_local! {
    static BUFFERS: std::cell::RefCell<ProductBuffers> =
        const { std::cell::RefCell::new(ProductBuffers { pairs: Vec::new(), panels: Vec::new() }) };
}

/// What a product's tiles store.
#[derive(Clone, Copy)]
pub(super) enum Store<'a> {
    /// The sums, as [`Sums`] says.
    Sums(Sums<'a>),
    /// `act'(sums + bias)` as the fp32 output and `act(sums + bias)` as
    /// bf16 pairs ([`TileOut::Both`]), `⌈n / 2⌉` per row, and as the
    /// panels of a right operand `[m, n]` (`panels_len(m, n) / 2` words).
    Both {
        bias: &'a [f32],
        act: Act,
        pairs: SharedPairs,
        ldp: usize,
        panels: SharedPairs,
    },
    /// Only `sums + bias` as bf16 pairs ([`TileOut::Pairs`]), `⌈n / 2⌉`
    /// per row: a product whose every use is another product's operand.
    Pairs { bias: &'a [f32], pairs: SharedPairs },
    /// The sums are an activation's output gradient ([`TileOut::ActGrad`]):
    /// its input gradient as pairs, `⌈n / 2⌉` per row, from the
    /// activation's `slopes` (`[m, n]`); the column sums of each task's
    /// rows into row `rows.start / ROWS_PER_TASK` of `sums` (`[⌈m /
    /// ROWS_PER_TASK⌉, n]`, zeroed by the caller).
    ActGrad {
        slopes: SharedIn,
        pairs: SharedPairs,
        ldp: usize,
        sums: SharedOut,
        /// The input gradient transposed, as [`Blocks`] (`⌈n / MR_BF16⌉`
        /// blocks of `MR_BF16 · ⌈m / 2⌉` words).
        blocks: SharedPairs,
    },
}

/// A pair output tasks share, each writing its own tiles.
#[derive(Clone, Copy)]
pub(super) struct SharedPairs(pub(super) *mut u32);
// SAFETY: every task writes only its own rows and pair columns.
unsafe impl Send for SharedPairs {}
unsafe impl Sync for SharedPairs {}

impl SharedPairs {
    pub(super) fn at(self, offset: usize) -> *mut u32 {
        self.0.wrapping_add(offset)
    }
}

/// A read-only input tasks share.
#[derive(Clone, Copy)]
pub(super) struct SharedIn(pub(super) *const f32);
// SAFETY: tasks only read through it, while the caller's borrow lasts.
unsafe impl Send for SharedIn {}
unsafe impl Sync for SharedIn {}

impl SharedIn {
    fn at(self, offset: usize) -> *const f32 {
        self.0.wrapping_add(offset)
    }
}

/// `f` with this thread's product buffers; a product started while they
/// are in use (a rayon task stolen while waiting inside one) gets its own.
pub(super) fn with_buffers(f: impl FnOnce(&mut ProductBuffers)) {
    BUFFERS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buffers) => f(&mut buffers),
        Err(_) => f(&mut ProductBuffers::default()),
    })
}

/// A product of these operands into `c` (`[m, n]`, row-major) as `sums`
/// says, on every core, with this thread's buffers.
pub(super) fn product_bf16_sums<'c>(
    (m, n, k): (usize, usize, usize),
    a: Left,
    b: Right,
    c: impl Into<Dst<'c>>,
    sums: Sums,
) {
    let store = Store::Sums(sums);
    match c.into() {
        Dst::Rows(c) => with_buffers(|buffers| {
            product_bf16_on(features().bf16, (m, n, k), a, b, c, store, buffers)
        }),
        Dst::New(c) => product_bf16_writing((m, n, k), a, b, Some(c), store),
    }
}

/// A product into `c` `[m, n]`, a new buffer that it writes whole (`store`
/// must not accumulate): every row block's tiles store every panel's
/// columns, reading none of them first, so `c` needs no zeroing.
pub(super) fn product_bf16_writing(
    dims: (usize, usize, usize),
    a: Left,
    b: Right,
    c: Option<&mut Unwritten>,
    store: Store,
) {
    product_bf16_writing_on(features().bf16, dims, a, b, c, store)
}

/// [`product_bf16_writing`] on AVX512-BF16 or the scalar loop (`simd`).
pub(super) fn product_bf16_writing_on(
    simd: bool,
    (m, n, k): (usize, usize, usize),
    a: Left,
    b: Right,
    c: Option<&mut Unwritten>,
    store: Store,
) {
    if let Store::Sums(sums) = store {
        assert!(
            !sums.accumulate,
            "product_bf16: a new output cannot accumulate"
        );
    }
    // Only a Store::Pairs or ActGrad has no fp32 output (its tiles never
    // write one).
    let c = match c {
        Some(c) => {
            assert_eq!(c.len(), m * n, "product_bf16: output is not [{m}, {n}]");
            c.as_mut_ptr()
        }
        None => {
            assert!(
                matches!(store, Store::Pairs { .. } | Store::ActGrad { .. }),
                "product_bf16: no output"
            );
            std::ptr::null_mut()
        }
    };
    let run = Run {
        simd,
        parallel: true,
    };
    // SAFETY: c addresses m × n values owned by the caller's buffer (or,
    // null, is never written: Store::Pairs); a Store::Both's or
    // Store::Pairs's pairs were checked to be m × ⌈n / 2⌉ by their maker.
    with_buffers(|buffers| unsafe {
        product_bf16_into(run, (m, n, k), a, b, (c, n), store, buffers)
    });
}

/// How a product runs: on AVX512-BF16 or the scalar loop (`simd`), on
/// every core or the calling thread (`parallel`).
#[derive(Clone, Copy)]
pub(super) struct Run {
    pub(super) simd: bool,
    pub(super) parallel: bool,
}

pub(super) fn product_bf16_on(
    simd: bool,
    (m, n, k): (usize, usize, usize),
    a: Left,
    b: Right,
    c: &mut [f32],
    store: Store,
    buffers: &mut ProductBuffers,
) {
    assert_eq!(c.len(), m * n, "product_bf16: output is not [{m}, {n}]");
    let run = Run {
        simd,
        parallel: true,
    };
    // SAFETY: c is m × n, rows n apart (asserted), and borrowed mutably;
    // a Store::Both's pairs were checked to be m × ⌈n / 2⌉ by its maker.
    unsafe { product_bf16_into(run, (m, n, k), a, b, (c.as_mut_ptr(), n), store, buffers) }
}

const _: () = assert!(ROWS_PER_TASK.is_multiple_of(MR_BF16));

/// [`product_bf16_on`] into `m` rows of `n` values `ldc` apart at `c`.
///
/// # Safety
/// As [`product_bf16_serial`].
///
/// [`product_bf16_serial`]: super::serial::product_bf16_serial
pub(super) unsafe fn product_bf16_into(
    Run { simd, parallel }: Run,
    (m, n, k): (usize, usize, usize),
    a: Left,
    b: Right,
    (c, ldc): (*mut f32, usize),
    store: Store,
    buffers: &mut ProductBuffers,
) {
    match b {
        Right::F32(b) => b.check(k, n, "product_bf16 right operand"),
        Right::Packed(p) => assert_eq!(
            p.len(),
            panels_len(k, n),
            "product_bf16: the packed right operand is not [{k}, {n}]"
        ),
        Right::Pairs(_) => {}
    }
    let (bias, act) = match store {
        Store::Sums(sums) => (sums.bias, None),
        Store::Both { bias, act, .. } => (Some(bias), Some(act)),
        Store::Pairs { bias, .. } => (Some(bias), None),
        Store::ActGrad { .. } => (None, None),
    };
    if let Some(bias) = bias {
        assert_eq!(bias.len(), n, "product_bf16: bias is not [{n}]");
    }
    let k2 = k.div_ceil(2);
    // The left operand's words per row: rows of pairs as their maker laid
    // them out (padded or not), k2 as rounded here.
    let a_stride = match a {
        Left::Pairs(p) => stride_of(p.len(), m, k, "the left operand's pairs"),
        Left::TransposedPairs(p) => stride_of(p.len(), k, m, "the left operand's pairs"),
        Left::Interleaved(p) => {
            let len = transposed_len(m, k2);
            assert_eq!(p.len(), len, "product_bf16: the interleaved left operand");
            k2
        }
        Left::Strided(_) => k2,
    };
    if let Right::Pairs(p) = b {
        stride_of(p.len(), k, n, "the right operand's pairs");
    }
    if m == 0 || n == 0 {
        return;
    }
    let ProductBuffers { pairs, panels } = buffers;
    // A transposed left operand (a weight gradient's dYᵀ) is read as its
    // rows interleaved two by two, every step's pairs side by side: no
    // transpose. Others as rows of pairs.
    let interleaved = match a {
        Left::Strided(a) => a.cs != 1 && a.rs == 1,
        Left::Pairs(_) => false,
        Left::TransposedPairs(_) | Left::Interleaved(_) => true,
    };
    let pairs: &[u32] = match a {
        Left::Pairs(p) | Left::Interleaved(p) => p,
        Left::TransposedPairs(p) => {
            let src = Source::Pairs {
                data: p,
                row: a_stride,
            };
            interleave_rows(src, k, m, pairs, parallel);
            &pairs[..transposed_len(m, k2)]
        }
        Left::Strided(a) => {
            a.check(m, k, "product_bf16 left operand");
            if a.cs == 1 {
                round_rows_strided(simd, parallel, (a.data, a.rs), m, k, k2, pairs);
            } else if interleaved {
                let src = Source::F32 {
                    data: a.data,
                    cs: a.cs,
                };
                interleave_rows(src, k, m, pairs, parallel);
            } else {
                round_strided(a, m, k, k2, pairs);
            }
            match interleaved {
                true => &pairs[..transposed_len(m, k2)],
                false => &pairs[..m * k2],
            }
        }
    };
    let panels: &[u16] = match b {
        Right::Packed(p) => p,
        _ => {
            pack_panels_reusing(b, k, n, panels, parallel);
            panels
        }
    };
    let left = |r0: usize| match interleaved {
        // Tiles start at multiples of MR_BF16 (tasks at multiples of
        // ROWS_PER_TASK, a const assertion above), so r0 starts a block.
        true => transposed_left(pairs, r0, k2),
        false => PairsIn::rows(&pairs[r0 * a_stride..], a_stride),
    };
    let zeros = [0f32; NR];
    let (out, n2, width) = (SharedOut(c), n.div_ceil(2), transposed_width());
    let task = |p: usize, rows: std::ops::Range<usize>| {
        let panel = &panels[p * k2 * NR * 2..(p + 1) * k2 * NR * 2];
        let cs = p * NR..(p * NR + NR).min(n);
        let bias = bias.map_or(&zeros[..cs.len()], |b| &b[cs]);
        let block = rows.start / ROWS_PER_TASK;
        let dest = |r0: usize| {
            let c = out.at(r0 * ldc + p * NR);
            match store {
                Store::Sums(sums) => TileOut::F32 {
                    c,
                    ldc,
                    accumulate: sums.accumulate,
                },
                Store::Both {
                    pairs: to,
                    ldp,
                    act,
                    panels,
                    ..
                } => TileOut::Both {
                    slopes: c,
                    lds: ldc,
                    pairs: to.at(r0 * ldp + p * NR / 2),
                    ldp,
                    act,
                    // Panel p's pair rows, m.div_ceil(2) of NR words; r0 is
                    // even (a multiple of MR_BF16).
                    panel: Some(panels.at((p * m.div_ceil(2) + r0 / 2) * NR)),
                },
                Store::Pairs { pairs: to, .. } => TileOut::Pairs {
                    c: to.at(r0 * n2 + p * NR / 2),
                    ldc: n2,
                },
                Store::ActGrad {
                    slopes,
                    pairs: to,
                    ldp,
                    sums,
                    blocks,
                } => TileOut::ActGrad {
                    slopes: slopes.at(r0 * n + p * NR),
                    lds: n,
                    pairs: to.at(r0 * ldp + p * NR / 2),
                    ldp,
                    sums: sums.at(block * n + p * NR),
                    // r0 is even (a multiple of MR_BF16).
                    blocks: Blocks {
                        at: blocks.at(r0 / 2 * width),
                        stride: match width {
                            1 => transposed_stride(m.div_ceil(2)),
                            width => width * m.div_ceil(2),
                        },
                        c0: p * NR,
                        width,
                    },
                },
            }
        };
        // SAFETY: the task's rows, columns of panel p lie inside c (the
        // caller's m × n) and the pairs (m rows, n2 or the store's ldp
        // apart) and belong to this task only; the tiles read pairs of
        // their rows inside `pairs` (m rows of k2, a_stride apart).
        unsafe { tiles(simd, rows, left, k2, panel, bias, act, dest) };
    };
    if parallel {
        for_each_task(m, n, std::mem::size_of_val(pairs), task);
    } else {
        (0..n.div_ceil(NR)).for_each(|p| task(p, 0..m));
    }
}
