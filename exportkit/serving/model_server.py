"""`exportkit serve` (model_servers/server.cc): TF Serving's gRPC and REST APIs over the TF1-style loader.

For machines without the `tensorflow_model_server` binary. It loads the SavedModel the way TF Serving does
(MetaGraph + Session, no user Python imported), replays the warm-up records before reporting AVAILABLE, and
answers with TF Serving's status codes, so a client or a check that passes here behaves the same against the
real server. It is a stand-in, not TF Serving: reports must say which server answered.

Lifecycle: bind 127.0.0.1 -> status LOADING -> load + warm-up -> AVAILABLE, then print exactly one line
(`ADDRESS_LINE`) on stdout. A load failure sets END with the error, logs it and exits 1. SIGINT/SIGTERM (or, when
EXPORTKIT_SERVE_WATCH_STDIN=1, EOF on stdin: the launcher died) stop the server with exit 0.
"""
from __future__ import annotations

import logging
import os
import re
import signal
import sys
import threading

from exportkit.errors import CheckFailed, UsageError
from exportkit.savedmodel import resolve_model_path
from exportkit.serving.grpc_service import start_grpc
from exportkit.serving.servable import ServedModel
from exportkit.serving.server_core import ServerCore
from exportkit.tfenv import quiet_env

ADDRESS_LINE = "exportkit serve: model '{name}' version {version} AVAILABLE at {address}"
REST_SUFFIX = " rest {rest_address}"
ADDRESS_RE = re.compile(r"^exportkit serve: model '(?P<name>.*)' version (?P<version>\d+) AVAILABLE at (?P<address>\S+)"
                        r"(?: rest (?P<rest>\S+))?\s*$")
WATCH_STDIN_ENV = "EXPORTKIT_SERVE_WATCH_STDIN"

log = logging.getLogger("exportkit.serve")


def _setup_logging() -> None:
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("exportkit serve: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def _watch_stdin(stop: threading.Event) -> None:
    """The launcher keeps our stdin open; EOF means it is gone, so do not outlive it."""
    try:
        while os.read(0, 4096):  # raw fd: a daemon thread blocked in a buffered read aborts the exit
            pass
    except (OSError, ValueError):
        pass
    log.info("stdin closed (launcher gone): stopping")
    stop.set()


def serve_command(path: str, port: int = 8500, model_name: str | None = None, device: str = "cpu",
                  rest_port: int = 0) -> int:
    """Serve until SIGINT/SIGTERM (exit 0). Load failure: log it, exit 1 (CheckFailed). Bind failure: exit 3."""
    _setup_logging()
    quiet_env()
    if device not in ("cpu", "gpu"):
        raise UsageError(f"--device must be cpu or gpu, got {device!r}", "pass --device cpu or --device gpu")
    if device == "cpu" and "tensorflow" not in sys.modules:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # no GPU memory grabbed by a CPU server
    if not 0 <= port <= 65535:
        raise UsageError(f"--port must be 0..65535, got {port}", "pass --port 8500, or --port 0 for a free one")
    if not 0 <= rest_port <= 65535:
        raise UsageError(f"--rest-port must be 0..65535 (0 = no REST), got {rest_port}",
                         "pass --rest-port 8501, or leave it out for no REST API")
    location = resolve_model_path(path)
    name = model_name or location.default_name

    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    served = ServedModel(location, name, device)
    core = ServerCore([served])
    server = rest = None
    loader = None
    try:
        server, bound = start_grpc(core, port)
        address = f"127.0.0.1:{bound}"
        line = ADDRESS_LINE.format(name=name, version=location.version, address=address)
        if rest_port:
            from exportkit.serving.http_handler import start_rest

            rest, rest_bound = start_rest(core, rest_port)
            line += REST_SUFFIX.format(rest_address=f"127.0.0.1:{rest_bound}")
            log.info("REST API on 127.0.0.1:%d", rest_bound)
        log.info("listening on %s; loading model '%s' version %d from %s", address, name, location.version,
                 location.version_dir)
        if os.environ.get(WATCH_STDIN_ENV) == "1":
            threading.Thread(target=_watch_stdin, args=(stop,), daemon=True, name="stdin-watch").start()
        loader = threading.Thread(target=served.load, daemon=True, name="load")
        loader.start()
        announced = False
        while not stop.wait(0.05):
            if announced or loader.is_alive():
                continue
            if served.state == "END":
                code, message = served.error
                log.error("model '%s' version %d failed to load: %s", name, location.version, message)
                raise CheckFailed(f"model '{name}' version {location.version} failed to load: {message}",
                                  "run `exportkit inspect` on the version directory; check custom ops and the warm-up file")
            print(line, flush=True)
            announced = True
        log.info("stopping")
        return 0
    finally:
        if rest is not None:
            rest.shutdown()
            rest.server_close()
        if server is not None:
            server.stop(grace=2).wait(5)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if loader is not None and loader.is_alive():
            # Stopped mid-load: TF's C++ load cannot be interrupted, and tearing down the interpreter under it may
            # crash. Leave now; the exit code is still 0 for a requested stop.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0 if stop.is_set() else 1)
        served.close()
