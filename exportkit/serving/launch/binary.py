"""The real TF Serving binary, `tensorflow_model_server`: finding it (explicit path, else $EXPORTKIT_MODEL_SERVER,
else PATH), the flags every launched TF Serving gets, and running it on a free loopback port.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile

from exportkit.errors import InfraError
from exportkit.options.launch import LaunchOptions, batching_file
from exportkit.savedmodel.versions import list_versions, resolve_model_path
from exportkit.serving.launch.process import Child, PendingServer, ServerHandle, flags_entry, free_port, wait_available
from exportkit.tfenv import child_env

BINARY_NAME = "tensorflow_model_server"
BINARY_ENV = "EXPORTKIT_MODEL_SERVER"
INSTALL_HINT = ("install TF Serving: the `tensorflow/serving` Docker image, or the `tensorflow-model-server` package "
                "from TensorFlow's apt repository (https://www.tensorflow.org/tfx/serving/setup); then pass "
                f"--model-server-bin PATH or set ${BINARY_ENV}, or use --serving embedded")
# A server exportkit launches serves one complete version: a failed load is the answer at once, not after TF Serving's
# default 5 retries a minute apart (model_servers/server.h, core/loader_harness.cc).
NO_LOAD_RETRIES = ["--max_num_load_retries=0"]


def start_binary(path: str, model_name: str | None = None, binary: str | None = None, device: str = "cpu",
                 load_timeout: float = 120.0, rest: bool = False, launch: LaunchOptions | None = None) -> PendingServer:
    """Spawn the real tensorflow_model_server on a free loopback port (InfraError if there is none)."""
    found = find_binary(binary)
    if found is None:
        raise InfraError(f"{BINARY_NAME} not found (no --model-server-bin, no ${BINARY_ENV}, not on PATH)", INSTALL_HINT)
    name = model_name or resolve_model_path(path).default_name
    flags = (launch or LaunchOptions()).server_flags
    cleanup: list = []

    def clean() -> None:
        while cleanup:
            cleanup.pop()()

    try:
        base_dir, version = _binary_base_dir(path, cleanup)
        port = free_port()
        rest_port = free_port() if rest else 0
        argv = [found, f"--port={port}", f"--rest_api_port={rest_port}", f"--model_name={name}",
                f"--model_base_path={os.path.abspath(base_dir)}", *NO_LOAD_RETRIES]
        argv += batching_flags(batching_file(launch)) + flags.argv()
        child = Child(argv, child_env(device), label="binary", hint=INSTALL_HINT)
    except BaseException:
        clean()
        raise
    address = f"127.0.0.1:{port}"

    def stop() -> None:
        child.stop()
        clean()

    def finish() -> ServerHandle:
        from exportkit.serving.client.grpc_client import ServingClient

        with ServingClient(address, name, version) as client:
            wait_available(child, client, load_timeout, f"{BINARY_NAME} ({found})")
        description = {"kind": "binary", "version": binary_version(found), "address": address,
                       "binary": found, "model_name": name, "model_version": version,
                       **flags_entry(flags)}
        return ServerHandle(address, description, name, version, stop, child.proc, child.tail,
                            rest_address=f"127.0.0.1:{rest_port}" if rest_port else None)

    return PendingServer(finish, stop)


def launch_binary(path: str, model_name: str | None = None, binary: str | None = None, device: str = "cpu",
                  load_timeout: float = 120.0) -> ServerHandle:
    """Run the real tensorflow_model_server; return once the model is AVAILABLE."""
    return start_binary(path, model_name, binary, device, load_timeout).wait()


def find_binary(explicit: str | None = None) -> str | None:
    """Explicit path, else $EXPORTKIT_MODEL_SERVER, else `tensorflow_model_server` on PATH; None if none."""
    for candidate, source in ((explicit, "--model-server-bin"), (os.environ.get(BINARY_ENV), f"${BINARY_ENV}")):
        if candidate:
            resolved = shutil.which(candidate) if os.sep not in candidate else candidate
            if not resolved or not (os.path.isfile(resolved) and os.access(resolved, os.X_OK)):
                raise InfraError(f"{source} points to {candidate!r}, which is not an executable file", INSTALL_HINT)
            return os.path.abspath(resolved)
    return shutil.which(BINARY_NAME)


def binary_version(binary: str, timeout: float = 10.0) -> str:
    """`tensorflow_model_server --version` ("TensorFlow ModelServer: 2.x.y..."), or "unknown" if it misbehaves.

    Asked only once the model is AVAILABLE (a binary that cannot load the model is not worth asking), in its own
    process group so a hanging binary is killed whole.
    """
    try:
        proc = subprocess.Popen([binary, "--version"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
    except OSError:
        return "unknown"
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out = b""
    finally:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.communicate()
    match = re.search(r"TensorFlow ModelServer:\s*(\S+)", out.decode("utf-8", "replace"))
    return match.group(1) if match else "unknown"


def _binary_base_dir(path: str, stack: list) -> tuple[str, int]:
    """TF Serving wants a base dir of integer versions and serves the highest; make one that serves `path`."""
    loc = resolve_model_path(path)
    if loc.base_dir is not None and list_versions(loc.base_dir)[-1] == loc.version:
        return loc.base_dir, loc.version
    tmp = tempfile.mkdtemp(prefix="exportkit-base-")
    stack.append(lambda: shutil.rmtree(tmp, ignore_errors=True))
    os.symlink(loc.version_dir, os.path.join(tmp, str(loc.version)))
    return tmp, loc.version


def batching_flags(path: str | None) -> list[str]:
    """The server flags that turn on TF Serving's batching with a parameters file at `path` (as the server sees it)."""
    return ["--enable_batching=true", f"--batching_parameters_file={path}"] if path else []
