//! How a head is loaded: checked against the checkpoint, or with its
//! missing tensors initialised fresh like transformers for fine-tuning.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use candle_core::{DType, Device, Result as CResult, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder};

use super::{BertHead, HeadKind};
use crate::config::BertConfig;
use crate::error::{Error, Result};
use crate::io::weights::{strip_backtrace, SeededInit, Weights};
use crate::model::bert::BertModel;

/// What to do when a checkpoint lacks the head's tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeadInit {
    /// The head must be in the checkpoint: a missing tensor is an error.
    #[default]
    FromCheckpoint,
    /// Head tensors missing from the checkpoint (and the pooler, for heads
    /// that use it) are initialised like transformers: normal(0,
    /// `initializer_range`) weights, zero biases, unit LayerNorm, drawn
    /// from a generator seeded with `seed`. Encoder tensors must still be
    /// present.
    Fresh { seed: u64 },
}

/// A `VarBuilder` backend: the checkpoint's tensors, with head tensors it
/// lacks drawn fresh (and remembered) when allowed.
struct HeadBackend {
    weights: Weights,
    fresh: Option<(SeededInit, Vec<String>)>,
    initialised: Arc<Mutex<Vec<String>>>,
}

impl HeadBackend {
    fn may_init(&self, name: &str) -> Option<&SeededInit> {
        let (init, prefixes) = self.fresh.as_ref()?;
        prefixes
            .iter()
            .any(|p| name.starts_with(p.as_str()))
            .then_some(init)
    }
}

impl SimpleBackend for HeadBackend {
    fn get(&self, s: Shape, name: &str, h: Init, dtype: DType, dev: &Device) -> CResult<Tensor> {
        if !self.weights.contains(name) {
            if let Some(init) = self.may_init(name) {
                if let Ok(mut v) = self.initialised.lock() {
                    v.push(name.to_string());
                }
                return init.get(s, name, h, dtype, dev);
            }
        }
        self.weights.get(s, name, h, dtype, dev)
    }

    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> CResult<Tensor> {
        self.weights.get_unchecked(name, dtype, dev)
    }

    /// Only what the checkpoint really holds (so that a tied decoder is
    /// tied, not drawn fresh).
    fn contains_tensor(&self, name: &str) -> bool {
        self.weights.contains(name)
    }
}

/// Loads head `H` from named tensors, with or without the `bert.` prefix:
/// [`BertHead::from_weights`].
pub(super) fn load_head<H: BertHead>(
    weights: Weights,
    config: BertConfig,
    init: HeadInit,
    device: &Device,
) -> Result<H> {
    let (base, root, fresh) = head_var_builders(weights, &config, H::KIND, init, device)?;
    let origin = base.1.clone();
    let head = H::load_parts(base.0, root, config).map_err(|e| Error::Weights {
        path: origin.clone(),
        reason: strip_backtrace(&e),
    })?;
    let fresh = fresh.lock().map(|v| v.clone()).unwrap_or_default();
    if !fresh.is_empty() {
        tracing::warn!(
            "{}: newly initialised {} tensors (train before use): {}",
            origin.display(),
            H::KIND,
            fresh.join(", ")
        );
    }
    Ok(head)
}

type Fresh = Arc<Mutex<Vec<String>>>;

