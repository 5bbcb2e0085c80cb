"""exportkit verify: every runtime against the reference, failures named, reports that agree with each other."""
from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from conftest import REPO, has_gpu, invoke, run_cli

CUSTOM = dict(custom_objects=["sample_models.custom_layers"], python_path=[str(REPO)])
pytestmark = pytest.mark.slow


def _verify(capsys, path, **flags):
    """verify in this process (TensorFlow is already imported here); returns (exit code, text, JSON report)."""
    from exportkit.options.verify import VerifyOptions
    from exportkit.verify.command import verify_command

    flags.setdefault("serving", "none")
    code = verify_command(VerifyOptions(path=str(path), json_out="-", **flags))
    out = capsys.readouterr().out
    return code, json.loads(out)


@pytest.fixture(scope="session")
def models(exported):
    """A few of the session's exports: mixed precision with custom objects, dict outputs, strings, a checkpoint."""
    names = {"mixed": "mixed_functional.keras", "multi_io": "multi_io.keras", "text": "text.keras",
             "ckpt": "ranker_ckpt"}
    for sample_name in names.values():
        assert exported(sample_name).proc.returncode == 0, exported(sample_name).proc.stderr
    return {key: exported(sample_name).path for key, sample_name in names.items()}


@pytest.mark.parametrize("name", ["mixed", "multi_io", "text", "ckpt"])
def test_golden_saved_model_and_session_agree(capsys, models, name):
    code, report = _verify(capsys, models[name].parent)  # the base dir: its highest version is verified
    assert code == 0, report["verdict"]
    assert report["passed"] and report["reference"] == "golden"
    names = {r["name"] for r in report["runtimes"]}
    assert {"golden", "saved_model", "session"} <= names
    assert "golden" in report["inputs"]["source"] and "generated" in report["inputs"]["source"]
    assert 1 in report["inputs"]["batch_sizes"] and 8 in report["inputs"]["batch_sizes"]
    for runtime in report["runtimes"]:
        if not runtime["is_reference"]:
            assert runtime["outputs"], runtime["name"]


def test_against_the_training_source_in_eager_keras(capsys, models, sample):
    from exportkit.options.source import source_options
    from exportkit.options.verify import VerifyOptions
    from exportkit.verify.command import verify_command

    against = source_options(sample("mixed_functional.keras")["path"], **CUSTOM)
    code = verify_command(VerifyOptions(path=str(models["mixed"]), against=against, serving="none", json_out="-"))
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report["verdict"]
    keras_runtime = next(r for r in report["runtimes"] if r["name"] == "keras")
    assert keras_runtime["kind"] == "in-process" and keras_runtime["outputs"]


def _replace_weights(version_dir, seed: int) -> None:
    """Overwrite every float variable in variables/ with other values, keeping the checkpoint's keys."""
    import tensorflow as tf

    prefix = str(version_dir / "variables" / "variables")
    reader = tf.train.load_checkpoint(prefix)
    rng = np.random.default_rng(seed)
    names, tensors = [], []
    for name, dtype in sorted(reader.get_variable_to_dtype_map().items()):
        value = reader.get_tensor(name)
        if dtype.is_floating:
            value = (value + rng.normal(0, 0.5, np.shape(value))).astype(dtype.as_numpy_dtype)
        names.append(name)
        tensors.append(tf.constant(value, dtype=dtype))
    for stale in (version_dir / "variables").iterdir():
        stale.unlink()
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors)


def test_swapped_weights_fail_naming_the_outputs(capsys, tmp_path, models):
    version = tmp_path / "swapped" / "1"
    shutil.copytree(models["ckpt"], version)
    _replace_weights(version, seed=3)
    code, report = _verify(capsys, version)
    assert code == 1 and not report["passed"]
    failing = {(r["name"], o["key"]) for r in report["runtimes"] for o in r["outputs"] if not o["passed"]}
    assert ("session", "score") in failing and ("saved_model", "score") in failing
    assert "score" in report["verdict"]


