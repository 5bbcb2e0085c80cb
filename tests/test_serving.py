"""The serving path end to end, over real gRPC with TF Serving's official stubs (no mocks).

One embedded `exportkit serve` per session (spawning one costs the TF import, ~5 s); tests that need a server
of their own say so. After every test no child process may be left except that session server (conftest).

The embedded server computes with `Tf1SavedModel` (the TF1 loader), the same class as the `reference` fixture:
comparing the two proves the protocol (request and response conversion, names, dtypes, shapes), not the
numbers. For the numbers, Predict is also compared with TF2's own `tf.saved_model.load` runtime
(`tf2_reference`), which shares no code with the server.
"""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time

import grpc
import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import exportkit  # noqa: E402
from conftest import SESSION_CHILDREN  # noqa: E402
from exportkit.errors import CheckFailed, InfraError  # noqa: E402
from exportkit.tfenv import import_tf  # noqa: E402

tf = import_tf()

from tensorflow_serving.apis import (  # noqa: E402
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from exportkit.runtimes.serving import ServingRuntime  # noqa: E402
from exportkit.serving.launch.binary import BINARY_ENV  # noqa: E402
from exportkit.serving.launch.embedded import launch_embedded  # noqa: E402
from exportkit.serving.launch.modes import launch  # noqa: E402
from exportkit.serving.launch.process import free_port  # noqa: E402
from exportkit.serving.client.grpc_client import ServingClient, ServingError  # noqa: E402
from exportkit.serving.tensors import to_ndarray, to_tensor_proto  # noqa: E402
from exportkit.serving.warmup import read_warmup_records, write_warmup_records  # noqa: E402
from exportkit.savedmodel.loader import Tf1SavedModel  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.serving]
MODEL = "ranker"


def _inputs(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(n, 3)).astype(np.float32), "k": rng.integers(0, 10, size=(n,)).astype(np.int32)}


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="session")
def model_base(tmp_path_factory):
    """BASE/ranker/{2,3}: two inputs (x float32 (None,3), k int32 (None,)), two signatures, warm-up in v3."""
    import keras

    base = tmp_path_factory.mktemp("models") / MODEL
    keras.utils.set_random_seed(1)
    x = keras.Input((3,), name="x", dtype="float32")
    k = keras.Input((), name="k", dtype="int32")
    dense = keras.layers.Dense(4, name="dense")
    y = keras.layers.Add()([dense(x), keras.layers.Embedding(10, 4, name="emb")(k)])
    model = keras.Model({"x": x, "k": k}, y)

    def serve(x, k):
        scores = model({"x": x, "k": k})
        return {"scores": scores, "total": tf.reduce_sum(scores, axis=1)}

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serving_default", serve, input_signature=[
        tf.TensorSpec((None, 3), tf.float32, name="x"), tf.TensorSpec((None,), tf.int32, name="k")])
    archive.add_endpoint("dense_only", lambda x: {"h": dense(x)},
                         input_signature=[tf.TensorSpec((None, 3), tf.float32, name="x")])
    archive.write_out(str(base / "2"), verbose=False)
    archive.write_out(str(base / "3"), verbose=False)
    write_warmup_records(str(base / "3"), MODEL, "serving_default", [_inputs(1), _inputs(4, seed=1)])
    return base


@pytest.fixture(scope="session")
def reference(model_base):
    """The TF1-style loader in this process: what the server must reproduce."""
    model = Tf1SavedModel(str(model_base / "3"), device="cpu")
    yield model
    model.close()


@pytest.fixture(scope="session")
def tf2_reference(model_base):
    """TF2's own runtime (`tf.saved_model.load`), independent of the server's TF1 loader: run(signature, inputs)."""
    loaded = tf.saved_model.load(str(model_base / "3"))

    def run(signature_name: str, inputs: dict) -> dict[str, np.ndarray]:
        outputs = loaded.signatures[signature_name](**{k: tf.constant(v) for k, v in inputs.items()})
        return {k: v.numpy() for k, v in outputs.items()}

    return run


@pytest.fixture(scope="session")
def embedded(model_base):
    handle = launch_embedded(str(model_base), MODEL, load_timeout=120)
    SESSION_CHILDREN.add(handle.process.pid)
    yield handle
    handle.stop()
    assert handle.process.returncode == 0, "SIGTERM must stop `exportkit serve` cleanly (exit 0)"
    SESSION_CHILDREN.discard(handle.process.pid)


