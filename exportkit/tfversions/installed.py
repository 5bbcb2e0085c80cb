"""The installed TensorFlow's op registry, cached on disk per TensorFlow version (in files.cache_dir()).

Listing TensorFlow's ops needs `import tensorflow` (seconds), so a fresh interpreter does it once per version and
`<cache dir>/ops-<tf version>.json` keeps the answer. `inspect` and `verify` hand it to the lint, which checks the
graph's ops against it and never imports TensorFlow itself.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from pathlib import Path

from exportkit.errors import ExportkitError
from exportkit.files import cache_dir, write_atomic
from exportkit.tfenv import child_env, tensorflow_version

_REGISTRY_TIMEOUT_S = 300

_registry_lock = threading.Lock()
_registry: dict[str, frozenset[str] | None] = {}


def op_cache_path(version: str | None = None) -> Path:
    version = version or tensorflow_version() or "unknown"
    return cache_dir() / f"ops-{re.sub(r'[^A-Za-z0-9_.+-]', '_', version)}.json"


# Runs in a fresh interpreter: TF's C registry after `import tensorflow` holds every op of the core
# libraries and of the kernel libraries TF loads at import time (including tensorflow-plugins).
_REGISTRY_SCRIPT = r"""
import json, os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf
from tensorflow.core.framework import op_def_pb2
from tensorflow.python.client import pywrap_tf_session as c_api
buf = c_api.TF_GetAllOpList()
try:
    op_list = op_def_pb2.OpList()
    op_list.ParseFromString(c_api.TF_GetBuffer(buf))
finally:
    c_api.TF_DeleteBuffer(buf)
names = sorted({op.name for op in op_list.op})
sys.stdout.write(json.dumps({"tensorflow_version": tf.__version__, "ops": names}))
"""


def compute_registered_ops() -> dict:
    """Ask a fresh Python with TensorFlow for its op registry: {"tensorflow_version", "ops": [names]}."""
    # Isolated (-I, no PYTHON* variables) like the serving-equivalent workers: a user's sitecustomize or PYTHONPATH
    # could load custom op libraries and hide an op TF Serving does not have.
    proc = subprocess.run([sys.executable, "-I", "-c", _REGISTRY_SCRIPT], capture_output=True, text=True,
                          env=child_env("cpu"), timeout=_REGISTRY_TIMEOUT_S)
    if proc.returncode != 0:
        tail = (proc.stderr or "").strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"listing TensorFlow's ops failed (exit {proc.returncode}): {tail[0]}")
    data = json.loads(proc.stdout)
    if not data.get("ops"):
        raise RuntimeError("TensorFlow reported no registered ops")
    return data


def registered_ops() -> frozenset[str] | None:
    """Names of every op registered in the installed TensorFlow; None if TensorFlow cannot say.

    Read from `<cache dir>/ops-<tf version>.json`; the first call per TensorFlow version fills it from a
    subprocess (a few seconds) and writes it atomically. Later calls cost a JSON read.
    """
    version = tensorflow_version()
    key = version or "unknown"
    if key in _registry:
        return _registry[key]
    with _registry_lock:
        if key in _registry:
            return _registry[key]
        path = op_cache_path(version)
        ops = None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("ops") and (version is None or data.get("tensorflow_version") == version):
                ops = frozenset(data["ops"])
        except (OSError, ValueError, AttributeError):
            pass
        if ops is None:
            if sys.stderr.isatty():
                sys.stderr.write(f"exportkit: listing the ops TensorFlow {key} registers (once; cached in {path})\n")
            try:
                data = compute_registered_ops()
            except (OSError, RuntimeError, ValueError, subprocess.SubprocessError):
                _registry[key] = None
                return None
            ops = frozenset(data["ops"])
            path = op_cache_path(data.get("tensorflow_version") or version)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(path, json.dumps(data), f"the op cache {path}")
            except (OSError, ExportkitError):
                pass  # a read-only cache dir only costs speed
        _registry[key] = ops
        return ops
