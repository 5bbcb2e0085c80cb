"""verify's one TensorFlow worker (issue 12): `saved_model`, `session` and the embedded server live in one process,
and the server answers from the session's load. Each path must still be checked on its own: a direct Session.run
is not a request through the server."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from tests.conftest import run_cli

pytestmark = [pytest.mark.slow, pytest.mark.serving]


def _verify(path, *args):
    proc = run_cli("verify", path, "--serving", "embedded", "--json", "-", *args)
    report = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None
    assert report is not None, proc.stdout + proc.stderr
    return proc, {r["name"]: r for r in report["runtimes"]}


def _passed(row) -> bool:
    return row["status"] == "ok" and row["passed"]


@pytest.fixture(scope="module")
def stateful_warmup(tmp_path_factory):
    """`serving_default` returns x * v; the warm-up file calls `bump`, which adds 1 to v first. TF Serving replays
    warm-up before it answers, so it answers x * (v + 1) where a fresh Session.run (and tf.saved_model.load)
    answer x * v: the server's answers differ from Session.run's because of what happens in the serving path."""
    import tensorflow as tf

    from exportkit.serving.warmup import warmup_records, write_warmup_file

    class Counter(tf.Module):
        def __init__(self):
            self.v = tf.Variable(2.0)

        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
        def serve(self, x):
            return {"y": x * self.v}

        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
        def bump(self, x):
            self.v.assign_add(1.0)
            return {"y": x * self.v}

    module = Counter()
    path = tmp_path_factory.mktemp("stateful") / "counter" / "1"
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve, "bump": module.bump})
    write_warmup_file(str(path), warmup_records("counter", "bump", [{"x": np.ones((1, 3), np.float32)}]))
    return path


def test_server_changed_by_its_warmup_disagrees_with_session_run(stateful_warmup):
    proc, rows = _verify(stateful_warmup, "--signature", "serving_default")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert _passed(rows["saved_model"]) and _passed(rows["session"]), rows
    assert rows["serving"]["status"] == "ok" and not _passed(rows["serving"]), rows["serving"]
    assert not _passed(rows["rest"])
    # Both paths were answered by the one worker, and the report says so.
    assert "session" in rows["serving"]["server"]["process"]
    assert rows["session"]["kind"] == "subprocess" and rows["serving"]["kind"] == "grpc"


def test_a_model_only_the_tf1_loader_fails_fails_session_and_server_alike(tmp_path):
    """tf.saved_model.save of a Keras 3 model: TF2 loading runs it; the TF1 loader (TF Serving's) cannot find its
    variables. The shared load fails once, and both of its paths say so; saved_model still passes."""
    import keras
    import tensorflow as tf

    inp = keras.Input((4,), name="x")
    model = keras.Model(inp, keras.layers.Dense(2, name="y")(inp))
    path = tmp_path / "plain" / "1"
    tf.saved_model.save(model, str(path))
    proc, rows = _verify(path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert rows["saved_model"]["status"] == "ok"
    assert rows["session"]["status"] == "error" and "find variable" in rows["session"]["error"]
    assert rows["serving"]["status"] == "error" and "find variable" in rows["serving"]["error"], rows["serving"]


def test_shared_worker_reports_every_path(exported):
    proc, rows = _verify(exported("mixed_functional.keras").path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("golden", "saved_model", "session", "serving", "rest"):
        assert rows[name]["status"] == "ok", rows[name]
    assert rows["saved_model"]["device"] == "cpu:0"  # where the worker computed it, as in-process it said
    assert rows["serving"]["server"]["kind"] == "embedded"


def test_one_load_at_a_time_gives_the_same_report_and_drops_the_tf2_load(exported, monkeypatch):
    """Over ONE_LOAD_AT_A_TIME_BYTES the TF2 load answers first and is unloaded before the TF1 load (one copy of
    the variables): the report must be the one both loads at once give, and the TF2 load must really be gone."""
    from exportkit.api import verify
    from exportkit.runtimes.session import WorkerRuntime
    from exportkit.verify import execute

    path = exported("mixed_functional.keras").path
    both = verify(path, runtimes="golden,saved_model,session,serving,rest").to_dict()
    released = []
    original = WorkerRuntime.release

    def release(runtime):
        original(runtime)
        released.append((runtime.name, runtime.worker.request(op="run", loader=runtime.name, dir="-", inputs="x",
                                                              outputs="y", signature="serving_default")))

    monkeypatch.setattr(WorkerRuntime, "release", release)
    monkeypatch.setattr(execute, "ONE_LOAD_AT_A_TIME_BYTES", 0)
    one = verify(path, runtimes="golden,saved_model,session,serving,rest").to_dict()
    assert [name for name, _ in released] == ["saved_model"]
    reply = released[0][1]  # the worker holds no TF2 load any more: a run there finds no model to run
    assert reply["ok"] is False and "KeyError" in reply["message"] and "saved_model" in reply["message"], reply

    def without_timings(doc):
        drop = {"seconds", "latency", "server", "toolchain"}
        return [{k: v for k, v in r.items() if k not in drop} for r in doc["runtimes"]], doc["passed"], doc["findings"]

    assert without_timings(one) == without_timings(both)
    assert one["passed"] and [r["name"] for r in one["runtimes"]] == ["golden", "saved_model", "session", "serving",
                                                                       "rest"]


def test_a_prestarted_worker_is_taken_or_ended():
    """verify's worker starts before its model is known; one nobody takes is killed, whatever happened."""
    from exportkit.runtimes.session import TfWorker

    TfWorker.prestart("cpu")
    worker = TfWorker.for_model(".", "cpu")
    assert worker.process is not None and worker.path  # the prestarted process, now pointed at a model
    assert TfWorker.for_model(".", "cpu") is not worker  # taken once: the next caller gets a fresh one
    worker.close()
    from exportkit.runtimes import session

    TfWorker.prestart("cpu")  # nothing takes this one
    process = session._PRESTARTED["cpu", None, None].process
    TfWorker.discard_prestarted(keep=(("gpu", None, None),))
    assert ("cpu", None, None) not in session._PRESTARTED and process.poll() is not None
    # a managed environment's (here: this Python with the standalone worker script) goes to its session runtime
    from exportkit.tfversions.envs import WORKER
    from exportkit.runtimes.session import SessionRuntime

    TfWorker.prestart("cpu", python=sys.executable, worker=str(WORKER))
    process = session._PRESTARTED["cpu", sys.executable, str(WORKER)].process
    runtime = SessionRuntime(".", python=sys.executable, worker=str(WORKER))
    assert runtime.worker.process is process and not session._PRESTARTED
    process.kill()
    runtime.worker.close()
