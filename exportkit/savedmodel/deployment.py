"""What a real TF Serving deployment does to a graph that no local run can show. No TensorFlow import.

Files outside the SavedModel. TF Serving loads through TensorFlow's SavedModel loader (saved_model_bundle_factory ->
LoadSessionBundleOrSavedModelBundle -> tensorflow/cc/saved_model/loader.cc), which feeds each AssetFileDef's tensor
with `<export dir>/assets/<filename>` when it runs the restore and init ops (tf.compat.v1's loader_impl.py
`get_asset_tensors` does the same in Python: MetaGraphDef.asset_file_def, else the `saved_model_assets` collection); TF Serving itself rewrites no other path (servables/tensorflow/ reads
only assets.extra/). A path that is a constant in the graph reaches the op as written: on the build machine the file
is there and every local runtime passes; in a container or on another host it is not, and the model fails to load
(a table initializer, run by the init op) or fails its requests (ReadFile, a dataset, on a signature's path).

XLA. Unless started with --xla_cpu_compilation_enabled or --xla_gpu_compilation_enabled, tensorflow_model_server
calls DisableXlaCompilation() (model_servers/main.cc), on CPU and GPU builds alike, and from then on every XLA
compilation fails: DeviceCompiler::CompileImpl returns Internal "XLA compilation disabled" for any cache entry not
yet compiled when FailOnXlaCompilation() (tensorflow/compiler/jit/device_compiler.h, flags.cc). Three things
compile: a function marked `_XlaMustCompile` (tf.function(jit_compile=True)), the nodes a TF1 jit_scope marks
`_XlaCompile` (clustered into _XlaCompile/_XlaRun), and the tf2xla ops `Xla*` (XlaCallModule, which jax2tf and
Keras 3's JAX-backend export write, XlaDot, XlaConv, ...): their CPU and GPU kernel is XlaCompileOnDemandOp
(tensorflow/compiler/jit/xla_ops_on_regular_devices.cc; XlaCallModule's XLA kernel,
tensorflow/compiler/tf2xla/kernels/xla_call_module_op.cc, lowers the StableHLO module it holds), and the Xla*
ops without one run only inside a compiled cluster. Measured with TF 2.21's TF1 loader after
DisableXlaCompilation(), for each of the three: the model loads, Session.run fails.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass

from exportkit.findings import Finding
from exportkit.savedmodel.graph import Graph, data_inputs, function_label, graph_of, signature_tensors, tensor_node
from exportkit.savedmodel.lint import few
from exportkit.options.server_flags import STOCK, ServerFlags

# Op -> index of its file-name input. Tables read at load time; files and datasets while a request runs.
FILENAME_INPUTS = {
    "InitializeTableFromTextFile": 1, "InitializeTableFromTextFileV2": 1, "ReadFile": 0, "MatchingFiles": 0,
    "TextLineDataset": 0, "TFRecordDataset": 0, "TFRecordDatasetV2": 0, "FixedLengthRecordDataset": 0,
    "FixedLengthRecordDatasetV2": 0, "CSVDataset": 0, "CSVDatasetV2": 0, "ExperimentalCSVDataset": 0,
    "MatchingFilesDataset": 0, "ExperimentalMatchingFilesDataset": 0, "LMDBDataset": 0, "ExperimentalLMDBDataset": 0,
    "LoadDataset": 0,
}
# Readers (WholeFileReader, TFRecordReader, ...) take file names from a queue (input 1) that enqueue ops fill.
READER_OPS = frozenset({"ReaderRead", "ReaderReadV2", "ReaderReadUpTo", "ReaderReadUpToV2"})
ENQUEUE_OPS = frozenset({"QueueEnqueue", "QueueEnqueueV2", "QueueEnqueueMany", "QueueEnqueueManyV2"})
# Ops that read a file named by an attr (protocol-buffer descriptors; local:// and bytes:// are not files).
FILENAME_ATTRS = {"DecodeProtoV2": "descriptor_source", "EncodeProto": "descriptor_source"}
_NOT_FILES = ("local://", "bytes://")
READ_OPS = frozenset(FILENAME_INPUTS) | READER_OPS | frozenset(FILENAME_ATTRS)
# Ops that hand their input on unchanged (PlaceholderWithDefault: unless a client feeds it, which none does here).
PASS_THROUGH = frozenset({"Identity", "IdentityN", "StopGradient", "Snapshot", "PlaceholderWithDefault",
                          "EnsureShape"})
VARIABLE_OPS = frozenset({"VarHandleOp", "VariableV2", "Variable"})
ASSIGN_OPS = frozenset({"AssignVariableOp", "Assign"})
XLA_ATTR = "_XlaMustCompile"  # set by tf.function(jit_compile=True) on the function and its call
XLA_SCOPE_ATTR = "_XlaCompile"  # set by tf.xla.experimental.jit_scope (TF1 graphs) on each op in the scope
XLA_OPS = ("Xla", "_Xla")  # the tf2xla op namespace (tensorflow/compiler/tf2xla/ops/xla_ops.cc)
_REMOTE = ("gs://", "s3://", "hdfs://", "http://", "https://")
_DT_STRING = 7
_MAX_DEPTH = 64  # calls followed back from a file-name input; TensorFlow's own nesting is a handful


@dataclass(frozen=True)
class FileRead:
    """A file the graph reads: `asset` (fed by the loader with assets/<asset>) or a literal `path` in the graph."""

    op: str
    node: str  # "function/node" inside a function
    when: str  # "load" (the init op: tables) | "request" (a signature's path)
    path: str | None = None
    asset: str | None = None
    owner: str | None = None  # who holds it: the node's name scope (a layer) in its function's object path (TF2)

    @property
    def outside(self) -> bool:
        return self.path is not None

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


LEGACY_ASSETS_COLLECTION = "saved_model_assets"  # tensorflow/python/saved_model/constants.py ASSETS_KEY


def asset_file_defs(meta_graph) -> list:
    """The AssetFileDefs the loader feeds: MetaGraphDef.asset_file_def, else (older SavedModels) the Any protos of
    the `saved_model_assets` collection, as loader_impl.get_asset_tensors reads them."""
    if meta_graph.asset_file_def or LEGACY_ASSETS_COLLECTION not in meta_graph.collection_def:
        return list(meta_graph.asset_file_def)
    from exportkit.savedmodel.protos import protos

    found = []
    for value in meta_graph.collection_def[LEGACY_ASSETS_COLLECTION].any_list.value:
        info = protos()["meta_graph"].AssetFileDef()
        if value.Unpack(info):
            found.append(info)
    return found


class _FileNames:
    """Follows a file-name tensor back through identities, variables and function calls to where it comes from."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.meta_graph = graph.meta_graph
        self.assets = {info.tensor_info.name.split(":")[0]: info.filename for info in asset_file_defs(self.meta_graph)}

    def owner(self, function: str | None, node) -> str | None:
        """The node's name scope (a Keras layer's name, e.g. `functional_1/vocab`) in the object-graph path of its
        function (e.g. `root.serve`, `root.table._initialize`): who captured the path."""
        parts = [node.name.rpartition("/")[0], self.graph.object_path(function)]
        return " in ".join(p for p in parts if p) or None

    def sources(self, function: str | None, ref: str, depth: int = 0) -> list[tuple[str, str]]:
        """Where a string tensor comes from: ("path", literal) | ("asset", filename) | ("fed", placeholder) |
        ("computed", node): constants, assets and placeholders followed back through identities and calls."""
        name, _, rest = ref.lstrip("^").partition(":")
        if depth > _MAX_DEPTH:
            return [("computed", name)]
        if function is not None and not rest and name in self.graph.args(function):
            return self._argument(function, self.graph.args(function).index(name), depth)
        node = self.graph.node(function, name)
        if node is None:
            return []
        if function is None and name in self.assets:
            # The loader feeds any asset tensor, a Const too: tf.compat.v1's SavedModelBuilder records the Const
            # holding the path as written (tensorflow/cc/saved_model/loader.cc AddAssetsTensorsToInputs).
            return [("asset", self.assets[name])]
        if node.op == "Const":
            tensor = node.attr["value"].tensor
            if tensor.dtype != _DT_STRING:
                return [("computed", name)]
            return [("path", s.decode("utf-8", "replace")) for s in tensor.string_val]
        if node.op == "Placeholder" and function is None:
            return [("fed", name)]
        if node.op == "ReadVariableOp" and node.input:
            return self.sources(function, node.input[0], depth + 1)
        if node.op in VARIABLE_OPS:  # TF2 saves an asset's path as a variable the init op assigns the fed path to
            return [found for value in self._assigned(function, name) for found in self.sources(function, value, depth + 1)]
        if node.op in PASS_THROUGH:
            data = data_inputs(node)
            index = int(rest.rpartition(":")[2] or 0) if node.op == "IdentityN" and rest else 0
            return self.sources(function, data[index], depth + 1) if index < len(data) else []
        return [("computed", name)]

    def _assigned(self, function: str | None, variable: str) -> list[str]:
        """The values assigned to `variable` (AssignVariableOp / Assign in the same graph or function)."""
        nodes = self.graph.function_nodes(function)
        return [data[1] for data in (data_inputs(n) for n in nodes.values() if n.op in ASSIGN_OPS)
                if len(data) > 1 and data[0].partition(":")[0] == variable]

    def enqueued(self, function: str | None, queue: str) -> list[tuple[str, str]]:
        """What the enqueue ops of the same graph put into `queue`: a reader's file names."""
        nodes = self.graph.function_nodes(function)
        name = tensor_node(queue)
        found = []
        for node in nodes.values():
            data = data_inputs(node)
            if node.op in ENQUEUE_OPS and data and data[0].partition(":")[0] == name:
                found += [source for component in data[1:] for source in self.sources(function, component)]
        return found

    def _argument(self, function: str, index: int, depth: int) -> list[tuple[str, str]]:
        callers = self.graph.callers(function)
        if callers:
            found = []
            for where, node in callers:
                data = data_inputs(node)
                if index < len(data):
                    found += self.sources(where, data[index], depth + 1)
            return found
        return self._bound_input(function, index)

    def _bound_input(self, function: str, index: int) -> list[tuple[str, str]]:
        """tf.saved_model.load binds a function's captured inputs (its last arguments) to objects: an asset, whose
        file the loader takes from assets/, or a constant, a node of the top-level graph."""
        graph = self.meta_graph.object_graph_def
        saved = graph.concrete_functions.get(function)
        if saved is None:
            return []
        bound = list(saved.bound_inputs)
        position = index - (len(self.graph.args(function)) - len(bound))
        if not 0 <= position < len(bound) or bound[position] >= len(graph.nodes):
            return []
        obj = graph.nodes[bound[position]]
        kind = obj.WhichOneof("kind")
        if kind == "asset":
            defs = self.meta_graph.asset_file_def
            i = obj.asset.asset_file_def_index
            return [("asset", defs[i].filename)] if i < len(defs) else []
        if kind == "constant":
            return self.sources(None, obj.constant.operation)
        return []


