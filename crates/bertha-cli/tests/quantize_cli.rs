//! `bertha quantize`: the folder it writes embeds as quantising at load
//! does, when `--precision` asks for the folder's precision; mismatches,
//! an existing `--out` and bad `--calibration` files are refused by name.

mod common;

use std::path::Path;

use common::{failure, fixtures, ok, ok_lines, run, run_model, s};

const TEXTS: [&str; 3] = ["a small test", "of quantised folders", "and their vectors"];

fn embed(model: &Path, args: &[&str]) -> String {
    let mut all = args.to_vec();
    all.extend(TEXTS);
    ok(&run_model("embed", model, &all))
}

#[test]
fn quantize_writes_a_folder_that_embeds_as_quantising_at_load() {
    let tmp = tempfile::tempdir().unwrap();
    let src = fixtures().join("st-embedding");
    for precision in ["int8", "bf16"] {
        let out = tmp.path().join(precision);
        let line = &ok_lines(&run_model(
            "quantize",
            &src,
            &["--precision", precision, "--out", s(&out)],
        ))[0];
        assert_eq!(line["precision"], precision);
        assert!(out.join("bertha-packed.safetensors").is_file());
        assert!(out.join("2_Normalize").is_dir());
        let args = ["--precision", precision];
        assert_eq!(embed(&out, &args), embed(&src, &args), "{precision}");
    }
    // int8 really differs from fp32.
    let int8 = tmp.path().join("int8");
    assert_ne!(embed(&int8, &["--precision", "int8"]), embed(&int8, &[]));

    let err = failure(&run_model("embed", &int8, &["--precision", "bf16", "x"]));
    assert!(
        err.contains("bertha-packed.safetensors") && err.contains("precision"),
        "{err}"
    );
    let err = failure(&run_model(
        "quantize",
        &src,
        &["--precision", "int8", "--out", s(&int8)],
    ));
    assert!(err.contains("already exists"), "{err}");
    let err = failure(&run(&[
        "quantize",
        "--model",
        s(&src),
        "--precision",
        "f32",
        "--out",
        "x",
    ]));
    assert!(err.contains("f32"), "{err}");
}

#[test]
fn calibration_files_are_read_and_bad_ones_named() {
    let tmp = tempfile::tempdir().unwrap();
    let src = fixtures().join("st-embedding");
    let calib = tmp.path().join("calib.txt");
    std::fs::write(&calib, "some words to calibrate on\nand a few more\n").unwrap();
    let with_file = ["--precision", "int8", "--calibration", s(&calib)];
    assert_ne!(
        embed(&src, &with_file),
        embed(&src, &["--precision", "int8"])
    );
    let out = tmp.path().join("q");
    ok(&run_model(
        "quantize",
        &src,
        &[
            "--precision",
            "int8",
            "--calibration",
            s(&calib),
            "--out",
            s(&out),
        ],
    ));
    assert_eq!(
        embed(&out, &["--precision", "int8"]),
        embed(&src, &with_file)
    );

    let empty = tmp.path().join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    for bad in [empty, tmp.path().join("missing.txt")] {
        let args = ["--precision", "int8", "--calibration", s(&bad), "x"];
        let err = failure(&run_model("embed", &src, &args));
        assert!(
            err.contains(bad.file_name().unwrap().to_str().unwrap()),
            "{err}"
        );
    }
}
