"""inspect / verify / compat --run give TF Serving's verdict on SavedModels written the way others write them.

The expected verdict of each model (builders.Expected) is read from TF Serving's sources; see builders.py.
"""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tests.conftest import invoke
from tests.corpus import builders as b

cramjam = pytest.importorskip("cramjam", reason="writes snappy-compressed checkpoint indexes (pip install cramjam)")


# --------------------------------------------------------------------------------------- checkpoint index
def test_snappy_round_trip_and_corruption():
    from exportkit.savedmodel.checkpoint import _Corrupt, snappy_uncompress

    rng = np.random.default_rng(0)
    for raw in (b"", b"a", b"abc" * 1000, rng.integers(0, 4, 5000, dtype=np.uint8).tobytes(), os.urandom(70000)):
        assert snappy_uncompress(bytes(cramjam.snappy.compress_raw(raw))) == raw
    good = bytes(cramjam.snappy.compress_raw(b"xyz" * 100))
    for bad in (good[:-1], good[:1] + b"\xfe" + good[2:], b"\xff\xff\xff\xff\x0f" + good[1:], b"\x05\x09\x00"):
        with pytest.raises(_Corrupt):
            snappy_uncompress(bad)


@pytest.mark.slow
def test_snappy_index_reads_as_tensorflow_reads_it(corpus):
    """half_plus_two with its index rewritten in snappy blocks: exportkit's reader and tf.train.load_checkpoint
    list the same tensors, and the data the index points at is TF's values."""
    from exportkit.savedmodel.checkpoint import data_shard_path, read_checkpoint
    from exportkit.tfenv import import_tf

    model = corpus(b.snappy_checkpoint)
    index = model.version_dir / "variables" / "variables.index"
    ours = read_checkpoint(index)
    reader = import_tf().train.load_checkpoint(str(index)[:-len(".index")])
    assert {t.name: list(t.shape) for t in ours.variables} == reader.get_variable_to_shape_map()
    shard = data_shard_path(index, 0, ours.num_shards).read_bytes()
    for t in ours.variables:
        assert np.frombuffer(shard[t.offset:t.offset + t.size], "<f4").item() == reader.get_tensor(t.name)
    plain = read_checkpoint(corpus(b.half_plus_two).version_dir / "variables" / "variables.index")
    assert [(t.name, t.size, t.crc32c) for t in plain.variables] == [(t.name, t.size, t.crc32c) for t in ours.variables]


def test_a_64_mib_block_is_judged_in_bounded_time(tmp_path):
    """One 64 MiB data block with a bad checksum: unreadable, said within seconds (issue 27: it took 15.6 s)."""
    from exportkit.inputs.tfrecord import crc32c
    from exportkit.savedmodel.checkpoint import read_checkpoint
    from exportkit.errors import UsageError

    size = 64 << 20
    block_handle = b._varint(0) + b._varint(size)
    index_block = b._varint(0) + b._varint(1) + b._varint(len(block_handle)) + b"\xff" + block_handle
    index_block += struct.pack("<II", 0, 1)
    body = bytes(size) + b"\x00" + struct.pack("<I", 12345)
    index_offset = len(body)
    body += index_block + b"\x00" + struct.pack("<I", b._mask(crc32c(index_block + b"\x00")))
    footer = (b._varint(0) + b._varint(0) + b._varint(index_offset) + b._varint(len(index_block))).ljust(40, b"\0")
    path = tmp_path / "variables.index"
    path.write_bytes(body + footer + struct.pack("<Q", 0xDB4775248B80FB57))
    began = time.perf_counter()
    with pytest.raises(UsageError, match="data block at offset 0: checksum mismatch"):
        read_checkpoint(path)
    assert time.perf_counter() - began < 3.0


# ------------------------------------------------------------------------------------------------ inspect
REFUSED = (b.session_bundle, b.tflite_version, b.missing_tensor)


@pytest.mark.slow
@pytest.mark.parametrize("builder", b.BUILDERS, ids=lambda f: f.__name__)
def test_inspect_gives_the_servers_verdict(corpus, builder):
    model = corpus(builder)
    got = invoke("inspect", model.base, "--json")
    if not model.expected.serves:
        said = got.stderr + got.stdout
        assert model.expected.refusal.lower() in said.lower(), said
        if got.returncode == 0:
            assert any(f["severity"] == "error" for f in json.loads(got.stdout)["findings"])
        else:
            assert got.returncode == 2 and "fix:" in got.stderr and "Traceback" not in got.stderr
        return
    assert got.returncode == 0, got.stderr
    info = json.loads(got.stdout)
    assert not [f for f in info["findings"] if f["severity"] == "error"], info["findings"]


@pytest.mark.slow
def test_refused_formats_say_what_they_are(tmp_path):
    """A SessionBundle and a TFLite version dir: exit 2 with TF Serving's reason, not "the export did not finish"."""
    for builder, words in ((b.session_bundle, "Session Bundle is deprecated and removed"),
                           (b.tflite_version, "--prefer_tflite_model")):
        model = builder(tmp_path)
        for path in (model.base, model.version_dir):
            got = invoke("inspect", path)
            assert got.returncode == 2 and words in got.stderr and "did not finish" not in got.stderr, got.stderr


