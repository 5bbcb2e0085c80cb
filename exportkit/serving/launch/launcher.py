"""Four ways to get a TF Serving-compatible server, one result: `ServerHandle` (address, description, stop()).

    docker    the real TF Serving: its official image (docker[:TAG], or a private image) in a container
    binary    the real `tensorflow_model_server` (explicit path, else $EXPORTKIT_MODEL_SERVER, else PATH)
    remote    HOST:PORT of a server someone else runs; nothing is launched
    embedded  `python -I -m exportkit serve` in a child process: the TF1-style loader, no user code on sys.path
    auto      binary if found, else embedded

Launched servers run in their own process group (containers: labelled, removed) and are stopped (SIGTERM, wait,
SIGKILL to the group) on success, error and Ctrl-C, so no server outlives the check. A model that fails to load is
`CheckFailed` with the tail of the server's log; a missing binary or a server that cannot start is `InfraError`.
"""
from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable

from exportkit.errors import EXIT_INFRA, CheckFailed, InfraError, UsageError
from exportkit.savedmodel.reader import list_versions, resolve_model_path
from exportkit.serving.launch.container import NO_LOAD_RETRIES, batching_flags, is_container_mode
from exportkit.options.server_flags import STOCK, ServerFlags
from exportkit.tfenv import child_env
from exportkit.log import log

BINARY_NAME = "tensorflow_model_server"
BINARY_ENV = "EXPORTKIT_MODEL_SERVER"
INSTALL_HINT = ("install TF Serving: the `tensorflow/serving` Docker image, or the `tensorflow-model-server` package "
                "from TensorFlow's apt repository (https://www.tensorflow.org/tfx/serving/setup); then pass "
                f"--model-server-bin PATH or set ${BINARY_ENV}, or use --serving embedded")
LOG_TAIL_LINES = 40

_live: set = set()  # handles not yet stopped; stopped at interpreter exit as a last resort


@atexit.register
def _stop_all() -> None:
    for handle in list(_live):
        handle.stop()


@dataclass
class ServerHandle:
    """A running (or remote) server: where it is, what it is, and how to stop it. A context manager."""

    address: str
    description: dict
    model_name: str
    model_version: int | None
    _stop: Callable[[], None] | None = field(default=None, repr=False)
    process: subprocess.Popen | None = field(default=None, repr=False)  # None for a remote server
    tail: Callable[[], str] | None = field(default=None, repr=False)  # the server's log tail, while it runs

    def died(self) -> str | None:
        """How a launched server ended ("exited with code 1", "killed by SIGKILL"), or None while it runs."""
        code = self.process.poll() if self.process is not None else None
        if code is None:
            return None
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exited with code {code}"
    rest_address: str | None = None  # "127.0.0.1:PORT" when the server also serves the REST API

    def stop(self) -> None:
        """Idempotent; safe from `finally`, `__exit__` and atexit."""
        stop, self._stop = self._stop, None
        _live.discard(self)
        if stop is not None:
            stop()

    def __enter__(self) -> "ServerHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    __hash__ = object.__hash__


# --------------------------------------------------------------------------------------------------- processes
class _Child:
    """A child in its own process group with its log in a temp file; `stop()` leaves nothing behind."""

    def __init__(self, argv: list[str], env: dict, stdout=None, stdin=None, cwd: str | None = None, label: str = "server"):
        self.label = label
        self.log = tempfile.NamedTemporaryFile(prefix="exportkit-serving-", suffix=".log", delete=False)
        try:
            self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=stdin if stdin is not None else subprocess.DEVNULL,
                                         stdout=stdout if stdout is not None else self.log, stderr=self.log,
                                         start_new_session=True, close_fds=True)
        except OSError as err:
            self._remove_log()
            raise InfraError(f"cannot start {label} ({argv[0]}): {err}", INSTALL_HINT if label == "binary" else None) from None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            with open(self.log.name, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - 64 * 1024))
                text = fh.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)  # start_new_session: pgid == pid
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the group, wait `grace`, then SIGKILL the group; always reap and remove the log."""
        try:
            if self.proc.poll() is None:
                self._signal_group(signal.SIGTERM)
                try:
                    self.proc.wait(grace)
                except subprocess.TimeoutExpired:
                    pass
            self._signal_group(signal.SIGKILL)  # grandchildren that ignored SIGTERM or outlived the leader
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        finally:
            for pipe in (self.proc.stdin, self.proc.stdout):
                if pipe is not None:
                    try:
                        pipe.close()
                    except OSError:
                        pass
            self._remove_log()

    def _remove_log(self) -> None:
        try:
            self.log.close()
            os.unlink(self.log.name)
        except OSError:
            pass


def free_port() -> int:
    """A free loopback port (the server binds it a moment later; the race is accepted)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait(handle_child: _Child, client, load_timeout: float, what: str) -> int:
    """Wait until AVAILABLE; the child dying, END or the timeout are CheckFailed with the log tail."""
    from exportkit.serving.client.grpc_client import ModelLoadFailed, ServingError

    def check() -> None:
        if not handle_child.alive():
            raise _died(handle_child, what)

    try:
        return client.wait_available(load_timeout, check=check)
    except ModelLoadFailed as err:
        raise CheckFailed(f"{what}: {err.message}\n{handle_child.tail()}",
                          "the server's error and log above say why the model did not load") from None
    except ServingError as err:
        if err.code == "DEADLINE_EXCEEDED":
            raise CheckFailed(f"{what} timed out after {load_timeout:g}s waiting for the model to be AVAILABLE "
                              f"({err.message}):\n{handle_child.tail()}", "raise --load-timeout if the model is big") from None
        raise CheckFailed(f"{what}: {err}\n{handle_child.tail()}", "the server log above says what went wrong") from None


