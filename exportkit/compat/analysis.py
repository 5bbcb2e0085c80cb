"""Predicted compatibility: what a TF X.Y server loads and executes, checked against X.Y's registries.

No TensorFlow import. Measured with the TF1 loader of TF 2.12 and 2.21 (the core TF Serving runs), by
editing saved_model.pb files and loading them:

* loading instantiates the top-level graph and every function its nodes call, transitively (the session
  places and inlines the whole graph, save path included): an unknown op there fails the *load*, and so
  does an unknown type-valued attr that changes an input/output type ("expected type int64 != int32").
  Functions nobody calls are never looked at.
* attrs the target's OpDef lacks are silently ignored, whatever their value (`NodeDef mentions attr` is not
  raised by this loader): a warning when the value is not the writer's default (MetaInfoDef's
  stripped_op_list), since its effect is lost.
* executed are the signatures' tensors (and `__saved_model_init_op` / the main op) and the saver's restore
  op, walked back through their inputs and into every function they call (call ops, functional control flow,
  func-valued attrs). Only those nodes need a kernel for their dtypes and allowed dtypes (checked when the
  kernel is made, at run time); the save path (SaveV2, MergeV2Checkpoints, DisableCopyOnRead ...) never runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from exportkit.compat import registry as registries
from exportkit.compat.attrvalue import attr_json
from exportkit.findings import Finding
from exportkit.savedmodel import INIT_OP_SIGNATURE, dtype_name

MAIN_OP_COLLECTIONS = ("saved_model_main_op", "legacy_init_op")
# Ops whose own kernel never runs: call ops are inlined or run through the function runtime, functional
# control flow is lowered to Switch/Merge/Enter/Exit before kernels are created.
NO_KERNEL_NEEDED = frozenset({
    "PartitionedCall", "StatefulPartitionedCall", "If", "StatelessIf", "While", "StatelessWhile", "Case",
    "StatelessCase", "SymbolicGradient", "RemoteCall",
})
TYPE_ATTRS = ("type", "list(type)")
DT_STRING = 7
# Attrs whose loss changes nothing a client sees (VarHandleOp.debug_name, new in 2.15, is on every variable
# TF >= 2.15 writes): an ignored one is an info finding, not a warning.
COSMETIC_ATTRS = frozenset({"debug_name"})
_UNSET = object()


@dataclass
class ServedNode:
    """One node the loader sees. `function` is None for the top-level graph."""

    name: str
    op: str
    function: str | None
    executed: bool  # needs a kernel: on a signature, init or restore path
    serving: bool  # on a signature's path (runs per request, not once at load time)
    attrs: dict  # attr name -> AttrValue message (internal `_` attrs left out)
    types: dict = field(default_factory=dict)  # attr name -> [DataType] for the type-valued attrs it sets

    @property
    def where(self) -> str:
        return f"{self.function}/{self.name}" if self.function else self.name


@dataclass
class CompatResult:
    tf: str
    predicted: str  # ok | warn | fails
    findings: list[Finding] = field(default_factory=list)


def _node_name(tensor: str) -> str:
    return tensor.lstrip("^").split(":")[0]


def _funcs_in(attr_value) -> list[str]:
    kind = attr_value.WhichOneof("value")
    if kind == "func":
        return [attr_value.func.name]
    if kind == "list":
        return [f.name for f in attr_value.list.func]
    return []


def served_nodes(meta_graph) -> list[ServedNode]:
    """Every node the loader instantiates: the top-level graph and the functions it calls, transitively;
    flagged `executed` where a signature, init or restore path reaches them, `serving` on a signature's."""
    graph = meta_graph.graph_def
    top = {node.name: node for node in graph.node}
    library = {f.signature.name: f for f in graph.library.function}

    serving, loading = [], []  # per request / once at load time (init op, restore)
    for key, signature in meta_graph.signature_def.items():
        tensors = list(signature.inputs.values()) + list(signature.outputs.values())
        names = [t.name if t.WhichOneof("encoding") == "name" else t.coo_sparse.values_tensor_name for t in tensors]
        (loading if key == INIT_OP_SIGNATURE else serving).extend(names)
    saver = meta_graph.saver_def
    loading += [saver.restore_op_name, saver.filename_tensor_name]
    for key in MAIN_OP_COLLECTIONS:
        if key in meta_graph.collection_def:
            loading += list(meta_graph.collection_def[key].node_list.value)

    reached: dict[str, bool] = {}  # top-level node -> on a serving path
    executed: dict[str, bool] = {}  # function -> called from a serving path
    for starts, on_serving in ((serving, True), (loading, False)):
        pending = [_node_name(t) for t in starts if t]
        called = []
        while pending:
            name = pending.pop()
            if name in reached or name not in top:
                continue
            reached[name] = on_serving
            pending.extend(_node_name(i) for i in top[name].input)
            called += _calls(top[name], library)
        _close(called, library, executed, on_serving)
    instantiated: dict[str, bool] = {}
    _close([f for node in graph.node for f in _calls(node, library)], library, instantiated, False)

    nodes = [_served(node, None, node.name in reached, reached.get(node.name, False)) for node in graph.node]
    for fname in instantiated:
        nodes += [_served(node, fname, fname in executed, executed.get(fname, False))
                  for node in library[fname].node_def]
    return nodes


