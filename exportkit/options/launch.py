"""How a launched TF Serving server is run (verify, compat and the Python API fill it from the same flags)."""
from __future__ import annotations

import os
from dataclasses import dataclass

from exportkit.errors import UsageError
from exportkit.options.server_flags import STOCK, ServerFlags


@dataclass(frozen=True)
class LaunchOptions:
    """How a launched server is run: the container CLI (docker, podman or a path) and whether a missing image may
    be pulled (docker mode), a TF Serving BatchingParameters text proto to serve with `--enable_batching`, and the
    tensorflow_model_server flags the deployment runs with (exportkit.options.server_flags; every kind of server gets them)."""

    container_cli: str = "docker"
    pull: bool = False
    batching_parameters: str | None = None
    server_flags: ServerFlags = STOCK


def batching_file(options: LaunchOptions | None) -> str | None:
    """The absolute path of --batching-parameters, if given; UsageError if it is not a file."""
    path = options.batching_parameters if options else None
    if path and not os.path.isfile(path):
        raise UsageError(f"--batching-parameters {path}: no such file",
                         "pass a TF Serving BatchingParameters text proto (e.g. max_batch_size { value: 32 })")
    return os.path.abspath(path) if path else None
