"""Batches of inputs and outputs, shared by export, the runtimes and their workers, and verify: InputSpec,
generated batches (deterministic by seed), user inputs from .npz/.json, and the .npz batch format on disk.

No TensorFlow here. Conventions:

* A batch is `dict[input_key, np.ndarray]`; every runtime gets the very same arrays.
* Strings in memory are `object` arrays of `bytes` (what TensorFlow returns for tf.string). On disk (.npz) they
  are fixed-width `S` arrays so that no pickle is needed. numpy drops trailing NUL bytes of `S` elements, so when
  an element ends with NUL, `save_batches` also writes `<key>.__len__` (int64 byte lengths) and `load_batches`
  restores the exact bytes.
* bfloat16 arrays (ml_dtypes) are stored in .npy as 2-byte void (`|V2`) by numpy; `load_batches` and
  `load_inputs` view any `|V2` array as bfloat16 again.
* Shapes use -1 for an unknown dim. The first dim is the batch dim when the rank is >= 1.
"""
from __future__ import annotations

import base64
import gzip
import json
import math
import os
import re
import struct
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from exportkit.dtypes import is_string, numpy_dtype
from exportkit.errors import UsageError
from exportkit.files import staged_dir

# Unknown non-batch dims (e.g. a sequence length) are generated with this size: long enough to exercise
# recurrences, masks and pooling (1 would hide bugs that only show with length > 1), small enough to stay cheap.
# The same value for every input, so inputs whose unknown dims must agree (tokens and their mask) do agree.
DEFAULT_UNKNOWN_DIM = 8
STRING_ALPHABET = b"abcdefghijklmnopqrstuvwxyz"
STRING_MAX_LEN = 8


@dataclass
class InputSpec:
    key: str
    dtype: str  # numpy dtype name ("float32", "int64", "bool", "bfloat16", ...) or "string"
    shape: list[int] | None = field(default_factory=list)  # -1 = unknown dim; None = unknown rank
    examples: Any = None  # exportkit.tfexample.signatures.ExampleSpec (generate, check, describe) for serialized tf.Example


DEFAULT_INT_RANGE = (0, 10)
_RANGE = r"\s*(-?\d+)\s*:\s*(-?\d+)\s*"


def parse_int_range(spec: str) -> tuple[int, int]:
    """`"LO:HI"` -> (LO, HI), half-open [LO, HI), LO < HI; negative numbers allowed (`-5:5`)."""
    m = re.fullmatch(_RANGE, spec or "")
    if not m:
        raise UsageError(f"bad --int-range {spec!r}", "expected LO:HI or NAME=LO:HI with integers, e.g. --int-range "
                                                      "0:10 or --int-range token_ids=0:30522")
    lo, hi = int(m.group(1)), int(m.group(2))
    if lo >= hi:
        raise UsageError(f"bad --int-range {spec!r}: LO must be < HI (the range is [LO, HI))",
                         "e.g. --int-range 0:10")
    return lo, hi


def format_int_range(lo_hi: tuple[int, int]) -> str:
    return f"{lo_hi[0]}:{lo_hi[1]}"


@dataclass(frozen=True)
class IntRanges:
    """The values of generated integer inputs: [LO, HI) per input key, else `default`."""

    default: tuple[int, int] = DEFAULT_INT_RANGE
    by_input: dict[str, tuple[int, int]] = field(default_factory=dict)

    def of(self, key: str) -> tuple[int, int]:
        return self.by_input.get(key, self.default)

    def describe(self) -> str:
        return ", ".join(f"{k}={format_int_range(v)}" for k, v in self.by_input.items())

    def to_manifest(self) -> dict:
        """The manifest's golden entries: `int_range` (what older readers use) and `int_ranges` per input."""
        return {"int_range": format_int_range(self.default),
                "int_ranges": {k: format_int_range(v) for k, v in self.by_input.items()}}

    @classmethod
    def from_manifest(cls, golden: dict | None) -> "IntRanges":
        golden = golden or {}
        return cls(parse_int_range(golden.get("int_range") or format_int_range(DEFAULT_INT_RANGE)),
                   {k: parse_int_range(v) for k, v in (golden.get("int_ranges") or {}).items()})


