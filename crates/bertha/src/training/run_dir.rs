//! A run's output folder belongs to one run: a fresh run refuses a folder
//! that holds another run's metrics and checkpoints (unless told to
//! replace it), a resumed run refuses options that would change what it
//! trains (unless told which changes to accept), and both clear the
//! temporaries a killed process left behind.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// What a run writes into its output folder besides the model files.
const RUN_FILES: &[&str] = &[
    "metrics.jsonl",
    "eval_results.json",
    "loss.png",
    "metric.png",
];

/// Options whose change on resume alters nothing the run learns.
const HARMLESS: &[&str] = &[
    "out",
    "eval_every",
    "save_every",
    "save_total_limit",
    "eval_batch_size",
    "overwrite",
    "allow_changes",
];

/// Prepares `out` for a fresh run: removes stale temporaries, then refuses
/// a folder holding another run, or (with `overwrite`) clears that run's
/// metrics, checkpoints and `best/`.
pub(crate) fn claim(out: &Path, overwrite: bool) -> Result<()> {
    remove_stale_temporaries(out)?;
    let found = previous_run(out)?;
    if found.is_empty() {
        return Ok(());
    }
    if !overwrite {
        let names: Vec<String> = found
            .iter()
            .filter_map(|p| Some(p.file_name()?.to_string_lossy().into_owned()))
            .collect();
        return Err(Error::option(
            "out",
            format!(
                "{} holds another run ({}): continue it with resume, or replace it with overwrite",
                out.display(),
                names.join(", ")
            ),
        ));
    }
    found.iter().try_for_each(|p| remove(p))
}

/// Keeps the checkpoint of `step` and the newest `keep - 1` before it
/// (transformers' `save_total_limit`: each holds the optimiser's moments,
/// twice the model's size). Later ones are an abandoned run's (a resume
/// repeats those steps) and go too.
pub(crate) fn prune_checkpoints(out: &Path, step: u64, keep: usize) -> Result<()> {
    let all = super::checkpoint::list(out)?;
    let older = all.iter().filter(|(s, _)| *s < step).count();
    let excess = older.saturating_sub(keep.saturating_sub(1));
    all.iter()
        .enumerate()
        .filter(|(i, (s, _))| *i < excess || *s > step)
        .try_for_each(|(_, (_, p))| remove(p))
}

/// Removes a file or a folder with everything in it.
fn remove(p: &Path) -> Result<()> {
    let removed = if p.is_dir() {
        std::fs::remove_dir_all(p)
    } else {
        std::fs::remove_file(p)
    };
    removed.map_err(|e| Error::io(p, e))
}

/// The metrics, checkpoints and `best/` of a run in `out`.
fn previous_run(out: &Path) -> Result<Vec<PathBuf>> {
    let Ok(entries) = std::fs::read_dir(out) else {
        return Ok(Vec::new());
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(out, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let checkpoint = name
            .strip_prefix("checkpoint-")
            .is_some_and(|n| n.parse::<u64>().is_ok());
        if checkpoint || name == "best" || RUN_FILES.contains(&name.as_str()) {
            found.push(entry.path());
        }
    }
    found.sort();
    Ok(found)
}

/// Removes the `.NAME.tmp-PID` files and folders (and their `.old`
/// siblings) that an atomic write interrupted by a kill leaves in `out`.
pub(crate) fn remove_stale_temporaries(out: &Path) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(out) else {
        return Ok(());
    };
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(out, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !(name.starts_with('.') && name.contains(".tmp-")) {
            continue;
        }
        let p = entry.path();
        tracing::warn!(
            "{}: removing a temporary left by an interrupted write",
            p.display()
        );
        remove(&p)?;
    }
    Ok(())
}

/// On resume: the options (and data, and config) the checkpoint's run
/// was made with against this run's. Any difference outside
/// [`HARMLESS`] and `allowed` is refused, naming each option with both
/// values; allowed ones are logged.
pub(crate) fn check_unchanged(
    checkpoint: &Path,
    was: &BTreeMap<String, serde_json::Value>,
    now: &BTreeMap<String, serde_json::Value>,
    allowed: &[String],
) -> Result<()> {
    let mut refused = Vec::new();
    for (key, old) in was {
        let Some(new) = now.get(key) else { continue };
        if old == new || HARMLESS.contains(&key.as_str()) {
            continue;
        }
        let change = format!("{key} (was {old}, now {new})");
        // `weight_decay` accepts `adamw.weight_decay`, `steps` `length.steps`.
        let named = |a: &String| a == key || key.split('.').any(|part| part == a);
        if allowed.iter().any(named) {
            tracing::warn!("resuming {} with a changed {change}", checkpoint.display());
        } else {
            refused.push(change);
        }
    }
    if refused.is_empty() {
        return Ok(());
    }
    Err(Error::option(
        "resume",
        format!(
            "{}: this run would change {}; name the options to accept in allow_changes",
            checkpoint.display(),
            refused.join(", ")
        ),
    ))
}

/// The fields of a JSON object, nested objects' by dotted name
/// (`adamw.weight_decay`, `length.steps`).
pub(crate) fn fields(value: &serde_json::Value) -> BTreeMap<String, serde_json::Value> {
    fn walk(prefix: &str, v: &serde_json::Value, out: &mut BTreeMap<String, serde_json::Value>) {
        match v.as_object() {
            Some(o) if !prefix.is_empty() || !o.is_empty() => {
                for (k, v) in o {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&key, v, out);
                }
            }
            _ if !prefix.is_empty() => {
                out.insert(prefix.to_string(), v.clone());
            }
            _ => {}
        }
    }
    let mut out = BTreeMap::new();
    walk("", value, &mut out);
    out
}

/// FNV-1a over a run's training inputs: a resumed run checks it reads
/// the same data (the same tokens in the same inputs).
#[derive(Debug, Clone, Copy)]
pub struct Fingerprint(u64);

impl Default for Fingerprint {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fingerprint {
    pub fn add(&mut self, values: impl IntoIterator<Item = i64>) {
        for v in values {
            for b in v.to_le_bytes() {
                self.0 ^= u64::from(b);
                self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
            }
        }
    }

    pub fn hex(&self) -> String {
        format!("{:016x}", self.0)
    }
}
