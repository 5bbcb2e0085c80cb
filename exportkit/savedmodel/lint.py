"""Static checks of a SavedModel: the one implementation used by `inspect` and `verify`.

Errors mean TF Serving cannot load or run the model; warnings mean it can, but clients or later exports will
likely trip over it. Everything here works on the parsed protobuf and never imports TensorFlow, except the
one-time fill of the registered-op cache (a subprocess, see `registered_ops`).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Iterable, Iterator

from exportkit.savedmodel.checkpoint import format_bytes, saved_model_checkpoint
from exportkit.dtypes import HALF_DTYPES
from exportkit.errors import ExportkitError, UsageError
from exportkit.files import write_atomic
from exportkit.findings import Finding
from exportkit.savedmodel.reader import dtype_name, select_meta_graph, shape_list, signature_names
from exportkit.signature_constants import DEFAULT_SIGNATURE, INIT_OP_SIGNATURE, SERVE_TAG
from exportkit.tfenv import child_env, tensorflow_version

# Ops that run Python in the exporting process: TF Serving (C++) cannot run them.
PY_FUNC_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})
# `saved_model_cli scan`'s default denylist (tensorflow/python/tools/saved_model_cli.py, `_OP_DENYLIST`).
DENYLIST_OPS = frozenset({"WriteFile", "ReadFile", "PrintV2"})
# Ops that reach outside the graph: files, checkpoints, datasets read from disk or the network, summaries,
# debug dumps, printing. verify refuses to execute a graph whose signatures (or load-time initializers) reach
# one of them, unless --allow-io-ops: release CI runs models written by others. The one list, by category.
# Not listed on purpose: Assert (fails, touches nothing); InitializeTableFromTextFile* (how vocabularies in
# assets/ are loaded); the save/restore functions every SavedModel has (only counted when a signature reaches them).
IO_OPS: dict[str, frozenset[str]] = {
    "file system": frozenset({
        "ReadFile", "WriteFile", "MatchingFiles", "MatchingFilesDataset", "ExperimentalMatchingFilesDataset",
        "ImmutableConst", "FileSystemSetConfiguration", "RecordInput", "CalibrationStatisticsSaver"}),
    "checkpoint save/restore": frozenset({
        "Save", "SaveV2", "SaveSlices", "Restore", "RestoreV2", "RestoreSlice", "MergeV2Checkpoints",
        "DTensorRestoreV2"}),
    "dataset or reader on files": frozenset({
        "TFRecordDataset", "TFRecordDatasetV2", "TextLineDataset", "FixedLengthRecordDataset",
        "FixedLengthRecordDatasetV2", "CSVDataset", "CSVDatasetV2", "ExperimentalCSVDataset", "LMDBDataset",
        "ExperimentalLMDBDataset", "SqlDataset", "ExperimentalSqlDataset", "LoadDataset", "SaveDataset",
        "SaveDatasetV2", "DistributedSave", "SnapshotDataset", "SnapshotDatasetV2", "SnapshotDatasetReader",
        "SnapshotNestedDatasetReader", "SnapshotChunkDataset", "ListSnapshotChunksDataset", "DatasetToTFRecord",
        "ExperimentalDatasetToTFRecord", "CacheDataset", "CacheDatasetV2", "TFRecordReader", "TFRecordReaderV2",
        "TextLineReader", "TextLineReaderV2", "FixedLengthRecordReader", "FixedLengthRecordReaderV2",
        "WholeFileReader", "WholeFileReaderV2", "LMDBReader"}),
    "network": frozenset({
        "DataServiceDataset", "DataServiceDatasetV2", "DataServiceDatasetV3", "DataServiceDatasetV4",
        "RegisterDataset", "RegisterDatasetV2", "RpcClient", "RpcCall", "RpcServer", "RpcServerStart",
        "RpcServerRegister", "RpcCheckStatus", "RpcGetValue"}),
    "summary writer": frozenset({
        "CreateSummaryFileWriter", "CreateSummaryDbWriter", "SummaryWriter", "WriteSummary", "WriteScalarSummary",
        "WriteHistogramSummary", "WriteImageSummary", "WriteAudioSummary", "WriteGraphSummary",
        "WriteRawProtoSummary", "ImportEvent", "FlushSummaryWriter", "CloseSummaryWriter",
        "StatsAggregatorSetSummaryWriter"}),
    "debug dump or print": frozenset({
        "Print", "PrintV2", "DebugIdentity", "DebugIdentityV2", "DebugIdentityV3", "DebugNanCount",
        "DebugNumericSummary", "DebugNumericSummaryV2"}),
}
IO_OP_CATEGORY = {op: category for category, ops in IO_OPS.items() for op in ops}
ALLOW_IO_FLAG = "--allow-io-ops"
IO_OP_REFUSAL = (" verify does not execute such a graph (a model written by someone else could read or write files "
                 f"on this machine); pass {ALLOW_IO_FLAG} if you trust the model")
# Protocol-buffer ops read a descriptor file unless told to use the linked-in or inline one.
_PROTO_DESCRIPTOR_OPS = ("DecodeProtoV2", "EncodeProto")
# Keys TF/Keras generate when inputs or outputs are not named: unstable between exports.
AUTO_KEY = re.compile(r"(keras_tensor|args)_\d+")
# Keys Keras/exportkit give the items of a list or tuple the model returns: stable, but only positional.
POSITIONAL_OUTPUT_KEY = re.compile(r"output_\d+")

# Op libraries known by the namespace their ops are registered under (REGISTER_OP("Addons>ParseTime") ...).
# TF Text's and TF-DF's full op lists ship with the registries (exportkit.tfversions.registry.provider).
OP_NAMESPACES = {"TFText>": "tensorflow-text", "Addons>": "tensorflow-addons", "IO>": "tensorflow-io",
                 "Scann>": "scann", "TFRA>": "tensorflow-recommenders-addons",
                 "SimpleML": "tensorflow-decision-forests"}


def op_namespace_package(op: str) -> str | None:
    """The pip package whose op namespace `op` is in ("Addons>ParseTime" -> "tensorflow-addons"), else None."""
    return next((package for prefix, package in OP_NAMESPACES.items() if op.startswith(prefix)), None)


OP_CACHE_ENV = "EXPORTKIT_CACHE_DIR"
_REGISTRY_TIMEOUT_S = 300

_registry_lock = threading.Lock()
_registry: dict[str, frozenset[str] | None] = {}


# ------------------------------------------------------------------------------------- graph traversal
def iter_nodes(meta_graph) -> Iterator[tuple[str | None, object]]:
    """(function name or None for the top-level graph, NodeDef) for every node of the graph and its library.

    The library is flat (nested functions are listed there too), so this reaches every function recursively.
    """
    graph = meta_graph.graph_def
    for node in graph.node:
        yield None, node
    for fdef in graph.library.function:
        for node in fdef.node_def:
            yield fdef.signature.name, node


def library_function_names(meta_graph) -> set[str]:
    return {f.signature.name for f in meta_graph.graph_def.library.function}


def op_counts(meta_graph) -> dict[str, int]:
    """{op type: number of nodes} over the graph and, recursively, its function library; sorted by op name."""
    counts = Counter(node.op for _, node in iter_nodes(meta_graph))
    return dict(sorted(counts.items()))


def _tensor_node(name: str) -> str:
    """`node:0`, `^node`, `node:output:0` (inside functions) -> `node`."""
    return name.lstrip("^").split(":", 1)[0]


def _called_functions(node, library: set[str]) -> Iterator[str]:
    """Library functions a node calls: as its op, or through function-valued attrs (f, then_branch, body, ...)."""
    if not library:
        return  # a TF1 graph without functions: nothing to look for in its (many) attrs
    if node.op in library:
        yield node.op
    for value in node.attr.values():
        if value.HasField("func") and value.func.name in library:
            yield value.func.name
        if value.HasField("list"):
            for func in value.list.func:
                if func.name in library:
                    yield func.name


def root_tensors(meta_graph) -> list[str]:
    """Tensors a loader or a client makes the graph compute: every signature's outputs (the init op's too) and
    the main-op collections. The saver's restore op is not a root: it only reads the model's own variables/."""
    roots = signature_tensors(meta_graph)
    for key in ("saved_model_main_op", "legacy_init_op", "main_op", "table_initializer"):
        if key in meta_graph.collection_def:
            roots += list(meta_graph.collection_def[key].node_list.value)
    return roots


def signature_tensors(meta_graph, served_only: bool = False) -> list[str]:
    """Every signature's output tensors: the init op signature's too, unless `served_only` (what requests compute)."""
    roots = []
    for name, sig in meta_graph.signature_def.items():
        if served_only and name == INIT_OP_SIGNATURE:
            continue
        for info in sig.outputs.values():
            which = info.WhichOneof("encoding")
            if which == "name":
                roots.append(info.name)
            elif which == "coo_sparse":
                roots += [info.coo_sparse.values_tensor_name, info.coo_sparse.indices_tensor_name,
                          info.coo_sparse.dense_shape_tensor_name]
            elif which == "composite_tensor":
                roots += [c.name for c in info.composite_tensor.components if c.WhichOneof("encoding") == "name"]
    return roots


def _load_time_functions(meta_graph) -> list[str]:
    """Functions tf.saved_model.load runs by itself: resources' _create_resource/_initialize (object graph)."""
    graph = meta_graph.object_graph_def
    names = []
    for obj in graph.nodes:
        for child in obj.children:
            if child.local_name in ("_create_resource", "_initialize") and child.node_id < len(graph.nodes):
                target = graph.nodes[child.node_id]
                if target.HasField("function"):
                    names += list(target.function.concrete_functions)
                elif target.HasField("bare_concrete_function"):
                    names.append(target.bare_concrete_function.concrete_function_name)
    return names