# ------------------------------------------------------------------------------------------------- verify
def _verify(model, *args):
    got = invoke("verify", model.base, "--json", "-", *args)
    return got, json.loads(got.stdout) if got.stdout.strip().startswith("{") else None


def _rows(report, signature):
    return {r["name"]: r for r in report["runtimes"] if r.get("signature") == signature}


@pytest.mark.slow
def test_compat_and_inspect_predict_a_missing_signature_tensor_fails_everywhere(corpus):
    """TF's loader refuses the model on every version ("refers to a Tensor which does not exist"): compat's
    static prediction says so, naming the tensor, and inspect forecasts no version that serves it."""
    model = corpus(b.missing_tensor)
    got = invoke("compat", model.base, "--json", "-")
    matrix = json.loads(got.stdout)
    assert got.returncode == 1, got.stdout[-2000:]
    rows = matrix["versions"]
    assert rows and all(r["predicted"] == "fails" for r in rows), rows
    assert all(any(f["code"] == "missing-tensor" and "renamed_y:0" in f["message"] for f in r["findings"])
               for r in rows)
    info = json.loads(invoke("inspect", model.base, "--json").stdout)
    assert info["oldest_tf_serving"] is None
    assert [f["code"] for f in info["findings"]].count("missing-tensor") == 1


@pytest.mark.slow
def test_half_plus_two_passes_with_the_api_tf_serving_uses(corpus):
    """Classify/Regress on Example signatures; Predict on the classify/regress signatures over a float input,
    which TF Serving's Classify/Regress refuse (the report names the API)."""
    model = corpus(b.half_plus_two)
    got, report = _verify(model, "--runtimes", "session,serving,rest")  # (the server is the subject: no TF2 load)
    assert got.returncode == 0, got.stdout[-3000:]
    for signature, api in model.expected.apis.items():
        rows = _rows(report, signature)
        assert rows["serving"]["server"]["api"] == api, (signature, rows["serving"])
        assert rows["serving"]["status"] == "ok" and rows["serving"]["outputs"], rows["serving"]


@pytest.mark.slow
def test_counter_state_zero_inputs_and_a_tf2_only_failure(corpus):
    """TF Serving's counter model: it serves (exit 0). The TF2 loader's ref-variable failure is a warning, the
    signatures are `stateful` (not "remove randomness"), REST skips the zero-input ones saying why, and the
    unknown-rank `delta` is fed the counter's shape."""
    model = corpus(b.counter)
    got, report = _verify(model)
    assert got.returncode == 0, got.stdout[-3000:]
    codes = {f["code"]: f for f in report["findings"]}
    assert "nondeterministic" not in codes
    assert codes["tf2-load-failed"]["severity"] == "warning" and "TF1 loader" in codes["tf2-load-failed"]["message"]
    stateful = {f["message"].split("'")[1]: f["message"] for f in report["findings"] if f["code"] == "stateful"}
    assert set(stateful) == {"get_counter", "incr_counter", "incr_counter_by"}, stateful  # reset: always 0
    assert all("state, not randomness" in m for m in stateful.values())
    assert "reads variable counter, which signature" in stateful["get_counter"]
    for signature in ("get_counter", "incr_counter", "reset_counter"):
        rest = _rows(report, signature)["rest"]
        assert rest["status"] == "skipped" and "without inputs" in rest["error"]
        assert _rows(report, signature)["serving"]["status"] == "ok"
    assert _rows(report, "incr_counter_by")["rest"]["status"] == "ok"


@pytest.mark.slow
def test_a_regress_output_of_unknown_rank_passes(corpus):
    """[batch, 1] at run time, rank unknown in the signature: Regress's flat answer is shaped as Predict's."""
    got, report = _verify(corpus(b.regress_unknown_rank), "--runtimes", "session,serving,rest")
    assert got.returncode == 0, got.stdout[-3000:]
    assert all(r["status"] == "ok" and r["passed"] for r in report["runtimes"]), report["runtimes"]


@pytest.mark.slow
def test_a_tensorinfo_without_shape_is_fed_what_the_graph_takes(corpus):
    """No shape in the TensorInfo: inputs are generated for the placeholder's [-1, 2] and the TF1 loader runs them
    (no Python feed-shape check); TF2's loader reads the missing shape as a scalar and fails: a warning only.
    (The embedded server's Predict still checks shapes against the SignatureDef: serving-core's part of issue 21.)"""
    got, report = _verify(corpus(b.no_shape), "--runtimes", "saved_model,session")
    assert got.returncode == 0, got.stdout[-3000:]
    rows = _rows(report, "serving_default")
    assert rows["session"]["status"] == "ok" and rows["saved_model"]["status"] == "skipped"
    assert any(f["code"] == "tf2-load-failed" and f["severity"] == "warning" for f in report["findings"])


