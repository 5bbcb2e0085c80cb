"""`exportkit serve` as TF Serving behaves in production (issue 33): deadlines, metrics, the version lifecycle and
batching, each against TF Serving's semantics (the cases of its own C++ tests where it has them). Bounded loopback
load only: every client loop is bounded in count and time. One small TF1 model (tests/tfs_models.py) serves all."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from tfs_models import build_production_toy

MODEL = "toy"


# ------------------------------------------------------------------------------------------ pure: the policy
@pytest.mark.parametrize("versions, expected", [
    # availability_preserving_policy_test.cc, case by case: (version, aspired, state)
    ([(1, False, "unloading"), (2, False, "error"), (3, True, "ready"), (4, True, "new"), (5, True, "new")],
     ("load", 5)),  # LoadsNewAspired
    ([(1, False, "unloading"), (2, False, "error"), (3, False, "ready"), (4, True, "ready"), (5, True, "new")],
     ("unload", 3)),  # UnloadsNonAspiredFirst
    ([(1, False, "disabled"), (2, False, "ready"), (3, False, "error")], ("unload", 2)),  # ...WhenNoAspired
    ([(1, True, "ready"), (2, True, "error"), (3, True, "loading"), (4, False, "unloading"), (5, False, "disabled")],
     None),  # ReturnsNoActionWhenNone
    ([(1, False, "ready"), (2, True, "loading")], None),  # DoesNotUnloadWhenOtherNotReady
    ([(1, False, "ready"), (2, True, "error")], None),  # DoesNotUnloadWhenOtherInError
    ([(1, False, "ready"), (2, True, "loading"), (3, True, "ready")], ("unload", 1)),  # ...EvenIfLoading
    ([(1, False, "ready"), (2, True, "error"), (3, True, "ready")], ("unload", 1)),  # ...EvenIfError
    ([(2, False, "ready"), (1, False, "ready"), (3, True, "error"), (4, True, "loading")],
     ("unload", 1)),  # UnloadIfNoAspiredVersionsReady
])
def test_the_version_policy_is_availability_preserving(versions, expected):
    from exportkit.serving.server.server_core import next_action

    assert next_action(versions) == expected


# ------------------------------------------------------------------------------------------ pure: Prometheus
def test_the_prometheus_page_is_tf_servings():
    """prometheus_exporter_test.cc's cases, byte for byte, and a real Prometheus parser reads the page."""
    from prometheus_client.parser import text_string_to_metric_families

    from exportkit.serving.server.monitoring import Counter, Sampler, generate_page

    counter = Counter("/test/path/total", "name")
    counter.add(("abc",), 2)
    assert generate_page([counter]) == '# TYPE :test:path:total counter\n:test:path:total{name="abc"} 2\n'
    histogram = Sampler("/test/path/histogram", "status", buckets=tuple(2.0 ** i for i in range(10)))
    for value in (2, 20, 200):
        histogram.add(("good",), value)
    expected = ["# TYPE :test:path:histogram histogram"] + [
        f':test:path:histogram_bucket{{status="good",le="{le}"}} {n}'
        for le, n in zip([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, "+Inf"], [0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3])] + [
        ':test:path:histogram_sum{status="good"} 222', ':test:path:histogram_count{status="good"} 3']
    assert generate_page([histogram]) == "\n".join(expected) + "\n"
    escaped = Counter("/test/path/total", "name")
    escaped.add(('"abc\\"',), 2)
    assert ':test:path:total{name="\\"abc\\\\\\""} 2' in generate_page([escaped])
    odd = Counter("0/path-total_count", "my-name+1")
    odd.add(("abc",), 2)
    assert generate_page([odd]) == '# TYPE _0:path:total_count counter\n_0:path:total_count{my_name_1="abc"} 2\n'

    families = {f.name: f for f in text_string_to_metric_families(generate_page([counter, histogram, escaped]))}
    assert families[":test:path:histogram"].type == "histogram"
    assert families[":test:path:total"].type == "counter"
    assert [s.labels for s in families[":test:path:total"].samples] == [{"name": "abc"}, {"name": '"abc\\"'}]


# ------------------------------------------------------------------------------------------ in-process servers
@pytest.fixture(scope="module")
def toy_base(tmp_path_factory):
    """Version 1 (y = x + 1) and a spare version 2 (y = x + 2) to copy in."""
    root = tmp_path_factory.mktemp("production")
    build_production_toy(str(root / "toy" / "1"), b=1.0)
    build_production_toy(str(root / "spare" / "2"), b=2.0)
    return root


