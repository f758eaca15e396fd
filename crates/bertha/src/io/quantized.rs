//! Quantised checkpoints: the fast path's packed weights (int8 with their
//! scales and smoothing factors, or bf16) in one safetensors file beside
//! the model's own, so start-up skips calibration and packing.
//!
//! The file is `bertha-packed.safetensors`. Its metadata carries a format
//! version, the precision, a hash of the folder's `config.json` and a hash
//! of the packed tensors themselves (`data_hash`, since version 2: flipped
//! bytes in the panels or scales went unnoticed); reading checks all four
//! (and every tensor's type and size, and that every scale and bf16 weight
//! is finite, as `model.safetensors`' weights are) and refuses a mismatch
//! with an error naming the file and the field or tensor.
//! Each encoder layer `l` has four linears, `layers.{l}.{qkv,attn_out,
//! ffn_in,ffn_out}`, stored as:
//! - `….packed`: the panels exactly as the kernels read them (I8, or BF16
//!   bit patterns);
//! - `….layout`: I32 `[in_dim, out_dim, group]` (group 0 for bf16);
//! - int8 only: `….w_scales` (F32, a weight scale per output column and
//!   channel group, in the panels' order) and `….x_scales` (F32 `[in_dim]`, the inverse smoothing
//!   factor per input channel).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};

use super::weights::RawTensor;
use crate::error::{Error, Result};
use crate::training::distributed::Hash64;

/// The packed file's name inside a model folder.
pub const PACKED_FILE: &str = "bertha-packed.safetensors";

/// Format version: bumped whenever the layout of a tensor changes, so an
/// older or newer file is refused instead of misread.
pub const PACKED_VERSION: &str = "2";

/// What the file holds for one linear layer.
#[derive(Debug, Clone, PartialEq)]
pub enum PackedData {
    /// int8 panels, weight scales per output column and channel group (in
    /// the panels' order), inverse smoothing factor per input channel,
    /// input channels per activation (and weight) scale.
    I8 {
        panels: Vec<i8>,
        w_scales: Vec<f32>,
        x_scales: Vec<f32>,
        group: usize,
    },
    /// bf16 panels (bit patterns).
    Bf16 { panels: Vec<u16> },
}

/// One packed linear layer: `name` is `layers.{l}.{site}`.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedLinear {
    pub name: String,
    pub in_dim: usize,
    pub out_dim: usize,
    pub data: PackedData,
}

/// The whole file.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedCheckpoint {
    /// `int8` or `bf16`.
    pub precision: String,
    /// [`config_hash`] of the folder's `config.json`.
    pub config_hash: String,
    /// Where the int8 calibration texts came from (informative).
    pub calibration: String,
    pub linears: Vec<PackedLinear>,
}

/// FNV-1a (64 bit) of `config.json`'s bytes, in hex: any edit of the
/// config makes a packed file stale.
pub fn config_hash(config_path: &Path) -> Result<String> {
    let bytes = std::fs::read(config_path).map_err(|e| Error::io(config_path, e))?;
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    Ok(format!("{hash:016x}"))
}

