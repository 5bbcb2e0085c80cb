"""Runtimes: one lifecycle, and every runtime gets the very same input arrays.

    with runtime:                                     # start() + load(); close() on exit
        runtime.run({input_key: ndarray}) -> {output_key: ndarray}

`start()` begins slow work early (a worker's TensorFlow import, a server launch) and returns at once, so that
several runtimes get ready in parallel; `load()` waits until the model is loaded and raises CheckFailed (the
model's fault) or InfraError. Fields: `name` (one of RUNTIME_NAMES), `kind` (recorded | in-process | subprocess |
grpc | rest), `device` asked for ("cpu", "gpu", or None when not ours to choose), `placed_on` (where the last outputs
were computed, e.g. "cpu:0", when the runtime can tell), `server` (who answered, for a server), `loaded`,
`signature_name` (the signature `run` answers for; `use_signature` switches it without loading again).

Runtimes are constructed in one place, exportkit.runtimes.factory (a RuntimeSpec -> a runtime), and batches go
through them in one loop, exportkit.runtimes.loop.
"""
from __future__ import annotations

import numpy as np

# Every runtime verify knows, in order of preference for the reference (`trained`: the training-time reference).
RUNTIME_NAMES = ("trained", "golden", "keras", "saved_model", "session", "serving", "rest")
# How each one computes (its class's `kind`), for reports about runtimes that were not started.
RUNTIME_KINDS = {"trained": "recorded", "golden": "recorded", "keras": "in-process", "saved_model": "subprocess",
                 "session": "subprocess", "serving": "grpc", "rest": "rest"}


class Runtime:
    name: str = ""
    kind: str = ""
    device: str | None = None
    placed_on: str | None = None
    server: dict | None = None
    loaded: bool = False
    signature_name: str | None = None

    def use_signature(self, name: str, input_dtypes: dict[str, str]) -> None:
        """Answer for signature `name` from now on (inputs keyed and typed as `input_dtypes`); a loaded model
        stays loaded, so one runtime serves every signature of a SavedModel."""
        self.signature_name = name

    def refusal(self) -> str | None:
        """Why this runtime cannot call the signature in use, as the real API it stands for refuses it (it is then
        skipped, and the report says why); None when it can."""
        return None

    def start(self) -> None:
        """Begin what takes long, without waiting for it. Safe to call more than once."""

    def load(self) -> None:
        self.start()
        self.loaded = True

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        raise NotImplementedError

    def close(self) -> None:
        self.loaded = False

    def __enter__(self):
        self.load()
        return self

    def __exit__(self, *exc) -> None:
        self.close()
