"""Several input/output batches in one .npz file, without pickle: keys are `<batch>/<tensor key>`.

Strings travel as fixed-width bytes (`S`) arrays and come back as object arrays of bytes, as TF returns them.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np


def _storable(array) -> np.ndarray:
    array = np.asarray(array)
    if array.dtype == object:
        return array.astype(np.bytes_)
    if array.dtype.kind == "U":
        return np.char.encode(array, "utf-8")
    return array


def save_batches(path: str | Path, batches: list[dict[str, np.ndarray]]) -> None:
    arrays = {f"{i}/{key}": _storable(value) for i, batch in enumerate(batches) for key, value in batch.items()}
    with open(path, "wb") as handle:
        np.savez(handle, **arrays)


def load_batches(path: str | Path) -> list[dict[str, np.ndarray]]:
    batches: dict[int, dict[str, np.ndarray]] = {}
    with np.load(path, allow_pickle=False) as data:
        for name in data.files:
            index, _, key = name.partition("/")
            value = data[name]
            if value.dtype.kind == "S":
                value = value.astype(object)
            batches.setdefault(int(index), {})[key] = value
    return [batches[i] for i in sorted(batches)]
