"""The three promises of docs/export.md and docs/verify.md, each checked from the outside, so that breaking one
fails a test:

1. the serving-equivalent processes (session worker, embedded server) see no user code;
2. export's self-check and verify's `session` runtime load the SavedModel the way TF Serving does (TF1 loader),
   not with TF2 loading. verify's runs in a fresh process. export's runs in the exporting process, where user code
   is imported, so what a fresh process would have caught is refused statically first: a py_function reachable
   from a signature, an op that stock TensorFlow of this version does not register (exportkit/export/selfcheck.py);
   without a shipped op registry for the installed TensorFlow it falls back to the fresh process;
3. an unexpected failure exits 3 with one "unexpected" line, and `--debug` shows the traceback.

Each test's docstring says which mutation of the code it catches.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap
import time
from pathlib import Path
import shutil
from types import SimpleNamespace

import numpy as np
import psutil
import pytest

from conftest import invoke, tree_snapshot

pytestmark = pytest.mark.slow

RECORDER = """\
import json, os, sys
with open({log!r}, "a") as fh:
    fh.write(json.dumps({{"pid": os.getpid(), "module": __name__, "argv": sys.argv}}) + "\\n")
"""


def _user_project(folder: Path, log: Path) -> Path:
    """A user's project: a custom-objects module and a sitecustomize.py, both recording every process that imports
    them. sitecustomize runs at start-up in any Python process whose start-up path holds the project."""
    folder.mkdir()
    record = RECORDER.format(log=str(log))
    (folder / "sitecustomize.py").write_text(record)
    (folder / "recorded_layers.py").write_text(record + textwrap.dedent("""
        import keras

        @keras.saving.register_keras_serializable(package="recorded")
        class Shift(keras.layers.Layer):
            def call(self, x):
                return x + 1.0
    """))
    return folder


def _run_watching_children(args, cwd: Path, env: dict, logs: Path) -> tuple[subprocess.CompletedProcess, int, list]:
    """Run the CLI; meanwhile note every descendant process: its pid, command line, working directory, and
    whether PYTHONPATH is in its environment (as last seen). Output goes to files: no pipe can fill up."""
    out, err = logs.with_suffix(".out"), logs.with_suffix(".err")
    argv = [sys.executable, "-m", "exportkit", *map(str, args)]
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen(argv, cwd=cwd, env={**os.environ, **env}, stdout=stdout, stderr=stderr, text=True)
    seen: dict[int, dict] = {}
    parent = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            children = parent.children(recursive=True)
        except psutil.NoSuchProcess:
            break
        for child in children:  # sampled on every round: a child not yet exec'd still shows the CLI's state
            try:
                snapshot = {"pid": child.pid, "cmdline": child.cmdline(), "cwd": child.cwd(),
                            "pythonpath": "PYTHONPATH" in child.environ()}
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue
            if snapshot["cmdline"] != argv:
                seen[child.pid] = snapshot
        time.sleep(0.1)
    proc.wait()
    completed = subprocess.CompletedProcess(proc.args, proc.returncode, out.read_text(), err.read_text())
    return completed, proc.pid, list(seen.values())


@pytest.mark.serving
def test_user_code_is_imported_only_by_the_cli_process(tmp_path):
    """Export (self-check in the CLI process) and verify (session worker, embedded server, keras runtime) with the
    user's project as working directory, on PYTHONPATH and on --python-path: only the CLI process may import from it.
    Catches: a worker or server started without -I or with the user's cwd/PYTHONPATH; export starting a worker
    again although the in-process check applies."""
    import keras

    log = tmp_path / "imports.jsonl"
    project = _user_project(tmp_path / "project", log)
    sys.path.insert(0, str(project))
    try:
        from recorded_layers import Shift
    finally:
        sys.path.remove(str(project))
    inp = keras.Input((3,), name="x")
    keras.Model(inp, keras.layers.Dense(2, name="y")(Shift()(inp))).save(project / "model.keras")
    log.unlink()  # this test process imported the module too: only what the CLI runs counts

    user = ["--custom-objects", "recorded_layers", "--python-path", project]
    # A fresh op-registry cache: verify's registry probe (a child process) runs too and is checked with the rest.
    env = {"PYTHONPATH": str(project), "EXPORTKIT_CACHE_DIR": str(tmp_path / "cache")}
    export, export_pid, export_children = _run_watching_children(
        ["export", "model.keras", "-o", tmp_path / "models", *user], project, env, tmp_path / "export")
    assert export.returncode == 0, export.stderr
    verify, verify_pid, verify_children = _run_watching_children(
        ["verify", tmp_path / "models", "--against", "model.keras", *user, "--serving", "embedded",
         "--json", tmp_path / "report.json"], project, env, tmp_path / "verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert {r["name"] for r in report["runtimes"] if r["outputs"]} >= {"keras", "session", "serving"}

    records = [json.loads(line) for line in log.read_text().splitlines()]
    by_pid = {(r["pid"], r["module"]) for r in records}
    # The trap is armed: the CLI process imported both (start-up hook and custom objects), in both commands.
    for pid in (export_pid, verify_pid):
        assert {(pid, "sitecustomize"), (pid, "recorded_layers")} <= by_pid, records
    intruders = [r for r in records if r["pid"] not in (export_pid, verify_pid)]
    assert not intruders, f"user code imported by a serving-equivalent process: {intruders}"

    # The serving-equivalent processes were seen; none runs in the user's directory or with the user's PYTHONPATH
    # (stricter than needed under `python -I`, and what keeps the guarantee if a flag is lost).
    workers = [c for c in export_children + verify_children if any("exportkit" in part for part in c["cmdline"])]
    assert not [c for c in export_children if any("exportkit" in part for part in c["cmdline"])], export_children
    # verify's one TensorFlow worker holds the session runtime and the embedded server.
    assert any("session_worker" in " ".join(c["cmdline"]) for c in verify_children), verify_children
    for child in workers:
        assert not Path(child["cwd"]).resolve().is_relative_to(project.resolve()), child
        assert not child["pythonpath"], child


# ------------------------------------------------------------------------------------------------ 2. TF1 loader
PY_FUNC_LAYER = """\
import keras, tensorflow as tf

