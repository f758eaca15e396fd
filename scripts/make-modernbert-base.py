"""A ModernBERT of ModernBERT-base's shape with random weights, for speed runs (no real ModernBERT checkpoint is
reachable here; the speed of a model does not depend on its weights).

Shape: 22 layers, hidden 768, GeGLU intermediate 1,152, 12 heads, vocabulary 50,368, 8,192 positions, global
attention every third layer (RoPE theta 160,000) and a 128-token sliding window in the others (theta 10,000), as
answerdotai/ModernBERT-base's config.json. The tokenizer is a byte-level BPE of the same vocabulary size learnt on
the Wikipedia part of ../shared/data/corpus, with ModernBERT's special tokens and `[CLS] $A [SEP]` template, so
texts split into about as many tokens as with the released tokenizer.

usage: python scripts/make-modernbert-base.py OUT_DIR [CORPUS_TXT] [VOCAB_SIZE] [LAYERS]
"""
import json
import os
import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import ModernBertConfig, ModernBertForMaskedLM, PreTrainedTokenizerFast

out = sys.argv[1]
corpus = sys.argv[2] if len(sys.argv) > 2 else "../shared/data/corpus/wiki_vital_en.txt"
vocab = int(sys.argv[3]) if len(sys.argv) > 3 else 50368
layers = int(sys.argv[4]) if len(sys.argv) > 4 else 22
os.makedirs(out, exist_ok=True)

specials = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
tok = Tokenizer(models.BPE(unk_token=None))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials,
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
tok.train([corpus], trainer)
cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
tok.post_processor = processors.TemplateProcessing(
    single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
                               pad_token="[PAD]", mask_token="[MASK]", model_max_length=8192)
fast.save_pretrained(out)

config = ModernBertConfig(
    vocab_size=vocab, hidden_size=768, intermediate_size=1152, num_hidden_layers=layers, num_attention_heads=12,
    max_position_embeddings=8192, global_attn_every_n_layers=3, local_attention=128,
    global_rope_theta=160000.0, local_rope_theta=10000.0, pad_token_id=fast.pad_token_id,
    cls_token_id=cls, sep_token_id=sep, bos_token_id=cls, eos_token_id=sep)
torch.manual_seed(0)
model = ModernBertForMaskedLM(config).eval()
model.save_pretrained(out, safe_serialization=True)
json.dump({"made_by": "scripts/make-modernbert-base.py", "weights": "random (seed 0)", "corpus": corpus},
          open(os.path.join(out, "PROVENANCE.json"), "w"), indent=1)
print(f"{out}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, vocabulary {len(fast)}")