/// Checks the head against the checkpoint and builds (encoder, root)
/// builders over it.
fn head_var_builders(
    weights: Weights,
    config: &BertConfig,
    kind: HeadKind,
    init: HeadInit,
    device: &Device,
) -> Result<((VarBuilder<'static>, PathBuf), VarBuilder<'static>, Fresh)> {
    let origin = weights.origin().to_path_buf();
    let prefix = weights
        .base_prefix(config.family.prefix())
        .ok_or_else(|| Error::Weights {
            path: origin.clone(),
            reason: format!(
                "missing tensor `embeddings.word_embeddings.weight` (also looked for `{}.embeddings.word_embeddings.weight`)",
                config.family.prefix()
            ),
        })?;
    if !kind.supported_by(&config.family) {
        return Err(Error::config(
            &origin,
            "model_type",
            format!(
                "bertha has no {} head for `{}` models",
                kind.class_name(&config.family),
                config.model_type
            ),
        ));
    }
    if kind == HeadKind::MultipleChoice {
        // ELECTRA's `summary_*` keys, named in the folder's config.json.
        let config_json = match origin.extension() {
            Some(_) => origin.with_file_name("config.json"),
            None => origin.join("config.json"),
        };
        config.sequence_summary(&config_json)?;
    }
    if kind.uses_pooler_in(&config.family) && !config.add_pooling_layer {
        return Err(Error::config(
            &origin,
            "add_pooling_layer",
            format!("{kind} reads the pooler output, but the config has no pooler"),
        ));
    }
    if !config.architectures.is_empty()
        && !config
            .architectures
            .iter()
            .any(|a| *a == kind.class_name(&config.family))
    {
        tracing::debug!(
            "{}: loading {kind} from a checkpoint saved as {:?}",
            origin.display(),
            config.architectures
        );
    }
    let fresh = match init {
        HeadInit::FromCheckpoint => {
            // The head follows `architectures`: tensors of the right names
            // saved by another head are not this head's weights.
            let saved: Vec<HeadKind> = config
                .architectures
                .iter()
                .filter_map(|a| HeadKind::from_any_architecture(a))
                .collect();
            if !saved.contains(&kind) {
                if let Some(other) = saved
                    .iter()
                    .find(|s| kind.conflicts_with(**s, &prefix, config))
                {
                    return Err(Error::Weights {
                        path: origin,
                        reason: format!(
                            "the checkpoint has no {} head: it was saved as {} (config.json \
                             `architectures`), whose tensors of the same names are another \
                             head's. Use a checkpoint fine-tuned for this task, or initialise \
                             the head fresh to train it",
                            kind.class_name(&config.family),
                            other.class_name(&config.family),
                        ),
                    });
                }
            }
            if let Some(missing) = kind
                .head_tensors(&prefix, config)
                .into_iter()
                .find(|n| !weights.contains(n))
            {
                let saved_as = if config.architectures.is_empty() {
                    "no `architectures` in config.json".to_string()
                } else {
                    format!("saved as {}", config.architectures.join(", "))
                };
                let kind = kind.class_name(&config.family);
                return Err(Error::Weights {
                    path: origin,
                    reason: format!(
                        "the checkpoint has no {kind} head: missing tensor `{missing}` ({saved_as}). \
                         Use a checkpoint fine-tuned for this task, or initialise the head fresh to train it"
                    ),
                });
            }
            None
        }
        HeadInit::Fresh { seed } => {
            Some((SeededInit::new(seed), kind.fresh_prefixes(&prefix, config)))
        }
    };
    let initialised: Fresh = Arc::default();
    let backend = HeadBackend {
        weights,
        fresh,
        initialised: initialised.clone(),
    };
    let root = VarBuilder::from_backend(Box::new(backend), DType::F32, device.clone());
    let base = if prefix.is_empty() {
        root.clone()
    } else {
        root.pp(prefix.trim_end_matches('.'))
    };
    Ok(((base, origin), root, initialised))
}

pub(super) fn load_bert(
    base: VarBuilder,
    config: BertConfig,
    kind: HeadKind,
) -> CResult<BertModel> {
    if !kind.supported_by(&config.family) {
        candle_core::bail!(
            "bertha has no {} head for `{}` models",
            kind.class_name(&config.family),
            config.model_type
        );
    }
    let pooler = kind.uses_pooler_in(&config.family);
    if pooler && !config.add_pooling_layer {
        candle_core::bail!(
            "{kind} reads the pooler output, but the config has add_pooling_layer false"
        );
    }
    BertModel::load(base, config, pooler)
}
