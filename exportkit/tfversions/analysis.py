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
* every instantiated NodeDef is validated against its OpDef as TensorFlow's ValidateNodeDef does (required
  attrs present, attr values of the attr's kind, list lengths and minimums, the number of inputs), and
  functions that call each other in a cycle are refused ("cyclic dependency between functions").
* devices: TF Serving's session config sets no soft placement (server.cc / the bundle factory never set
  allow_soft_placement; ConfigProto's default is false), and the session places the whole top-level graph when
  the loader first runs it (the restore op), so a node pinned to /device:GPU:N anywhere in it makes a CPU server
  refuse the model. Inside a tf.function the pin is soft (measured: the call op's config_proto allows it).
  On a GPU server, an op without a GPU kernel runs on the CPU: a warning, unless the op lives on the host by
  design (strings, I/O, tables, datasets, resource handles).

The nodes are grouped by what the checks look at (op, attrs, input count, device, path), so a graph of a
million nodes costs one pass to group and then one check per distinct group and version.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from exportkit.tfversions import SUPPORTED
from exportkit.tfversions import registry as registries
from exportkit.tfversions.attrvalue import attr_json
from exportkit.savedmodel.deployment import deployment_findings
from exportkit.findings import Finding
from exportkit.savedmodel.graph import graph_of, tensor_info_names
from exportkit.savedmodel.lint import IO_OP_CATEGORY, py_func_findings, reachable_py_funcs
from exportkit.savedmodel.reader import dtype_name
from exportkit.savedmodel.signature_defs import missing_tensor_findings
from exportkit.signature_constants import INIT_OP_SIGNATURE
from exportkit.options.server_flags import STOCK, ServerFlags

# The collections the TF1 loader runs after the restore (cc/saved_model/loader.cc RunMainOp: the main op, else the
# legacy init op); lint reads more as roots (savedmodel.graph.MAIN_OP_COLLECTIONS).
LOADER_MAIN_OPS = ("saved_model_main_op", "legacy_init_op")
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
    """Nodes the loader sees that the checks cannot tell apart (same op, attrs, input count, device and path);
    `where` names the first, `count` says how many. `function` is None for the top-level graph."""

    name: str
    op: str
    function: str | None
    executed: bool  # needs a kernel: on a signature, init or restore path
    serving: bool  # on a signature's path (runs per request, not once at load time)
    attrs: dict  # attr name -> AttrValue message (internal `_` attrs left out)
    types: dict = field(default_factory=dict)  # attr name -> [DataType] for the type-valued attrs it sets
    inputs: int = 0  # data inputs (control inputs left out)
    device: str = ""  # the NodeDef's device field, e.g. "/device:GPU:0"
    count: int = 1

    @property
    def where(self) -> str:
        return f"{self.function}/{self.name}" if self.function else self.name


@dataclass
class CompatResult:
    tf: str
    predicted: str  # ok | warn | fails
    findings: list[Finding] = field(default_factory=list)


def served_nodes(meta_graph) -> list[ServedNode]:
    """Every node the loader instantiates: the top-level graph and the functions it calls, transitively;
    flagged `executed` where a signature, init or restore path reaches them, `serving` on a signature's.
    Grouped (see ServedNode): each node costs one serialization of its op, device and attrs, no objects."""
    graph = graph_of(meta_graph)
    serving_roots, loading_roots = _roots(meta_graph)
    serving, loading = graph.reach(t for t in serving_roots if t), graph.reach(t for t in loading_roots if t)
    executed = {**dict.fromkeys(loading.functions, False), **dict.fromkeys(serving.functions, True)}
    keyer = _Keyer(graph)
    top = graph.top
    keys = [keyer.key(node) for node in top]
    instantiated = graph.reach((), [f for key in dict.fromkeys(keys) for f in keyer.calls[key]]).functions

    groups: dict[tuple, ServedNode] = {}
    for i, key in enumerate(keys):
        flag = 2 if serving.marked[i] else 1 if loading.marked[i] else 0  # on a serving, a load-time or no path
        _add(groups, (key, flag, None), top, i, None, flag > 0, flag == 2, key[1])
    for fname in instantiated:
        on_path, serves = fname in executed, executed.get(fname, False)
        body = graph.functions[fname].node_def
        for i, node in enumerate(body):
            key = keyer.key(node)
            _add(groups, (key, on_path, serves, "in a function"), body, i, fname, on_path, serves, key[1])
    return list(groups.values())


def _roots(meta_graph) -> tuple[list[str], list[str]]:
    """Tensors computed per request (signatures) and once at load time (init op, main op, restore)."""
    serving, loading = [], []
    for key, signature in meta_graph.signature_def.items():
        tensors = [name for info in [*signature.inputs.values(), *signature.outputs.values()]
                   for name in tensor_info_names(info)]
        (loading if key == INIT_OP_SIGNATURE else serving).extend(tensors)
    saver = meta_graph.saver_def
    loading += [saver.restore_op_name, saver.filename_tensor_name]
    for key in LOADER_MAIN_OPS:
        if key in meta_graph.collection_def:
            loading += list(meta_graph.collection_def[key].node_list.value)
    return serving, loading


class _Keyer:
    """What the checks see of a node, as one hashable key: its serialized NodeDef without the name and the
    inputs (op, device, attrs in field order, map entries sorted), and the number of data inputs. Cutting
    the bytes costs a third of reading the attr map through Python. The functions a node calls are worked
    out once per key."""

    def __init__(self, graph):
        self.graph = graph
        self.calls: dict[tuple, list[str]] = {}
        self._keys: dict[tuple, tuple] = {}

    def key(self, node) -> tuple:
        raw = node.SerializeToString(deterministic=True)
        size, name_end = len(raw), 0
        if size and raw[0] == 0x0A:  # field 1, name
            _, name_end = _field_end(raw, 1)
        op_end = name_end
        if op_end < size and raw[op_end] == 0x12:  # field 2, op
            _, op_end = _field_end(raw, op_end + 1)
        end, inputs = op_end, 0
        while end < size and raw[end] == 0x1A:  # field 3, input (repeated): "^name" is a control input
            start, end = _field_end(raw, end + 1)
            inputs += raw[start:start + 1] != b"^"
        key = (raw[name_end:op_end] + raw[end:], inputs)
        known = self._keys.get(key)
        if known is not None:
            return known  # one key object per group: a million nodes hold a few keys, not a million copies
        self._keys[key] = key
        self.calls[key] = self.graph.calls(node)
        return key


def _field_end(raw: bytes, i: int) -> tuple[int, int]:
    """(start, end) of the length-delimited field whose length varint begins at `i`."""
    length = shift = 0
    while True:
        byte = raw[i]
        i += 1
        length |= (byte & 0x7F) << shift
        if byte < 0x80:
            return i, i + length
        shift += 7


def _add(groups: dict, group_key, nodes, index: int, function, executed, serving, inputs) -> None:
    group = groups.get(group_key)
    if group is None:
        groups[group_key] = _served(nodes[index], function, executed, serving, inputs)
    else:
        group.count += 1


def _served(node, function, executed, serving, inputs) -> ServedNode:
    attrs = {k: v for k, v in node.attr.items() if not k.startswith("_")}
    types = {k: t for k, t in ((k, _types(v)) for k, v in attrs.items()) if t is not None}
    return ServedNode(node.name, node.op, function, executed, serving, attrs, types, inputs, node.device)


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


# Ops that live on the host by design, whatever kernels they have: I/O, lookup tables, datasets and
# iterators, queues, summaries, resource and variable handling, checks. On a GPU server their CPU placement is
# the plan, not a fallback. Compute ops without a GPU kernel (NonMaxSuppressionV5, the SimpleML* ops) are not.
HOST_BY_DESIGN = re.compile(
    r"(Table|Dataset|Iterator|Reader|Queue|Summary|Barrier|Stack|TensorArray|Resource|Variable|VarHandle|"
    r"VarIsInitialized|Save|Restore|MergeV2Checkpoints|ShardedFilename|File|Decode|Encode|Parse|Serialize|String|"
    r"Regex|Substr|Unicode|Print|Assert|Optional|Mutex|Accumulator|StagingArea|Unstage|Stage|Rpc|Tpu|TPU)")


def _host_only(op: str, types: dict[str, list[int]], op_def: dict) -> bool:
    """String tensors live in host memory (a string-typed attr, input or output: TF Text's tokenizers); I/O,
    tables, datasets and resource handling are host ops by design."""
    if any(DT_STRING in ts for ts in types.values()):
        return True
    if any(arg.get("t") == DT_STRING for arg in op_def["i"] + op_def["o"]):
        return True
    return bool(HOST_BY_DESIGN.search(op)) or op in IO_OP_CATEGORY


def _type_list(types: dict[str, list[int]]) -> str:
    return ", ".join(f"{k}={'/'.join(dtype_name(t) for t in v)}" for k, v in sorted(types.items())) or "no type attrs"


class _Collector:
    """Findings of one version, one per (code, op, detail): a model with 200 Conv2D nodes gets one line."""

    def __init__(self):
        self.groups: dict[tuple, list] = {}

    def add(self, severity, code, op, node: ServedNode | None, detail: str):
        where, count = (node.where, node.count) if node is not None else (None, 0)
        group = self.groups.setdefault((severity, code, op, detail), [where, 0])
        group[1] += count

    def findings(self) -> list[Finding]:
        order = {"error": 0, "warning": 1, "info": 2}
        out = []
        for (severity, code, op, detail), (where, count) in self.groups.items():
            more = f" (and {count - 1} more node{'s' if count > 2 else ''})" if count > 1 else ""
            out.append(Finding(severity, code, f"{detail}{more}", op=op, node=where))
        return sorted(out, key=lambda f: (order[f.severity], f.code, f.op or "", f.node or ""))


GPU_DEVICE = re.compile(r"(?i)(?:^|/)(?:device:)?gpu:\d+")
NO_SOFT_PLACEMENT = ("TF Serving sets no soft placement (its session config leaves allow_soft_placement off), "
                     "so the model fails to load")
CLEAR_DEVICES = ("export with clear_devices=True (tf.compat.v1.saved_model.Builder(path).add_meta_graph_and_variables("
                 "..., clear_devices=True)), or build the graph without tf.device('/GPU:N')")
# AttrValue's oneof field for each OpDef attr type (ValidateAttrValue: "AttrValue had value with type ...").
ATTR_FIELD = {"string": "s", "int": "i", "float": "f", "bool": "b", "type": "type", "shape": "shape",
              "tensor": "tensor", "func": "func"}


def nodedef_problems(node: ServedNode, op_def: dict) -> list[str]:
    """What TensorFlow's ValidateNodeDef refuses in this node (node_def_util.cc): attrs of the wrong kind,
    lists shorter than the OpDef's minimum, required attrs missing, a number of inputs the OpDef does not
    take. Attrs the OpDef lacks are left to the attr-unknown check (this loader ignores them)."""
    problems = []
    specs = op_def["a"]
    for name, value in node.attrs.items():
        spec = specs.get(name)
        kind = value.WhichOneof("value")
        if spec is None or spec["t"] == "any" or kind == "placeholder":
            continue
        wanted = spec["t"]
        if wanted.startswith("list("):
            item = ATTR_FIELD.get(wanted[5:-1])
            other = [f for f in ATTR_FIELD.values() if f != item and kind == "list" and len(getattr(value.list, f))]
            if kind != "list" or other:
                problems.append(f"attr '{name}' is {_kind(value)}, the OpDef wants {wanted}")
            elif "min" in spec and len(getattr(value.list, item)) < spec["min"]:
                problems.append(f"attr '{name}' has {len(getattr(value.list, item))} values, the OpDef wants at "
                                f"least {spec['min']}")
        elif kind != ATTR_FIELD.get(wanted):
            problems.append(f"attr '{name}' is {_kind(value)}, the OpDef wants {wanted}")
        elif wanted == "int" and "min" in spec and value.i < spec["min"]:
            problems.append(f"attr '{name}' is {value.i}, the OpDef wants at least {spec['min']}")
    missing = sorted(a for a, spec in specs.items() if a not in node.attrs and "d" not in spec)
    if missing:
        problems.append(f"NodeDef missing attr{'s' if len(missing) > 1 else ''} {', '.join(repr(m) for m in missing)}")
    expected = _input_count(node, op_def)
    if expected is not None and expected != node.inputs and not problems:
        problems.append(f"the OpDef takes {expected} input{'s' if expected != 1 else ''}, the NodeDef gives "
                        f"{node.inputs}")
    return problems


def _kind(value) -> str:
    kind = value.WhichOneof("value")
    if kind == "list":
        fields = [f for f in ATTR_FIELD.values() if len(getattr(value.list, f))]
        return f"list({', '.join(fields) or 'empty'})"
    return {v: k for k, v in ATTR_FIELD.items()}.get(kind, kind or "unset")


def _input_count(node: ServedNode, op_def: dict) -> int | None:
    """How many data inputs the OpDef takes given the node's attrs (number_attr N, type_list_attr lists)."""
    total = 0
    for arg in op_def["i"]:
        if "na" in arg:
            value = node.attrs.get(arg["na"])
            n = value.i if value is not None and value.WhichOneof("value") == "i" else op_def["a"][arg["na"]].get("d")
            if not isinstance(n, int):
                return None
            total += n
        elif "tla" in arg:
            value = node.attrs.get(arg["tla"])
            if value is None or value.WhichOneof("value") != "list":
                default = op_def["a"][arg["tla"]].get("d")
                if not isinstance(default, list):
                    return None
                total += len(default)
            else:
                total += len(value.list.type)
        else:
            total += 1
    return total


def check_version(nodes: list[ServedNode], library: set[str], producer_ops: dict, version: str,
                  device: str = "cpu", server: str = "stock") -> CompatResult:
    """Findings of one TF Serving version for nodes from `served_nodes`; `device` is "cpu" or "gpu";
    `server` "stock" (TF X.Y plus the op libraries the stock model server links) or "tf-only"."""
    reg = registries.load(version, server)
    out = _Collector()
    kernel_memo: dict[tuple, bool] = {}
    dev = device.upper()
    for node in nodes:
        op = node.op
        pinned_gpu = bool(node.device) and bool(GPU_DEVICE.search(node.device))
        if pinned_gpu and dev == "CPU" and node.function is None:
            out.add("error", "device-pinned", op, node,
                    f"{node.where} is pinned to {node.device} and a CPU server has no GPU: {NO_SOFT_PLACEMENT} "
                    f"(Cannot assign a device for operation); fix: {CLEAR_DEVICES}, or serve on a GPU")
        elif pinned_gpu and dev == "CPU":  # measured: the TF1 loader runs a tf.function's tf.device('/GPU:0') on CPU
            out.add("info", "device-pinned", op, node,
                    f"{node.where} is pinned to {node.device} inside a function: the function runtime places it "
                    f"softly (the call's config_proto allows soft placement), so a CPU server runs it on the CPU")
        if op in library:
            continue  # a direct function call: the function's nodes are checked themselves
        op_def = reg.op(op)
        if op_def is None:
            out.add("error", "op-unknown", op, node, unknown_op_message(op, reg))
            continue
        problems = nodedef_problems(node, op_def)
        if problems:
            out.add("error", "nodedef-invalid", op, node,
                    f"NodeDef of {op} does not match its OpDef in TF {reg.release}: {'; '.join(problems)}: the "
                    f"model fails to load (ValidateNodeDef)")
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
        if op == "XlaCallModule":
            for code, detail in xla_module_problems(node, reg, dev):
                out.add("error", code, op, node, detail)
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
        if dev == "GPU" and has_kernel("CPU") and not pinned_gpu:
            if not node.serving or _host_only(op, types, op_def):
                continue  # placed on the CPU on every GPU server: load-time work, strings, I/O, tables
            out.add("warning", "gpu-fallback", op, node,
                    f"{op} has no GPU kernel for {_type_list(types)} in TF {reg.release}: the placer puts it on "
                    f"the CPU, with copies between the devices on every request")
        elif dev == "GPU" and has_kernel("CPU"):
            out.add("error", "device-pinned", op, node,
                    f"{node.where} is pinned to {node.device} but {op} has no GPU kernel for {_type_list(types)} "
                    f"in TF {reg.release}: {NO_SOFT_PLACEMENT}; fix: {CLEAR_DEVICES}")
        else:
            only = " (only a GPU kernel)" if dev == "CPU" and has_kernel("GPU") else ""
            out.add("error", "no-kernel", op, node,
                    f"No OpKernel was registered to support Op '{op}' on {dev} with {_type_list(types)} in "
                    f"TF {reg.release}{only}: the model fails at run time")
    findings = out.findings()
    predicted = ("fails" if any(f.severity == "error" for f in findings)
                 else "warn" if any(f.severity == "warning" for f in findings) else "ok")
    return CompatResult(tf=version, predicted=predicted, findings=findings)


# XlaCallModule's kernel builds its loader when the first request runs it, and the loader refuses a module serialized
# at a newer version than it knows: "XlaCallModuleOp with version N is not supported by this build. Must be <= M"
# (tensorflow/compiler/tf2xla/kernels/xla_call_module_loader.cc, kVersionMaximumSupported). M per release, as its
# wheel's tensorflow/compiler/tf2xla/python/xla.py call_module_maximum_supported_version() returns it (read from the
# 2.14, 2.15, 2.16, 2.19, 2.20 and 2.21 wheels; 2.17 and 2.18 lie between two 9s). 2.12 and 2.13 have no such
# function and their op lacks the disabled_checks attr that version 6 brought (kVersionStartSupportDisabledChecks):
# at most 5. The OpDefs cannot tell: 2.14 has version 9's has_token_input_output attr but refuses version 9.
# JAX 0.10 writes version 10 by default and 9 at the least (jax.export's minimum_supported_calling_convention_version).
XLA_MODULE_MAX_VERSION = {"2.12": 5, "2.13": 5, "2.14": 8, "2.15": 8, "2.16": 9, "2.17": 9, "2.18": 9, "2.19": 9,
                          "2.20": 10, "2.21": 10}
# The loader also refuses a module not serialized for the platform it runs on ("The current platform CUDA is not
# among the platforms required by the module"), unless the module disables the "platform" check. jax2tf and Keras'
# JAX export serialize for the platform of the machine that exported, e.g. only CPU.
XLA_PLATFORMS = {"CPU": "CPU", "GPU": "CUDA"}


def xla_module_problems(node: ServedNode, reg, device: str) -> list[tuple[str, str]]:
    """(code, why) for an XlaCallModule node that TF `reg` cannot run: its module's version or platforms."""
    problems = []
    version = node.attrs["version"].i if "version" in node.attrs else 0
    known = XLA_MODULE_MAX_VERSION.get(reg.version)
    if known is not None and version > known:
        first = next((v for v in registries.available() if XLA_MODULE_MAX_VERSION.get(v, 0) >= version), None)
        serve = f"serve on TF Serving {first} or later, or " if first else ""
        problems.append(("xla-module-version", (
            f"{node.where} holds a StableHLO module serialized at version {version}, newer than TF {reg.release}'s "
            f"XlaCallModule knows (up to {known}): every request fails with 'XlaCallModuleOp with version {version} "
            f"is not supported by this build'; fix: {serve}serialize it at version {known} or lower "
            f"(JAX_EXPORT_CALLING_CONVENTION_VERSION={known} when you export, if your JAX still writes it)")))
    platforms = [p.decode() for p in node.attrs["platforms"].list.s] if "platforms" in node.attrs else []
    checks = [c.decode() for c in node.attrs["disabled_checks"].list.s] if "disabled_checks" in node.attrs else []
    wanted = XLA_PLATFORMS.get(device)
    if platforms and wanted and wanted not in platforms and "platform" not in checks:
        problems.append(("xla-module-platform", (
            f"{node.where} holds a module serialized for {', '.join(platforms)} only: on a {device} server every "
            f"request fails with 'The current platform {wanted} is not among the platforms required by the "
            f"module'; fix: export it again for both (jax2tf.convert(..., native_serialization_platforms=('cpu', "
            f"'cuda')), or keras' export on the TensorFlow backend), or serve on {platforms[0]}")))
    return problems


def unknown_op_message(op: str, reg) -> str:
    """Why TF Serving `reg.version`'s server lacks `op`, which library has it, and what to do."""
    package = registries.provider(op)
    stock = registries.load(reg.version).library_of(op) if not reg.linked else None
    later = registries.first_server_with(op) if reg.linked else None
    if stock:
        fix = (f"the stock tensorflow_model_server {reg.version} links it ({stock}): serve with the stock build, or "
               f"link {stock.split()[0]}'s ops_lib into yours")
    elif later and SUPPORTED.index(later) > SUPPORTED.index(reg.version):
        fix = f"serve on TF Serving {later} or later, whose stock server links it, or replace the op"
    elif package:
        fix = (f"stock TF Serving does not link {package.split()[0]}: build tensorflow_model_server with its op "
               f"library in SUPPORTED_TENSORFLOW_OPS (model_servers/BUILD), or replace the op with stock ops")
    else:
        fix = ("only a custom op library registers it: build tensorflow_model_server with that library linked in, "
               "or replace the op with stock TensorFlow ops")
    origin = f" (from {package})" if package else ""
    return (f"Op type not registered '{op}' in TF Serving {reg.version}{origin}: the model fails to load; fix: {fix} "
            f"(registry: {reg.server})")


def producer_defaults(meta_graph) -> dict:
    """{op: {attr: default in attr_json form}} of the TF that wrote the model (MetaInfoDef.stripped_op_list)."""
    out = {}
    for op_def in meta_graph.meta_info_def.stripped_op_list.op:
        out[op_def.name] = {a.name: attr_json(a.default_value) for a in op_def.attr if a.HasField("default_value")}
    return out


def analyze(meta_graph, versions: list[str], device: str = "cpu", server: str = "stock",
            server_flags: ServerFlags = STOCK) -> list[CompatResult]:
    """One CompatResult per version, in the order given. What fails on every version whatever its registry (cyclic
    calls, files outside the SavedModel, XLA under `server_flags`: exportkit.savedmodel.deployment) comes first in each."""
    nodes = served_nodes(meta_graph)
    library = graph_of(meta_graph).library
    producer = producer_defaults(meta_graph)
    # PyFunc: the registries, from TF's wheel, list its kernel; no server has the Python function behind it
    every = (loader_refusals(meta_graph) + deployment_findings(meta_graph, server_flags)
             + py_func_findings(reachable_py_funcs(graph_of(meta_graph))))
    results = [check_version(nodes, library, producer, v, device, server) for v in versions]
    for result in results:
        result.findings[:0] = every
        if any(f.severity == "error" for f in every):
            result.predicted = "fails"
        elif result.predicted == "ok" and any(f.severity == "warning" for f in every):
            result.predicted = "warn"
    return results


def loader_refusals(meta_graph) -> list[Finding]:
    """What every version's loader refuses, whatever its registries: cyclic function calls, and signature tensors
    the graph does not have (savedmodel.missing_tensor_findings, the check inspect shows)."""
    return cycle_findings(meta_graph) + missing_tensor_findings(meta_graph)


def cycle_findings(meta_graph) -> list[Finding]:
    """One error per cycle of function calls: both loaders refuse them (tf.saved_model.load: "cyclic
    dependency between functions"; the session's function instantiation never ends)."""
    return [Finding("error", "function-cycle",
                    f"functions call each other in a cycle ({' -> '.join(cycle)}): the model fails to load "
                    f"(cyclic dependency between functions); fix: export the model again, a function library "
                    f"written by TensorFlow has no cycles", node=cycle[0])
            for cycle in graph_of(meta_graph).function_cycles()]


LOADER_CODES = ("device-pinned", "nodedef-invalid", "function-cycle")


def forecast(meta_graph, device: str = "cpu") -> tuple[str | None, list[Finding]]:
    """For inspect: the oldest supported version from which on every newer one is predicted to work (None: not
    even the newest), and what makes the newest version's loader refuse the model whatever the version (nodes
    pinned to a GPU on a CPU server, NodeDefs their OpDef rejects, loader_refusals). Checked newest first,
    stopping at the first failure (~10 ms of CPU per registry read)."""
    nodes = served_nodes(meta_graph)
    library = graph_of(meta_graph).library
    producer = producer_defaults(meta_graph)
    refusals = loader_refusals(meta_graph)
    oldest, blocking = None, [Finding(f.severity, f.code, f.message) for f in refusals]
    for version in reversed(registries.available()):
        result = check_version(nodes, library, producer, version, device)
        if version == registries.available()[-1]:
            blocking += [Finding(f.severity, f.code, f"{f.message} (TF Serving {version}, node {f.node})")
                         for f in result.findings if f.code in LOADER_CODES and f.severity == "error"]
        if refusals or result.predicted == "fails":
            break
        oldest = version
    return oldest, blocking