def _module_model(path, with_py_func=False, output_dtype="float32", input_dtype="float32", extra_output=False):
    """A third-party SavedModel: a plain tf.Module with several signatures and a string input."""
    import tensorflow as tf

    class Scorer(tf.Module):
        def __init__(self):
            self.w = tf.Variable([[0.5], [-1.0], [2.0]], dtype=input_dtype)
            self.table = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(["a", "b", "c"], [1, 2, 3], value_dtype=tf.int64), -1)

        @tf.function(input_signature=[tf.TensorSpec([None, 3], input_dtype, name="x")])
        def score(self, x):
            y = tf.matmul(x, self.w)
            if with_py_func:
                y = tf.py_function(lambda t: t * 2, [y], Tout=y.dtype)
            out = {"score": tf.cast(y, output_dtype)}
            if extra_output:
                out["double"] = 2 * out["score"]
            return out

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="token")])
        def lookup(self, token):
            return {"id": self.table.lookup(token), "upper": tf.strings.upper(token)}

    module = Scorer()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.score, "lookup": module.lookup})
    return path


def test_third_party_savedmodel_with_several_signatures(capsys, tmp_path):
    path = _module_model(tmp_path / "third" / "1")
    for signature in ("serving_default", "lookup"):
        code, report = _verify(capsys, path, signature_name=signature)
        assert code == 0, report["verdict"]
        assert report["reference"] == "saved_model"
        assert {r["name"] for r in report["runtimes"]} == {"saved_model", "session"}


def test_py_function_is_an_error_finding(capsys, tmp_path):
    path = _module_model(tmp_path / "pyfunc" / "1", with_py_func=True)
    code, report = _verify(capsys, path)
    assert code == 1
    assert any(f["code"] == "py-func" and f["severity"] == "error" for f in report["findings"])


def test_missing_signature_fails(capsys, models):
    code, report = _verify(capsys, models["multi_io"], signature_name="nope")
    assert code == 1
    assert any(f["code"] == "missing-signature" for f in report["findings"])


def _nudge_golden(version_dir, delta):
    """Shift the recorded outputs a little: the export now differs from its golden record by `delta`."""
    from exportkit.inputs.npz import load_batches, save_batches

    folder = version_dir / "assets.extra/exportkit"
    outputs = load_batches(folder, "golden_outputs")
    save_batches(folder, [{k: (v + delta).astype(v.dtype) for k, v in b.items()} for b in outputs], "golden_outputs")


def test_tolerance_options(capsys, tmp_path, models):
    version = tmp_path / "multi" / "1"
    shutil.copytree(models["multi_io"], version)
    _nudge_golden(version, 1e-3)
    verify = lambda **flags: _verify(capsys, version, runtimes="golden,saved_model", **flags)  # noqa: E731
    code, report = verify()
    assert code == 1
    failing = [o for r in report["runtimes"] for o in r["outputs"] if not o["passed"]]
    assert {o["key"] for o in failing} == {"click", "dwell"}
    needed = max(o["required_atol"] for o in failing)
    assert 9e-4 < needed < 2e-3
    code, _ = verify(atol=2e-3, rtol=0.0)
    assert code == 0
    code, report = verify(tol=["click=2e-3,0"])
    assert code == 1  # dwell still over
    assert all(o["passed"] for r in report["runtimes"] for o in r["outputs"] if o["key"] == "click")
    code, _ = verify(tol=["click=2e-3,0", "dwell=2e-3,0"])
    assert code == 0
    code, _ = verify(rtol=0.5, atol=0.0)  # outputs are O(0.1-1): 1e-3 is well within 50%
    assert code == 0


def test_cli_reports_agree_json_junit_and_table(models, tmp_path):
    json_file, junit_file = tmp_path / "r.json", tmp_path / "r.xml"
    proc = invoke("verify", models["mixed"], "--serving", "none", "--json", json_file, "--junit", junit_file)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(json_file.read_text())
    assert report["passed"] is True and report["verdict"] in proc.stdout
    suite = ET.parse(junit_file).getroot()
    cases = suite.iter("testcase")
    names = {(c.get("classname"), c.get("name")) for c in cases}
    for runtime in report["runtimes"]:
        for output in runtime["outputs"]:
            assert (f"exportkit.verify.{runtime['name']}", output["key"]) in names
            assert runtime["name"] in proc.stdout
    assert not list(suite.iter("failure"))


