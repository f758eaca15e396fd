//! How texts are cut into batches, and the arithmetic one encoder pass
//! over them costs (`bertha bench`'s fraction of the peak).

use crate::config::BertConfig;
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
