"""The shapes clients send: a non-batch dimension the signature leaves open (-1, or an unknown rank) is any size a
client picks. The ordinary batches fill it with one size (batches.DEFAULT_UNKNOWN_DIM); a model that breaks at
other sizes (a fixed-length reshape, a positional embedding of 64 rows on a [None, None] input) passes them. So
one extra batch of one row is run at size 1 and at a long size, on the serving-equivalent runtime only.

Pure functions: which sizes, the batch of one size, the finding for a failure.
"""
from __future__ import annotations

import math

from exportkit.inputs.generate import DEFAULT_UNKNOWN_DIM, generate_batches
from exportkit.inputs.spec import InputSpec
from exportkit.dtypes import is_string
from exportkit.findings import Finding

LONG_DIM = 256  # a long sequence / large image side: past the 64/128 limits models are built with
MAX_ROW_ELEMENTS = 1 << 20  # per input, per row: the long size shrinks so one row stays small (4 MB of float32)
MAX_STRING_ELEMENTS = 1 << 14  # strings are generated one by one (and cost more on the wire)


def open_dims(spec: InputSpec) -> list[int]:
    """The non-batch dims of `spec` a client chooses (an unknown rank counts as one: inputs/generate.py generates
    [batch, size] for it)."""
    if spec.shape is None:
        return [1]
    return [i for i, d in enumerate(spec.shape) if i > 0 and (d is None or d < 0)]


def _fixed(spec: InputSpec) -> int:
    return math.prod(int(d) for i, d in enumerate(spec.shape or []) if i > 0 and d is not None and d >= 0)


def probe_sizes(specs: list[InputSpec], default: int = DEFAULT_UNKNOWN_DIM) -> list[int]:
    """The sizes to try besides `default` (which the ordinary batches use): 1 and a long one (LONG_DIM, smaller
    where one row of an input would exceed the element cap); [] when no input has an open dim."""
    long = LONG_DIM
    for spec in specs:
        dims = open_dims(spec)
        if not dims or spec.examples is not None:
            continue
        cap = MAX_STRING_ELEMENTS if is_string(spec.dtype) else MAX_ROW_ELEMENTS
        long = min(long, int((cap / max(1, _fixed(spec))) ** (1 / len(dims))))
    if not any(open_dims(s) and s.examples is None for s in specs):
        return []
    return sorted({1, long} - {default} if long > default else {1} - {default})


def probe_batch(specs: list[InputSpec], size: int, seed: int, int_range) -> dict:
    """One row of inputs, every open dim `size` (the same size for every input: lengths that must match do)."""
    return generate_batches(specs, samples=1, seed=seed, int_range=int_range, unknown_dim=size)[0]


def describe_dims(specs: list[InputSpec]) -> str:
    """"input 'tokens' dim 1 ([-1, -1])" for every open dim."""
    parts = []
    for spec in specs:
        dims = open_dims(spec)
        if dims and spec.examples is None:
            shape = "<unknown rank>" if spec.shape is None else str(list(spec.shape))
            parts.append(f"input '{spec.key}' dim{'s' if len(dims) > 1 else ''} {', '.join(map(str, dims))} ({shape})")
    return ", ".join(parts)


def dim_failure(signature: str, specs: list[InputSpec], size: int, runtime: str, error: str) -> Finding:
    """The model fails at a size its signature allows: a client sending it gets this error. A warning, not an
    error: a signature cannot say "at most 512" (a positional table's length), so a model with such a limit has
    no signature that passes; the verdict names it all the same."""
    return Finding("warning", "dynamic-dim-fails",
                   f"signature '{signature}': {describe_dims(specs)} set to {size}, a size the signature allows: "
                   f"{runtime} fails ({error}); clients sending it get this error: declare the size the model takes "
                   f"(export --input-spec NAME:-1,SIZE:DTYPE), make the model accept any size, or tell clients the "
                   f"limit")
