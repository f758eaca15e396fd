//! The documentation's CLI examples, run. Every ```` ```console ```` block of
//! `docs/**/*.md` and `README.md` is a transcript: `$ bertha ARGS` lines, each
//! followed by the output it must print (stdout). The command runs with the
//! `bertha` this test was built with, in the repository root, and a changed
//! output fails the test naming the page and line, so the docs cannot drift
//! from the program (trycmd's markdown mode, without its dependency stack).
//!
//! In an expected output, `[..]` matches any text within a line and a line
//! `...` any number of lines: floats whose last digits depend on the CPU's
//! instruction set are written as `[..]`, never pinned.
//!
//! `BERTHA_DOCS_BLESS=1 cargo test -p bertha-cli --test docs_examples`
//! rewrites the expected outputs that hold no wildcard (the `--help` pages)
//! with what the program prints now; review the diff.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    // Canonical, so failures name `REPO/docs/page.md`, not `crates/bertha-cli/../..`.
    root.canonicalize().unwrap_or(root)
}

/// One `$ bertha ...` line of a console block and what follows it.
struct Example {
    file: PathBuf,
    /// 1-based line of the `$` line.
    line: usize,
    args: Vec<String>,
    /// 0-based line range of the expected output in the file.
    expected: std::ops::Range<usize>,
}

fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            markdown_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

/// Splits a command line as a POSIX shell would for the quoting the docs
/// use: single quotes, double quotes (with `\"`), and backslashes.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for q in chars.by_ref() {
                    if q == '\'' {
                        break;
                    }
                    word.push(q);
                }
            }
            '"' => {
                in_word = true;
                while let Some(q) = chars.next() {
                    match q {
                        '"' => break,
                        '\\' => word.extend(chars.next()),
                        _ => word.push(q),
                    }
                }
            }
            '\\' => {
                in_word = true;
                word.extend(chars.next());
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

fn examples_of(file: &Path, text: &str) -> Vec<Example> {
    let lines: Vec<&str> = text.lines().collect();
    let mut examples = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim_end() != "```console" {
            i += 1;
            continue;
        }
        i += 1;
        let mut current: Option<Example> = None;
        while i < lines.len() && lines[i].trim_end() != "```" {
            if let Some(cmd) = lines[i].strip_prefix("$ ") {
                examples.extend(current.take());
                let args = shell_words(cmd);
                assert_eq!(
                    args.first().map(String::as_str),
                    Some("bertha"),
                    "{}:{}: console examples run `bertha` only",
                    file.display(),
                    i + 1
                );
                current = Some(Example {
                    file: file.to_path_buf(),
                    line: i + 1,
                    args: args[1..].to_vec(),
                    expected: i + 1..i + 1,
                });
            } else if let Some(ex) = current.as_mut() {
                ex.expected.end = i + 1;
            }
            i += 1;
        }
        examples.extend(current.take());
        i += 1;
    }
    examples
}

