"""InputSpec: what one signature input is fed, the one description generation, loading and the runtimes share.

Shapes use -1 for an unknown dim (None for an unknown rank); the first dim is the batch dim when the rank is >= 1.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class InputSpec:
    key: str
    dtype: str  # numpy dtype name ("float32", "int64", "bool", "bfloat16", ...) or "string"
    shape: list[int] | None = field(default_factory=list)  # -1 = unknown dim; None = unknown rank
    examples: Any = None  # exportkit.tfexample.signatures.ExampleSpec (generate, check, describe) for serialized tf.Example
