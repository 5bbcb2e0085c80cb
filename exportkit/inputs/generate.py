"""Generated input batches: deterministic by seed, sizes 1 and --samples, integers within their ranges."""
from __future__ import annotations

import zlib

import numpy as np

from exportkit.dtypes import is_string, numpy_dtype
from exportkit.errors import UsageError
from exportkit.inputs.ranges import DEFAULT_INT_RANGE, IntRanges
from exportkit.inputs.spec import InputSpec

# Unknown non-batch dims (e.g. a sequence length) are generated with this size: long enough to exercise
# recurrences, masks and pooling (1 would hide bugs that only show with length > 1), small enough to stay cheap.
# The same value for every input, so inputs whose unknown dims must agree (tokens and their mask) do agree.
DEFAULT_UNKNOWN_DIM = 8
STRING_ALPHABET = b"abcdefghijklmnopqrstuvwxyz"
STRING_MAX_LEN = 8

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