def int_range_texts(value) -> list[str]:
    """--int-range values (repeatable) or exportkit.toml's int_range (a string or a list) as a list."""
    if value is None or value == "":
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]


def is_integer(dtype: str) -> bool:
    """An integer dtype name (int8 ... uint64): the inputs --int-range and derived ranges apply to."""
    try:
        return not is_string(dtype) and numpy_dtype(dtype).kind in "iu"
    except (TypeError, ValueError, KeyError):
        return False


def integer_keys(specs: list[InputSpec]) -> list[str]:
    """The inputs that hold integers (serialized Examples are strings, their features follow the default)."""
    return [s.key for s in specs if s.examples is None and is_integer(s.dtype)]


@dataclass(frozen=True)
class IntRangeFlags:
    """--int-range values, parsed once where the options are read: the plain `LO:HI` (every integer input) or
    None, and {NAME: range} of the `NAME=LO:HI` ones."""

    plain: tuple[int, int] | None = None
    named: dict[str, tuple[int, int]] = field(default_factory=dict)


def parse_int_range_flags(texts) -> IntRangeFlags:
    """--int-range values (a list, or exportkit.toml's string or list) -> IntRangeFlags; the last wins."""
    plain, named = None, {}
    for text in int_range_texts(texts):
        name, sep, lo_hi = text.partition("=") if "=" in text else ("", "", text)
        if sep and not name.strip():
            raise UsageError(f"bad --int-range {text!r}: no input name before '='", "write NAME=LO:HI")
        if sep:
            named[name.strip()] = parse_int_range(lo_hi)
        else:
            plain = parse_int_range(lo_hi)
    return IntRangeFlags(plain, named)


def resolve_int_ranges(flags: IntRangeFlags, integer_keys: list[str], found: IntRanges | None = None) -> IntRanges:
    """--int-range values over what is `found` (derived from the model, or recorded by export): `NAME=LO:HI` sets
    one input, a plain `LO:HI` every integer input without its own; nothing given keeps what was found. Every
    integer input gets its range by name (so that the manifest records each)."""
    plain, named = flags.plain, flags.named
    unknown = sorted(set(named) - set(integer_keys))
    if unknown:
        raise UsageError(f"--int-range names {', '.join(unknown)}, which {'is' if len(unknown) == 1 else 'are'} not "
                         f"an integer input", "integer inputs: " + (", ".join(integer_keys) or "none"))
    found = found or IntRanges()
    default = plain or found.default
    return IntRanges(default, {key: named.get(key) or plain or found.by_input.get(key) or default
                               for key in integer_keys})


def recorded_int_ranges(flags: IntRangeFlags, manifest: dict | None, signatures: dict) -> IntRanges:
    """The ranges a SavedModel's inputs are generated from (verify, compat --run, inspect --requests): what its
    export recorded (exportkit's manifest; else the default), with --int-range over them. `signatures`: in
    savedmodel.signatures_of's form."""
    keys = sorted({key for signature in signatures.values() for key, info in signature.get("inputs", {}).items()
                   if is_integer(info.get("dtype") or "")})
    return resolve_int_ranges(flags, keys, IntRanges.from_manifest((manifest or {}).get("golden")))


def _has_dynamic_batch(spec: InputSpec) -> bool:
    return spec.shape is None or (len(spec.shape) >= 1 and (spec.shape[0] is None or spec.shape[0] < 0))


def _concrete_shape(spec: InputSpec, batch: int, unknown_dim: int) -> tuple[int, ...]:
    if spec.shape is None:  # unknown rank: a batch of vectors
        return (batch, unknown_dim)
    dims = []
    for i, d in enumerate(spec.shape):
        if d is None or d < 0:
            dims.append(batch if i == 0 else unknown_dim)
        else:
            dims.append(int(d))
    return tuple(dims)


