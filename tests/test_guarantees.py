"""The README's three promises, each checked from the outside, so that breaking one fails a test:

1. the serving-equivalent processes (session worker, embedded server) see no user code;
2. export's self-check and verify's `session` runtime load the SavedModel the way TF Serving does (TF1 loader,
   fresh process), not with TF2 loading in the exporting process;
3. an unexpected failure exits 3 with one "unexpected" line, and `--debug` shows the traceback.
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
    """Export (self-check worker) and verify (session worker, embedded server, keras runtime) with the user's
    project as working directory, on PYTHONPATH and on --python-path: only the CLI process may import from it."""
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
    assert any("session_worker" in " ".join(c["cmdline"]) for c in export_children), export_children
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


def test_export_self_check_runs_the_model_where_user_code_is_absent(tmp_path):
    """A SavedModel that TF2 loading runs in the exporting process (its Python function is registered there) but
    the TF1 loader in a fresh process cannot: the export fails and writes nothing."""
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
    assert "TF1 loader" in proc.stderr and "pyfunc" in proc.stderr.lower(), proc.stderr
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


def test_export_self_check_rejects_what_only_tf2_loading_accepts(keras3_saved_with_tf_saved_model):
    """The self-check function itself, given that SavedModel and outputs TF2 loading would reproduce exactly."""
    from exportkit.errors import CheckFailed
    from exportkit.export.pipeline import _self_check
    from exportkit.runtimes.session import SessionRuntime

    path, inputs, expected = keras3_saved_with_tf_saved_model
    # _self_check reads only these fields of the golden record and the manifest.
    record = SimpleNamespace(plan=SimpleNamespace(name="serving_default"), inputs=inputs, outputs=expected)
    tolerances = {key: {"atol": 1e-5, "rtol": 1e-5} for key in expected[0]}
    manifest = {"signatures": {"serving_default": {"tolerances": tolerances}}}
    session = SessionRuntime(str(path))
    try:
        with pytest.raises(CheckFailed, match="TF1 loader.*find variable"):
            _self_check(session, SimpleNamespace(signatures=[record]), manifest)
    finally:
        session.close()


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
