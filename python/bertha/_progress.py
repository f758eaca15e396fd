"""Progress bars: tqdm's when tqdm is installed, else a plain one on stderr."""

from __future__ import annotations

import sys
import time
from typing import Optional


class _PlainBar:
    """The part of tqdm's interface bertha uses, drawn as one stderr line."""

    def __init__(self, total: Optional[int], desc: str = "", initial: int = 0) -> None:
        self.total = total
        self.n = initial
        self.desc = desc
        self.postfix = ""
        self._start = time.monotonic()
        self._drawn = 0.0

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        # Redraw at most 10 times a second, and at the end.
        if now - self._drawn >= 0.1 or (self.total is not None and self.n >= self.total):
            self._drawn = now
            self._draw()

    def set_postfix_str(self, s: str) -> None:
        self.postfix = s

    def write(self, line: str) -> None:
        sys.stderr.write("\r\033[K" + line + "\n")
        self._draw()

    def _draw(self) -> None:
        elapsed = time.monotonic() - self._start
        if self.total:
            done = min(self.n / self.total, 1.0)
            bar = "#" * int(done * 30)
            head = f"{self.desc}: {done * 100:3.0f}%|{bar:<30}| {self.n}/{self.total}"
        else:
            head = f"{self.desc}: {self.n}"
        sys.stderr.write(f"\r{head} [{elapsed:.1f}s] {self.postfix}")
        sys.stderr.flush()

    def close(self) -> None:
        self._draw()
        sys.stderr.write("\n")
        sys.stderr.flush()


def bar(total: Optional[int], desc: str, initial: int = 0):
    """A tqdm bar (``update``, ``set_postfix_str``, ``write``, ``close``)."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _PlainBar(total, desc, initial)
    return tqdm(total=total, desc=desc, initial=initial)