@pytest.fixture(scope="session")
def channel(embedded):
    ch = grpc.insecure_channel(embedded.address)
    yield ch
    ch.close()


@pytest.fixture(scope="session")
def predict_stub(channel):
    return prediction_service_pb2_grpc.PredictionServiceStub(channel)


@pytest.fixture(scope="session")
def model_stub(channel):
    return model_service_pb2_grpc.ModelServiceStub(channel)


def _request(inputs, name=MODEL, signature=None, version=None):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    if signature is not None:
        request.model_spec.signature_name = signature
    if version is not None:
        request.model_spec.version.value = version
    for key, value in inputs.items():
        request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
    return request


def _rpc_error(call, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=10)
    return info.value


# ------------------------------------------------------------------------------------------------ embedded server
def test_embedded_server_describes_itself(embedded):
    assert embedded.description["kind"] == "embedded"
    assert embedded.address.startswith("127.0.0.1:")
    assert embedded.model_version == 3  # highest integer version of the base dir
    # Says what it is: exportkit's server on this TensorFlow, never passed off as TF Serving.
    assert embedded.description["version"] == f"exportkit {exportkit.__version__} serve (TensorFlow {tf.__version__})"


def test_status_available_and_not_found(model_stub):
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = MODEL
    response = model_stub.GetModelStatus(request, timeout=10)
    [entry] = response.model_version_status
    assert entry.version == 3
    assert entry.state == get_model_status_pb2.ModelVersionStatus.AVAILABLE
    assert entry.status.error_code == 0

    request.model_spec.version.value = 7
    err = _rpc_error(model_stub.GetModelStatus, request)
    assert err.code() == grpc.StatusCode.NOT_FOUND and "version 7" in err.details()
    other = get_model_status_pb2.GetModelStatusRequest()
    other.model_spec.name = "nope"
    assert _rpc_error(model_stub.GetModelStatus, other).code() == grpc.StatusCode.NOT_FOUND


def test_metadata_is_a_packed_signature_def_map(predict_stub, reference):
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = MODEL
    response = predict_stub.GetModelMetadata(request, timeout=10)
    assert response.model_spec.name == MODEL and response.model_spec.version.value == 3
    packed = response.metadata["signature_def"]
    assert packed.type_url == "type.googleapis.com/tensorflow.serving.SignatureDefMap"
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    assert packed.Unpack(signature_map)
    assert dict(signature_map.signature_def) == reference.signatures

    bad = get_model_metadata_pb2.GetModelMetadataRequest()
    bad.model_spec.name = MODEL
    assert _rpc_error(predict_stub.GetModelMetadata, bad).code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("batch", [1, 5])