def _last_line(tail: str) -> str:
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "(the server printed nothing)"


def _died(child: "_Child", what: str) -> Exception:
    """The error for a server process that ended before its model was AVAILABLE, with its log tail.

    Killed by a signal (OOM killer, someone's kill -9) or a lost port race: infrastructure (exit 3), however far
    it had got. Exiting on its own with a code: the server refused the model (exit 1).
    """
    code = child.proc.returncode
    tail = child.tail()
    log = f"\nserver log (last {LOG_TAIL_LINES} lines):\n{tail}" if tail.strip() else ""
    if "Address already in use" in tail:  # lost the free-port race: not the model's fault
        return InfraError(f"{what} could not bind its port{log}", "run the check again")
    if child.label == "embedded server" and code == EXIT_INFRA:  # `exportkit serve` said its environment failed
        said = {ln.strip().partition(": ")[0]: ln.strip().partition(": ")[2] for ln in tail.splitlines()
                if ln.strip().startswith(("error: ", "fix: "))}
        return InfraError(f"{what}: {said.get('error') or _last_line(tail)}{log}",
                          said.get("fix") or "the server log says what is missing; run the check again once it is fixed")
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return InfraError(f"{what} was killed by {name} before the model was AVAILABLE (last log line: "
                          f"{_last_line(tail)}){log}",
                          "look for the out-of-memory killer (dmesg) or whoever stopped it, then run the check again")
    return CheckFailed(f"{what} exited with code {code} before the model was AVAILABLE: {_last_line(tail)}{log}",
                       "the server log says why the model did not load")


@dataclass(frozen=True)
class LaunchOptions:
    """How a launched server is run: the container CLI (docker, podman or a path) and whether a missing image may
    be pulled (docker mode), a TF Serving BatchingParameters text proto to serve with `--enable_batching`, and the
    tensorflow_model_server flags the deployment runs with (exportkit.options.server_flags; every kind of server gets them)."""

    container_cli: str = "docker"
    pull: bool = False
    batching_parameters: str | None = None
    server_flags: ServerFlags = STOCK


def _model_name(path: str, model_name: str | None) -> str:
    return model_name or resolve_model_path(path).default_name


def _flags(options: LaunchOptions | None) -> ServerFlags:
    return options.server_flags if options else STOCK


def _flags_entry(flags: ServerFlags) -> dict:
    """The server description's `server_flags` entry: the flags that differ from the stock server's, if any."""
    return {"server_flags": flags.argv()} if flags.changed() else {}


def batching_file(options: LaunchOptions | None) -> str | None:
    path = options.batching_parameters if options else None
    if path and not os.path.isfile(path):
        raise UsageError(f"--batching-parameters {path}: no such file",
                         "pass a TF Serving BatchingParameters text proto (e.g. max_batch_size { value: 32 })")
    return os.path.abspath(path) if path else None


# --------------------------------------------------------------------------------------------------- binary
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


