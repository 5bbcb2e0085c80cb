"""`exportkit inspect`, the fast SavedModel reader and the static lint, against SavedModels written here by TF."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import run_cli

UNKNOWN_OP = "NoSuchOpXyz"


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("exportkit-cache")


@pytest.fixture(scope="session")
def env(cache_dir) -> dict:
    """Added to the environment of the CLI runs: a cache directory of the session's own."""
    return {"EXPORTKIT_CACHE_DIR": str(cache_dir), "PYTHONWARNINGS": "ignore"}


@pytest.fixture(scope="session")
def tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from exportkit.tfenv import import_tf

    return import_tf()


@pytest.fixture(scope="session")
def models(tf, tmp_path_factory) -> dict[str, Path]:
    """Every SavedModel the tests read, written once per session."""
    root = tmp_path_factory.mktemp("models")
    vocab = root / "vocab.txt"
    vocab.write_text("a\nb\nc\n")

    class Multi(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(tf.ones([3, 2]))
            self.vocab = tf.saved_model.Asset(str(vocab))

        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
        def predict(self, x):
            return {"y": tf.matmul(x, self.w)}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
        def parse(self, text):
            return {"length": tf.strings.length(text)}

    multi = Multi()
    out = {"multi": root / "multi" / "1"}
    tf.saved_model.save(multi, str(out["multi"]), signatures={"serving_default": multi.predict, "parse": multi.parse})

    class PyFn(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
        def serve(self, x):
            y = tf.py_function(lambda t: t * 2.0, [x], tf.float32)
            return {"y": tf.reshape(y, [-1, 2])}

    pyfn = PyFn()
    out["pyfunc"] = root / "pyfunc" / "1"
    tf.saved_model.save(pyfn, str(out["pyfunc"]), signatures={"serving_default": pyfn.serve})

    class Smelly(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([4, 3], tf.float64), tf.TensorSpec(None, tf.float32)])
        def serve(self, *args):
            return {"out": tf.cast(args[0], tf.float16), "score": tf.reduce_sum(args[1])}

    smelly = Smelly()
    out["smelly"] = root / "smelly" / "1"
    tf.saved_model.save(smelly, str(out["smelly"]), signatures={"serving_default": smelly.serve})

    class ReadsFiles(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([], tf.string, name="path")])
        def read(self, path):
            return {"content": tf.io.read_file(path)}

    reader = ReadsFiles()
    out["readfile"] = root / "readfile" / "1"
    tf.saved_model.save(reader, str(out["readfile"]), signatures={"serving_default": reader.read})

    # A copy of `multi` whose MatMul (inside a function body) is renamed to an op no TensorFlow registers.
    from tensorflow.core.protobuf import saved_model_pb2

    out["unknown_op"] = root / "unknown_op" / "1"
    shutil.copytree(out["multi"], out["unknown_op"])
    pb_path = out["unknown_op"] / "saved_model.pb"
    sm = saved_model_pb2.SavedModel.FromString(pb_path.read_bytes())
    renamed = [node for f in sm.meta_graphs[0].graph_def.library.function for node in f.node_def if node.op == "MatMul"]
    assert renamed, "expected a MatMul in a function body"
    for node in renamed:
        node.op = UNKNOWN_OP
    pb_path.write_bytes(sm.SerializeToString())

    # A model base directory: the highest integer-named version with saved_model.pb wins (10 > 9 > 2).
    base = root / "base"
    for version in ("2", "9", "10"):
        shutil.copytree(out["multi"], base / version)
    (base / "11").mkdir()  # half-written: no saved_model.pb
    shutil.copytree(out["multi"], base / "12.tmp")  # not an integer name
    out["base"] = base

    # An exportkit manifest in assets.extra/.
    out["manifest"] = root / "manifest" / "1"
    shutil.copytree(out["multi"], out["manifest"])
    (out["manifest"] / "assets.extra" / "exportkit").mkdir(parents=True)
    (out["manifest"] / "assets.extra" / "exportkit" / "manifest.json").write_text(
        json.dumps({"exportkit_version": "0.1.0", "source": {"path": "ckpt/", "format": "checkpoint"}}))
    return out


