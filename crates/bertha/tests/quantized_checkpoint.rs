//! Quantised checkpoints (`Embedder::write_quantized`, what `bertha
//! quantize` writes): a folder's stored int8 / bf16 weights give exactly
//! the embeddings of quantising at load, and a folder that does not match
//! what is asked is refused with an error naming the file and field. And
//! `calibration`: a user's texts, with errors naming a bad file.

mod common;

use std::path::{Path, PathBuf};

use bertha::fast::Precision;
use bertha::{Device, EmbedOptions, Embedder};
use common::minilm_dir;

const TEXTS: [&str; 4] = [
    "A man is playing a guitar.",
    "The new movie is awesome, I loved every minute of it!",
    "Short.",
    "Quantised weights should give the same vectors as quantising at load time.",
];

fn load(
    dir: &Path,
    precision: Precision,
    calibration: Option<PathBuf>,
) -> bertha::Result<Embedder> {
    let opts = EmbedOptions {
        precision,
        calibration,
        ..EmbedOptions::default()
    };
    Embedder::from_dir(dir, &Device::Cpu, &opts)
}

fn embed(e: &Embedder) -> Vec<Vec<f32>> {
    e.embed(&TEXTS, 3, &mut |_| {}).unwrap()
}

/// A quantised copy of all-MiniLM-L6-v2 in `tmp`.
fn quantized(tmp: &Path, precision: Precision) -> PathBuf {
    let out = tmp.join(format!("minilm-{}", precision.name()));
    let src = minilm_dir();
    let e = load(&src, Precision::F32, None).unwrap();
    e.write_quantized(&src, &out, precision, "built-in")
        .unwrap();
    out
}

#[test]
fn stored_weights_give_the_embeddings_of_quantising_at_load() {
    let tmp = tempfile::tempdir().unwrap();
    for precision in [Precision::Int8, Precision::Bf16] {
        let out = quantized(tmp.path(), precision);
        assert!(out.join("bertha-packed.safetensors").is_file());
        for kept in [
            "config.json",
            "tokenizer.json",
            "modules.json",
            "1_Pooling/config.json",
        ] {
            assert!(out.join(kept).is_file(), "{kept} not copied");
        }
        let at_load = load(&minilm_dir(), precision, None).unwrap();
        let stored = load(&out, precision, None).unwrap();
        assert_eq!(stored.precision(), at_load.precision());
        let want = embed(&at_load);
        assert_eq!(embed(&stored), want, "{precision:?}");
        // Reduced precision really ran: fp32 differs.
        let exact = embed(&load(&out, Precision::F32, None).unwrap());
        if at_load.precision() != Precision::F32 {
            assert_ne!(exact, want, "{precision:?}");
        }
        // fp32 on the quantised folder is fp32 of the original.
        assert_eq!(
            exact,
            embed(&load(&minilm_dir(), Precision::F32, None).unwrap())
        );
    }
}

