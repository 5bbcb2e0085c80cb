"""`--serving MODE`: which server answers. Four ways to get a TF Serving-compatible server, one result:
`ServerHandle` (address, description, stop()).

    docker    the real TF Serving: its official image (docker[:TAG], or a private image) in a container (docker.py)
    binary    the real `tensorflow_model_server` (explicit path, else $EXPORTKIT_MODEL_SERVER, else PATH; binary.py)
    remote    HOST:PORT of a server someone else runs; nothing is launched (remote.py)
    embedded  `python -I -m exportkit serve` in a child process: the TF1-style loader, no user code (embedded.py)
    auto      binary if found, else embedded
"""
from __future__ import annotations

from exportkit.errors import UsageError
from exportkit.options.launch import LaunchOptions
from exportkit.savedmodel.versions import resolve_model_path
from exportkit.serving.launch.binary import find_binary, start_binary
from exportkit.serving.launch.docker import is_container_mode, start_container
from exportkit.serving.launch.embedded import start_embedded
from exportkit.serving.launch.process import PendingServer, ServerHandle
from exportkit.serving.launch.remote import ADDRESS, connect_remote


def start(serving: str, path: str | None = None, *, model_name: str | None = None, model_version: int | None = None,
          binary: str | None = None, device: str = "cpu", load_timeout: float = 120.0,
          rest: bool = False, launch: LaunchOptions | None = None) -> PendingServer:
    """`serving`: "auto" | "binary" | "embedded" | "docker[:TAG]" | "HOST:PORT" (remote; "remote:HOST:PORT" also
    accepted). `launch`: how a launched server runs (container CLI, --pull, batching parameters).

    `rest`: a launched server also serves the REST API (its address: ServerHandle.rest_address).

    Spawns at once (binary/embedded) and returns; `.wait()` blocks until AVAILABLE. Remote connects in wait().
    """
    if serving == "auto":
        serving = "binary" if find_binary(binary) else "embedded"
    if serving == "binary":
        return start_binary(path, model_name, binary, device, load_timeout, rest, launch)
    if serving == "embedded":
        return start_embedded(path, model_name, device, load_timeout, rest, launch)
    if is_container_mode(serving):
        return start_container(serving, path, model_name, device, load_timeout, launch)
    address = serving[len("remote:"):] if serving.startswith("remote:") else serving
    check_serving_mode(serving)
    if model_name is None and path is not None:
        model_name = resolve_model_path(path).default_name
    return PendingServer(lambda: connect_remote(address, model_name, model_version, load_timeout))


def launch(serving: str, path: str | None = None, **kwargs) -> ServerHandle:
    """start(...).wait(): a server with the model AVAILABLE, or CheckFailed / InfraError / UsageError."""
    return start(serving, path, **kwargs).wait()


def check_serving_mode(serving: str) -> None:
    """UsageError unless `serving` is auto, binary, embedded, none, docker[:TAG], HOST:PORT or remote:HOST:PORT."""
    if serving in ("auto", "binary", "embedded", "none") or is_container_mode(serving):
        return
    address = serving[len("remote:"):] if serving.startswith("remote:") else serving
    if not ADDRESS.fullmatch(address):
        raise UsageError(f"--serving {serving!r} is not auto, binary, embedded, docker[:TAG], none or HOST:PORT",
                         "pass --serving embedded (no binary needed), or the address of a running server, "
                         "e.g. --serving localhost:8500")
