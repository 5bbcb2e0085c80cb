"""Shared fixtures: sample models built once per session, and a CLI runner that runs the real program."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def run_cli(*args, cwd=None, env=None, timeout=300) -> subprocess.CompletedProcess:
    """`python -m exportkit ARGS` in a subprocess, as a user or CI runs it."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "exportkit", *map(str, args)], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def invoke(*args) -> SimpleNamespace:
    """The CLI in this process (TensorFlow stays imported between calls): exit code, stdout, stderr."""
    from typer.testing import CliRunner

    from exportkit.cli import app

    result = CliRunner().invoke(app, [str(a) for a in args])
    return SimpleNamespace(returncode=result.exit_code, stdout=result.stdout, stderr=result.stderr)


@pytest.fixture(scope="session")
def samples_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("samples")


@pytest.fixture(scope="session")
def sample(samples_dir):
    """sample(name) -> its samples.json entry, building it on first use."""
    from sample_models import build_samples

    built: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in built:
            built[name] = build_samples.SAMPLES[name](samples_dir)
        return built[name]

    return get


def tree_snapshot(path: Path) -> dict:
    """Every file below `path` with its bytes: equal snapshots mean the directory was left untouched."""
    if not path.exists():
        return {}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()} | {
        str(p.relative_to(path)) + "/": b"" for p in sorted(path.rglob("*")) if p.is_dir()}
