"""TensorFlow's and TF Serving's generated protobuf modules, imported without importing TensorFlow.

`import tensorflow` costs about 3 s. The generated protobuf modules under `tensorflow/core/...` need only
`google.protobuf`, so they are imported with a throw-away stand-in for the top-level `tensorflow` package
(whose `__init__` is what is slow). The stand-in lives in `sys.modules` only while those modules import and
is removed afterwards, so a later real `import tensorflow` works and even reuses the same message classes.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import sys
import threading
import types

from exportkit.errors import UsageError

_lock = threading.Lock()
_protos: dict[str, types.ModuleType] = {}

_PROTO_MODULES = {
    "saved_model": "tensorflow.core.protobuf.saved_model_pb2",
    "meta_graph": "tensorflow.core.protobuf.meta_graph_pb2",
    "types": "tensorflow.core.framework.types_pb2",
    "tensor_shape": "tensorflow.core.framework.tensor_shape_pb2",
    "graph": "tensorflow.core.framework.graph_pb2",
    "op_def": "tensorflow.core.framework.op_def_pb2",
    "example": "tensorflow.core.example.example_pb2",
    "tensor": "tensorflow.core.framework.tensor_pb2",
    "tensor_bundle": "tensorflow.core.protobuf.tensor_bundle_pb2",
}


def _tensorflow_module_lock():
    """Hold the import system's lock for `tensorflow` so another thread's `import tensorflow` waits for the
    real module instead of picking up the stand-in (CPython's private API; without it, no lock)."""
    try:
        from importlib._bootstrap import _ModuleLockManager  # type: ignore[attr-defined]

        return _ModuleLockManager("tensorflow")
    except Exception:  # pragma: no cover - other Pythons
        return contextlib.nullcontext()


def _import_without_tf(names: list[str]) -> list[types.ModuleType]:
    """Import modules that need only TensorFlow's generated protobuf modules (its *_pb2, TF Serving's APIs) with a
    temporary stand-in for the `tensorflow` package (see module doc)."""
    real = sys.modules.get("tensorflow")
    if (real is not None and not getattr(real, "__exportkit_stub__", False)) or all(n in sys.modules for n in names):
        return [importlib.import_module(name) for name in names]  # TensorFlow (or the modules) already there: free
    spec = importlib.util.find_spec("tensorflow")  # locates the package without executing its __init__
    if spec is None or not spec.submodule_search_locations:
        raise UsageError("TensorFlow is not installed in this Python environment; it is needed to read SavedModels",
                         "pip install tensorflow")
    with _tensorflow_module_lock():
        if "tensorflow" in sys.modules:  # another thread imported the real one meanwhile
            return [importlib.import_module(name) for name in names]
        stub = types.ModuleType("tensorflow")
        stub.__path__ = list(spec.submodule_search_locations)
        stub.__exportkit_stub__ = True
        stub_spec = importlib.machinery.ModuleSpec("tensorflow", None, is_package=True)
        stub_spec.submodule_search_locations = list(spec.submodule_search_locations)
        stub_spec._initializing = True  # other threads treat it as "being imported" and wait on the lock
        stub.__spec__ = stub_spec

        def __getattr__(attr):  # a thread that got hold of the stand-in is handed the real TensorFlow
            if sys.modules.get("tensorflow") is stub or attr.startswith("__"):
                raise AttributeError(attr)
            return getattr(importlib.import_module("tensorflow"), attr)

        stub.__getattr__ = __getattr__
        sys.modules["tensorflow"] = stub
        try:
            return [importlib.import_module(name) for name in names]
        finally:
            # Only the stand-in goes. `tensorflow.core*` are the real (empty) packages and the *_pb2 modules the
            # real modules: a later `import tensorflow` runs the real __init__ and reuses them (same classes).
            if sys.modules.get("tensorflow") is stub:
                del sys.modules["tensorflow"]


def protos() -> dict[str, types.ModuleType]:
    """The generated protobuf modules, keyed `saved_model`, `meta_graph`, `types`, `tensor_shape`, ..."""
    if len(_protos) == len(_PROTO_MODULES):
        return _protos
    with _lock:
        if len(_protos) != len(_PROTO_MODULES):
            _protos.update(zip(_PROTO_MODULES, _import_without_tf(list(_PROTO_MODULES.values()))))
    return _protos


_SERVING_APIS = ("classification_pb2", "get_model_metadata_pb2", "get_model_status_pb2", "inference_pb2",
                 "model_pb2", "model_service_pb2_grpc", "predict_pb2", "prediction_log_pb2",
                 "prediction_service_pb2_grpc", "regression_pb2")


def serving_apis() -> types.SimpleNamespace:
    """TF Serving's API modules (`tensorflow_serving.apis.*`), imported without TensorFlow: a client needs only
    protobuf and gRPC."""
    with _lock:
        modules = _import_without_tf([f"tensorflow_serving.apis.{name}" for name in _SERVING_APIS])
    return types.SimpleNamespace(**dict(zip(_SERVING_APIS, modules)))
