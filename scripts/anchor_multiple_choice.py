"""Anchor for `bertha finetune --task multiple-choice`: transformers'
AutoModelForMultipleChoice (BertForMultipleChoice: pooler → dropout → one
output per choice, cross-entropy over each example's choices), fine-tuned
as run_swag.py pairs SWAG's columns, on the CPU in fp32.

usage: python anchor_multiple_choice.py MODEL_DIR TRAIN.csv TEST.csv EPOCHS
env: SEED (0), LR (5e-5), BATCH (16), MAX_LENGTH (64)

Recipe (bertha finetune's defaults where run_swag.py's differ only in
epochs): AdamW (weight decay 0.01), linear warmup over 10 % of the steps
then linear decay, gradient norm clipped to 1, dropout on, dynamic padding
per batch, shuffled each epoch. Prints one line: test accuracy, training
time, real (unpadded) tokens and examples per second of training.
"""
import csv
import os
import random
import sys
import time

import torch
from transformers import AutoModelForMultipleChoice, AutoTokenizer, get_linear_schedule_with_warmup

model_dir, train_path, test_path, epochs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
SEED = int(os.environ.get("SEED", "0"))
LR = float(os.environ.get("LR", "5e-5"))
BS = int(os.environ.get("BATCH", "16"))
MAX_LENGTH = int(os.environ.get("MAX_LENGTH", "64"))
torch.manual_seed(SEED)
random.seed(SEED)
torch.set_num_threads(os.cpu_count())


def read(path):
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    endings = sorted((k for k in rows[0] if k.startswith("ending")), key=lambda k: int(k[6:]))
    out = []
    for r in rows:
        lead = r.get("sent2", "").strip()
        choices = [f"{lead} {r[e]}" if lead else r[e] for e in endings]
        out.append((r["sent1"], choices, int(r["label"])))
    return out


def encode(batch):
    c = len(batch[0][1])
    first = [ctx for ctx, choices, _ in batch for _ in choices]
    second = [ch for _, choices, _ in batch for ch in choices]
    e = tok(first, second, truncation=True, max_length=MAX_LENGTH, padding=True, return_tensors="pt")
    real = int(e["attention_mask"].sum())
    e = {k: v.view(len(batch), c, -1) for k, v in e.items()}
    return e, torch.tensor([y for _, _, y in batch]), real


train, test = read(train_path), read(test_path)
tok = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForMultipleChoice.from_pretrained(model_dir)
decay = [p for n, p in model.named_parameters() if not ("bias" in n or "LayerNorm" in n)]
rest = [p for n, p in model.named_parameters() if "bias" in n or "LayerNorm" in n]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}], lr=LR)
steps = epochs * ((len(train) + BS - 1) // BS)
sched = get_linear_schedule_with_warmup(opt, -(-steps // 10), steps)

train_s, tokens, examples = 0.0, 0, 0
for epoch in range(epochs):
    model.train()
    random.shuffle(train)
    t0 = time.time()
    for i in range(0, len(train), BS):
        batch = train[i:i + BS]
        e, y, real = encode(batch)
        out = model(**e, labels=y)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        tokens += real
        examples += len(batch)
    train_s += time.time() - t0

model.eval()
right = 0
with torch.inference_mode():
    for i in range(0, len(test), 64):
        e, y, _ = encode(test[i:i + 64])
        right += int((model(**e).logits.argmax(-1) == y).sum())
print(f"transformers multiple choice: test accuracy {right / len(test):.4f}, {train_s:.1f} s training, "
      f"{tokens / train_s:.0f} tokens/s, {examples / train_s:.2f} examples/s", flush=True)
