//! The `bertha` command: run (tokenize, embed, similarity, bench, the task
//! pipelines fill-mask, classify, ner, qa and nsp), train (pretrain,
//! finetune, evaluate, predict, all on the library's one training loop),
//! serve, and show (attention, embed-map). Library errors name options as
//! the library does (`max_length`); `render_error` shows the flag.
//!
//! Output is JSON Lines on stdout (or `--output FILE`, written atomically);
//! diagnostics, warnings and progress go to stderr.

mod commands;
mod model_dir;
mod output;
mod texts;
mod training;

use clap::{Parser, Subcommand};

/// The version line: whether data-parallel training over MPI is built in.
#[cfg(feature = "mpi")]
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (MPI: built in; `mpirun -np N bertha pretrain|finetune` trains data-parallel)"
);
#[cfg(not(feature = "mpi"))]
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (MPI: not built in; build with `--features mpi` for data-parallel training)"
);

#[derive(Parser)]
#[command(
    name = "bertha",
    version = VERSION,
    about = "BERT, end to end: run, train, serve and show Hugging Face BERT-family checkpoints",
    long_about = "BERT, end to end: run, train, serve and show Hugging Face BERT-family checkpoints.\n\n\
        Run: tokenize, embed, similarity, bench, fill-mask, classify, ner, qa, nsp.\n\
        Train (one training loop for every objective): pretrain (MLM, NSP), finetune (classification, \
        NER, QA, embeddings, rerankers), mine-negatives, evaluate, predict.\n\
        Rerank: rerank (a cross-encoder's scores, best first).\n\
        Serve: serve (TEI- and OpenAI-compatible HTTP).\n\
        Show: attention (heatmaps), embed-map (t-SNE / PCA maps), curves (metrics of runs).\n\n\
        Outputs match transformers / sentence-transformers; results are JSON Lines on stdout."
)]
struct Cli {
    /// Worker threads for tokenization and matrix multiplies (default: all cores).
    #[arg(long, global = true, env = "RAYON_NUM_THREADS")]
    threads: Option<usize>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Token ids, token types, attention mask, tokens and character offsets.
    Tokenize(commands::tokenize::Args),
    /// Sentence embeddings (per-token with `--pooling none`, sparse with `--pooling splade`).
    Embed(commands::embed::Args),
    /// A t-SNE / PCA map of sentence vectors coloured by label, as PNG or SVG.
    EmbedMap(commands::embed_map::Args),
    /// One chart of a metric (e.g. eval_mlm_loss) from several runs' metrics.jsonl, PNG or SVG.
    Curves(commands::curves::Args),
    /// Attention heatmap of one text (one head, or [CLS] across layers), PNG/SVG or JSON.
    Attention(commands::attention::Args),
    /// Cosine similarity matrix of the given texts' embeddings.
    Similarity(commands::similarity::Args),
    /// Embedding throughput on a text file: texts/s and tokens/s.
    Bench(commands::bench::Args),
    /// A model folder with its fast path packed in int8 or bf16, so start-up skips calibration.
    Quantize(commands::quantize::Args),
    /// HTTP server: TEI- and OpenAI-compatible routes, task routes, a web playground.
    Serve(commands::serve::Args),
    /// Fill in [MASK] tokens: the top-k tokens per mask (a masked-LM checkpoint).
    FillMask(commands::fill_mask::Args),
    /// Label scores of texts or text pairs (a sequence-classification checkpoint).
    Classify(commands::classify::Args),
    /// Named entities with character offsets (a token-classification checkpoint).
    Ner(commands::ner::Args),
    /// The answer span to a question in a context (a question-answering checkpoint).
    Qa(commands::qa::Args),
    /// Probability that TEXT_B follows TEXT_A (a checkpoint with BERT's NSP head).
    Nsp(commands::nsp::Args),
    /// Masked-LM (+NSP) or ELECTRA pre-training on plain-text corpora; checkpoints transformers loads.
    Pretrain(commands::pretrain::Args),
    /// Tokenize a pre-training corpus once into memory-mapped shards for `pretrain --corpus DIR`.
    PrepareCorpus(commands::prepare_corpus::Args),
    /// Fine-tune a classification, NER, QA or multiple-choice head, an embedding model or a reranker on a training file.
    Finetune(Box<commands::finetune::Args>),
    /// The task's metrics of a fine-tuned checkpoint on a labelled file, of sentence embeddings
    /// on pairs (sts, retrieval) or of a reranker on candidate lists, as one JSON line.
    Evaluate(commands::evaluate::Args),
    /// A fine-tuned checkpoint's predictions for a data file.
    Predict(commands::predict::Args),
    /// A cross-encoder's scores of documents for a query, best first.
    Rerank(commands::rerank::Args),
    /// Hard negatives for reranker or embedding training, mined with a bi-encoder.
    MineNegatives(commands::mine_negatives::Args),
}