def _close(called: list[str], library, seen: dict[str, bool], flag: bool) -> None:
    """Add `called` and every function they call, transitively, to `seen` (first flag wins)."""
    while called:
        fname = called.pop()
        if fname in seen:
            continue
        seen[fname] = flag
        for node in library[fname].node_def:
            called += _calls(node, library)


def _calls(node, library) -> list[str]:
    names = [node.op] if node.op in library else []
    for value in node.attr.values():
        names += [f for f in _funcs_in(value) if f in library]
    return names


def _served(node, function, executed, serving) -> ServedNode:
    attrs = {k: v for k, v in node.attr.items() if not k.startswith("_")}
    types = {k: t for k, t in ((k, _types(v)) for k, v in attrs.items()) if t is not None}
    return ServedNode(node.name, node.op, function, executed, serving, attrs, types)


# ------------------------------------------------------------------------------------------------ checks
def _types(value) -> list[int] | None:
    kind = value.WhichOneof("value")
    if kind == "type":
        return [int(value.type)]
    if kind == "list":
        return [int(t) for t in value.list.type]
    return None


def _type_values(node: ServedNode, op_def: dict) -> dict[str, list[int]]:
    """Type-valued attrs of the node, completed by the target OpDef's defaults (TF adds them on load)."""
    out = {}
    for name, spec in op_def["a"].items():
        if spec["t"] not in TYPE_ATTRS:
            continue
        if name in node.types:
            types = node.types[name]
        elif name in node.attrs:
            types = None  # set, but not to a type: the op's definition changed kind; nothing to match
        else:
            default = spec.get("d")
            types = [default] if isinstance(default, int) else default if isinstance(default, list) else None
        if types is not None:
            out[name] = types
    return out


def _kernel_matches(constraints: list[dict], types: dict[str, list[int]]) -> bool:
    for constraint in constraints:
        if all(name not in types or all(t in allowed for t in types[name]) for name, allowed in constraint.items()):
            return True
    return False


def _host_only(op: str, types: dict[str, list[int]], reg) -> bool:
    """String tensors live in host memory, and ops without a GPU kernel here and in the newest version are
    CPU ops by design (I/O, lookup tables): their CPU placement is no fallback worth a warning."""
    if any(DT_STRING in ts for ts in types.values()):
        return True
    newest = registries.load(registries.available()[-1])
    return not reg.kernels_for(op, "GPU") and not newest.kernels_for(op, "GPU")


def _type_list(types: dict[str, list[int]]) -> str:
    return ", ".join(f"{k}={'/'.join(dtype_name(t) for t in v)}" for k, v in sorted(types.items())) or "no type attrs"


class _Collector:
    """Findings of one version, one per (code, op, detail): a model with 200 Conv2D nodes gets one line."""

    def __init__(self):
        self.groups: dict[tuple, list] = {}

    def add(self, severity, code, op, node: ServedNode, detail: str):
        self.groups.setdefault((severity, code, op, detail), []).append(node.where)

    def findings(self) -> list[Finding]:
        order = {"error": 0, "warning": 1, "info": 2}
        out = []
        for (severity, code, op, detail), nodes in self.groups.items():
            more = f" (and {len(nodes) - 1} more node{'s' if len(nodes) > 2 else ''})" if len(nodes) > 1 else ""
            out.append(Finding(severity, code, f"{detail}{more}", op=op, node=nodes[0]))
        return sorted(out, key=lambda f: (order[f.severity], f.code, f.op or "", f.node or ""))