#[test]
fn a_mismatched_folder_is_refused_naming_file_and_field() {
    let tmp = tempfile::tempdir().unwrap();
    let out = quantized(tmp.path(), Precision::Int8);
    let file = out.join("bertha-packed.safetensors");
    let err = |dir: &Path, p: Precision| load(dir, p, None).err().unwrap().to_string();

    let e = err(&out, Precision::Bf16);
    assert!(
        e.contains("bertha-packed.safetensors") && e.contains("`precision`"),
        "{e}"
    );
    assert!(e.contains("int8"), "{e}");

    // Another format version.
    let bytes = std::fs::read(&file).unwrap();
    let tampered = replace_once(&bytes, br#""version":"2""#, br#""version":"9""#);
    std::fs::write(&file, &tampered).unwrap();
    let e = err(&out, Precision::Int8);
    assert!(
        e.contains("bertha-packed.safetensors") && e.contains("`version`"),
        "{e}"
    );
    std::fs::write(&file, &bytes).unwrap();
    load(&out, Precision::Int8, None).unwrap();

    // A config edited after quantising.
    let config = out.join("config.json");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{text}\n")).unwrap();
    let e = err(&out, Precision::Int8);
    assert!(
        e.contains("bertha-packed.safetensors") && e.contains("`config_hash`"),
        "{e}"
    );
    std::fs::write(&config, text).unwrap();

    // A truncated file.
    std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
    let e = err(&out, Precision::Int8);
    assert!(e.contains("bertha-packed.safetensors"), "{e}");
}

/// Issue 46, case 6: a packed folder's flipped weight bytes went
/// unnoticed (garbage embeddings, exit 0). Now the packed data's hash is
/// checked at load, and the load refuses naming the file and field.
#[test]
fn flipped_packed_bytes_are_refused_at_load() {
    let tmp = tempfile::tempdir().unwrap();
    let out = quantized(tmp.path(), Precision::Int8);
    let file = out.join("bertha-packed.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    // A byte near the end: the last tensor's data (panels or scales).
    for at in [bytes.len() - 3, bytes.len() / 2] {
        let mut flipped = bytes.clone();
        flipped[at] ^= 0x01;
        std::fs::write(&file, &flipped).unwrap();
        let e = load(&out, Precision::Int8, None).err().unwrap().to_string();
        assert!(
            e.contains("bertha-packed.safetensors")
                && (e.contains("`data_hash`") || e.contains("must be finite")),
            "{e}"
        );
    }
    std::fs::write(&file, &bytes).unwrap();
    load(&out, Precision::Int8, None).unwrap();
}

fn replace_once(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let at = bytes
        .windows(from.len())
        .position(|w| w == from)
        .expect("the pattern is in the header");
    let mut out = bytes.to_vec();
    out[at..at + from.len()].copy_from_slice(to);
    out
}

#[test]
fn writing_refuses_f32_an_existing_folder_and_a_quantised_source() {
    let tmp = tempfile::tempdir().unwrap();
    let src = minilm_dir();
    let e = load(&src, Precision::F32, None).unwrap();
    let msg = e
        .write_quantized(&src, &tmp.path().join("a"), Precision::F32, "")
        .unwrap_err()
        .to_string();
    assert!(msg.contains("precision"), "{msg}");
    let existing = tmp.path().join("existing");
    std::fs::create_dir(&existing).unwrap();
    let msg = e
        .write_quantized(&src, &existing, Precision::Int8, "")
        .unwrap_err()
        .to_string();
    assert!(msg.contains("already exists"), "{msg}");
    // Nothing half-written beside it.
    let names: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert_eq!(names.len(), 1);
    let out = quantized(tmp.path(), Precision::Int8);
    let again = load(&out, Precision::F32, None).unwrap();
    let msg = again
        .write_quantized(&out, &tmp.path().join("b"), Precision::Int8, "")
        .unwrap_err()
        .to_string();
    assert!(msg.contains("already quantised"), "{msg}");
}

#[test]
fn calibration_texts_come_from_the_file_and_bad_files_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("calib.txt");
    std::fs::write(
        &file,
        "a few words\n\nof calibration text, here and there\n",
    )
    .unwrap();
    let mine = load(&minilm_dir(), Precision::Int8, Some(file.clone())).unwrap();
    let builtin = load(&minilm_dir(), Precision::Int8, None).unwrap();
    assert_ne!(embed(&mine), embed(&builtin));
    // Given, it is calibrated again over a quantised folder's weights.
    let out = quantized(tmp.path(), Precision::Int8);
    let again = load(&out, Precision::Int8, Some(file.clone())).unwrap();
    assert_eq!(embed(&again), embed(&mine));

    let missing = tmp.path().join("missing.txt");
    let empty = tmp.path().join("empty.txt");
    std::fs::write(&empty, "\n  \n").unwrap();
    let latin1 = tmp.path().join("latin1.txt");
    std::fs::write(&latin1, b"caf\xe9\n").unwrap();
    for bad in [missing, empty, latin1] {
        let e = load(&minilm_dir(), Precision::Int8, Some(bad.clone()))
            .err()
            .unwrap()
            .to_string();
        let name = bad.file_name().unwrap().to_str().unwrap();
        assert!(e.contains(name), "{e}");
    }
}
