#!/usr/bin/env python3
"""Reads collie checkpoints with the safetensors layout, json and NumPy only.

usage: read_safetensors.py SHARDED_STEP_DIR WHOLE_STEP_DIR

SHARDED_STEP_DIR holds one shard per rank (tensors split into pieces across files);
WHOLE_STEP_DIR one file of whole tensors, from an unsharded run of the same training.
Every tensor assembled from the shards must equal the whole file's, bit for bit.
"""
import json
import pathlib
import struct
import sys

import numpy as np


def read_safetensors(path):
    """A safetensors file: (metadata, {name: array}), checking the layout as its spec says."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    data = raw[8 + length:]
    metadata = header.pop("__metadata__", {})
    assert all(isinstance(v, str) for v in metadata.values()), "metadata maps str to str"
    tensors, end = {}, 0
    for name, entry in sorted(header.items(), key=lambda e: e[1]["data_offsets"]):
        begin, stop = entry["data_offsets"]
        assert entry["dtype"] == "F32" and begin == end, f"{path}: {name} leaves a hole"
        tensors[name] = np.frombuffer(data[begin:stop], dtype="<f4").reshape(entry["shape"])
        end = stop
    assert end == len(data), f"{path}: bytes after the last tensor"
    return metadata, tensors


def assemble(step_dir):
    """Every tensor of a checkpoint, whole: its pieces placed where the manifest says."""
    manifest = json.loads((step_dir / "manifest.json").read_text())
    whole = {t["key"]: np.full(t["shape"], np.nan, dtype="<f4") for t in manifest["tensors"]}
    split = 0
    for entry in manifest["files"]:
        metadata, tensors = read_safetensors(step_dir / entry["name"])
        where = json.loads(metadata["pieces"])
        for key, piece in tensors.items():
            start = where[key]["start"]
            split += piece.size != whole[key].size
            whole[key].reshape(-1)[start:start + piece.size] = piece.reshape(-1)
    return manifest, whole, split


def main():
    sharded, whole_dir = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    manifest, assembled, split = assemble(sharded)
    files = sorted(whole_dir.glob("*.safetensors"))
    assert len(files) == 1, f"{whole_dir}: expected one file, found {len(files)}"
    _, whole = read_safetensors(files[0])
    assert assembled.keys() == whole.keys(), "the two checkpoints hold other tensors"
    for key, array in whole.items():
        assert not np.isnan(assembled[key]).any(), f"{key}: a piece is missing"
        assert assembled[key].shape == array.shape, f"{key}: {assembled[key].shape}"
        assert np.array_equal(assembled[key], array), f"{key} differs"
    assert split > 0, "no tensor was split over files: the test would not see a misplaced piece"
    print(f"{len(whole)} tensors from {len(manifest['files'])} shards ({split} pieces of "
          f"tensors split over files and equal to the unsharded run's)")


if __name__ == "__main__":
    main()