impl PackedCheckpoint {
    /// The file's bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut tensors: Vec<(String, RawTensor)> = Vec::new();
        for l in &self.linears {
            let group = match &l.data {
                PackedData::I8 { group, .. } => *group,
                PackedData::Bf16 { .. } => 0,
            };
            let layout = [l.in_dim, l.out_dim, group].map(|v| v as i32);
            tensors.push((
                format!("{}.layout", l.name),
                RawTensor {
                    dtype: Dtype::I32,
                    shape: vec![3],
                    bytes: layout.iter().flat_map(|x| x.to_le_bytes()).collect(),
                },
            ));
            match &l.data {
                PackedData::I8 {
                    panels,
                    w_scales,
                    x_scales,
                    ..
                } => {
                    tensors.push((
                        format!("{}.packed", l.name),
                        RawTensor {
                            dtype: Dtype::I8,
                            shape: vec![panels.len()],
                            bytes: panels.iter().map(|&q| q as u8).collect(),
                        },
                    ));
                    tensors.push((
                        format!("{}.w_scales", l.name),
                        RawTensor::f32(vec![w_scales.len()], w_scales),
                    ));
                    tensors.push((
                        format!("{}.x_scales", l.name),
                        RawTensor::f32(vec![x_scales.len()], x_scales),
                    ));
                }
                PackedData::Bf16 { panels } => tensors.push((
                    format!("{}.packed", l.name),
                    RawTensor {
                        dtype: Dtype::BF16,
                        shape: vec![panels.len()],
                        bytes: panels.iter().flat_map(|x| x.to_le_bytes()).collect(),
                    },
                )),
            }
        }
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        let hash = data_hash(
            tensors
                .iter()
                .map(|(n, r)| (n.as_str(), r.dtype, r.shape.as_slice(), r.bytes.as_slice())),
        );
        let metadata = HashMap::from([
            ("data_hash".to_string(), hash),
            ("format".to_string(), "bertha-packed".to_string()),
            ("version".to_string(), PACKED_VERSION.to_string()),
            ("precision".to_string(), self.precision.clone()),
            ("config_hash".to_string(), self.config_hash.clone()),
            ("calibration".to_string(), self.calibration.clone()),
            ("linears".to_string(), self.linears.len().to_string()),
        ]);
        safetensors::serialize(tensors.iter().map(|(n, r)| (n.as_str(), r)), Some(metadata))
            .map_err(|e| Error::Input(format!("serialising {PACKED_FILE}: {e}")))
    }

    /// Reads `path`, checking its format version, that its precision is
    /// `precision` and its config hash `config_hash`; the linears come
    /// back in the file's order of names (`layers.0.attn_out`, …), to be
    /// matched against the model by name.
    pub fn read(path: &Path, precision: &str, config_hash: &str) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|e| Error::Weights {
            path: path.to_path_buf(),
            reason: format!("not a valid safetensors file: {e}"),
        })?;
        let meta = header.metadata().clone().unwrap_or_default();
        let (stored, hash) = check_metadata(path, &meta, precision, config_hash)?;
        let calibration = meta.get("calibration").cloned().unwrap_or_default();
        let st = SafeTensors::deserialize(&bytes).map_err(|e| Error::Weights {
            path: path.to_path_buf(),
            reason: format!("not a valid safetensors file: {e}"),
        })?;
        let mut names: Vec<String> = st
            .names()
            .into_iter()
            .filter_map(|n| n.strip_suffix(".layout").map(str::to_string))
            .collect();
        names.sort();
        let linears = names
            .into_iter()
            .map(|name| read_linear(&st, path, name))
            .collect::<Result<Vec<_>>>()?;
        check_data_hash(path, &meta, &st)?;
        Ok(Self {
            precision: stored,
            config_hash: hash,
            calibration,
            linears,
        })
    }
}

impl PackedCheckpoint {
    /// Checks `path`'s header as [`PackedCheckpoint::read`] does (format,
    /// version, precision, config hash) without reading its tensors: for a
    /// folder whose packed weights will not run (bf16 asked on a CPU that
    /// runs it in fp32), which must still hold what was asked.
    pub fn check(path: &Path, precision: &str, config_hash: &str) -> Result<()> {
        use std::io::Read;
        let invalid = |reason: String| Error::Weights {
            path: path.to_path_buf(),
            reason: format!("not a valid safetensors file: {reason}"),
        };
        let mut file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        let mut len = [0u8; 8];
        file.read_exact(&mut len)
            .map_err(|e| invalid(e.to_string()))?;
        let len = u64::from_le_bytes(len);
        // safetensors' own bound on a header (100 MB).
        if len > 100_000_000 {
            return Err(invalid(format!("a header of {len} bytes")));
        }
        let mut header = Vec::new();
        file.take(len)
            .read_to_end(&mut header)
            .map_err(|e| invalid(e.to_string()))?;
        #[derive(serde::Deserialize)]
        struct Header {
            #[serde(rename = "__metadata__", default)]
            metadata: HashMap<String, String>,
        }
        let header: Header =
            serde_json::from_slice(&header).map_err(|e| invalid(format!("its header: {e}")))?;
        check_metadata(path, &header.metadata, precision, config_hash).map(|_| ())
    }
}

