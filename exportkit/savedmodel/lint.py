"""Static checks of a SavedModel: the one implementation used by `inspect` and `verify`.

Errors mean TF Serving cannot load or run the model; warnings mean it can, but clients or later exports will
likely trip over it. Everything here works on the parsed protobuf and never imports TensorFlow: the installed
TensorFlow's op names come from the caller (exportkit.tfversions.installed.registered_ops).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterable

from exportkit.savedmodel.checkpoint import format_bytes, saved_model_checkpoint
from exportkit.dtypes import HALF_DTYPES
from exportkit.errors import UsageError
from exportkit.findings import Finding
from exportkit.savedmodel.graph import function_label, graph_of
from exportkit.savedmodel.reader import dtype_name, select_meta_graph, shape_list
from exportkit.savedmodel.signature_defs import signature_names
from exportkit.signature_constants import DEFAULT_SIGNATURE, SERVE_TAG
from exportkit.tfenv import tensorflow_version

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


# ------------------------------------------------------------------------------------------------ checks
def io_op_nodes(meta_graph) -> dict[str, list[str]]:
    """{op: ["node in function F", ...]} for the I/O ops (IO_OPS) reachable from the signatures."""
    found: dict[str, list[str]] = {}
    graph = graph_of(meta_graph)
    if not (IO_OP_CATEGORY.keys() | set(_PROTO_DESCRIPTOR_OPS)) & graph.op_counts().keys():
        return found  # no such op anywhere: no walk
    for function, node in graph.reachable_nodes():
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


def reachable_py_funcs(graph) -> list[tuple[str | None, object]]:
    """(function, node) of the Python-callback ops the signatures and the loader reach."""
    if not PY_FUNC_OPS & graph.op_counts().keys():
        return []
    return [(function, node) for function, node in graph.reachable_nodes() if node.op in PY_FUNC_OPS]


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


def _op_findings(meta_graph, prefix: str, check_registry: bool, installed_ops=None, server_registry=None,
                 op_libraries: tuple[str, ...] = ()) -> list[Finding]:
    graph = graph_of(meta_graph)
    findings: list[Finding] = []
    reached = io_op_nodes(meta_graph)
    io_finding = io_op_finding(reached, prefix)
    if io_finding is not None:
        findings.append(io_finding)
    findings += py_func_findings(reachable_py_funcs(graph), prefix)  # a PyFunc no request runs is never run
    denylisted: dict[str, list[str]] = {}
    for function, node in graph.iter_nodes() if DENYLIST_OPS & graph.op_counts().keys() else ():
        if node.op in DENYLIST_OPS and node.op not in reached:  # reached ones are io-op errors
            denylisted.setdefault(node.op, []).append(function_label(function))

    for op, places in sorted(denylisted.items()):
        findings.append(Finding(
            "warning", "denylisted-op",
            f"{prefix}op {op} (in {few(sorted(set(places)))}) is on saved_model_cli scan's denylist: it touches the "
            f"file system or prints on the server (no signature reaches it now)"))

    if check_registry:
        # This TensorFlow's own registry (`installed_ops`) and, where exportkit ships it, the registry of the
        # stock TF Serving of this version, which adds the TF Text and TF-DF ops tensorflow_model_server links.
        registry = installed_ops
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
    graph = graph_of(meta_graph)
    ops = {op for op in graph.op_counts() if op and op not in graph.library and op not in known}
    unknown: dict[str, set[str]] = {}
    for function, node in graph.iter_nodes() if ops else ():
        if node.op in ops:
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
                    check_registry: bool = True, installed_ops: frozenset[str] | None = None, server_registry=None,
                    op_libraries: tuple[str, ...] = ()) -> list[Finding]:
    """Findings for one MetaGraph. With `signature_name`, signature checks cover that signature only.
    `installed_ops`: the op names of the installed TensorFlow (exportkit.tfversions.installed.registered_ops).
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
    findings.extend(_op_findings(meta_graph, prefix, check_registry, installed_ops, server_registry, op_libraries))
    return findings


def lint_saved_model(saved_model_proto, signature_name: str | None = None, *,
                     check_registry: bool = True, installed_ops: frozenset[str] | None = None,
                     server_registry=None, op_libraries: tuple[str, ...] = ()) -> list[Finding]:
    """All findings for a parsed SavedModel, errors first (stable order within a severity).

    Checks the MetaGraph TF Serving loads (tag `serve`; the first one if none has it). `signature_name`
    restricts the signature checks to that signature and reports `missing-signature` if it is absent.
    `check_registry=False` skips the unregistered-op check; otherwise ops are checked against `installed_ops` (this
    TensorFlow's, from exportkit.tfversions.installed.registered_ops) and `server_registry`.
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
                                    installed_ops=installed_ops, server_registry=server_registry,
                                    op_libraries=op_libraries))
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(findings, key=lambda f: order.get(f.severity, 3))
