"""Managed TensorFlow X.Y environments for the observed runs: `<cache>/tf/X.Y`, one venv per minor version.

Each holds `tensorflow-cpu==X.Y.*` (the C++ core TF Serving X.Y is built on), the op libraries the stock
server links (TF Text, TF-DF: `oplibs.env_requirements`, without their dependencies) and whatever numpy pip picks for
it (TF 2.12 needs numpy < 2); exportkit itself is not installed there: the worker is the standalone script
`exportkit/compat/worker.py`. The version of the TensorFlow this Python imports needs no environment.
An environment is built in a hidden sibling directory and renamed into place once `import tensorflow` works
in it, so an interrupted install leaves nothing half-built behind.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from exportkit.compat import check_version
from exportkit.errors import InfraError, UsageError
from exportkit.lint import cache_dir
from exportkit.tfenv import tensorflow_version

READY = "exportkit-env.json"
WORKER = Path(__file__).with_name("worker.py")


def install_command(version: str) -> str:
    return f"exportkit runtimes install {version}"


def root() -> Path:
    return cache_dir() / "tf"


def env_dir(version: str) -> Path:
    return root() / version


def current_version() -> str | None:
    """The X.Y of the TensorFlow installed next to exportkit (served by this Python, no environment)."""
    full = tensorflow_version()
    return ".".join(full.split(".")[:2]) if full else None


@dataclass
class EnvInfo:
    version: str
    state: str  # "built-in" | "installed" | "absent"
    python: str | None
    tensorflow: str | None  # exact release, e.g. "2.12.1"
    numpy: str | None
    path: str | None
    bytes: int | None


def _python(directory: Path) -> Path:
    return directory / "bin" / "python"


def info(version: str) -> EnvInfo:
    version = check_version(version)
    if version == current_version():
        import numpy

        return EnvInfo(version, "built-in", sys.executable, tensorflow_version(), numpy.__version__, None, None)
    directory = env_dir(version)
    try:
        meta = json.loads((directory / READY).read_text())
    except (OSError, ValueError):
        return EnvInfo(version, "absent", None, None, None, None, None)
    size = sum(f.stat().st_size for f in directory.rglob("*") if f.is_file() and not f.is_symlink())
    return EnvInfo(version, "installed", str(_python(directory)), meta.get("tensorflow"), meta.get("numpy"),
                   str(directory), size)


def list_envs() -> list[EnvInfo]:
    from exportkit.compat import SUPPORTED

    return [info(v) for v in SUPPORTED]


def _progress(message: str) -> None:
    sys.stderr.write(f"exportkit: {message}\n")
    sys.stderr.flush()


def install(version: str, force: bool = False) -> EnvInfo:
    """Create the environment of TF `version` (about a minute and 1.7 GB), showing progress on stderr."""
    version = check_version(version)
    current = info(version)
    if current.state != "absent" and not force:
        return current
    target = env_dir(version)
    root().mkdir(parents=True, exist_ok=True)
    building = root() / f".{version}.building-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    began = time.monotonic()
    _progress(f"creating the TensorFlow {version} environment in {target} (once; about a minute and 1.7 GB)")
    try:
        subprocess.run([sys.executable, "-m", "venv", str(building)],
                       check=True, capture_output=True, text=True)
        python = str(_python(building))
        spec = f"tensorflow-cpu=={version}.*"
        _progress(f"pip install {spec}")
        _pip(python, [spec], version)
        from exportkit.compat.oplibs import env_requirements

        libraries = env_requirements(version)  # the op libraries the stock server links (TF Text, TF-DF)
        if libraries:
            _progress(f"pip install --no-deps {' '.join(libraries)}")
            _pip(python, ["--no-deps", *libraries], version)
        probe = subprocess.run(
            [python, "-I", "-c", "import json, numpy, tensorflow as tf; "
             "print(json.dumps({'tensorflow': tf.__version__, 'numpy': numpy.__version__}))"],
            capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, timeout=300)
        if probe.returncode != 0:
            tail = (probe.stderr.strip().splitlines() or ["no output"])[-1]
            raise InfraError(f"TensorFlow {version} does not import in its new environment: {tail}",
                             f"report it; retry with `{install_command(version)}`")
        meta = json.loads(probe.stdout.strip().splitlines()[-1])
        (building / READY).write_text(json.dumps({**meta, "version": version, "python": sys.version.split()[0]}))
        if target.exists():
            shutil.rmtree(target)
        os.replace(building, target)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    _progress(f"TensorFlow {meta['tensorflow']} (numpy {meta['numpy']}) ready in {time.monotonic() - began:.0f} s")
    return info(version)


def _pip(python: str, requirements: list[str], version: str) -> None:
    """pip install with its progress lines relayed to stderr; a failure (no network, no wheel) is exit 3."""
    command = [python, "-m", "pip", "install", "--progress-bar", "off", "--disable-pip-version-check", *requirements]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    for line in proc.stdout:
        line = line.rstrip()
        if not line or line.startswith("WARNING: Location"):
            continue
        tail = (tail + [line])[-6:]
        if line.startswith(("Collecting", "Downloading", "Installing", "Successfully")):
            _progress(f"  {line[:150]}")
    if proc.wait() != 0:
        reason = next((t for t in reversed(tail) if "ERROR" in t or "Error" in t), tail[-1] if tail else "")
        raise InfraError(f"could not install tensorflow-cpu=={version}.* (pip exit {proc.returncode}): {reason}",
                         f"make PyPI reachable (network, proxy, PIP_INDEX_URL) and run `{install_command(version)}`")


def remove(version: str) -> bool:
    """Delete the environment; False when there was none."""
    version = check_version(version)
    if version == current_version():
        raise UsageError(f"TensorFlow {version} is the one installed next to exportkit, not a managed environment",
                         "nothing to remove; uninstall it with pip if you must")
    directory = env_dir(version)
    if not directory.exists():
        return False
    shutil.rmtree(directory)
    return True


def python_for(version: str, install_missing: bool = True) -> str:
    """The interpreter whose TensorFlow is X.Y, installing its environment on first use."""
    env = info(version)
    if env.state == "absent":
        if not install_missing:
            raise InfraError(f"no TensorFlow {version} environment", f"run `{install_command(version)}`")
        env = install(version)
    return env.python