/// A hash of the packed tensors (sorted by name): each one's name, type,
/// shape and bytes, in hex.
fn data_hash<'a>(tensors: impl Iterator<Item = (&'a str, Dtype, &'a [usize], &'a [u8])>) -> String {
    let mut h = Hash64::default();
    for (name, dtype, shape, bytes) in tensors {
        h.bytes(name.as_bytes());
        h.bytes(format!("{dtype:?}").as_bytes());
        shape.iter().for_each(|&d| h.word(d as u64));
        h.bytes(bytes);
    }
    format!("{:016x}", h.finish())
}

/// Refuses a file whose tensors are not those it was written with.
fn check_data_hash(path: &Path, meta: &HashMap<String, String>, st: &SafeTensors) -> Result<()> {
    let want = meta.get("data_hash").ok_or_else(|| Error::Config {
        path: path.to_path_buf(),
        field: "data_hash".into(),
        reason: "missing from the metadata: write the folder again with `bertha quantize`".into(),
    })?;
    let mut tensors = st.tensors();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let got = data_hash(
        tensors
            .iter()
            .map(|(n, t)| (n.as_str(), t.dtype(), t.shape(), t.data())),
    );
    if &got != want {
        return Err(Error::Config {
            path: path.to_path_buf(),
            field: "data_hash".into(),
            reason: format!(
                "is {want}, but the packed tensors hash to {got}: the file was changed or \
                 damaged since `bertha quantize` wrote it; quantize again"
            ),
        });
    }
    Ok(())
}

/// Checks a packed file's metadata (format, version, precision, config
/// hash) and gives its precision and config hash.
fn check_metadata(
    path: &Path,
    meta: &HashMap<String, String>,
    precision: &str,
    config_hash: &str,
) -> Result<(String, String)> {
    let bad = |field: &str, reason: String| Error::Config {
        path: path.to_path_buf(),
        field: field.to_string(),
        reason,
    };
    let field = |name: &str| -> Result<String> {
        meta.get(name).cloned().ok_or_else(|| {
            bad(
                name,
                "missing from the metadata: not a bertha packed file (write one with \
                 `bertha quantize`)"
                    .to_string(),
            )
        })
    };
    let format = field("format")?;
    if format != "bertha-packed" {
        return Err(bad("format", format!("is `{format}`, not `bertha-packed`")));
    }
    let version = field("version")?;
    if version != PACKED_VERSION {
        return Err(bad(
            "version",
            format!(
                "is {version}, this bertha reads version {PACKED_VERSION}: write the folder \
                 again with this bertha's `bertha quantize`"
            ),
        ));
    }
    let stored = field("precision")?;
    if stored != precision {
        return Err(bad(
            "precision",
            format!(
                "the folder is packed for {stored}, but {precision} was asked: ask for \
                 {stored}, or use the original model folder"
            ),
        ));
    }
    let hash = field("config_hash")?;
    if hash != config_hash {
        return Err(bad(
            "config_hash",
            format!(
                "is {hash}, but the folder's config.json hashes to {config_hash}: the config \
                 changed since `bertha quantize` wrote this file; quantize again"
            ),
        ));
    }
    Ok((stored, hash))
}