def _random_array(spec: InputSpec, shape: tuple[int, ...], rng: np.random.Generator,
                  int_range: tuple[int, int]) -> np.ndarray:
    """Random values for one input; integers uniform in `int_range` [LO, HI), clipped to the dtype."""
    if spec.examples is not None:
        return spec.examples.generate(shape, rng, int_range)
    if is_string(spec.dtype):
        out = np.empty(shape, dtype=object)
        for idx in np.ndindex(*shape):
            n = int(rng.integers(1, STRING_MAX_LEN + 1))
            out[idx] = bytes(rng.choice(np.frombuffer(STRING_ALPHABET, dtype=np.uint8), size=n).tolist())
        return out
    dt = numpy_dtype(spec.dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dt.kind in "iu" or dt.name in ("int4", "uint4", "int2", "uint2"):
        if dt.kind in "iu":
            info = np.iinfo(dt)
        else:  # int4 and friends: ml_dtypes' (imported only here: it costs 0.6 s)
            import ml_dtypes

            info = ml_dtypes.iinfo(dt)
        lo, hi = max(int_range[0], int(info.min)), min(int_range[1], int(info.max) + 1)
        if lo >= hi:
            raise UsageError(f"--int-range {int_range[0]}:{int_range[1]} has no value of {dt.name} "
                             f"(input {spec.key!r})", f"use a range within [{info.min}, {info.max}]")
        return rng.integers(lo, hi, size=shape, dtype=np.int64 if info.min < 0 else np.uint64).astype(dt)
    if dt.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    if dt.kind == "f" or dt.kind == "V":  # V: ml_dtypes floats (bfloat16, float8 ...)
        return rng.standard_normal(shape).astype(dt)
    raise UsageError(f"cannot generate inputs of dtype {spec.dtype!r} (input {spec.key!r})",
                     "pass --inputs with an .npz or .json file")


def generate_batches(specs: list[InputSpec], samples: int, seed: int,
                     int_range: tuple[int, int] | IntRanges = DEFAULT_INT_RANGE,
                     unknown_dim: int = DEFAULT_UNKNOWN_DIM) -> list[dict[str, np.ndarray]]:
    """Random input batches: batch size 1, then batch size `samples` (only the first if samples == 1).

    * The leading -1 dim is the batch size; other -1 dims become `unknown_dim` (8). Fixed dims are kept.
    * If no input has a dynamic batch dim (all fixed or scalar), a single batch is generated: other batch sizes
      would be rejected.
    * floats: standard normal cast to the dtype; ints: uniform in [lo, hi) clipped to the dtype's range (one
      range for all, or IntRanges: one per input; serialized Examples use its default);
      bools: fair coin; strings: object arrays of 1..8 random lowercase ASCII letters (bytes).
    * Deterministic: every (batch, input) pair has its own generator seeded by (seed, batch index, crc32(key)),
      so adding or reordering inputs does not change the values of the others.
    * The batch of `samples` starts with the row of the batch of 1, so the two prove batch independence (export's
      golden record and verify's generated batches are then the same batches, run once).
    """
    if samples < 1:
        raise UsageError(f"--samples must be >= 1, got {samples}", "pass --samples 8 (for example)")
    if unknown_dim < 1:
        raise UsageError(f"unknown_dim must be >= 1, got {unknown_dim}", "pass a positive size")
    ranges = int_range if isinstance(int_range, IntRanges) else IntRanges(tuple(int_range))
    sizes = [1] if samples == 1 else [1, samples]
    if specs and not any(_has_dynamic_batch(s) for s in specs):
        sizes = [1]
    batches = []
    for b, size in enumerate(sizes):
        batch = {}
        for spec in specs:
            rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, b, zlib.crc32(spec.key.encode("utf-8"))])
            lo_hi = ranges.default if spec.examples is not None else ranges.of(spec.key)
            batch[spec.key] = _random_array(spec, _concrete_shape(spec, size, unknown_dim), rng, lo_hi)
        batches.append(batch)
    if len(batches) == 2:
        single, many = batches
        for key, value in many.items():
            if np.ndim(value) and np.ndim(single[key]) and np.shape(value)[1:] == np.shape(single[key])[1:]:
                value[:1] = single[key]
    return batches


# --------------------------------------------------------------------------------------------- load / cast


def _decode_strings(arr: np.ndarray) -> np.ndarray:
    out = np.empty(arr.shape, dtype=object)
    for idx in np.ndindex(*arr.shape):
        v = arr[idx]
        if isinstance(v, (bytes, np.bytes_)):
            out[idx] = bytes(v)
        elif isinstance(v, (str, np.str_)):
            out[idx] = str(v).encode("utf-8")
        else:
            raise TypeError(type(v).__name__)
    return out


