"""exportkit.warm_start(): verify's workers forked from one TensorFlow import must be indistinguishable from workers
started fresh (same answers, own session, directory and environment), and must be started fresh wherever a fork
could differ."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import psutil
import pytest

import exportkit
from exportkit.batches import load_batches
from exportkit.errors import InfraError
from exportkit.runtimes import forkserver
from exportkit.runtimes.session import TfWorker

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model(exported):
    entry = exported("multi_io.keras")
    assert entry.proc.returncode == 0, entry.proc.stderr
    return entry.path


def _answers(path) -> dict:
    """What the session and saved_model loaders answer on the golden batch of 8, in one worker."""
    worker = TfWorker.for_model(str(path), "cpu")
    try:
        inputs = load_batches(str(path / "assets.extra" / "exportkit"), "golden_inputs")[-1]
        worker.start()
        answers = {"forked": isinstance(worker.process, forkserver.ForkedProcess)}
        for loader in ("session", "saved_model"):
            assert worker.load(loader, "serving_default")["ok"]
            reply, outputs = worker.run(loader, "serving_default", inputs, {k: v.dtype.name for k, v in inputs.items()})
            assert reply["ok"], reply["detail"]
            answers[loader] = outputs
        return answers
    finally:
        worker.close()


def test_a_forked_worker_answers_bit_for_bit_as_a_fresh_one(model, monkeypatch):
    assert forkserver.current() is not None  # conftest's session-wide warm_start()
    forked = _answers(model)
    monkeypatch.setattr(forkserver, "_current", None)
    fresh = _answers(model)
    assert forked.pop("forked") and not fresh.pop("forked")
    for loader, outputs in fresh.items():
        assert outputs.keys() == forked[loader].keys()
        for key, value in outputs.items():
            assert value.dtype == forked[loader][key].dtype
            np.testing.assert_array_equal(value, forked[loader][key], err_msg=f"{loader} {key}")


def test_a_forked_worker_has_its_own_session_directory_and_environment(model):
    worker = TfWorker.for_model(str(model), "cpu")
    try:
        worker.start()
        assert worker.load("session", "serving_default")["ok"]
        pid, server = worker.process.pid, forkserver.current().process.pid
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
        with pytest.raises(InfraError, match=r"died \(killed by SIGKILL\)"):
            worker.request(op="unload", loader="session")
    finally:
        worker.close()


def test_workers_start_fresh_once_the_server_is_gone(model, monkeypatch):
    """A server of this test's own (the session's stays up), killed under a running worker."""
    monkeypatch.setattr(forkserver, "_current", None)
    with exportkit.warm_start():
        server = forkserver.current()
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
    monkeypatch.setattr(forkserver, "_current", None)
    cold = exportkit.verify(model, serving="embedded")
    assert warm.passed and cold.passed and warm.verdict == cold.verdict
    assert {r.name: r.status for r in warm.runtimes} == {r.name: r.status for r in cold.runtimes}
    for output, by_runtime in cold.outputs.items():
        for runtime, comparison in by_runtime.items():
            assert warm.outputs[output][runtime].max_abs_err == comparison.max_abs_err, (output, runtime)
