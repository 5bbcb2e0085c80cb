"""Runtimes: one small interface, every runtime gets the very same input arrays.

    runtime.load()                                   # may raise CheckFailed (the model's fault) or InfraError
    runtime.run({input_key: ndarray}) -> {output_key: ndarray}
    runtime.close()

Attributes: `name` (golden | keras | saved_model | session | serving), `kind` (recorded | in-process |
subprocess | grpc), `device` ("cpu", "gpu" or None when unknown) and `server` (a dict describing the server
that answered, for the serving runtime; None elsewhere).
"""
from __future__ import annotations

from typing import Protocol

import numpy as np


class Runtime(Protocol):
    name: str
    kind: str
    device: str | None
    server: dict | None

    def load(self) -> None: ...

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...
