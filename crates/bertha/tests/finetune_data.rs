//! Fine-tuning data and metrics on small committed fixtures
//! (`tests/fixtures/finetune/`, slices of the real data sets; see the
//! README there). Expected values are worked out by hand in the comments.

mod common;

use std::path::{Path, PathBuf};

use bertha::data::{
    postprocess, ClassificationData, ConllOptions, FeatureOptions, LabelKind, LabelSet, LabelValue,
    NerAligner, NerData, PostprocessOptions, ReadOptions, SquadData, SquadFeaturizer,
};
use bertha::metrics::{
    accuracy, binary_f1, entities, entity_scores, macro_f1, normalize_answer, pearson, spearman,
    squad_exact_match, squad_f1, squad_scores, Entity,
};
use bertha::model::IGNORE_INDEX;
use bertha::{Error, Tokenizer};

/// The message of a read that must fail.
fn error_of<T: std::fmt::Debug>(read: bertha::Result<T>) -> String {
    read.unwrap_err().to_string()
}

fn fixture(name: &str) -> PathBuf {
    common::fixtures().join("finetune").join(name)
}

fn tokenizer(max_length: usize) -> Tokenizer {
    Tokenizer::from_dir(&common::fixtures().join("minilm-tokenizer"), max_length).unwrap()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

// ---------------------------------------------------------------- classification

#[test]
fn sst2_dev_head() {
    // The header and the first 40 rows of GLUE SST-2 dev.tsv: 18 positive.
    let d =
        ClassificationData::read(&fixture("sst2-dev-head.tsv"), &ReadOptions::default()).unwrap();
    assert_eq!(d.len(), 40);
    assert_eq!(d.labels.names(), ["0", "1"]);
    assert_eq!(d.columns.text, "sentence");
    assert_eq!(d.columns.label.as_deref(), Some("label"));
    assert!(!d.is_pair());
    assert_eq!(d.skipped, 0);
    let first = &d.examples[0];
    // GLUE keeps a space before the tab.
    assert_eq!(
        first.text_a,
        "it 's a charming and often affecting journey . "
    );
    assert_eq!((first.label, first.line), (LabelValue::Class(1), 2));
    let ids = d.class_ids().unwrap();
    assert_eq!(ids.iter().filter(|&&c| c == 1).count(), 18);
    assert_eq!(d.examples[39].line, 41);

    // The label map written to config.json comes back the same.
    let mut cfg = bertha::BertConfig::default();
    d.labels.apply_to(&mut cfg);
    let back =
        bertha::BertConfig::from_json_str(&cfg.to_json().to_string(), Path::new("c.json")).unwrap();
    assert_eq!(
        LabelSet::from_config(&back).unwrap(),
        Some(d.labels.clone())
    );
}

#[test]
fn checkpoint_label_names_must_cover_the_file() {
    // A checkpoint labelled negative/positive cannot read SST-2's 0/1.
    let opts = ReadOptions {
        labels: Some(LabelSet::from_names(vec!["negative".into(), "positive".into()]).unwrap()),
        ..Default::default()
    };
    let path = fixture("sst2-dev-head.tsv");
    let err = error_of(ClassificationData::read(&path, &opts));
    assert_eq!(
        err,
        format!(
            "{}: line 2: unknown label `1` (the labels are `negative`, `positive`)",
            path.display()
        )
    );
    // With the training set's own map, ids are kept even if dev lacks a class.
    let opts = ReadOptions {
        labels: Some(LabelSet::from_names(vec!["0".into(), "1".into(), "2".into()]).unwrap()),
        ..Default::default()
    };
    let d = ClassificationData::read(&path, &opts).unwrap();
    assert_eq!(d.labels.len(), 3);
    assert_eq!(d.examples[1].label, LabelValue::Class(0));
}

#[test]
fn csv_sentence_pairs_with_quoting() {
    let d = ClassificationData::read(&fixture("pairs.csv"), &ReadOptions::default()).unwrap();
    assert!(d.is_pair());
    // Names sort as strings: contradiction 0, entailment 1, neutral 2.
    assert_eq!(d.labels.names(), ["contradiction", "entailment", "neutral"]);
    assert_eq!(d.examples[0].text_a, "A man, in a hat, sings.");
    assert_eq!(
        d.examples[0].text_b.as_deref(),
        Some("Someone is \"singing\".")
    );
    assert_eq!(d.class_ids().unwrap(), [1, 0, 2]);
    assert_eq!(d.examples[2].line, 4);
}

#[test]
fn jsonl_with_numeric_labels_and_blank_lines() {
    let d = ClassificationData::read(&fixture("sst2.jsonl"), &ReadOptions::default()).unwrap();
    assert_eq!(d.labels.names(), ["0", "1"]);
    assert_eq!(d.class_ids().unwrap(), [1, 0, 1]);
    // Line 3 is blank; the third example is on line 4, its é intact.
    assert_eq!(d.examples[2].line, 4);
    assert_eq!(d.examples[2].text_a, "café society, lovingly told");
    // The same numbers read as regression targets.
    let opts = ReadOptions {
        label_kind: LabelKind::Scores,
        ..Default::default()
    };
    let d = ClassificationData::read(&fixture("sst2.jsonl"), &opts).unwrap();
    assert_eq!(d.scores().unwrap(), [1.0, 0.0, 1.0]);
}

#[test]
fn malformed_rows_name_file_and_line_or_are_skipped() {
    let path = fixture("bad-rows.tsv");
    let err = error_of(ClassificationData::read(&path, &ReadOptions::default()));
    assert_eq!(
        err,
        format!(
            "{}: line 3: 3 fields, but the header has 2 (a tab inside a text?)",
            path.display()
        )
    );
    let skip = ReadOptions {
        skip_bad_rows: true,
        ..Default::default()
    };
    let d = ClassificationData::read(&path, &skip).unwrap();
    assert_eq!(d.skipped, 2);
    assert_eq!(d.bad_rows[1].line, 4);
    assert_eq!(d.bad_rows[1].reason, "empty label in column `label`");
    assert_eq!(d.len(), 2);
    assert_eq!(d.examples[1].line, 5);

    let path = fixture("bad.jsonl");
    let err = error_of(ClassificationData::read(&path, &ReadOptions::default()));
    assert!(
        err.starts_with(&format!("{}: line 2: invalid JSON", path.display())),
        "{err}"
    );
    let d = ClassificationData::read(&path, &skip).unwrap();
    assert_eq!(d.skipped, 2);
    assert_eq!(d.bad_rows[1].line, 3);
    assert_eq!(d.bad_rows[1].reason, "field `sentence` is not a string");
    // Labels come from the good rows only.
    assert_eq!(d.labels.names(), ["neg", "pos"]);
}

#[test]
fn invalid_utf8_missing_files_and_columns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("latin1.tsv");
    std::fs::write(&path, b"sentence\tlabel\nfine\t1\ncaf\xe9\t0\n").unwrap();
    let err = error_of(ClassificationData::read(&path, &ReadOptions::default()));
    assert_eq!(
        err,
        format!(
            "{}: line 3: column `sentence`: invalid UTF-8 at byte 3 of the field",
            path.display()
        )
    );
    let conll = dir.path().join("latin1.conll");
    std::fs::write(&conll, b"a O\n\ncaf\xe9 B-LOC\n").unwrap();
    let err = error_of(NerData::read(&conll, &ConllOptions::default()));
    assert_eq!(
        err,
        format!(
            "{}: line 3: invalid UTF-8 at byte 3 of the line",
            conll.display()
        )
    );

    let missing = dir.path().join("nope.tsv");
    let err = ClassificationData::read(&missing, &ReadOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
    assert!(err.to_string().contains("nope.tsv"));

    let empty = dir.path().join("empty.csv");
    std::fs::write(&empty, b"").unwrap();
    let err = ClassificationData::read(&empty, &ReadOptions::default()).unwrap_err();
    assert!(
        err.to_string().contains("empty.csv: the file is empty"),
        "{err}"
    );

    let opts = ReadOptions {
        label_column: Some("gold".into()),
        ..Default::default()
    };
    let err = error_of(ClassificationData::read(&fixture("pairs.csv"), &opts));
    assert!(
        err.ends_with(
            "no label column `gold` in the header (it has `sentence1`, `sentence2`, `label`)"
        ),
        "{err}"
    );
}

// ---------------------------------------------------------------- CoNLL

#[test]
fn conll_valid_head() {
    // -DOCSTART- and the first 3 sentences of CoNLL-2003 valid.txt (IOB2).
    let d = NerData::read(&fixture("conll-valid-head.txt"), &ConllOptions::default()).unwrap();
    assert_eq!(d.documents, 1);
    assert_eq!(d.retagged, 0, "the shared CoNLL-2003 copy is IOB2 already");
    let lens: Vec<usize> = d.sentences.iter().map(|s| s.words.len()).collect();
    assert_eq!(lens, [11, 2, 35]);
    assert_eq!(d.sentences[0].line, 3);
    assert_eq!(d.sentences[1].words, ["LONDON", "1996-08-30"]);
    assert_eq!(d.sentences[1].tags, ["B-LOC", "O"]);
    // O first, then B-/I- per type in sorted order.
    assert_eq!(
        d.labels.names(),
        ["O", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER", "I-PER"]
    );
    assert_eq!(d.sentences[2].tag_ids[..5], [3, 4, 0, 7, 8]);
    // Gold against itself: every entity right. Entities: LEICESTERSHIRE
    // (ORG), LONDON (LOC), West Indian (MISC), Phil Simmons (PER),
    // Leicestershire and Somerset (ORG) = 6.
    let s = entity_scores(&d.tags(), &d.tags()).unwrap();
    assert_eq!((s.overall.support, s.overall.correct), (6, 6));
    assert!(close(s.overall.f1, 1.0));
    assert_eq!(s.per_type["ORG"].support, 3);
}

#[test]
fn conll_iob1_is_converted_to_iob2() {
    let d = NerData::read(&fixture("conll-iob1.txt"), &ConllOptions::default()).unwrap();
    // Sentence 1: I-ORG, I-PER and I-LOC each start an entity → B- (3).
    // Sentence 2: Germany I-LOC → B-LOC; France B-LOC stays (IOB1's B- marks
    // a second adjacent LOC); New I-LOC after O → B-LOC; York continues (2).
    assert_eq!(d.retagged, 5);
    assert_eq!(
        d.sentences[0].tags,
        ["B-ORG", "O", "B-PER", "O", "O", "B-LOC", "O"]
    );
    assert_eq!(
        d.sentences[1].tags,
        ["B-LOC", "B-LOC", "O", "B-LOC", "I-LOC"]
    );
    let e = entities(&d.sentences[1].tags);
    let loc = |start, end| Entity {
        kind: "LOC".into(),
        start,
        end,
    };
    assert_eq!(e, [loc(0, 1), loc(1, 2), loc(3, 5)]);
}

#[test]
fn conll_bad_line() {
    let path = fixture("conll-bad.txt");
    let err = error_of(NerData::read(&path, &ConllOptions::default()));
    assert_eq!(
        err,
        format!(
            "{}: line 7: expected a word and a tag separated by whitespace, got `call`",
            path.display()
        )
    );
    let d = NerData::read(
        &path,
        &ConllOptions {
            skip_bad_rows: true,
            ..Default::default()
        },
    )
    .unwrap();
    // The whole sentence with the bad line goes.
    assert_eq!((d.len(), d.skipped, d.bad_rows[0].line), (2, 1, 7));
    assert_eq!(d.sentences[1].words, ["Peter"]);
}

#[test]
fn labels_land_on_first_word_pieces() {
    let d = NerData::read(&fixture("conll-valid-head.txt"), &ConllOptions::default()).unwrap();
    let tok = tokenizer(512);
    let aligner = NerAligner::new(&tok, 128).unwrap();
    let all = aligner.align_all(&d.sentences).unwrap();
    assert_eq!(all.len(), 3);

    // "LONDON 1996-08-30": the date splits into 1996 - 08 - 30, all word 1.
    let a = &all[1];
    let tokens: Vec<String> = a
        .input_ids
        .iter()
        .map(|&i| tok.id_to_token(i).unwrap())
        .collect();
    assert_eq!(
        tokens,
        ["[CLS]", "london", "1996", "-", "08", "-", "30", "[SEP]"]
    );
    assert_eq!(
        a.word_ids,
        [
            None,
            Some(0),
            Some(1),
            Some(1),
            Some(1),
            Some(1),
            Some(1),
            None
        ]
    );
    // B-LOC (1) on london, O (0) on 1996, -100 on the rest.
    assert_eq!(a.labels, [-100, 1, 0, -100, -100, -100, -100, -100]);
    assert_eq!(a.token_type_ids, [0; 8]);
    assert_eq!((a.words, a.words_truncated, a.words_empty), (2, 0, 0));

    // "West Indian all-rounder Phil Simmons ...": all-rounder is
    // all - round ##er, labelled once (O) on `all`.
    let a = &all[2];
    let tokens: Vec<String> = a.input_ids[..10]
        .iter()
        .map(|&i| tok.id_to_token(i).unwrap())
        .collect();
    assert_eq!(
        tokens,
        ["[CLS]", "west", "indian", "all", "-", "round", "##er", "phil", "simmons", "took"]
    );
    // B-MISC 3, I-MISC 4, O 0, B-PER 7, I-PER 8.
    assert_eq!(a.labels[..10], [-100, 3, 4, 0, -100, -100, -100, 7, 8, 0]);
    assert_eq!(*a.labels.last().unwrap(), IGNORE_INDEX);
    // Each word labelled exactly once: 35 labels.
    assert_eq!(a.labels.iter().filter(|&&l| l != IGNORE_INDEX).count(), 35);

    // Predictions back to words: the first piece decides (pieces 4..6 of
    // all-rounder predict B-PER but are ignored).
    let mut pred = vec![0usize; a.len() + 3]; // + padding
    pred[1] = 3;
    pred[2] = 4;
    pred[4] = 7;
    pred[5] = 7;
    pred[7] = 7;
    pred[8] = 8;
    let tags = a.word_tags(&pred, &d.labels).unwrap();
    assert_eq!(tags[..6], ["B-MISC", "I-MISC", "O", "B-PER", "I-PER", "O"]);
}

#[test]
fn truncated_words_are_counted_and_predicted_o() {
    let d = NerData::read(&fixture("conll-valid-head.txt"), &ConllOptions::default()).unwrap();
    let tok = tokenizer(512);
    // 7 tokens: [CLS] west indian all - round [SEP]; all-rounder keeps its
    // first piece, so 3 of 35 words stay and 32 are truncated.
    let aligner = NerAligner::new(&tok, 7).unwrap();
    let s = &d.sentences[2];
    let a = aligner.align(&s.words, Some(&s.tag_ids)).unwrap();
    assert_eq!(a.len(), 7);
    assert_eq!(a.labels, [-100, 3, 4, 0, -100, -100, -100]);
    assert_eq!(a.words_truncated, 32);
    assert_eq!(
        *a.input_ids.last().unwrap(),
        tok.token_to_id("[SEP]").unwrap()
    );
    // Predict B-ORG (5) everywhere: words kept get B-ORG, truncated ones O.
    let tags = a.word_tags(&[5; 7], &d.labels).unwrap();
    assert_eq!(tags.len(), 35);
    assert_eq!(tags[..4], ["B-ORG", "B-ORG", "B-ORG", "O"]);
    assert!(tags[3..].iter().all(|t| t == "O"));
    // A length that leaves no room for words is an error.
    assert!(NerAligner::new(&tok, 2).is_err());
}

// ---------------------------------------------------------------- SQuAD

#[test]
fn squad_slice_reads() {
    // Super_Bowl_50, paragraphs 0, 1 and 3 of dev-v1.1.json: 30 + 25 + 26.
    let d = SquadData::read(&fixture("squad-dev-slice.json")).unwrap();
    assert_eq!(
        (d.version.as_str(), d.articles, d.paragraphs, d.len()),
        ("1.1", 1, 3, 81)
    );
    let e = &d.examples[0];
    assert_eq!(e.id, "56be4db0acb8001400a502ec");
    assert_eq!(
        e.question,
        "Which NFL team represented the AFC at Super Bowl 50?"
    );
    assert_eq!(e.answers.len(), 3);
    assert_eq!(
        (e.answers[0].text.as_str(), e.answers[0].start),
        ("Denver Broncos", 177)
    );
    // Paragraph 3: "... guest performers Beyoncé and Bruno Mars": offsets
    // count characters, and é is one.
    let b = d
        .examples
        .iter()
        .find(|e| e.id == "56beaf5e3aeaaa14008c9200")
        .unwrap();
    assert_eq!(
        (b.answers[0].text.as_str(), b.answers[0].start),
        ("Bruno Mars", 245)
    );

    let path = fixture("squad-bad-offset.json");
    let err = SquadData::read(&path).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "{}: data[0].paragraphs[0].qas[2] (id 56be5333acb8001400a5030c).answers[1]: the \
             context at character 195 is `oldplay `, not the answer text `Coldplay`",
            path.display()
        )
    );
}

