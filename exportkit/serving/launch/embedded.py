"""The embedded server: `python -I -m exportkit serve` in a child process (isolated from cwd and PYTHONPATH, so no
user code), TF Serving's APIs over the TF1-style loader, for machines without the real binary.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from exportkit.errors import CheckFailed, InfraError
from exportkit.options.launch import LaunchOptions, batching_file
from exportkit.savedmodel.versions import resolve_model_path
from exportkit.serving.launch.binary import batching_flags
from exportkit.serving.launch.process import (Child, PendingServer, ServerHandle, free_port, server_ended,
                                              wait_available)
from exportkit.tfenv import child_env


def launch_embedded(path: str, model_name: str | None = None, device: str = "cpu",
                    load_timeout: float = 120.0) -> ServerHandle:
    """Run `exportkit serve` in an isolated child; return once the model is AVAILABLE."""
    return start_embedded(path, model_name, device, load_timeout).wait()


def start_embedded(path: str, model_name: str | None = None, device: str = "cpu",
                   load_timeout: float = 120.0, rest: bool = False, launch: LaunchOptions | None = None) -> PendingServer:
    """Spawn `python -I -m exportkit serve PATH --port 0`: isolated from cwd/PYTHONPATH, so no user code.
    `launch.batching_parameters`: served with TF Serving's batching (--enable_batching), as binary and docker."""
    from exportkit.serving.server.model_server import WATCH_STDIN_ENV

    loc = resolve_model_path(path)
    name = model_name or loc.default_name
    env = child_env(device)
    env[WATCH_STDIN_ENV] = "1"  # the child exits when our end of its stdin closes (we died)
    argv = [sys.executable, "-I", "-m", "exportkit", "serve", os.path.abspath(path), "--port", "0",
            "--model-name", name, "--device", device]
    if rest:
        argv += ["--rest-port", str(free_port())]
    argv += batching_flags(batching_file(launch)) + (launch or LaunchOptions()).server_flags.argv()
    workdir = tempfile.mkdtemp(prefix="exportkit-serve-cwd-")  # nothing importable in the child's cwd
    try:
        child = Child(argv, env, stdout=subprocess.PIPE, stdin=subprocess.PIPE, cwd=workdir, label="embedded server")
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    deadline = time.monotonic() + load_timeout

    def stop() -> None:
        child.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    def finish() -> ServerHandle:
        return _finish_embedded(child, name, deadline, load_timeout, stop)

    return PendingServer(finish, stop)


def _finish_embedded(child: Child, name: str, deadline: float, load_timeout: float, stop) -> ServerHandle:
    from exportkit.serving.client.grpc_client import ServingClient
    from exportkit.serving.server.model_server import ADDRESS_RE
    from exportkit.tfenv import tensorflow_version
    from exportkit.version import __version__

    what = "embedded server (exportkit serve)"
    line = _read_line(child, deadline, ADDRESS_RE)
    match = ADDRESS_RE.match(line or "")
    if not match:
        if line is not None:  # stdout closed: it is exiting; give it a moment to be reaped
            try:
                child.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        if child.alive():
            raise CheckFailed(f"{what} timed out after {load_timeout:g}s waiting for the model to be AVAILABLE:\n"
                              f"{child.tail()}", "raise --load-timeout if the model is big")
        tail = child.tail()
        if "No module named exportkit" in tail:
            raise InfraError(f"{what} cannot import exportkit in isolated mode (python -I)",
                             f"install exportkit into {sys.executable} (pip install -e .)")
        raise server_ended(child, what)
    address = match.group("address")
    version = int(match.group("version"))
    with ServingClient(address, name, version) as client:
        wait_available(child, client, max(5.0, deadline - time.monotonic()), what)
    description = {"kind": "embedded", "version": f"exportkit {__version__} serve (TensorFlow {tensorflow_version() or '?'})",
                   "address": address, "binary": None, "model_name": name, "model_version": version}
    return ServerHandle(address, description, name, version, stop, child.proc, child.tail,
                        rest_address=match.group("rest"))


def _read_line(child: Child, deadline: float, pattern: re.Pattern) -> str | None:
    """The first stdout line matching `pattern` (other lines: noise, skipped); '' if stdout closed first (the
    server exited), None if the deadline passed."""
    import selectors

    fd = child.proc.stdout.fileno()
    buf = b""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                text = line.decode("utf-8", "replace")
                if pattern.match(text):
                    return text
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            if not sel.select(min(remaining, 0.5)):
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                return ""
            buf += chunk
