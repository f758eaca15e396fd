"""Anchors for bench-family-embed.sh: sentence embeddings of the BERT families other than BERT (RoBERTa,
DistilBERT, ALBERT, ELECTRA) with the Python tools a user would pick, each at its best practice on the CPU, and
the random-weight model folders of the real models' shapes that both sides load.

usage:
  python anchor_family_embed.py make SHAPE VOCAB_TXT OUT_DIR
      a random-weight base model of SHAPE (below), with VOCAB_TXT's WordPiece tokenizer: the real models' own
      tokenizers (BPE, SentencePiece) are on the hub, out of reach here; the vocabulary sets the embedding
      table's size only, and both sides read the same tokens
  python anchor_family_embed.py run MODEL_DIR TEXTS_FILE BATCH REPS [which,...]   (which: st,ort,ort_int8)
      sentence-transformers encode (its length-sorted batches), ONNX Runtime fp32 and dynamic int8
      (per-channel; sorted batches, all graph optimisations), as ../shared/bench/anchor_embed_strong.py runs
      them for BERT, with the model's own inputs (DistilBERT takes no token types). Mean pooling, truncation
      256, best of REPS wall times; int8's min cosine to sentence-transformers' fp32 embeddings.

shapes (the sentence-transformers models people use on them):
  distilroberta   RoBERTa, 6 layers, 768 wide, 12 heads, FFN 3,072 (all-distilroberta-v1)
  distilbert      DistilBERT, 6 layers, 768, 12 heads, 3,072 (multi-qa-distilbert-cos-v1)
  albert-base     ALBERT, 12 steps of one shared layer, 768, embeddings 128, 12 heads, 3,072 (albert-base-v2)
  electra-small   ELECTRA, 12 layers, 256, embeddings 128, 4 heads, 1,024 (electra-small-discriminator)
"""
import inspect
import os
import sys
import tempfile
import time

import numpy as np
import torch

from anchor_vocab import wordpiece


def make(shape, vocab, out):
    from transformers import (AlbertConfig, AlbertModel, DistilBertConfig, DistilBertModel,
                              ElectraConfig, ElectraModel, RobertaConfig, RobertaModel)

    tok = wordpiece(vocab)
    torch.manual_seed(0)
    v, pad = tok.vocab_size, tok.pad_token_id
    if shape == "distilroberta":
        # The tokenizer's [PAD] is the padding index: positions start after it, as RoBERTa's do.
        model = RobertaModel(RobertaConfig(vocab_size=v, num_hidden_layers=6, max_position_embeddings=514,
                                           pad_token_id=pad, bos_token_id=tok.cls_token_id,
                                           eos_token_id=tok.sep_token_id, type_vocab_size=1),
                             add_pooling_layer=False)
    elif shape == "distilbert":
        model = DistilBertModel(DistilBertConfig(vocab_size=v, pad_token_id=pad))
        tok.model_input_names = ["input_ids", "attention_mask"]
    elif shape == "albert-base":
        model = AlbertModel(AlbertConfig(vocab_size=v, embedding_size=128, hidden_size=768, num_hidden_layers=12,
                                         num_attention_heads=12, intermediate_size=3072, pad_token_id=pad),
                            add_pooling_layer=False)
    elif shape == "electra-small":
        model = ElectraModel(ElectraConfig(vocab_size=v, embedding_size=128, hidden_size=256, num_hidden_layers=12,
                                           num_attention_heads=4, intermediate_size=1024, pad_token_id=pad))
    else:
        sys.exit(f"unknown shape {shape}")
    model.save_pretrained(out)
    tok.save_pretrained(out)


def run(model_dir, texts_file, batch, reps, which):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, AutoTokenizer

    torch.set_num_threads(os.cpu_count())
    texts = [l.rstrip("\n") for l in open(texts_file, encoding="utf-8")]
    tok = AutoTokenizer.from_pretrained(model_dir)
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))  # sentence-transformers' own order
    sorted_texts = [texts[i] for i in order]

    def best(f):
        out = f()
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t)
        return min(ts), out

    def report(name, t, out=None, ref=None):
        extra = ""
        if out is not None and ref is not None:
            a = out / np.linalg.norm(out, axis=1, keepdims=True)
            b = ref / np.linalg.norm(ref, axis=1, keepdims=True)
            extra = f", min cosine to fp32 {(a * b).sum(1).min():.5f}"
        print(f"{name}: {len(texts)} texts, batch {batch}, best {t:.3f}s, {len(texts) / t:.1f} texts/s{extra}",
              flush=True)

    st = SentenceTransformer(model_dir, device="cpu")
    st.max_seq_length = 256
    t, ref = best(lambda: st.encode(texts, batch_size=batch, convert_to_numpy=True, normalize_embeddings=False))
    if "st" in which:
        report(f"sentence-transformers (PyTorch {torch.__version__}, fp32)", t)
    if "ort" not in which and "ort_int8" not in which:
        return

    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = AutoModel.from_pretrained(model_dir).eval()
    takes = inspect.signature(model.forward).parameters
    names = [k for k in ["input_ids", "attention_mask", "token_type_ids"] if k in takes]
    d = tempfile.mkdtemp()
    fp32 = os.path.join(d, "model.onnx")
    e = tok(["hello world"], return_tensors="pt")

    class Wrap(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, *inputs):
            return self.m(**dict(zip(names, inputs))).last_hidden_state

    torch.onnx.export(Wrap(model), tuple(e[k] for k in names), fp32, input_names=names,
                      output_names=["last_hidden_state"],
                      dynamic_axes={k: {0: "b", 1: "t"} for k in names + ["last_hidden_state"]},
                      opset_version=17, dynamo=False)

    def session(path):
        so = ort.SessionOptions()
        so.intra_op_num_threads = os.cpu_count()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])

    def runner(sess):
        def go():
            outs = []
            for i in range(0, len(sorted_texts), batch):
                e = tok(sorted_texts[i:i + batch], padding=True, truncation=True, max_length=256,
                        return_tensors="np", return_token_type_ids="token_type_ids" in names)
                h = sess.run(None, {k: e[k].astype(np.int64) for k in names})[0]
                m = e["attention_mask"][..., None].astype(np.float32)
                outs.append((h * m).sum(1) / m.sum(1))
            o = np.concatenate(outs)
            res = np.empty_like(o)
            res[order] = o
            return res
        return go

    if "ort" in which:
        t, out = best(runner(session(fp32)))
        report(f"onnxruntime {ort.__version__} fp32 (sorted)", t)
    if "ort_int8" in which:
        q = os.path.join(d, "model.int8.onnx")
        quantize_dynamic(fp32, q, weight_type=QuantType.QInt8, per_channel=True)
        t, out = best(runner(session(q)))
        report(f"onnxruntime {ort.__version__} dynamic int8, per-channel (sorted)", t, out, ref)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3], sys.argv[4])
    elif len(sys.argv) in (6, 7) and sys.argv[1] == "run":
        which = sys.argv[6].split(",") if len(sys.argv) == 7 else ["st", "ort", "ort_int8"]
        run(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), which)
    else:
        sys.exit(__doc__)