#[test]
fn squad_windows_hold_the_answer_tokens() {
    let d = SquadData::read(&fixture("squad-dev-slice.json")).unwrap();
    let tok = tokenizer(512);
    let opts = FeatureOptions {
        max_length: 64,
        doc_stride: 16,
    };
    let fz = SquadFeaturizer::new(&tok, opts).unwrap();
    let features = fz.features_all(&d.examples).unwrap();
    let cls = tok.token_to_id("[CLS]").unwrap();
    let sep = tok.token_to_id("[SEP]").unwrap();

    // The first question: 11 question tokens (which nfl team represented
    // the afc at super bowl 50 ?) leave 64 - 3 - 11 = 50 context tokens per
    // window; paragraph 0 is cut into several windows
    // that share 16 tokens.
    let first: Vec<_> = features.iter().filter(|f| f.example_index == 0).collect();
    assert!(first.len() > 2, "{} windows", first.len());
    for pair in first.windows(2) {
        let a: Vec<_> = pair[0].offsets.iter().flatten().collect();
        let b: Vec<_> = pair[1].offsets.iter().flatten().collect();
        assert_eq!(a[a.len() - 16..], b[..16]);
    }
    let f = first[0];
    assert_eq!(f.len(), 64);
    assert_eq!(
        (f.input_ids[0], f.input_ids[12], f.input_ids[63]),
        (cls, sep, sep)
    );
    assert_eq!(f.token_type_ids[..13], [0; 13]);
    assert_eq!(f.token_type_ids[13..], [1; 51]);
    assert_eq!(
        f.context_tokens().collect::<Vec<_>>(),
        (13..63).collect::<Vec<_>>()
    );
    assert_eq!(f.offsets[13], Some((0, 5))); // "Super"
                                             // "Denver Broncos" (characters 177..191) is in window 0.
    let answer = tok
        .decode(&f.input_ids[f.start_position..=f.end_position], true)
        .unwrap();
    assert_eq!(answer, "denver broncos");

    // The answer tokens decode to the answer, except for the 4 gold answers
    // that are part of a word piece ("gold" of "golden", ...).
    let mut inside_pieces = std::collections::BTreeSet::new();
    for (i, ex) in d.examples.iter().enumerate() {
        let mine: Vec<_> = features.iter().filter(|f| f.example_index == i).collect();
        let with_answer: Vec<_> = mine.iter().filter(|f| f.start_position > 0).collect();
        // Answers are short, windows overlap by 16: some window holds each.
        assert!(!with_answer.is_empty(), "{}", ex.id);
        let gold = &ex.answers[0];
        let want = tok
            .decode(&tok.encode(&gold.text).unwrap().input_ids, true)
            .unwrap();
        for f in with_answer {
            let got = tok
                .decode(&f.input_ids[f.start_position..=f.end_position], true)
                .unwrap();
            if got != want {
                assert!(got.contains(&want), "{}: {got}", ex.id);
                inside_pieces.insert(got);
            }
            let (s, e) = (
                f.offsets[f.start_position].unwrap(),
                f.offsets[f.end_position].unwrap(),
            );
            assert!(s.0 <= gold.start && e.1 >= gold.start + gold.text.chars().count());
        }
        // Windows without the whole answer point at [CLS].
        for f in mine.iter().filter(|f| f.start_position == 0) {
            assert_eq!(f.end_position, 0);
        }
    }
    assert_eq!(
        inside_pieces.into_iter().collect::<Vec<_>>(),
        ["12", "18", "49", "golden"]
    );

    // A question that leaves no more context room than the stride.
    let tight = SquadFeaturizer::new(
        &tok,
        FeatureOptions {
            max_length: 30,
            doc_stride: 16,
        },
    )
    .unwrap();
    let err = tight.features(0, &d.examples[0]).unwrap_err().to_string();
    // 30 - 3 - 11 = 16 context tokens, not more than the stride of 16.
    assert!(
        err.starts_with("question 56be4db0acb8001400a502ec: its 11 tokens leave 16"),
        "{err}"
    );
}

