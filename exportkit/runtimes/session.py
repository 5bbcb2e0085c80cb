"""Runtimes in the TensorFlow worker process (exportkit.runtimes.session_worker): `session` (TF1 loader +
Session.run, as TF Serving loads models) and `saved_model` (tf.saved_model.load, the TF2 way).

One `TfWorker` process holds every load verify needs: one TensorFlow import, both loaders loading at the same time
on two cores, and the embedded server answering from the session loader's graph (serving.ServingRuntime asks the
worker to serve). The verify process itself then never imports TensorFlow (unless eager Keras runs there).
"""
from __future__ import annotations

import atexit
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections import deque
from pathlib import Path

import numpy as np

from exportkit.files import os_error
from exportkit.inputs.npz import batch_bytes, read_npz, write_npz
from exportkit.errors import CheckFailed, InfraError, MissingModule
from exportkit.runtimes import Runtime, forkserver
from exportkit.signature_constants import DEFAULT_SIGNATURE
from exportkit.savedmodel.loader import loader_failure
from exportkit.tfenv import child_env

REPLY_TIMEOUT = 600.0
_PRESTARTED: dict = {}  # (device, python, worker) -> a TfWorker started before its model was known (prestart)


def runs_in_worker(names, serving: str | None) -> bool:
    """Whether verify's runtimes `names`, with `--serving serving`, run in this Python's TensorFlow worker (as
    verify.execute builds them): `session` always, `saved_model` unless eager Keras imports TensorFlow in the verify
    process anyway, the servers when embedded. A server that turns out to be a binary only leaves a worker unused."""
    in_worker = {"session"} | (set() if "keras" in names else {"saved_model"})
    if (serving or "auto") in ("embedded", "auto"):
        in_worker |= {"serving", "rest"}
    return bool(in_worker & set(names))


MEMORY_BATCH = 16 << 20  # batches up to this many bytes go to the worker through memory (see memory_dir)


def memory_dir() -> tempfile.TemporaryDirectory | None:
    """A directory in /dev/shm for small batches' files, when it has room (else None: the worker's dir on disk).
    Writing a 100 KB batch file took 0.85 ms on this project's ext4 disk under load and 0.12 ms in /dev/shm, paid
    twice per batch and worker. Large batches stay on disk, where the page cache can evict them."""
    try:
        shm = os.statvfs("/dev/shm")
        if shm.f_bavail * shm.f_frsize < 1 << 30 or not os.access("/dev/shm", os.W_OK):
            return None
        return tempfile.TemporaryDirectory(prefix="exportkit-batches-", dir="/dev/shm")
    except OSError:
        return None


