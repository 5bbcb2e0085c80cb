"""Deployment pitfalls every local runtime agrees on: NaN outputs, a new version that breaks the clients of the
one served before, dims that fail at sizes the signature allows, warm-up of the batch sizes a batching server
runs, latency. Models built the way others write them: tf.Module saves, tf.compat.v1 graphs, Keras exports."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import invoke
from tfs_models import build_half_plus, build_half_plus_two_tf2


def _verify(capsys, path, **flags):
    """verify in this process; (exit code, JSON report)."""
    from exportkit.options.verify import VerifyOptions
    from exportkit.verify.command import verify_command

    flags.setdefault("serving", "none")
    code = verify_command(VerifyOptions(path=str(path), json_out="-", **flags))
    return code, json.loads(capsys.readouterr().out)


def _baseline(path, **flags):
    """verify's baseline check alone (static: no runtime starts): (findings, what was compared with what)."""
    from exportkit.options.verify import VerifyOptions
    from exportkit.verify.checks import baseline_findings
    from exportkit.verify.plan import read_model

    flags.setdefault("serving", "none")
    version_dir, _, signatures = read_model(str(path))
    return baseline_findings(VerifyOptions(path=str(path), **flags), signatures, list(signatures), version_dir)


def _codes(report, severity=None):
    return {f["code"] for f in report["findings"] if severity is None or f["severity"] == severity}


# -- pure parts ------------------------------------------------------------------------------------------------


def test_non_finite_counts_and_first_index():
    from exportkit.compare.finite import non_finite

    assert non_finite(np.array([[1.0, 2.0], [np.inf, np.nan]])) == (2, (1, 0))
    assert non_finite(np.ones(3)) == (0, None)
    assert non_finite(np.array([1, 2])) == (0, None)  # integers are always finite
    assert non_finite(np.array([b"nan"], dtype=object)) == (0, None)


def test_non_finite_findings_warning_when_every_runtime_agrees_error_against_a_finite_reference():
    from exportkit.compare.finite import non_finite_findings

    nan = np.array([[1.0, np.nan], [1.0, 1.0]], np.float32)
    runtimes = {"saved_model": [{"y": nan, "n": np.array([1])}, None], "session": [{"y": nan}, None]}
    (warning,) = non_finite_findings(runtimes)
    assert warning.severity == "warning" and warning.code == "non-finite-output"
    assert "'y'" in warning.message and "1 of 4 values" in warning.message and "batch 0 [0, 1]" in warning.message
    assert "saved_model, session" in warning.message
    (error,) = non_finite_findings({"golden": [{"y": np.ones((2, 2), np.float32)}, None], **runtimes}, "sig")
    assert error.severity == "error" and "vs golden" in error.message and error.message.startswith("signature 'sig'")
    # the reference had NaN there too: the model computes it, a warning
    (same,) = non_finite_findings({"trained": [{"y": nan}, None], **runtimes})
    assert same.severity == "warning"
    assert non_finite_findings({"saved_model": [{"y": np.ones(2)}]}) == []


def test_non_finite_counter_streams_record_numbers():
    from exportkit.compare.finite import NonFiniteCounter

    counter = NonFiniteCounter()
    counter.add("saved_model", {"y": np.ones((4, 2))}, 0)
    counter.add("saved_model", {"y": np.array([[1, 1], [1, np.inf]])}, 4)
    (finding,) = counter.findings()
    assert "Inf" in finding.message and "1 of 12" in finding.message and "record 5 [1]" in finding.message


def test_latency_summary_and_the_gate():
    from exportkit.verify.latency import latency_findings, latency_summary
    from exportkit.verify.report import RuntimeResult

    summary = latency_summary([0.5, 0.010, 0.012, 0.020])
    assert summary["requests"] == 4 and summary["first_ms"] == 500.0
    assert summary["p50_ms"] == 12.0 and 19.0 < summary["p99_ms"] <= 20.0  # the first request is not steady state
    assert latency_summary([0.002])["p99_ms"] == 2.0 and latency_summary([]) is None
    rows = [RuntimeResult("session", "subprocess", latency=summary), RuntimeResult("golden", "recorded")]
    assert latency_findings(rows, None) == [] and latency_findings(rows, 25) == []
    (over,) = latency_findings(rows, 15)
    assert over.code == "latency-over-limit" and "session" in over.message and "p99" in over.message


