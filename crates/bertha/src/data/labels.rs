//! Label names ↔ class ids, the mapping a checkpoint keeps as `id2label` /
//! `label2id` in its `config.json`. Training infers it from the training
//! file; evaluation and prediction must reuse the checkpoint's, or ids would
//! silently mean other classes.

use std::collections::{BTreeMap, HashMap};

use crate::config::BertConfig;
use crate::error::{Error, Result};

/// Ordered label names; a label's id is its position.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSet {
    names: Vec<String>,
    ids: HashMap<String, usize>,
}

impl LabelSet {
    /// Ids in the given order (e.g. a checkpoint's `id2label`). Empty or
    /// duplicate names are errors: two ids for one name cannot be undone.
    pub fn from_names(names: Vec<String>) -> Result<Self> {
        let mut ids = HashMap::with_capacity(names.len());
        for (i, n) in names.iter().enumerate() {
            if n.is_empty() {
                return Err(Error::Input(format!("label {i} has an empty name")));
            }
            if let Some(j) = ids.insert(n.clone(), i) {
                return Err(Error::Input(format!(
                    "label `{n}` appears twice in the label list (ids {j} and {i})"
                )));
            }
        }
        Ok(Self { names, ids })
    }

    /// The distinct labels, sorted as transformers' `run_glue.py` sorts
    /// them: numerically when every label is an integer (so labels 0..n
    /// keep their own values as ids), else by string.
    pub fn infer<I, S>(labels: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut names: Vec<String> = labels.into_iter().map(|s| s.as_ref().to_string()).collect();
        names.sort();
        names.dedup();
        let numeric: Option<Vec<i64>> = names.iter().map(|n| n.parse::<i64>().ok()).collect();
        if let Some(values) = numeric {
            let mut pairs: Vec<(i64, String)> = values.into_iter().zip(names).collect();
            pairs.sort();
            names = pairs.into_iter().map(|(_, n)| n).collect();
        }
        names.retain(|n| !n.is_empty());
        let ids = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i))
            .collect();
        Self { names, ids }
    }

    /// From `id2label` (ids must be exactly 0..n).
    pub fn from_id2label(id2label: &BTreeMap<usize, String>) -> Result<Self> {
        if let Some(i) = id2label.keys().enumerate().find(|(i, k)| i != *k) {
            return Err(Error::Input(format!(
                "id2label: label ids must be 0..{}, but id {} has no label",
                id2label.len(),
                i.0
            )));
        }
        Self::from_names(id2label.values().cloned().collect())
    }

    /// The checkpoint's label names, or `None` when it has none of its own:
    /// no `id2label`, or transformers' placeholders `LABEL_0..LABEL_{n-1}`
    /// (then, as `run_glue.py` does, the labels come from the data).
    pub fn from_config(config: &BertConfig) -> Result<Option<Self>> {
        if config.id2label.is_empty() {
            return Ok(None);
        }
        let set = Self::from_id2label(&config.id2label)?;
        if set.is_placeholder() {
            return Ok(None);
        }
        Ok(Some(set))
    }

    /// Whether the names are transformers' defaults `LABEL_0, LABEL_1, ...`.
    pub fn is_placeholder(&self) -> bool {
        self.names
            .iter()
            .enumerate()
            .all(|(i, n)| *n == format!("LABEL_{i}"))
    }

    /// Writes the names into a config, which saves them as `id2label` and
    /// `label2id`.
    pub fn apply_to(&self, config: &mut BertConfig) {
        config.id2label = self.id2label();
    }

    pub fn id2label(&self) -> BTreeMap<usize, String> {
        self.names.iter().cloned().enumerate().collect()
    }

    pub fn label2id(&self) -> BTreeMap<String, usize> {
        self.ids.iter().map(|(n, i)| (n.clone(), *i)).collect()
    }

    pub fn id(&self, name: &str) -> Option<usize> {
        self.ids.get(name).copied()
    }

    pub fn name(&self, id: usize) -> Option<&str> {
        self.names.get(id).map(String::as_str)
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The names as a readable list for error messages (`a`, `b`, ...).
    pub(crate) fn listed(&self) -> String {
        const SHOWN: usize = 20;
        let mut s = self
            .names
            .iter()
            .take(SHOWN)
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ");
        if self.names.len() > SHOWN {
            s.push_str(&format!(" and {} more", self.names.len() - SHOWN));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_keep_their_ids_and_sort_numerically() {
        let s = LabelSet::infer(["1", "0", "1", "2"]);
        assert_eq!(s.names(), ["0", "1", "2"]);
        assert_eq!(s.id("2"), Some(2));
        // "10" after "9", not after "1"; negatives first.
        let s = LabelSet::infer(["10", "9", "-1"]);
        assert_eq!(s.names(), ["-1", "9", "10"]);
    }

    #[test]
    fn names_sort_as_strings() {
        let s = LabelSet::infer(["neutral", "entailment", "contradiction", "entailment"]);
        assert_eq!(s.names(), ["contradiction", "entailment", "neutral"]);
        assert_eq!(s.id("neutral"), Some(2));
        assert_eq!(s.name(0), Some("contradiction"));
    }

    #[test]
    fn from_names_rejects_duplicates_and_round_trips_id2label() {
        let err = LabelSet::from_names(vec!["a".into(), "b".into(), "a".into()]).unwrap_err();
        assert!(err.to_string().contains("`a` appears twice"), "{err}");
        let s = LabelSet::from_names(vec!["neg".into(), "pos".into()]).unwrap();
        let back = LabelSet::from_id2label(&s.id2label()).unwrap();
        assert_eq!(back, s);
        assert_eq!(s.label2id()["pos"], 1);
        let mut gap = BTreeMap::new();
        gap.insert(0, "a".to_string());
        gap.insert(2, "c".to_string());
        assert!(LabelSet::from_id2label(&gap).is_err());
    }

    #[test]
    fn config_placeholders_are_no_label_names() {
        let mut cfg = BertConfig::default();
        assert_eq!(LabelSet::from_config(&cfg).unwrap(), None);
        cfg.id2label = [(0, "LABEL_0".to_string()), (1, "LABEL_1".to_string())].into();
        assert_eq!(LabelSet::from_config(&cfg).unwrap(), None);
        let s = LabelSet::from_names(vec!["negative".into(), "positive".into()]).unwrap();
        s.apply_to(&mut cfg);
        assert_eq!(LabelSet::from_config(&cfg).unwrap(), Some(s));
    }
}
