"""The one walker over a MetaGraph's GraphDef and its function library, indexed once per graph.

lint (I/O and Python ops on a signature's path), deployment (where a file name comes from) and the compat analysis
(what a loader instantiates and executes) all ask the same questions: which node has this name, which functions
does a node call, what do these tensors need computed. A graph of a million nodes is indexed once and each walk
is done once (`graph_of` keeps the last graph asked about), instead of once per question.
"""
from __future__ import annotations

from array import array
from collections import Counter
from typing import Iterable, Iterator

from exportkit.signature_constants import INIT_OP_SIGNATURE

# Call ops whose function is their `f` attr: their data inputs are the function's arguments, in order.
CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})
# Collections of ops the loader runs once, after restoring the variables (main op, legacy init op, tables).
MAIN_OP_COLLECTIONS = ("saved_model_main_op", "legacy_init_op", "main_op", "table_initializer")


def tensor_node(name: str) -> str:
    """`node:0`, `^node`, `node:output:0` (inside functions) -> `node`."""
    return name.lstrip("^").split(":", 1)[0]


def data_inputs(node) -> list[str]:
    """A node's inputs without its control inputs (`^name`)."""
    return [i for i in node.input if not i.startswith("^")]


def function_label(function: str | None) -> str:
    return f"function '{function}'" if function else "the top-level graph"


def tensor_info_names(info) -> list[str]:
    """The graph tensors a TensorInfo names: one, or a sparse tensor's three, or a composite's components."""
    encoding = info.WhichOneof("encoding")
    if encoding == "name":
        return [info.name]
    if encoding == "coo_sparse":
        return [info.coo_sparse.values_tensor_name, info.coo_sparse.indices_tensor_name,
                info.coo_sparse.dense_shape_tensor_name]
    if encoding == "composite_tensor":
        return [name for c in info.composite_tensor.components for name in tensor_info_names(c)]
    return []


def signature_tensors(meta_graph, served_only: bool = False) -> list[str]:
    """Every signature's output tensors: the init op signature's too, unless `served_only` (what requests compute)."""
    return [tensor for name, sig in meta_graph.signature_def.items() if not (served_only and name == INIT_OP_SIGNATURE)
            for info in sig.outputs.values() for tensor in tensor_info_names(info)]


def root_tensors(meta_graph) -> list[str]:
    """Tensors a loader or a client makes the graph compute: every signature's outputs (the init op's too) and
    the main-op collections. The saver's restore op is not a root: it only reads the model's own variables/."""
    roots = signature_tensors(meta_graph)
    for key in MAIN_OP_COLLECTIONS:
        if key in meta_graph.collection_def:
            roots += list(meta_graph.collection_def[key].node_list.value)
    return roots


def load_time_functions(meta_graph) -> list[str]:
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


class Reach:
    """What computing some roots runs: top-level nodes (indices, in the order the walk met them, and a mark per
    node) and the functions called from them, transitively (in the order the walk met them)."""

    def __init__(self, size: int):
        self.order = array("l")
        self.marked = bytearray(size)
        self.functions: list[str] = []

    def __contains__(self, index: int) -> bool:
        return bool(self.marked[index])


