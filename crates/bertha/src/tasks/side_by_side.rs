//! Batches run side by side, one per rayon worker, on the packed CPU fast
//! path: embeddings (`embed`) and a cross-encoder's pairs (`rerank`).
//!
//! Why: one batch at a time over two cores leaves each core at ~0.59 of
//! its FMA peak on all-MiniLM-L6-v2, against 0.63–0.68 for one core on its
//! own (Zen 4, `BERTHA_ISA=avx2`), though the linears alone scale to two
//! cores in full: batches side by side embedded SST-2 dev 8–34 % faster
//! (AVX-512: 5–12 %). A batch's rows do not depend on the thread that runs
//! it or on the pool's size (the products' sums run in one order on any
//! thread count), so the results are bit for bit the same.

use rayon::prelude::*;

use crate::error::Result;

/// Whether a caller with the packed fast path (`packed`) runs its batches
/// side by side, and the batch size to cut `texts` texts of `tokens`
/// tokens at ([`part_size`] when side by side, else `batch_size`). Side by
/// side needs more than one thread, and a caller outside the pool (inside,
/// as in a caller's own `par_iter`, the calling worker must not wait on
/// the pool it is part of).
pub(crate) fn plan(packed: bool, batch_size: usize, texts: usize, tokens: usize) -> (bool, usize) {
    let side_by_side =
        packed && rayon::current_num_threads() > 1 && rayon::current_thread_index().is_none();
    match side_by_side {
        true => (true, part_size(batch_size, texts, tokens)),
        false => (false, batch_size),
    }
}

/// Fewest tokens in a part of one batch cut for the cores ([`part_size`]).
const MIN_PART_TOKENS: usize = 300;

/// The batch size for `texts` texts of `tokens` tokens in all, run side by
/// side: fewer texts than a batch a thread (a server's dynamic batch, a
/// short file) are cut into up to one part a thread of at least
/// [`MIN_PART_TOKENS`] each, and more keep `batch_size`. The same rows,
/// sooner: AVX2 on Zen 4, 32 sentences of SST-2 in two parts 9 % sooner,
/// 64 3 %, 28 2.5 %, while 16 or 24, under 600 tokens, were level or 1–3 %
/// slower.
fn part_size(batch_size: usize, texts: usize, tokens: usize) -> usize {
    let parts = (tokens / MIN_PART_TOKENS).clamp(1, rayon::current_num_threads());
    batch_size.min(texts.div_ceil(parts)).max(1)
}

/// Runs `run` on every batch and hands each batch with its rows to
/// `done`, on the calling thread, in the order the batches finish; stops
/// at the first error. `concurrent` (see [`plan`]) runs more than one batch at
/// once, one per rayon worker, each batch's own products still split over
/// the pool (a worker that runs out of batches helps the others finish
/// theirs).
pub(crate) fn run_batches<T: Send>(
    batches: &[Vec<usize>],
    concurrent: bool,
    run: impl Fn(&[usize]) -> Result<Vec<T>> + Sync,
    mut done: impl FnMut(&[usize], Vec<T>),
) -> Result<()> {
    if !concurrent || batches.len() < 2 {
        for batch in batches {
            done(batch, run(batch)?);
        }
        return Ok(());
    }
    let (results, finished) = std::sync::mpsc::channel();
    let mut outcome = Ok(());
    rayon::in_place_scope(|scope| {
        scope.spawn(|_| {
            // A failed batch (or a caller gone after one) stops the rest.
            let _ = batches
                .par_iter()
                .enumerate()
                .with_max_len(1)
                .try_for_each_with(results, |results, (b, batch)| {
                    let rows = run(batch);
                    let failed = rows.is_err();
                    match results.send((b, rows)).is_ok() && !failed {
                        true => Ok(()),
                        false => Err(()),
                    }
                });
        });
        // The sender lives in the spawned task: the loop ends when it has
        // run every batch or stopped.
        for (b, rows) in finished {
            match rows {
                Ok(rows) => done(&batches[b], rows),
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            }
        }
    });
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn one_batch_is_cut_into_parts_of_300_tokens_and_more() {
        let size_on = |threads: usize, (batch, texts, tokens): (usize, usize, usize)| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| part_size(batch, texts, tokens))
        };
        // Under 600 tokens: whole.
        assert_eq!(size_on(2, (32, 32, 599)), 32);
        assert_eq!(size_on(2, (32, 32, 800)), 16);
        // As many parts as 300 tokens allow, up to one a thread.
        assert_eq!(size_on(4, (32, 32, 800)), 16);
        assert_eq!(size_on(4, (32, 32, 1300)), 8);
        assert_eq!(size_on(4, (32, 3, 5000)), 1);
        // More texts than a batch a thread keep the batch size.
        assert_eq!(size_on(2, (8, 100, 10_000)), 8);
        assert_eq!(size_on(1, (32, 32, 10_000)), 32);
        assert_eq!(size_on(2, (0, 5, 10_000)), 1);
    }

    #[test]
    fn batches_run_side_by_side_reach_the_caller_once_each() {
        let batches: Vec<Vec<usize>> = (0..23).map(|b| vec![2 * b, 2 * b + 1]).collect();
        for concurrent in [false, true] {
            let mut got = vec![None; 46];
            let mut calls = 0;
            run_batches(
                &batches,
                concurrent,
                |batch| Ok(batch.iter().map(|i| i * 10).collect()),
                |batch, rows| {
                    calls += 1;
                    for (i, row) in batch.iter().zip(rows) {
                        assert!(got[*i].replace(row).is_none(), "row {i} twice");
                    }
                },
            )
            .unwrap();
            assert_eq!(calls, 23);
            let want: Vec<Option<usize>> = (0..46).map(|i| Some(i * 10)).collect();
            assert_eq!(got, want, "concurrent {concurrent}");
        }
    }

    #[test]
    fn a_failed_batch_is_the_error_and_stops_the_rest() {
        let batches: Vec<Vec<usize>> = (0..200).map(|b| vec![b]).collect();
        for concurrent in [false, true] {
            let ran = std::sync::atomic::AtomicUsize::new(0);
            let mut delivered = 0;
            let err = run_batches(
                &batches,
                concurrent,
                |batch| {
                    ran.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    match batch[0] {
                        3 => Err(Error::Input("batch 3 is bad".into())),
                        b => Ok(vec![b]),
                    }
                },
                |_, _| delivered += 1,
            )
            .unwrap_err();
            assert!(err.to_string().contains("batch 3 is bad"), "{err}");
            let ran = ran.into_inner();
            assert!(
                delivered < 200 && ran < 200,
                "{delivered} delivered, {ran} run"
            );
        }
    }
}
