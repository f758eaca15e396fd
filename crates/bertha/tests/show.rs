//! `bertha::show`: PCA against a power-iteration reference, seeded t-SNE,
//! the cluster figures on hand-made clusters, valid pictures with one
//! point per input, and clear errors for bad inputs.
#![cfg(feature = "show")]

use std::path::Path;

use bertha::show::{cluster, coords, reduce, LabeledTexts, MapPlot, Method, ReadSpec, TsneOptions};

/// A deterministic pseudo-random value in [-1, 1) (no RNG crate needed).
fn hash01(i: usize) -> f32 {
    let x = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let x = (x ^ (x >> 31)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// `per` noisy points around each of `centres`, cluster by cluster.
fn blobs(centres: &[Vec<f32>], per: usize, noise: f32) -> (Vec<Vec<f32>>, Vec<usize>) {
    let mut vectors = Vec::new();
    let mut labels = Vec::new();
    for (c, centre) in centres.iter().enumerate() {
        for p in 0..per {
            let v = centre
                .iter()
                .enumerate()
                .map(|(d, x)| x + noise * hash01(1000 * c + 37 * p + d))
                .collect();
            vectors.push(v);
            labels.push(c);
        }
    }
    (vectors, labels)
}

#[test]
fn pca_first_axis_matches_power_iteration() {
    let x: Vec<Vec<f32>> = vec![
        vec![2.5, 2.4, 0.5, 1.0],
        vec![0.5, 0.7, -0.3, 0.2],
        vec![2.2, 2.9, 0.1, 0.8],
        vec![1.9, 2.2, 0.6, 0.4],
        vec![3.1, 3.0, -0.2, 1.3],
        vec![2.3, 2.7, 0.4, 0.1],
        vec![2.0, 1.6, 0.9, 0.6],
        vec![1.0, 1.1, -0.5, 0.3],
        vec![1.5, 1.6, 0.2, 0.9],
        vec![1.1, 0.9, 0.0, -0.2],
    ];
    let (n, d) = (x.len(), x[0].len());
    // Reference: the covariance's top eigenvector by power iteration.
    let mean: Vec<f64> = (0..d)
        .map(|j| x.iter().map(|r| f64::from(r[j])).sum::<f64>() / n as f64)
        .collect();
    let centred: Vec<Vec<f64>> = x
        .iter()
        .map(|r| (0..d).map(|j| f64::from(r[j]) - mean[j]).collect())
        .collect();
    let cov: Vec<Vec<f64>> = (0..d)
        .map(|a| {
            (0..d)
                .map(|b| centred.iter().map(|r| r[a] * r[b]).sum::<f64>() / (n - 1) as f64)
                .collect()
        })
        .collect();
    let mut v = vec![1.0f64; d];
    for _ in 0..2000 {
        let w: Vec<f64> = (0..d)
            .map(|a| (0..d).map(|b| cov[a][b] * v[b]).sum())
            .collect();
        let norm = w.iter().map(|x| x * x).sum::<f64>().sqrt();
        v = w.iter().map(|x| x / norm).collect();
    }
    let lambda: f64 = (0..d)
        .map(|a| v[a] * (0..d).map(|b| cov[a][b] * v[b]).sum::<f64>())
        .sum();
    let total_var: f64 = (0..d).map(|a| cov[a][a]).sum();
    let reference: Vec<f64> = centred
        .iter()
        .map(|r| r.iter().zip(&v).map(|(a, b)| a * b).sum())
        .collect();

    let (points, ratio) = reduce::pca_2d(&x).unwrap();
    let first: Vec<f64> = points.iter().map(|p| p[0]).collect();
    // The same axis up to sign; our sign makes the largest loading positive.
    let biggest = v
        .iter()
        .copied()
        .fold(0.0f64, |m, x| if x.abs() > m.abs() { x } else { m });
    let sign = biggest.signum();
    for (got, want) in first.iter().zip(&reference) {
        assert!(
            (got - sign * want).abs() < 1e-6,
            "PC1 {got} vs power iteration {}",
            sign * want
        );
    }
    assert!((ratio[0] - lambda / total_var).abs() < 1e-9, "{ratio:?}");
    // The second axis is orthogonal to the first in sample space.
    let dot: f64 = points.iter().map(|p| p[0] * p[1]).sum();
    assert!(dot.abs() < 1e-6, "PC1 · PC2 = {dot}");
    assert!(ratio[1] > 0.0 && ratio[1] <= ratio[0]);
}

#[test]
fn tsne_is_deterministic_for_a_seed_and_separates_blobs() {
    let (vectors, labels) = blobs(
        &[vec![0.0; 8], {
            let mut c = vec![0.0; 8];
            c[0] = 10.0;
            c
        }],
        20,
        1.0,
    );
    let opts = TsneOptions {
        perplexity: 5.0,
        seed: 7,
        iterations: 500,
        ..TsneOptions::default()
    };
    let a = reduce::tsne_2d(&vectors, &opts).unwrap();
    let b = reduce::tsne_2d(&vectors, &opts).unwrap();
    assert_eq!(a, b, "same seed, same points (bit for bit)");
    let c = reduce::tsne_2d(&vectors, &TsneOptions { seed: 8, ..opts }).unwrap();
    assert_ne!(a, c, "another seed starts elsewhere");
    assert_eq!(a.len(), 40);

    let texts: Vec<String> = (0..40).map(|i| format!("text {i}")).collect();
    let names: Vec<String> = labels.iter().map(|l| l.to_string()).collect();
    let lines: Vec<usize> = (2..42).collect();
    let csv_a = coords::to_csv(&a, &texts, Some(&names), &lines).unwrap();
    let csv_b = coords::to_csv(&b, &texts, Some(&names), &lines).unwrap();
    assert_eq!(csv_a, csv_b);
    assert_eq!(
        String::from_utf8(csv_a).unwrap().lines().count(),
        41,
        "a header and one row per point"
    );

    // Two far-apart blobs stay apart: a high silhouette in the map.
    let s = cluster::silhouette(&a, &labels).unwrap();
    assert!(s > 0.7, "silhouette {s}");
}

#[test]
fn tsne_rejects_a_perplexity_too_large_for_the_points() {
    let (vectors, _) = blobs(&[vec![0.0; 4]], 10, 1.0);
    let err = reduce::tsne_2d(&vectors, &TsneOptions::default()).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("perplexity 30 is too large for 10 points") && msg.contains("at most 3"),
        "{msg}"
    );
    let err = reduce::reduce(&vectors[..2], Method::Pca, &TsneOptions::default()).unwrap_err();
    assert!(err.to_string().contains("at least 3 vectors"), "{err}");
}

#[test]
fn silhouette_on_hand_made_clusters() {
    // Two pairs 10 apart: for every point a = 1, b = (10 + √101) / 2.
    let points = [[0.0, 0.0], [0.0, 1.0], [10.0, 0.0], [10.0, 1.0]];
    let b = (10.0 + 101f64.sqrt()) / 2.0;
    let s = cluster::silhouette(&points, &[0, 0, 1, 1]).unwrap();
    assert!((s - (1.0 - 1.0 / b)).abs() < 1e-12, "{s}");
    // Labels across the pairs: a = 10 (the same label is across), b = (1 + √101) / 2
    // → negative.
    let s = cluster::silhouette(&points, &[0, 1, 0, 1]).unwrap();
    let b_cross = (1.0 + 101f64.sqrt()) / 2.0;
    assert!((s - (b_cross - 10.0) / 10.0).abs() < 1e-12, "{s}");
    // A point alone in its label scores 0 (scikit-learn's convention):
    // points 0 and 1 score 1 - 1/b', point 2 scores 0.
    let points3 = [[0.0, 0.0], [0.0, 1.0], [4.0, 0.0]];
    let s = cluster::silhouette(&points3, &[0, 0, 1]).unwrap();
    let s0 = 1.0 - 1.0 / 4.0;
    let s1 = 1.0 - 1.0 / 17f64.sqrt();
    assert!((s - (s0 + s1) / 3.0).abs() < 1e-12, "{s}");
    // Undefined with one label, or with every point its own label.
    assert_eq!(cluster::silhouette(&points, &[0, 0, 0, 0]), None);
    assert_eq!(cluster::silhouette(&points, &[0, 1, 2, 3]), None);
}

#[test]
fn knn_accuracy_on_hand_made_clusters() {
    // Two directions (cosine): 12 vectors near e1, 12 near e2.
    let mut e1 = vec![0.0f32; 6];
    e1[0] = 5.0;
    let mut e2 = vec![0.0f32; 6];
    e2[1] = 5.0;
    let (vectors, mut labels) = blobs(&[e1, e2], 12, 0.5);
    assert_eq!(cluster::knn_accuracy(&vectors, &labels, 10), Some(1.0));
    // Mislabel one vector of the first blob: it alone is predicted wrong
    // (its neighbours are the 11 others of its blob); every other vector
    // still has a clear majority of its own label among 10 neighbours.
    labels[3] = 1;
    let acc = cluster::knn_accuracy(&vectors, &labels, 10).unwrap();
    assert!((acc - 23.0 / 24.0).abs() < 1e-12, "{acc}");
    // Scale does not matter to cosine.
    let scaled: Vec<Vec<f32>> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| v.iter().map(|x| x * (1 + i) as f32).collect())
        .collect();
    assert_eq!(cluster::knn_accuracy(&scaled, &labels, 10), Some(acc));
    // Ties go to the label of the nearest voter: k = 2 with one vote each.
    let line = vec![
        vec![1.0, 0.0],
        vec![1.0, 0.1],
        vec![1.0, -0.3],
        vec![0.0, 1.0],
    ];
    // Vector 0's neighbours: 1 (label 0, nearer), 2 (label 1) → predicts 0.
    let acc = cluster::knn_accuracy(&line, &[0, 0, 1, 1], 2).unwrap();
    // 0 → {1:0, 2:1} → 0 ✓; 1 → {0:0, 2:1} → 0 ✓; 2 → {0:0, 1:0} → 0 ✗;
    // 3 → {1:0, 0:0} → 0 ✗.
    assert!((acc - 0.5).abs() < 1e-12, "{acc}");
    assert_eq!(cluster::knn_accuracy(&line, &[0, 0, 0, 0], 2), None);
}