class TfWorker:
    """The worker process and its request/reply channel. `start()` spawns it (its TensorFlow import overlaps the
    caller's work); `begin_load()` sends a load without waiting, so loads overlap each other too.

    By default the worker is `exportkit.runtimes.session_worker` on this Python. `python` and `worker` run another
    interpreter and a standalone script speaking the same protocol instead (a managed TF X.Y environment, see
    exportkit.tfversions.envs); `tf_version` then says which TensorFlow answered.
    """

    def __init__(self, path: str, device: str | None = "cpu", allow_tf32: bool = False, *, python: str | None = None,
                 worker: str | None = None,
                 broken_remedy: str = "check that exportkit is installed in this Python environment"):
        self.path = str(Path(path).resolve())
        self.device = device
        self.allow_tf32 = allow_tf32
        self.tf_version: str | None = None
        self.managed = worker is not None  # a standalone worker in a managed TF X.Y environment
        self._command = [python or sys.executable, "-I"] + (
            [worker] if worker else ["-m", "exportkit.runtimes.session_worker"])
        self._broken_remedy = broken_remedy
        self._proc = None
        self._ready = False
        self._next_id = 0
        self._pending: deque[int] = deque()  # ids sent and not yet answered, oldest first
        self._replies: dict[int, dict] = {}
        self._arrived = threading.Condition()  # guards the ids, _pending, _replies and the ready line
        self._sending = threading.Lock()
        self._ready_line: dict | None = None
        self._ended = False  # the worker closed its stdout (it exited)
        self._loads: dict[str, int] = {}  # loader -> id of its load request
        self._loaded: dict[str, dict] = {}  # loader -> the reply to its load
        self._runs = itertools.count(1)
        self._users = 0
        self._users_lock = threading.Lock()

    @classmethod
    def prestart(cls, device: str | None = "cpu", *, python: str | None = None, worker: str | None = None) -> None:
        """Start a worker for `device` (on `python` with `worker`, a managed environment's, or this Python's) before
        its model is known: its TensorFlow import (2-3 s, the longest step of a verify) then overlaps everything the
        caller does first. `for_model` hands it out; `discard_prestarted` ends the ones nobody took."""
        key = (device, python, worker)
        if key not in _PRESTARTED:
            if not _PRESTARTED:
                atexit.register(cls.discard_prestarted)  # e.g. a usage error before verify ran
            started = cls("", device, python=python, worker=worker)
            started.start()
            _PRESTARTED[key] = started

    @classmethod
    def for_model(cls, path: str, device: str | None = "cpu", allow_tf32: bool = False, *, python: str | None = None,
                  worker: str | None = None, **options) -> "TfWorker":
        """The prestarted worker for `device` (and `python`, `worker`) pointed at `path` (it has loaded nothing yet),
        else a new one."""
        taken = _PRESTARTED.pop((device, python, worker), None)
        if taken is None or taken._proc.poll() is not None:
            if taken is not None:
                taken.close()
            return cls(path, device, allow_tf32, python=python, worker=worker, **options)
        taken.path, taken.allow_tf32 = str(Path(path).resolve()), allow_tf32
        taken._broken_remedy = options.get("broken_remedy", taken._broken_remedy)
        return taken

    @staticmethod
    def discard_prestarted(keep: tuple = ()) -> None:
        """End the prestarted workers nobody took, but those `keep` names ((device, python, worker), as `prestart`
        was given them; killed: they hold nothing but a TensorFlow import)."""
        for key in [k for k in _PRESTARTED if k not in keep]:
            worker = _PRESTARTED.pop(key)
            worker._proc.kill()
            worker.close()

    def attach(self) -> None:
        """One more runtime uses this worker; it stays up until the last one detaches."""
        with self._users_lock:
            self._users += 1

    def detach(self) -> None:
        with self._users_lock:
            self._users -= 1
            last = self._users <= 0
        if last:
            self.close()

    @property
    def process(self) -> subprocess.Popen | None:
        return self._proc

    def start(self) -> None:
        if self._proc is not None:
            return
        self.dir = tempfile.TemporaryDirectory(prefix="exportkit-worker-")
        self._memory = memory_dir()
        self._log = open(Path(self.dir.name) / "worker.log", "w+")
        # Requests go over a socket, not a pipe: a send to a worker that died is EPIPE (MSG_NOSIGNAL), never the
        # SIGPIPE that kills a CLI which restored SIGPIPE's default for `| head`.
        self._requests, theirs = socket.socketpair()
        env = child_env(self.device)
        warm = forkserver.current()
        try:
            self._proc = warm and warm.spawn(self._command, stdin=theirs, stderr=self._log, cwd=self.dir.name, env=env)
            if self._proc is None:
                self._proc = subprocess.Popen(self._command, stdin=theirs, stdout=subprocess.PIPE, stderr=self._log,
                                              cwd=self.dir.name, env=env, text=True, start_new_session=True)
        finally:
            theirs.close()
        self._reader = threading.Thread(target=self._read_lines, daemon=True, name="worker-replies")
        self._reader.start()

    def log_tail(self, lines: int = 15) -> str:
        self._log.flush()
        self._log.seek(0)
        tail = [line.rstrip() for line in self._log.read().splitlines() if line.strip()][-lines:]
        return "\n".join(tail)

    # -- the channel ----------------------------------------------------------------------------------------------
    def _read_lines(self) -> None:
        """The reader thread: every line the worker writes, filed as soon as it comes (the first one is the ready
        line), so no reply waits in a buffer that select() cannot see and each waiter takes its own."""
        for line in self._proc.stdout:
            if line.startswith("{"):
                self._file(json.loads(line))
        with self._arrived:
            self._ended = True
            self._arrived.notify_all()

    def _file(self, reply: dict) -> None:
        if reply.get("missing_module"):  # the worker's Python lacks a package: infrastructure, with the pip command
            missing = MissingModule(reply["missing_module"], self._command[0])
            reply.update(kind="infra", message=missing.message, remedy=missing.remedy)
        with self._arrived:
            if self._ready_line is None:
                self._ready_line = reply
            else:  # replies without an id (a standalone worker answering in order) answer the oldest request
                answered = reply.get("id", self._pending[0] if self._pending else None)
                if answered in self._pending:
                    self._pending.remove(answered)
                self._replies[answered] = reply
            self._arrived.notify_all()

    def _until(self, arrived) -> None:
        """Wait (holding `_arrived`) until `arrived()`; the worker's death or silence is an InfraError."""
        if not self._arrived.wait_for(lambda: arrived() or self._ended, timeout=REPLY_TIMEOUT):
            raise InfraError(f"the TensorFlow worker did not answer within {REPLY_TIMEOUT:.0f} s", "re-run with --debug")
        if not arrived():
            raise self._died()

    def _died(self) -> InfraError:
        """The worker's death as an infrastructure failure naming it, how it ended and the end of its log."""
        try:
            code = self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # it closed its end of the channel and hangs: end it
            self._proc.kill()
            code = self._proc.wait()
        how, why, remedy = f"exit {code}", "", self._broken_remedy
        if code < 0:
            try:
                how = f"killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"killed by signal {-code}"
        if code == -signal.SIGKILL:  # nothing in Python does that: the OOM killer, a CI timeout, a kill -9
            why = ": signal 9, most likely out of memory (the kernel's OOM killer) or a timeout"
            remedy = (f"give the run more memory (each process that loads the model needs about the model's size "
                      f"+ 0.6 GB; `dmesg | grep -i oom` tells whether the OOM killer ended pid {self._proc.pid}) or "
                      f"more time, then run again")
        tail = self.log_tail()
        return InfraError(f"the TensorFlow worker (pid {self._proc.pid}, {' '.join(self._command[2:])}) died "
                          f"({how}){why}" + (f"; its log ends:\n{tail}" if tail else ""), remedy)

    def send(self, **payload) -> int:
        """Send a request; returns its id for `wait`. Runtimes in several threads may send and wait at once."""
        self.start()
        with self._arrived:
            self._next_id += 1
            request_id = payload["id"] = self._next_id
            self._pending.append(request_id)  # before it is sent: a reply without an id can come at once
        try:
            with self._sending:
                self._requests.sendall((json.dumps(payload) + "\n").encode(), getattr(socket, "MSG_NOSIGNAL", 0))
        except OSError as err:  # EPIPE, ECONNRESET: it died
            self._await_ready()  # (having said why, if it could not start)
            raise self._died() from err
        return request_id

    def _await_ready(self) -> None:
        """Wait for the "ready" line, sent once TensorFlow is imported; one that says numpy/TensorFlow do not import
        there (the worker then exits) is an InfraError saying what is wrong with that Python."""
        with self._arrived:
            if self._ready:
                return
            self._until(lambda: self._ready_line is not None)
            ready = self._ready_line
            if not ready.get("ok"):
                if ready.get("missing_module"):
                    raise InfraError(ready["message"], ready["remedy"])
                raise InfraError(f"the TensorFlow worker's Python ({self._command[0]}) {ready.get('message')}",
                                 self._broken_remedy)
            self.tf_version = ready.get("tf")
            self._ready = True

    def wait(self, request_id: int) -> dict:
        """The reply to `request_id`."""
        self._await_ready()
        with self._arrived:
            self._until(lambda: request_id in self._replies)
            return self._replies.pop(request_id)

    def request(self, **payload) -> dict:
        return self.wait(self.send(**payload))

    # -- what the runtimes ask ------------------------------------------------------------------------------------
    def begin_load(self, loader: str, signature: str) -> None:
        if loader not in self._loads:
            self._loads[loader] = self.send(op="load", loader=loader, path=self.path, signature=signature,
                                            device=self.device, allow_tf32=self.allow_tf32)

    def load(self, loader: str, signature: str) -> dict:
        self.begin_load(loader, signature)
        if loader not in self._loaded:  # every later load() of this loader gets the same answer
            self._loaded[loader] = self.wait(self._loads[loader])
        return self._loaded[loader]

    def unload(self, loader: str) -> None:
        """Drop `loader`'s model in the worker (its memory with it); a later load() loads it again."""
        if self._loads.pop(loader, None) is not None:
            self._loaded.pop(loader, None)
            self.request(op="unload", loader=loader)

    def memory(self, previous: str | None = None) -> dict:
        """What the session loader's load costs this worker (exportkit.tfversions.worker.MemoryMeter.figures; {}
        when the worker cannot say). `previous`: a version directory loaded beside it first, as TF Serving holds the
        version it served while it loads the new one (the swap): its growth is `previous_loaded_bytes`."""
        loaded = self.request(op="load", loader="previous", path=str(previous), signature="",
                              device=self.device) if previous is not None else {"ok": True}
        reply = self.request(op="memory", loader="session", device=self.device)
        figures = reply.get("memory") or {} if reply.get("ok") else {}
        return figures if loaded.get("ok") else {**figures, "previous_error": loaded.get("message", "")}

    def run(self, loader: str, signature: str, inputs: dict[str, np.ndarray], input_dtypes: dict[str, str]) -> tuple[dict, dict]:
        run = next(self._runs)  # atomic: runtimes in several threads run at once
        inputs_prefix, outputs_prefix = f"in{run}", f"out{run}"
        small = self._memory is not None and batch_bytes(inputs) <= MEMORY_BATCH
        folder = Path(self._memory.name if small else self.dir.name)  # named as load_batches/save_batches name them
        sent, answered = folder / f"{inputs_prefix}_batch_0.npz", folder / f"{outputs_prefix}_batch_0.npz"
        try:
            try:  # no staging (save_batches'): the worker reads the file only once asked to
                write_npz(sent, inputs)
            except OSError as err:
                raise os_error(err, f"the TensorFlow worker's inputs ({folder})") from None
            reply = self.request(op="run", loader=loader, dir=str(folder), inputs=inputs_prefix,
                                 outputs=outputs_prefix, signature=signature, input_dtypes=input_dtypes)
            return reply, (read_npz(answered) if reply.get("ok") else {})
        finally:  # one batch's files at a time (1M records through diff left 2,000 files; iterdir read them all)
            sent.unlink(missing_ok=True)
            answered.unlink(missing_ok=True)

    def close(self) -> None:
        if self._proc is None:
            return
        if self._proc.poll() is None:
            try:
                self._requests.shutdown(socket.SHUT_WR)  # the worker's EOF: it exits
                self._proc.wait(timeout=10)
            except (subprocess.TimeoutExpired, OSError):
                self._proc.kill()
                self._proc.wait()
        self._requests.close()
        self._reader.join(timeout=5)  # it ends at the worker's EOF; then its pipe can close
        if self._proc.stdout and not self._reader.is_alive():
            self._proc.stdout.close()
        self._log.close()
        self.dir.cleanup()
        if self._memory is not None:
            self._memory.cleanup()
        self._proc = None


