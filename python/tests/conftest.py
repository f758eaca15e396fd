"""Shared fixtures: the repository's reference outputs (made by
transformers / sentence-transformers, see tests/fixtures/README.md)."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Dict

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"


def read_safetensors(path: Path) -> Dict[str, np.ndarray]:
    """A safetensors file's f32 tensors (its format: an 8-byte header length,
    a JSON header, then the raw little-endian data), without torch."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = {"F32": "<f4", "I64": "<i8"}[info["dtype"]]
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=dtype).reshape(info["shape"])
    return out


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    d = Path(os.environ.get("BERTHA_MODEL", REPO / ".cache" / "models" / "all-MiniLM-L6-v2"))
    if not (d / "config.json").exists():
        pytest.fail(f"{d}: no all-MiniLM-L6-v2 here; run scripts/fetch-model.sh first")
    return d


@pytest.fixture(scope="session")
def minilm_fixture():
    sentences = json.loads((FIXTURES / "minilm.json").read_text())["sentences"]
    return sentences, read_safetensors(FIXTURES / "minilm.safetensors")


@pytest.fixture(scope="session")
def pipelines_fixture():
    return json.loads((FIXTURES / "pipelines.json").read_text())


def tiny(name: str) -> Path:
    return FIXTURES / "tiny" / name
