"""Anchor: extractive-QA fine-tuning with Hugging Face transformers (PyTorch, CPU), for bench-qa.sh.

usage: python anchor_qa_finetune.py MODEL_DIR SQUAD_JSON [MAX_LENGTH] [BATCH]   (env BF16=1 for torch.autocast bf16)

transformers' run_qa recipe: windows of MAX_LENGTH (256) tokens with stride 128 over the context
(truncation="only_second"), start/end positions from the offsets (CLS for answers outside a window),
the folder's `…ForQuestionAnswering` (AutoModelForQuestionAnswering: BERT's, ModernBERT's, …; token types only
where the model takes them), AdamW 1e-4, batch 32, one epoch in file order, dropout on. Prints the tokens/s
(attention-mask tokens) of the steps after the first three, and the last loss.
"""
import inspect
import json
import os
import sys
import time

import torch
from transformers import AutoModelForQuestionAnswering, AutoTokenizer

model_dir, squad = sys.argv[1], sys.argv[2]
max_length = int(sys.argv[3]) if len(sys.argv) > 3 else 256
bs = int(sys.argv[4]) if len(sys.argv) > 4 else 32
BF16 = os.environ.get("BF16") == "1"
torch.manual_seed(0)
torch.set_num_threads(os.cpu_count())

questions, contexts, answers = [], [], []
for article in json.load(open(squad, encoding="utf-8"))["data"]:
    for para in article["paragraphs"]:
        for qa in para["qas"]:
            a = qa["answers"][0]
            questions.append(qa["question"].lstrip())
            contexts.append(para["context"])
            answers.append((a["answer_start"], a["answer_start"] + len(a["text"])))

tok = AutoTokenizer.from_pretrained(model_dir)
enc = tok(questions, contexts, truncation="only_second", max_length=max_length, stride=min(128, max_length // 2),
          return_overflowing_tokens=True, return_offsets_mapping=True, padding="max_length")
starts, ends = [], []
for i, offsets in enumerate(enc["offset_mapping"]):
    s_char, e_char = answers[enc["overflow_to_sample_mapping"][i]]
    seq = enc.sequence_ids(i)
    c0 = seq.index(1)
    c1 = len(seq) - 1 - seq[::-1].index(1)
    if offsets[c0][0] > s_char or offsets[c1][1] < e_char:
        starts.append(0); ends.append(0)
        continue
    s = c0
    while s <= c1 and offsets[s][0] <= s_char:
        s += 1
    e = c1
    while e >= c0 and offsets[e][1] >= e_char:
        e -= 1
    starts.append(s - 1); ends.append(e + 1)

model = AutoModelForQuestionAnswering.from_pretrained(model_dir)
ids = torch.tensor(enc["input_ids"])
mask = torch.tensor(enc["attention_mask"])
starts, ends = torch.tensor(starts), torch.tensor(ends)
# ModernBERT, RoBERTa and DistilBERT take no token types.
typed = "token_type_ids" in inspect.signature(model.forward).parameters and "token_type_ids" in enc
types = torch.tensor(enc["token_type_ids"]) if typed else None
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
n = len(ids) // bs
timed_tokens, t_start, loss = 0, None, None
for step in range(n):
    if step == 3:
        t_start = time.time()
    sl = slice(step * bs, (step + 1) * bs)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=BF16):
        extra = {"token_type_ids": types[sl]} if typed else {}
        out = model(input_ids=ids[sl], attention_mask=mask[sl], start_positions=starts[sl],
                    end_positions=ends[sl], **extra)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step(); opt.zero_grad()
    loss = out.loss.item()
    if step >= 3:
        timed_tokens += int(mask[sl].sum())
el = time.time() - t_start
print(f"pytorch QA {'bf16' if BF16 else 'fp32'}: {n} steps of {bs} x {max_length} ({len(ids)} windows), "
      f"{n - 3} timed in {el:.1f}s, {timed_tokens / el:.0f} tokens/s, last loss {loss:.3f}", flush=True)
