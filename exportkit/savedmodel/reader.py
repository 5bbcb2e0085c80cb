"""Finding and reading SavedModels fast: saved_model.pb is parsed without importing TensorFlow.

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
import os
import re
import sys
import threading
import types
from dataclasses import dataclass
from pathlib import Path

from exportkit.dtypes import canonical
from exportkit.errors import UsageError
from exportkit.savedmodel.graph import graph_of, tensor_info_names
from exportkit.signature_constants import (CLASSIFY_CLASSES, CLASSIFY_METHOD, CLASSIFY_SCORES, INIT_OP_SIGNATURE,
                                           REGRESS_METHOD, REGRESS_OUTPUTS, SERVE_TAG)

SAVED_MODEL_PB = "saved_model.pb"
SAVED_MODEL_PBTXT = "saved_model.pbtxt"

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


# --------------------------------------------------------------------------------------------- protobufs
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


def read_saved_model_proto(path: str | Path):
    """Parse `<dir>/saved_model.pb` (or .pbtxt) into a `tensorflow.SavedModel` message, without importing TF.

    `path` may be a version directory or a model base directory (see `resolve_savedmodel_dir`).
    """
    directory = resolve_savedmodel_dir(path)
    pb = protos()["saved_model"]
    proto = pb.SavedModel()
    binary, text = directory / SAVED_MODEL_PB, directory / SAVED_MODEL_PBTXT
    try:
        if binary.is_file():
            proto.ParseFromString(binary.read_bytes())
        else:
            from google.protobuf import text_format

            text_format.Parse(text.read_text(encoding="utf-8"), proto)
    except Exception as err:  # DecodeError, ParseError, OSError
        raise UsageError(f"cannot parse {binary if binary.is_file() else text}: {type(err).__name__}: {err}",
                         "the file is damaged or not a SavedModel; export the model again") from err
    if not proto.meta_graphs:
        raise UsageError(f"{directory} holds a SavedModel without any MetaGraph", "export the model again")
    return proto


# ------------------------------------------------------------------------------------------- directories
def path_problem(path: str | Path) -> str | None:
    """Why `path` exists as a name but cannot be used as a file or directory (a symlink loop or dangling link, a
    FIFO, a socket, a device, no permission); None when it is usable or simply absent."""
    import errno
    import stat

    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            return f"{path} is a dangling symlink (to {os.readlink(path)})"
        return None
    except OSError as err:
        if err.errno == errno.ELOOP:
            return f"{path} is a symlink loop (it points back to itself)"
        return f"{path} cannot be read: {err.strerror or err}"
    for test, what in ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(st.st_mode):
            return f"{path} is {what}, not a regular file or directory"
    return None


def check_path(path: str | Path, fix: str) -> None:
    """UsageError naming what is wrong with a path that exists but cannot be used (see `path_problem`)."""
    problem = path_problem(path)
    if problem:
        raise UsageError(problem, fix)


def _has_saved_model(directory: Path) -> bool:
    return (directory / SAVED_MODEL_PB).is_file() or (directory / SAVED_MODEL_PBTXT).is_file()


def list_versions(base: str | Path) -> list[int]:
    """Integer-named subdirectories of a model base directory that hold a SavedModel, ascending."""
    base = Path(base)
    versions = []
    try:
        children = list(base.iterdir())
    except OSError:
        return []
    for child in children:
        if child.is_dir() and re.fullmatch(r"\d+", child.name) and _has_saved_model(child):
            versions.append(int(child.name))
    return sorted(versions)


def resolve_savedmodel_dir(path: str | Path) -> Path:
    """The SavedModel directory meant by `path`.

    A version directory (holds saved_model.pb) is returned as is; a model base directory resolves, like TF
    Serving, to its highest integer-named subdirectory that holds saved_model.pb. Anything else is a UsageError.
    """
    p = Path(path).expanduser()
    check_path(p, "pass a SavedModel version or base directory")
    if not p.exists():
        raise UsageError(f"no such file or directory: {p}", "check the path (a SavedModel version or base directory)")
    if p.is_file():
        if p.name in (SAVED_MODEL_PB, SAVED_MODEL_PBTXT):
            return p.parent
        raise UsageError(f"{p} is a file, not a SavedModel directory",
                         "pass the directory that contains saved_model.pb, or its model base directory")
    if _has_saved_model(p):
        return p
    versions = list_versions(p)
    if versions:
        return p / _version_name(p, versions[-1])
    numeric = sorted(c.name for c in p.iterdir() if c.is_dir() and re.fullmatch(r"\d+", c.name))
    for directory in [p] + [p / n for n in sorted(numeric, key=int, reverse=True)]:
        other = other_format(directory)
        if other:
            raise UsageError(*other)
    if numeric:
        raise UsageError(f"{p} has version directories ({', '.join(numeric[:5])}) but none contains saved_model.pb",
                         "the export did not finish or wrote elsewhere; export the model again")
    raise UsageError(f"{p} contains no saved_model.pb and no integer-named version directory with one",
                     "pass a SavedModel version directory (with saved_model.pb) or its base directory "
                     "(models/NAME holding 1/, 2/, ...)")


SESSION_BUNDLE_META = "export.meta"
TFLITE_MODEL = "model.tflite"


def other_format(directory: Path) -> tuple[str, str] | None:
    """(message, fix) when a directory without saved_model.pb holds a model of a format TF Serving does not load
    as a SavedModel: a SessionBundle (`export.meta`; session_bundle/oss/session_bundle_util.cc: "Session Bundle is
    deprecated and removed.") or a TFLite model (`model.tflite`: served only with --prefer_tflite_model)."""
    if (directory / SESSION_BUNDLE_META).is_file():
        return (f"{directory} holds a SessionBundle ({SESSION_BUNDLE_META}), the export format before SavedModel: "
                f"TF Serving refuses it (\"Session Bundle is deprecated and removed.\")",
                "export the model again as a SavedModel (tf.compat.v1.saved_model.Builder, or exportkit export)")
    if (directory / TFLITE_MODEL).is_file():
        return (f"{directory} holds a TFLite model ({TFLITE_MODEL}) and no saved_model.pb: TF Serving serves it only "
                f"with --prefer_tflite_model, and exportkit checks SavedModels only",
                "point exportkit at the SavedModel the TFLite model was converted from")
    return None


@dataclass(frozen=True)
class ModelLocation:
    """Where a served version lives: `base_dir` is None when a non-integer version dir was given directly."""

    base_dir: str | None
    version_dir: str
    version: int
    default_name: str


def resolve_model_path(path: str) -> ModelLocation:
    """A base dir (serve its highest integer version) or a version dir (version = its name if integer, else 1)."""
    version_dir = resolve_savedmodel_dir(path).resolve()
    if version_dir.name.isdigit():
        base = version_dir.parent
        return ModelLocation(str(base), str(version_dir), int(version_dir.name), base.name or "model")
    return ModelLocation(None, str(version_dir), 1, version_dir.name or "model")


def _version_name(base: Path, version: int) -> str:
    """The real name of version `version` (`007` stays `007`)."""
    for child in base.iterdir():
        if child.is_dir() and re.fullmatch(r"\d+", child.name) and int(child.name) == version and _has_saved_model(child):
            return child.name
    return str(version)


# ---------------------------------------------------------------------------------------- MetaGraph choice
def select_meta_graph(saved_model, tags: list[str] | tuple[str, ...] | None = None):
    """The MetaGraph with exactly `tags` (default: the one TF Serving loads, tagged `serve`), else the first."""
    graphs = list(saved_model.meta_graphs)
    wanted = set(tags) if tags else {SERVE_TAG}
    for mg in graphs:
        if set(mg.meta_info_def.tags) == wanted:
            return mg
    if not tags:
        for mg in graphs:
            if SERVE_TAG in mg.meta_info_def.tags:
                return mg
        return graphs[0]
    available = ["{" + ",".join(mg.meta_info_def.tags) + "}" for mg in graphs]
    raise UsageError(f"no MetaGraph with tags {sorted(wanted)}; available: {', '.join(available)}",
                     "pick one of the available tag sets")


# ----------------------------------------------------------------------------------------- dtypes, shapes
def dtype_name(dtype_enum: int) -> str:
    """A DataType enum value by its canonical name (exportkit.dtypes): float32, bfloat16, int64, string, ..."""
    types_pb2 = protos()["types"]
    try:
        return canonical(types_pb2.DataType.Name(int(dtype_enum)))
    except ValueError:
        return f"dtype_{int(dtype_enum)}"


def shape_list(shape_proto) -> list[int] | None:
    """A TensorShapeProto as a list with -1 for unknown dimensions; None when the rank is unknown."""
    if shape_proto is None or shape_proto.unknown_rank:
        return None
    return [int(d.size) if d.size >= 0 else -1 for d in shape_proto.dim]


# -------------------------------------------------------------------------------------------- signatures
def tensor_info_dict(info) -> dict:
    """A TensorInfo as {"dtype", "shape", "name"} (plus "encoding" for sparse/composite tensors)."""
    out = {"dtype": dtype_name(info.dtype),
           "shape": shape_list(info.tensor_shape) if info.HasField("tensor_shape") else None,
           "name": None}
    encoding = info.WhichOneof("encoding")
    if encoding == "name":
        out["name"] = info.name
    elif encoding == "coo_sparse":
        out["name"] = info.coo_sparse.values_tensor_name
        out["encoding"] = "coo_sparse"
    elif encoding == "composite_tensor":
        out["encoding"] = "composite_tensor"
    return out


def serving_api(signature: dict) -> tuple[str, str | None]:
    """(the TF Serving API a client calls this signature with, why not its method's API, or None).

    Classify/Regress for signatures of those methods whose one input takes serialized Examples: TF Serving feeds
    them a DT_STRING tensor (servables/tensorflow/util.cc InputToSerializedExampleTensor; classifier.cc and
    regressor.cc "Expected one input Tensor."), so a float input makes them INVALID_ARGUMENT. Predict answers any
    signature of the three methods (predict_util.cc ValidateSignature), so such a signature is called with it."""
    method = signature.get("method")
    api = {CLASSIFY_METHOD: "Classify", REGRESS_METHOD: "Regress"}.get(method)
    if api is None:
        return "Predict", None
    inputs = signature.get("inputs") or {}
    if len(inputs) != 1:
        return "Predict", f"{api} needs exactly one input (serialized Examples), the signature has {len(inputs)}"
    (key, info), = inputs.items()
    if info.get("dtype") != "string":
        return "Predict", (f"{api} feeds serialized tf.Examples (a string tensor) and input '{key}' is "
                           f"{info.get('dtype')}: TF Serving's {api} refuses it (INVALID_ARGUMENT), Predict answers it")
    return api, None


def serving_api_findings(meta_graph) -> list:
    """What TF Serving's Classify/Regress will do with each classify/regress signature, from its static shapes and
    dtypes: `predict-only` (info) when they cannot call it (serving_api), `api-output` (error) when their answer
    check refuses an output (regressor.cc: [batch] or [batch, 1] float; classifier.cc: [batch, classes] float
    scores, string classes). Unknown dims and ranks are left to the run."""
    from exportkit.findings import Finding

    found = []
    for name, signature in signatures_of(meta_graph).items():
        api, why = serving_api(signature)
        if why:
            found.append(Finding("info", "predict-only", f"signature '{name}': {why}"))
        outputs = signature["outputs"]
        if api == "Regress":
            wants = {REGRESS_OUTPUTS: ("float32", lambda s: len(s) == 1 or (len(s) == 2 and s[1] in (1, -1)),
                                       "[batch_size] or [batch_size, 1]")}
        elif api == "Classify":
            wants = {CLASSIFY_SCORES: ("float32", lambda s: len(s) == 2, "[batch_size, num_classes]"),
                     CLASSIFY_CLASSES: ("string", lambda s: len(s) == 2, "[batch_size, num_classes]")}
        else:
            continue
        for key, (dtype, fits, shape) in wants.items():
            info = outputs.get(key)
            if info is None:
                continue
            bad = []
            if info["dtype"] != dtype:
                bad.append(f"is {info['dtype']}, not {dtype}")
            if info["shape"] is not None and not fits(info["shape"]):
                bad.append(f"has shape {info['shape']}, not {shape}")
            if bad:
                found.append(Finding("error", "api-output", (
                    f"signature '{name}' output '{key}' {' and '.join(bad)}: TF Serving's {api} refuses the model's "
                    f"output (INVALID_ARGUMENT on every request); fix: export it as {api} defines it, or give the "
                    f"signature the predict method")))
    return found


def signature_names(meta_graph, include_internal: bool = False) -> list[str]:
    """Sorted signature keys; `__saved_model_init_op` only with `include_internal`. `meta_graph` may also be any
    collection of signature names (a loaded model's signature map)."""
    names = meta_graph.signature_def if hasattr(meta_graph, "signature_def") else meta_graph
    return sorted(n for n in names if include_internal or n != INIT_OP_SIGNATURE)


def signatures_of(meta_graph, include_internal: bool = False) -> dict:
    """{NAME: {"method", "inputs": {KEY: {"dtype", "shape", "name"}}, "outputs": {...}}}, sorted by name/key.

    Shapes use -1 for unknown dimensions and None for unknown rank; dtypes are numpy-style names.
    """
    result = {}
    for name in signature_names(meta_graph, include_internal):
        sig = meta_graph.signature_def[name]
        result[name] = {
            "method": sig.method_name,
            "inputs": {k: tensor_info_dict(sig.inputs[k]) for k in sorted(sig.inputs)},
            "outputs": {k: tensor_info_dict(sig.outputs[k]) for k in sorted(sig.outputs)},
        }
        if getattr(sig, "defaults", None):  # inputs a request may leave out (TF Serving's predict_util.cc)
            result[name]["defaults"] = sorted(sig.defaults)
    return result


def graph_shape(meta_graph, tensor_name: str | None) -> list[int] | None:
    """The static shape the graph gives a tensor ("node:0"): a Placeholder's `shape` attr, else the node's
    `_output_shapes` (tf.compat.v1 writers add them), else the shape of the variable it is assigned to (a counter's
    `delta`); None when the graph does not say. For TensorInfos without a shape or rank: TF Serving's C++ session
    feeds what the graph accepts, so inputs are generated for that."""
    if not tensor_name:
        return None
    node_name, _, index = tensor_name.lstrip("^").partition(":")
    index = int(index) if index.isdigit() else 0
    graph = graph_of(meta_graph)
    node = graph.node(None, node_name)
    if node is None:
        return None
    shape = None
    if node.op in ("Placeholder", "PlaceholderWithDefault") and "shape" in node.attr:
        shape = shape_list(node.attr["shape"].shape)
    elif "_output_shapes" in node.attr and index < len(node.attr["_output_shapes"].list.shape):
        shape = shape_list(node.attr["_output_shapes"].list.shape[index])
    if shape is None:  # the value an Assign*/AssignAdd* writes into a variable has the variable's shape
        for consumer in meta_graph.graph_def.node:
            if (consumer.op in _VARIABLE_UPDATES and len(consumer.input) > 1
                    and consumer.input[1] in (tensor_name, node_name)):
                variable = graph.node(None, consumer.input[0].lstrip("^").partition(":")[0])
                if variable is not None and "shape" in variable.attr:
                    return shape_list(variable.attr["shape"].shape)
    return shape


_VARIABLE_UPDATES = ("Assign", "AssignAdd", "AssignSub", "AssignVariableOp", "AssignAddVariableOp",
                     "AssignSubVariableOp")


def missing_tensor_findings(meta_graph) -> list:
    """One `missing-tensor` error per signature tensor the graph does not have (see missing_signature_tensors)."""
    from exportkit.findings import Finding

    return [Finding("error", "missing-tensor", (
        f"signature '{signature}' {what} names tensor {tensor!r}, which the graph does not have: TF Serving and "
        f"both TensorFlow loaders refuse the model (\"refers to a Tensor which does not exist\"); fix: export the "
        f"signature from the graph it runs on (a hand-edited or renamed SignatureDef does this)"))
        for signature, what, tensor in missing_signature_tensors(meta_graph)]


def missing_signature_tensors(meta_graph) -> list[tuple[str, str, str]]:
    """(signature, "input KEY" | "output KEY", tensor name) for every TensorInfo that names a tensor the graph does
    not have: both loaders refuse such a model (Session.run: "The name ... refers to a Tensor which does not
    exist"; TF Serving fails its load when it validates signatures)."""
    nodes = graph_of(meta_graph).position
    missing = []
    for name in signature_names(meta_graph):
        sig = meta_graph.signature_def[name]
        for noun, infos in (("input", sig.inputs), ("output", sig.outputs)):
            for key in sorted(infos):
                info = infos[key]
                for tensor in tensor_info_names(info):
                    if tensor and tensor.lstrip("^").partition(":")[0] not in nodes:
                        missing.append((name, f"{noun} {key!r}", tensor))
    return missing
