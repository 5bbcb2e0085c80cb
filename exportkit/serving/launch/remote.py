"""A server someone else runs (HOST:PORT): check the model is AVAILABLE there, launch nothing, stop nothing."""
from __future__ import annotations

import re
import socket

from exportkit.errors import CheckFailed, InfraError, UsageError
from exportkit.serving.launch.process import ServerHandle

ADDRESS = re.compile(r"(?P<host>\[[0-9a-fA-F:.]+\]|[\w.-]+):(?P<port>\d+)")
CONNECT_TIMEOUT_S = 5.0


def connect_remote(address: str, model_name: str, model_version: int | None = None,
                   load_timeout: float = 30.0) -> ServerHandle:
    """A server someone else runs: check the model is AVAILABLE there, launch nothing, stop nothing."""
    from exportkit.serving.client.grpc_client import ModelLoadFailed, ServingClient, ServingError, as_exportkit_error

    if not model_name:
        raise UsageError("a remote server needs --model-name", "pass --model-name NAME as the server knows the model")
    _check_listening(address)
    with ServingClient(address, model_name, model_version) as client:
        try:
            version = client.wait_available(load_timeout)
        except ModelLoadFailed as err:
            raise CheckFailed(f"remote server {address}: {err.message}",
                              "the model failed to load on that server: read its log") from None
        except ServingError as err:
            raise as_exportkit_error(err, f"remote server {address} (model '{model_name}')",
                                     "check the address and that the server is running") from None
    description = {"kind": "remote", "version": "unknown", "address": address, "binary": None,
                   "model_name": model_name, "model_version": model_version if model_version is not None else version}
    return ServerHandle(address, description, model_name, model_version if model_version is not None else version)


def _check_listening(address: str) -> None:
    """Fail in seconds, not after --load-timeout, when nothing listens at a remote HOST:PORT (InfraError)."""
    match = ADDRESS.fullmatch(address)
    host, port = match.group("host").strip("[]"), int(match.group("port"))
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as err:
        reason = err.strerror or type(err).__name__
        if isinstance(err, socket.gaierror):
            reason = f"cannot resolve {host}: {reason}"
        elif isinstance(err, TimeoutError) or isinstance(err, socket.timeout):
            reason = f"no answer within {CONNECT_TIMEOUT_S:g}s"
        raise InfraError(f"remote server {address}: cannot connect ({reason})",
                         "start the server first, or pass the HOST:PORT it listens on to --serving") from None