#[test]
fn squad_postprocess_recovers_gold_spans() {
    // Logits that peak at each feature's gold positions give back the gold
    // text, cut from the original context (case, "$", "é" and all), except
    // where the first gold answer is part of a word piece: 4 of the 81 (gold
    // "gold" in "golden", "8" in "18", "4" in "49", "2" in "12"), where the
    // whole piece comes back, as in transformers.
    let d = SquadData::read(&fixture("squad-dev-slice.json")).unwrap();
    let tok = tokenizer(512);
    let fz = SquadFeaturizer::new(
        &tok,
        FeatureOptions {
            max_length: 96,
            doc_stride: 32,
        },
    )
    .unwrap();
    let features = fz.features_all(&d.examples).unwrap();
    let mut starts = Vec::new();
    let mut ends = Vec::new();
    for f in &features {
        let mut s = vec![0.0f32; f.len() + 5]; // + padding
        let mut e = s.clone();
        if f.start_position > 0 {
            s[f.start_position] = 10.0;
            e[f.end_position] = 10.0;
        }
        // The question tokens score higher still, and are never answers.
        s[1] = 50.0;
        e[1] = 50.0;
        starts.push(s);
        ends.push(e);
    }
    let preds = postprocess(
        &d.examples,
        &features,
        &starts,
        &ends,
        &PostprocessOptions::default(),
    )
    .unwrap();
    assert_eq!(preds.len(), d.len());
    let mut inside_pieces = Vec::new();
    for (p, ex) in preds.iter().zip(&d.examples) {
        let gold = &ex.answers[0];
        assert_eq!(p.id, ex.id);
        assert_eq!(p.score, 20.0);
        if p.text != gold.text {
            inside_pieces.push(p.text.as_str());
            assert!(p.text.contains(&gold.text), "{}: {}", ex.id, p.text);
        }
        let end = gold.start + gold.text.chars().count();
        assert!(p.start <= gold.start && p.end >= end, "{}", ex.id);
        let context: Vec<char> = ex.context.chars().collect();
        assert_eq!(p.text, context[p.start..p.end].iter().collect::<String>());
    }
    assert_eq!(inside_pieces, ["golden", "18", "49", "12"]);
    // Those 4 match no gold answer (EM 0, F1 0): 77 of 81 right.
    let scores = d.evaluate(&preds);
    assert_eq!((scores.total, scores.answered), (81, 81));
    assert!(close(scores.exact_match, 100.0 * 77.0 / 81.0));
    assert!(close(scores.f1, 100.0 * 77.0 / 81.0));
    // Dropping the first prediction (a right one): the official script
    // scores the unanswered question 0.
    let scores = d.evaluate(&preds[1..]);
    assert!(close(scores.exact_match, 100.0 * 76.0 / 81.0));
    // Mismatched logit rows are an error.
    assert!(postprocess(
        &d.examples,
        &features,
        &starts[1..],
        &ends,
        &PostprocessOptions::default()
    )
    .is_err());
}

