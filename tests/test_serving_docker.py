"""`verify --serving docker[:TAG]` and `--serving binary`: the real TF Serving's lifecycle, through stand-ins.

Docker is not on these machines, so a stand-in `docker` (tests/standins.py) runs `exportkit serve` with the flags TF
Serving's image entrypoint passes: the server protocol is real, only the container runtime stands in. Covered: a
model that loads, one that fails to load (log tail shown), an image that is missing (and --pull), a killed exportkit
(its container removed by the next run), Ctrl-C and SIGTERM (container removed).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest

import standins
from conftest import SESSION_CHILDREN, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.serving]
IMAGE = "tensorflow/serving:2.14.1"
DIGEST = "0123456789abcdef" * 4


@pytest.fixture(scope="module")
def ranker(exported):
    assert exported("ranker_ckpt").proc.returncode == 0, exported("ranker_ckpt").proc.stderr
    return exported("ranker_ckpt").base


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    """The stand-in's dockerd: its containers are its forks (one TensorFlow import for the module's containers)."""
    running = standins.ContainerDaemon(tmp_path_factory.mktemp("dockerd"))
    SESSION_CHILDREN.add(running.process.pid)
    yield running
    running.close()
    SESSION_CHILDREN.discard(running.process.pid)


@pytest.fixture()
def docker(tmp_path, daemon):
    """(env, state) with a stand-in `docker` first on PATH; IMAGE is "pulled"; :2.15.0 is only in the registry."""
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    standins.write_docker(bin_dir, state, {IMAGE: DIGEST}, registry={"tensorflow/serving:2.15.0": DIGEST[::-1]})
    yield standins.env_with(bin_dir, state, daemon), state
    for container in standins.containers(state):  # a failing test must not leave servers behind
        subprocess.run([str(bin_dir / "docker"), "rm", "-f", container["id"]], env={**os.environ,
                       **standins.env_with(bin_dir, state)}, capture_output=True)


def _serving(report_path):
    report = json.loads(report_path.read_text())
    return next(r for r in report["runtimes"] if r["name"] == "serving"), report


def _server_gone(container: dict) -> bool:
    return not psutil.pid_exists(container["pid"]) or psutil.Process(container["pid"]).status() == "zombie"


def test_verify_through_tf_servings_image(ranker, docker, tmp_path):
    env, state = docker
    proc = run_cli("verify", ranker, "--serving", "docker:2.14.1", "--json", tmp_path / "r.json", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    serving, report = _serving(tmp_path / "r.json")
    server = serving["server"]
    assert server["kind"] == "docker" and server["image"] == IMAGE
    assert server["digest"] == f"tensorflow/serving@sha256:{DIGEST}"
    assert server["version"] == standins.VERSION  # the server's own answer to --version
    rest = next(r for r in report["runtimes"] if r["name"] == "rest")
    assert rest["status"] == "ok" and all(o["passed"] for o in rest["outputs"])
    assert IMAGE in proc.stdout
    run = next(c for c in standins.calls(state) if c[:2] == ["run", "-d"])
    published = [run[i + 1] for i, a in enumerate(run) if a == "-p"]
    assert published and all(p.startswith("127.0.0.1:") for p in published), run
    mounts = [run[i + 1] for i, a in enumerate(run) if a == "-v"]
    assert mounts == [f"{ranker / '1'}:/models/{ranker.name}/1:ro"]
    assert any(a.startswith("org.exportkit.run=") for a in run)
    assert standins.containers(state) == [], "the container must be removed at the end"
    # its memory is the container's own accounting (`docker stats`), asked once every batch was answered
    [held] = report["memory"]["servers"]
    assert held["server"] == "docker" and held["method"].startswith("docker stats")
    assert [c[:2] for c in standins.calls(state) if c[0] == "stats"] == [["stats", "--no-stream"]]
    [session] = report["memory"]["measured"]  # the model is inside it, with TensorFlow and the server
    assert session["loaded_bytes"] < held["total_bytes"] < 4 * 10**9


def test_missing_image_is_infrastructure_with_the_pull_to_run(ranker, docker):
    env, state = docker
    proc = run_cli("verify", ranker, "--serving", "docker:2.15.0", "--runtimes", "serving", env=env)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "docker pull tensorflow/serving:2.15.0" in proc.stderr and "Traceback" not in proc.stderr
    assert not any(c[0] in ("run", "pull") for c in standins.calls(state)), "no pull unless --pull"



def test_a_docker_without_its_daemon_is_not_a_missing_image(ranker, tmp_path):
    """The docker CLI is there but its daemon is not (a CI runner, a laptop with Docker Desktop stopped): exit 3
    saying so, not "image not on this machine" with a `docker pull` that would fail the same way."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.log"
    docker = bin_dir / "docker"  # what Docker's own CLI prints for every command when nothing listens on its socket
    docker.write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\n"
                      "echo 'Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon "
                      "running?' >&2\nexit 1\n")
    docker.chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = run_cli("verify", ranker, "--serving", "docker:2.14.1", "--pull", "--runtimes", "serving", env=env)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "Is the docker daemon running?" in proc.stderr and "docker info" in proc.stderr, proc.stderr
    assert "not on this machine" not in proc.stderr and "Traceback" not in proc.stderr
    assert not [line for line in calls.read_text().splitlines() if line.startswith(("pull", "run"))]

