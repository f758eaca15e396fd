//! `bertha attention`: the JSON matrices are transformers' attentions for
//! the tiny fixtures' first sequence, and the pictures are valid PNG / SVG.

mod common;

use std::path::Path;
use std::process::Output;

use common::{ok, read_json, run_model, s, stderr, tiny_dir};

/// The first sequence of a fixture as text (its tokens joined, `##`
/// pieces glued on) and transformers' attentions for it [L][H][T][T].
/// [layer][head][query][key]
type Maps = Vec<Vec<Vec<Vec<f32>>>>;

fn fixture_text(name: &str) -> (String, Vec<String>, Maps) {
    let dir = tiny_dir(name);
    let vocab: Vec<String> = std::fs::read_to_string(dir.join("vocab.txt"))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let inputs = read_json(&dir.join("inputs.json"));
    let ids: Vec<usize> = serde_json::from_value(inputs["inputs"]["input_ids"][0].clone()).unwrap();
    let tokens: Vec<String> = ids.iter().map(|&i| vocab[i].clone()).collect();
    let mut text = String::new();
    for t in &tokens[1..tokens.len() - 1] {
        match t.strip_prefix("##") {
            Some(rest) => text.push_str(rest),
            None => {
                if !text.is_empty() {
                    text.push(' ');
                }
                text.push_str(t);
            }
        }
    }
    let expected =
        candle_core::safetensors::load(dir.join("expected.safetensors"), &candle_core::Device::Cpu)
            .unwrap();
    // [L, B, H, T, T] → sequence 0
    let att = expected["attentions"]
        .narrow(1, 0, 1)
        .unwrap()
        .squeeze(1)
        .unwrap();
    let (l, h) = (att.dim(0).unwrap(), att.dim(1).unwrap());
    let maps = (0..l)
        .map(|i| {
            (0..h)
                .map(|j| {
                    att.get(i)
                        .unwrap()
                        .get(j)
                        .unwrap()
                        .to_vec2::<f32>()
                        .unwrap()
                })
                .collect()
        })
        .collect();
    (text, tokens, maps)
}

/// `bertha attention --model MODEL TEXT`, then `extra` flags.
fn attention(model: &Path, text: &str, extra: &[&str]) -> Output {
    let mut args = vec![text];
    args.extend_from_slice(extra);
    run_model("attention", model, &args)
}

fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| {
            assert_eq!(x.len(), y.len());
            x.iter().zip(y).map(|(p, q)| (p - q).abs())
        })
        .fold(0.0, f32::max)
}

#[test]
fn json_matrices_are_transformers_attentions() {
    for name in ["roberta-mlm", "distilbert-mlm", "deberta-v2-mlm"] {
        let (text, tokens, want) = fixture_text(name);
        let dir = tiny_dir(name);
        let out = attention(
            &dir,
            &text,
            &["--layer", "1", "--head", "3", "--format", "json"],
        );
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let got_tokens: Vec<String> = serde_json::from_value(v["tokens"].clone()).unwrap();
        assert_eq!(
            got_tokens, tokens,
            "{name}: the text tokenizes back to the fixture"
        );
        let all: Vec<Vec<Vec<Vec<f32>>>> = serde_json::from_value(v["attentions"].clone()).unwrap();
        assert_eq!(all.len(), want.len(), "{name}: layers");
        for (l, (g, w)) in all.iter().zip(&want).enumerate() {
            for (h, (gh, wh)) in g.iter().zip(w).enumerate() {
                let d = max_diff(gh, wh);
                assert!(d <= 1e-4, "{name} layer {l} head {h}: max abs diff {d:e}");
            }
        }
        let matrix: Vec<Vec<f32>> = serde_json::from_value(v["matrix"].clone()).unwrap();
        assert!(
            max_diff(&matrix, &want[1][3]) <= 1e-4,
            "{name}: the drawn head"
        );
        // [CLS] across layers: the mean over heads of each layer's row 0.
        let out = attention(&dir, &text, &["--cls-across-layers", "--format", "json"]);
        assert!(out.status.success());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let cls: Vec<Vec<f32>> = serde_json::from_value(v["matrix"].clone()).unwrap();
        let mean: Vec<Vec<f32>> = want
            .iter()
            .map(|heads| {
                (0..tokens.len())
                    .map(|k| heads.iter().map(|h| h[0][k]).sum::<f32>() / heads.len() as f32)
                    .collect()
            })
            .collect();
        assert!(max_diff(&cls, &mean) <= 1e-4, "{name}: cls across layers");
        assert_eq!(v["rows"][0], "layer 0");
    }
}

#[test]
fn pictures_are_valid_png_and_svg() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tiny_dir("bert-mlm");
    let png_path = tmp.path().join("head.png");
    ok(&attention(
        &dir,
        "the film about germany",
        &["--out", s(&png_path)],
    ));
    let decoder = png::Decoder::new(std::fs::File::open(&png_path).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert!(
        info.width > 200 && info.height > 200,
        "{}x{}",
        info.width,
        info.height
    );
    let bytes = &buf[..info.buffer_size()];
    // Not blank: the darkest cell is dark blue.
    let darkest = bytes
        .chunks(3)
        .map(|p| p.iter().map(|&x| x as u32).sum::<u32>())
        .min();
    assert!(darkest.unwrap() < 300);

    let svg_path = tmp.path().join("cls.svg");
    ok(&attention(
        &tiny_dir("albert-mlm"),
        "the film about germany",
        &["--cls-across-layers", "--out", s(&svg_path)],
    ));
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert!(svg.starts_with("<svg"), "{}", &svg[..60.min(svg.len())]);
    assert!(svg.trim_end().ends_with("</svg>"));
    for label in ["germany", "layer 2", "[CLS]"] {
        assert!(svg.contains(label), "the SVG lacks the label {label}");
    }
    // 3 layers × 6 tokens of cells, plus the colour bar.
    assert!(svg.matches("<rect").count() >= 18);
}

#[test]
fn bad_requests_are_explained() {
    let dir = tiny_dir("bert-mlm");
    let cases: [(&[&str], &str); 4] = [
        (&["--layer", "7", "--format", "json"], "layer 7"),
        (&["--head", "9", "--format", "json"], "head 9"),
        (&[], "--out"),
        (&["--out", "/tmp/x.gif"], ".png or .svg"),
    ];
    for (args, want) in cases {
        let out = attention(&dir, "a text", args);
        assert!(!out.status.success(), "{args:?}");
        let err = stderr(&out);
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
