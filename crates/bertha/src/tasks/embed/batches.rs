//! How texts are cut into batches, and the arithmetic one encoder pass
//! over them costs (`bertha bench`'s fraction of the peak).

use rayon::prelude::*;

use crate::config::BertConfig;
use crate::error::Result;
use crate::io::tokenizer::Encoded;

/// Indices of `encodings`, longest first, cut into batches of at most
/// `batch_size` texts and at most `max_tokens` tokens (a text longer than
/// the cap runs alone).
pub fn length_sorted_batches(
    encodings: &[Encoded],
    batch_size: usize,
    max_tokens: usize,
) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..encodings.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(encodings[i].len()));
    let mut batches = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut tokens = 0;
    for i in order {
        let n = encodings[i].len();
        if !current.is_empty() && (current.len() >= batch_size.max(1) || tokens + n > max_tokens) {
            batches.push(std::mem::take(&mut current));
            tokens = 0;
        }
        current.push(i);
        tokens += n;
    }
    if !current.is_empty() {
        batches.push(current);
    }
    batches
}

/// Runs `run` on every batch and hands each batch with its rows to
/// `done`, on the calling thread, in the order the batches finish; stops
/// at the first error. `concurrent` runs batches at once, one per rayon
/// worker, each batch's own products still split over the pool (a worker
/// that runs out of batches helps the others finish theirs).
///
/// Why: one batch at a time over two cores leaves each core at ~0.59 of
/// its FMA peak on all-MiniLM-L6-v2, against 0.63–0.68 for one core on its
/// own (Zen 4, `BERTHA_ISA=avx2`): batches side by side embedded SST-2
/// dev 8–34 % faster (AVX-512: 5–12 %). A batch's rows do not depend on
/// the thread that runs it or on the pool's size (the products' sums run
/// in one order on any thread count), so the vectors are bit for bit the
/// same.
pub(crate) fn run_batches<T: Send>(
    batches: &[Vec<usize>],
    concurrent: bool,
    run: impl Fn(&[usize]) -> Result<Vec<T>> + Sync,
    mut done: impl FnMut(&[usize], Vec<T>),
) -> Result<()> {
    if !concurrent {
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

/// Floating-point operations of one encoder pass over texts of these
/// token counts (multiply-adds count 2): the projections and FFN per
/// token, and attention's two products per text, on real tokens only.
/// With `one_row` (the fast path's last layer at one row per text, for
/// `[CLS]` pooling and the pooler), that layer's Q/K/V count on every
/// token and the rest on one row per text.
pub fn encoder_flops(config: &BertConfig, lengths: &[usize], one_row: bool) -> f64 {
    let d = config.hidden_size as f64;
    let f = config.intermediate_size as f64;
    let layers = config.num_hidden_layers as f64;
    let per_token = 2.0 * (3.0 * d * d + d * d + 2.0 * d * f);
    let tokens: f64 = lengths.iter().map(|&n| n as f64).sum();
    let attention: f64 = lengths.iter().map(|&n| 4.0 * (n as f64).powi(2) * d).sum();
    if !one_row || config.num_hidden_layers == 0 {
        return layers * (per_token * tokens + attention);
    }
    let texts = lengths.len() as f64;
    let last = 2.0 * 3.0 * d * d * tokens
        + texts * 2.0 * (d * d + 2.0 * d * f)
        + lengths.iter().map(|&n| 4.0 * n as f64 * d).sum::<f64>();
    (layers - 1.0) * (per_token * tokens + attention) + last
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

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

    #[test]
    fn one_row_work_counts_the_last_layer_at_one_row_per_text() {
        let mut config = BertConfig::mini_bert_seed();
        config.num_hidden_layers = 2;
        let (d, f) = (config.hidden_size as f64, config.intermediate_size as f64);
        let lengths = [3, 5];
        let whole = encoder_flops(&config, &lengths, false);
        let layer = 2.0 * (4.0 * d * d + 2.0 * d * f) * 8.0 + 4.0 * (9.0 + 25.0) * d;
        assert_eq!(whole, 2.0 * layer);
        // Last layer: Q/K/V on all 8 tokens, the rest on 2 rows, each
        // row's attention over its text's keys.
        let last = 2.0 * 3.0 * d * d * 8.0 + 2.0 * 2.0 * (d * d + 2.0 * d * f) + 4.0 * 8.0 * d;
        assert_eq!(encoder_flops(&config, &lengths, true), layer + last);
    }
}
