"""The bert-base-uncased WordPiece tokenizer that the family anchors' random-weight models are made with."""
import os
import sys


def wordpiece(vocab_txt):
    """The WordPiece tokenizer of VOCAB_TXT's folder, checked against the file: transformers 5 reads no
    `vocab_file=` argument, and a tokenizer built that way holds its 5 special tokens only, so every word
    would be [UNK] and an MLM decoder 5 wide."""
    from transformers import BertTokenizerFast

    tok = BertTokenizerFast.from_pretrained(os.path.dirname(os.path.abspath(vocab_txt)), do_lower_case=True)
    with open(vocab_txt, encoding="utf-8") as f:
        words = sum(1 for _ in f)
    if tok.vocab_size != words:
        sys.exit(f"{vocab_txt}: the tokenizer holds {tok.vocab_size} tokens, the file {words}")
    return tok