def reachable_nodes(meta_graph, roots: Iterable[str] | None = None) -> Iterator[tuple[str | None, object]]:
    """(function or None, NodeDef) for every node that computing `roots` (default: `root_tensors`) may run.

    Top-level graph: the roots' ancestors (data and control inputs). Functions: every node of a function that is
    called (call ops, function-valued attrs such as If/While branches and dataset map functions), recursively.
    """
    graph = meta_graph.graph_def
    by_name = {node.name: node for node in graph.node}
    functions = {f.signature.name: f for f in graph.library.function}
    library = set(functions)
    pending_nodes = [_tensor_node(t) for t in (root_tensors(meta_graph) if roots is None else roots)]
    pending_functions = [] if roots is not None else [f for f in _load_time_functions(meta_graph) if f in library]
    seen_nodes: set[str] = set()
    seen_functions: set[str] = set()
    while pending_nodes or pending_functions:
        if pending_nodes:
            name = pending_nodes.pop()
            node = by_name.get(name)
            if name in seen_nodes or node is None:
                continue
            seen_nodes.add(name)
            yield None, node
            pending_nodes += [_tensor_node(i) for i in node.input]
            pending_functions += list(_called_functions(node, library))
            continue
        fname = pending_functions.pop()
        if fname in seen_functions:
            continue
        seen_functions.add(fname)
        for node in functions[fname].node_def:
            yield fname, node
            pending_functions += list(_called_functions(node, library))