// ---------------------------------------------------------------- metrics

#[test]
fn seqeval_entity_scores_worked_example() {
    // Gold                               Pred
    // 1: B-PER I-PER O B-LOC             B-PER I-PER O O        PER ✓, LOC missed
    // 2: B-ORG O                         B-ORG O                ORG ✓
    // 3: O B-MISC I-MISC                 O B-MISC O             MISC(1..2) ≠ MISC(1..3)
    // Gold entities 4, predicted 3, correct 2:
    // P = 2/3, R = 2/4, F1 = 2·(2/3)(1/2) / (2/3 + 1/2) = (2/3) / (7/6) = 4/7.
    // Tokens: 9, two differ → accuracy 7/9.
    let gold = vec![
        vec!["B-PER", "I-PER", "O", "B-LOC"],
        vec!["B-ORG", "O"],
        vec!["O", "B-MISC", "I-MISC"],
    ];
    let pred = vec![
        vec!["B-PER", "I-PER", "O", "O"],
        vec!["B-ORG", "O"],
        vec!["O", "B-MISC", "O"],
    ];
    let s = entity_scores(&gold, &pred).unwrap();
    assert!(close(s.overall.precision, 2.0 / 3.0));
    assert!(close(s.overall.recall, 0.5));
    assert!(close(s.overall.f1, 4.0 / 7.0));
    assert_eq!(
        (s.overall.support, s.overall.predicted, s.overall.correct),
        (4, 3, 2)
    );
    assert!(close(s.token_accuracy, 7.0 / 9.0));
    // Per type: PER and ORG perfect; LOC never predicted → P = 0 (zero
    // division), R = 0; MISC predicted once, wrong → 0 / 0 / 0.
    assert!(close(s.per_type["PER"].f1, 1.0) && close(s.per_type["ORG"].f1, 1.0));
    assert_eq!(
        (s.per_type["LOC"].predicted, s.per_type["LOC"].f1),
        (0, 0.0)
    );
    assert_eq!(
        (s.per_type["MISC"].predicted, s.per_type["MISC"].f1),
        (1, 0.0)
    );
    assert_eq!(s.per_type.len(), 4);
}