def check_version(nodes: list[ServedNode], library: set[str], producer_ops: dict, version: str,
                  device: str = "cpu") -> CompatResult:
    """Findings of one TF version for nodes from `served_nodes`; `device` is "cpu" or "gpu"."""
    reg = registries.load(version)
    out = _Collector()
    kernel_memo: dict[tuple, bool] = {}
    dev = device.upper()
    for node in nodes:
        op = node.op
        if op in library:
            continue  # a direct function call: the function's nodes are checked themselves
        op_def = reg.op(op)
        if op_def is None:
            out.add("error", "op-unknown", op, node,
                    f"Op type not registered '{op}' in TF {reg.release}: the model fails to load")
            continue
        for name, value in node.attrs.items():
            if name in op_def["a"]:
                continue
            if attr_json(value) == producer_ops.get(op, {}).get(name, _UNSET):
                continue  # the writer's default: the op behaves the same without it
            if value.WhichOneof("value") == "type" or (value.WhichOneof("value") == "list" and value.list.type):
                out.add("error", "attr-unknown", op, node,
                        f"{op} of TF {reg.release} has no attr '{name}' (a dtype, not the writer's default): its "
                        f"inputs/outputs keep their old types and the model fails to load with a type mismatch")
            else:
                out.add("info" if name in COSMETIC_ATTRS else "warning", "attr-unknown", op, node,
                        f"{op} of TF {reg.release} has no attr '{name}': TF {reg.release} silently ignores it, "
                        f"so what it sets (not the writer's default) has no effect there")
        if not node.executed:
            continue  # dtypes and kernels matter when the kernel is made, which never happens here
        types = _type_values(node, op_def)
        bad = {name: [t for t in ts if t not in op_def["a"][name].get("av", ts)] for name, ts in types.items()}
        bad = {k: v for k, v in bad.items() if v}
        if bad:
            out.add("error", "dtype-unsupported", op, node,
                    f"{op} does not allow {_type_list(bad)} in TF {reg.release}: the model fails at run time "
                    f"(not in the list of allowed values)")
            continue
        if op in NO_KERNEL_NEEDED:
            continue
        key = (op, tuple(sorted((k, tuple(v)) for k, v in types.items())))

        def has_kernel(device: str) -> bool:  # memoized: a graph repeats few (op, dtypes) pairs many times
            if (device, key) not in kernel_memo:
                kernel_memo[device, key] = _kernel_matches(reg.kernels_for(op, device), types)
            return kernel_memo[device, key]

        if has_kernel(dev):
            continue
        if dev == "GPU" and has_kernel("CPU"):
            if not node.serving or _host_only(op, types, reg):
                continue  # placed on the CPU on every GPU server: load-time work, strings, I/O, tables
            out.add("warning", "gpu-fallback", op, node,
                    f"{op} has no GPU kernel for {_type_list(types)} in TF {reg.release}: it runs on the CPU "
                    f"(soft placement), with copies between devices")
        else:
            only = " (only a GPU kernel)" if dev == "CPU" and has_kernel("GPU") else ""
            out.add("error", "no-kernel", op, node,
                    f"No OpKernel was registered to support Op '{op}' on {dev} with {_type_list(types)} in "
                    f"TF {reg.release}{only}: the model fails at run time")
    findings = out.findings()
    predicted = ("fails" if any(f.severity == "error" for f in findings)
                 else "warn" if any(f.severity == "warning" for f in findings) else "ok")
    return CompatResult(tf=version, predicted=predicted, findings=findings)


def producer_defaults(meta_graph) -> dict:
    """{op: {attr: default in attr_json form}} of the TF that wrote the model (MetaInfoDef.stripped_op_list)."""
    out = {}
    for op_def in meta_graph.meta_info_def.stripped_op_list.op:
        out[op_def.name] = {a.name: attr_json(a.default_value) for a in op_def.attr if a.HasField("default_value")}
    return out


def analyze(meta_graph, versions: list[str], device: str = "cpu") -> list[CompatResult]:
    """One CompatResult per version, in the order given."""
    nodes = served_nodes(meta_graph)
    library = {f.signature.name for f in meta_graph.graph_def.library.function}
    producer = producer_defaults(meta_graph)
    return [check_version(nodes, library, producer, v, device) for v in versions]


def oldest_accepted(meta_graph, device: str = "cpu") -> str | None:
    """The oldest supported version from which on every newer one is predicted to work (None: not even the
    newest). Checked newest first, stopping at the first failure (~10 ms of CPU per registry read)."""
    nodes = served_nodes(meta_graph)
    library = {f.signature.name for f in meta_graph.graph_def.library.function}
    producer = producer_defaults(meta_graph)
    oldest = None
    for version in reversed(registries.available()):
        if check_version(nodes, library, producer, version, device).predicted == "fails":
            break
        oldest = version
    return oldest