class PendingServer:
    """A server that is starting: `wait()` returns its ServerHandle once the model is AVAILABLE; `stop()` abandons it.

    Starting is cheap (spawn a process); waiting is where the seconds go, so callers can do other work between.
    """

    def __init__(self, finish: Callable[[], ServerHandle], abort: Callable[[], None] | None = None):
        self._finish = finish
        self._abort = abort
        self._handle: ServerHandle | None = None
        _live.add(self)

    def wait(self) -> ServerHandle:
        if self._handle is None:
            try:
                self._handle = self._finish()
            except BaseException:
                self.stop()
                raise
            self._abort = None
            _live.discard(self)
        return self._handle

    def stop(self) -> None:
        _live.discard(self)
        abort, self._abort = self._abort, None
        if abort is not None:
            abort()
        if self._handle is not None:
            self._handle.stop()


def start_binary(path: str, model_name: str | None = None, binary: str | None = None, device: str = "cpu",
                 load_timeout: float = 120.0, rest: bool = False, launch: LaunchOptions | None = None) -> PendingServer:
    """Spawn the real tensorflow_model_server on a free loopback port (InfraError if there is none)."""
    found = find_binary(binary)
    if found is None:
        raise InfraError(f"{BINARY_NAME} not found (no --model-server-bin, no ${BINARY_ENV}, not on PATH)", INSTALL_HINT)
    name = _model_name(path, model_name)
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
        argv += batching_flags(batching_file(launch)) + _flags(launch).argv()
        child = _Child(argv, child_env(device), label="binary")
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
            _wait(child, client, load_timeout, f"{BINARY_NAME} ({found})")
        description = {"kind": "binary", "version": binary_version(found), "address": address,
                       "binary": found, "model_name": name, "model_version": version,
                       **_flags_entry(_flags(launch))}
        handle = ServerHandle(address, description, name, version, stop, child.proc, child.tail,
                              rest_address=f"127.0.0.1:{rest_port}" if rest_port else None)
        _live.add(handle)
        return handle

    return PendingServer(finish, stop)


def launch_binary(path: str, model_name: str | None = None, binary: str | None = None, device: str = "cpu",
                  load_timeout: float = 120.0) -> ServerHandle:
    """Run the real tensorflow_model_server; return once the model is AVAILABLE."""
    return start_binary(path, model_name, binary, device, load_timeout).wait()


# --------------------------------------------------------------------------------------------------- docker
def start_container(serving: str, path: str, model_name: str | None = None, device: str = "cpu",
                    load_timeout: float = 120.0, options: LaunchOptions | None = None) -> PendingServer:
    """TF Serving's image on the model (serving.container); `wait()` returns once the model is AVAILABLE."""
    from exportkit.serving.launch import container as containers

    options = options or LaunchOptions()
    image = containers.image_for(serving, device)
    batching_file(options)
    cli = containers.ContainerCli(options.container_cli)
    removed = containers.remove_stale(cli)
    for stale in removed:
        log.warning(f"note: removed container {stale}, left behind by an exportkit run that was killed")
    image_id, digest = containers.image_identity(cli, image, options.pull)
    loc = resolve_model_path(path)
    name = model_name or loc.default_name
    grpc_port, rest_port = free_port(), free_port()
    container = containers.Container.run(cli, image, model_name=name, version_dir=str(loc.version_dir),
                                         version=loc.version, grpc_port=grpc_port, rest_port=rest_port,
                                         gpu=device == "gpu", batching_parameters=options.batching_parameters,
                                         server_args=options.server_flags.argv())
    address = f"127.0.0.1:{grpc_port}"
    what = f"TF Serving in {image} (container {container.name})"
    log_tail = f"container log (last {containers.LOG_TAIL_LINES} lines)"

    def finish() -> ServerHandle:
        from exportkit.serving.client.grpc_client import ModelLoadFailed, ServingClient, ServingError

        def check() -> None:
            if not container.running():
                raise CheckFailed(f"{what} exited before the model was AVAILABLE; {log_tail}:\n{container.tail()}",
                                  "the container log says why TF Serving did not load the model")

        with ServingClient(address, name, loc.version) as client:
            try:
                client.wait_available(load_timeout, check=check)
            except ModelLoadFailed as err:
                raise CheckFailed(f"{what}: {err.message}\n{log_tail}:\n{container.tail()}",
                                  "the container log says why TF Serving did not load the model") from None
            except ServingError as err:
                hint = ("raise --load-timeout if the model is big" if err.code == "DEADLINE_EXCEEDED"
                        else "the container log says what went wrong")
                raise CheckFailed(f"{what}: {err}\n{log_tail}:\n{container.tail()}", hint) from None
        description = {"kind": "docker", "version": containers.server_version(cli, image), "address": address,
                       "binary": None, "image": image, "image_id": image_id, "digest": digest,
                       "container": container.name, "cli": cli.name, "model_name": name,
                       "model_version": loc.version, **_flags_entry(options.server_flags)}
        if removed:
            description["removed_stale"] = removed
        if containers.moving_tag(image):
            print(f"warning: {image} moves with every TF Serving release; this run used TF Serving "
                  f"{description['version']} ({digest or image_id}): pin it with --serving "
                  f"docker:{description['version']}{'-gpu' if device == 'gpu' else ''} to run the same server again",
                  file=sys.stderr)
        handle = ServerHandle(address, description, name, loc.version, container.remove, None, container.tail,
                              rest_address=f"127.0.0.1:{rest_port}")
        _live.add(handle)
        return handle

    return PendingServer(finish, container.remove)