def io_op_nodes(meta_graph) -> dict[str, list[str]]:
    """{op: ["node in function F", ...]} for the I/O ops (IO_OPS) reachable from the signatures."""
    found: dict[str, list[str]] = {}
    for function, node in reachable_nodes(meta_graph):
        op = node.op
        if op in _PROTO_DESCRIPTOR_OPS and "descriptor_source" in node.attr:
            source = node.attr["descriptor_source"].s.decode("utf-8", "replace")
            if source and not source.startswith(("local://", "bytes://")):
                found.setdefault(op, []).append(f"'{node.name}' in {function_label(function)} (descriptor file {source})")
            continue
        if op in IO_OP_CATEGORY:
            found.setdefault(op, []).append(f"'{node.name}' in {function_label(function)}")
    return dict(sorted(found.items()))


def io_op_finding(found: dict[str, list[str]], prefix: str = "") -> Finding | None:
    """One error naming every reachable I/O op (`io_op_nodes`) and where it is; None when there is none."""
    if not found:
        return None
    parts = [f"{op} ({IO_OP_CATEGORY.get(op, 'file system')}) at {few(places)}" for op, places in found.items()]
    return Finding("error", "io-op",
                   f"{prefix}the signatures reach ops that touch files, the network or the console: "
                   f"{'; '.join(parts)}." + IO_OP_REFUSAL)


# ------------------------------------------------------------------------------------- op registry cache
def cache_dir() -> Path:
    """`$EXPORTKIT_CACHE_DIR`, else `${XDG_CACHE_HOME:-~/.cache}/exportkit`."""
    override = os.environ.get(OP_CACHE_ENV)
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "exportkit"


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


# ------------------------------------------------------------------------------------------------ checks
def function_label(function: str | None) -> str:
    return f"function '{function}'" if function else "the top-level graph"


