use std::path::Path;

use super::*;
use crate::error::Result;

fn parse(json: &str) -> Result<BertConfig> {
    BertConfig::from_json_str(json, Path::new("config.json"))
}

#[test]
fn empty_object_gives_transformers_defaults() {
    assert_eq!(parse("{}").unwrap(), BertConfig::default());
}

#[test]
fn unknown_model_type_names_the_field() {
    let err = parse(r#"{"model_type": "gpt2"}"#).unwrap_err().to_string();
    assert!(err.contains("model_type") && err.contains("gpt2"), "{err}");
}

#[test]
fn unsupported_options_name_the_field() {
    for (json, field) in [
        (
            r#"{"position_embedding_type": "relative_key"}"#,
            "position_embedding_type",
        ),
        (r#"{"is_decoder": true}"#, "is_decoder"),
        (r#"{"hidden_act": "mish"}"#, "hidden_act"),
        (
            r#"{"hidden_size": 10, "num_attention_heads": 3}"#,
            "num_attention_heads",
        ),
        (r#"{"hidden_size": "big"}"#, "hidden_size"),
        (r#"{"norm_position": "middle"}"#, "norm_position"),
    ] {
        let err = parse(json).unwrap_err().to_string();
        assert!(err.contains(field), "{json}: {err}");
    }
}

#[test]
fn mini_bert_round_trips_through_json() {
    let cfg = BertConfig::mini_bert_seed();
    let json = cfg.to_json().to_string();
    assert_eq!(parse(&json).unwrap(), cfg);
}

#[test]
fn head_options_are_read_and_checked() {
    let cfg = parse(
        r#"{"problem_type": "multi_label_classification", "classifier_dropout": 0.3, "num_labels": 3}"#,
    )
    .unwrap();
    assert_eq!(
        cfg.problem_type,
        Some(ProblemType::MultiLabelClassification)
    );
    assert_eq!(cfg.classifier_dropout, Some(0.3));
    assert_eq!(cfg.num_labels(), 3);
    assert_eq!(cfg.label_name(2), "LABEL_2");
    let back = parse(&cfg.to_json().to_string()).unwrap();
    assert_eq!(back.problem_type, cfg.problem_type);
    assert_eq!(back.classifier_dropout, cfg.classifier_dropout);
    assert_eq!(back.id2label, cfg.id2label);
    for (json, field) in [
        (r#"{"problem_type": "ranking"}"#, "problem_type"),
        (r#"{"classifier_dropout": 1.5}"#, "classifier_dropout"),
        (r#"{"id2label": {"0": "A", "2": "C"}}"#, "id2label"),
    ] {
        let err = parse(json).unwrap_err().to_string();
        assert!(err.contains(field), "{json}: {err}");
    }
    assert_eq!(parse("{}").unwrap().num_labels(), 2);
}

#[test]
fn family_configs_read_their_own_keys_and_round_trip() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny");
    for name in [
        "roberta-mlm",
        "distilbert-mlm",
        "albert-mlm",
        "deberta-v2-mlm",
    ] {
        let cfg = BertConfig::from_file(&dir.join(name).join("config.json")).unwrap();
        assert_eq!(cfg.hidden_size, 32, "{name}");
        assert_eq!(cfg.num_attention_heads, 4, "{name}");
        assert_eq!(cfg.intermediate_size, 37, "{name}");
        let back = parse(&cfg.to_json().to_string()).unwrap();
        assert_eq!(back, cfg, "{name}");
    }
    let distil = parse(r#"{"model_type": "distilbert", "dim": 64, "n_layers": 3, "n_heads": 2, "hidden_dim": 99, "activation": "relu"}"#).unwrap();
    assert_eq!(
        (
            distil.hidden_size,
            distil.num_hidden_layers,
            distil.num_attention_heads,
            distil.intermediate_size
        ),
        (64, 3, 2, 99)
    );
    assert_eq!(distil.hidden_act, Activation::Relu);
    assert_eq!(distil.type_vocab_size, 0);
    let roberta = parse(r#"{"model_type": "roberta", "max_position_embeddings": 514}"#).unwrap();
    assert_eq!(roberta.pad_token_id, 1);
    assert_eq!(roberta.max_sequence_length(), 512);
    let albert = parse(r#"{"model_type": "albert"}"#).unwrap();
    assert_eq!(albert.hidden_act, Activation::GeluTanh);
    assert_eq!(albert.embedding_size(), 128);
    let deberta = parse(r#"{"model_type": "deberta-v2", "relative_attention": true, "pos_att_type": "p2c|c2p", "position_buckets": 256, "hidden_size": 64, "num_attention_heads": 4}"#).unwrap();
    let Family::DebertaV2(o) = &deberta.family else {
        panic!("not deberta")
    };
    assert!(o.c2p && o.p2c && !o.share_att_key);
    assert_eq!((o.att_span(), o.max_relative_positions), (256, 512));
    for (json, field) in [
        (
            r#"{"model_type": "distilbert", "activation": "swish"}"#,
            "activation",
        ),
        (r#"{"model_type": "distilbert", "dim": "wide"}"#, "dim"),
        (
            r#"{"model_type": "albert", "num_hidden_groups": 0}"#,
            "num_hidden_groups",
        ),
        (
            r#"{"model_type": "deberta-v2", "pos_att_type": ["p2p"]}"#,
            "pos_att_type",
        ),
        (
            r#"{"model_type": "deberta-v2", "conv_kernel_size": 3}"#,
            "conv_kernel_size",
        ),
        (
            r#"{"model_type": "roberta", "max_position_embeddings": 2}"#,
            "max_position_embeddings",
        ),
    ] {
        let err = parse(json).unwrap_err().to_string();
        assert!(err.contains(field), "{json}: {err}");
    }
}

#[test]
fn id2label_keys_become_integers() {
    let cfg = parse(r#"{"id2label": {"0": "NEG", "1": "POS"}}"#).unwrap();
    assert_eq!(cfg.id2label.get(&1).map(String::as_str), Some("POS"));
}

#[test]
fn electra_summary_keys_are_read_round_trip_and_resolve_as_transformers() {
    let electra = |keys: &str| {
        parse(&format!(
            r#"{{"model_type": "electra", "architectures": ["ElectraForMultipleChoice"]{keys}}}"#
        ))
    };
    let resolve = |cfg: &BertConfig| cfg.sequence_summary(Path::new("config.json"));
    // ElectraConfig's defaults: the first token → layer → gelu, 0.1 after.
    let cfg = electra("").unwrap();
    let spec = resolve(&cfg).unwrap().unwrap();
    assert_eq!(
        spec,
        SummarySpec {
            token: SummaryToken::First,
            projection: true,
            activation: Some(Activation::Gelu),
            first_dropout: 0.0,
            last_dropout: 0.1,
        }
    );
    assert_eq!(parse(&cfg.to_json().to_string()).unwrap(), cfg);
    let cfg = electra(
        r#", "summary_type": "mean", "summary_use_proj": false, "summary_activation": null,
        "summary_first_dropout": 0.2, "summary_last_dropout": -1"#,
    )
    .unwrap();
    let spec = resolve(&cfg).unwrap().unwrap();
    assert_eq!(
        (spec.token, spec.projection, spec.activation),
        (SummaryToken::Mean, false, None)
    );
    // transformers applies no dropout at a rate ≤ 0.
    assert_eq!((spec.first_dropout, spec.last_dropout), (0.2, 0.0));
    let back = parse(&cfg.to_json().to_string()).unwrap();
    assert_eq!(back, cfg);
    assert_eq!(back.to_json()["summary_activation"], "");
    // `cls_index` without an index is the last row.
    let cfg = electra(r#", "summary_type": "cls_index", "summary_activation": "tanh""#).unwrap();
    let spec = resolve(&cfg).unwrap().unwrap();
    assert_eq!(
        (spec.token, spec.activation),
        (SummaryToken::Last, Some(Activation::Tanh))
    );
    // Labels as many as the hidden size keep the classifier's width.
    let labels: Vec<String> = (0..256).map(|i| format!(r#""{i}": "L{i}""#)).collect();
    let wide = format!(
        r#", "summary_proj_to_labels": true, "id2label": {{{}}}"#,
        labels.join(", ")
    );
    assert!(
        resolve(&electra(&wide).unwrap())
            .unwrap()
            .unwrap()
            .projection
    );
    // What the module cannot run loads (a sequence classifier does not
    // read it) and is refused by name when the summary is built.
    for (keys, field) in [
        (r#", "summary_type": "attn""#, "summary_type"),
        (r#", "summary_type": "max""#, "summary_type"),
        (r#", "summary_activation": "silu""#, "summary_activation"),
        (
            r#", "summary_proj_to_labels": true"#,
            "summary_proj_to_labels",
        ),
        (r#", "summary_first_dropout": 1.0"#, "summary_first_dropout"),
    ] {
        let err = resolve(&electra(keys).unwrap()).unwrap_err().to_string();
        assert!(
            err.contains(&format!("config.json: field `{field}`")),
            "{keys}: {err}"
        );
    }
    let err = electra(r#", "summary_use_proj": "yes""#)
        .unwrap_err()
        .to_string();
    assert!(err.contains("summary_use_proj"), "{err}");
    assert!(resolve(&parse("{}").unwrap()).unwrap().is_none());
}