def _predict(signature: str = "serving_default", version: int | None = None, **inputs):
    from tensorflow_serving.apis import predict_pb2

    from exportkit.serving.tensors import to_tensor_proto

    request = predict_pb2.PredictRequest()
    request.model_spec.name = MODEL
    request.model_spec.signature_name = signature
    if version is not None:
        request.model_spec.version.value = version
    for key, value in inputs.items():
        request.inputs[key].CopyFrom(to_tensor_proto(np.asarray(value, np.float32)))
    return request


def _outputs(response) -> dict:
    from exportkit.serving.tensors import to_ndarray

    return {k: to_ndarray(v).tolist() for k, v in response.outputs.items()}


def _core(base, batching: str | None = None, **options):
    from exportkit.serving.server.config import ModelConfig, _declared_messages
    from exportkit.serving.server.server_core import ServerCore

    params = None
    if batching is not None:
        from google.protobuf import text_format

        params = text_format.Parse(batching, _declared_messages()["BatchingParameters"]())
    core = ServerCore(batching=params, **options)
    core.reload_config([ModelConfig(MODEL, str(base))])
    return core


def _in_threads(calls: list, seconds: float = 30) -> list:
    """Run each call in its own thread (started 50 ms apart, in order); their results or exceptions."""
    results: list = [None] * len(calls)

    def run(i, call):
        try:
            results[i] = call()
        except Exception as err:  # noqa: BLE001 — the test looks at it
            results[i] = err

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
        time.sleep(0.05)
    for thread in threads:
        thread.join(seconds)
    return results


