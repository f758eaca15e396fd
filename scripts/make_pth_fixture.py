#!/usr/bin/env python3
"""Writes a `pytorch_model.bin` holding the tensors of a safetensors file,
in the zip + pickle layout `torch.save` uses, without needing torch.

Used to make tests/fixtures/tiny-pth/ (the bert-mlm tiny checkpoint as a
PyTorch file) so the pickle loader is tested on a fresh clone.

    python3 scripts/make_pth_fixture.py IN.safetensors OUT.bin
"""
import collections
import io
import json
import pickle
import struct
import sys
import types
import zipfile

# Stand-ins for the globals torch.save references; pickle records them by
# module and name only, which is all a reader (torch or candle) looks at.
torch = types.ModuleType("torch")
torch_utils = types.ModuleType("torch._utils")


def _rebuild_tensor_v2(*args):  # pragma: no cover - never called
    raise RuntimeError


class FloatStorage:  # pragma: no cover - never instantiated
    pass


_rebuild_tensor_v2.__module__ = "torch._utils"
FloatStorage.__module__ = "torch"
torch_utils._rebuild_tensor_v2 = _rebuild_tensor_v2
torch.FloatStorage = FloatStorage
sys.modules["torch"] = torch
sys.modules["torch._utils"] = torch_utils


class StorageRef:
    def __init__(self, key, numel):
        self.key, self.numel = key, numel


class TensorRef:
    def __init__(self, key, shape):
        self.key, self.shape = key, shape

    def __reduce__(self):
        strides, acc = [], 1
        for d in reversed(self.shape):
            strides.insert(0, acc)
            acc *= d
        numel = acc
        return (
            _rebuild_tensor_v2,
            (StorageRef(self.key, numel), 0, tuple(self.shape), tuple(strides), False, collections.OrderedDict()),
        )


class Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, StorageRef):
            return ("storage", FloatStorage, obj.key, "cpu", obj.numel)
        return None


def main(src, dst):
    raw = open(src, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    body = raw[8 + n :]
    state = collections.OrderedDict()
    blobs = {}
    for i, (name, info) in enumerate(sorted((k, v) for k, v in header.items() if k != "__metadata__")):
        assert info["dtype"] == "F32", f"{name}: only F32 is supported"
        a, b = info["data_offsets"]
        key = str(i)
        blobs[key] = body[a:b]
        state[name] = TensorRef(key, info["shape"])
    buf = io.BytesIO()
    Pickler(buf, protocol=2).dump(state)
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", buf.getvalue())
        for key, blob in blobs.items():
            z.writestr(f"archive/data/{key}", blob)
        z.writestr("archive/version", "3\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