def file_reads(meta_graph) -> list[FileRead]:
    """Every file a loader or a request makes the graph read, where TensorFlow can tell the name without running it:
    table initializers, ReadFile, file datasets, descriptor files, whose file name is an asset or a constant."""
    graph = graph_of(meta_graph)
    if not READ_OPS & graph.op_counts().keys():
        return []  # the common case: no reachability walk
    names = _FileNames(graph)
    on_request = {(f, n.name) for f, n in graph.reachable_nodes(signature_tensors(meta_graph, served_only=True))}
    reads: list[FileRead] = []
    seen = set()
    for function, node in graph.reachable_nodes():
        if node.op not in READ_OPS:
            continue
        where = f"{function}/{node.name}" if function else node.name
        when = "request" if (function, node.name) in on_request else "load"
        if node.op in FILENAME_INPUTS:
            data = data_inputs(node)
            index = FILENAME_INPUTS[node.op]
            found = names.sources(function, data[index]) if index < len(data) else []
        elif node.op in READER_OPS and len(node.input) > 1:
            found = names.enqueued(function, node.input[1])
        elif node.op in FILENAME_ATTRS and FILENAME_ATTRS[node.op] in node.attr:
            value = node.attr[FILENAME_ATTRS[node.op]].s.decode("utf-8", "replace")
            found = [("path", value)] if value and not value.startswith(_NOT_FILES) else []
        else:
            continue
        for kind, value in found:
            if kind not in ("path", "asset") or (where, kind, value) in seen:
                continue
            seen.add((where, kind, value))
            reads.append(FileRead(node.op, where, when, path=value if kind == "path" else None,
                                  asset=value if kind == "asset" else None, owner=names.owner(function, node)))
    return reads


