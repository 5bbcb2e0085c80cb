"""User inputs (--inputs): .npz, .json or a TFRecord file of tf.Example read into batches, each value cast to its
InputSpec's dtype without a lossy cast and checked against its shape."""
from __future__ import annotations

import base64
import json
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from exportkit.dtypes import is_string, numpy_dtype
from exportkit.errors import UsageError
from exportkit.inputs.npz import check_npz_sizes, contiguous, decode_strings, restore_void
from exportkit.inputs.spec import InputSpec
from exportkit.inputs.tfrecord import tfrecord_records

_FIX_DTYPE = "store each input with the signature's dtype (`exportkit inspect PATH` lists them)"
_FIX_SHAPE = "store each input with the signature's shape (`exportkit inspect PATH` lists them; -1 = any size)"


def cast_input(key: str, value: Any, spec: InputSpec, where: str = "") -> np.ndarray:
    """Convert one loaded value to the spec's dtype, refusing lossy casts; check rank and fixed dims."""
    at = f" in {where}" if where else ""
    arr = value if isinstance(value, np.ndarray) else None
    if is_string(spec.dtype):
        if arr is None:
            arr = np.asarray(value, dtype=object)
        if arr.dtype.kind not in "SUO":
            raise UsageError(f"input {key!r}{at} must hold strings, got {arr.dtype.name} values", _FIX_DTYPE)
        try:
            arr = decode_strings(arr)
        except TypeError as e:
            raise UsageError(f"input {key!r}{at} must hold strings, found a {e} value", _FIX_DTYPE) from None
    else:
        dt = numpy_dtype(spec.dtype)
        if arr is None:
            try:
                arr = np.asarray(value)
            except ValueError as e:  # ragged nested lists
                raise UsageError(f"input {key!r}{at} is not a rectangular array: {e}",
                                 "give every row the same length (pad it)") from None
        arr = restore_void(arr)
        if arr.dtype.kind in "SUO":
            raise UsageError(f"input {key!r}{at} must be {spec.dtype}, got strings/objects", _FIX_DTYPE)
        src_kind = "f" if (arr.dtype.kind == "V") else arr.dtype.kind
        if dt.kind in "iub" and src_kind in "fc":
            with np.errstate(invalid="ignore"):
                if not np.all(np.isfinite(arr)) or not np.all(np.asarray(arr, np.float64) == np.round(np.asarray(arr, np.float64))):
                    raise UsageError(f"input {key!r}{at} must be {spec.dtype}, got non-integer values",
                                     f"store whole numbers (e.g. np.round(x).astype('{spec.dtype}')); exportkit never "
                                     f"rounds inputs for you")
        if dt.kind in "iu" and arr.size and src_kind in "iufb":
            info = np.iinfo(dt)
            lo, hi = np.min(arr), np.max(arr)
            if lo < info.min or hi > info.max:
                raise UsageError(f"input {key!r}{at}: values {lo}..{hi} do not fit {spec.dtype}",
                                 f"keep the values within [{info.min}, {info.max}]")
        if dt.kind == "b" and src_kind in "iuf" and arr.size and not np.all((arr == 0) | (arr == 1)):
            raise UsageError(f"input {key!r}{at} must be bool (0/1, true/false)", _FIX_DTYPE)
        arr = contiguous(arr.astype(dt))
    if spec.shape is not None:
        if arr.ndim != len(spec.shape):
            raise UsageError(f"input {key!r}{at} has shape {tuple(arr.shape)}, expected rank {len(spec.shape)} "
                             f"(signature shape {_fmt_shape(spec.shape)})", _FIX_SHAPE)
        for i, (got, want) in enumerate(zip(arr.shape, spec.shape)):
            if want is not None and want >= 0 and got != want:
                raise UsageError(f"input {key!r}{at} has shape {tuple(arr.shape)}; dim {i} must be {want} "
                                 f"(signature shape {_fmt_shape(spec.shape)})", _FIX_SHAPE)
    return arr


def _fmt_shape(shape: list[int]) -> str:
    return "[" + ", ".join("?" if d is None or d < 0 else str(d) for d in shape) + "]"


def _check_keys(got: set[str], specs: list[InputSpec], where: str) -> None:
    expected = [s.key for s in specs]
    missing = [k for k in expected if k not in got]
    unknown = sorted(k for k in got if k not in set(expected))
    if missing or unknown:
        what = []
        if missing:
            what.append("missing input " + ", ".join(repr(k) for k in missing))
        if unknown:
            what.append("unknown input " + ", ".join(repr(k) for k in unknown))
        raise UsageError(f"{where}: {'; '.join(what)}", "the signature's inputs are: " + ", ".join(expected))