def py_func_findings(nodes: Iterable[tuple[str | None, object]], prefix: str = "") -> list[Finding]:
    """One error per Python-callback op type among `nodes` ((function, node) pairs): the server cannot run them."""
    places: dict[str, list[str]] = {}
    for function, node in nodes:
        if node.op in PY_FUNC_OPS:
            places.setdefault(node.op, []).append(f"{node.name} in {function_label(function)}")
    return [Finding("error", "py-func",
                    f"{prefix}op {op} ({few(where)}) runs Python code; TF Serving cannot run it (the kernel and the "
                    f"Python function live in the process that built the graph, not in tensorflow_model_server); "
                    f"fix: replace tf.py_func/tf.py_function/tf.numpy_function with TensorFlow ops")
            for op, where in sorted(places.items())]


def _op_findings(meta_graph, prefix: str, check_registry: bool, server_registry=None,
                 op_libraries: tuple[str, ...] = ()) -> list[Finding]:
    findings: list[Finding] = []
    reached = io_op_nodes(meta_graph)
    io_finding = io_op_finding(reached, prefix)
    if io_finding is not None:
        findings.append(io_finding)
    findings += py_func_findings(reachable_nodes(meta_graph), prefix)  # a PyFunc no request runs is never run
    denylisted: dict[str, list[str]] = {}
    for function, node in iter_nodes(meta_graph):
        if node.op in DENYLIST_OPS and node.op not in reached:  # reached ones are io-op errors
            denylisted.setdefault(node.op, []).append(function_label(function))

    for op, places in sorted(denylisted.items()):
        findings.append(Finding(
            "warning", "denylisted-op",
            f"{prefix}op {op} (in {few(sorted(set(places)))}) is on saved_model_cli scan's denylist: it touches the "
            f"file system or prints on the server (no signature reaches it now)"))

    if check_registry:
        # This TensorFlow's own registry (a cached subprocess) and, where exportkit ships it, the registry of the
        # stock TF Serving of this version, which adds the TF Text and TF-DF ops tensorflow_model_server links.
        registry = registered_ops()
        if registry is None and server_registry is None:
            findings.append(Finding(
                "warning", "op-registry-unavailable",
                f"{prefix}could not list the ops registered in this TensorFlow, so unregistered ops were not "
                f"checked: make sure `python -c 'import tensorflow'` works"))
            return findings
        known = set(registry or ()) | set(server_registry.names() if server_registry is not None else ())
        server = (f"the stock TF Serving {server_registry.version} ({server_registry.server})"
                  if server_registry is not None else f"TensorFlow {tensorflow_version()}")
        for op, places in unregistered_ops(meta_graph, known).items():
            package = server_registry.provider(op) if server_registry is not None else op_namespace_package(op)
            message = f"{prefix}op '{op}' (in {few(places)}) " + unknown_op_advice(op, server, package)
            if op_libraries:  # the runtimes load them: if none registers the op, the model fails to load there
                findings.append(Finding("warning", "unknown-op", f"{message}. The runtimes load --op-library "
                                        f"{', '.join(op_libraries)} for it; a stock server would refuse the model"))
            else:
                findings.append(Finding("error", "unknown-op", message))
    return findings


def unknown_op_advice(op: str, server: str, package: str | None) -> str:
    """The rest of an unknown-op finding: which server lacks the op, which library has it, what to do."""
    origin = f"; it comes from {package}" if package else ""
    what = f"its library ({package.split()[0]})" if package else "the op's kernel library"
    return (f"is not registered in {server}{origin}: the stock TF Serving fails to load the model. Fix: serve it "
            f"from a tensorflow_model_server built with {what} linked in (SUPPORTED_TENSORFLOW_OPS in "
            f"model_servers/BUILD; verify and serve can run it with --op-library), or replace the op with stock "
            f"TensorFlow ops")


def unregistered_ops(meta_graph, known) -> dict[str, list[str]]:
    """{op: where it is used} for every op of the graph and its function library that is neither in `known` (a
    registry's op names) nor a library function; sorted."""
    functions = library_function_names(meta_graph)
    unknown: dict[str, set[str]] = {}
    for function, node in iter_nodes(meta_graph):
        if node.op and node.op not in functions and node.op not in known:
            unknown.setdefault(node.op, set()).add(function_label(function))
    return {op: sorted(places) for op, places in sorted(unknown.items())}