@pytest.mark.slow
def test_a_py_func_is_the_models_fault_not_the_inputs(corpus):
    """Every reloaded runtime fails the PyFunc whatever the inputs: the report says so (not "the inputs were wrong")
    and names the cause past TF2's Python stack."""
    got = invoke("verify", corpus(b.py_func).base, "--runtimes", "saved_model,session", "--serving", "none")
    assert got.returncode == 1 and "Traceback" not in got.stderr
    assert "inputs were wrong" not in got.stdout and "Could not find callback with key=pyfunc" in got.stdout, got.stdout
    assert got.stdout.count("fix: replace the Python function with TensorFlow ops") == 2, got.stdout


@pytest.mark.slow
@pytest.mark.serving
def test_a_request_over_max_batch_size_names_the_batching_parameters(corpus, tmp_path):
    """TF Serving's batching queue refuses a request over max_batch_size (INVALID_ARGUMENT, "Task size 8 is larger
    than maximum input batch size 4"): a deployment limit, not generated inputs the model rejects."""
    params = tmp_path / "batching.txt"
    params.write_text("max_batch_size { value: 4 } batch_timeout_micros { value: 0 }\n")
    got = invoke("verify", corpus(b.keras_export).base, "--runtimes", "session,serving", "--serving-protocol", "grpc",
                 "--batching-parameters", params, "--samples", "8")
    assert got.returncode == 1 and "Task size 8 is larger than maximum input batch size 4" in got.stdout, got.stdout
    assert "inputs were wrong" not in got.stdout and "fix: send at most 4 examples per request" in got.stdout


@pytest.mark.slow
def test_an_output_regress_refuses_is_the_models_fault(corpus):
    got = invoke("verify", corpus(b.regress_wide_output).base, "--runtimes", "session,serving")
    assert got.returncode == 1
    assert "Regress refuses the model's output" in got.stdout and "inputs were wrong" not in got.stdout, got.stdout


@pytest.mark.slow
def test_compat_run_keeps_scalar_outputs(corpus):
    """get_counter answers a scalar: compat --run compares shape () with shape (), not (1,)."""
    got = invoke("compat", corpus(b.counter).base, "--tf", "2.21", "--run", "--signature-name", "get_counter")
    assert got.returncode == 0 and "shape (1,)" not in got.stdout, got.stdout


# --------------------------------------------------------------------------------------- the worker's death
WORKER_KILLED = textwrap.dedent('''
    import os, signal, sys
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # as the CLI does for `| head`
    from exportkit.errors import InfraError
    from exportkit.runtimes.session import TfWorker
    worker = TfWorker(sys.argv[1])
    worker.start()
    os.kill(worker.process.pid, signal.SIGKILL)
    worker.process.wait()
    try:
        worker.request(op="load", loader="session", path=worker.path, signature="serving_default", device="cpu")
    except InfraError as err:
        print(err.message)
        print("fix:", err.remedy)
    finally:
        worker.close()
''')


@pytest.mark.slow
def test_a_killed_worker_is_an_infra_error_naming_it(corpus):
    """The worker killed under a parent whose SIGPIPE is the default: the parent says who died and how, and lives."""
    proc = subprocess.run([sys.executable, "-c", WORKER_KILLED, str(corpus(b.half_plus_two).version_dir)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert "TensorFlow worker" in proc.stdout and "killed by SIGKILL" in proc.stdout and "fix:" in proc.stdout


@pytest.mark.slow
def test_a_graph_that_kills_the_worker_is_exit_3(tmp_path):
    """A serving graph that aborts the process running it: verify exits 3 naming the worker, not -13 silently."""
    from exportkit.tfenv import import_tf

    tf = import_tf()
    v1 = tf.compat.v1
    with tf.Graph().as_default(), v1.Session() as sess:
        x = v1.placeholder(tf.float32, [None, 1], name="x")
        with tf.control_dependencies([tf.raw_ops.Abort(error_msg="hostile graph")]):
            y = tf.identity(x, name="y")
        b._save(sess, tmp_path / "m" / "1", {"serving_default": b._signature({"x": x}, {"y": y}, b.PREDICT_METHOD)})
    proc = subprocess.run([sys.executable, "-m", "exportkit", "verify", str(tmp_path / "m"), "--runtimes", "session"],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert proc.returncode == 3, (proc.returncode, proc.stdout[-1500:], proc.stderr[-1500:])
    assert "TensorFlow worker" in proc.stdout + proc.stderr and "SIGABRT" in proc.stdout + proc.stderr


# ------------------------------------------------------------------------------------ older TensorFlow writers
@pytest.mark.slow
@pytest.mark.compat
def test_models_tf_2_12_wrote_get_tf_servings_verdict(tmp_path):
    from exportkit.tfversions.envs import info, python_for

    if info("2.12").state == "absent":
        pytest.skip("the managed TF 2.12 environment is not installed (`exportkit runtimes install 2.12`)")
    for model in b.write_in_env(python_for("2.12", install_missing=False), tmp_path):
        compat = invoke("compat", model.base, "--tf", "2.12", "--run")  # TF 2.12's loader against this one's
        assert compat.returncode == 0, (model.name, compat.stdout)
        if model.name.endswith("tf1_graph"):  # every runtime of this TensorFlow on what TF 2.12 wrote
            got, _ = _verify(model)
            assert got.returncode == 0, (model.name, got.stdout[-2000:])