fn plot_of<'a>(points: &'a [[f64; 2]], labels: &'a [usize], names: &'a [String]) -> MapPlot<'a> {
    MapPlot {
        title: "test map",
        subtitle: Some("silhouette 0.5"),
        axes: ["x", "y"],
        points,
        labels,
        label_names: names,
        legend: true,
        size: (640, 480),
    }
}

#[test]
fn png_and_svg_are_valid_with_one_point_per_input() {
    let (vectors, labels) = blobs(&[vec![0.0, 0.0], vec![5.0, 5.0], vec![0.0, 5.0]], 9, 1.0);
    let points: Vec<[f64; 2]> = vectors
        .iter()
        .map(|v| [f64::from(v[0]), f64::from(v[1])])
        .collect();
    let names: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
    let plot = plot_of(&points, &labels, &names);
    let dir = tempfile::tempdir().unwrap();

    let png_path = dir.path().join("map.png");
    plot.save(&png_path).unwrap();
    let bytes = std::fs::read(&png_path).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let decoder = png::Decoder::new(std::io::Cursor::new(&bytes));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!((info.width, info.height), (640, 480));
    // Points are drawn in colour on white: some pixels are each label's colour.
    assert_eq!(info.color_type, png::ColorType::Rgb);
    let has = |want: (u8, u8, u8)| {
        buf.chunks(3).any(|p| {
            let d = |a: u8, b: u8| (i32::from(a) - i32::from(b)).abs();
            d(p[0], want.0) + d(p[1], want.1) + d(p[2], want.2) < 40
        })
    };
    for (g, _) in names.iter().enumerate() {
        let c = bertha::show::plot::label_color(g);
        // Points are 75% opaque on white.
        let mix = |x: u8| ((f64::from(x) * 0.75) + 255.0 * 0.25).round() as u8;
        assert!(
            has((mix(c.0), mix(c.1), mix(c.2))),
            "no pixel of label {g}'s colour"
        );
    }

    let svg_path = dir.path().join("map.svg");
    plot.save(&svg_path).unwrap();
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert!(
        svg.starts_with("<svg") || svg.starts_with("<?xml"),
        "{}",
        &svg[..40]
    );
    assert!(svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("width=\"640\"") && svg.contains("height=\"480\""));
    assert_eq!(
        svg.matches("<circle").count(),
        points.len(),
        "one circle per point"
    );
    assert!(svg.contains("a (n=9)") && svg.contains("test map"));

    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&png_path).unwrap().permissions().mode();
        assert_eq!(mode & 0o644, 0o644, "readable by all: {mode:o}");
    }
    // No temporary files are left behind.
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(left.len(), 2);

    let err = plot.save(&dir.path().join("map.jpg")).unwrap_err();
    assert!(err.to_string().contains(".png or .svg"), "{err}");
}