def test_pull_fetches_a_missing_image(ranker, docker, tmp_path):
    env, state = docker
    proc = run_cli("verify", ranker, "--serving", "docker:2.15.0", "--pull", "--runtimes", "serving",
                   "--json", tmp_path / "r.json", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ["pull", "tensorflow/serving:2.15.0"] in standins.calls(state)
    assert _serving(tmp_path / "r.json")[0]["server"]["image"] == "tensorflow/serving:2.15.0"


def test_a_model_tf_serving_cannot_load_shows_the_container_log(ranker, docker, tmp_path):
    env, state = docker
    broken = tmp_path / "broken"
    shutil.copytree(ranker, broken)
    (broken / "1" / "variables" / "variables.index").write_bytes(b"not an index")
    proc = run_cli("verify", broken, "--serving", "docker:2.14.1", "--runtimes", "serving", "--load-timeout", "60",
                   env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "container log" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert standins.containers(state) == []


def test_gpu_needs_a_gpu_image(ranker, docker):
    env, _ = docker
    proc = run_cli("verify", ranker, "--serving", "docker:2.14.1", "--device", "gpu", "--runtimes", "serving", env=env)
    assert proc.returncode in (2, 3), proc.stdout + proc.stderr  # 3 when this machine has no GPU at all
    assert "fix:" in proc.stderr and "Traceback" not in proc.stderr


def _start_verify(ranker, env, tmp_path) -> subprocess.Popen:
    log = open(tmp_path / "verify.log", "w")
    return subprocess.Popen([sys.executable, "-m", "exportkit", "verify", str(ranker), "--serving", "docker:2.14.1",
                             "--runtimes", "serving", "--load-timeout", "120"], env={**os.environ, **env},
                            stdout=log, stderr=subprocess.STDOUT)


def _wait_for_container(state, proc, deadline=60.0) -> dict:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        found = standins.containers(state)
        if found:
            return found[0]
        assert proc.poll() is None, "verify ended before it started a container"
        time.sleep(0.1)
    raise AssertionError("no container started")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_verify_removes_its_container(ranker, docker, tmp_path, sig):
    env, state = docker
    proc = _start_verify(ranker, env, tmp_path)
    container = _wait_for_container(state, proc)
    proc.send_signal(sig)
    assert proc.wait(60) == 130, (tmp_path / "verify.log").read_text()
    assert standins.containers(state) == []
    assert _server_gone(container)


def test_a_killed_run_leaves_a_container_the_next_run_removes(ranker, docker, tmp_path):
    env, state = docker
    proc = _start_verify(ranker, env, tmp_path)
    container = _wait_for_container(state, proc)
    proc.kill()  # SIGKILL: no cleanup runs; the container outlives it, as a real one would
    proc.wait(30)
    assert [c["id"] for c in standins.containers(state)] == [container["id"]]
    again = run_cli("verify", ranker, "--serving", "docker:2.14.1", "--runtimes", "serving", env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"removed container {container['name']}" in again.stderr
    assert standins.containers(state) == [] and _server_gone(container)


def test_binary_standin_speaks_tf_servings_flags(ranker, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    binary = standins.write_binary(bin_dir)
    proc = run_cli("verify", ranker, "--serving", "binary", "--model-server-bin", binary, "--json", tmp_path / "r.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    serving, report = _serving(tmp_path / "r.json")
    assert serving["server"]["kind"] == "binary" and serving["server"]["version"] == standins.VERSION
    [held] = report["memory"]["servers"]  # the server process's own /proc, read while it runs
    assert held["method"].startswith(f"/proc/") and held["total_bytes"] <= held["peak_bytes"]


def test_compat_observes_each_version_on_its_image(ranker, docker, tmp_path):
    env, state = docker
    proc = run_cli("compat", ranker, "--tf", "2.14", "--serving", "docker", "--json", tmp_path / "c.json", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    row = json.loads((tmp_path / "c.json").read_text())["versions"][0]
    assert row["tf"] == "2.14" and row["served"] == "ok" and row["observed"] is None
    assert row["server"]["image"] == IMAGE and row["server"]["version"] == standins.VERSION  # newest local 2.14.Z
    assert "TF SERVING" in proc.stdout and IMAGE in proc.stdout
    assert standins.containers(state) == []
    missing = run_cli("compat", ranker, "--tf", "2.13", "--serving", "docker", env=env)
    assert missing.returncode == 3 and "docker pull tensorflow/serving:2.13.0" in missing.stderr
    one_image = run_cli("compat", ranker, "--tf", "2.13,2.14", "--serving", "docker:2.14.1", env=env)
    assert one_image.returncode == 2 and "fix:" in one_image.stderr