class Graph:
    """A MetaGraph's top-level nodes and function library, with indexes built on first use."""

    def __init__(self, meta_graph):
        self.meta_graph = meta_graph
        graph_def = meta_graph.graph_def
        self.top = graph_def.node
        self.functions = {f.signature.name: f for f in graph_def.library.function}
        self.library = frozenset(self.functions)
        self._position: dict[str, int] | None = None
        self._function_nodes: dict[str | None, dict] = {}
        self._callers: dict[str, list] | None = None
        self._object_paths: dict[str, str] | None = None
        self._reached: dict[tuple, Reach] = {}
        self._op_counts: dict[str, int] | None = None

    # ----------------------------------------------------------------------------------------- lookups
    @property
    def position(self) -> dict[str, int]:
        """{top-level node name: its index}."""
        if self._position is None:
            self._position = {node.name: i for i, node in enumerate(self.top)}
        return self._position

    def node(self, function: str | None, name: str):
        """The NodeDef `name` of the top-level graph (function None) or of a function's body; None if absent."""
        if function is None:
            i = self.position.get(name)
            return None if i is None else self.top[i]
        return self.function_nodes(function).get(name)

    def function_nodes(self, function: str | None) -> dict:
        """{node name: NodeDef} of a function's body (the top-level graph's for None)."""
        if function not in self._function_nodes:
            nodes = self.top if function is None else self.functions[function].node_def
            self._function_nodes[function] = {n.name: n for n in nodes}
        return self._function_nodes[function]

    def args(self, function: str) -> list[str]:
        return [a.name for a in self.functions[function].signature.input_arg]

    def iter_nodes(self) -> Iterator[tuple[str | None, object]]:
        """(function name or None for the top-level graph, NodeDef) for every node of the graph and its library.
        The library is flat (nested functions are listed there too), so this reaches every function."""
        for node in self.top:
            yield None, node
        for name, fdef in self.functions.items():
            for node in fdef.node_def:
                yield name, node

    def op_counts(self) -> dict[str, int]:
        """{op type: number of nodes} over the graph and its function library; sorted by op name. Also what the
        checks look at first: an op type absent here needs no walk."""
        if self._op_counts is None:
            counts = Counter(node.op for node in self.top)
            for fdef in self.functions.values():
                counts.update(node.op for node in fdef.node_def)
            self._op_counts = dict(sorted(counts.items()))
        return self._op_counts

    def calls(self, node) -> list[str]:
        """Library functions a node calls: as its op, or through function-valued attrs (f, then_branch, body, ...)."""
        if not self.library:
            return []  # a TF1 graph without functions: nothing to look for in its (many) attrs
        names = [node.op] if node.op in self.library else []
        for value in node.attr.values():
            kind = value.WhichOneof("value")
            if kind == "func":
                names += [value.func.name] if value.func.name in self.library else []
            elif kind == "list":
                names += [f.name for f in value.list.func if f.name in self.library]
        return names

    def callers(self, function: str) -> list[tuple[str | None, object]]:
        """(where, node) of every node that calls `function` with its data inputs as the arguments: the function
        as the op, or a call op's `f`."""
        if self._callers is None:
            self._callers = {}
            for where, node in self.iter_nodes():
                callee = node.op if node.op in self.library else (
                    node.attr["f"].func.name if node.op in CALL_OPS and "f" in node.attr else None)
                if callee:
                    self._callers.setdefault(callee, []).append((where, node))
        return self._callers.get(function, [])

    def object_path(self, function: str | None) -> str | None:
        """The shortest object-graph path that reaches a concrete function, e.g. `root.table._initialize` (TF2)."""
        if self._object_paths is None:
            self._object_paths = _object_paths(self.meta_graph.object_graph_def)
        return self._object_paths.get(function or "")

    # ------------------------------------------------------------------------------------------- walks
    def reach(self, roots: Iterable[str], functions: Iterable[str] = ()) -> Reach:
        """The top-level ancestors (data and control inputs) of `roots` and every function they or `functions`
        call, transitively; memoized per (roots, functions)."""
        roots, functions = tuple(roots), tuple(functions)
        key = (roots, functions)
        if key in self._reached:
            return self._reached[key]
        top, position, library = self.top, self.position, self.library
        found = Reach(len(top))
        marked, order = found.marked, found.order
        pending_functions = [f for f in functions if f in library]
        pending = [i for i in (position.get(tensor_node(t)) for t in roots) if i is not None]
        while pending:
            i = pending.pop()
            if marked[i]:
                continue
            marked[i] = 1
            order.append(i)
            node = top[i]
            for name in node.input:
                j = position.get(name.lstrip("^").split(":", 1)[0])  # tensor_node, inlined: a million calls
                if j is not None:
                    pending.append(j)
            if library:
                pending_functions += self.calls(node)
        seen: set[str] = set()
        while pending_functions:
            fname = pending_functions.pop()
            if fname in seen:
                continue
            seen.add(fname)
            found.functions.append(fname)
            for node in self.functions[fname].node_def:
                pending_functions += self.calls(node)
        self._reached[key] = found
        return found

    def reachable_nodes(self, roots: Iterable[str] | None = None) -> Iterator[tuple[str | None, object]]:
        """(function or None, NodeDef) for every node that computing `roots` (default: `root_tensors`, and the
        functions the loader runs by itself) may run: top-level nodes first, then the called functions' nodes."""
        if roots is None:
            found = self.reach(root_tensors(self.meta_graph), load_time_functions(self.meta_graph))
        else:
            found = self.reach(roots)
        top = self.top
        for i in found.order:
            yield None, top[i]
        for fname in found.functions:
            for node in self.functions[fname].node_def:
                yield fname, node

    def function_cycles(self) -> list[list[str]]:
        """Functions of the library that call themselves, directly or through others: one list per cycle found
        (the path that closes it), by a depth-first walk over the call graph (call ops and func-valued attrs)."""
        callees = {name: sorted({c for node in f.node_def for c in self.calls(node)})
                   for name, f in self.functions.items()}
        state: dict[str, int] = {}  # 1 on the current path, 2 done
        cycles = []
        for start in sorted(self.library):
            if state.get(start):
                continue
            path, stack = [start], [iter(callees[start])]
            state[start] = 1
            while stack:
                callee = next(stack[-1], None)
                if callee is None:
                    state[path.pop()] = 2
                    stack.pop()
                elif state.get(callee) == 1:
                    cycles.append(path[path.index(callee):] + [callee])
                elif not state.get(callee):
                    state[callee] = 1
                    path.append(callee)
                    stack.append(iter(callees[callee]))
        return cycles


def _object_paths(object_graph) -> dict[str, str]:
    """{concrete function name: the shortest object path that reaches it, e.g. root.layer.table._initialize}."""
    if not object_graph.nodes:
        return {}
    paths = {0: "root"}
    order = [0]
    for node_id in order:
        for child in object_graph.nodes[node_id].children:
            if child.node_id not in paths and child.node_id < len(object_graph.nodes):
                paths[child.node_id] = f"{paths[node_id]}.{child.local_name}"
                order.append(child.node_id)
    out: dict[str, str] = {}
    for node_id in order:
        obj = object_graph.nodes[node_id]
        kind = obj.WhichOneof("kind")
        names = (list(obj.function.concrete_functions) if kind == "function" else
                 [obj.bare_concrete_function.concrete_function_name] if kind == "bare_concrete_function" else [])
        for name in names:
            out.setdefault(name, paths[node_id])
    return out


_last: Graph | None = None


def graph_of(meta_graph) -> Graph:
    """The Graph of `meta_graph`, indexed once: the last one asked about is kept (one slot), so lint, the
    deployment checks and the compat analysis of one MetaGraph share its indexes and walks."""
    global _last
    last = _last
    if last is None or last.meta_graph is not meta_graph:
        last = _last = Graph(meta_graph)
    return last
