"""verify through a gRPC server, end to end through the CLI: embedded, HOST:PORT, and stand-in binaries."""
from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import textwrap

import psutil
import pytest

from conftest import run_cli


@pytest.fixture(scope="module")
def exported(sample, tmp_path_factory):
    base = tmp_path_factory.mktemp("served") / "ranker"
    proc = run_cli("export", sample("ranker_ckpt")["path"], "-o", base)
    assert proc.returncode == 0, proc.stderr
    return base


@pytest.fixture(autouse=True)
def no_children_left():
    """Every process a test starts (workers, servers, stand-ins) is gone when it ends."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    new = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    _, alive = psutil.wait_procs(new, timeout=15)
    assert not alive, f"left behind: {[p.cmdline() for p in alive]}"


def _report(path):
    return json.loads(path.read_text())


def test_verify_through_the_embedded_server(exported, tmp_path):
    proc = run_cli("verify", exported, "--serving", "embedded", "--json", tmp_path / "r.json")
    report = _report(tmp_path / "r.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    serving = next(r for r in report["runtimes"] if r["name"] == "serving")
    assert serving["server"]["kind"] == "embedded" and serving["kind"] == "grpc"
    assert serving["outputs"] and all(o["passed"] for o in serving["outputs"])
    assert "embedded server" in proc.stdout
    assert "TF Serving" not in serving["server"].get("version", "")


def test_verify_against_a_running_server(exported, tmp_path):
    server = subprocess.Popen([sys.executable, "-m", "exportkit", "serve", exported, "--port", "0",
                               "--model-name", "ranker"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = server.stdout.readline()
        address = re.search(r"127\.0\.0\.1:\d+", line).group(0)
        proc = run_cli("verify", exported, "--serving", address, "--model-name", "ranker", "--json", tmp_path / "r.json")
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


def test_binary_that_fails_to_load_the_model_is_the_models_failure(exported, tmp_path):
    env = _standin(tmp_path, "#!/bin/sh\necho \"Op type not registered 'Foo' in binary\" >&2\nexit 1\n")
    proc = run_cli("verify", exported, "--serving", "binary", "--json", tmp_path / "r.json", env=env)
    assert proc.returncode == 1
    report = _report(tmp_path / "r.json")
    serving = next(r for r in report["runtimes"] if r["name"] == "serving")
    assert serving["status"] == "error" and "Op type not registered 'Foo'" in serving["error"]


def test_binary_standin_that_speaks_the_protocol(exported, tmp_path):
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
    proc = run_cli("verify", exported, "--json", tmp_path / "r.json", env=env)  # auto finds the binary
    assert proc.returncode == 0, proc.stdout + proc.stderr
    serving = next(r for r in _report(tmp_path / "r.json")["runtimes"] if r["name"] == "serving")
    assert serving["server"]["kind"] == "binary" and serving["server"]["version"] == "0.0.0-standin"


def test_binary_asked_for_but_absent_is_infrastructure(exported, tmp_path):
    env = {"PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin", "EXPORTKIT_MODEL_SERVER": ""}
    proc = run_cli("verify", exported, "--serving", "binary", env=env)
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