@keras.saving.register_keras_serializable(package="pyfunc")
class NumpyDouble(keras.layers.Layer):
    \"\"\"Computes in Python: works wherever this module is imported, nowhere else (not in TF Serving).\"\"\"

    def call(self, x):
        y = tf.py_function(lambda t: t.numpy() * 2.0, [x], Tout=tf.float32)
        y.set_shape(x.shape)
        return y
"""


def test_export_self_check_refuses_python_code_tf_serving_cannot_run(tmp_path):
    """A model whose signature runs a tf.py_function: the exporting process has its Python callback registered, so
    loading and running it here (TF2 or TF1 loader) passes; TF Serving cannot run it. The export fails (exit 1) and
    writes nothing. Catches: the static py_function check dropped or not walking into the function library."""
    import keras

    (tmp_path / "pyfunc_layers.py").write_text(PY_FUNC_LAYER)
    sys.path.insert(0, str(tmp_path))
    try:
        from pyfunc_layers import NumpyDouble
    finally:
        sys.path.remove(str(tmp_path))
    inp = keras.Input((3,), name="x")
    keras.Model(inp, keras.layers.Dense(2, name="y")(NumpyDouble()(inp))).save(tmp_path / "pyfunc.keras")
    base = tmp_path / "models"
    base.mkdir()
    proc = invoke("export", tmp_path / "pyfunc.keras", "-o", base, "--custom-objects", "pyfunc_layers",
                  "--python-path", tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "EagerPyFunc" in proc.stderr and "TF Serving cannot run it" in proc.stderr, proc.stderr
    assert "fix:" in proc.stderr and "Traceback" not in proc.stderr
    assert list(base.iterdir()) == []


@pytest.fixture(scope="module")
def keras3_saved_with_tf_saved_model(tmp_path_factory):
    """`tf.saved_model.save` of a Keras 3 model: TF2 loading runs it, the TF1 loader cannot find its variables
    (DESIGN.md). Returns (version dir, inputs, the outputs eager Keras computes for them)."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(3)
    inp = keras.Input((4,), name="x")
    model = keras.Model(inp, keras.layers.Dense(2, name="y")(inp))
    path = tmp_path_factory.mktemp("tf_saved_model_save") / "plain" / "1"
    tf.saved_model.save(model, str(path))
    served = tf.saved_model.load(str(path)).signatures["serving_default"]
    [in_key], [out_key] = served.structured_input_signature[1], served.structured_outputs
    inputs = [{in_key: np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)}]
    expected = [{out_key: np.asarray(model(batch[in_key]))} for batch in inputs]
    tf2 = served(**{in_key: tf.constant(inputs[0][in_key])})[out_key].numpy()
    np.testing.assert_allclose(tf2, expected[0][out_key], atol=1e-6)  # TF2 loading runs it
    return path, inputs, expected


@pytest.mark.parametrize("where", ["in_process", "fresh_process"])
def test_export_self_check_rejects_what_only_tf2_loading_accepts(keras3_saved_with_tf_saved_model, where):
    """The self-check function itself, given that SavedModel and outputs TF2 loading would reproduce exactly, with
    either session it uses: the TF1 loader in this process (which has imported Keras and the model's code) and the
    fallback worker. Catches: the check loading with tf.saved_model.load, or swallowing load failures."""
    from exportkit.errors import CheckFailed
    from exportkit.export.pipeline import _self_check
    from exportkit.export.selfcheck import InProcessSession
    from exportkit.runtimes.session import SessionRuntime

    path, inputs, expected = keras3_saved_with_tf_saved_model
    # _self_check reads only these fields of the golden record and the manifest.
    record = SimpleNamespace(plan=SimpleNamespace(name="serving_default"), inputs=inputs, outputs=expected)
    tolerances = {key: {"atol": 1e-5, "rtol": 1e-5} for key in expected[0]}
    manifest = {"signatures": {"serving_default": {"tolerances": tolerances}}}
    session = InProcessSession(str(path)) if where == "in_process" else SessionRuntime(str(path))
    try:
        with pytest.raises(CheckFailed, match="TF1 loader.*find variable"):
            _self_check(session, SimpleNamespace(signatures=[record]), manifest)
    finally:
        session.close()


