//! ELECTRA's training step on the fast engine: the generator's MLM step
//! on the masked rows ([`MlmHead`]), the draws from its logits before its
//! backward pass, then the discriminator's step on the corrupted input
//! ([`ReplacedTokenHead`]). Each pass returns its gradients; the shared
//! embeddings' are the sum of both, as the candle path's one backward
//! gives them. Masks, draws and dropout streams are the candle path's, so
//! in fp32 both engines compute the same step.

use super::{masked_targets, row_base, Draws, ElectraTally, ElectraTraining, Masked, MASK, SAMPLE};
use crate::data::Example;
use crate::error::{Error, Result};
use crate::fast::train::{
    Compute, MlmBatch, MlmHead, ReplacedTokenBatch, ReplacedTokenHead, WeightPacks,
};
use crate::model::electra_pretraining::ElectraPretraining;
use crate::model::IGNORE_INDEX;
use crate::training::trainer::{target_shares, Gradients, MeanLoss, MicroStep, Slice};

/// Whether the fast engine runs both models of `pair`.
pub(super) fn covers(pair: &ElectraPretraining) -> Result<bool> {
    Ok(MlmHead::of_masked_lm(&pair.generator)?.is_some()
        && ReplacedTokenHead::of(&pair.discriminator)?.is_some())
}

/// Rows of ids with their token types, as the fast heads take them.
fn packed<'a>(ids: &'a [Vec<u32>], types: &'a [Vec<u32>]) -> Vec<(&'a [u32], &'a [u32])> {
    ids.iter()
        .zip(types)
        .map(|(i, t)| (&i[..], &t[..]))
        .collect()
}

fn uncovered() -> Error {
    Error::Input("internal: the fast path no longer covers the ELECTRA pair".into())
}

impl ElectraTraining {
    /// A training micro-batch on the fast path. The loss terms' weights
    /// (this process's share of the micro-batch's masked tokens and of its
    /// tokens) need every process's counts first, so every process takes
    /// part even with no rows.
    pub(super) fn train_batch_fast(
        &self,
        batch: &[usize],
        slice: &Slice,
    ) -> Result<MicroStep<ElectraTally>> {
        let owned: Vec<_> = batch.iter().map(|&i| self.train.example(i)).collect();
        let examples: Vec<&Example> = owned.iter().map(|e| e.as_ref()).collect();
        let base = row_base(slice);
        let Masked { ids, labels, types } = self.mask(&examples, (MASK, base), true);
        let masked = labels
            .iter()
            .flatten()
            .filter(|&&y| y != IGNORE_INDEX)
            .count();
        let tokens: usize = ids.iter().map(Vec::len).sum();
        let shares = match target_shares(&[masked, tokens], batch.len(), tokens, slice.group)? {
            Ok(shares) => shares,
            Err(done) => return Ok(done),
        };
        let packs = (self.compute == Compute::Bf16).then(|| self.packs());
        let mut tally = ElectraTally::default();
        let mut corrupted: Vec<Vec<u32>> = examples.iter().map(|e| e.input_ids.clone()).collect();
        let mut gradients = None;
        if masked > 0 {
            let mut head = MlmHead::of_masked_lm(&self.pair.generator)?
                .ok_or_else(uncovered)?
                .with_compute(self.compute);
            if let Some(packs) = packs {
                head = head.with_packs(packs);
            }
            let batch = MlmBatch {
                sequences: packed(&ids, &types),
                labels: labels.iter().map(|l| &l[..]).collect(),
                next_sentence: None,
            };
            let targets = masked_targets(&labels);
            let draws = Draws {
                seed: self.opts.train.seed,
                purpose: SAMPLE,
                base,
            };
            let mut sample = |logits: &[f32]| {
                tally.replaced = draws.fill(&targets, logits, &mut corrupted) as f64;
                Ok(())
            };
            let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
            let out =
                head.step_reading_logits(&batch, [shares[0], 0.0], true, &mut kept, &mut sample)?;
            drop(kept);
            tally.generator = MeanLoss::of(out.mlm_loss, out.masked);
            tally.generator_correct = out.correct as f64;
            gradients = Some(out.gradients);
        }
        // Labels: 1 where the token differs from the original (a draw
        // equal to the original counts as original).
        let replaced: Vec<Vec<bool>> = corrupted
            .iter()
            .zip(&examples)
            .map(|(c, e)| c.iter().zip(&e.input_ids).map(|(a, b)| a != b).collect())
            .collect();
        let mut head = ReplacedTokenHead::of(&self.pair.discriminator)?
            .ok_or_else(uncovered)?
            .with_compute(self.compute);
        if let Some(packs) = packs {
            head = head.with_packs(packs);
        }
        let batch = ReplacedTokenBatch {
            sequences: packed(&corrupted, &types),
            replaced: replaced.iter().map(|r| &r[..]).collect(),
        };
        let out = head.step(&batch, self.opts.disc_weight * shares[1], true)?;
        tally.discriminator = MeanLoss::of(out.loss, out.tokens);
        tally.discriminator_correct = out.correct as f64;
        // The shared embeddings' gradient: both parts added.
        let gradients = match gradients {
            Some(mut g) => {
                g.extend(out.gradients)?;
                g
            }
            None => out.gradients,
        };
        Ok(MicroStep {
            loss: self.total(&tally),
            gradients: Gradients::Computed(gradients),
            tokens,
            tally,
        })
    }

    /// Both models' bf16 weight panels (made at the first bf16 step).
    fn packs(&self) -> &WeightPacks {
        self.packs.get_or_init(|| {
            let mut weights = Vec::new();
            if let Ok(Some(g)) = MlmHead::of_masked_lm(&self.pair.generator) {
                weights.extend(g.packed_weights());
            }
            if let Ok(Some(d)) = ReplacedTokenHead::of(&self.pair.discriminator) {
                weights.extend(d.packed_weights());
            }
            WeightPacks::of(weights)
        })
    }
}