#[test]
fn seqeval_i_without_b_starts_an_entity() {
    // conlleval / seqeval default mode: `I-PER` after `O` starts a PER
    // chunk, so "O I-PER I-PER" is the entity (1..3) and matches the gold
    // "O B-PER I-PER" (strict IOB2 mode would not count it).
    let s = entity_scores(
        &[vec!["O", "B-PER", "I-PER"]],
        &[vec!["O", "I-PER", "I-PER"]],
    )
    .unwrap();
    assert_eq!((s.overall.correct, s.overall.predicted), (1, 1));
    assert!(close(s.overall.f1, 1.0));
    // "B-LOC I-PER": the type change ends LOC and starts PER: two predicted
    // entities, neither is the gold LOC (0..2). P = 0/2, R = 0/1.
    let s = entity_scores(&[vec!["B-LOC", "I-LOC"]], &[vec!["B-LOC", "I-PER"]]).unwrap();
    assert_eq!(
        (s.overall.correct, s.overall.predicted, s.overall.support),
        (0, 2, 1)
    );
    assert_eq!(s.overall.f1, 0.0);
    assert!(
        s.per_type.contains_key("PER"),
        "types only predicted are reported"
    );
    // Sentences of different lengths are an error, not a panic.
    assert!(entity_scores(&[vec!["O"]], &[vec!["O", "O"]]).is_err());
}

