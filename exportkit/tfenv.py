"""Importing TensorFlow quietly, and the only places where global TF state is changed (always restored)."""
from __future__ import annotations

import contextlib
import importlib
import os
import sys


def quiet_env() -> None:
    """Keep TF's C++ log noise out of our output; must run before TensorFlow is imported."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    os.environ.setdefault("ABSL_MIN_LOG_LEVEL", "3")


@contextlib.contextmanager
def _stderr_to_devnull():
    """TF writes a few lines (oneDNN, cpu_feature_guard) straight to fd 2 while importing."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, ValueError, OSError):
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    try:
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)
        os.close(devnull)


def child_env(device: str | None) -> dict:
    """Environment for a worker or server process: no PYTHON* variables (so no user code on its path), TF quiet,
    GPUs hidden unless the device is "gpu"."""
    if device not in (None, "cpu", "gpu"):
        from exportkit.errors import UsageError

        raise UsageError(f"device must be cpu or gpu, got {device!r}", "pass --device cpu or --device gpu")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def tensorflow_version() -> str | None:
    """The installed TensorFlow's version, from package metadata (does not import TensorFlow)."""
    from importlib import metadata

    for dist in ("tensorflow", "tensorflow-cpu", "tensorflow-intel", "tensorflow-macos", "tf-nightly",
                 "tf-nightly-cpu", "tensorflow-aarch64"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def import_tf():
    """Import TensorFlow once, without its start-up chatter."""
    if "tensorflow" in sys.modules and hasattr(sys.modules["tensorflow"], "function"):
        return sys.modules["tensorflow"]
    quiet_env()
    with _stderr_to_devnull():
        import tensorflow as tf
        import keras  # noqa: F401  (its import prints too)
    tf.get_logger().setLevel("ERROR")
    try:
        import absl.logging

        absl.logging.set_verbosity(absl.logging.ERROR)
    except ImportError:
        pass
    return tf


@contextlib.contextmanager
def dtype_policy(name: str | None, package: str = "keras"):
    """Build models under a dtype policy of Keras 3 (`keras`) or tf.keras 2 (`tf_keras`); the previous global
    policy comes back afterwards."""
    if not name:
        yield
        return
    keras = importlib.import_module(package)
    if package == "keras":
        get, set_ = keras.config.dtype_policy, keras.config.set_dtype_policy
    else:
        get, set_ = keras.mixed_precision.global_policy, keras.mixed_precision.set_global_policy
    previous = get()
    set_(name)
    try:
        yield
    finally:
        set_(previous)


@contextlib.contextmanager
def tf32(enabled: bool):
    """TensorFloat-32 on or off for the block (GPU float32 matmuls lose ~1e-3 relative with it on)."""
    tf = import_tf()
    previous = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(enabled)
    try:
        yield
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(previous)
