//! The `bertha` binary end to end: real processes, real files, real model.

mod common;

use common::{
    assert_stderr_has, bertha, fixtures, minilm, ok, ok_lines, read_jsonl, reference, run,
    run_model, run_stdin, s, tiny, tiny_dir,
};

use std::path::Path;
use std::process::{Output, Stdio};

fn reference_embedding(i: usize) -> Vec<f32> {
    reference("minilm.safetensors")[&format!("sentence_embedding.{i}")]
        .to_vec1()
        .unwrap()
}

/// The JSON lines of a successful `bertha CMD --model <MiniLM> ARGS...`.
fn on_minilm(cmd: &str, args: &[&str]) -> Vec<serde_json::Value> {
    ok_lines(&run_model(cmd, &minilm(), args))
}

/// `bertha embed` of the file `input` into the file `output`.
fn embed_file(model: &Path, input: &Path, output: &Path) -> Output {
    run_model(
        "embed",
        model,
        &["--input", s(input), "--output", s(output)],
    )
}

#[test]
fn tokenize_matches_transformers_from_vocab_only_folder() {
    let dir = fixtures().join("minilm-vocab-only");
    let out = run_model("tokenize", &dir, &["The cat sat on the mat.", ""]);
    let lines = ok_lines(&out);
    assert_eq!(lines.len(), 2);
    assert_eq!(
        lines[0]["input_ids"],
        serde_json::json!([101, 1996, 4937, 2938, 2006, 1996, 13523, 1012, 102])
    );
    assert_eq!(lines[0]["offsets"][1], serde_json::json!([0, 3]));
    assert_eq!(lines[0]["tokens"][6], "mat");
    assert_eq!(lines[1]["input_ids"], serde_json::json!([101, 102]));
}

#[test]
fn tokenize_pairs_and_truncation_is_reported() {
    let dir = minilm();
    let out = run_model(
        "tokenize",
        &dir,
        &[
            "--pair",
            "I went to the bank to deposit money.",
            "The cat sat on the mat.",
        ],
    );
    let lines = ok_lines(&out);
    assert_eq!(
        lines[0]["token_type_ids"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| *v == 1)
            .count(),
        10
    );

    let long = "word ".repeat(100);
    let out = run_model("tokenize", &dir, &["--max-length", "16", &long]);
    let lines = ok_lines(&out);
    assert_eq!(lines[0]["input_ids"].as_array().unwrap().len(), 16);
    assert_eq!(lines[0]["truncated"], true);
    assert_stderr_has(&out, "truncated to 16 tokens");
}

#[test]
fn embed_matches_sentence_transformers() {
    let lines = on_minilm(
        "embed",
        &[
            "The cat sat on the mat.",
            "I went to the bank to deposit money.",
        ],
    );
    assert_eq!(lines.len(), 2);
    for (i, line) in lines.iter().enumerate() {
        let got: Vec<f32> = serde_json::from_value(line["embedding"].clone()).unwrap();
        let want = reference_embedding(i);
        let d = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(d <= 1e-5, "sentence {i}: {d:e}");
    }
}

#[test]
fn embed_reads_files_and_stdin_and_writes_files_atomically() {
    let dir = minilm();
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in.txt");
    std::fs::write(
        &input,
        "The cat sat on the mat.\n\nI went to the bank to deposit money.\n",
    )
    .unwrap();
    let output = tmp.path().join("out.jsonl");
    let out = embed_file(&dir, &input, &output);
    ok(&out);
    let lines = read_jsonl(&output);
    assert_eq!(lines.len(), 3, "the empty line gets its own embedding");
    let first: Vec<f32> = serde_json::from_value(lines[0]["embedding"].clone()).unwrap();
    let want = reference_embedding(0);
    assert!(first.iter().zip(&want).all(|(a, b)| (a - b).abs() <= 1e-5));
    // Only the output file is left in the folder: no temporary leftovers.
    let names: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");

    let from_stdin = ok_lines(&run_stdin(
        &["embed", "--model", dir.to_str().unwrap()],
        b"The cat sat on the mat.\n",
    ));
    assert_eq!(from_stdin[0]["embedding"], lines[0]["embedding"]);
}

