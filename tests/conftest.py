"""Shared fixtures: one sample build and one export of each sample per session, one way to run the CLI, and one
check that no test leaves a process behind.

Markers (registered in pyproject.toml): `slow` (more than a few seconds: exports, servers, extra processes),
`serving` (starts a gRPC server), `gpu` (needs a GPU to mean anything), `compat` (other TensorFlow versions).
`pytest -m "not slow"` is the quick loop (docs/development.md).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def run_cli(*args, cwd=None, env=None, timeout=300) -> subprocess.CompletedProcess:
    """`python -m exportkit ARGS` in a subprocess, as a user or CI runs it; `env` is added to this environment."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "exportkit", *map(str, args)], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def invoke(*args) -> SimpleNamespace:
    """The CLI in this process (TensorFlow stays imported between calls): exit code, stdout, stderr."""
    from typer.testing import CliRunner

    from exportkit.cli import app

    result = CliRunner().invoke(app, [str(a) for a in args])
    return SimpleNamespace(returncode=result.exit_code, stdout=result.stdout, stderr=result.stderr)


def has_gpu() -> bool:
    from exportkit.tfenv import import_tf

    return bool(import_tf().config.list_physical_devices("GPU"))


# ------------------------------------------------------------------------------------------------ samples
@pytest.fixture(scope="session")
def samples_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("samples")


@pytest.fixture(scope="session")
def sample(samples_dir):
    """sample(name) -> its samples.json entry, building it on first use (the only sample build of the suite)."""
    from sample_models import build_samples

    built: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in built:
            built[name] = build_samples.SAMPLES[name](samples_dir)
        return built[name]

    return get


@pytest.fixture(scope="session")
def exported(sample, tmp_path_factory):
    """exported(name) -> the sample exported once per session by the CLI (self-check included):
    `.proc` (exit code, stdout, stderr), `.base` (the model base directory), `.path` (its version 1).

    Tests must not change these directories; copy them first (shutil.copytree)."""
    root = tmp_path_factory.mktemp("exported")
    done: dict[str, SimpleNamespace] = {}

    def get(name: str) -> SimpleNamespace:
        if name not in done:
            entry = sample(name)
            base = root / name.replace(".", "_")
            proc = invoke("export", entry["path"], "-o", base, *entry["export_args"])
            done[name] = SimpleNamespace(proc=proc, base=base, path=base / "1")
        return done[name]

    return get


def tree_snapshot(path: Path) -> dict:
    """Every file below `path` with its bytes: equal snapshots mean the directory was left untouched."""
    if not path.exists():
        return {}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()} | {
        str(p.relative_to(path)) + "/": b"" for p in sorted(path.rglob("*")) if p.is_dir()}


# ------------------------------------------------------------------------------------------------ processes
SESSION_CHILDREN: set[int] = set()  # pids of session-scoped servers: allowed to outlive the test that started them


def _storage_server(cls, tmp_path_factory):
    """`cls` started; its .env also names a cache of its own (EXPORTKIT_CACHE_DIR), so that what a test mirrors from
    it never lands in the user's cache (~/.cache/exportkit/storage); a test may still set a cache after it."""
    server = cls()
    SESSION_CHILDREN.add(server.proc.pid)
    SESSION_CHILDREN.update(p.pid for p in psutil.Process(server.proc.pid).children(recursive=True))
    server.env["EXPORTKIT_CACHE_DIR"] = str(tmp_path_factory.mktemp(f"{cls.__name__}-cache"))
    return server


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    """A GCS emulator on loopback for the session (tests/storage_servers.py): .endpoint, .env, .bucket(name),
    .upload(local, url), .keys(url)."""
    from tests.storage_servers import GcsServer

    server = _storage_server(GcsServer, tmp_path_factory)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """moto's S3 server on loopback for the session, as gcs_server."""
    from tests.storage_servers import S3Server

    server = _storage_server(S3Server, tmp_path_factory)
    yield server
    server.stop()


@pytest.fixture(scope="session", autouse=True)
def warm_start():
    """Verifies in this process fork their TensorFlow worker from one import (exportkit.warm_start()), as a release
    suite's would; so do the CLI subprocesses (run_cli) and scripts started inside it, whose environment is the
    suite's (EXPORTKIT_WARM_START): a test that changes it gets a fresh worker, as users do."""
    import exportkit

    with exportkit.warm_start():
        yield


@pytest.fixture(autouse=True)
def no_children_left():
    """Every process a test starts (workers, servers, stand-ins) is gone when it ends, on success and failure."""
    from exportkit.runtimes import forkserver

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    warm = forkserver.current()  # a managed TF X.Y environment's fork server starts with its first worker
    allowed = before | SESSION_CHILDREN | (warm.pids() if warm else set())
    new = [p for p in psutil.Process().children(recursive=True) if p.pid not in allowed]
    _, alive = psutil.wait_procs(new, timeout=15)
    left = []
    for process in alive:
        try:
            left.append((process.pid, process.cmdline()))
        except psutil.NoSuchProcess:
            pass
    assert not left, f"child processes left behind: {left}"
