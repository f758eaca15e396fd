#!/usr/bin/env python3
"""Converts an original STS Benchmark file (sts-train.csv, sts-dev.csv, sts-test.csv) to the scored-pairs TSV that
`bertha finetune --task embedding` and `bertha evaluate --task sts` read: a header `sentence1, sentence2, score` and
scores divided by 5 (0-1).

    python scripts/stsb-to-pairs.py ../shared/data/stsb/sts-train.csv sts-train.tsv

The originals have no header and are tab-split without quoting (some sentences hold unbalanced `"`): genre, file,
year, id, score, sentence1, sentence2, and on some lines two more fields (sources), which are dropped.
`--stsb` on those commands reads the originals directly, the same way. Needs only the standard library.
"""
import os
import sys


def convert(src, dst):
    rows = []
    with open(src, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            fields = line.split("\t")
            if len(fields) < 7:
                sys.exit(f"{src}: line {n}: {len(fields)} fields, an STS-B line has at least 7")
            try:
                score = float(fields[4])
            except ValueError:
                sys.exit(f"{src}: line {n}: score `{fields[4]}` is not a number")
            if not 0 <= score <= 5:
                sys.exit(f"{src}: line {n}: score {score} is outside 0-5")
            s1, s2 = fields[5], fields[6]
            if not s1.strip() or not s2.strip():
                sys.exit(f"{src}: line {n}: empty sentence")
            rows.append(f"{s1}\t{s2}\t{score / 5!r}\n")
    tmp = dst + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write("sentence1\tsentence2\tscore\n")
        f.writelines(rows)
    os.replace(tmp, dst)
    print(f"{dst}: {len(rows)} pairs", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    convert(sys.argv[1], sys.argv[2])