#[test]
fn embed_pooling_none_gives_token_vectors() {
    let lines = on_minilm(
        "embed",
        &[
            "--pooling",
            "none",
            "--no-normalize",
            "The cat sat on the mat.",
        ],
    );
    let tokens = lines[0]["tokens"].as_array().unwrap();
    let vectors = lines[0]["embeddings"].as_array().unwrap();
    assert_eq!(tokens.len(), 9);
    assert_eq!(vectors.len(), 9);
    assert_eq!(vectors[0].as_array().unwrap().len(), 384);
    // The un-normalised token states are the model's last hidden state.
    let want: Vec<Vec<f32>> = reference("minilm.safetensors")["last_hidden_state.0"]
        .to_vec2()
        .unwrap();
    let got: Vec<Vec<f32>> = serde_json::from_value(lines[0]["embeddings"].clone()).unwrap();
    for (g, w) in got.iter().zip(&want) {
        assert!(g.iter().zip(w).all(|(a, b)| (a - b).abs() <= 1e-4));
    }
}

/// Without `--no-normalize` too: the folder's Normalize module acts on
/// sentence vectors, never on token vectors (as `/embed_all`, TEI and
/// sentence-transformers' `token_embeddings`).
#[test]
fn embed_pooling_none_is_not_normalised_by_the_folder() {
    let lines = on_minilm("embed", &["--pooling", "none", "The cat sat on the mat."]);
    let want: Vec<Vec<f32>> = reference("minilm.safetensors")["last_hidden_state.0"]
        .to_vec2()
        .unwrap();
    let got: Vec<Vec<f32>> = serde_json::from_value(lines[0]["embeddings"].clone()).unwrap();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert!(g.iter().zip(w).all(|(a, b)| (a - b).abs() <= 1e-4));
    }
}

#[test]
fn similarity_matrix_is_symmetric_with_unit_diagonal() {
    let lines = on_minilm(
        "similarity",
        &[
            "The film was surprisingly moving and beautifully shot.",
            "A gripping, beautifully acted drama that never lets up.",
            "I went to the bank to deposit money.",
        ],
    );
    let m: Vec<Vec<f32>> = serde_json::from_value(lines[0]["similarity"].clone()).unwrap();
    for (i, row) in m.iter().enumerate() {
        assert!((row[i] - 1.0).abs() < 1e-5);
        for (j, v) in row.iter().enumerate() {
            assert!((v - m[j][i]).abs() < 1e-6);
        }
    }
    assert!(
        m[0][1] > m[0][2],
        "two film reviews are closer than a film review and banking: {m:?}"
    );
}

/// `similarity --precision bf16` and `--quantize int8`: fp32's matrix
/// within 1e-2 (measured: 3.2e-3 at int8, whose embeddings keep cosine
/// ≥ 0.999 to fp32's), and not fp32's numbers at int8.
#[test]
fn similarity_takes_a_precision() {
    let texts = [
        "The film was surprisingly moving and beautifully shot.",
        "A gripping, beautifully acted drama that never lets up.",
        "I went to the bank to deposit money.",
    ];
    let matrix = |flags: &[&str]| -> Vec<f32> {
        let mut args = flags.to_vec();
        args.extend(texts);
        let lines = on_minilm("similarity", &args);
        let m: Vec<Vec<f32>> = serde_json::from_value(lines[0]["similarity"].clone()).unwrap();
        m.concat()
    };
    let exact = matrix(&[]);
    for flags in [["--precision", "bf16"], ["--quantize", "int8"]] {
        let got = matrix(&flags);
        for (g, w) in got.iter().zip(&exact) {
            assert!((g - w).abs() <= 1e-2, "{flags:?}: {g} vs {w}");
        }
        if flags[1] == "int8" {
            assert_ne!(got, exact);
        }
    }
}

