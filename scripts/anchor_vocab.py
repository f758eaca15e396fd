"""The bert-base-uncased WordPiece tokenizer that the family anchors' random-weight models are made with.

usage:
  python3 anchor_vocab.py matches MODEL_DIR VOCAB_TXT
      exits 0 when MODEL_DIR's config.json has VOCAB_TXT's vocabulary size, else 1 (a folder made before the
      anchors checked their tokenizer holds 5 tokens: the bench scripts remake it)
"""
import json
import os
import sys


def vocab_words(vocab_txt):
    """The tokens of a WordPiece vocabulary file, one a line."""
    with open(vocab_txt, encoding="utf-8") as f:
        return sum(1 for _ in f)


def wordpiece(vocab_txt):
    """The WordPiece tokenizer of VOCAB_TXT's folder, checked against the file: transformers 5 reads no
    `vocab_file=` argument, and a tokenizer built that way holds its 5 special tokens only, so every word
    would be [UNK] and an MLM decoder 5 wide."""
    from transformers import BertTokenizerFast

    tok = BertTokenizerFast.from_pretrained(os.path.dirname(os.path.abspath(vocab_txt)), do_lower_case=True)
    words = vocab_words(vocab_txt)
    if tok.vocab_size != words:
        sys.exit(f"{vocab_txt}: the tokenizer holds {tok.vocab_size} tokens, the file {words}")
    return tok


def matches(model_dir, vocab_txt):
    """Whether MODEL_DIR was made with VOCAB_TXT's vocabulary (False when it has no readable config)."""
    try:
        with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
            return json.load(f).get("vocab_size") == vocab_words(vocab_txt)
    except (OSError, ValueError):
        return False


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "matches":
        sys.exit(__doc__)
    sys.exit(0 if matches(sys.argv[2], sys.argv[3]) else 1)