def test_inputs_file_and_saving_what_reproduces_a_failure(capsys, models, tmp_path):
    from exportkit.inputs.npz import load_batches

    inputs = tmp_path / "in.npz"
    np.savez(inputs, user=np.ones((3, 6), np.float32), item=np.zeros((3, 6), np.float32),
             context=np.full((3, 3), 0.5, np.float32))
    code, report = _verify(capsys, models["multi_io"], inputs=str(inputs), save_inputs=str(tmp_path / "saved_in"),
                           save_outputs=str(tmp_path / "saved_out"), samples=4)
    assert code == 0
    assert "file" in report["inputs"]["source"] and 3 in report["inputs"]["batch_sizes"]
    saved = load_batches(tmp_path / "saved_in", "inputs")
    assert [len(b["user"]) for b in saved] == report["inputs"]["batch_sizes"]
    assert any(b["user"].shape == (3, 6) and np.all(b["user"] == 1) for b in saved)
    # Every runtime's outputs, one file per batch it ran, keyed by the signature's outputs; they agree as reported.
    saved_out = {r["name"]: load_batches(tmp_path / "saved_out", r["name"]) for r in report["runtimes"]}
    assert set(saved_out) == {"golden", "saved_model", "session"}
    for name in ("saved_model", "session"):
        assert [len(b["click"]) for b in saved_out[name]] == report["inputs"]["batch_sizes"], name
        for batch in saved_out[name]:
            assert sorted(batch) == ["click", "dwell"]
        for mine, theirs in zip(saved_out[name], saved_out["saved_model"]):
            np.testing.assert_allclose(mine["click"], theirs["click"], rtol=1e-5, atol=1e-5)
    json_inputs = tmp_path / "in.json"
    json_inputs.write_text(json.dumps({"token": ["a", "zz"]}))
    path = _module_model(tmp_path / "m" / "1")
    code, report = _verify(capsys, path, signature_name="lookup", inputs=str(json_inputs))
    assert code == 0


def test_baseline_breaking_and_compatible_changes(capsys, tmp_path):
    old = _module_model(tmp_path / "old" / "1")
    added = _module_model(tmp_path / "added" / "1", extra_output=True)
    retyped = _module_model(tmp_path / "retyped" / "1", input_dtype="float64")
    code, report = _verify(capsys, added, baseline=str(old))
    assert code == 0, report["findings"]
    assert any(f["severity"] == "info" and "double" in f["message"] for f in report["findings"])
    code, report = _verify(capsys, retyped, baseline=str(old))
    assert code == 1
    assert any(f["severity"] == "error" and f["code"].startswith("baseline") for f in report["findings"])


@pytest.mark.parametrize("args,code,needle", [
    (["/no/such/model"], 2, "no such file"),
    (["{model}", "--runtimes", "golden,bogus"], 2, "bogus"),
    (["{model}", "--tol", "click"], 2, "KEY=ATOL,RTOL"),
])
def test_cli_usage_errors(models, args, code, needle):
    args = [str(models["multi_io"]) if a == "{model}" else a for a in args]
    proc = run_cli("verify", *args)
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.gpu
def test_device_gpu(models):
    """Exit 3 (infrastructure) without a GPU; on a machine with one, the same command verifies on it."""
    proc = run_cli("verify", models["multi_io"], "--device", "gpu", "--serving", "none")
    if has_gpu():
        assert proc.returncode == 0, proc.stdout + proc.stderr
    else:
        assert proc.returncode == 3, proc.stdout + proc.stderr
        assert "GPU" in proc.stderr and "fix:" in proc.stderr and "Traceback" not in proc.stderr


def test_large_sample_counts_run_in_bounded_batches(capsys, models):
    from exportkit.inputs.loader import MAX_BATCH_ROWS

    samples = MAX_BATCH_ROWS * 2 + 3
    code, report = _verify(capsys, models["multi_io"], samples=samples, runtimes="saved_model,session")
    assert code == 0, report["verdict"]
    assert max(report["inputs"]["batch_sizes"]) == MAX_BATCH_ROWS
    manifest = json.loads((models["multi_io"] / "assets.extra/exportkit/manifest.json").read_text())
    golden = manifest["golden"]["batch_sizes"]  # the export's golden batches come first
    repeat = [1]  # the batch of 1 again, last: the determinism check
    # The generated batch of 1 is the golden one (same seed): not run twice.
    assert report["inputs"]["batch_sizes"] == golden + [MAX_BATCH_ROWS, MAX_BATCH_ROWS, 3] + repeat
    assert sum(report["inputs"]["batch_sizes"]) == sum(golden) + samples + 1
