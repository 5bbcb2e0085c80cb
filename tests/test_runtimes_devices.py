"""Device placement and global TF state: tested on logical CPU devices; real GPU runs skip without a GPU."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import REPO, has_gpu, run_cli


@pytest.mark.slow
def test_runtimes_run_on_the_device_they_are_given_and_report_it(tmp_path):
    """Two logical CPUs stand in for two devices: placement must follow the runtime's device string."""
    script = textwrap.dedent(f"""
        import json, sys
        import tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        import keras
        inp = keras.Input((3,), name="x")
        model = keras.Model(inp, keras.layers.Dense(2, name="y")(inp))
        archive = keras.export.ExportArchive()
        archive.track(model)
        archive.add_endpoint("serving_default", lambda x: {{"y": model(x)}},
                             input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
        archive.write_out({str(tmp_path / "m")!r}, verbose=False)
        from exportkit.runtimes.local import SavedModelRuntime
        placed = {{}}
        for device in ("/CPU:0", "/CPU:1"):
            runtime = SavedModelRuntime({str(tmp_path / "m")!r}, "serving_default", {{"x": "float32"}}, device=device)
            runtime.load()
            runtime.run({{"x": [[1.0, 2.0, 3.0]]}})
            placed[device] = runtime.placed_on
        print(json.dumps(placed))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    placed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert placed == {"/CPU:0": "cpu:0", "/CPU:1": "cpu:1"}


@pytest.mark.gpu
def test_gpu_without_gpu_is_an_infrastructure_failure():
    if has_gpu():
        pytest.skip("this machine has a GPU")
    from exportkit.errors import InfraError
    from exportkit.runtimes.local import tf_device

    with pytest.raises(InfraError, match="no GPU"):
        tf_device("gpu")
    assert tf_device("cpu") == "/CPU:0"


def test_device_all_also_compares_gpu_with_cpu():
    """The comparison plan of --device all, on arrays: every @gpu runtime is also held against its @cpu twin."""
    from exportkit.compare.tolerances import Tolerance
    from exportkit.verify.report import RuntimeResult, VerifyReport
    from exportkit.verify.pairs import compare_all as _compare_all

    cpu = [{"y": np.array([[1.0, 2.0]], np.float32)}]
    gpu = [{"y": np.array([[1.0, 2.001]], np.float32)}]  # what TF32 does to a float32 matmul
    outputs = {"saved_model@cpu": cpu, "saved_model@gpu": gpu}
    report = VerifyReport(path="m", signature="serving_default", reference="", runtimes=[
        RuntimeResult(name=n, kind="in-process", device=n[-3:], server=None, status="ok", error=None, seconds=0.0,
                      is_reference=False, comparisons=[]) for n in outputs], findings=[], inputs={})
    _compare_all(report, outputs, [("generated", {"x": np.zeros((1, 3))})], lambda k, d: Tolerance(1e-5, 1e-5),
                 ["cpu", "gpu"])
    names = [r.name for r in report.runtimes]
    assert names == ["saved_model@cpu", "saved_model@gpu", "saved_model@gpu vs cpu"]
    assert report.reference == "saved_model@cpu"
    assert not report.runtimes[2].passed and not report.passed


def test_tf32_and_dtype_policy_are_restored():
    import keras
    import tensorflow as tf

    from exportkit.tfenv import dtype_policy, tf32

    before = tf.config.experimental.tensor_float_32_execution_enabled()
    with tf32(not before):
        assert tf.config.experimental.tensor_float_32_execution_enabled() == (not before)
    assert tf.config.experimental.tensor_float_32_execution_enabled() == before
    policy = keras.config.dtype_policy().name
    with pytest.raises(RuntimeError):
        with dtype_policy("mixed_float16"):
            assert keras.config.dtype_policy().name == "mixed_float16"
            raise RuntimeError("a failing build must not leave the policy behind")
    assert keras.config.dtype_policy().name == policy


@pytest.mark.gpu
@pytest.mark.slow
def test_verify_on_gpu_and_all(exported, tmp_path):
    if not has_gpu():
        pytest.skip("needs a GPU")
    for device in ("gpu", "all"):
        proc = run_cli("verify", exported("multi_io.keras").base, "--device", device, "--json", tmp_path / f"{device}.json")
        report = json.loads((tmp_path / f"{device}.json").read_text())
        assert proc.returncode == 0, report["verdict"]
        assert report["tf32"] is False
        assert any("GPU" in (r["device"] or "").upper() for r in report["runtimes"])