def _until_taken(batcher) -> None:
    """Wait (at most 10 s) until the batch threads have taken every queued task: the slow batch is running."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(t for q in batcher._queues.values() for b in q.batches for t in b):
        time.sleep(0.02)
    time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.serving
def test_batching_queue_full_large_batch_splitting_and_variable_length_padding(toy_base):
    from exportkit.serving.server.predict import predict
    from exportkit.serving.server.scope import request_scope
    from exportkit.serving.server.status import RpcError

    base = toy_base / "toy"
    # max_enqueued_batches: one batch runs (slowly), one full batch waits, the next task finds the queue full
    core = _core(base, "max_batch_size { value: 2 } batch_timeout_micros { value: 0 } "
                       "max_enqueued_batches { value: 1 } num_batch_threads { value: 1 }")
    try:
        batcher = core.servable(MODEL)._batcher
        first = threading.Thread(target=predict, args=(core, _predict("slow", x=[1.0], delay=[1.5])))
        first.start()
        _until_taken(batcher)
        second = _in_threads([lambda: _outputs(predict(core, _predict("slow", x=[1.0, 2.0], delay=[0.0, 0.0])))],
                             seconds=0.3)  # still waiting in the queue when this returns
        with pytest.raises(RpcError) as info:
            predict(core, _predict("slow", x=[3.0], delay=[0.0]))
        assert (info.value.code.name, info.value.message) == (
            "UNAVAILABLE", "The batch scheduling queue to which this task was submitted is full; currently 1 batches "
                           "enqueued and max_enqueued_batches is 1")
        first.join(30)
        deadline = time.monotonic() + 30
        while second[0] is None and time.monotonic() < deadline:  # the waiting batch runs once the thread is free
            time.sleep(0.05)
        assert second == [{"y": [2.0, 3.0]}]

        # a request whose deadline passes while it waits in the queue is not run at all
        busy = threading.Thread(target=predict, args=(core, _predict("slow", x=[1.0], delay=[1.0])))
        busy.start()
        _until_taken(batcher)
        with pytest.raises(RpcError) as info, request_scope(0.2):
            predict(core, _predict("slow", x=[1.0], delay=[0.0]))
        assert (info.value.code.name, info.value.message) == (
            "RESOURCE_EXHAUSTED", "Run() timeout exceeded while waiting in batching queue")
        busy.join(30)
    finally:
        core.close()

    # enable_large_batch_splitting: 5 rows run as pieces of at most 2 (padded to the allowed 2), answered as one
    split = _core(base, "max_batch_size { value: 8 } batch_timeout_micros { value: 0 } allowed_batch_sizes: 2 "
                        "allowed_batch_sizes: 8 enable_large_batch_splitting { value: true } "
                        "max_execution_batch_size { value: 2 }")
    whole = _core(base, "max_batch_size { value: 8 } batch_timeout_micros { value: 0 } allowed_batch_sizes: 2 "
                        "allowed_batch_sizes: 8")
    try:
        rows = [1.0, 2.0, 3.0, 4.0, 5.0]
        assert _outputs(predict(split, _predict(x=rows))) == {"y": [2.0, 3.0, 4.0, 5.0, 6.0], "rows": [2.0] * 5}
        assert _outputs(predict(whole, _predict(x=rows))) == {"y": [2.0, 3.0, 4.0, 5.0, 6.0], "rows": [8.0] * 5}
        with pytest.raises(RpcError) as info:
            predict(split, _predict(x=[1.0] * 9))
        assert info.value.message == "Task size 9 is larger than maximum input batch size 8"
    finally:
        split.close()
        whole.close()

    # pad_variable_length_inputs: two requests of different lengths share a batch, padded with their first element
    padded = _core(base, "max_batch_size { value: 4 } batch_timeout_micros { value: 1000000 } "
                         "pad_variable_length_inputs: true")
    strict = _core(base, "max_batch_size { value: 4 } batch_timeout_micros { value: 1000000 }")
    try:
        ask = lambda core, row: lambda: _outputs(predict(core, _predict("ragged", x=[row])))  # noqa: E731
        assert _in_threads([ask(padded, [7.0, 2.0]), ask(padded, [3.0, 4.0, 5.0])]) == [
            {"y": [[7.0, 2.0, 7.0]], "rows": [2.0]}, {"y": [[3.0, 4.0, 5.0]], "rows": [2.0]}]
        answers = _in_threads([ask(strict, [7.0, 2.0]), ask(strict, [3.0, 4.0, 5.0])])
        assert [(type(a).__name__, a.code.name) for a in answers] == [("RpcError", "FAILED_PRECONDITION")] * 2
        assert answers[0].message.startswith("Tensors with name 'x2:0' from different tasks have different shapes "
                                             "and padding is turned off.")
    finally:
        padded.close()
        strict.close()


@pytest.mark.slow
@pytest.mark.serving
def test_a_late_copy_loads_on_retry_and_a_failed_load_shows_in_get_model_status(toy_base, tmp_path):
    """A version whose saved_model.pb arrives after the poll saw it loads on a retry (loader_harness.cc); one that
    never completes ends with TF's error in GetModelStatus while the version before it keeps serving."""
    from tensorflow_serving.apis import get_model_status_pb2

    from exportkit.serving.server.model_status import get_model_status
    from exportkit.serving.server.monitoring import Metrics
    from exportkit.serving.server.predict import predict
    from exportkit.serving.server.server_core import LoadRetries

    base = tmp_path / "toy"
    shutil.copytree(toy_base / "toy" / "1", base / "1")
    metrics = Metrics("/metrics")
    core = _core(base, retries=LoadRetries(5, 300_000), metrics=metrics)
    try:
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = MODEL
        states = get_model_status_pb2.ModelVersionStatus.State

        def status():
            return [(e.version, states.Name(e.state), e.status.error_code, e.status.error_message)
                    for e in get_model_status(core, request).model_version_status]

        while_retrying = []

        def copy_the_rest():
            while_retrying.extend(status())
            shutil.copy(toy_base / "spare" / "2" / "saved_model.pb", base / "2")

        shutil.copytree(toy_base / "spare" / "2", base / "2", ignore=shutil.ignore_patterns("saved_model.pb"))
        late = threading.Timer(0.5, copy_the_rest)
        late.start()
        core.poll_file_system()  # returns once version 2 has loaded (on a retry) and version 1 unloaded
        late.join()
        assert while_retrying == [(2, "LOADING", 0, ""), (1, "AVAILABLE", 0, "")]  # as TF Serving reports a retry
        assert _outputs(predict(core, _predict(x=[1.0])))["y"] == [3.0]
        attempts = metrics.load_attempts.cells
        assert attempts[(str(base / "2"), "fail")] >= 1 and attempts[(str(base / "2"), "success")] == 1

        core.retries = LoadRetries(1, -1)  # negative: retried at once
        (base / "3").mkdir()  # never completed
        core.poll_file_system()
        assert status() == [
            (3, "END", 5, f"Could not find SavedModel .pb or .pbtxt at supplied export directory path: {base / '3'}. "
                          "Check that the directory exists and that you have the right permissions for accessing it."),
            (2, "AVAILABLE", 0, ""), (1, "END", 0, "")]
        assert attempts[(str(base / "3"), "fail")] == 2  # the attempt and its one retry
        assert _outputs(predict(core, _predict(x=[1.0])))["y"] == [3.0]  # availability preserved
    finally:
        core.close()