@pytest.fixture(scope="session")
def multi_json(models, env) -> dict:
    """`inspect --json` of the multi-signature model; the first CLI run fills the op-registry cache."""
    proc = run_cli("inspect", models["multi"], "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def codes(findings) -> list[str]:
    return [f["code"] if isinstance(f, dict) else f.code for f in findings]


# ---------------------------------------------------------------------------------------------------- JSON
def test_json_schema(multi_json, models, tf):
    doc = multi_json
    assert set(doc) == {"schema_version", "path", "tags", "tensorflow_version", "signatures", "ops", "assets",
                        "variables_bytes", "variables", "manifest", "findings", "oldest_tf_serving",
                        "oldest_tf_serving_with_xla", "files_read", "memory_estimate"}
    assert doc["oldest_tf_serving_with_xla"] is None  # nothing here needs XLA
    assert doc["schema_version"] == 1
    assert doc["path"] == os.path.abspath(models["multi"])
    assert doc["tags"] == ["serve"]
    assert doc["tensorflow_version"] == tf.__version__
    assert list(doc["signatures"]) == ["parse", "serving_default"]  # sorted; __saved_model_init_op hidden
    for sig in doc["signatures"].values():
        assert set(sig) == {"method", "inputs", "outputs"}
        assert sig["method"] == "tensorflow/serving/predict"
        for tensor in [*sig["inputs"].values(), *sig["outputs"].values()]:
            assert set(tensor) == {"dtype", "shape", "name"}
            assert isinstance(tensor["dtype"], str) and isinstance(tensor["name"], str)
            assert isinstance(tensor["shape"], list) and all(isinstance(d, int) for d in tensor["shape"])
    serving = doc["signatures"]["serving_default"]
    assert serving["inputs"] == {"x": {"dtype": "float32", "shape": [-1, 3], "name": "serving_default_x:0"}}
    assert serving["outputs"]["y"]["dtype"] == "float32" and serving["outputs"]["y"]["shape"] == [-1, 2]
    parse = doc["signatures"]["parse"]
    assert parse["inputs"]["text"]["dtype"] == "string" and parse["inputs"]["text"]["shape"] == [-1]
    assert parse["outputs"]["length"]["dtype"] == "int32"
    assert isinstance(doc["ops"], dict) and all(isinstance(n, int) and n > 0 for n in doc["ops"].values())
    assert doc["ops"]["MatMul"] == 1 and "StringLength" in doc["ops"]  # StringLength lives in a function body
    assert doc["assets"] == ["assets/vocab.txt"]
    assert isinstance(doc["variables_bytes"], int) and doc["variables_bytes"] > 0
    assert doc["variables"] == {"tensors": 1, "bytes": 24, "shards": 1, "duplicate_bytes": 0,  # w: 3x2 float32
                                "largest": [{"name": "w/.ATTRIBUTES/VARIABLE_VALUE", "dtype": "float32",
                                             "shape": [3, 2], "bytes": 24}]}
    assert doc["manifest"] is None
    assert isinstance(doc["findings"], list)
    for f in doc["findings"]:
        assert set(f) == {"severity", "code", "message"} and f["severity"] in ("error", "warning", "info")
    assert "error" not in [f["severity"] for f in doc["findings"]]


def test_op_registry_cache_filled_once(multi_json, cache_dir, models, env):
    from exportkit.tfenv import tensorflow_version

    cached = cache_dir / f"ops-{tensorflow_version()}.json"
    data = json.loads(cached.read_text())
    ops = set(data["ops"])
    assert {"MatMul", "StatefulPartitionedCall", "PartitionedCall", "EagerPyFunc", "ReadFile", "VarHandleOp"} <= ops
    assert len(ops) > 1000
    assert [p.name for p in cache_dir.iterdir()] == [cached.name]  # no temp files left behind
    before = cached.stat().st_mtime_ns
    assert run_cli("inspect", models["multi"], "--json", env=env).returncode == 0
    assert cached.stat().st_mtime_ns == before


@pytest.mark.slow
def test_corrupt_op_cache_is_rebuilt(models, env, tmp_path):
    from exportkit.tfenv import tensorflow_version

    cached = tmp_path / f"ops-{tensorflow_version()}.json"
    cached.write_text("{not json")
    proc = run_cli("inspect", models["unknown_op"], "--json", env={**env, "EXPORTKIT_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert "unknown-op" in codes(json.loads(proc.stdout)["findings"])
    assert "MatMul" in json.loads(cached.read_text())["ops"]


def test_manifest_and_assets_extra(models, env, multi_json):
    proc = run_cli("inspect", models["manifest"], "--json", env=env)
    doc = json.loads(proc.stdout)
    assert doc["manifest"] == {"exportkit_version": "0.1.0", "source": {"path": "ckpt/", "format": "checkpoint"}}
    assert doc["assets"] == ["assets.extra/exportkit/manifest.json", "assets/vocab.txt"]


# --------------------------------------------------------------------------------------------------- human
def test_human_output(models, env, multi_json):
    proc = run_cli("inspect", models["multi"], env=env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.index("signature_def['parse']") < out.index("signature_def['serving_default']")
    assert "serving_default_x:0" in out and "(-1, 3)" in out and "float32" in out
    assert "method name: tensorflow/serving/predict" in out
    assert "assets/vocab.txt" in out and "MatMul" in out and "manifest: none" in out
    proc = run_cli("inspect", models["manifest"], env=env)
    assert "exportkit_version" in proc.stdout and "0.1.0" in proc.stdout


# ------------------------------------------------------------------------------------------------ findings
def test_py_func_is_an_error(models, env, multi_json):
    proc = run_cli("inspect", models["pyfunc"], "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    py = [f for f in doc["findings"] if f["code"] == "py-func"]
    assert py and py[0]["severity"] == "error" and "EagerPyFunc" in py[0]["message"] and "fix: " in py[0]["message"]
    assert doc["oldest_tf_serving"] is None  # the registries (TF's wheel) list a PyFunc kernel; the server has none
    from exportkit.tfversions.analysis import analyze
    from exportkit.savedmodel.reader import read_saved_model_proto, select_meta_graph

    (result,) = analyze(select_meta_graph(read_saved_model_proto(models["pyfunc"])), ["2.21"])
    assert result.predicted == "fails" and "py-func" in [f.code for f in result.findings]
    assert run_cli("inspect", models["pyfunc"], "--strict", env=env).returncode == 1


def test_a_py_func_no_signature_runs_is_no_error(tmp_path):
    """A tf.compat.v1.py_func beside the served path (a debugging op): the session never runs it, TF Serving serves
    the model (PyFunc's op is registered in TF's core, only its kernel is Python's)."""
    import tensorflow as tf

    from exportkit.inspection.command import read_info

    v1 = tf.compat.v1
    with tf.Graph().as_default(), v1.Session() as sess:
        x = v1.placeholder(tf.float32, [None, 2], name="x")
        v1.py_func(lambda a: a, [x], tf.float32, name="debug_dump")
        builder = v1.saved_model.Builder(str(tmp_path / "1"))
        builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={
            "serving_default": v1.saved_model.predict_signature_def({"x": x}, {"y": x * 3.0})})
        builder.save()
    info = read_info(tmp_path / "1", check_registry=False)
    assert not [f for f in info.findings if f.code == "py-func"] and info.oldest_tf_serving is not None


def test_unknown_op_is_an_error(models, env, multi_json):
    proc = run_cli("inspect", models["unknown_op"], "--json", "--strict", env=env)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)  # still exactly one JSON document
    unknown = [f for f in doc["findings"] if f["code"] == "unknown-op"]
    assert len(unknown) == 1 and unknown[0]["severity"] == "error"
    assert UNKNOWN_OP in unknown[0]["message"] and "__inference_predict" in unknown[0]["message"]
    # Function calls (StatefulPartitionedCall) and other registered ops are not reported.
    assert run_cli("inspect", models["multi"], "--strict", env=env).returncode == 0


def test_warnings(models, env, multi_json):
    doc = json.loads(run_cli("inspect", models["smelly"], "--json", env=env).stdout)
    by_code = {}
    for f in doc["findings"]:
        by_code.setdefault(f["code"], []).append(f)
    assert {"fixed-batch", "float64-input", "half-output", "auto-key", "unknown-rank"} <= set(by_code)
    assert all(f["severity"] == "warning" for f in doc["findings"])
    assert any("args_0" in f["message"] for f in by_code["auto-key"])
    assert doc["signatures"]["serving_default"]["inputs"]["args_1"]["shape"] is None
    assert doc["signatures"]["serving_default"]["inputs"]["args_0"]["dtype"] == "float64"
    assert doc["signatures"]["serving_default"]["outputs"]["out"]["dtype"] == "float16"


def test_lint_missing_signature_and_denylist(models):
    from exportkit.savedmodel.lint import lint_saved_model
    from exportkit.savedmodel.reader import read_saved_model_proto

    proto = read_saved_model_proto(models["multi"])
    missing = [f for f in lint_saved_model(proto, "predict", check_registry=False) if f.code == "missing-signature"]
    assert len(missing) == 1 and missing[0].severity == "error"
    assert "parse" in missing[0].message and "serving_default" in missing[0].message
    assert "missing-signature" not in codes(lint_saved_model(proto, "parse", check_registry=False))
    # tf.io.read_file reached from a signature: verify refuses to execute it (an error naming the op and the flag).
    found = [f for f in lint_saved_model(read_saved_model_proto(models["readfile"]), check_registry=False)
             if f.code in ("denylisted-op", "io-op")]
    assert [f.code for f in found] == ["io-op"] and found[0].severity == "error"
    assert "ReadFile" in found[0].message and "--allow-io-ops" in found[0].message


# ------------------------------------------------------------------------------------------------ resolving
def test_base_dir_resolves_to_highest_version(models, env, multi_json):
    from exportkit.savedmodel.versions import resolve_savedmodel_dir

    assert resolve_savedmodel_dir(models["base"]) == models["base"] / "10"
    proc = run_cli("inspect", models["base"], "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["path"] == os.path.abspath(models["base"] / "10")


@pytest.mark.parametrize("kind", ["missing", "empty_dir", "text_file", "only_bad_versions"])
def test_unreadable_input_exits_2(kind, tmp_path, env):
    target = {"missing": tmp_path / "nope", "empty_dir": tmp_path / "empty", "text_file": tmp_path / "notes.txt",
              "only_bad_versions": tmp_path / "model"}[kind]
    if kind == "empty_dir":
        target.mkdir()
    elif kind == "text_file":
        target.write_text("hello")
    elif kind == "only_bad_versions":
        (target / "1").mkdir(parents=True)
    proc = run_cli("inspect", target, "--json", env=env)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len([ln for ln in lines if ln.startswith("error:")]) == 1 and str(target.name) in lines[0]
    assert any(ln.strip().startswith("fix:") for ln in lines)


def test_damaged_saved_model_pb_exits_2(tmp_path, env):
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "saved_model.pb").write_bytes(b"\xff\xfe not a protobuf \x00" * 10)
    proc = run_cli("inspect", tmp_path, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "cannot parse" in proc.stderr


# ------------------------------------------------------------------------------------------- no TF import
@pytest.mark.slow
def test_reading_does_not_import_tensorflow_and_tf_still_works_after(models, env, multi_json):
    script = textwrap.dedent(f"""
        import sys
        from exportkit.inspection.command import read_info
        from exportkit.savedmodel.reader import read_saved_model_proto
        info = read_info({str(models["multi"])!r})
        assert info.signatures["serving_default"]["inputs"]["x"]["shape"] == [-1, 3]
        leaked = sorted(m for m in sys.modules if m == "tensorflow" or m.startswith("tensorflow.python"))
        assert not leaked, leaked
        assert "keras" not in sys.modules
        proto = read_saved_model_proto({str(models["multi"])!r})
        # A real TensorFlow import afterwards works and shares the message classes.
        import tensorflow as tf
        assert int(tf.constant(1)) == 1
        from tensorflow.core.protobuf import saved_model_pb2
        assert type(proto) is saved_model_pb2.SavedModel
        loaded = tf.saved_model.load({str(models["multi"])!r})
        y = loaded.signatures["serving_default"](x=tf.ones([1, 3]))["y"]
        assert y.numpy().tolist() == [[3.0, 3.0]]
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-2000:]


def test_cli_inspect_path_never_imports_tensorflow(models, env, multi_json):
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "exportkit", "inspect", str(models["multi"])],
                          capture_output=True, text=True, env={**os.environ, **env}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = [ln.rsplit("|", 1)[-1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")]
    assert "tensorflow.core.protobuf.meta_graph_pb2" in imported  # the fast path ran
    assert not [m for m in imported if m == "tensorflow" or m.startswith(("tensorflow.python", "keras"))]
