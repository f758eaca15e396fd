//! ELECTRA's pre-training pair: a small generator (`ElectraForMaskedLM`)
//! and the discriminator (`ElectraForPreTraining`), trained together with
//! the loss `generator MLM loss + weight × discriminator loss`.
//!
//! Both live in one parameter store: the discriminator in transformers'
//! layout (`electra.`, `discriminator_predictions.`), the generator under
//! [`GENERATOR_PREFIX`]. The generator's embeddings (word, position, type
//! and their LayerNorm) are the discriminator's tensors, and its decoder
//! stays tied to the shared word embeddings, as in the ELECTRA paper: a
//! name under `generator.electra.embeddings.` reads the discriminator's
//! tensor of the same name, so the shared tensors' gradient is the sum of
//! both models' parts.

use candle_core::Tensor;
use candle_nn::VarBuilder;

use super::heads::{BertForMaskedLM, BertHead, ElectraForPreTraining, HeadLabels, HeadOptions};
use super::BertInput;
use crate::config::{BertConfig, Family};
use crate::error::{Error, Result};

/// Where the generator's own tensors live in the pair's store.
pub const GENERATOR_PREFIX: &str = "generator.";

/// The shared embeddings, as the discriminator names them.
const SHARED: &str = "electra.embeddings.";

/// The generator and the discriminator over shared embeddings.
#[derive(Debug, Clone)]
pub struct ElectraPretraining {
    pub generator: BertForMaskedLM,
    pub discriminator: ElectraForPreTraining,
}

/// One joint step's inputs: the generator reads `masked`, the
/// discriminator `corrupted` (the masked positions filled with the
/// generator's samples).
pub struct ReplacedTokenBatch<'a> {
    pub masked: &'a BertInput,
    /// [B, T]: the original token at masked positions, -100 elsewhere.
    pub generator_labels: &'a Tensor,
    pub corrupted: &'a BertInput,
    /// [B, T]: 1 where the corrupted token differs from the original.
    pub discriminator_labels: &'a Tensor,
}

/// The joint loss and its parts.
#[derive(Debug, Clone)]
pub struct ElectraPretrainingOutput {
    /// `generator_loss + weight × discriminator_loss`.
    pub loss: Tensor,
    /// Mean cross-entropy over the masked tokens.
    pub generator_loss: Tensor,
    /// Mean binary cross-entropy over the attended tokens.
    pub discriminator_loss: Tensor,
    /// [B, T, V] ([N masked, V] with `labelled_rows_only`).
    pub generator_logits: Tensor,
    /// [B, T]
    pub discriminator_logits: Tensor,
}

impl ElectraPretraining {
    /// Loads both models from one store rooted at `vb` (see the module
    /// notes). The generator's config must agree with the discriminator's
    /// on everything the shared embeddings hold.
    pub fn load(
        vb: VarBuilder<'_>,
        discriminator: BertConfig,
        generator: BertConfig,
    ) -> Result<Self> {
        check_pair(&discriminator, &generator)?;
        let disc = ElectraForPreTraining::load(vb.clone(), discriminator)?;
        let shared_under_generator = format!("{GENERATOR_PREFIX}{SHARED}");
        let gen_vb = vb
            .rename_f(
                move |name| match name.strip_prefix(&shared_under_generator) {
                    Some(rest) => format!("{SHARED}{rest}"),
                    None => name.to_string(),
                },
            )
            .pp(GENERATOR_PREFIX.trim_end_matches('.'));
        let generator = BertForMaskedLM::load(gen_vb, generator)?;
        Ok(Self {
            generator,
            discriminator: disc,
        })
    }

    /// The generator's MLM pass on the masked input: logits and mean loss
    /// over the labelled positions.
    pub fn generator_pass(
        &self,
        masked: &BertInput,
        labels: &Tensor,
        opts: HeadOptions,
    ) -> Result<(Tensor, Tensor)> {
        let out = BertHead::forward(
            &self.generator,
            masked,
            &HeadLabels::labels(Some(labels)),
            opts,
        )?;
        let loss = out
            .loss
            .ok_or_else(|| Error::Input("the batch has no masked token to predict".into()))?;
        Ok((out.logits, loss))
    }

    /// The discriminator's pass on the corrupted input: logits [B, T] and
    /// mean loss over the attended tokens.
    pub fn discriminator_pass(
        &self,
        corrupted: &BertInput,
        labels: &Tensor,
        opts: HeadOptions,
    ) -> Result<(Tensor, Tensor)> {
        let out = BertHead::forward(
            &self.discriminator,
            corrupted,
            &HeadLabels::labels(Some(labels)),
            HeadOptions {
                labelled_rows_only: false,
                ..opts
            },
        )?;
        let loss = out
            .loss
            .ok_or_else(|| Error::Input("internal: no discriminator loss".into()))?;
        Ok((out.logits, loss))
    }

    /// Both passes on a batch whose corruption is already made, and the
    /// joint loss with the discriminator's part weighted by `weight`.
    pub fn forward(
        &self,
        batch: &ReplacedTokenBatch,
        weight: f64,
        opts: HeadOptions,
    ) -> Result<ElectraPretrainingOutput> {
        let (generator_logits, generator_loss) =
            self.generator_pass(batch.masked, batch.generator_labels, opts)?;
        let (discriminator_logits, discriminator_loss) =
            self.discriminator_pass(batch.corrupted, batch.discriminator_labels, opts)?;
        let loss = (&generator_loss + discriminator_loss.affine(weight, 0.0)?)?;
        Ok(ElectraPretrainingOutput {
            loss,
            generator_loss,
            discriminator_loss,
            generator_logits,
            discriminator_logits,
        })
    }
}

/// The generator shares the discriminator's embeddings: both must be
/// ELECTRA configs with the same vocabulary, embedding width, positions,
/// token types, padding id and LayerNorm eps.
pub fn check_pair(discriminator: &BertConfig, generator: &BertConfig) -> Result<()> {
    let (Family::Electra(d), Family::Electra(g)) = (&discriminator.family, &generator.family)
    else {
        return Err(Error::option(
            "model_type",
            format!(
                "ELECTRA pre-training needs two `electra` configs, got `{}` and `{}`",
                discriminator.model_type, generator.model_type
            ),
        ));
    };
    let pairs = [
        ("embedding_size", d.embedding_size, g.embedding_size),
        ("vocab_size", discriminator.vocab_size, generator.vocab_size),
        (
            "max_position_embeddings",
            discriminator.max_position_embeddings,
            generator.max_position_embeddings,
        ),
        (
            "type_vocab_size",
            discriminator.type_vocab_size,
            generator.type_vocab_size,
        ),
        (
            "pad_token_id",
            discriminator.pad_token_id as usize,
            generator.pad_token_id as usize,
        ),
    ];
    for (field, a, b) in pairs {
        if a != b {
            return Err(Error::option(
                field,
                format!("the generator's {b} differs from the discriminator's {a}: the two share their embeddings"),
            ));
        }
    }
    if discriminator.layer_norm_eps != generator.layer_norm_eps {
        return Err(Error::option(
            "layer_norm_eps",
            "the generator's differs from the discriminator's: the two share the embedding LayerNorm",
        ));
    }
    Ok(())
}