#[test]
fn squad_normalisation_and_f1() {
    // lower → "the  cat!" → drop punctuation → "the  cat" → drop article →
    // "   cat" → collapse → "cat".
    assert_eq!(normalize_answer("The  Cat!"), "cat");
    assert_eq!(squad_exact_match("The  Cat!", "cat"), 1.0);
    // "an" inside a word stays; "A" as a word goes; "_" is punctuation.
    assert_eq!(
        normalize_answer("A banana_split, an ANT"),
        "bananasplit ant"
    );
    // Partial overlap: pred {denver, broncos, team} vs gold {denver,
    // broncos}: 2 shared, P = 2/3, R = 1, F1 = 2·(2/3)/(5/3) = 4/5.
    assert!(close(
        squad_f1("the Denver Broncos team", "Denver Broncos"),
        0.8
    ));
    assert_eq!(
        squad_exact_match("the Denver Broncos team", "Denver Broncos"),
        0.0
    );
    // Tokens are a multiset: "new york new york" vs "new york" shares 2
    // of 4: P = 1/2, R = 1, F1 = 2/3.
    assert!(close(squad_f1("new york new york", "New York"), 2.0 / 3.0));
    assert_eq!(squad_f1("Broncos", "Panthers"), 0.0);

    // Three questions: q1 partial (EM 0, F1 0.8), q2 best of two golds
    // ("Broncos" matches the second: EM 1, F1 1), q3 unanswered (0, 0).
    // EM = 100·1/3, F1 = 100·1.8/3 = 60.
    let s = squad_scores([
        (Some("the Denver Broncos team"), vec!["Denver Broncos"]),
        (Some("Broncos"), vec!["Denver Broncos", "broncos"]),
        (None, vec!["Carolina Panthers"]),
    ]);
    assert!(close(s.exact_match, 100.0 / 3.0));
    assert!(close(s.f1, 60.0));
    assert_eq!((s.total, s.answered), (3, 2));
}

