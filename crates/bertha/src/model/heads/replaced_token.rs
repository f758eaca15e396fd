//! `ElectraForPreTraining`: ELECTRA's discriminator, one logit per token
//! saying whether the token was replaced, trained by binary
//! cross-entropy over the attended tokens.

use candle_core::{DType, Module, Result as CResult, Tensor, D};

use super::loss::{bce_with_logits, float_labels};
use super::{Head, HeadOutput, HeadPass, HeadSource};
use crate::config::Activation;
use crate::error::{Error, Result};
use crate::model::nn::{activate, Dense};

super::declare_head! {
    /// `ElectraForPreTraining`'s module (`ElectraDiscriminatorPredictions`):
    /// dense → `hidden_act` → `dense_prediction` on every token.
    ElectraForPreTraining: ReplacedTokenDetection -> HeadOutput,
    DiscriminatorModule { dense: Dense, act: Activation, prediction: Dense }
}

impl DiscriminatorModule {
    fn load_head(from: &HeadSource) -> CResult<Head<Self>> {
        let config = from.config();
        let (d, std) = (config.hidden_size, config.initializer_range);
        let vb = from.root().pp("discriminator_predictions");
        let module = Self {
            dense: Dense::load(vb.pp("dense"), d, d, std)?,
            act: config.hidden_act,
            prediction: Dense::load(vb.pp("dense_prediction"), d, 1, std)?,
        };
        Ok(Head::new(from.encoder()?, module))
    }

    /// `labels` [B, T]: 1 where the token was replaced, 0 where it is the
    /// original. The loss is the mean binary cross-entropy over the tokens
    /// the attention mask keeps (all tokens without a mask), as
    /// transformers computes it.
    fn run(&self, pass: HeadPass) -> Result<HeadOutput> {
        let out = pass.encode()?;
        let logits = self.logits(&out.last_hidden_state)?;
        let mask = pass.input.attention_mask.as_ref();
        HeadOutput::with_loss(out, logits, pass.labels.labels, |logits, labels, what| {
            replaced_token_loss(logits, labels, mask, what)
        })
    }

    /// [B, T, D] → [B, T].
    fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        let h = activate(&self.dense.forward(hidden)?, self.act)?;
        Ok(self.prediction.forward(&h)?.squeeze(D::Minus1)?)
    }
}

impl ElectraForPreTraining {
    /// `discriminator_predictions`: its dense layer, activation and
    /// one-logit `dense_prediction`.
    pub fn parts(&self) -> (&Dense, Activation, &Dense) {
        let m = &self.module;
        (&m.dense, m.act, &m.prediction)
    }
}

/// The discriminator's loss: mean binary cross-entropy of `logits` [B, T]
/// against `labels` [B, T] over the positions where `mask` is 1.
pub fn replaced_token_loss(
    logits: &Tensor,
    labels: &Tensor,
    mask: Option<&Tensor>,
    what: &str,
) -> Result<Tensor> {
    let targets = float_labels(labels, logits.dims(), what)?;
    let Some(mask) = mask else {
        return bce_with_logits(logits, &targets);
    };
    if mask.dims() != logits.dims() {
        return Err(Error::Input(format!(
            "attention_mask: shape {:?} does not match the logits' {:?}",
            mask.dims(),
            logits.dims()
        )));
    }
    let keep: Vec<u32> = mask
        .flatten_all()?
        .to_dtype(DType::F32)?
        .to_vec1::<f32>()?
        .iter()
        .enumerate()
        .filter(|(_, &m)| m == 1.0)
        .map(|(i, _)| i as u32)
        .collect();
    if keep.is_empty() {
        return Err(Error::Input(format!(
            "{what}: the attention mask keeps no token to score"
        )));
    }
    let n = keep.len();
    let idx = Tensor::from_vec(keep, n, logits.device())?;
    let pick = |t: &Tensor| t.flatten_all()?.index_select(&idx, 0);
    bce_with_logits(&pick(logits)?, &pick(&targets)?)
}