/// `[..]` matches any text (possibly empty) within the line.
fn line_matches(expected: &str, actual: &str) -> bool {
    let parts: Vec<&str> = expected.split("[..]").collect();
    if parts.len() == 1 {
        return expected == actual;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !actual.starts_with(first) || actual.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &actual[first.len()..];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// A line `...` matches any number of lines (the shortest run that lets the
/// rest match).
fn lines_match(expected: &[&str], actual: &[&str]) -> bool {
    match expected.split_first() {
        None => actual.is_empty(),
        Some((&"...", rest)) => (0..=actual.len()).any(|skip| lines_match(rest, &actual[skip..])),
        Some((e, rest)) => actual
            .split_first()
            .is_some_and(|(a, more)| line_matches(e, a) && lines_match(rest, more)),
    }
}

fn run(ex: &Example) -> Result<String, String> {
    let root = repo_root();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_bertha"));
    cmd.args(&ex.args).current_dir(&root);
    // A fixed environment: clap prints the values of the variables a flag
    // reads (`[env: RAYON_NUM_THREADS=4]`), and BERTHA_MODEL would change
    // the default model. BERTHA_ISA passes through, so the examples run on
    // the kernels the suite is testing.
    cmd.env_clear();
    for keep in ["PATH", "HOME", "TMPDIR", "LD_LIBRARY_PATH", "BERTHA_ISA"] {
        if let Some(v) = std::env::var_os(keep) {
            cmd.env(keep, v);
        }
    }
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run bertha: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!(
            "exited with {}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(stdout)
}

fn normalise(text: &str) -> Vec<String> {
    let mut lines: Vec<String> = text.lines().map(|l| l.trim_end().to_string()).collect();
    while lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    lines
}

fn doc_files() -> Vec<PathBuf> {
    let root = repo_root();
    let mut files = vec![root.join("README.md")];
    markdown_files(&root.join("docs"), &mut files);
    files
}

#[test]
fn console_examples_in_the_docs_print_what_they_show() {
    let bless = std::env::var_os("BERTHA_DOCS_BLESS").is_some();
    let mut failures = Vec::new();
    let mut count = 0;
    for file in doc_files() {
        let text = fs::read_to_string(&file).expect("read a docs page");
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        let examples = examples_of(&file, &text);
        // Bless from the last example up, so earlier line ranges stay valid.
        for ex in examples.iter().rev() {
            count += 1;
            let expected: Vec<String> = normalise(&lines[ex.expected.clone()].join("\n"));
            let actual = match run(ex) {
                Ok(out) => normalise(&out),
                Err(e) => {
                    failures.push(format!("{}:{}: {e}", ex.file.display(), ex.line));
                    continue;
                }
            };
            let exp: Vec<&str> = expected.iter().map(String::as_str).collect();
            let act: Vec<&str> = actual.iter().map(String::as_str).collect();
            if lines_match(&exp, &act) {
                continue;
            }
            let wildcard = exp.iter().any(|l| *l == "..." || l.contains("[..]"));
            if bless && !wildcard {
                lines.splice(ex.expected.clone(), actual.iter().cloned());
                continue;
            }
            // The first differing line leads (a --help page is long).
            let at = exp
                .iter()
                .zip(&act)
                .position(|(e, a)| *e == "..." || !line_matches(e, a))
                .unwrap_or(exp.len().min(act.len()));
            failures.push(format!(
                "{}:{}: `bertha {}` printed something else; first difference at output line {}:\n  \
                 expected: {}\n  actual:   {}\n--- expected\n{}\n--- actual\n{}",
                ex.file.display(),
                ex.line,
                ex.args.join(" "),
                at + 1,
                exp.get(at).unwrap_or(&"(end)"),
                act.get(at).unwrap_or(&"(end)"),
                exp.join("\n"),
                act.join("\n")
            ));
        }
        if bless {
            let mut new = lines.join("\n");
            new.push('\n');
            if new != text {
                fs::write(&file, new).expect("write a blessed docs page");
            }
        }
    }
    assert!(
        count >= 20,
        "only {count} console examples found in the docs"
    );
    assert!(
        failures.is_empty(),
        "{} of {count} docs examples failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// Every subcommand `bertha --help` lists has its `--help` shown (and so
/// checked) in the docs, so a new command or flag cannot go undocumented.
#[test]
fn every_subcommand_has_its_help_in_the_docs() {
    let out = Command::new(env!("CARGO_BIN_EXE_bertha"))
        .arg("--help")
        .output()
        .expect("run bertha --help");
    let help = String::from_utf8(out.stdout).expect("utf-8 help");
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(commands.len() >= 15, "commands parsed: {commands:?}");
    let shown: Vec<Vec<String>> = doc_files()
        .iter()
        .flat_map(|f| examples_of(f, &fs::read_to_string(f).expect("read a docs page")))
        .map(|ex| ex.args)
        .collect();
    let missing: Vec<&str> = commands
        .iter()
        .copied()
        .filter(|c| !shown.iter().any(|a| a == &[c.to_string(), "--help".into()]))
        .collect();
    assert!(
        missing.is_empty(),
        "no `$ bertha CMD --help` block in docs/ for: {missing:?}"
    );
    assert!(
        shown.iter().any(|a| a == &["--help".to_string()]),
        "no `$ bertha --help` block in docs/"
    );
}

#[test]
fn wildcards_match_as_documented() {
    assert!(line_matches(
        r#"{"score":[..],"token":108}"#,
        r#"{"score":0.0668,"token":108}"#
    ));
    assert!(!line_matches(
        r#"{"score":[..],"token":108}"#,
        r#"{"score":0.0668,"token":109}"#
    ));
    assert!(line_matches("[..]", ""));
    assert!(lines_match(&["a", "...", "d"], &["a", "b", "c", "d"]));
    assert!(lines_match(&["a", "...", "b"], &["a", "b"]));
    assert!(!lines_match(&["a", "...", "d"], &["a", "b"]));
    assert_eq!(
        shell_words(r#"qa --question "who played" --context 'x y' a\ b"#),
        ["qa", "--question", "who played", "--context", "x y", "a b"]
    );
}