def test_probe_sizes_only_for_open_dims_and_capped():
    from exportkit.inputs.spec import InputSpec
    from exportkit.verify.shapes import LONG_DIM, probe_batch, probe_sizes

    assert probe_sizes([InputSpec("x", "float32", [-1, 3])]) == []
    assert probe_sizes([InputSpec("t", "int32", [-1, -1])]) == [1, LONG_DIM]
    assert probe_sizes([InputSpec("x", "float32", None)]) == [1, LONG_DIM]  # unknown rank: [batch, size]
    images = probe_sizes([InputSpec("img", "float32", [-1, -1, -1, 3]), InputSpec("t", "int32", [-1, -1])])
    assert images == [1, LONG_DIM]  # 256 x 256 x 3 fits the cap
    huge = probe_sizes([InputSpec("v", "float32", [-1, -1, -1, -1])])
    assert huge[0] == 1 and 8 < huge[1] < LONG_DIM
    batch = probe_batch([InputSpec("t", "int32", [-1, -1]), InputSpec("m", "float32", [-1, -1])], 40, 0, (0, 5))
    assert batch["t"].shape == (1, 40) and batch["m"].shape == (1, 40)


def test_a_wide_matmul_is_not_batch_dependent_but_batch_statistics_are():
    """oneDNN orders a 5000-term float32 sum differently at batch 1 and 8: round-off on the scale of the largest
    answers (~1e-4 near 100), which an element-wise 1e-5 test blames on batching for answers near zero."""
    import tensorflow as tf

    from exportkit.compare.tolerances import default_tolerance
    from exportkit.verify.behaviours import batch_dependent_outputs

    tolerance = lambda key, dtype: default_tolerance(dtype)  # noqa: E731
    w = tf.constant(np.random.default_rng(0).standard_normal((5000, 10)).astype("float32"))
    for seed in range(10):
        x = tf.constant(np.random.default_rng(seed).standard_normal((8, 5000)).astype("float32"))
        alone, in_batch = tf.matmul(x[:1], w).numpy(), tf.matmul(x, w).numpy()
        assert batch_dependent_outputs({"y": alone}, {"y": in_batch}, 1, tolerance) == [], seed
        normalised = (in_batch - in_batch.mean(axis=0)) / in_batch.std(axis=0)  # a training-mode BatchNorm
        assert batch_dependent_outputs({"y": alone}, {"y": normalised}, 1, tolerance) == ["y"], seed


def test_baseline_added_input_with_a_default_is_compatible():
    from exportkit.verify.baseline import compare_signature_sets

    old = {"s": {"inputs": {"x": {"dtype": "float32", "shape": [-1, 3]}}, "outputs": {}}}
    new = {"s": {"inputs": {"x": {"dtype": "float32", "shape": [-1, 3]}, "t": {"dtype": "float32", "shape": []}},
                 "outputs": {}, "defaults": ["t"]}}
    assert [(f.severity, f.code) for f in compare_signature_sets(old, new)] == [("info", "baseline-added-optional-input")]
    new["s"].pop("defaults")
    assert [(f.severity, f.code) for f in compare_signature_sets(old, new)] == [("error", "baseline-added-input")]


def test_warmup_batch_sizes_of_batching_parameters(tmp_path):
    from exportkit.errors import UsageError
    from exportkit.serving.warmup import resized_batches, warmup_batch_sizes

    good = tmp_path / "batching.txt"
    good.write_text("max_batch_size { value: 16 }\nallowed_batch_sizes: 4\nallowed_batch_sizes: 16\n")
    assert warmup_batch_sizes(str(good)) == [4, 16] and warmup_batch_sizes(None) == []
    bad = tmp_path / "bad.txt"
    bad.write_text("max_batch_size { value: 32 }\nallowed_batch_sizes: 4\nallowed_batch_sizes: 16\n")
    with pytest.raises(UsageError, match="must match max_batch_size"):
        warmup_batch_sizes(str(bad))
    batches = resized_batches([{"x": np.arange(3)[:1]}, {"x": np.arange(3)}], [4, 3])
    assert [len(b["x"]) for b in batches] == [1, 3, 4] and list(batches[-1]["x"]) == [0, 1, 2, 0]