def few(items: list[str], limit: int = 3) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _signature_findings(meta_graph, prefix: str, names: Iterable[str]) -> list[Finding]:
    findings: list[Finding] = []
    for name in names:
        sig = meta_graph.signature_def[name]
        for key in sorted(sig.inputs):
            info = sig.inputs[key]
            where = f"{prefix}signature '{name}' input '{key}'"
            dtype = dtype_name(info.dtype)
            shape = shape_list(info.tensor_shape) if info.HasField("tensor_shape") else None
            if info.WhichOneof("encoding") == "name" and shape is None:
                findings.append(Finding("warning", "unknown-rank",
                                        f"{where} has unknown rank: clients cannot tell what shape to send; "
                                        f"give the input_signature a shape"))
            elif shape and shape[0] != -1:
                findings.append(Finding("warning", "fixed-batch",
                                        f"{where} has a fixed batch dimension {shape[0]} (shape {shape}): TF Serving "
                                        f"batching and other batch sizes fail; use None as the first dimension"))
            if dtype == "float64":
                findings.append(Finding("warning", "float64-input",
                                        f"{where} is float64: most clients send float32; export a float32 input"))
            if AUTO_KEY.fullmatch(key):
                findings.append(Finding("warning", "auto-key",
                                        f"{where}: key '{key}' was generated and changes between exports; name the "
                                        f"input (keras.Input(name=...) or TensorSpec(name=...))"))
        for key in sorted(sig.outputs):
            info = sig.outputs[key]
            where = f"{prefix}signature '{name}' output '{key}'"
            dtype = dtype_name(info.dtype)
            if dtype in HALF_DTYPES:
                findings.append(Finding("warning", "half-output",
                                        f"{where} is {dtype}: clients usually expect float32 and lose precision; "
                                        f"cast the output to float32 in the serving function"))
            generated = AUTO_KEY.fullmatch(key)
            if generated or POSITIONAL_OUTPUT_KEY.fullmatch(key):
                why = ("was generated and changes between exports" if generated
                       else "only says the output's position in the list the model returns")
                a_dict = "a dict from the serving function" if generated else "a dict"
                findings.append(Finding("warning", "auto-key", f"{where}: key '{key}' {why}; name the outputs (exportkit "
                                                               f"export --output-names a,b,... or return {a_dict})"))
    return findings


def asset_findings(directory: str | Path) -> list[Finding]:
    """Findings on the files beside saved_model.pb: symlinks under assets/ or assets.extra/ that point outside the
    SavedModel (a server reading the asset reads whatever the link names on its machine, or nothing when the model
    is copied), and the checkpoint in variables/ (see `checkpoint_findings`)."""
    return _symlink_findings(directory) + checkpoint_findings(directory)


def _symlink_findings(directory: str | Path) -> list[Finding]:
    root = os.path.realpath(directory)
    findings = []
    for sub in ("assets", "assets.extra"):
        top = os.path.join(directory, sub)
        for dirpath, dirnames, filenames in os.walk(top):
            for name in dirnames + filenames:
                path = os.path.join(dirpath, name)
                if not os.path.islink(path):
                    continue
                target = os.path.realpath(path)
                if os.path.commonpath([root, target]) != root:
                    rel = os.path.relpath(path, directory)
                    findings.append(Finding("warning", "asset-symlink",
                                            f"{rel} is a symlink to {os.readlink(path)}, outside the SavedModel: a "
                                            f"copy of the model loses it and a server reads whatever that path holds "
                                            f"on its machine; copy the file into {sub}/ instead"))
    return findings