# --------------------------------------------------------------------------------------------------- embedded
def _read_line(child: _Child, deadline: float, pattern: re.Pattern) -> str | None:
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
    argv += batching_flags(batching_file(launch)) + _flags(launch).argv()
    workdir = tempfile.mkdtemp(prefix="exportkit-serve-cwd-")  # nothing importable in the child's cwd
    try:
        child = _Child(argv, env, stdout=subprocess.PIPE, stdin=subprocess.PIPE, cwd=workdir, label="embedded server")
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


def _finish_embedded(child: _Child, name: str, deadline: float, load_timeout: float, stop) -> ServerHandle:
    from exportkit.serving.server.model_server import ADDRESS_RE
    from exportkit.version import __version__
    from exportkit.tfenv import tensorflow_version

    what = "embedded server (exportkit serve)"
    from exportkit.serving.client.grpc_client import ServingClient

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
        raise _died(child, what)
    address = match.group("address")
    version = int(match.group("version"))
    with ServingClient(address, name, version) as client:
        _wait(child, client, max(5.0, deadline - time.monotonic()), what)
    description = {"kind": "embedded", "version": f"exportkit {__version__} serve (TensorFlow {tensorflow_version() or '?'})",
                   "address": address, "binary": None, "model_name": name, "model_version": version}
    handle = ServerHandle(address, description, name, version, stop, child.proc, child.tail,
                          rest_address=match.group("rest"))
    _live.add(handle)
    return handle


def launch_embedded(path: str, model_name: str | None = None, device: str = "cpu",
                    load_timeout: float = 120.0) -> ServerHandle:
    """Run `exportkit serve` in an isolated child; return once the model is AVAILABLE."""
    return start_embedded(path, model_name, device, load_timeout).wait()


# --------------------------------------------------------------------------------------------------- remote
def connect_remote(address: str, model_name: str, model_version: int | None = None,
                   load_timeout: float = 30.0) -> ServerHandle:
    """A server someone else runs: check the model is AVAILABLE there, launch nothing, stop nothing."""
    from exportkit.serving.client.grpc_client import ModelLoadFailed, ServingClient, ServingError, as_exportkit_error

    check_serving_mode(address)
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


_ADDRESS = re.compile(r"(?P<host>\[[0-9a-fA-F:.]+\]|[\w.-]+):(?P<port>\d+)")
CONNECT_TIMEOUT_S = 5.0


def _check_listening(address: str) -> None:
    """Fail in seconds, not after --load-timeout, when nothing listens at a remote HOST:PORT (InfraError)."""
    match = _ADDRESS.fullmatch(address)
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


def check_serving_mode(serving: str) -> None:
    """UsageError unless `serving` is auto, binary, embedded, none, docker[:TAG], HOST:PORT or remote:HOST:PORT."""
    if serving in ("auto", "binary", "embedded", "none") or is_container_mode(serving):
        return
    address = serving[len("remote:"):] if serving.startswith("remote:") else serving
    if not _ADDRESS.fullmatch(address):
        raise UsageError(f"--serving {serving!r} is not auto, binary, embedded, docker[:TAG], none or HOST:PORT",
                         "pass --serving embedded (no binary needed), or the address of a running server, "
                         "e.g. --serving localhost:8500")


# --------------------------------------------------------------------------------------------------- one entry
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
        model_name = _model_name(path, None)
    return PendingServer(lambda: connect_remote(address, model_name, model_version, load_timeout))


def launch(serving: str, path: str | None = None, **kwargs) -> ServerHandle:
    """start(...).wait(): a server with the model AVAILABLE, or CheckFailed / InfraError / UsageError."""
    return start(serving, path, **kwargs).wait()