def test_predict_equals_tf1_loader_and_tf2_runtime(predict_stub, reference, tf2_reference, batch):
    inputs = _inputs(batch, seed=batch)
    response = predict_stub.Predict(_request(inputs), timeout=10)
    assert response.model_spec.name == MODEL
    assert response.model_spec.version.value == 3
    assert response.model_spec.signature_name == "serving_default"  # filled in although not sent
    expected = reference.run("serving_default", inputs)
    independent = tf2_reference("serving_default", inputs)
    assert set(response.outputs) == set(expected) == set(independent)
    for key, value in expected.items():
        got = tf.make_ndarray(response.outputs[key])
        assert got.shape == value.shape and got.dtype == value.dtype
        np.testing.assert_allclose(got, value, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(got, independent[key], rtol=1e-5, atol=1e-6)


def test_predict_second_signature_and_output_filter(predict_stub, reference, tf2_reference):
    inputs = _inputs(2)
    response = predict_stub.Predict(_request({"x": inputs["x"]}, signature="dense_only"), timeout=10)
    assert response.model_spec.signature_name == "dense_only"
    np.testing.assert_allclose(tf.make_ndarray(response.outputs["h"]),
                               reference.run("dense_only", {"x": inputs["x"]})["h"], rtol=1e-6)
    np.testing.assert_allclose(tf.make_ndarray(response.outputs["h"]),
                               tf2_reference("dense_only", {"x": inputs["x"]})["h"], rtol=1e-5, atol=1e-6)

    request = _request(inputs)
    request.output_filter.append("total")
    assert list(predict_stub.Predict(request, timeout=10).outputs) == ["total"]
    request.output_filter.append("nope")
    err = _rpc_error(predict_stub.Predict, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "nope" in err.details()


@pytest.mark.parametrize("case, code, words", [
    ("wrong_key", grpc.StatusCode.INVALID_ARGUMENT, ["input tensor alias not found in signature: y", "{k,x}"]),
    ("missing_key", grpc.StatusCode.INVALID_ARGUMENT, ["Missing but required: {k}"]),
    # No dtype or shape check against the SignatureDef (predict_util.cc): the session refuses what it cannot run.
    ("wrong_dtype", grpc.StatusCode.INVALID_ARGUMENT, ["float", "double"]),
    ("wrong_shape", grpc.StatusCode.INVALID_ARGUMENT, ["[2,4]"]),
    ("unknown_model", grpc.StatusCode.NOT_FOUND, ["nope"]),
    ("unknown_version", grpc.StatusCode.NOT_FOUND, ["9"]),
    # TF Serving answers FAILED_PRECONDITION here (predict_util.cc), and so must a stand-in.
    ("unknown_signature", grpc.StatusCode.FAILED_PRECONDITION, ["nope"]),
])
def test_predict_errors_like_tf_serving(predict_stub, case, code, words):
    good = _inputs(2)
    request = {
        "wrong_key": lambda: _request({"y": good["x"], "k": good["k"]}),
        "missing_key": lambda: _request({"x": good["x"]}),
        "wrong_dtype": lambda: _request({"x": good["x"].astype(np.float64), "k": good["k"]}),
        "wrong_shape": lambda: _request({"x": np.zeros((2, 4), np.float32), "k": good["k"]}),
        "unknown_model": lambda: _request(good, name="nope"),
        "unknown_version": lambda: _request(good, version=9),
        "unknown_signature": lambda: _request(good, signature="nope"),
    }[case]()
    err = _rpc_error(predict_stub.Predict, request)
    assert err.code() == code, err.details()
    for word in words:
        assert word in err.details()


def test_classify_on_a_predict_signature_is_rejected_like_tf_serving(predict_stub):
    # TF Serving (no method-name check by default) checks the signature's structure: classifier.cc.
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = MODEL
    err = _rpc_error(predict_stub.Classify, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and err.details() == "Expected one input Tensor."


# ------------------------------------------------------------------------------------------------ client
def test_client_round_trip_and_error_codes(embedded, reference):
    with ServingClient(embedded.address, MODEL, timeout=10) as client:
        assert client.wait_available(10) == 3
        assert set(client.metadata()) == set(reference.signatures)
        inputs = _inputs(5)
        got = client.predict(inputs)
        for key, value in reference.run("serving_default", inputs).items():
            np.testing.assert_allclose(got[key], value, rtol=1e-6, atol=1e-7)
        with pytest.raises(ServingError) as info:
            client.predict({"x": inputs["x"].astype(np.float64), "k": inputs["k"]})
        # what the session says, as in TF Serving (no SignatureDef dtype check in predict_util.cc)
        assert info.value.code == "INVALID_ARGUMENT" and "double" in info.value.message
    with ServingClient(embedded.address, "nope", timeout=5) as client:
        with pytest.raises(ServingError) as info:
            client.wait_available(5)
        assert info.value.code == "NOT_FOUND"


def test_client_wait_times_out_on_a_dead_port():
    with ServingClient(f"127.0.0.1:{free_port()}", MODEL) as client:
        with pytest.raises(ServingError) as info:
            client.wait_available(0.5)
        assert info.value.code == "DEADLINE_EXCEEDED"


# ------------------------------------------------------------------------------------------------ remote + runtime
def test_remote_runtime_against_running_serve(embedded, model_base, reference):
    runtime = ServingRuntime(None, embedded.address, model_name=MODEL, load_timeout=10)
    runtime.load()
    try:
        assert runtime.server["kind"] == "remote" and runtime.server["address"] == embedded.address
        assert runtime.device is None
        inputs = _inputs(3)
        got = runtime.run(inputs)
        for key, value in reference.run("serving_default", inputs).items():
            np.testing.assert_allclose(got[key], value, rtol=1e-6, atol=1e-7)
        from exportkit.savedmodel.signature_defs import signatures_of
        from exportkit.verify.baseline import served_signature_findings

        served = runtime.served_signatures()
        expected = signatures_of(reference.meta_graph)["serving_default"]
        assert served_signature_findings("serving_default", expected, served) == []
        changed = {"inputs": {**expected["inputs"], "x": {**expected["inputs"]["x"], "dtype": "float64"}},
                   "outputs": {k: v for k, v in expected["outputs"].items() if k != "total"}}
        problems = served_signature_findings("serving_default", changed, served)
        assert [f.code for f in problems] == ["serving-metadata"] * 2, problems
        assert any("float64" in f.message for f in problems) and any("'total'" in f.message for f in problems)
        assert served_signature_findings("nope", expected, served)[0].message.startswith("signature 'nope' is not served")
        assert runtime.replay_warmup(str(model_base / "3")) == []
        with pytest.raises(CheckFailed, match="INVALID_ARGUMENT"):
            runtime.run({"x": inputs["x"]})
    finally:
        runtime.close()
    assert embedded.process.poll() is None, "closing a remote runtime must not stop the server"

    with pytest.raises(CheckFailed, match="NOT_FOUND"):
        launch(embedded.address, model_name="nope", load_timeout=5)


# ------------------------------------------------------------------------------------------------ binary mode
def _write_exe(directory, text: str) -> str:
    path = directory / "tensorflow_model_server"
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


def test_binary_not_found(monkeypatch, tmp_path, model_base):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv(BINARY_ENV, raising=False)
    with pytest.raises(InfraError) as info:
        launch("binary", str(model_base))
    assert "tensorflow/serving" in info.value.remedy and "tensorflow-model-server" in info.value.remedy
    with pytest.raises(InfraError):
        launch("binary", str(model_base), binary=str(tmp_path / "missing"))


def test_binary_load_error_is_check_failed_with_log(tmp_path, model_base):
    exe = _write_exe(tmp_path, textwrap.dedent("""\
        #!/bin/sh
        echo "Loading servable: {name: $3 version: 3}" >&2
        echo "Op type not registered 'Foo' in binary running on host." >&2
        exit 1
        """))
    with pytest.raises(CheckFailed) as info:
        launch("binary", str(model_base), binary=exe, load_timeout=30)
    assert "Op type not registered 'Foo'" in info.value.message


def test_binary_timeout_kills_the_process_group(tmp_path, model_base):
    exe = _write_exe(tmp_path, "#!/bin/sh\nsleep 60\n")  # never listens; `sleep` is a grandchild
    with pytest.raises(CheckFailed, match="timed out"):
        launch("binary", str(model_base), binary=exe, load_timeout=1.0)


STANDIN = """\
#!{python}
# Stand-in for tensorflow_model_server: parses its flags, then becomes `exportkit serve`.
import os, sys
flags = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
if "--version" in sys.argv:
    print("TensorFlow ModelServer: 0.0.0-standin")
    sys.exit(0)
assert flags["rest_api_port"] == "0", flags
with open(os.path.join(os.path.dirname(__file__), "env.txt"), "w") as fh:
    fh.write(repr(os.environ.get("CUDA_VISIBLE_DEVICES")))
os.execv(sys.executable, [sys.executable, "-m", "exportkit", "serve", flags["model_base_path"],
                          "--port", flags["port"], "--model-name", flags["model_name"]])
"""


def test_binary_mode_with_standin(tmp_path, model_base, reference):
    exe = _write_exe(tmp_path, STANDIN.format(python=sys.executable))
    # Version 2 is not the highest: the launcher must hand the binary a base dir that serves exactly v2.
    runtime = ServingRuntime(str(model_base / "2"), "binary", model_name=MODEL, binary=exe, load_timeout=120)
    try:
        runtime.start()  # spawns; load() waits
        runtime.load()
        assert runtime.server["kind"] == "binary" and runtime.server["binary"] == exe
        assert runtime.server["version"] == "0.0.0-standin"
        assert runtime.server["model_version"] == 2 and runtime.device == "cpu"
        assert (tmp_path / "env.txt").read_text() == "''"  # device=cpu hides GPUs from the child
        inputs = _inputs(2)
        got = runtime.run(inputs)
        np.testing.assert_allclose(got["total"], reference.run("serving_default", inputs)["total"], rtol=1e-6)
        process = runtime._handle.process
    finally:
        runtime.close()
    assert process.poll() is not None


def test_a_close_while_the_server_loads_stops_it_and_starts_none_after(model_base):
    """Ctrl-C while a lane waits for the model to load: the main thread's close() must stop that server (before,
    load() held it in a local, so close() saw none), and a lane arriving after the close must start none."""
    runtime = ServingRuntime(str(model_base / "2"), "embedded", model_name=MODEL, load_timeout=120)
    runtime.start()
    failed: list[BaseException] = []

    def lane():
        try:
            runtime.load()
        except BaseException as err:  # what the lane sees once its server is stopped under it
            failed.append(err)

    thread = threading.Thread(target=lane)
    thread.start()
    time.sleep(0.5)  # the lane is now waiting for the load (TensorFlow's import alone takes seconds)
    runtime.close()
    thread.join(120)
    assert not thread.is_alive() and failed, "the load went on after close()"
    assert runtime._handle is None or runtime._handle._stop is None  # stopped (no_children_left checks the process)
    with pytest.raises(InfraError, match="closed"):
        runtime.load()


# ------------------------------------------------------------------------------------------------ load failures
def test_embedded_failing_warmup_is_check_failed(tmp_path, model_base):
    import shutil

    bad = tmp_path / "broken" / "1"
    shutil.copytree(model_base / "3", bad)
    inputs = _inputs(1)
    # Bypass the writer's checks: a record whose dtype the signature does not accept.
    write_warmup_records(str(bad), MODEL, "serving_default", [{"x": inputs["x"].astype(np.float64), "k": inputs["k"]}],
                         signature_def=_float64_signature())
    with pytest.raises(CheckFailed) as info:
        launch("embedded", str(bad.parent), load_timeout=120)
    # The session refuses the float64 feed as TF Serving's C++ session does ("... float but double is provided").
    assert "warm-up record 0" in info.value.message and "double" in info.value.message


def _float64_signature():
    from tensorflow.core.protobuf import meta_graph_pb2

    signature = meta_graph_pb2.SignatureDef()
    signature.inputs["x"].dtype = tf.float64.as_datatype_enum
    signature.inputs["k"].dtype = tf.int32.as_datatype_enum
    return signature


def test_serve_cli_usage_error_exit_2(tmp_path):
    result = subprocess.run([sys.executable, "-m", "exportkit", "serve", str(tmp_path / "nothing"), "--port", "0"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""


# ------------------------------------------------------------------------------------------------ warm-up files
def test_warmup_records_round_trip_and_limits(tmp_path, model_base):
    records = read_warmup_records(str(model_base / "3"))
    assert len(records) == 2 and records[1].model_spec.name == MODEL
    assert set(records[1].inputs) == {"x", "k"}
    assert to_ndarray(records[1].inputs["x"]).shape == (4, 3)

    target = str(model_base / "2" / "assets.extra" / "scratch")
    with pytest.raises(ValueError, match="1..1000"):
        write_warmup_records(str(tmp_path / "w"), MODEL, "serving_default", [])
    with pytest.raises(ValueError, match="1..1000"):
        write_warmup_records(str(tmp_path / "w"), MODEL, "serving_default", [_inputs(1)] * 1001)
    with pytest.raises(ValueError, match="keys"):  # signature read from the SavedModel next to the file
        write_warmup_records(target, MODEL, "serving_default", [{"x": _inputs(1)["x"]}])
    with pytest.raises(ValueError, match="dtype"):
        write_warmup_records(target, MODEL, "serving_default", [{"x": _inputs(1)["x"], "k": np.zeros(1, np.int64)}])
    assert not os.path.exists(target)


def test_tensor_proto_helpers_round_trip():
    for value in (np.arange(6, dtype=np.float32).reshape(2, 3), np.array([1, 2], np.int64), np.array([True, False]),
                  np.array([b"a", b"bc"], dtype=object), np.array(["x", "yz"]), np.zeros((0, 3), np.float16)):
        back = to_ndarray(to_tensor_proto(value))
        expected = value.astype(object) if value.dtype.kind == "U" else value
        if value.dtype.kind == "U":
            expected = np.array([s.encode() for s in value], dtype=object)
        assert back.shape == value.shape
        assert back.tolist() == expected.tolist()
    # The fast path must agree with TensorFlow's own conversion.
    value = np.random.default_rng(0).normal(size=(3, 2)).astype(np.float32)
    assert to_tensor_proto(value) == tf.make_tensor_proto(value)


def test_sigint_stops_serve_cleanly(model_base):
    """Same as SIGTERM (checked at session end), but for Ctrl-C; the server is stopped mid-load here."""
    proc = subprocess.Popen([sys.executable, "-m", "exportkit", "serve", str(model_base), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        line = b""
        while b"loading model " not in line:  # logged as the load starts, before any port opens
            line = proc.stderr.readline()
            assert line, "exportkit serve exited before listening"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
