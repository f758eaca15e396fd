#!/usr/bin/env bash
# What keeping DeBERTa-v2 on the candle path costs: SST-2 fine-tuning speed of
# a DeBERTa-v3-small-shaped model (6 layers, hidden 768, 12 heads, relative
# position buckets 256, random weights) on bertha (candle: the fast engine does
# not run disentangled attention) and on PyTorch (transformers), beside a BERT
# of the same width and depth on bertha (fast engine) and on PyTorch; one after
# the other, the first N training sentences, 1 epoch, batch 32, max length 64,
# AdamW lr 1e-4, fp32. Both models use bert-base-uncased's vocabulary, so the
# attention is the only difference.
#
#   scripts/bench-deberta-finetune.sh        # N=640
#
# Env: N, DATA (../shared/data), REFENV (~/.refenv: Python with transformers),
# OUT (.cache/bench-deberta). Prints examples/s per run.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-640}
DATA=${DATA:-../shared/data}
REFENV=${REFENV:-$HOME/.refenv}
OUT=${OUT:-.cache/bench-deberta}
PY=$REFENV/bin/python
mkdir -p "$OUT"
cargo build --release -p bertha-cli --quiet
BERTHA="${CARGO_TARGET_DIR:-target}/release/bertha"
lscpu | grep 'Model name' | sed 's/ \+/ /g'

# The two models, random weights of the real shapes, bert-base-uncased's tokenizer.
"$PY" - "$OUT" "$DATA/vocab/bert-base-uncased" <<'EOF'
import os, sys
import torch
from transformers import (BertConfig, BertForSequenceClassification, BertTokenizerFast,
                          DebertaV2Config, DebertaV2ForSequenceClassification)
out, vocab = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
tok = BertTokenizerFast(os.path.join(vocab, "vocab.txt"), do_lower_case=True)
shape = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=6, num_attention_heads=12,
             intermediate_size=3072, max_position_embeddings=512, num_labels=2)
deberta = DebertaV2Config(**shape, relative_attention=True, position_buckets=256, max_relative_positions=-1,
                          pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm", share_att_key=True,
                          position_biased_input=False, type_vocab_size=0, pad_token_id=0)
for name, model in [("deberta", DebertaV2ForSequenceClassification(deberta)),
                    ("bert", BertForSequenceClassification(BertConfig(**shape)))]:
    path = os.path.join(out, name)
    if not os.path.exists(os.path.join(path, "model.safetensors")):
        model.save_pretrained(path)
        tok.save_pretrained(path)
EOF

head -n $((N + 1)) "$DATA/sst2/train.tsv" > "$OUT/train.tsv"
for name in deberta bert; do
    "$BERTHA" finetune --task classification --model "$OUT/$name" --train "$OUT/train.tsv" \
        --dev "$DATA/sst2/dev.tsv" --out "$OUT/bertha-$name" --epochs 1 --lr 1e-4 --weight-decay 0.01 \
        --warmup-ratio 0.1 --batch-size 32 --max-length 64 --seed 0 --overwrite >/dev/null 2>&1
    python3 - "$OUT/bertha-$name" "$N" "$name" <<'EOF'
import json, sys
steps = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl") if '"loss"' in l]
el = steps[-1]["elapsed_s"]
print(f"bertha {sys.argv[3]}: {int(sys.argv[2]) / el:.1f} examples/s ({el:.0f} s)")
EOF
done

# PyTorch: the same recipe, dynamic padding, dropout on.
"$PY" - "$OUT" "$N" <<'EOF' 2>/dev/null
import os, random, sys, time
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, get_linear_schedule_with_warmup
out, n = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(os.cpu_count())
rows = [l.rstrip("\n").split("\t") for l in open(f"{out}/train.tsv", encoding="utf-8")][1:n + 1]
train = [(s.strip(), int(y)) for s, y in rows]
for name in ["deberta", "bert"]:
    torch.manual_seed(0); random.seed(0)
    tok = AutoTokenizer.from_pretrained(f"{out}/{name}")
    model = AutoModelForSequenceClassification.from_pretrained(f"{out}/{name}")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    steps = (len(train) + 31) // 32
    sched = get_linear_schedule_with_warmup(opt, steps // 10, steps)
    model.train()
    t = time.time()
    for i in range(0, len(train), 32):
        b = train[i:i + 32]
        e = tok([s for s, _ in b], padding=True, truncation=True, max_length=64, return_tensors="pt")
        loss = model(**e, labels=torch.tensor([y for _, y in b])).loss
        loss.backward(); opt.step(); sched.step(); opt.zero_grad()
    el = time.time() - t
    print(f"PyTorch {name}: {len(train) / el:.1f} examples/s ({el:.0f} s)")
EOF
