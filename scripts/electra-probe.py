"""Why ELECTRA does or does not beat BERT at the compute of scripts/electra-vs-bert.sh:
probes of each pre-training checkpoint on held-out text, run by transformers
(which also shows that it loads the folders bertha wrote).

    ~/.refenv/bin/python scripts/electra-probe.py [OUT]   # OUT: .cache/electra-vs-bert

On wikitext-2 test (not in the pre-training corpus), 256 sequences of 128 tokens,
15 % of the non-special positions chosen with a fixed seed:

* masked-LM skill of BERT's checkpoints and of ELECTRA's generators: every chosen
  position is [MASK] (no 10 % kept tokens to copy), cross-entropy and top-1
  accuracy there, against what the training corpus's unigram distribution gives
  without any context;
* replaced-token detection: the chosen positions are replaced by samples from
  (a) that checkpoint's generator (ELECTRA's training task), (b) the corpus's
  unigram distribution, (c) uniform over the vocabulary; the ROC-AUC with which
  the discriminator's logit separates replaced from original positions (0.5: no
  skill). BERT is scored on the same inputs by how much less likely its context
  makes the observed token than the unigram does.

Writes OUT/probe.json and prints a Markdown table.
"""
import glob
import json
import os
import sys

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import BertForMaskedLM, ElectraForMaskedLM, ElectraForPreTraining

torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
torch.manual_seed(0)
out = sys.argv[1] if len(sys.argv) > 1 else ".cache/electra-vs-bert"
data = os.environ.get("DATA", "../shared/data")
SPECIAL = [0, 100, 101, 102, 103]  # [PAD] [UNK] [CLS] [SEP] [MASK] of bert-base-uncased
CLS, SEP, MASK = 101, 102, 103



def shard_tokens(path):
    """The token ids of a prepared shard: a 16-byte magic, the id width and a
    reserved u32, then the token, piece and document counts (u64 each), then the ids."""
    raw = open(path, "rb").read()
    width = int.from_bytes(raw[16:20], "little")
    n = int.from_bytes(raw[24:32], "little")
    return np.frombuffer(raw, dtype=np.uint16 if width == 2 else np.uint32, count=n, offset=48)


# The unigram distribution of the pre-training corpus.
ids = np.concatenate([shard_tokens(f) for f in sorted(glob.glob(f"{out}/corpus/shard-*.bin"))])
assert ids.max() < 30522, "not a bert-base-uncased corpus"
counts = np.bincount(ids, minlength=30522).astype(np.float64)
counts[SPECIAL] = 0
unigram = (counts + 0.01) / (counts + 0.01).sum()

tok = Tokenizer.from_file(f"{out}/mlm/tokenizer.json")
tok.no_padding()
tok.no_truncation()
lines = [l for l in open(f"{data}/corpus/wikitext-2-raw-test.txt") if l.strip()]
stream = np.concatenate([np.array(tok.encode(l, add_special_tokens=False).ids) for l in lines])
stream = stream[~np.isin(stream, SPECIAL)]
n, body = 256, 126
tokens = torch.tensor(np.stack([stream[i * body:(i + 1) * body] for i in range(n)]), dtype=torch.long)
tokens = torch.cat([torch.full((n, 1), CLS), tokens, torch.full((n, 1), SEP)], dim=1)
rng = np.random.default_rng(0)
chosen = torch.zeros_like(tokens, dtype=torch.bool)
for row in range(n):
    chosen[row, 1 + rng.choice(body, size=round(0.15 * body), replace=False)] = True
masked = tokens.masked_fill(chosen, MASK)
targets = tokens[chosen]
unigram_ce = float(-np.log(unigram[targets.numpy()]).mean())
unigram_acc = float((targets.numpy() == counts.argmax()).mean())


def mlm_probe(model):
    with torch.no_grad():
        logits = model(input_ids=masked).logits[chosen]
    ce = torch.nn.functional.cross_entropy(logits, targets).item()
    return ce, (logits.argmax(-1) == targets).float().mean().item(), logits