EXTERNAL_FILE_FIX = ("fix: ship the file inside the SavedModel as an asset: in TF2 give tf.lookup.TextFileInitializer "
                     "(or tf.saved_model.Asset) the path as a Python string on a tracked object, so the save copies it "
                     "into assets/; with tf.compat.v1's SavedModelBuilder pass add_meta_graph_and_variables(..., "
                     "assets_collection=tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.ASSET_FILEPATHS)); a file a "
                     "layer reads per request (tf.io.read_file, a file dataset): read it once in Python when the layer "
                     "is built, or hand the path over as a tf.saved_model.Asset the layer tracks")


def external_file_message(read: FileRead) -> tuple[str, str]:
    """(severity, why): an absolute or relative path is an error, a remote URL a warning."""
    path = read.path or ""
    held = f" (held by {read.owner})" if read.owner else ""
    what = f"{read.op} '{read.node}'{held} reads '{path}' {'at load time' if read.when == 'load' else 'on every request'}"
    fails = ("fails to load the model" if read.when == "load" else "fails those requests")
    if path.startswith(_REMOTE):
        return "warning", (f"{what}: a remote file, not part of the SavedModel; the model works only where the server "
                           f"can reach it and only while it stays unchanged. {EXTERNAL_FILE_FIX}")
    kind = ("an absolute path on the machine that wrote the model" if os.path.isabs(path) else
            "a relative path, resolved against the server's working directory")
    return "error", (f"{what}: {kind}, outside the SavedModel's assets/. TF Serving's loader feeds only the "
                     f"SavedModel's assets with <export dir>/assets/<file> (AssetFileDef; tensorflow/cc/saved_model/"
                     f"loader.cc), so a server in a container or on another host, where '{path}' does not exist, "
                     f"{fails}; the local runtimes pass only because this machine has the file. {EXTERNAL_FILE_FIX}")