def _stock_version():
    from exportkit.export.selfcheck import stock_version
    from exportkit.tfenv import tensorflow_version

    version = stock_version(tensorflow_version())
    if version is None:
        pytest.skip(f"no op registry ships for TensorFlow {tensorflow_version()}: export checks in a fresh process")
    return version


UNREGISTERED_OP = "ExportkitUnregisteredOp"


def test_export_self_check_refuses_ops_stock_tensorflow_lacks(exported, tmp_path):
    """An op that only the exporting process knows (a custom op library loaded by the user's code) loads and runs
    there, but not in TF Serving. Built honestly: an exported SavedModel whose function library names an op type the
    registry lacks. The static check refuses it by name, the unedited copy passes, and a fresh process's TF1 loader
    (what the static check stands in for) fails on it too. Catches: the registry check dropped, or skipping the
    function library (where Keras exports put every op)."""
    from exportkit.errors import CheckFailed
    from exportkit.export.selfcheck import static_check
    from exportkit.runtimes.session import SessionRuntime
    from exportkit.savedmodel.reader import read_saved_model_proto

    version = _stock_version()
    path = tmp_path / "1"
    shutil.copytree(exported("multi_io.keras").path, path)
    static_check(path, version)  # stock ops only: passes

    proto = read_saved_model_proto(path)
    library = proto.meta_graphs[0].graph_def.library
    node = next(n for f in library.function for n in f.node_def if n.op == "MatMul")
    node.op = UNREGISTERED_OP
    (path / "saved_model.pb").write_bytes(proto.SerializeToString())
    with pytest.raises(CheckFailed, match=f"'{UNREGISTERED_OP}'.*not register|not register.*'{UNREGISTERED_OP}'") as err:
        static_check(path, version)
    assert "TF Serving" in str(err.value) and err.value.remedy

    fresh = SessionRuntime(str(path))
    try:
        with pytest.raises(CheckFailed, match=f"not registered.*{UNREGISTERED_OP}|{UNREGISTERED_OP}.*not registered"):
            fresh.load()
    finally:
        fresh.close()


def test_export_falls_back_to_a_fresh_process_without_a_registry(sample, tmp_path, monkeypatch):
    """A TensorFlow whose stock ops exportkit does not ship cannot be checked statically: the self-check must then
    run in the fresh worker, not in this process unguarded. Catches: the fallback lost."""
    from exportkit.export import selfcheck

    monkeypatch.setattr(selfcheck, "stock_version", lambda tf_version: None)
    entry = sample("multi_io.keras")
    proc = invoke("export", entry["path"], "-o", tmp_path / "models", *entry["export_args"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "self-check: passed (TF1 loader in a fresh process)" in proc.stdout


def test_verify_session_runtime_rejects_what_only_tf2_loading_accepts(keras3_saved_with_tf_saved_model):
    path, _, _ = keras3_saved_with_tf_saved_model
    proc = invoke("verify", path, "--serving", "none", "--json", "-")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    runtimes = {r["name"]: r for r in report["runtimes"]}
    assert runtimes["session"]["status"] == "error" and "find variable" in runtimes["session"]["error"]
    assert runtimes["saved_model"]["status"] == "ok"


# ------------------------------------------------------------------------------------------------ 3. exit 3
def _small_files_only():
    """In the child: files may not grow beyond 8 KB (a full disk or quota, as the export sees it)."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))


def test_unexpected_failure_exits_3_and_debug_shows_the_traceback(sample, tmp_path):
    """A real environment failure exportkit has no message for: writing saved_model.pb fails (`File too large`).
    One "unexpected" line and the fix, exit 3, the base directory as it was; --debug adds the traceback."""
    entry = sample("multi_io.keras")
    base = tmp_path / "models"
    (base / "1").mkdir(parents=True)
    before = tree_snapshot(base)
    args = [sys.executable, "-m", "exportkit", "export", entry["path"], "-o", str(base), "--no-verify"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, preexec_fn=_small_files_only)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    [error] = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert error.startswith("error: unexpected ") and "File too large" in error
    assert "fix: re-run with --debug" in proc.stderr and "Traceback" not in proc.stderr
    assert tree_snapshot(base) == before

    debug = subprocess.run([*args, "--debug"], capture_output=True, text=True, timeout=300,
                           preexec_fn=_small_files_only)
    assert debug.returncode != 0
    assert "Traceback (most recent call last)" in debug.stderr and "File too large" in debug.stderr
    assert tree_snapshot(base) == before