def _restore_void(arr: np.ndarray) -> np.ndarray:
    """numpy writes bfloat16 as |V2: view it as bfloat16 again."""
    if arr.dtype.kind == "V" and arr.dtype.itemsize == 2 and arr.dtype.names is None:
        import ml_dtypes

        return arr.view(ml_dtypes.bfloat16)
    return arr


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
            arr = _decode_strings(arr)
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
        arr = _restore_void(arr)
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
        arr = _contig(arr.astype(dt))
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
                _check_npz_sizes(z, p)
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


def _check_npz_sizes(z, p: Path) -> None:
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
                holds = min(holds, member.compress_size * _DEFLATE_MAX_RATIO)
        if declared > holds:
            raise UsageError(f"cannot read {p}: member {member.filename} declares shape {shape} of {dtype} "
                             f"({declared} bytes), but holds {max(holds, 0)}",
                             "the file is damaged or not written by numpy.savez: write it again")


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


_FIX_TFRECORD = "pass TFRecord files (tf.io.TFRecordWriter), uncompressed or GZIP, or .npz shards"
_FIX_DAMAGED = "the file is damaged (TensorFlow's reader refuses it too: DataLossError): write it again, or leave it out"
_DEFLATE_MAX_RATIO = 1032  # deflate's largest expansion: no record of a gzipped file can be longer than this bounds
_READ_BLOCK = 1 << 20  # TFRecord files are read a block of this size at a time (tfrecord_blocks)


def masked_crc32c(data: bytes) -> int:
    """The CRC TFRecordWriter stores: CRC-32C, rotated right by 15 bits plus a constant (tsl/lib/hash/crc32c.h)."""
    import google_crc32c

    return _masked(google_crc32c.value(data))


def _masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord_records(path: str) -> Iterator[bytes]:
    """The data of every record of a TFRecord file, checked as tfrecord_blocks checks it."""
    for _, _, records, _ in tfrecord_blocks(path):
        yield from records