def checkpoint_findings(directory: str | Path) -> list[Finding]:
    """An unreadable checkpoint index (error), and tensors stored more than once (warning): every variable when
    Keras 3's `model.export` / ExportArchive wrote it (it tracks each Keras Variable and the tf.Variable inside it
    and the checkpoint writes both, so every loader reads and holds every weight twice), else equal tensors of at
    least 1 MiB."""
    try:
        checkpoint = saved_model_checkpoint(directory)
    except UsageError as err:
        return [Finding("error", "checkpoint-unreadable", f"{err.message}; fix: {err.remedy}")]
    keras = checkpoint.keras_copies() if checkpoint else []
    groups = checkpoint.duplicates() if checkpoint else []
    if not keras and not groups:
        return []
    duplicated = format_bytes(checkpoint.duplicate_bytes())
    if keras:
        what = (f"the checkpoint stores {len(keras)} variable{'s' if len(keras) != 1 else ''} twice: {duplicated} of "
                f"{format_bytes(checkpoint.total_bytes)} are second copies (e.g. {keras[0][0].name} = {keras[0][1].name})")
        why = ("Keras 3's model.export / ExportArchive tracks each Keras Variable and the tf.Variable inside it, "
               "and writes each weight twice")
        fix = "re-export with `exportkit export`, which writes each variable once"
    else:
        copies = sum(len(g) - 1 for g in groups)
        what = (f"the checkpoint stores {copies} tensor{'s' if copies != 1 else ''} of at least 1 MiB more than once: "
                f"{duplicated} of {format_bytes(checkpoint.total_bytes)} are duplicates (e.g. "
                f"{' = '.join(t.name for t in groups[0][:2])})")
        why = "the same values are saved under several names (a variable tracked twice, or tied weights copied)"
        fix = "track each variable once when saving, or re-export with `exportkit export`"
    return [Finding("warning", "duplicate-variables",
                    f"{what}. Why: {why}. Cost: every loader, TF Serving included, reads and holds every copy; "
                    f"fix: {fix}")]


def lint_meta_graph(meta_graph, signature_name: str | None = None, prefix: str = "",
                    check_registry: bool = True, server_registry=None,
                    op_libraries: tuple[str, ...] = ()) -> list[Finding]:
    """Findings for one MetaGraph. With `signature_name`, signature checks cover that signature only.
    `server_registry` (exportkit.tfversions.registry.Registry: `names()`, `provider(op)`, `server`) is the op
    registry of the TF Serving the ops are checked against; None: this TensorFlow's own registry.
    `op_libraries` (--op-library) make unknown ops warnings: the runtimes load them and show whether they run."""
    findings: list[Finding] = []
    available = signature_names(meta_graph)
    if signature_name is not None and signature_name not in available:
        findings.append(Finding(
            "error", "missing-signature",
            f"{prefix}no signature '{signature_name}'; available: {', '.join(available) or 'none'}"))
        names: list[str] = []
    elif signature_name is not None:
        names = [signature_name]
    else:
        names = available
        if not available:
            findings.append(Finding("error", "missing-signature",
                                    f"{prefix}the MetaGraph has no signatures: TF Serving has nothing to serve; "
                                    f"export with signatures"))
        elif DEFAULT_SIGNATURE not in meta_graph.signature_def:
            findings.append(Finding("warning", "no-default-signature",
                                    f"{prefix}no '{DEFAULT_SIGNATURE}' signature (available: {', '.join(available)}): "
                                    f"requests must name a signature"))
    findings.extend(_signature_findings(meta_graph, prefix, names))
    findings.extend(_op_findings(meta_graph, prefix, check_registry, server_registry, op_libraries))
    return findings


def lint_saved_model(saved_model_proto, signature_name: str | None = None, *,
                     check_registry: bool = True, server_registry=None,
                     op_libraries: tuple[str, ...] = ()) -> list[Finding]:
    """All findings for a parsed SavedModel, errors first (stable order within a severity).

    Checks the MetaGraph TF Serving loads (tag `serve`; the first one if none has it). `signature_name`
    restricts the signature checks to that signature and reports `missing-signature` if it is absent.
    `check_registry=False` skips the unregistered-op check (which may need a one-time TensorFlow subprocess).
    """
    graphs = list(saved_model_proto.meta_graphs)
    findings: list[Finding] = []
    if not graphs:
        return [Finding("error", "no-meta-graph", "the SavedModel holds no MetaGraph; export it again")]
    meta_graph = select_meta_graph(saved_model_proto)
    if SERVE_TAG not in meta_graph.meta_info_def.tags:
        tags = ["{" + ",".join(mg.meta_info_def.tags) + "}" for mg in graphs]
        findings.append(Finding("error", "no-serve-tag",
                                f"no MetaGraph is tagged '{SERVE_TAG}' (tag sets: {', '.join(tags)}): TF Serving "
                                f"loads '{SERVE_TAG}' by default; export with tags=['serve']"))
    findings.extend(lint_meta_graph(meta_graph, signature_name, check_registry=check_registry,
                                    server_registry=server_registry, op_libraries=op_libraries))
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(findings, key=lambda f: order.get(f.severity, 3))