/// The tensors of one linear, with their types and sizes checked (the
/// panels' size, which depends on the kernels' layout, is checked where
/// they are unpacked: `PackedBert::load_packed`).
fn read_linear(st: &SafeTensors, path: &Path, name: String) -> Result<PackedLinear> {
    let tensor = |suffix: &str, dtype: Dtype| -> Result<Vec<u8>> {
        let full = format!("{name}.{suffix}");
        let t = st.tensor(&full).map_err(|_| Error::Weights {
            path: path.to_path_buf(),
            reason: format!("tensor `{full}` is missing"),
        })?;
        if t.dtype() != dtype {
            return Err(Error::Weights {
                path: path.to_path_buf(),
                reason: format!("tensor `{full}` is {:?}, expected {dtype:?}", t.dtype()),
            });
        }
        Ok(t.data().to_vec())
    };
    let words = |b: Vec<u8>| -> Vec<[u8; 4]> {
        b.chunks_exact(4)
            .map(|c| [c[0], c[1], c[2], c[3]])
            .collect()
    };
    let layout: Vec<i32> = words(tensor("layout", Dtype::I32)?)
        .into_iter()
        .map(i32::from_le_bytes)
        .collect();
    let wrong = |what: String| Error::Weights {
        path: path.to_path_buf(),
        reason: format!("tensor `{name}.{what}"),
    };
    let &[in_dim, out_dim, group] = &layout[..] else {
        return Err(wrong(format!(
            "layout` has {} values, expected 3",
            layout.len()
        )));
    };
    if in_dim <= 0 || out_dim <= 0 || group < 0 {
        return Err(wrong(format!("layout` is {layout:?}: not a layer's shape")));
    }
    let (in_dim, out_dim, group) = (in_dim as usize, out_dim as usize, group as usize);
    let floats = |suffix: &str, len: Option<usize>| -> Result<Vec<f32>> {
        let v: Vec<f32> = words(tensor(suffix, Dtype::F32)?)
            .into_iter()
            .map(f32::from_le_bytes)
            .collect();
        match len {
            Some(len) if v.len() != len => Err(wrong(format!(
                "{suffix}` has {} values, expected {len}",
                v.len()
            ))),
            // A scale that is not finite (or whose int8 range overflows)
            // makes every output of the layer NaN or garbage.
            _ => match v.iter().position(|x| !(x * 127.0).is_finite()) {
                Some(i) => Err(wrong(format!(
                    "{suffix}` holds {} at index {i}: scales must be finite",
                    v[i]
                ))),
                None => Ok(v),
            },
        }
    };
    let data = if group > 0 {
        if !group.is_multiple_of(4) {
            return Err(wrong(format!(
                "layout`: group {group} is not a multiple of 4"
            )));
        }
        let panels: Vec<i8> = tensor("packed", Dtype::I8)?
            .into_iter()
            .map(|b| b as i8)
            .collect();
        PackedData::I8 {
            panels,
            w_scales: floats("w_scales", None)?,
            x_scales: floats("x_scales", Some(in_dim))?,
            group,
        }
    } else {
        let panels: Vec<u16> = tensor("packed", Dtype::BF16)?
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        // bf16 with every exponent bit set is an infinity or a NaN.
        if let Some(i) = panels.iter().position(|b| b & 0x7f80 == 0x7f80) {
            return Err(wrong(format!(
                "packed` holds a weight that is not finite (bf16 bits {:#06x}) at index {i}",
                panels[i]
            )));
        }
        PackedData::Bf16 { panels }
    };
    Ok(PackedLinear {
        name,
        in_dim,
        out_dim,
        data,
    })
}

/// The packed file of the model folder `dir`, when it has one.
pub fn packed_file(dir: &Path) -> Option<PathBuf> {
    let path = dir.join(PACKED_FILE);
    path.is_file().then_some(path)
}

/// Files of other frameworks' weights, which a quantised folder leaves
/// out (bertha reads safetensors or `pytorch_model.bin`, and the packed
/// file replaces nothing of them).
fn is_foreign_weights(name: &str) -> bool {
    name.ends_with(".onnx")
        || name.ends_with(".h5")
        || name.ends_with(".msgpack")
        || name.ends_with(".ot")
        || name.ends_with(".xml") && name.starts_with("openvino")
}