#[test]
fn invalid_utf8_input_names_the_line() {
    let dir = minilm();
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("bad.txt");
    std::fs::write(&input, b"fine\nalso fine\nbroken \xc3\x28 here\n").unwrap();
    let output = tmp.path().join("out.jsonl");
    let out = embed_file(&dir, &input, &output);
    assert_eq!(out.status.code(), Some(1));
    assert_stderr_has(&out, "bad.txt: line 3: invalid UTF-8");
    assert!(!output.exists(), "no half-written output");

    let out = run_stdin(
        &["tokenize", "--model", dir.to_str().unwrap()],
        b"ok\n\xff\n",
    );
    assert_stderr_has(&out, "stdin: line 2: invalid UTF-8");
}

#[test]
fn bad_model_paths_are_explained() {
    let embed_hi = |model: &str| run(&["embed", "--model", model, "hi"]);
    let out = embed_hi("/nonexistent/folder");
    assert_eq!(out.status.code(), Some(1));
    assert_stderr_has(&out, "does not exist");

    // A hub id fails at once with an explanation; nothing tries the network.
    let start = std::time::Instant::now();
    let out = embed_hi("sentence-transformers/all-MiniLM-L6-v2");
    assert_eq!(out.status.code(), Some(1));
    assert_stderr_has(&out, "Hugging Face hub id");
    assert!(start.elapsed().as_secs() < 30);

    let out = embed_hi(s(&fixtures().join("sentences.txt")));
    assert_stderr_has(&out, "not a folder");

    let out = embed_hi(s(&fixtures().join("minilm-vocab-only")));
    assert_stderr_has(&out, "config.json is missing");
}

