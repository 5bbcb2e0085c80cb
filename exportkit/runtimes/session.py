"""The `session` runtime: TF1 loader + Session.run in a separate process, as TF Serving loads models."""
from __future__ import annotations

import json
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from exportkit.batches import load_batches, save_batches
from exportkit.errors import CheckFailed, InfraError
from exportkit.runtimes import Runtime
from exportkit.tfenv import child_env
from exportkit.savedmodel import DEFAULT_SIGNATURE

REPLY_TIMEOUT = 600.0


class SessionRuntime(Runtime):
    """`start()` spawns the worker, so its TensorFlow import overlaps with whatever the caller does next.

    By default the worker is `exportkit.runtimes.session_worker` on this Python. `python` and `worker` run
    another interpreter and a standalone script speaking the same protocol instead (a managed TF X.Y
    environment, see exportkit.compat.envs); `tf_version` then says which TensorFlow answered.
    """

    name = "session"
    kind = "subprocess"

    def __init__(self, path: str, signature_name: str = DEFAULT_SIGNATURE, device: str | None = "cpu",
                 allow_tf32: bool = False, *, python: str | None = None, worker: str | None = None,
                 broken_remedy: str = "check that exportkit is installed in this Python environment"):
        self.path = str(Path(path).resolve())
        self.tf_version: str | None = None
        self._command = [python or sys.executable, "-I"] + (
            [worker] if worker else ["-m", "exportkit.runtimes.session_worker"])
        self._broken_remedy = broken_remedy
        self.allow_tf32 = allow_tf32
        self.signature_name = signature_name
        self.device = device
        self._proc = None
        self._ready = False
        self._runs = 0

    def start(self) -> None:
        if self._proc is not None:
            return
        self._dir = tempfile.TemporaryDirectory(prefix="exportkit-session-")
        self._log = open(Path(self._dir.name) / "worker.log", "w+")
        self._proc = subprocess.Popen(
            self._command,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, cwd=self._dir.name,
            env=child_env(self.device), text=True, start_new_session=True)

    def _log_tail(self, lines: int = 15) -> str:
        self._log.flush()
        self._log.seek(0)
        tail = [line.rstrip() for line in self._log.read().splitlines() if line.strip()][-lines:]
        return "\n".join(tail)

    def _receive(self) -> dict:
        deadline = time.monotonic() + REPLY_TIMEOUT
        while True:
            ready, _, _ = select.select([self._proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise InfraError(f"the session worker did not answer within {REPLY_TIMEOUT:.0f} s", "re-run with --debug")
            line = self._proc.stdout.readline()
            if not line:
                raise InfraError(f"the session worker died (exit {self._proc.poll()}): {self._log_tail()}",
                                 self._broken_remedy)
            if line.startswith("{"):
                return json.loads(line)

    def _request(self, **payload) -> dict:
        if not self._ready:
            ready = self._receive()  # the "ready" line, sent once TensorFlow is imported
            self.tf_version = ready.get("tf")
            self._ready = True
        try:
            self._proc.stdin.write(json.dumps(payload) + "\n")
            self._proc.stdin.flush()
        except BrokenPipeError as err:
            raise InfraError(f"the session worker died: {self._log_tail()}", "re-run with --debug") from err
        reply = self._receive()
        if not reply.get("ok"):
            message = reply.get("message", "")
            remedy = ("export with `exportkit export` (keras.export.ExportArchive tracks every variable the signature "
                      "uses; tf.saved_model.save of a Keras 3 model does not)" if "find variable" in message else
                      "this SavedModel will fail the same way in TF Serving; see the message, re-run with --debug")
            raise CheckFailed(f"TF1 loader (as TF Serving loads models): {message}", remedy)
        return reply

    def load(self) -> None:
        self.start()
        self._request(op="load", path=self.path, signature=self.signature_name, device=self.device,
                      allow_tf32=self.allow_tf32)
        self.loaded = True

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self._runs += 1
        inputs_prefix, outputs_prefix = f"in{self._runs}", f"out{self._runs}"
        save_batches(self._dir.name, [inputs], inputs_prefix)
        self._request(op="run", dir=self._dir.name, inputs=inputs_prefix, outputs=outputs_prefix,
                      signature=self.signature_name)
        return load_batches(self._dir.name, outputs_prefix)[0]

    def close(self) -> None:
        self.loaded = False
        if self._proc is None:
            return
        if self._proc.poll() is None:
            try:
                self._proc.stdin.close()
                self._proc.wait(timeout=10)
            except (subprocess.TimeoutExpired, BrokenPipeError, OSError):
                self._proc.kill()
                self._proc.wait()
        if self._proc.stdout:
            self._proc.stdout.close()
        self._log.close()
        self._dir.cleanup()