def _check_batch_dims(batch: dict[str, np.ndarray], specs: list[InputSpec], where: str) -> None:
    sizes = {s.key: batch[s.key].shape[0] for s in specs
             if s.shape is not None and len(s.shape) >= 1 and batch[s.key].ndim >= 1}
    if len(set(sizes.values())) > 1:
        raise UsageError(f"{where}: inputs disagree on the batch size (leading dim): "
                         + ", ".join(f"{k}={v}" for k, v in sizes.items()),
                         "give every input the same number of rows (the first dimension)")


def _json_value(v: Any) -> Any:
    """JSON strings -> utf-8 bytes; {"b64": "..."} (TF Serving REST convention) -> raw bytes."""
    if isinstance(v, list):
        return [_json_value(x) for x in v]
    if isinstance(v, dict) and set(v) == {"b64"}:
        return base64.b64decode(v["b64"])
    return v


def load_inputs(path: str | os.PathLike, specs: list[InputSpec]) -> list[dict[str, np.ndarray]]:
    """Load user inputs: `.npz` keyed by input name (one batch; the leading axis is the batch) or `.json`
    (`{"key": nested list}` = one batch, a list of such objects = several batches; `{"inputs": {...}}` as in
    TF Serving's REST API is accepted too; strings become utf-8 bytes, `{"b64": ...}` raw bytes), or a TFRecord
    file of serialized tf.Example (`.tfrecord`, `.tfrecords`, `.tfr`, optionally gzipped) for a signature whose
    only input is serialized tf.Example (one batch of all records).

    Keys must be exactly the signature's inputs; values are cast to the spec dtype (no lossy casts).
    """
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"no such inputs file: {p}", "pass an .npz keyed by input name, or a .json file")
    suffix = p.suffix.lower()
    by_key = {s.key: s for s in specs}
    if suffix == ".npz":
        try:
            with np.load(p, allow_pickle=False) as z:
                check_npz_sizes(z, p)
                raw = [{k: z[k] for k in z.files}]
        except ValueError as e:
            raise UsageError(f"cannot read {p}: {e}",
                             "store strings as fixed-width bytes (np.array(values, dtype='S')), not objects") from None
        except (OSError, zipfile.BadZipFile) as e:
            raise UsageError(f"cannot read {p}: {e}", "write it with numpy.savez(path, key=array, ...)") from None
    elif suffix in TFRECORD_SUFFIXES or p.name.lower().endswith(tuple(f"{x}.gz" for x in TFRECORD_SUFFIXES)):
        return [_load_tfrecord_examples(p, specs)]
    elif suffix == ".json":
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError) as e:  # RecursionError: nested too deeply
            raise UsageError(f"{p} is not valid JSON: {e}",
                             "fix the file (json.dump of {\"key\": nested list})") from None
        if isinstance(doc, dict) and set(doc) == {"inputs"} and "inputs" not in by_key and isinstance(doc["inputs"], dict):
            doc = doc["inputs"]
        if isinstance(doc, dict):
            doc = [doc]
        if not isinstance(doc, list) or not doc or not all(isinstance(d, dict) for d in doc):
            raise UsageError(f"{p}: expected an object {{\"input_key\": nested list}} or a non-empty list of them",
                             "write one object per batch, keyed by the signature's input names")
        raw = [{k: _json_value(v) for k, v in d.items()} for d in doc]
    else:
        raise UsageError(f"unsupported inputs file {p.name!r}",
                         "use .npz (keyed by input name), .json, or a .tfrecord of tf.Example")
    batches = []
    for i, r in enumerate(raw):
        where = f"{p.name}" + (f" batch {i}" if len(raw) > 1 else "")
        _check_keys(set(r), specs, where)
        batch = {s.key: cast_input(s.key, r[s.key], s, where) for s in specs}
        _check_batch_dims(batch, specs, where)
        batches.append(batch)
    return batches


TFRECORD_SUFFIXES = (".tfrecord", ".tfrecords", ".tfr")


def _load_tfrecord_examples(p: Path, specs: list[InputSpec]) -> dict[str, np.ndarray]:
    example_specs = [s for s in specs if s.examples is not None]
    if len(specs) != 1 or len(example_specs) != 1:
        raise UsageError(f"{p.name} is a TFRecord file, but this signature's inputs are not one serialized tf.Example "
                         f"input (inputs: {', '.join(s.key for s in specs)})",
                         "pass --inputs as .npz or .json keyed by input name")
    spec = example_specs[0]
    records = list(tfrecord_records(str(p)))
    if not records:
        raise UsageError(f"{p} holds no records", "write at least one serialized tf.Example")
    values = np.empty(len(records), dtype=object)
    values[:] = records
    problem = spec.examples.check(values)
    if problem:
        raise UsageError(f"{p.name}: {problem} (the signature parses {spec.examples.describe()})",
                         "write tf.train.Example protos with the features the model parses")
    shape = spec.shape or [-1]
    return {spec.key: values.reshape([len(records)] + [1] * (len(shape) - 1))}
