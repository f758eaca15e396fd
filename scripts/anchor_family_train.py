"""Anchors for bench-families.sh: RoBERTa and DistilBERT training steps with Hugging Face transformers
(PyTorch, CPU), each at its best practice here, and the random-weight model folders both sides start from.

usage:
  python anchor_family_train.py make FAMILY PRESET VOCAB_TXT OUT_DIR
      a random-weight FAMILY (roberta | distilbert) model of PRESET's shape (tiny, mini, small: BERT's
      presets, feed-forward 4x hidden), with VOCAB_TXT's WordPiece tokenizer (roberta-base's BPE is on the
      hub, which is out of reach here; the vocabulary size sets the embedding and decoder sizes only)
  python anchor_family_train.py mlm MODEL_DIR CORPUS STEPS
      masked-LM steps of 32 x 128 tokens (15 % masked 80/10/10 by DataCollatorForLanguageModeling), AdamW
      5e-4 wd 0.01, clip 1.0, the decoder on masked rows only (as bertha and anchor_mlm_strong.py do);
      tokens/s over the steps after the first three
  python anchor_family_train.py classify MODEL_DIR SST2_DIR MAX_TRAIN
      SST-2 fine-tuning as anchor_sst2_finetune.py (AutoModelForSequenceClassification): batch 32, max
      length 64, dynamic padding, AdamW 1e-4, 10 % warmup, one epoch over MAX_TRAIN shuffled sentences;
      real (attention-mask) tokens/s over the epoch and the dev accuracy
env: BF16=1 runs the steps under torch.autocast bf16.
"""
import os
import random
import sys
import time

import torch

from anchor_vocab import wordpiece

PRESETS = {"tiny": (2, 128, 2), "mini": (4, 256, 4), "small": (4, 512, 8)}
BF16 = os.environ.get("BF16") == "1"


def make(family, preset, vocab, out):
    from transformers import DistilBertConfig, DistilBertForMaskedLM, RobertaConfig, RobertaForMaskedLM

    layers, hidden, heads = PRESETS[preset]
    tok = wordpiece(vocab)
    torch.manual_seed(0)
    if family == "roberta":
        # The tokenizer's [PAD] is the padding index, so positions start after it as in RoBERTa.
        cfg = RobertaConfig(vocab_size=tok.vocab_size, num_hidden_layers=layers, hidden_size=hidden,
                            num_attention_heads=heads, intermediate_size=4 * hidden, max_position_embeddings=514,
                            pad_token_id=tok.pad_token_id, bos_token_id=tok.cls_token_id,
                            eos_token_id=tok.sep_token_id, type_vocab_size=1)
        model = RobertaForMaskedLM(cfg)
    elif family == "distilbert":
        cfg = DistilBertConfig(vocab_size=tok.vocab_size, n_layers=layers, dim=hidden, n_heads=heads,
                               hidden_dim=4 * hidden, pad_token_id=tok.pad_token_id)
        model = DistilBertForMaskedLM(cfg)
    else:
        sys.exit(f"unknown family {family}")
    model.save_pretrained(out)
    tok.save_pretrained(out)


def threads():
    torch.manual_seed(0)
    random.seed(0)
    torch.set_num_threads(os.cpu_count())


def mlm(model_dir, corpus, steps):
    from transformers import AutoModelForMaskedLM, AutoTokenizer, DataCollatorForLanguageModeling

    threads()
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForMaskedLM.from_pretrained(model_dir).train()
    ids = tok(open(corpus, encoding="utf-8").read()[:3_000_000], add_special_tokens=False)["input_ids"]
    seqs = [[tok.cls_token_id] + ids[i:i + 126] + [tok.sep_token_id] for i in range(0, len(ids) - 126, 126)]
    coll = DataCollatorForLanguageModeling(tok, mlm_probability=0.15)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.01)
    body = getattr(model, model.base_model_prefix)
    if model.config.model_type == "distilbert":
        def head(h):
            return model.vocab_projector(model.vocab_layer_norm(model.activation(model.vocab_transform(h))))
    else:
        head = model.lm_head
    B = 32
    t0 = None
    for s in range(steps + 3):
        if s == 3:
            t0 = time.perf_counter()
        batch = coll([{"input_ids": x} for x in seqs[s * B:(s + 1) * B]])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=BF16):
            h = body(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
            sel = batch["labels"] != -100
            loss = torch.nn.functional.cross_entropy(head(h[sel]).float(), batch["labels"][sel])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
    el = time.perf_counter() - t0
    print(f"pytorch MLM {model.config.model_type}: {steps} steps of {B}x128 in {el:.1f}s, "
          f"{steps * B * 128 / el:.0f} tokens/s, last loss {loss.item():.3f}")


def classify(model_dir, data_dir, max_train):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, get_linear_schedule_with_warmup

    threads()

    def read(p):
        rows = [l.rstrip("\n").split("\t") for l in open(p, encoding="utf-8")][1:]
        return [(s.strip(), int(y)) for s, y in rows]

    train, dev = read(f"{data_dir}/train.tsv"), read(f"{data_dir}/dev.tsv")
    random.shuffle(train)
    train = train[:max_train]
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    bs = 32
    steps = (len(train) + bs - 1) // bs
    sched = get_linear_schedule_with_warmup(opt, steps // 10, steps)
    model.train()
    t0, ntok = time.time(), 0
    for i in range(0, len(train), bs):
        b = train[i:i + bs]
        e = tok([s for s, _ in b], padding=True, truncation=True, max_length=64, return_tensors="pt")
        ntok += int(e["attention_mask"].sum())
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=BF16):
            out = model(**e, labels=torch.tensor([y for _, y in b]))
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
    el = time.time() - t0
    model.eval()
    correct = 0
    with torch.inference_mode():
        for i in range(0, len(dev), 64):
            b = dev[i:i + 64]
            e = tok([s for s, _ in b], padding=True, truncation=True, max_length=64, return_tensors="pt")
            correct += (model(**e).logits.argmax(-1) == torch.tensor([y for _, y in b])).sum().item()
    print(f"pytorch classify {model.config.model_type}: dev_acc {correct / len(dev):.4f} "
          f"elapsed {el:.0f}s train_tokens/s {ntok / el:.0f}")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "make":
        make(*args)
    elif cmd == "mlm":
        mlm(args[0], args[1], int(args[2]))
    elif cmd == "classify":
        classify(args[0], args[1], int(args[2]))
    else:
        sys.exit(__doc__)