def auc(scores, labels):
    """ROC-AUC by ranks (ties averaged)."""
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    s = scores[order]
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    pos = labels.sum()
    neg = len(labels) - pos
    return float((ranks[labels].sum() - pos * (pos + 1) / 2) / (pos * neg))


def corrupt(samples):
    """The input with the chosen positions set to `samples`; the replaced mask
    (a sample equal to the original is not a replacement, as in ELECTRA)."""
    x = tokens.clone()
    x[chosen] = samples
    return x, (x != tokens)


def sample_logits(logits):
    g = torch.Generator().manual_seed(1)
    return torch.multinomial(torch.softmax(logits, -1), 1, generator=g).squeeze(-1)


inner = torch.zeros_like(tokens, dtype=torch.bool)
inner[:, 1:-1] = True
draw = np.random.default_rng(2)
replacements = {
    "unigram": torch.tensor(draw.choice(30522, size=len(targets), p=unigram)),
    "uniform": torch.tensor(draw.integers(999, 30522, size=len(targets))),  # past the [unused] block
}


def rtd_probe(score_fn, generator_samples=None):
    res = {}
    sets = dict(replacements)
    if generator_samples is not None:
        sets = {"generator": generator_samples, **sets}
    for name, samples in sets.items():
        x, replaced = corrupt(samples)
        with torch.no_grad():
            s = score_fn(x)
        res[name] = auc(s[inner].numpy(), replaced[inner].numpy())
    return res


log_unigram = torch.tensor(np.log(unigram), dtype=torch.float32)


def bert_rtd(model):
    """How out of place BERT finds each token: −(log p(token | context) −
    log p_unigram(token)), so that a token is not suspect merely for being rare."""
    def score(x):
        logp = torch.log_softmax(model(input_ids=x).logits, -1)
        return -(logp.gather(-1, x.unsqueeze(-1)).squeeze(-1) - log_unigram[x])
    return score


def checkpoints(run):
    """(step, folder) of each checkpoint, the initialisation as step 0 where present."""
    found = [(int(p.rsplit("-", 1)[1]), p) for p in glob.glob(f"{out}/{run}/checkpoint-*")]
    if os.path.isdir(f"{out}/init-{run}"):
        found.append((0, f"{out}/init-{run}"))
    return sorted(found)


rows = []
for step, path in checkpoints("mlm"):
    m = BertForMaskedLM.from_pretrained(path).eval()
    ce, acc, logits = mlm_probe(m)
    rows.append({"run": "BERT MLM", "step": step, "mlm_ce": ce, "mlm_acc": acc,
                 "rtd_auc": rtd_probe(bert_rtd(m))})
for step, path in checkpoints("electra"):
    gen = ElectraForMaskedLM.from_pretrained(f"{path}/generator").eval()
    disc = ElectraForPreTraining.from_pretrained(path).eval()
    ce, acc, logits = mlm_probe(gen)
    rows.append({"run": "ELECTRA", "step": step, "mlm_ce": ce, "mlm_acc": acc,
                 "rtd_auc": rtd_probe(lambda x: disc(input_ids=x).logits, sample_logits(logits))})

result = {"unigram_ce": unigram_ce, "unigram_acc": unigram_acc, "masked_positions": len(targets), "rows": rows}
json.dump(result, open(f"{out}/probe.json", "w"), indent=1)
print(f"context-free (unigram of the corpus): MLM cross-entropy {unigram_ce:.3f}, top-1 {unigram_acc:.3f}; "
      f"{len(targets)} masked positions\n")
print("| run | step | MLM cross-entropy (all [MASK]) | MLM top-1 | RTD AUC: own generator | unigram | uniform |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    a = r["rtd_auc"]
    gen = f"{a['generator']:.3f}" if "generator" in a else "–"
    print(f"| {r['run']} | {r['step']} | {r['mlm_ce']:.3f} | {r['mlm_acc']:.3f} | {gen} | "
          f"{a['unigram']:.3f} | {a['uniform']:.3f} |")