#[test]
fn default_model_is_the_fetched_minilm() {
    minilm();
    let tmp = tempfile::tempdir().unwrap();
    let out = bertha(&["embed", "The cat sat on the mat."])
        .current_dir(tmp.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let lines = ok_lines(&out);
    assert_eq!(lines[0]["embedding"].as_array().unwrap().len(), 384);
}

#[test]
fn bench_reports_throughput() {
    let lines = on_minilm(
        "bench",
        &[
            "--input",
            fixtures().join("sentences.txt").to_str().unwrap(),
            "--reps",
            "1",
        ],
    );
    assert_eq!(lines[0]["texts"], 17);
    assert!(lines[0]["texts_per_s"].as_f64().unwrap() > 0.0);
    assert!(lines[0]["tokens"].as_u64().unwrap() > 17 * 2);
}

/// `serve` with an empty key (flag or `BERTHA_API_KEY`) stops at once with
/// an error naming the flag, instead of serving 401 to every call.
#[test]
fn serve_refuses_an_empty_api_key() {
    let model = minilm();
    let by_flag = [
        "serve",
        "--model",
        s(&model),
        "--port",
        "0",
        "--api-key",
        "",
    ];
    let by_env = ["serve", "--model", s(&model), "--port", "0"];
    for (args, env) in [(&by_flag[..], None), (&by_env[..], Some(""))] {
        let err = serve_error(args, env.map(|v| ("BERTHA_API_KEY", v)));
        assert!(err.contains("--api-key is empty"), "{err}");
        assert!(err.contains("BERTHA_API_KEY"), "{err}");
        // Issue 46, case 14: not taken for the model's error.
        assert!(!err.contains("loading the model"), "{err}");
    }
}

/// `bertha ARGS` with `env` set, its stderr piped (the rest closed).
fn spawn(args: &[&str], env: Option<(&str, &str)>) -> std::process::Child {
    let mut cmd = bertha(args);
    if let Some((name, value)) = env {
        cmd.env(name, value);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Runs `bertha ARGS` (a `serve` that must not start) and returns its
/// stderr once it has failed.
fn serve_error(args: &[&str], env: Option<(&str, &str)>) -> String {
    let mut child = spawn(args, env);
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > std::time::Duration::from_secs(60) {
            child.kill().unwrap();
            panic!("`bertha {args:?}` is serving");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A connection limit or timeout of 0 would leave the server unable to
/// serve anyone: refused at start, naming the flag.
#[test]
fn serve_refuses_zero_connection_limits() {
    let model = minilm();
    for (flag, want) in [
        ("--max-connections", "--max-connections must be at least 1"),
        (
            "--header-read-timeout",
            "--header-read-timeout must be longer than 0 s",
        ),
        (
            "--keep-alive-timeout",
            "--keep-alive-timeout must be longer than 0 s",
        ),
    ] {
        let args = ["serve", "--model", s(&model), "--port", "0", flag, "0"];
        let err = serve_error(&args, None);
        assert!(err.contains(want), "{flag}: {err}");
        assert!(!err.contains("loading the model"), "{flag}: {err}");
    }
}

/// Issue 46, case 3: `--model a=DIR --model a/embed=DIR2` panicked (exit
/// 101, a backtrace) after printing "serving on". Now an error at start.
#[test]
fn serve_refuses_model_names_whose_routes_overlap() {
    let tiny_mlm = tiny("bert-mlm");
    let a = format!("a={tiny_mlm}");
    let inner = format!("a/embed={tiny_mlm}");
    let args = ["serve", "--model", &a, "--model", &inner, "--port", "0"];
    let mut child = spawn(&args, None);
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > std::time::Duration::from_secs(60) {
            child.kill().unwrap();
            panic!("serving");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("the names `a` and `a/embed` overlap"), "{err}");
    assert!(
        !err.contains("serving on") && !err.contains("panicked"),
        "{err}"
    );
}

/// `serve --grpc-port` serves HTTP and gRPC (HTTP/2) side by side, and one
/// SIGTERM stops both cleanly.
#[cfg(all(feature = "grpc", unix))]
#[test]
fn serve_grpc_port_beside_http_and_sigterm_stops_both() {
    use std::io::{BufRead, BufReader, Read, Write};
    let mut child = bertha(&[
        "serve",
        "--model",
        s(&fixtures().join("tiny/bert-seqcls")),
        "--port",
        "0",
        "--grpc-port",
        "0",
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    // The first line the HTTP address, then the served models, then gRPC's.
    let mut addr = |scheme: &str| loop {
        let mut line = String::new();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "no {scheme} line");
        if line.contains(scheme) {
            let addr = line.trim().rsplit(' ').next().unwrap_or_default();
            break addr.trim_start_matches("http://").to_string();
        }
    };
    let (http, grpc) = (addr("http://"), addr("gRPC"));
    // HTTP/1.1 on one port ...
    let mut stream = std::net::TcpStream::connect(&http).unwrap();
    let get = format!("GET /health HTTP/1.1\r\nHost: {http}\r\nConnection: close\r\n\r\n");
    stream.write_all(get.as_bytes()).unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    // ... HTTP/2 on the other: the client preface and an empty SETTINGS
    // frame get the server's SETTINGS frame (type 4) back.
    let mut stream = std::net::TcpStream::connect(&grpc).unwrap();
    stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .unwrap();
    let mut frame = [0u8; 9];
    stream.read_exact(&mut frame).unwrap();
    assert_eq!(frame[3], 4, "not a SETTINGS frame: {frame:?}");
    drop(stream);
    let pid = child.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > std::time::Duration::from_secs(30) {
            child.kill().unwrap();
            panic!("bertha serve did not stop on SIGTERM");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
}

/// Without the `grpc` feature, `--grpc-port` is refused, saying how to
/// build it.
#[cfg(not(feature = "grpc"))]
#[test]
fn serve_grpc_port_needs_the_feature() {
    let model = fixtures().join("tiny/bert-seqcls");
    let args = [
        "serve",
        "--model",
        s(&model),
        "--port",
        "0",
        "--grpc-port",
        "0",
    ];
    let err = serve_error(&args, None);
    assert!(err.contains("--features grpc"), "{err}");
}

/// The gRPC decision of issue 46: the default build leaves gRPC out, and
/// `serve --help` says how to get it (any build shows the flag).
#[test]
fn serve_help_says_how_to_get_grpc() {
    let help = ok(&run(&["serve", "--help"]));
    assert!(help.contains("--grpc-port"), "{help}");
    assert!(
        help.contains("cargo build --release -p bertha-cli --features grpc"),
        "{help}"
    );
}

/// A `bertha serve` started by a test, stopped however the test ends.
struct Serving {
    child: std::process::Child,
    addr: String,
}

impl Serving {
    fn start(args: &[&str], env: Option<(&str, &str)>) -> Self {
        use std::io::{BufRead, BufReader};
        let mut child = spawn(args, env);
        let mut line = String::new();
        BufReader::new(child.stderr.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .rsplit("http://")
            .next()
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_string();
        Self { child, addr }
    }

    /// Sends `request` (HTTP/1.1, `Connection: close`): the whole reply
    /// and its body.
    fn http(&self, request: String) -> (String, String) {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(&self.addr).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).unwrap();
        let body = reply
            .split("\r\n\r\n")
            .nth(1)
            .unwrap_or_default()
            .to_string();
        (reply, body)
    }

    fn get(&self, path: &str) -> serde_json::Value {
        let addr = &self.addr;
        let (reply, body) = self.http(format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        ));
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {reply}"))
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `serve --served-model-name` (TEI's flag) names the model in
/// `/v1/models`; `TASK=sentence-similarity` makes `POST /` compare
/// sentences, as TEI.
#[test]
fn serve_takes_tei_served_model_name_and_task() {
    let model = minilm();
    let server = Serving::start(
        &[
            "serve",
            "--model",
            s(&model),
            "--port",
            "0",
            "--served-model-name",
            "my-model",
        ],
        Some(("TASK", "sentence-similarity")),
    );
    let models = server.get("/v1/models");
    let body = r#"{"inputs": {"source_sentence": "a cat", "sentences": ["a cat"]}}"#;
    let (reply, scores) = server.http(format!(
        "POST / HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        server.addr,
        body.len()
    ));
    drop(server);
    assert_eq!(models["data"][0]["id"], "my-model");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    let scores: Vec<f32> = serde_json::from_str(&scores).unwrap();
    assert!(
        scores.len() == 1 && (scores[0] - 1.0).abs() < 1e-5,
        "{scores:?}"
    );
}

/// `serve --model NAME=DIR --model DIR`: several models, named, each under
/// `/models/NAME/`; one `--served-model-name` cannot name them all.
#[test]
fn serve_takes_several_models() {
    let (model, tiny) = (minilm(), tiny_dir("bert-mlm"));
    let named = format!("mini={}", model.display());
    let server = Serving::start(
        &[
            "serve",
            "--model",
            &named,
            "--model",
            s(&tiny),
            "--port",
            "0",
        ],
        None,
    );
    let models = server.get("/v1/models");
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["mini", "bert-mlm"]);
    let info = server.get("/models/bert-mlm/info");
    assert_eq!(info["model_id"], "bert-mlm");
    drop(server);
    let err = serve_error(
        &[
            "serve",
            "--model",
            &named,
            "--model",
            s(&tiny),
            "--served-model-name",
            "x",
        ],
        None,
    );
    assert!(err.contains("--served-model-name names one model"), "{err}");
    let err = serve_error(
        &[
            "serve",
            "--model",
            &named,
            "--model",
            &format!("mini={}", tiny.display()),
        ],
        None,
    );
    assert!(err.contains("`mini` is given to two models"), "{err}");
}
