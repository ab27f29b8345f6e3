"""Tensor-at-a-time safetensors reading and writing, so host memory holds one tensor at once.

File format: 8-byte little-endian header length N, N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
then the raw little-endian tensor bytes (offsets relative to the data start).
The `safetensors` package's `save_file` needs every tensor in memory at once and
`safe_open(..., "numpy")` cannot return bfloat16, hence this small reader/writer.
Folders are local or `gs://` URIs (`orchestra_jax/io/paths.py`).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import struct
from collections.abc import Callable, Iterable
from typing import cast

import ml_dtypes
import numpy as np
from etils import epath

from orchestra_jax.io import paths

_DTYPES = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_CODES = {dtype: code for code, dtype in _DTYPES.items()}

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


@dataclasses.dataclass(frozen=True)
class TensorRef:
    """Where one tensor lives: file, dtype, shape and absolute byte range."""

    file: epath.Path
    dtype: np.dtype
    shape: tuple[int, ...]
    start: int
    end: int

    def read(self) -> np.ndarray:
        """The tensor as a fresh numpy array (reads only its bytes)."""
        out = np.empty(self.shape, self.dtype)
        if self.end - self.start != out.nbytes:
            raise ValueError(f"{self.file}: byte range does not match shape {self.shape}")
        with self.file.open("rb") as opened:
            f = cast("io.BufferedIOBase", opened)  # binary: local files and gcsfs's alike
            f.seek(self.start)
            if f.readinto(out.reshape(-1).view(np.uint8).data) != out.nbytes:
                raise ValueError(f"{self.file}: truncated tensor data")
        return out


def _read_header(file: epath.Path) -> dict[str, TensorRef]:
    with file.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    refs = {}
    for name, info in header.items():
        if info["dtype"] not in _DTYPES:
            raise ValueError(f"{file}: tensor {name} has unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        refs[name] = TensorRef(
            file, _DTYPES[info["dtype"]], tuple(info["shape"]), 8 + n + begin, 8 + n + end
        )
    return refs


def index_checkpoint(folder: str | os.PathLike) -> dict[str, TensorRef]:
    """Every tensor of a checkpoint folder: model.safetensors, or shards listed by the index."""
    folder = paths.as_path(folder)
    if (folder / INDEX_NAME).exists():
        weight_map = json.loads((folder / INDEX_NAME).read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
    elif (folder / SINGLE_NAME).exists():
        files = [SINGLE_NAME]
    else:
        raise FileNotFoundError(f"no {SINGLE_NAME} or {INDEX_NAME} in {folder}")
    refs: dict[str, TensorRef] = {}
    for name in files:
        refs.update(_read_header(folder / name))
    return refs


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """A tensor to write: its name, shape, dtype, and a function producing its data on demand."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    produce: Callable[[], np.ndarray]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def write_file(file: epath.Path, specs: list[TensorSpec], metadata: dict[str, str]) -> None:
    """Write one safetensors file, producing and writing one tensor at a time."""
    header: dict = {"__metadata__": metadata}
    offset = 0
    for spec in specs:
        header[spec.name] = {
            "dtype": _CODES[np.dtype(spec.dtype)],
            "shape": list(spec.shape),
            "data_offsets": [offset, offset + spec.nbytes],
        }
        offset += spec.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # keep tensor data 8-byte aligned, as the format advises.
    with file.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for spec in specs:
            data = np.ascontiguousarray(spec.produce(), dtype=spec.dtype)
            if data.shape != tuple(spec.shape):
                raise ValueError(f"{spec.name}: produced {data.shape}, declared {spec.shape}")
            f.write(data.reshape(-1).view(np.uint8).data)
            del data


def write_checkpoint(
    folder: str | os.PathLike, specs: Iterable[TensorSpec], max_shard_size: int
) -> list[epath.Path]:
    """Write model.safetensors, or shards + index when specs exceed max_shard_size bytes."""
    folder = paths.as_path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for spec in specs:
        if shards[-1] and size + spec.nbytes > max_shard_size:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += spec.nbytes
    metadata = {"format": "pt"}  # transformers refuses files without a known format.
    if len(shards) == 1:
        write_file(folder / SINGLE_NAME, shards[0], metadata)
        return [folder / SINGLE_NAME]
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for name, shard in zip(names, shards):
        write_file(folder / name, shard, metadata)
    index = {
        "metadata": {"total_size": sum(s.nbytes for shard in shards for s in shard)},
        "weight_map": {s.name: name for name, shard in zip(names, shards) for s in shard},
    }
    (folder / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
    return [folder / name for name in names]