/// Writes the quantised folder `out`: `src`'s top-level files (config,
/// weights, tokenizer, sentence-transformers files; not other frameworks'
/// weights) and the module folders its `modules.json` names, plus
/// `checkpoint` as [`PACKED_FILE`]. Built in a temporary folder beside
/// `out`, then renamed: `out` is complete or absent. `out` must not exist.
pub fn write_folder(src: &Path, out: &Path, checkpoint: &PackedCheckpoint) -> Result<()> {
    if out.exists() {
        return Err(Error::ModelDir {
            path: out.to_path_buf(),
            reason: "already exists: choose a new folder for the quantised model".into(),
        });
    }
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = out.file_name().and_then(|n| n.to_str()).unwrap_or("model");
    let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = fill_folder(src, &tmp, checkpoint)
        .and_then(|()| std::fs::rename(&tmp, out).map_err(|e| Error::io(out, e)));
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}

fn fill_folder(src: &Path, dst: &Path, checkpoint: &PackedCheckpoint) -> Result<()> {
    std::fs::create_dir_all(dst).map_err(|e| Error::io(dst, e))?;
    let mut module_dirs: Vec<String> = Vec::new();
    let modules = src.join("modules.json");
    if modules.is_file() {
        let text = std::fs::read_to_string(&modules).map_err(|e| Error::io(&modules, e))?;
        let list: Vec<serde_json::Value> =
            serde_json::from_str(&text).map_err(|e| Error::Json {
                path: modules.clone(),
                source: e,
            })?;
        module_dirs = list
            .iter()
            .filter_map(|m| m.get("path")?.as_str())
            .filter(|p| !p.is_empty() && !p.contains(".."))
            .map(str::to_string)
            .collect();
    }
    for entry in std::fs::read_dir(src).map_err(|e| Error::io(src, e))? {
        let entry = entry.map_err(|e| Error::io(src, e))?;
        let file_name = entry.file_name();
        let Some(name) = file_name.to_str() else {
            continue;
        };
        let from = entry.path();
        if from.is_file() {
            if name == PACKED_FILE || name.starts_with('.') || is_foreign_weights(name) {
                continue;
            }
            std::fs::copy(&from, dst.join(name)).map_err(|e| Error::io(&from, e))?;
        } else if from.is_dir() && module_dirs.iter().any(|d| d == name) {
            copy_dir(&from, &dst.join(name))?;
        }
    }
    let bytes = checkpoint.to_bytes()?;
    let file = dst.join(PACKED_FILE);
    std::fs::write(&file, bytes).map_err(|e| Error::io(&file, e))
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).map_err(|e| Error::io(to, e))?;
    for entry in std::fs::read_dir(from).map_err(|e| Error::io(from, e))? {
        let path = entry.map_err(|e| Error::io(from, e))?.path();
        let target = to.join(path.file_name().expect("read_dir entries have names"));
        if path.is_dir() {
            copy_dir(&path, &target)?;
        } else {
            std::fs::copy(&path, &target).map_err(|e| Error::io(&path, e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checkpoint() -> PackedCheckpoint {
        PackedCheckpoint {
            precision: "int8".into(),
            config_hash: "0123456789abcdef".into(),
            calibration: "built-in".into(),
            linears: vec![
                PackedLinear {
                    name: "layers.0.qkv".into(),
                    in_dim: 8,
                    out_dim: 3,
                    data: PackedData::I8 {
                        panels: (0..256).map(|i| ((i % 255) as i16 - 127) as i8).collect(),
                        w_scales: vec![0.5, 0.25, 0.125],
                        x_scales: (0..8).map(|i| i as f32 + 0.5).collect(),
                        group: 4,
                    },
                },
                PackedLinear {
                    name: "layers.0.attn_out".into(),
                    in_dim: 3,
                    out_dim: 2,
                    data: PackedData::Bf16 {
                        panels: vec![0x3f80, 0xbf80, 0x0001, 0x7f7f],
                    },
                },
            ],
        }
    }

    #[test]
    fn a_checkpoint_reads_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(PACKED_FILE);
        let want = checkpoint();
        std::fs::write(&path, want.to_bytes().unwrap()).unwrap();
        let got = PackedCheckpoint::read(&path, "int8", "0123456789abcdef").unwrap();
        // Read back sorted by name.
        let mut sorted = want.clone();
        sorted.linears.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(got, sorted);
        let err = PackedCheckpoint::read(&path, "bf16", "0123456789abcdef").unwrap_err();
        assert!(err.to_string().contains("`precision`"), "{err}");
    }

    /// Issue 46, case 6: NaN or huge scales and flipped bytes were read
    /// as they were.
    #[test]
    fn damaged_or_non_finite_packed_data_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(PACKED_FILE);
        let read = |bytes: &[u8]| {
            std::fs::write(&path, bytes).unwrap();
            PackedCheckpoint::read(&path, "int8", "0123456789abcdef")
                .unwrap_err()
                .to_string()
        };
        let good = checkpoint().to_bytes().unwrap();
        // One byte of the panels flipped, or a scale made 1e30.
        let mut flipped = good.clone();
        let at = flipped
            .windows(4)
            .position(|w| w == [0x81, 0x82, 0x83, 0x84])
            .unwrap();
        flipped[at + 2] ^= 0x10;
        let err = read(&flipped);
        assert!(
            err.contains("`data_hash`") && err.contains("changed or damaged"),
            "{err}"
        );
        let mut huge = good.clone();
        let half = 0.5f32.to_le_bytes();
        let at = huge.windows(4).position(|w| w == half).unwrap();
        huge[at..at + 4].copy_from_slice(&1e30f32.to_le_bytes());
        assert!(read(&huge).contains("`data_hash`"));
        // Non-finite values written with a matching hash.
        for bad in [f32::NAN, f32::INFINITY, 1e38] {
            let mut c = checkpoint();
            if let PackedData::I8 { w_scales, .. } = &mut c.linears[0].data {
                w_scales[1] = bad;
            }
            let err = read(&c.to_bytes().unwrap());
            assert!(
                err.contains("layers.0.qkv.w_scales` holds") && err.contains("index 1"),
                "{err}"
            );
        }
        let mut c = checkpoint();
        if let PackedData::I8 { x_scales, .. } = &mut c.linears[0].data {
            x_scales[3] = f32::NAN;
        }
        assert!(read(&c.to_bytes().unwrap()).contains("x_scales` holds NaN at index 3"));
        let mut c = checkpoint();
        c.linears.remove(0);
        if let PackedData::Bf16 { panels } = &mut c.linears[0].data {
            panels[2] = 0x7fc0;
        }
        std::fs::write(&path, c.to_bytes().unwrap()).unwrap();
        let err = PackedCheckpoint::read(&path, "int8", "0123456789abcdef")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("not finite (bf16 bits 0x7fc0) at index 2"),
            "{err}"
        );
    }

    #[test]
    fn other_safetensors_files_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(PACKED_FILE);
        // A plain safetensors file (as a model's weights): no metadata.
        let raw = RawTensor::f32(vec![2], &[1.0, 2.0]);
        let bytes = safetensors::serialize([("w", &raw)], None).unwrap();
        std::fs::write(&path, bytes).unwrap();
        let err = PackedCheckpoint::read(&path, "int8", "x")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(PACKED_FILE) && err.contains("`format`"),
            "{err}"
        );
        // A linear whose panels have the wrong type.
        let mut c = checkpoint();
        c.linears.truncate(1);
        let mut bytes = c.to_bytes().unwrap();
        let at = bytes.windows(4).position(|w| w == b"\"I8\"").unwrap();
        bytes[at..at + 4].copy_from_slice(b"\"U8\"");
        std::fs::write(&path, bytes).unwrap();
        let err = PackedCheckpoint::read(&path, "int8", "0123456789abcdef")
            .unwrap_err()
            .to_string();
        assert!(err.contains("layers.0.qkv.packed"), "{err}");
    }
}