# ------------------------------------------------------------------------------------------ `exportkit serve`
@pytest.fixture(scope="module")
def served(toy_base, tmp_path_factory):
    """`exportkit serve` with TF Serving's flags over version 1; its stdout is closed before the readiness line is
    written (that must not end it), so readiness is waited for as TF Serving's clients do, over ModelService."""
    import grpc
    from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc

    from exportkit.serving.launch.process import free_port

    root = tmp_path_factory.mktemp("served")
    base = root / MODEL
    shutil.copytree(toy_base / "toy" / "1", base / "1")
    monitoring = root / "monitoring.config"
    monitoring.write_text('prometheus_config { enable: true path: "/metrics" }\n')
    grpc_port, rest_port = free_port(), free_port()
    log = (root / "serve.log").open("w+")
    proc = subprocess.Popen([sys.executable, "-m", "exportkit", "serve", f"--port={grpc_port}",
                             f"--rest_api_port={rest_port}", f"--model_name={MODEL}", f"--model_base_path={base}",
                             "--rest_api_timeout_in_ms=500", f"--monitoring_config_file={monitoring}",
                             "--file_system_poll_wait_seconds=1"],
                            stdout=subprocess.PIPE, stderr=log)
    proc.stdout.close()  # nobody reads the readiness line
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    try:
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = MODEL
        stub = model_service_pb2_grpc.ModelServiceStub(channel)
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, _log(log)
            try:
                stub.GetModelStatus(request, timeout=5)
                break
            except grpc.RpcError:  # the ports open once the model is loaded
                time.sleep(0.2)
        yield {"proc": proc, "log": log, "base": base, "channel": channel, "status": stub, "rest": rest_port,
               "spare": toy_base / "spare" / "2"}
    finally:
        channel.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        log.close()


def _log(log) -> str:
    log.flush()
    log.seek(0)
    return log.read()[-3000:]


def _grpc_predict(served, request, timeout: float = 20):
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    return prediction_service_pb2_grpc.PredictionServiceStub(served["channel"]).Predict(request, timeout=timeout)


