"""Processes that import TensorFlow once and fork verify's TensorFlow workers from it (`exportkit.warm_start()`).

Why: a fresh worker spends ~3 CPU-s importing TensorFlow, most of a small model's verify. A caller that verifies
many models in one process (a release suite, the pytest plugin, a script) pays it once here; each worker is then
a fork that has imported TensorFlow and initialised none of it (no context, device, session or thread pool yet,
which is what makes the fork safe). multiprocessing's forkserver does not fit: its children re-import the caller's
`__main__` and inherit its sys.path, and a worker must run with no user code importable (`python -I` from a
neutral directory), as it does when started fresh.

A forked worker must be indistinguishable from a fresh one, so a server forks only what a fresh start would make
identical: one worker command (exportkit's own session worker on this Python, started at once; a managed TF X.Y
environment's standalone worker, exportkit/tfversions/worker.py, on its first worker), with the environment the server
was started with (TensorFlow reads parts of it at import; "cpu" hides the GPUs). `WarmStart.spawn` returns None for
anything else, and the caller starts the worker fresh.

The server side of this file uses the standard library only: it runs under a managed environment's Python too,
where exportkit is not installed (`python -I forkserver.py WORKER-ARGS`, WORKER-ARGS as the fresh worker's).

Protocol: the owner holds a SOCK_SEQPACKET socket that is the server's stdin. Each message is one worker:
{"cwd": DIR} with four file descriptors (the worker's stdin, stdout and stderr, and a
socket for its reports). The server forks and answers on the report socket {"pid": N}, then {"exit": CODE} when it
has reaped the worker (CODE as Popen.returncode: -N for a signal). The server exits when its stdin closes; its
workers end as fresh ones do, at the EOF of their own stdin.

Processes started inside a `warm_start()` (an `exportkit verify` a release script runs, say) fork their session
workers from it too: `warm_start()` names, in EXPORTKIT_WARM_START, a socket the session worker's server also
listens on (in the owner's private directory). A connection first reads the server's ready line, so the process
can check that a fork would be alike, then asks for workers as the owner does.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

WORKER_COMMAND = [sys.executable, "-I", "-m", "exportkit.runtimes.session_worker"]
ADDRESS_VARIABLE = "EXPORTKIT_WARM_START"  # the socket of the warm start a process was started inside
# Set per test (pytest) and per warm start, or by JAX's import in a caller whose TensorFlow import brought it in
# (TPU_SKIP_MDS_QUERY): neither TensorFlow nor a worker reads them (workers keep jax out: NOT_FOR_LOADING).
IGNORED = ("PYTEST_CURRENT_TEST", ADDRESS_VARIABLE, "TPU_SKIP_MDS_QUERY")
VERSIONED_WORKER = Path(__file__).parents[1] / "tfversions" / "worker.py"  # a managed TF X.Y environment's worker
READY_TIMEOUT = 600.0

_current: WarmStart | None = None
_current_lock = threading.Lock()


class ForkedProcess:
    """A worker the server forked: the part of subprocess.Popen that TfWorker and ServerHandle use."""

    def __init__(self, pid: int, stdout, reports: socket.socket):
        self.pid, self.stdout, self.returncode = pid, stdout, None
        self._reports = reports
        self._lock = threading.Lock()

    def _collect(self, timeout: float | None) -> None:
        with self._lock:
            if self.returncode is not None or not select.select([self._reports], [], [], timeout)[0]:
                return
            message = self._reports.recv(4096)
            if message:
                self.returncode = json.loads(message)["exit"]
            else:  # the server died without reaping it: end the orphan, whose end nobody could report
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                self.returncode = -signal.SIGKILL
            self._reports.close()

    def poll(self) -> int | None:
        self._collect(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._collect(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired("a forked worker", timeout)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


def forkable(command: list[str]) -> bool:
    """Is `command` a worker a server can fork: this Python's session worker, or the standalone worker of a managed
    TF X.Y environment (its Python has exportkit's own copy of the script only, so any of them)."""
    return command == WORKER_COMMAND or (len(command) == 3 and command[1] == "-I"
                                         and os.path.realpath(command[2]) == os.path.realpath(VERSIONED_WORKER))


def forks_alike(env: dict, started: dict, imported: dict) -> bool:
    """Would a fresh worker started with `env` end up with the environment a fork of a server `started` with that
    environment has? Each variable must be the one the server was started with, or the one its start-up set (`imported`:
    TensorFlow's import sets TF2_BEHAVIOR, for one, also in a caller that imported it, and the start-up quiets the
    logs): a fresh worker sets it too."""
    return all(env.get(k) in (started.get(k), imported.get(k))
               for k in env.keys() | started.keys() | imported.keys() if k not in IGNORED)


def request_fork(channel: socket.socket, *, stdin: socket.socket, stderr, cwd: str) -> ForkedProcess | None:
    """One worker forked by the server at the other end of `channel`; None if that server is gone."""
    read_end, write_end = os.pipe()
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        socket.send_fds(channel, [json.dumps({"cwd": cwd}).encode()],
                        [stdin.fileno(), write_end, stderr.fileno(), theirs.fileno()])
        answered = select.select([mine], [], [], READY_TIMEOUT)[0]
        message = mine.recv(4096) if answered else b""
    except OSError:
        message = b""
    finally:
        os.close(write_end)
        theirs.close()
    if not message:
        os.close(read_end)
        mine.close()
        return None
    return ForkedProcess(json.loads(message)["pid"], open(read_end), mine)


class ForkServer:
    """The owner's end of one worker command's server, started at once (its TensorFlow import overlaps the
    caller's work). With `listen`, it also serves the processes started inside the warm start (`address`)."""

    def __init__(self, command: list[str], listen: bool = False):
        from exportkit.tfenv import child_env

        self.command = command
        self.env = child_env("cpu")
        self.dir = tempfile.TemporaryDirectory(prefix="exportkit-forkserver-")  # 0700: the socket is ours alone
        self._log = open(Path(self.dir.name) / "forkserver.log", "w+")
        self._control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener, self.address = _listener(Path(self.dir.name) / "forks.sock") if listen else (None, None)
        extra = ["--listen-fd", str(listener.fileno())] if listener else []
        try:
            self.process = subprocess.Popen([command[0], "-I", __file__, *extra, *command[2:]],
                                            stdin=theirs, stdout=subprocess.PIPE, stderr=self._log,
                                            cwd=self.dir.name, env=self.env, text=True, start_new_session=True,
                                            pass_fds=[listener.fileno()] if listener else [])
        except OSError:
            self._log.close()
            self.dir.cleanup()
            raise
        finally:
            theirs.close()
            if listener:
                listener.close()
        self._sending = threading.Lock()
        self._ready: bool | None = None  # None until its ready line (or its end) came
        self._imported_env: dict = {}  # its environment once the worker's start-up and TensorFlow's import set theirs

    def _await_ready(self) -> bool:
        with self._sending:
            if self._ready is None:
                readable = select.select([self.process.stdout], [], [], READY_TIMEOUT)[0]
                line = self.process.stdout.readline() if readable else ""
                ready = json.loads(line) if line else {}
                self._ready, self._imported_env = ready.get("ok", False), ready.get("environ", {})
            return self._ready

    def spawn(self, command: list[str], *, stdin: socket.socket, stderr, cwd: str, env: dict) -> ForkedProcess | None:
        """`command` forked from the server, or None where a fresh start could differ or the server cannot fork
        (then start it fresh: a missing TensorFlow, say, is reported by the fresh worker as always)."""
        if command != self.command or not self._await_ready() or not forks_alike(env, self.env, self._imported_env):
            return None
        with self._sending:
            forked = request_fork(self._control, stdin=stdin, stderr=stderr, cwd=cwd)
        if forked is None:  # the server is gone: from now on workers start fresh
            self._ready = False
        return forked

    def close(self) -> None:
        self._control.close()  # the server's EOF: it exits once its workers have (at once, when none is left)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()
        self._log.close()
        self.dir.cleanup()


def _listener(path: Path) -> tuple[socket.socket | None, str | None]:
    """A listening socket at `path` and its address; (None, None) where the path cannot be one (too long, say)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        listener.bind(str(path))
        listener.listen(64)
    except OSError:
        listener.close()
        return None, None
    return listener, str(path)


class WarmStart:
    """The servers of one `warm_start()`, one per worker command: this Python's session worker's from the start, a
    managed environment's from its first worker (which waits for that server's import instead of its own)."""

    def __init__(self):
        main = ForkServer(WORKER_COMMAND, listen=True)
        self._servers = {tuple(WORKER_COMMAND): main}
        self.address = main.address
        self._lock = threading.Lock()

    def server(self, command: list[str]) -> ForkServer | None:
        """The server of `command`, started on first use; None if it is not forkable or its Python cannot start."""
        if not forkable(command):
            return None
        with self._lock:
            if tuple(command) not in self._servers:
                try:
                    self._servers[tuple(command)] = ForkServer(command)
                except OSError:  # the fresh start says what is wrong with that Python
                    return None
            return self._servers[tuple(command)]

    def spawn(self, command: list[str], **how) -> ForkedProcess | None:
        """`command` forked (see ForkServer.spawn), or None: start it fresh."""
        server = self.server(command)
        return server and server.spawn(command, **how)

    def pids(self) -> set[int]:
        with self._lock:
            return {s.process.pid for s in self._servers.values()}

    def close(self) -> None:
        with self._lock:
            servers, self._servers = list(self._servers.values()), {}
        for server in servers:
            server.close()


class InheritedWarmStart:
    """The warm start this process was started inside (ADDRESS_VARIABLE): its session workers fork from there."""

    def __init__(self, address: str):
        self.address = address

    def spawn(self, command: list[str], *, stdin: socket.socket, stderr, cwd: str, env: dict) -> ForkedProcess | None:
        """As WarmStart.spawn, for this Python's session worker; None (start it fresh) if the warm start is gone."""
        if command != WORKER_COMMAND:
            return None
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as channel:
                channel.connect(self.address)
                line = channel.recv(1 << 20) if select.select([channel], [], [], READY_TIMEOUT)[0] else b""
                ready = json.loads(line) if line else {}
                if (not ready.get("ok") or ready["command"] != command  # another Python, another venv
                        or not forks_alike(env, ready["started"], ready["environ"])):
                    return None
                return request_fork(channel, stdin=stdin, stderr=stderr, cwd=cwd)
        except OSError:
            return None

    def pids(self) -> set[int]:
        return set()  # the servers are the starting process's