/// glibc returns every buffer above 128 KiB to the kernel with `munmap` and
/// trims the heap top eagerly, so each tensor op of a training step pays
/// for fresh zeroed pages (a third of a `mini` step's CPU time went to
/// the kernel). Raise the mmap threshold to glibc's maximum and keep freed
/// memory: +50% `pretrain` tokens/s, at the cost of a heap that stays at
/// its high-water mark. `MALLOC_*` environment variables still win, as
/// glibc reads them before `main`.
fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let set = |var: &str, param: libc::c_int, value: libc::c_int| {
            if std::env::var_os(var).is_none() {
                // SAFETY: mallopt only sets allocator parameters; it runs
                // before any other thread exists.
                unsafe { libc::mallopt(param, value) };
            }
        };
        set("MALLOC_MMAP_THRESHOLD_", libc::M_MMAP_THRESHOLD, 32 << 20);
        set("MALLOC_TRIM_THRESHOLD_", libc::M_TRIM_THRESHOLD, 1 << 30);
        set("MALLOC_TOP_PAD_", libc::M_TOP_PAD, 64 << 20);
    }
}

/// glibc backs its heap with 4 KiB pages unless asked for transparent huge
/// pages (`glibc.malloc.hugetlb=1`, glibc 2.35 on, the kernel's `madvise`
/// mode): on 2 MiB pages a training step's products miss the TLB less and
/// its buffers fault in 512 times fewer (+1.1–1.8 % `small` bf16
/// `pretrain` tokens/s in A/B, the same peak RSS). glibc reads tunables
/// only as a process starts, so this one runs itself again with the
/// tunable added, before anything else happens. A `GLIBC_TUNABLES` that
/// names `glibc.malloc.hugetlb` (any value) is left as it is, and when the
/// new run cannot start, this one goes on as it is.
fn huge_page_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use std::os::unix::process::CommandExt;
        let current = std::env::var_os("GLIBC_TUNABLES");
        let Some(value) = hugetlb_tunables(current.as_ref().map(|v| v.to_str())) else {
            return;
        };
        let mut args = std::env::args_os();
        let mut again = std::process::Command::new("/proc/self/exe");
        if let Some(name) = args.next() {
            again.arg0(name);
        }
        // exec returns only when it fails.
        let _ = again.args(args).env("GLIBC_TUNABLES", value).exec();
    }
}

/// `GLIBC_TUNABLES` with huge pages for malloc added, or `None` to leave it
/// as it is: it names the tunable already, or is not UTF-8 (`Some(None)`).
#[cfg_attr(not(all(target_os = "linux", target_env = "gnu")), allow(dead_code))]
fn hugetlb_tunables(current: Option<Option<&str>>) -> Option<String> {
    const TUNABLE: &str = "glibc.malloc.hugetlb";
    match current {
        None => Some(format!("{TUNABLE}=1")),
        Some(Some(v)) if v.split(':').any(|t| t.split('=').next() == Some(TUNABLE)) => None,
        Some(Some("")) => Some(format!("{TUNABLE}=1")),
        Some(Some(v)) => Some(format!("{v}:{TUNABLE}=1")),
        Some(None) => None,
    }
}

