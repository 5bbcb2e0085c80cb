"""The .npz batch format: the batches export records (golden), verify saves (--save-inputs/--save-outputs), the
runtimes' workers exchange and --save-failures writes, readable with `numpy.load(..., allow_pickle=False)`.

* Strings in memory are `object` arrays of `bytes` (what TensorFlow returns for tf.string). On disk they are
  fixed-width `S` arrays so that no pickle is needed. numpy drops trailing NUL bytes of `S` elements, so when an
  element ends with NUL, `write_batch_members` also writes `<key>.__len__` (int64 byte lengths) and
  `read_batch_members` restores the exact bytes.
* bfloat16 arrays (ml_dtypes) are stored in .npy as 2-byte void (`|V2`) by numpy; `restore_void` views any `|V2`
  array as bfloat16 again (for --inputs too).
"""
from __future__ import annotations

import itertools
import math
import os
import re
import zipfile
from pathlib import Path

import numpy as np

from exportkit.errors import UsageError
from exportkit import storage
from exportkit.inputs.tfrecord import DEFLATE_MAX_RATIO


def decode_strings(arr: np.ndarray) -> np.ndarray:
    """Strings as exportkit holds them: an object array of bytes (str elements encoded as utf-8); TypeError names
    the type of an element that is no string."""
    out = np.empty(arr.shape, dtype=object)
    if arr.dtype.kind == "S":  # at C speed: its elements are bytes (trailing NULs dropped, as bytes(v) drops them)
        out[...] = arr.tolist()
        return out
    for idx in np.ndindex(*arr.shape):
        v = arr[idx]
        if isinstance(v, (bytes, np.bytes_)):
            out[idx] = bytes(v)
        elif isinstance(v, (str, np.str_)):
            out[idx] = str(v).encode("utf-8")
        else:
            raise TypeError(type(v).__name__)
    return out


def restore_void(arr: np.ndarray) -> np.ndarray:
    """numpy writes bfloat16 as |V2: view it as bfloat16 again."""
    if arr.dtype.kind == "V" and arr.dtype.itemsize == 2 and arr.dtype.names is None:
        import ml_dtypes

        return arr.view(ml_dtypes.bfloat16)
    return arr


def check_npz_sizes(z, p: Path) -> None:
    """Every member's .npy header declares no more bytes than the member holds (and a deflated member no more
    than deflate can expand to): a lying header is a UsageError naming the member, not a MemoryError."""
    for member in z.zip.infolist():
        with z.zip.open(member) as fh:
            try:
                fmt = np.lib.format
                version = fmt.read_magic(fh)
                shape, _, dtype = (fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0)(fh)
            except (ValueError, OSError, EOFError) as e:
                raise UsageError(f"cannot read {p}: member {member.filename}: {e}",
                                 "write it with numpy.savez(path, key=array, ...)") from None
            declared = math.prod(shape) * dtype.itemsize
            holds = member.file_size - fh.tell()
            if member.compress_type != zipfile.ZIP_STORED:
                holds = min(holds, member.compress_size * DEFLATE_MAX_RATIO)
        if declared > holds:
            raise UsageError(f"cannot read {p}: member {member.filename} declares shape {shape} of {dtype} "
                             f"({declared} bytes), but holds {max(holds, 0)}",
                             "the file is damaged or not written by numpy.savez: write it again")


def _for_npz(arr: np.ndarray) -> np.ndarray:
    arr = np.asarray(arr)
    if _all_bytes(arr):  # the common case (serialized tf.Examples) at C speed; numpy sizes S to the longest
        return np.array(arr.tolist(), dtype="S")
    if arr.dtype.kind in "UO":
        try:
            b = decode_strings(arr)
        except TypeError as e:
            raise ValueError(f"cannot save an object array holding {e} values without pickle") from None
        width = max((len(x) for x in b.flat), default=1) or 1
        return np.array(b.tolist() if b.ndim else b[()], dtype=f"S{width}").reshape(arr.shape)
    return arr


def _all_bytes(arr: np.ndarray) -> bool:
    """An object array of bytes and nothing else (not empty)."""
    return arr.dtype.kind == "O" and arr.size > 0 and set(map(type, arr.flat)) == {bytes}


def _ends_with_nul(arr: np.ndarray) -> bool:
    """Whether a bytes element ends with NUL (an `S` array would drop it: see write_batch_members)."""
    if _all_bytes(arr):
        return any(map(bytes.endswith, arr.flat, itertools.repeat(b"\0")))
    return arr.dtype.kind in "OS" and any(isinstance(x, (bytes, np.bytes_)) and bytes(x).endswith(b"\0")
                                          for x in arr.flat)


def batch_bytes(batch: dict[str, np.ndarray]) -> int:
    """A batch's size: its arrays' bytes, strings counted by their length."""
    size = 0
    for value in batch.values():
        value = np.asarray(value)
        try:
            size += sum(map(len, value.flat)) if value.dtype == object else value.nbytes
        except TypeError:  # objects that are not strings
            size += value.nbytes
    return size