def current() -> WarmStart | InheritedWarmStart | None:
    """The servers of the innermost `warm_start()` of this process, else those of the one it was started inside."""
    address = os.environ.get(ADDRESS_VARIABLE)
    return InheritedWarmStart(address) if _current is None and address else _current


@contextlib.contextmanager
def warm_start():
    """Within it, verify's TensorFlow workers (CPU, this Python or a managed TF X.Y environment) are forked from one
    process per Python that imported TensorFlow once: ~0.5 s a worker instead of ~3 s. So are the session workers of
    the processes started inside it (ADDRESS_VARIABLE). Nested calls share the outer one's servers."""
    global _current
    with _current_lock:
        if _current is not None:
            owner = None
        else:
            owner = _current = WarmStart()
            inherited = os.environ.get(ADDRESS_VARIABLE)
            if owner.address:
                os.environ[ADDRESS_VARIABLE] = owner.address  # for the processes started inside it
    try:
        yield
    finally:
        if owner is not None:
            with _current_lock:
                _current = None
                if inherited is None:
                    os.environ.pop(ADDRESS_VARIABLE, None)
                else:
                    os.environ[ADDRESS_VARIABLE] = inherited
            owner.close()


# -- the server process ---------------------------------------------------------------------------------------------
def _worker_module(args: list[str]):
    """The worker the command line names, as a fresh start would run it: `-m MODULE` or a script's path."""
    if args[0] == "-m":
        return importlib.import_module(args[1])
    spec = importlib.util.spec_from_file_location("exportkit_worker", args[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _become_worker(worker, request: dict, fds: list[int], inherited: list[int]) -> None:
    """In the forked child: the worker's own session, descriptors, directory and environment, then its main."""
    code = 1
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in inherited:  # the server's channel and wake-up pipe, its other workers' report sockets
            os.close(fd)
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        for fd in fds:
            os.close(fd)
        os.chdir(request["cwd"])
        code = worker.main()
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stderr.flush()
        os._exit(code)


def main() -> int:
    control = socket.socket(fileno=0)  # the owner's SOCK_SEQPACKET socket
    args = sys.argv[1:]
    listener = None  # the warm start's address, for the processes started inside it
    if args[:1] == ["--listen-fd"]:
        listener, args = socket.socket(fileno=int(args[1])), args[2:]
    started = dict(os.environ)
    saved_stdout, sys.stdout = sys.stdout, sys.stderr  # anything TensorFlow prints at import stays off the channel
    try:
        worker = _worker_module(args)
        worker.prepare()
        ready = {"ok": True, "environ": dict(os.environ)}
    except Exception as err:  # e.g. no TensorFlow: the workers start fresh and say so
        ready = {"ok": False, "message": str(err)}
    sys.stdout = saved_stdout
    print(json.dumps(ready), flush=True)
    if not ready["ok"]:
        return 1
    wakeup_read, wakeup = os.pipe()
    os.set_blocking(wakeup, False)
    signal.set_wakeup_fd(wakeup)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake select() through the wake-up pipe
    reports: dict[int, socket.socket] = {}  # pid -> its report socket
    channels = [control]  # the owner's, then those of processes started inside the warm start
    while channels or reports:  # after the owner's EOF, until every worker is reaped and reported
        readable = select.select(channels + ([listener] if listener else []) + [wakeup_read], [], [])[0]
        if wakeup_read in readable:
            os.read(wakeup_read, 512)
            _reap(reports)
        if listener in readable:
            with contextlib.suppress(OSError):
                channel, _ = listener.accept()
                answer = {**ready, "started": started, "command": [sys.executable, "-I", *args]}
                channel.send(json.dumps(answer).encode())
                channels.append(channel)
        for channel in [c for c in channels if c in readable]:
            try:
                message, fds, _, _ = socket.recv_fds(channel, 65536, 4)
            except OSError:
                message, fds = b"", []
            if not message and channel is control:  # the owner is done: no more workers, from anyone
                for other in channels + ([listener] if listener else []):
                    other.close()
                channels, listener = [], None
                break
            if not message or len(fds) != 4:  # a process is done with its channel, or that is not a request
                for fd in fds:
                    os.close(fd)
                if not message:
                    channels.remove(channel)
                    channel.close()
                continue
            pid = os.fork()
            if pid == 0:
                _become_worker(worker, json.loads(message), fds,
                               [c.fileno() for c in channels] + ([listener.fileno()] if listener else [])
                               + [wakeup_read, wakeup] + [r.fileno() for r in reports.values()])
            for fd in fds[:3]:
                os.close(fd)
            reports[pid] = report = socket.socket(fileno=fds[3])
            with contextlib.suppress(OSError):
                report.send(json.dumps({"pid": pid}).encode())
    return 0


def _reap(reports: dict[int, socket.socket]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        report = reports.pop(pid, None)
        if report is not None:
            with contextlib.suppress(OSError):
                report.send(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode())
            report.close()


if __name__ == "__main__":
    sys.exit(main())
