"""verify's plan as plain data, and the pairs it plans compared on arrays (no TensorFlow, no runtime started)."""
from __future__ import annotations

import subprocess
import sys

import numpy as np

from exportkit.compare.tolerances import Tolerance
from exportkit.verify.pairs import compare_all
from exportkit.verify.plan import Pair, pairs_for, plan_runtimes
from exportkit.verify.report import RuntimeResult, VerifyReport


def test_planning_imports_no_tensorflow():
    code = ("import sys, exportkit.verify.plan, exportkit.verify.pairs, exportkit.verify.checks, "
            "exportkit.verify.execute; assert 'tensorflow' not in sys.modules, 'tensorflow imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_runtimes_are_planned_in_reference_order_with_devices_and_tf_versions():
    planned = plan_runtimes(["session", "rest", "golden", "keras", "serving", "saved_model", "trained"], ["cpu", "gpu"],
                            {"2.12": "/envs/2.12/bin/python"})
    assert [r.label for r in planned] == [
        "trained", "golden", "keras@cpu", "keras@gpu", "saved_model@cpu", "saved_model@gpu", "session@cpu",
        "session@gpu", "serving", "rest", "session@2.12"]
    by_label = {r.label: r for r in planned}
    assert by_label["serving"].device == by_label["rest"].device == "gpu"  # the server runs on the last device
    assert by_label["golden"].device is None
    assert (by_label["session@2.12"].name, by_label["session@2.12"].tf_version) == ("session", "2.12")
    assert [r.label for r in plan_runtimes(["saved_model", "session"], ["cpu"])] == ["saved_model", "session"]


def test_pairs_hold_each_runtime_against_the_ones_before_it_and_gpu_against_cpu():
    pairs = pairs_for("s", ["golden", "saved_model@cpu", "saved_model@gpu"], ["cpu", "gpu"])
    assert pairs == [Pair("reference", "s", "saved_model@cpu", ("golden",)),
                     Pair("reference", "s", "saved_model@gpu", ("golden", "saved_model@cpu")),
                     Pair("device", "s", "saved_model@gpu", ("saved_model@cpu",))]
    assert pairs_for("s", ["golden"], ["cpu"]) == []


def _report(names):
    return VerifyReport(path="m", signature="s", reference="", runtimes=[
        RuntimeResult(name=n, kind="in-process", device="cpu", status="ok") for n in names], findings=[], inputs={})


def test_per_batch_the_first_runtime_of_a_pair_that_answered_is_the_reference():
    """Golden answers only the recorded batch: the generated one is held against saved_model, and the report says
    which runtime stood in for the golden record."""
    y = {"y": np.array([[1.0, 2.0]], np.float32)}
    off = {"y": np.array([[1.0, 2.5]], np.float32)}
    outputs = {"golden": [y, None], "saved_model": [y, y], "session": [y, off]}
    batches = [("golden", {"x": np.zeros((1, 3))}), ("generated", {"x": np.ones((1, 3))})]
    report = _report(outputs)
    compare_all(report, outputs, batches, lambda key, dtype: Tolerance(1e-5, 1e-5), ["cpu"],
                pairs_for("s", list(outputs), ["cpu"]))
    by_name = {r.name: r for r in report.runtimes}
    assert report.reference == "golden" and by_name["golden"].is_reference
    assert report.inputs["reference_without_golden"] == "saved_model"
    assert [c.batches for c in by_name["saved_model"].comparisons] == [1]  # batch 1 has no one before it
    session = by_name["session"].comparisons[0]
    assert session.batches == 2 and not session.passed  # batch 1 against saved_model, which it disagrees with
    assert not report.passed


def test_the_cli_prestarts_a_worker_only_for_runs_that_use_one():
    """`exportkit verify` starts its TensorFlow worker before its own imports; a run none of whose runtimes is the
    worker's must start none (its TensorFlow import, killed halfway, would only take a core from the run)."""
    from exportkit.entry import needs_worker

    def verify(*flags):
        return needs_worker(["exportkit", "verify", "models/ranker", *flags])

    assert verify() and verify("--against", "m.keras") and verify("--serving", "docker")  # session runs
    assert verify("--runtimes", "golden,saved_model") and verify("--runtimes=serving,rest")  # embedded by default
    assert not verify("--runtimes", "keras,saved_model")  # saved_model runs beside eager Keras in the CLI process
    assert not verify("--runtimes", "serving", "--serving", "docker:2.14.1")
    assert not verify("--runtimes", "serving,rest", "--serving=127.0.0.1:8500")
    assert not verify("--runtimes", "golden", "--tf", "2.12") and not verify("--runtimes", "session@2.12")
    assert not verify("--data", "records.tfrecord") and not needs_worker(["exportkit", "export", "m.keras"])