class WorkerRuntime(Runtime):
    """One loader of a TfWorker; several runtimes share one worker (the last to close stops it)."""

    kind = "subprocess"

    def __init__(self, worker: TfWorker, loader: str, signature_name: str = DEFAULT_SIGNATURE, preload: bool = False,
                 input_dtypes: dict[str, str] | None = None):
        """`preload`: start() sends the load at once (the SavedModel must exist by then). `input_dtypes`: the
        signature's ({key: dtype}), which tf.saved_model.load's functions need their inputs cast to."""
        self.worker = worker
        worker.attach()
        self._attached = True
        self.preload = preload
        self.name = loader
        self.signature_name = signature_name
        self.device = worker.device
        self.input_dtypes = dict(input_dtypes or {})

    @property
    def tf_version(self) -> str | None:
        return self.worker.tf_version

    def start(self) -> None:
        self.worker.start()
        if self.preload:
            self.worker.begin_load(self.name, self.signature_name)

    def use_signature(self, name: str, input_dtypes: dict[str, str]) -> None:
        self.signature_name, self.input_dtypes = name, input_dtypes

    def _raise(self, reply: dict):
        message, remedy = reply.get("message", ""), reply.get("remedy")
        if reply.get("kind") == "infra":
            raise InfraError(message, remedy)
        if self.name == "saved_model":
            raise CheckFailed(message, remedy or "see the message, re-run with --debug")
        raise loader_failure(message, remedy)

    def load(self) -> None:
        self.start()
        reply = self.worker.load(self.name, self.signature_name)
        if not reply.get("ok"):
            self._raise(reply)
        self.loaded = True

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        reply, outputs = self.worker.run(self.name, self.signature_name, inputs, self.input_dtypes)
        if not reply.get("ok"):
            self._raise(reply)
        self.placed_on = reply.get("placed_on")
        return outputs

    def release(self) -> None:
        """Its model unloaded in the worker, the worker kept (a later run loads it again)."""
        if self.loaded:
            self.loaded = False
            self.worker.unload(self.name)

    def close(self) -> None:
        self.loaded = False
        attached, self._attached = self._attached, False
        if attached:
            self.worker.detach()


class SessionRuntime(WorkerRuntime):
    """The `session` runtime in a worker of its own (export's self-check, managed TF X.Y environments, Beam)."""

    def __init__(self, path: str, signature_name: str = DEFAULT_SIGNATURE, device: str | None = "cpu",
                 allow_tf32: bool = False, *, python: str | None = None, worker: str | None = None,
                 broken_remedy: str = "check that exportkit is installed in this Python environment"):
        super().__init__(TfWorker.for_model(path, device, allow_tf32, python=python, worker=worker,
                                            broken_remedy=broken_remedy), "session", signature_name)

    @property
    def path(self) -> str:
        return self.worker.path

    @path.setter
    def path(self, value: str) -> None:  # export points it at the staging dir once the version is written
        self.worker.path = str(Path(value).resolve())