def tfrecord_blocks(path: str) -> Iterator[tuple[int, list[int], list[bytes], int]]:
    """(index of the first, offsets, data, compressed position read so far) of the records of a TFRecord file, one
    block of the file at a time (GZIP is detected by its magic bytes). Both CRCs are checked, as TensorFlow's reader
    does (a mismatch is its DataLossError), and a length is bounded by what the file can hold: a bad record is a
    UsageError naming FILE:INDEX, raised once the records before it were given. Records are cut out of whole blocks:
    a read or two per record cost `verify --data` a third of a second per 100k records."""
    from google_crc32c import value as crc32c

    with open(path, "rb") as raw:
        size = os.fstat(raw.fileno()).st_size
        gzipped = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        stream = gzip.GzipFile(fileobj=raw, mode="rb") if gzipped else raw
        index, offset, buf, need, ended, failure = 0, 0, b"", 12, False, None

        def bad(problem: str, fix: str = _FIX_DAMAGED) -> UsageError:
            if failure is not None:  # the file could not be read further: that is why the record is short
                return UsageError(f"record {path}:{index}: cannot read it: {failure}",
                                  "pass TFRecord files, uncompressed or GZIP (other compressions are not supported)")
            return UsageError(f"record {path}:{index} (byte {offset}): {problem}", fix)

        while True:
            parts, have = [buf], len(buf)
            while have < need and not ended:  # a lying length costs what the file holds, not what it claims
                try:
                    block = stream.read(_READ_BLOCK)
                except (OSError, EOFError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
                    block, failure = b"", err
                ended = not block
                parts.append(block)
                have += len(block)
            buf = b"".join(parts)
            pos, first, offsets, records, problem = 0, index, [], [], None
            while have - pos >= 12:
                length, length_crc = struct.unpack_from("<QI", buf, pos)
                if _masked(crc32c(buf[pos:pos + 8])) != length_crc:
                    problem = bad("its length CRC does not match (corrupted, or not TFRecord framing)", _FIX_TFRECORD)
                    break
                if length > (size * _DEFLATE_MAX_RATIO if gzipped else size - offset - 16):
                    problem = bad(f"declares {length} bytes, more than the file can hold (truncated, or a damaged "
                                  "length)")
                    break
                end = pos + 16 + length
                if end > have:
                    break
                data = buf[pos + 12:end - 4]
                if _masked(crc32c(data)) != struct.unpack_from("<I", buf, end - 4)[0]:
                    problem = bad("its data CRC does not match (the record is corrupted)")
                    break
                records.append(data)
                offsets.append(offset)
                offset, index, pos = offset + 16 + length, index + 1, end
            if records:  # the records before a bad one are given first
                yield first, offsets, records, raw.tell()
            if problem is not None:
                raise problem
            buf, need = buf[pos:], (12 if have - pos < 12 else end - pos)
            if ended:
                if buf or failure is not None:  # bad() names a failed read as the reason
                    raise bad("truncated" if len(buf) >= 12 else "truncated (the file ends inside its length field)")
                return


# --------------------------------------------------------------------------------------------- save / load


def _for_npz(arr: np.ndarray) -> np.ndarray:
    arr = np.asarray(arr)
    if arr.dtype.kind in "UO":
        try:
            b = _decode_strings(arr)
        except TypeError as e:
            raise ValueError(f"cannot save an object array holding {e} values without pickle") from None
        width = max((len(x) for x in b.flat), default=1) or 1
        return np.array(b.tolist() if b.ndim else b[()], dtype=f"S{width}").reshape(arr.shape)
    return arr


LENGTHS_SUFFIX = ".__len__"


def _contig(arr: np.ndarray) -> np.ndarray:
    """C-contiguous, keeping 0-d arrays 0-d (np.ascontiguousarray makes them 1-d)."""
    arr = np.asarray(arr)
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


def _exact_strings(arr: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    width = arr.dtype.itemsize
    raw = _contig(arr).view(np.uint8).reshape(-1, width) if width else np.zeros((arr.size, 0), np.uint8)
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
    with staged_dir(dir, what or str(dir)) as stage:
        for prefix, batches in sets.items():
            for i, batch in enumerate(batches):
                write_npz(stage / _batch_name(prefix, i), batch)
    return [Path(dir) / _batch_name(prefix, i) for prefix, batches in sets.items() for i in range(len(batches))]


def write_npz(path: str | os.PathLike, batch: dict[str, np.ndarray]) -> None:
    """One batch as an uncompressed .npz (see write_batch_members)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        write_batch_members(zf, batch)


def write_batch_members(zf: zipfile.ZipFile, batch: dict[str, np.ndarray], prefix: str = "") -> None:
    """One `<prefix><key>.npy` member per array of `batch` (strings as `S` arrays, exact lengths where needed)."""
    for key, arr in batch.items():
        members = {key: _for_npz(arr)}
        if np.asarray(arr).dtype.kind in "OS" and any(
                isinstance(x, (bytes, np.bytes_)) and bytes(x).endswith(b"\0") for x in np.asarray(arr).flat):
            members[key + LENGTHS_SUFFIX] = np.array([len(x) for x in np.asarray(arr).flat],
                                                     dtype=np.int64).reshape(np.shape(arr))
        for name, value in members.items():
            with zf.open(f"{prefix}{name}.npy", "w", force_zip64=True) as fh:
                np.lib.format.write_array(fh, _contig(value), allow_pickle=False)


def read_batch_members(z, prefix: str = "") -> dict[str, np.ndarray]:
    """The batch `write_batch_members` wrote under `prefix` into an open `np.load` archive."""
    names = [k[len(prefix):] for k in z.files if k.startswith(prefix)]
    files = set(names)
    batch = {}
    for k in names:
        if k.endswith(LENGTHS_SUFFIX) and k[: -len(LENGTHS_SUFFIX)] in files:
            continue
        arr = _restore_void(z[prefix + k])
        if arr.dtype.kind == "S" and k + LENGTHS_SUFFIX in files:
            batch[k] = _exact_strings(arr, z[prefix + k + LENGTHS_SUFFIX])
        else:
            batch[k] = _decode_strings(arr) if arr.dtype.kind in "SU" else arr
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
    batches = []
    for _, f in found:
        with np.load(f, allow_pickle=False) as z:
            _check_npz_sizes(z, f)
            batches.append(read_batch_members(z))
    return batches
