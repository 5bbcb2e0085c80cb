"""exportkit.warm_start(): verify's workers forked from one TensorFlow import must be indistinguishable from workers
started fresh (same answers, own session, directory and environment), and must be started fresh wherever a fork
could differ."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import numpy as np
import psutil
import pytest

import exportkit
from exportkit.inputs.npz import load_batches
from exportkit.errors import InfraError
from exportkit.runtimes import forkserver
from exportkit.runtimes.session import TfWorker

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model(exported):
    entry = exported("multi_io.keras")
    assert entry.proc.returncode == 0, entry.proc.stderr
    return entry.path


def _answers(path, loaders=("session", "saved_model"), **where) -> dict:
    """What the loaders answer on the golden batch of 8, in one worker (`where`: TfWorker's python and worker)."""
    worker = TfWorker.for_model(str(path), "cpu", **where)
    try:
        inputs = load_batches(str(path / "assets.extra" / "exportkit"), "golden_inputs")[-1]
        worker.start()
        answers = {"forked": isinstance(worker.process, forkserver.ForkedProcess)}
        for loader in loaders:
            assert worker.load(loader, "serving_default")["ok"]
            reply, outputs = worker.run(loader, "serving_default", inputs, {k: v.dtype.name for k, v in inputs.items()})
            assert reply["ok"], reply["detail"]
            answers[loader] = outputs
        return answers
    finally:
        worker.close()


def _outside_any_warm_start(monkeypatch) -> None:
    """As in a process no warm start runs in or was started inside: workers start fresh."""
    monkeypatch.setattr(forkserver, "_current", None)
    monkeypatch.delenv(forkserver.ADDRESS_VARIABLE, raising=False)


def test_a_forked_worker_answers_bit_for_bit_as_a_fresh_one(model, monkeypatch):
    assert forkserver.current() is not None  # conftest's session-wide warm_start()
    forked = _answers(model)
    _outside_any_warm_start(monkeypatch)
    fresh = _answers(model)
    assert forked.pop("forked") and not fresh.pop("forked")
    for loader, outputs in fresh.items():
        assert outputs.keys() == forked[loader].keys()
        for key, value in outputs.items():
            assert value.dtype == forked[loader][key].dtype
            np.testing.assert_array_equal(value, forked[loader][key], err_msg=f"{loader} {key}")


@pytest.mark.compat
def test_a_managed_environments_worker_is_forked_from_its_own_server(model, monkeypatch):
    """`--tf 2.12`'s standalone worker (exportkit/tfversions/worker.py under that environment's Python): the first
    worker starts the environment's server, later ones fork from it, and they answer as a fresh one does."""
    from exportkit.tfversions.envs import WORKER, python_for

    where = {"python": python_for("2.12"), "worker": str(WORKER)}
    command = [where["python"], "-I", where["worker"]]
    forked = _answers(model, ["session"], **where)
    server = forkserver.current().server(command)
    assert psutil.Process(server.process.pid).cmdline()[0] == where["python"]  # TF 2.12's own interpreter
    again = _answers(model, ["session"], **where)
    _outside_any_warm_start(monkeypatch)
    fresh = _answers(model, ["session"], **where)
    assert forked.pop("forked") and again.pop("forked") and not fresh.pop("forked")
    for answers in (forked, again):
        for key, value in fresh["session"].items():
            assert value.dtype == answers["session"][key].dtype
            np.testing.assert_array_equal(value, answers["session"][key], err_msg=key)


def test_a_forked_worker_has_its_own_session_directory_and_environment(model):
    worker = TfWorker.for_model(str(model), "cpu")
    try:
        worker.start()
        assert worker.load("session", "serving_default")["ok"]
        pid, server = worker.process.pid, forkserver.current().server(forkserver.WORKER_COMMAND).process.pid
        process = psutil.Process(pid)
        assert process.ppid() == server
        assert os.getsid(pid) == pid  # signals to the caller's process group do not reach it
        assert process.cwd() == worker.dir.name
        environ = process.environ()
        assert environ.get("CUDA_VISIBLE_DEVICES") == ""
    finally:
        worker.close()


@pytest.mark.parametrize("change", ["environment", "gpu", "python"])
def test_a_worker_a_fork_could_make_different_starts_fresh(model, monkeypatch, change, tmp_path):
    options = {}
    if change == "environment":  # read by TensorFlow at import, which the server did with the old value
        monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    elif change == "gpu":
        options["device"] = "gpu"
    else:
        python = tmp_path / "python"
        python.symlink_to(os.path.realpath(sys.executable))
        options["python"] = str(python)
    worker = TfWorker.for_model(str(model), **options)
    try:
        worker.start()
        assert isinstance(worker.process, subprocess.Popen)
    finally:
        worker.process.kill()
        worker.close()


def test_a_killed_forked_worker_is_reported_as_a_fresh_one_would_be(model):
    worker = TfWorker.for_model(str(model), "cpu")
    try:
        worker.start()
        assert worker.load("session", "serving_default")["ok"]
        assert isinstance(worker.process, forkserver.ForkedProcess)
        os.kill(worker.process.pid, signal.SIGKILL)
        assert worker.process.wait(timeout=10) == -signal.SIGKILL
        with pytest.raises(InfraError, match=r"died \(killed by SIGKILL\)") as caught:
            worker.request(op="unload", loader="session")
    finally:
        worker.close()
    # SIGKILL is the OOM killer or a timeout, not a broken install: the message and the fix say so (exit 3)
    err = caught.value
    assert err.exit_code == 3
    assert "signal 9, most likely out of memory" in err.message and "timeout" in err.message, err.message
    assert "more memory" in err.remedy and "installed" not in err.remedy, err.remedy


def test_workers_start_fresh_once_the_server_is_gone(model, monkeypatch):
    """A server of this test's own (the session's stays up), killed under a running worker."""
    _outside_any_warm_start(monkeypatch)
    with exportkit.warm_start():
        server = forkserver.current().server(forkserver.WORKER_COMMAND)
        running = TfWorker.for_model(str(model), "cpu")
        running.start()
        assert running.load("session", "serving_default")["ok"]
        assert isinstance(running.process, forkserver.ForkedProcess)
        server.process.kill()
        server.process.wait()
        # Its worker cannot be reaped and reported any more: it is ended, and seen as killed.
        assert running.process.wait(timeout=10) == -signal.SIGKILL
        running.close()
        later = TfWorker.for_model(str(model), "cpu")
        try:
            later.start()
            assert isinstance(later.process, subprocess.Popen)
            assert later.load("session", "serving_default")["ok"]
        finally:
            later.close()
    assert forkserver.current() is None


def test_verify_in_a_warm_start_gives_the_report_it_gives_without(model, monkeypatch):
    warm = exportkit.verify(model, serving="embedded")
    _outside_any_warm_start(monkeypatch)
    cold = exportkit.verify(model, serving="embedded")
    assert warm.passed and cold.passed and warm.verdict == cold.verdict
    assert {r.name: r.status for r in warm.runtimes} == {r.name: r.status for r in cold.runtimes}
    for output, by_runtime in cold.outputs.items():
        for runtime, comparison in by_runtime.items():
            assert warm.outputs[output][runtime].max_abs_err == comparison.max_abs_err, (output, runtime)


_INHERITED = """
import json, sys
import psutil
from exportkit.runtimes import forkserver
from exportkit.runtimes.session import TfWorker
worker = TfWorker.for_model(sys.argv[1], "cpu")
try:
    worker.start()
    loaded = worker.load("session", "serving_default")["ok"]
    print(json.dumps({"forked": isinstance(worker.process, forkserver.ForkedProcess), "loaded": loaded,
                      "parent": psutil.Process(worker.process.pid).ppid()}))
finally:
    worker.close()
"""


@pytest.mark.parametrize("env", [{}, {"TF_ENABLE_ONEDNN_OPTS": "0"}], ids=["same environment", "changed"])
def test_a_process_started_inside_a_warm_start_forks_its_workers_from_it(model, env):
    """A release script's `exportkit verify` subprocess, say: its worker forks from the server of the warm start it
    was started in, unless its environment makes a fresh worker differ."""
    server = forkserver.current().server(forkserver.WORKER_COMMAND).process.pid
    assert os.environ[forkserver.ADDRESS_VARIABLE] == forkserver.current().address
    proc = subprocess.run([sys.executable, "-c", _INHERITED, str(model)], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["loaded"]
    assert (answer["forked"], answer["parent"] == server) == ((True, True) if not env else (False, False))


def test_a_warm_start_names_its_address_only_while_it_lasts(monkeypatch):
    _outside_any_warm_start(monkeypatch)
    with exportkit.warm_start():
        address = os.environ[forkserver.ADDRESS_VARIABLE]
        assert os.stat(os.path.dirname(address)).st_mode & 0o077 == 0  # no other user can ask for a worker
        with exportkit.warm_start():  # nested: the outer one's
            assert os.environ[forkserver.ADDRESS_VARIABLE] == address
    assert forkserver.ADDRESS_VARIABLE not in os.environ and forkserver.current() is None
    monkeypatch.setenv(forkserver.ADDRESS_VARIABLE, address)  # inherited from a warm start that has ended
    gone = forkserver.current()
    assert isinstance(gone, forkserver.InheritedWarmStart)
    stdin, stderr = socket.socketpair()
    with stdin, stderr:
        assert gone.spawn(forkserver.WORKER_COMMAND, stdin=stdin, stderr=stderr, cwd="/", env={}) is None