fn write(dir: &Path, name: &str, body: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p
}

#[test]
fn bad_inputs_give_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let tsv = write(dir.path(), "data.tsv", "sentence\tlabel\ngood\t1\nbad\t0\n");
    let spec = ReadSpec {
        label_column: Some("sentiment".into()),
        ..Default::default()
    };
    let err = LabeledTexts::read(&tsv, &spec).unwrap_err().to_string();
    assert!(
        err.contains("data.tsv")
            && err.contains("no label column `sentiment`")
            && err.contains("`sentence`, `label`"),
        "{err}"
    );
    let spec = ReadSpec {
        text_column: Some("review".into()),
        ..Default::default()
    };
    let err = LabeledTexts::read(&tsv, &spec).unwrap_err().to_string();
    assert!(err.contains("no text column `review`"), "{err}");

    let empty = write(dir.path(), "empty.tsv", "");
    let err = LabeledTexts::read(&empty, &ReadSpec::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("empty.tsv") && err.contains("empty"), "{err}");
    let header_only = write(dir.path(), "header.tsv", "sentence\tlabel\n");
    let err = LabeledTexts::read(&header_only, &ReadSpec::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("header.tsv: no texts"), "{err}");

    let short = write(dir.path(), "short.tsv", "sentence\tlabel\ngood\t1\nbad\n");
    let err = LabeledTexts::read(&short, &ReadSpec::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("short.tsv: line 3: no field `label`"), "{err}");

    let jsonl = write(
        dir.path(),
        "d.jsonl",
        "{\"text\": \"a\", \"label\": 1}\n{\"text\": \"b\"}\n",
    );
    let err = LabeledTexts::read(&jsonl, &ReadSpec::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("d.jsonl: line 2: no field `label`"), "{err}");

    let lines = write(dir.path(), "t.txt", "a\nb\nc\n");
    let labels = write(dir.path(), "l.txt", "x\ny\n");
    let spec = ReadSpec {
        labels_file: Some(labels),
        ..Default::default()
    };
    let err = LabeledTexts::read(&lines, &spec).unwrap_err().to_string();
    assert!(err.contains("2 labels for the 3 texts"), "{err}");
}