def file_findings(reads: list[FileRead], prefix: str = "", directory=None) -> list[Finding]:
    """One `external-file` finding per literal path a graph reads; with the SavedModel's `directory`, a
    `missing-asset` error per asset the loader would feed from assets/ that is not there."""
    findings = []
    for read in reads:
        if read.outside:
            severity, message = external_file_message(read)
            findings.append(Finding(severity, "external-file", prefix + message, op=read.op, node=read.node))
        elif directory is not None and not os.path.isfile(os.path.join(directory, "assets", read.asset)):
            findings.append(Finding(
                "error", "missing-asset",
                f"{prefix}{read.op} '{read.node}' reads the asset {read.asset}, and assets/{read.asset} is not in the "
                f"SavedModel: every server, TF Serving included, fails to load it (NotFound); fix: copy the file "
                f"into assets/ or export again", op=read.op, node=read.node))
    return findings


@dataclass(frozen=True)
class XlaUse:
    """Something a request or the loader runs that XLA must compile: `what` (an op, or the attr that marks a
    function or node) at `where` (a function label, or a node in it)."""

    what: str
    where: str
    kind: str  # "jit_compile" | "jit_scope" | "op"


def xla_uses(meta_graph, directory=None) -> list[XlaUse]:
    """What a signature or the init op reaches that must be compiled by XLA, one per function or op. `directory`
    (the SavedModel's) lets the file's bytes say whether any node has a jit_scope attr."""
    graph = graph_of(meta_graph)
    functions = graph.functions
    marked = any(XLA_ATTR in f.attr for f in functions.values())  # jit_compile marks the FunctionDef too
    ops = any(op.startswith(XLA_OPS) for op in graph.op_counts())
    scoped = _mentions_scope(graph, directory)
    if not (marked or ops or scoped):
        return []  # the common case: no reachability walk
    found: dict[tuple, XlaUse] = {}
    for function, node in graph.reachable_nodes():
        where = f"'{node.name}' in {function_label(function)}"
        if ops and node.op.startswith(XLA_OPS):
            found.setdefault((node.op, function), XlaUse(node.op, where, "op"))
        if not (marked or (scoped and XLA_SCOPE_ATTR in node.attr)):
            continue
        if XLA_SCOPE_ATTR in node.attr and _true(node.attr[XLA_SCOPE_ATTR]):
            found.setdefault((XLA_SCOPE_ATTR, function), XlaUse(XLA_SCOPE_ATTR, where, "jit_scope"))
        callee = node.attr["f"].func.name if "f" in node.attr else node.op
        if XLA_ATTR in node.attr and _true(node.attr[XLA_ATTR]) and callee:
            found.setdefault((XLA_ATTR, callee), XlaUse(XLA_ATTR, function_label(callee), "jit_compile"))
        if function is not None and XLA_ATTR in functions[function].attr and _true(functions[function].attr[XLA_ATTR]):
            found.setdefault((XLA_ATTR, function), XlaUse(XLA_ATTR, function_label(function), "jit_compile"))
    return list(found.values())