def _rest(served, body: dict, path: str = f"/v1/models/{MODEL}:predict", timeout: float = 20):
    request = urllib.request.Request(f"http://127.0.0.1:{served['rest']}{path}", data=json.dumps(body).encode())
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _metrics(served) -> dict:
    """{(family, sample name, sorted labels): value} of the Prometheus page, read by a real parser."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{served['rest']}/metrics", timeout=20).read().decode()
    assert "_total{" not in text and "_created" not in text
    return {(f.name, s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def _sample(page: dict, name: str, **labels) -> float:
    key = tuple(sorted(labels.items()))
    return sum(v for (family, sample, found), v in page.items() if sample == name and found == key)


@pytest.mark.slow
@pytest.mark.serving
def test_a_closed_stdout_does_not_end_the_server_and_ports_open_after_the_load(served):
    assert served["proc"].poll() is None
    text = _log(served["log"])
    assert "cannot write the readiness line to stdout" in text
    assert text.index("loaded in") < text.index("listening on")  # server.cc: load first, then the ports


@pytest.mark.slow
@pytest.mark.serving
def test_rest_and_grpc_deadlines_reach_the_session_under_load(served):
    import grpc

    fast = {"signature_name": "serving_default", "instances": [1.0]}
    slow = {"signature_name": "slow", "instances": [{"x": 1.0, "delay": 5.0}]}

    def clients():
        return [_rest(served, fast)[0] for _ in range(10)]  # bounded: 10 requests per client

    started = time.monotonic()
    results = _in_threads([lambda: _rest(served, slow)] + [clients] * 4)
    # --rest_api_timeout_in_ms=500 is the Session.run's RunOptions timeout: DEADLINE_EXCEEDED = HTTP 504
    assert results[0] == (504, {"error": "Timed out waiting for notification"})
    assert results[1:] == [[200] * 10] * 4
    assert time.monotonic() - started < 4.5  # the 5 s sleep was cut off

    before = _sample(_metrics(served), ":tensorflow:serving:request_count_total", model_name=MODEL,
                     status="DEADLINE_EXCEEDED")
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as info:
        _grpc_predict(served, _predict("slow", x=[1.0], delay=[5.0]), timeout=0.5)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # the client's deadline became the server's RunOptions timeout: its run ended then too, not 5 s later
    deadline = time.monotonic() + 10
    while _sample(_metrics(served), ":tensorflow:serving:request_count_total", model_name=MODEL,
                  status="DEADLINE_EXCEEDED") == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert time.monotonic() - started < 4.0


@pytest.mark.slow
@pytest.mark.serving
def test_metrics_after_mixed_rest_and_grpc_traffic(served):
    before = _metrics(served)
    for _ in range(5):
        assert _rest(served, {"instances": [1.0]})[0] == 200
    for _ in range(7):
        _grpc_predict(served, _predict(x=[1.0]))
    assert _rest(served, {"signature_name": "nope", "instances": [1.0]})[0] == 400
    after = _metrics(served)

    def delta(name, **labels):
        return _sample(after, name, **labels) - _sample(before, name, **labels)

    assert delta(":tensorflow:serving:request_count_total", model_name=MODEL, status="OK") == 12
    assert delta(":tensorflow:serving:request_count_total", model_name=MODEL, status="INVALID_ARGUMENT") == 1
    assert delta(":tensorflow:serving:request_latency_count", model_name=MODEL, API="predict", entrypoint="REST") == 5
    assert delta(":tensorflow:serving:request_latency_count", model_name=MODEL, API="Predict", entrypoint="GRPC") == 7
    assert delta(":tensorflow:serving:runtime_latency_count", model_name=MODEL, API="Predict", runtime="TF1") >= 12
    assert _sample(after, ":tensorflow:cc:saved_model:load_attempt_count_total",
                   model_path=str(served["base"] / "1"), status="success") == 1
    buckets = sorted(((float(dict(labels)["le"]), v) for (family, name, labels), v in after.items()
                      if name == ":tensorflow:serving:request_latency_bucket"
                      and ("entrypoint", "REST") in labels and ("model_name", MODEL) in labels), key=lambda b: b[0])
    assert [v for _, v in buckets] == sorted(v for _, v in buckets)  # cumulative
    assert buckets[-1] == (float("inf"), _sample(after, ":tensorflow:serving:request_latency_count", model_name=MODEL,
                                                 API="predict", entrypoint="REST"))


@pytest.mark.slow
@pytest.mark.serving
def test_a_swap_under_load_fails_no_request_and_waits_for_the_one_in_flight(served):
    """8 clients keep sending while version 2 arrives; a 6-second request on version 1 still answers from it, and
    version 1 is UNLOADING (no new request reaches it) until that request is done (basic_manager.cc)."""
    from tensorflow_serving.apis import get_model_status_pb2

    stop = threading.Event()
    failures, answers = [], set()

    def client(i):
        for n in range(200):  # bounded in count, and by `stop` / 30 s in time
            if stop.is_set():
                return
            try:
                if (i + n) % 2:
                    status, body = _rest(served, {"instances": [1.0]})
                    assert status == 200, body
                    answers.add(body["predictions"][0]["y"])
                else:
                    answers.add(_outputs(_grpc_predict(served, _predict(x=[1.0])))["y"][0])
            except Exception as err:  # noqa: BLE001 — counted
                failures.append(repr(err))
            time.sleep(0.05)

    in_flight: list = []
    slow = threading.Thread(target=lambda: in_flight.append(
        _outputs(_grpc_predict(served, _predict("slow", x=[1.0], delay=[6.0]), timeout=60))))
    slow.start()
    time.sleep(0.3)  # it has reached version 1
    clients = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for thread in clients:
        thread.start()
    base = served["base"]
    shutil.copytree(served["spare"], base / "tmp-2")
    os.rename(base / "tmp-2", base / "2")  # appears whole, as an export does

    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = MODEL
    states = get_model_status_pb2.ModelVersionStatus.State
    seen, deadline = [], time.monotonic() + 30
    while time.monotonic() < deadline:
        seen.append([(e.version, states.Name(e.state)) for e in
                     served["status"].GetModelStatus(request, timeout=10).model_version_status])
        if seen[-1] == [(2, "AVAILABLE"), (1, "END")]:
            break
        time.sleep(0.2)
    time.sleep(0.5)
    stop.set()
    for thread in clients:
        thread.join(30)
    slow.join(30)
    assert in_flight == [{"y": [2.0]}]  # answered by version 1, which stayed loaded for it
    assert failures == []
    assert seen[-1] == [(2, "AVAILABLE"), (1, "END")]
    assert [(2, "AVAILABLE"), (1, "UNLOADING")] in seen  # held by the 6 s request while version 2 served
    assert answers == {2.0, 3.0}  # version 1's and version 2's
    assert "Loop execution was cancelled" not in _log(served["log"])
