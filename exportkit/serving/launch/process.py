"""What every launched server shares: its process (own process group, log in a temp file, stopped whole), the
handle callers hold (`ServerHandle`, `PendingServer`), free ports, and waiting for the model with the log's tail.

Launched servers are stopped (SIGTERM, wait, SIGKILL to the group) on success, error and Ctrl-C, and at interpreter
exit as a last resort, so no server outlives the check. A model that fails to load is `CheckFailed` with the tail of
the server's log; a server that cannot start or is killed is `InfraError`.
"""
from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Callable

from exportkit.errors import EXIT_INFRA, CheckFailed, InfraError
from exportkit.options.server_flags import ServerFlags

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
    rest_address: str | None = None  # "127.0.0.1:PORT" when the server also serves the REST API
    memory: Callable[[], dict] | None = field(default=None, repr=False)  # a container's own accounting (docker)

    def memory_now(self) -> dict:
        """What the server holds now, TF Serving's own memory included: {"total_bytes", "peak_bytes"?, "method"}
        from its container's accounting, else from /proc/PID/status of its process; {} for a remote server."""
        if self.memory is not None:
            return self.memory()
        if self.process is None or self.process.poll() is not None:
            return {}
        try:
            with open(f"/proc/{self.process.pid}/status") as f:
                found = {k: int(v.split()[0]) * 1024 for k, _, v in (line.partition(":") for line in f)
                         if k in ("VmRSS", "VmHWM")}
        except (OSError, ValueError):
            return {}
        return {"total_bytes": found.get("VmRSS"), "peak_bytes": found.get("VmHWM"),
                "method": f"/proc/{self.process.pid}/status (VmRSS, VmHWM)"}

    def __post_init__(self) -> None:
        if self._stop is not None:  # a server we launched: stopped at exit if nobody else does
            _live.add(self)

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



class Child:
    """A child in its own process group with its log in a temp file; `stop()` leaves nothing behind."""

    def __init__(self, argv: list[str], env: dict, stdout=None, stdin=None, cwd: str | None = None, label: str = "server",
                 hint: str | None = None):
        """`hint`: the remedy when the program cannot be started at all (not installed)."""
        self.label = label
        self.log = tempfile.NamedTemporaryFile(prefix="exportkit-serving-", suffix=".log", delete=False)
        try:
            self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=stdin if stdin is not None else subprocess.DEVNULL,
                                         stdout=stdout if stdout is not None else self.log, stderr=self.log,
                                         start_new_session=True, close_fds=True)
        except OSError as err:
            self._remove_log()
            raise InfraError(f"cannot start {label} ({argv[0]}): {err}", hint) from None

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


def wait_available(handle_child: Child, client, load_timeout: float, what: str) -> int:
    """Wait until AVAILABLE; the child dying, END or the timeout are CheckFailed with the log tail."""
    from exportkit.serving.client.grpc_client import ModelLoadFailed, ServingError

    def check() -> None:
        if not handle_child.alive():
            raise server_ended(handle_child, what)

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


def server_ended(child: Child, what: str) -> Exception:
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



def flags_entry(flags: ServerFlags) -> dict:
    """The server description's `server_flags` entry: the flags that differ from the stock server's, if any."""
    return {"server_flags": flags.argv()} if flags.changed() else {}