def _mentions_scope(graph: Graph, directory) -> bool:
    """Whether a node has `_XlaCompile`: searching saved_model.pb's bytes costs a tenth of asking every NodeDef
    (a million nodes: 0.17 s against 1.6 s), which only a graph without its file pays."""
    for name in ("saved_model.pb", "saved_model.pbtxt") if directory is not None else ():
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                return XLA_SCOPE_ATTR.encode() in f.read()
    return any(XLA_SCOPE_ATTR in node.attr for _, node in graph.iter_nodes())


def _true(value) -> bool:
    return value.WhichOneof("value") == "b" and value.b


_XLA_WHAT = {"jit_compile": "tf.function(jit_compile=True)", "jit_scope": "tf.xla.experimental.jit_scope"}
_XLA_OP_ORIGIN = {"XlaCallModule": "a JAX program: jax2tf, or Keras 3's export on the JAX backend",
                  "XlaDynamicUpdateSlice": "keras.ops.slice_update on the TensorFlow backend writes it"}
XLA_FLAG_FIX = ("start tensorflow_model_server with --xla_cpu_compilation_enabled=true and say so to export, verify "
                "and compat (--server-flag xla_cpu_compilation_enabled=true)")
_XLA_AVOID = {"jit_compile": "export the serving function without jit_compile=True",
              "jit_scope": "build the graph without tf.xla.experimental.jit_scope",
              "XlaCallModule": "for a Keras 3 model, export its .keras file with exportkit export, which exports "
                               "on the TensorFlow backend (no XlaCallModule; Keras' export on the JAX backend writes "
                               "one even with jax2tf_kwargs native_serialization=False)",
              "XlaDynamicUpdateSlice": "write the update without keras.ops.slice_update (e.g. with "
                                       "keras.ops.concatenate of the slices, or keras.ops.scatter_update)"}


def _xla_use_text(use: XlaUse) -> str:
    if use.kind == "op":
        origin = _XLA_OP_ORIGIN.get(use.what, "a tf2xla op, compiled on demand")
        return f"{use.what} {use.where} ({origin})"
    return f"{use.where} ({_XLA_WHAT[use.kind]}: {use.what})"


def xla_findings(meta_graph, flags: ServerFlags = STOCK, prefix: str = "", directory=None) -> list[Finding]:
    """An error under the stock flags (XLA disabled), an info finding when the server is said to enable it."""
    uses = xla_uses(meta_graph, directory)
    if not uses:
        return []
    what = f"{prefix}the signatures need XLA compilation: {few([_xla_use_text(u) for u in uses])}"
    first = uses[0]
    if flags.xla_enabled:
        return [Finding("info", "xla-jit", f"{what}; the server runs with {flags.describe()}, so it compiles them at "
                                           f"their first request (a slow first request; warm-up hides it)",
                        op=first.what, node=first.where)]
    avoid = [_XLA_AVOID[k] for k in dict.fromkeys(u.what if u.kind == "op" else u.kind for u in uses) if k in _XLA_AVOID]
    fix = f"fix: {XLA_FLAG_FIX}" + (f", or {'; or '.join(avoid)}" if avoid else "")
    return [Finding("error", "xla-jit", f"{what}: the stock tensorflow_model_server, CPU or GPU, calls "
                                        f"DisableXlaCompilation() unless started with --xla_cpu_compilation_enabled or "
                                        f"--xla_gpu_compilation_enabled (model_servers/main.cc), and then every request "
                                        f"fails with 'XLA compilation disabled' (with warm-up records, the load "
                                        f"fails). {fix}", op=first.what, node=first.where)]


# The verdict's sentence per error code: what the real server does, which no local runtime shows.
VERDICTS = {
    "external-file": "the real TF Serving elsewhere (a container, another host) cannot load it: it reads files from "
                     "outside the SavedModel",
    "xla-jit": "the stock TF Serving answers its requests with 'XLA compilation disabled' (unless the deployment runs "
               "--xla_cpu_compilation_enabled: say so with --server-flag)",
}


def deployment_findings(meta_graph, flags: ServerFlags = STOCK, prefix: str = "", directory=None) -> list[Finding]:
    """Files outside the SavedModel (and missing assets, given its `directory`), XLA under the server flags."""
    return file_findings(file_reads(meta_graph), prefix, directory) + xla_findings(meta_graph, flags, prefix, directory)
