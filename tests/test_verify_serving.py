"""verify through a gRPC server, end to end through the CLI: embedded, HOST:PORT, and stand-in binaries."""
from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import textwrap

import pytest

import exportkit
from conftest import invoke, run_cli
from exportkit.tfenv import import_tf

pytestmark = [pytest.mark.slow, pytest.mark.serving]


@pytest.fixture(scope="module")
def ranker(exported):
    """The session's export of the checkpoint sample: its model base directory."""
    assert exported("ranker_ckpt").proc.returncode == 0, exported("ranker_ckpt").proc.stderr
    return exported("ranker_ckpt").base


def _report(path):
    return json.loads(path.read_text())


def test_verify_through_the_embedded_server(ranker, tmp_path):
    proc = invoke("verify", ranker, "--serving", "embedded", "--json", tmp_path / "r.json")
    report = _report(tmp_path / "r.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    serving = next(r for r in report["runtimes"] if r["name"] == "serving")
    assert serving["server"]["kind"] == "embedded" and serving["kind"] == "grpc"
    assert serving["outputs"] and all(o["passed"] for o in serving["outputs"])
    # The report says which server answered: exportkit's own, never passed off as TF Serving.
    tf_version = import_tf().__version__
    assert serving["server"]["version"] == f"exportkit {exportkit.__version__} serve (TensorFlow {tf_version})"
    assert f"embedded server version {serving['server']['version']}" in proc.stdout


def test_verify_through_the_embedded_server_with_tf_servings_batching(ranker, tmp_path):
    """--batching-parameters reaches the embedded server: its warm-up runs through the batching session, and a
    warm-up record larger than max_batch_size fails the load as TF Serving's would."""
    params = tmp_path / "batching.config"
    params.write_text("max_batch_size { value: 4 } batch_timeout_micros { value: 0 } allowed_batch_sizes: 4\n")
    proc = invoke("verify", ranker, "--serving", "embedded", "--batching-parameters", params,
                  "--json", tmp_path / "r.json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Task size 8 is larger than maximum input batch size 4" in proc.stdout


def test_verify_against_a_running_server(ranker, tmp_path):
    server = subprocess.Popen([sys.executable, "-m", "exportkit", "serve", ranker, "--port", "0",
                               "--model-name", "ranker"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = server.stdout.readline()
        address = re.search(r"127\.0\.0\.1:\d+", line).group(0)
        proc = invoke("verify", ranker, "--serving", address, "--model-name", "ranker", "--json", tmp_path / "r.json")
        report = _report(tmp_path / "r.json")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        serving = next(r for r in report["runtimes"] if r["name"] == "serving")
        assert serving["server"]["kind"] == "remote" and serving["server"]["address"] == address
        assert server.poll() is None, "verify must not stop a server it did not start"
    finally:
        server.terminate()
        assert server.wait(timeout=30) == 0


def _standin(tmp_path, body: str) -> dict:
    exe = tmp_path / "tensorflow_model_server"
    exe.write_text(body)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return {"EXPORTKIT_MODEL_SERVER": str(exe)}


def test_binary_that_fails_to_load_the_model_is_the_models_failure(ranker, tmp_path):
    env = _standin(tmp_path, "#!/bin/sh\necho \"Op type not registered 'Foo' in binary\" >&2\nexit 1\n")
    proc = run_cli("verify", ranker, "--serving", "binary", "--json", tmp_path / "r.json", env=env)
    assert proc.returncode == 1
    report = _report(tmp_path / "r.json")
    serving = next(r for r in report["runtimes"] if r["name"] == "serving")
    assert serving["status"] == "error" and "Op type not registered 'Foo'" in serving["error"]


def test_binary_standin_that_speaks_the_protocol(ranker, tmp_path):
    env = _standin(tmp_path, textwrap.dedent(f"""\
        #!{sys.executable}
        import os, sys
        flags = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
        if "--version" in sys.argv:
            print("TensorFlow ModelServer: 0.0.0-standin"); sys.exit(0)
        os.execv(sys.executable, [sys.executable, "-m", "exportkit", "serve", flags["model_base_path"],
                                  "--port", flags["port"], "--model-name", flags["model_name"],
                                  "--rest-port", flags["rest_api_port"]])
        """))
    proc = run_cli("verify", ranker, "--json", tmp_path / "r.json", env=env)  # auto finds the binary
    assert proc.returncode == 0, proc.stdout + proc.stderr
    serving = next(r for r in _report(tmp_path / "r.json")["runtimes"] if r["name"] == "serving")
    assert serving["server"]["kind"] == "binary" and serving["server"]["version"] == "0.0.0-standin"


def test_binary_asked_for_but_absent_is_infrastructure(ranker, tmp_path):
    env = {"PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin", "EXPORTKIT_MODEL_SERVER": ""}
    proc = run_cli("verify", ranker, "--serving", "binary", env=env)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "tensorflow/serving" in proc.stderr and "Traceback" not in proc.stderr


def test_inspect_a_source_file_with_custom_objects(sample):
    entry = sample("mixed_functional.h5")
    proc = run_cli("inspect", entry["path"], "--json")
    assert proc.returncode == 2  # cannot be loaded without its custom objects...
    described = json.loads(proc.stdout)
    assert "FeatureCross" in {c["name"] for c in described["custom_objects_needed"]}  # ...and says which
    proc = run_cli("inspect", entry["path"], "--json", *entry["export_args"])
    assert proc.returncode == 0, proc.stderr
    described = json.loads(proc.stdout)
    assert described["policy"] == "mixed_float16"
    assert [i["key"] for i in described["inputs"]] == ["features", "ids"]
    assert {o["key"]: o["dtype"] for o in described["outputs"]} == {"score": "float32", "embedding": "float16"}