LENGTHS_SUFFIX = ".__len__"


def contiguous(arr: np.ndarray) -> np.ndarray:
    """C-contiguous, keeping 0-d arrays 0-d (np.ascontiguousarray makes them 1-d)."""
    arr = np.asarray(arr)
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


def _exact_strings(arr: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    width = arr.dtype.itemsize
    raw = contiguous(arr).view(np.uint8).reshape(-1, width) if width else np.zeros((arr.size, 0), np.uint8)
    out = np.empty(arr.shape, dtype=object)
    for i, (row, n) in enumerate(zip(raw, lengths.reshape(-1))):
        out.reshape(-1)[i] = row[: int(n)].tobytes()
    return out


def _batch_name(prefix: str, i: int) -> str:
    return f"{prefix}_batch_{i}.npz" if prefix else f"batch_{i}.npz"


def save_batches(dir: str | os.PathLike, batches: list[dict[str, np.ndarray]], prefix: str = "") -> list[Path]:
    """Write `[<prefix>_]batch_<i>.npz` files (readable with `numpy.load(..., allow_pickle=False)`), all or none.

    Any key is allowed (even "file" or ones with "/"): the zip members are written directly.
    Returns the paths written.
    """
    return save_batch_sets(dir, {prefix: batches})


def save_batch_sets(dir: str | os.PathLike, sets: dict[str, list[dict[str, np.ndarray]]],
                    what: str | None = None) -> list[Path]:
    """save_batches for several prefixes (e.g. one per runtime), all of them or none: staged, then moved into
    `dir` together (files.StagedDir), so a full disk never leaves one runtime's files without the next one's.
    `what` names the destination in an error (default: the directory)."""
    with storage.staged_dir(dir, what or str(dir)) as stage:  # a bucket URL: uploaded when all are written
        for prefix, batches in sets.items():
            for i, batch in enumerate(batches):
                write_npz(stage / _batch_name(prefix, i), batch)
    names = [_batch_name(prefix, i) for prefix, batches in sets.items() for i in range(len(batches))]
    return [storage.join(str(dir), n) if storage.is_url(dir) else Path(dir) / n for n in names]


def write_npz(path: str | os.PathLike, batch: dict[str, np.ndarray]) -> None:
    """One batch as an uncompressed .npz (see write_batch_members)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        write_batch_members(zf, batch)


def write_batch_members(zf: zipfile.ZipFile, batch: dict[str, np.ndarray], prefix: str = "") -> None:
    """One `<prefix><key>.npy` member per array of `batch` (strings as `S` arrays, exact lengths where needed)."""
    for key, arr in batch.items():
        members = {key: _for_npz(arr)}
        if _ends_with_nul(np.asarray(arr)):
            members[key + LENGTHS_SUFFIX] = np.array([len(x) for x in np.asarray(arr).flat],
                                                     dtype=np.int64).reshape(np.shape(arr))
        for name, value in members.items():
            with zf.open(f"{prefix}{name}.npy", "w", force_zip64=True) as fh:
                np.lib.format.write_array(fh, contiguous(value), allow_pickle=False)


def read_batch_members(z, prefix: str = "") -> dict[str, np.ndarray]:
    """The batch `write_batch_members` wrote under `prefix` into an open `np.load` archive."""
    names = [k[len(prefix):] for k in z.files if k.startswith(prefix)]
    files = set(names)
    batch = {}
    for k in names:
        if k.endswith(LENGTHS_SUFFIX) and k[: -len(LENGTHS_SUFFIX)] in files:
            continue
        arr = restore_void(z[prefix + k])
        if arr.dtype.kind == "S" and k + LENGTHS_SUFFIX in files:
            batch[k] = _exact_strings(arr, z[prefix + k + LENGTHS_SUFFIX])
        else:
            batch[k] = decode_strings(arr) if arr.dtype.kind in "SU" else arr
    return batch


def load_batches(dir: str | os.PathLike, prefix: str = "") -> list[dict[str, np.ndarray]]:
    """Read what `save_batches` wrote, in batch order; strings come back as object arrays of bytes."""
    d = Path(dir)
    pat = re.compile(re.escape(f"{prefix}_batch_" if prefix else "batch_") + r"(\d+)\.npz")
    found = sorted((int(m.group(1)), f) for f in (d.iterdir() if d.is_dir() else [])
                   if (m := pat.fullmatch(f.name)) and f.is_file())  # a FIFO would block the read
    if not found:
        raise UsageError(f"no {_batch_name(prefix, 0).replace('0', '<i>')} files in {d}",
                         "pass the directory --save-inputs/--save-outputs wrote")
    return [read_npz(f) for _, f in found]


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """One batch file (write_npz's), its members' sizes checked first."""
    with np.load(path, allow_pickle=False) as z:
        check_npz_sizes(z, path)
        return read_batch_members(z)
