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


# tensorflow/lite/python/util.py tries `from jax import jit` for the TFLite converter (which exportkit never runs)
# wherever jax is installed: 1.5 s and 145 MB of every TensorFlow import. Kept out while TensorFlow imports; code
# that imports jax afterwards (a user's) gets it.
_NOT_FOR_TENSORFLOW = ("jax", "jaxlib")


def import_tf():
    """Import TensorFlow once, without its start-up chatter (and without jax: _NOT_FOR_TENSORFLOW)."""
    if "tensorflow" in sys.modules and hasattr(sys.modules["tensorflow"], "function"):
        return sys.modules["tensorflow"]
    quiet_env()
    kept_out = [name for name in _NOT_FOR_TENSORFLOW if name not in sys.modules]
    sys.modules.update(dict.fromkeys(kept_out))
    try:
        with _stderr_to_devnull():
            import tensorflow as tf
    finally:
        for name in kept_out:
            if sys.modules.get(name, False) is None:
                del sys.modules[name]
    with _stderr_to_devnull():
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


# The C++ functions behind tensorflow_model_server's XLA switch (tensorflow/compiler/jit/flags.h), exported by
# libtensorflow_cc; TensorFlow has no Python API for them.
_DISABLE_XLA = "_ZN10tensorflow21DisableXlaCompilationEv"
_FAIL_ON_XLA = "_ZN10tensorflow20FailOnXlaCompilationEv"


def disable_xla_compilation() -> bool:
    """What tensorflow_model_server does unless started with --xla_cpu_compilation_enabled or
    --xla_gpu_compilation_enabled (model_servers/main.cc): afterwards every function that must be compiled by XLA
    fails with "XLA compilation disabled". Process-wide and for good, as in the server, so only a server process
    calls it (there is nothing to restore: it is the process' configuration). False if this TensorFlow build does not
    export the switch (then jit_compile functions still compile here, unlike TF Serving)."""
    import ctypes
    import glob

    tf = import_tf()
    for path in sorted(glob.glob(os.path.join(os.path.dirname(tf.__file__), "libtensorflow_cc.*"))):
        try:
            lib = ctypes.CDLL(path)
            disable, fails = getattr(lib, _DISABLE_XLA), getattr(lib, _FAIL_ON_XLA)
        except (OSError, AttributeError):
            continue
        fails.restype = ctypes.c_bool
        disable()
        return bool(fails())
    return False


def gpu_memory_growth() -> None:
    """Let TensorFlow take GPU memory as it needs it instead of nearly all of it at once, so two TensorFlow processes
    (the in-process Keras run and the GPU worker or server) share one GPU. Only effective before the GPUs are first
    used, and it cannot be undone afterwards (a process-wide setting, like the device list); a no-op without a GPU."""
    tf = import_tf()
    for gpu in tf.config.list_physical_devices("GPU"):
        try:
            tf.config.experimental.set_memory_growth(gpu, True)
        except (RuntimeError, ValueError):
            pass  # already initialized: its memory is allocated the way it was


_BUILD_KEYS = ("is_cuda_build", "cuda_version", "cudnn_version", "is_rocm_build")


def _build_info() -> dict:
    """tf.sysconfig.get_build_info() (CUDA/cuDNN of the wheel), read from its generated module
    tensorflow/python/platform/build_info.py without importing TensorFlow; {} without TensorFlow."""
    import ast
    import importlib.util

    if "tensorflow" in sys.modules and hasattr(sys.modules["tensorflow"], "sysconfig"):
        return dict(sys.modules["tensorflow"].sysconfig.get_build_info())
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or spec.origin is None:
        return {}
    path = os.path.join(os.path.dirname(spec.origin), "python", "platform", "build_info.py")
    try:
        tree = ast.parse(open(path, encoding="utf-8").read())
    except (OSError, SyntaxError):
        return {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], (ast.List, ast.Dict)):
            try:
                return dict(ast.literal_eval(node.args[0]))
            except (ValueError, TypeError):
                return {}
    return {}


def package_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def toolchain(keras_package: str | None = None) -> dict:
    """What computed the results, for the manifest and the verify report: Python, TensorFlow and its build
    (CUDA/cuDNN), and the Keras that loaded the source (`keras_package`: "keras" or "tf_keras"; else the installed
    Kerases and which one tf.keras means)."""
    import platform

    build = _build_info()
    out = {"python": platform.python_version(), "tensorflow": tensorflow_version(),
           "tensorflow_build": {k: build[k] for k in _BUILD_KEYS if k in build}}
    if keras_package:
        out["keras"] = {"package": keras_package, "version": package_version(keras_package)}
    else:
        out["keras"] = {"keras": package_version("keras"), "tf_keras": package_version("tf_keras"),
                        "tf.keras": "tf_keras" if os.environ.get("TF_USE_LEGACY_KERAS") == "1" else "keras"}
    return out