def test_the_new_flags_are_checked_before_anything_starts(tmp_path):
    bad = tmp_path / "batching.txt"
    bad.write_text("max_batch_size { value: 8 }\nallowed_batch_sizes: 4\n")
    model = tmp_path / "m.keras"
    model.write_bytes(b"")
    for args, needle in ((["verify", tmp_path, "--baseline", tmp_path, "--no-baseline"], "contradict"),
                         (["verify", tmp_path, "--max-latency-ms", "0"], "--max-latency-ms 0"),
                         (["export", model, "-o", tmp_path / "out", "--batching-parameters", bad], "max_batch_size")):
        result = invoke(*args)
        assert result.returncode == 2 and needle in result.stderr and "fix:" in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()


# -- models as others write them -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """tf.Module saves: a positional embedding of 64 rows on a [None, None] input with an all-NaN output, v1
    `features` / v2 renamed `inputs` in one base dir; TF Serving's test models in two versions each (half_plus: a
    tf.compat.v1 graph; half_plus_two: a tf.Module, zero-padded version names)."""
    import tensorflow as tf

    root = tmp_path_factory.mktemp("pitfalls")

    def scorer(name):
        class Scorer(tf.Module):
            def __init__(self):
                self.w = tf.Variable([[1.0], [2.0], [3.0]])

            @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name=name)])
            def serve(self, x):
                return {"score": tf.matmul(x, self.w)}
        return Scorer()

    class Positional(tf.Module):
        """A positional table of 64 rows on a [None, None] input, and an output that is NaN everywhere."""

        def __init__(self):
            self.embedding = tf.Variable(tf.random.stateless_normal([10, 4], seed=[1, 2]))
            self.positions = tf.Variable(tf.random.stateless_normal([64, 4], seed=[3, 4]))

        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="tokens")])
        def serve(self, tokens):
            n = tf.shape(tokens)[1]
            return {"h": tf.gather(self.embedding, tokens) + self.positions[None, :n] + tf.zeros([1, n, 4]),
                    "y": tf.cast(tokens, tf.float32) * float("nan")}

    for module, path in ((Positional(), "positional/1"), (scorer("features"), "renamed/1"),
                         (scorer("inputs"), "renamed/2")):
        tf.saved_model.save(module, str(root / path), signatures={"serving_default": module.serve})
    build_half_plus(str(root / "half_plus" / "1"), b=2.0)
    build_half_plus(str(root / "half_plus" / "2"), b=3.0)
    build_half_plus_two_tf2(str(root / "half_plus_two" / "00000123"))
    build_half_plus_two_tf2(str(root / "half_plus_two" / "00000124"))
    return root


@pytest.mark.slow
def test_nan_outputs_long_lengths_and_the_latency_gate_in_one_run(capsys, models):
    code, report = _verify(capsys, models / "positional", max_latency_ms=1e-6)
    assert code == 1 and "latency-over-limit" in _codes(report, "error")  # only the gate fails
    assert _codes(report, "error") == {"latency-over-limit"}
    (nan,) = [f for f in report["findings"] if f["code"] == "non-finite-output"]
    assert nan["severity"] == "warning" and "'y'" in nan["message"] and "batch 0 [0, 0]" in nan["message"]
    (dim,) = [f for f in report["findings"] if f["code"] == "dynamic-dim-fails"]  # a warning: no signature says "<= 64"
    assert dim["severity"] == "warning" and "input 'tokens' dim 1" in dim["message"] and "256" in dim["message"]
    assert report["inputs"]["open_dim_sizes"] == {"serving_default": [1, 8, 256]}
    for runtime in report["runtimes"]:  # saved_model and session both timed, and agree at the default size
        latency = runtime["latency"]
        assert latency["requests"] >= 3 and 0 < latency["p50_ms"] <= latency["p99_ms"] and latency["first_ms"] > 0
        assert all(o["passed"] for o in runtime["outputs"])


def test_a_passing_verdict_names_nan_and_failing_sizes():
    from exportkit.findings import Finding
    from exportkit.compare.finite import non_finite_findings
    from exportkit.verify.report import RuntimeResult, VerifyReport, verdict_line
    from exportkit.verify.shapes import dim_failure
    from exportkit.inputs.spec import InputSpec

    nan = np.full((1, 2), np.nan, np.float32)
    findings = non_finite_findings({"saved_model": [{"y": nan}], "session": [{"y": nan}]})
    findings.append(dim_failure("serving_default", [InputSpec("tokens", "int32", [-1, -1])], 256, "session", "boom"))
    report = VerifyReport("m/1", "serving_default", "saved_model", findings=findings, runtimes=[
        RuntimeResult("saved_model", "subprocess", is_reference=True), RuntimeResult("session", "subprocess")])
    assert verdict_line(report).endswith("; but output 'y' holds NaN, input 'tokens' dim 1 fails at 256 (see findings)")
    report.findings += non_finite_findings({"saved_model": [{"y": nan}], "session": [{"y": nan}]}, signature="serve")
    assert verdict_line(report).count("holds NaN") == 1  # two signatures of one function: said once
    report.findings.append(Finding("error", "baseline-renamed-input", "input 'features' was renamed to 'inputs'; "
                                                                     "requests use the old name: keep it"))
    report.baseline = {"old": "m/0", "source": "previous-version"}
    assert verdict_line(report) == "FAILED: breaks clients of m/0: input 'features' was renamed to 'inputs'"


@pytest.mark.slow
def test_nan_in_the_savedmodel_where_the_training_time_reference_was_finite_is_an_error(capsys, models, tmp_path):
    """A Keras model recorded with exportkit.record_reference, exported (ExportArchive) with a NaN in a weight."""
    import keras
    import tensorflow as tf

    from exportkit import record_reference

    x = keras.Input((3,), name="x")
    model = keras.Model(x, keras.layers.Dense(2, name="y")(x))
    reference = record_reference(model, tmp_path / "ref.npz")
    kernel = model.get_layer("y").kernel
    kernel.assign(np.where(np.arange(6).reshape(3, 2) == 1, np.nan, kernel.numpy()))
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serving_default", lambda x: {"y": model(x)},
                         input_signature=[tf.TensorSpec((None, 3), tf.float32, name="x")])
    archive.write_out(str(tmp_path / "keras" / "1"), verbose=False)
    code, report = _verify(capsys, tmp_path / "keras" / "1", reference=str(reference))
    assert code == 1
    (finding,) = [f for f in report["findings"] if f["code"] == "non-finite-output"]
    assert finding["severity"] == "error" and "vs trained" in finding["message"], finding
    assert "non-finite-output" in report["verdict"]


@pytest.mark.slow
def test_verify_of_the_base_dir_compares_with_the_version_served_before(capsys, models):
    code, report = _verify(capsys, models / "renamed", runtimes="saved_model")
    assert code == 1
    (renamed,) = [f for f in report["findings"] if f["code"] == "baseline-renamed-input"]
    assert "'features'" in renamed["message"] and "'inputs'" in renamed["message"]
    assert report["baseline"]["source"] == "previous-version"
    assert Path(report["baseline"]["old"]).name == "1" and Path(report["baseline"]["new"]).name == "2"
    assert "features" in report["verdict"] and "inputs" in report["verdict"] and "renamed/1" in report["verdict"]



@pytest.mark.slow
def test_baseline_choices(models):
    """The static part of verify alone (no runtime starts): which released signatures are compared."""
    findings, compared = _baseline(models / "renamed" / "2")
    assert [f.code for f in findings] == ["baseline-renamed-input"] and compared["source"] == "previous-version"
    assert _baseline(models / "renamed", no_baseline=True) == ([], {"new": str(models / "renamed" / "2"),
                                                                  "source": "none", "old": None, "why": "--no-baseline"})
    findings, compared = _baseline(models / "renamed" / "1")  # the first version
    assert findings == [] and compared["old"] is None and "no lower version" in compared["why"]
    findings, compared = _baseline(models / "renamed" / "1", baseline=str(models / "renamed" / "2"))
    assert compared["source"] == "--baseline" and [f.code for f in findings] == ["baseline-renamed-input"]
    broken = models / "broken"
    shutil.copytree(models / "renamed" / "2", broken / "2")
    (broken / "1").mkdir()
    (broken / "1" / "saved_model.pb").write_bytes(b"not a proto")
    findings, compared = _baseline(broken / "2")
    assert [f.code for f in findings] == ["baseline-unreadable"] and compared["old"] is None
    # TF Serving's test models, two versions each: no false error
    findings, compared = _baseline(models / "half_plus")
    assert findings == [] and Path(compared["old"]).name == "1", compared
    findings, compared = _baseline(models / "half_plus_two")  # zero-padded version names
    assert findings == [] and Path(compared["old"]).name == "00000123", compared


@pytest.mark.slow
def test_non_finite_outputs_under_data(capsys, models, tmp_path):
    np.savez(tmp_path / "shard.npz", tokens=np.ones((5, 3), np.int32))
    code, report = _verify(capsys, models / "positional", data=str(tmp_path / "*.npz"), runtimes="saved_model")
    (finding,) = [f for f in report["findings"] if f["code"] == "non-finite-output"]
    assert "'y'" in finding["message"] and "15 of 15" in finding["message"] and "record 0" in finding["message"]
    # the model computes the NaNs and every runtime agrees: a warning, not a failure
    assert finding["severity"] == "warning" and code == 0 and report["passed"], report["findings"]
    assert report["runtimes"][0]["latency"]["requests"] == 1


@pytest.mark.slow
def test_a_re_export_with_batching_warms_every_allowed_size_and_breaks_no_client(capsys, exported, sample,
                                                                                 tmp_path):
    from exportkit.serving.warmup import read_warmup_records

    first = exported("multi_io.keras")
    assert first.proc.returncode == 0, first.proc.stderr
    base = tmp_path / "multi_io"
    shutil.copytree(first.base, base)
    batching = tmp_path / "batching.txt"
    batching.write_text("max_batch_size { value: 32 }\nallowed_batch_sizes: 2\nallowed_batch_sizes: 32\n")
    entry = sample("multi_io.keras")
    proc = invoke("export", entry["path"], "-o", base, *entry["export_args"], "--no-verify",
                  "--batching-parameters", str(batching))
    assert proc.returncode == 0, proc.stderr
    sizes = {next(iter(r.inputs.values())).tensor_shape.dim[0].size for r in read_warmup_records(str(base / "2"))}
    assert {2, 32} <= sizes, sizes
    code, report = _verify(capsys, base, runtimes="golden,saved_model")
    assert code == 0 and report["passed"], report["findings"]
    assert report["baseline"]["source"] == "previous-version"
    assert not {c for c in _codes(report, "error") if c.startswith("baseline")}, report["findings"]


@pytest.mark.slow
@pytest.mark.serving
def test_with_a_remote_server_the_deployed_model_is_the_baseline(models, tmp_path):
    from exportkit.serving.launch.process import free_port

    deployed = tmp_path / "renamed"
    shutil.copytree(models / "renamed" / "1", deployed / "1")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "exportkit", "serve", f"--port={port}", "--model_name=renamed",
                             f"--model_base_path={deployed}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "AVAILABLE" in proc.stdout.readline(), proc.stderr.read()[-2000:]
        findings, compared = _baseline(models / "renamed" / "2", serving=f"127.0.0.1:{port}")
        assert [f.code for f in findings] == ["baseline-renamed-input"] and compared["source"] == "serving"
        assert compared["old"] == f"model 'renamed' version 1 served at 127.0.0.1:{port}"
        findings, compared = _baseline(models / "renamed" / "2", serving=f"127.0.0.1:{port}", model_name="other")
        assert findings == [] and compared["old"] is None and "serves no version" in compared["why"]
    finally:
        proc.terminate()
        proc.wait(30)