#[test]
fn classification_metrics_worked_example() {
    // gold 1 1 0 0 1 0, pred 1 0 0 1 1 0: 4 right of 6.
    // class 1: TP 2, FP 1, FN 1 → F1 = 4/6; class 0: TP 2, FP 1, FN 1 → 4/6.
    let gold = [1, 1, 0, 0, 1, 0];
    let pred = [1, 0, 0, 1, 1, 0];
    assert!(close(accuracy(&pred, &gold).unwrap(), 4.0 / 6.0));
    assert!(close(binary_f1(&pred, &gold, 1).unwrap(), 2.0 / 3.0));
    assert!(close(macro_f1(&pred, &gold).unwrap(), 2.0 / 3.0));
    // Pearson of (1, 2, 3) and (1, 3, 2): means 2 and 2; deviations
    // (-1, 0, 1) and (-1, 1, 0): Σxy = 1, Σx² = Σy² = 2 → r = 1/2.
    assert!(close(
        pearson(&[1.0, 2.0, 3.0], &[1.0, 3.0, 2.0]).unwrap(),
        0.5
    ));
    // Spearman uses ranks: (10, 20, 30) vs (1, 300, 20) ranks (1, 3, 2) → 1/2.
    assert!(close(
        spearman(&[10.0, 20.0, 30.0], &[1.0, 300.0, 20.0]).unwrap(),
        0.5
    ));
}
