"""Faults around the serving runtime: a server that dies or is killed, a server that is not there."""
from __future__ import annotations

import json
import stat
import time

import pytest

from conftest import invoke


def _standin(tmp_path, body: str):
    exe = tmp_path / "tensorflow_model_server"
    exe.write_text(body)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


@pytest.mark.slow
def test_killed_server_is_infrastructure_and_its_log_shows_in_the_text_report(third_party, tmp_path):
    exe = _standin(tmp_path, "#!/bin/sh\necho \"Op type not registered 'Foo' in binary running on standin\" >&2\n"
                             "kill -9 $$\n")
    proc = invoke("verify", third_party["plain"], "--serving", "binary", "--model-server-bin", exe,
                   "--runtimes", "saved_model,serving", "--json", tmp_path / "r.json")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "SIGKILL" in proc.stderr and "fix:" in proc.stderr
    # The table of the runtimes that did run is still printed, and the server's log tail is in it.
    assert "saved_model" in proc.stdout and "REF" in proc.stdout
    assert "Op type not registered 'Foo'" in proc.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    serving = next(r for r in report["runtimes"] if r["name"] == "serving")
    assert serving["status"] == "error" and "killed by SIGKILL" in serving["error"]
    # exit 3: the verdict blames the environment, not the model (`passed` stays false: not everything ran)
    assert report["passed"] is False and report["verdict"].startswith("ERROR (infrastructure): serving: ")
    assert "SIGKILL" in report["verdict"] and "FAILED" not in report["verdict"], serving["error"]
    assert proc.stdout.rstrip().splitlines()[-1] == report["verdict"]


@pytest.mark.slow
def test_server_exiting_with_a_code_shows_its_log_tail_in_the_text_report(third_party, tmp_path):
    exe = _standin(tmp_path, "#!/bin/sh\necho 'loading...' >&2\n"
                             "echo \"Op type not registered 'Bar' in binary running on standin\" >&2\nexit 255\n")
    proc = invoke("verify", third_party["plain"], "--serving", "binary", "--model-server-bin", exe,
                   "--runtimes", "saved_model,serving")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    table_row = next(line for line in proc.stdout.splitlines() if line.startswith("serving"))
    assert "exited with code 255" in table_row and "Op type not registered 'Bar'" in table_row
    assert "serving error:" in proc.stdout and "loading..." in proc.stdout  # the whole tail, not only --json


@pytest.mark.slow
def test_nothing_listening_fails_fast_and_still_prints_the_table(third_party, tmp_path):
    from exportkit.serving.launch.process import free_port

    address = f"127.0.0.1:{free_port()}"
    began = time.monotonic()
    proc = invoke("verify", third_party["plain"], "--serving", address, "--model-name", "plain",
                   "--runtimes", "saved_model,serving")
    elapsed = time.monotonic() - began
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert elapsed < 60, f"took {elapsed:.0f}s: it waited for --load-timeout"
    assert "cannot connect" in proc.stderr and address in proc.stderr and "fix:" in proc.stderr
    assert "saved_model" in proc.stdout and "REF" in proc.stdout  # the other runtimes' table


def test_serving_unavailable_is_infrastructure_with_a_fix():
    from exportkit.errors import InfraError
    from exportkit.runtimes.serving import ServingRuntime
    from exportkit.serving.client.grpc_client import ServingError

    runtime = ServingRuntime(None, "127.0.0.1:1")
    with pytest.raises(InfraError) as info:
        runtime._raise(ServingError("UNAVAILABLE", "Socket closed"), "Predict(signature 'serving_default')")
    assert info.value.remedy and "UNAVAILABLE" in info.value.message