/// Writing into a closed pipe (`bertha embed … | head`) ends the command
/// quietly, as it ends other Unix tools: Rust ignores SIGPIPE, which turns
/// it into an error or a `println!` panic. Not for `serve`, which must
/// outlive clients that hang up.
fn default_sigpipe() {
    #[cfg(unix)]
    // SAFETY: restores the default action of one signal before any
    // output is written; no handler is installed.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() {
    huge_page_heap();
    tune_allocator();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BERTHA_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    if let Some(n) = cli.threads {
        if n == 0 {
            eprintln!("error: --threads must be at least 1");
            std::process::exit(2);
        }
        // candle's matrix multiply and tokenizers both size their pools
        // from this variable; set it before either starts.
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    }
    // Subnormal gradients make a training step 10× slower; the switch is
    // process-wide, so the command sets it once here (after the thread
    // count: it also starts rayon's pool).
    bertha::fast::flush_denormals();
    if !matches!(cli.command, Command::Serve(_)) {
        default_sigpipe();
    }
    let result = match cli.command {
        Command::Tokenize(a) => commands::tokenize::run(a),
        Command::Embed(a) => commands::embed::run(a),
        Command::EmbedMap(a) => commands::embed_map::run(a),
        Command::Curves(a) => commands::curves::run(a),
        Command::Attention(a) => commands::attention::run(a),
        Command::Similarity(a) => commands::similarity::run(a),
        Command::Bench(a) => commands::bench::run(a),
        Command::Quantize(a) => commands::quantize::run(a),
        Command::Serve(a) => commands::serve::run(a),
        Command::FillMask(a) => commands::fill_mask::run(a),
        Command::Classify(a) => commands::classify::run(a),
        Command::Ner(a) => commands::ner::run(a),
        Command::Qa(a) => commands::qa::run(a),
        Command::Nsp(a) => commands::nsp::run(a),
        Command::Pretrain(a) => commands::pretrain::run(a),
        Command::PrepareCorpus(a) => commands::prepare_corpus::run(a),
        Command::Finetune(a) => commands::finetune::run(*a),
        Command::Evaluate(a) => commands::evaluate::run(a),
        Command::Predict(a) => commands::predict::run(a),
        Command::Rerank(a) => commands::rerank::run(a),
        Command::MineNegatives(a) => commands::mine_negatives::run(a),
    };
    if let Err(e) = result {
        eprintln!("error: {}", render_error(&e));
        std::process::exit(1);
    }
}

/// The error and its causes on one line, as anyhow's `{:#}` writes them,
/// with the library's option names (`max_length`) shown as the flags that
/// set them (`--max-length`). A cause its parent's message already ends
/// with (the library's `cannot read PATH: {source}`) is not repeated.
pub(crate) fn render_error(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = match cause.downcast_ref::<bertha::Error>() {
            Some(bertha::Error::Option { name, reason }) => {
                format!("{} {reason}", flag_for(name))
            }
            _ => cause.to_string(),
        };
        if out.is_empty() {
            out = text;
        } else if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
    }
    out
}

/// The flag that sets the library option `name`.
fn flag_for(name: &str) -> String {
    match name {
        // `train_wordpiece`'s size comes from `pretrain --train-tokenizer`.
        "vocab_size" => "--train-tokenizer".into(),
        _ => format!("--{}", name.replace('_', "-")),
    }
}

#[cfg(test)]
mod tests {
    use super::{hugetlb_tunables, render_error};

    /// The tunable is added once, beside the user's others, and never over
    /// a value the user chose or an environment that is not UTF-8.
    #[test]
    fn huge_pages_are_asked_for_once() {
        let on = "glibc.malloc.hugetlb=1";
        assert_eq!(hugetlb_tunables(None).as_deref(), Some(on));
        assert_eq!(hugetlb_tunables(Some(Some(""))).as_deref(), Some(on));
        assert_eq!(
            hugetlb_tunables(Some(Some("glibc.malloc.arena_max=2"))).as_deref(),
            Some("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1")
        );
        for set in [
            on,
            "glibc.malloc.hugetlb=0",
            "glibc.pthread.mutex_spin_count=9:glibc.malloc.hugetlb=2",
        ] {
            assert_eq!(hugetlb_tunables(Some(Some(set))), None, "{set}");
        }
        // A look-alike name is another tunable.
        assert_eq!(
            hugetlb_tunables(Some(Some("glibc.malloc.hugetlbx=1"))).as_deref(),
            Some("glibc.malloc.hugetlbx=1:glibc.malloc.hugetlb=1")
        );
        assert_eq!(hugetlb_tunables(Some(None)), None);
    }

    #[test]
    fn a_cause_is_written_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let e = anyhow::Error::from(bertha::Error::Io {
            path: "/x/in.txt".into(),
            source: io,
        })
        .context("reading texts");
        assert_eq!(
            render_error(&e),
            "reading texts: cannot read /x/in.txt: no such file"
        );
        let e = anyhow::Error::from(bertha::Error::option("max_length", "must be at least 1"));
        assert_eq!(render_error(&e), "--max-length must be at least 1");
    }
}
