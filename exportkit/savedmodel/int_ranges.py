"""Which values each integer input of a SavedModel may take, read from its graph (pure protobuf, no TensorFlow).

A SavedModel exportkit did not export records no ranges, and the default 0:10 overflows small tables: a Hugging
Face BERT's `token_type_ids` index a 2-row embedding (`save_pretrained(d, saved_model=True)`), and a server only
ever gets valid ids. The same rules as exportkit.sources.int_ranges (which traces a Keras model) are applied to
the GraphDef: from a signature input, follow ops that pass values on (casts, reshapes, ...) and call ops into their
functions, to a gather from a table of known rows (a variable's shape from its VarHandleOp, through the call
ops that pass the handle down; a constant's), a one_hot's depth, or a mask use ([0, 2)).
"""
from __future__ import annotations

from exportkit.inputs.ranges import IntRangeFlags, IntRanges, is_integer, recorded_int_ranges
from exportkit.savedmodel.graph import CALL_OPS, data_inputs, graph_of, tensor_node
from exportkit.savedmodel.reader import dtype_name, shape_list

# op type -> data input positions whose values reach the output unchanged (None: all); as in sources.int_ranges
_PASS_THROUGH = {
    "Identity": (0,), "Snapshot": (0,), "StopGradient": (0,), "PreventGradient": (0,), "EnsureShape": (0,),
    "Reshape": (0,), "ExpandDims": (0,), "Squeeze": (0,), "Transpose": (0,), "StridedSlice": (0,),
    "Slice": (0,), "Tile": (0,), "BroadcastTo": (0,), "Pack": None, "Unpack": (0,), "Split": (1,),
    "SplitV": (0,), "SelectV2": (1, 2), "Select": (1, 2), "GatherV2": (0,), "ReverseV2": (0,), "Cast": (0,),
}
_ZERO_TESTS = {"Greater", "NotEqual", "Equal"}
_MASK = (0, 2)


def _scalar(node) -> float | None:
    """The value of a scalar Const node, else None."""
    if node is None or node.op != "Const":
        return None
    t = node.attr["value"].tensor
    if shape_list(t.tensor_shape) not in ([], None):
        return None
    for values in (t.int_val, t.int64_val, t.float_val, t.double_val):
        if len(values) == 1:
            return values[0]
    if t.tensor_content:
        import numpy as np

        try:
            values = np.frombuffer(t.tensor_content, dtype=np.dtype(dtype_name(t.dtype)))
        except TypeError:
            return None
        return values[0].item() if values.size == 1 else None
    return None


class _Walker:
    def __init__(self, meta_graph):
        self.graph = graph_of(meta_graph)
        self._consumers: dict = {}

    def consumers(self, function: str | None, name: str) -> list:
        """(node, data input position) of the nodes of `function` that read any output of node/arg `name`."""
        if function not in self._consumers:
            index: dict[str, list] = {}
            for node in self.graph.function_nodes(function).values():
                for position, ref in enumerate(data_inputs(node)):
                    index.setdefault(tensor_node(ref), []).append((node, position))
            self._consumers[function] = index
        return self._consumers[function].get(name, [])

    def producer(self, function, ref: str, stack: tuple):
        """(function, node, stack) of what `ref` names, following a function argument up the call stack."""
        name = tensor_node(ref)
        node = self.graph.node(function, name)
        if node is None and function is not None and stack and name in self.graph.args(function):
            caller, call = stack[-1]
            inputs = data_inputs(call)
            k = self.graph.args(function).index(name)
            return self.producer(caller, inputs[k], stack[:-1]) if k < len(inputs) else (None, None, ())
        return function, node, stack

    def rows(self, function, ref: str, stack: tuple, axis: int = 0) -> int | None:
        """The size along `axis` of a table: a variable (its handle, or a read of it) or a constant."""
        for _ in range(32):
            function, node, stack = self.producer(function, ref, stack)
            if node is None:
                return None
            if node.op in ("ReadVariableOp", "Identity") and data_inputs(node):
                ref = data_inputs(node)[0]
                continue
            shape = (shape_list(node.attr["shape"].shape) if node.op == "VarHandleOp" else
                     shape_list(node.attr["value"].tensor.tensor_shape) if node.op == "Const" else None)
            if shape is None or not -len(shape) <= axis < len(shape) or shape[axis] is None or shape[axis] < 0:
                return None
            return shape[axis]
        return None

    def bound(self, function, node, position: int, stack: tuple) -> tuple[int, int] | None:
        inputs = data_inputs(node)
        rows = None
        if node.op == "ResourceGather" and position == 1:
            rows = self.rows(function, inputs[0], stack)
        elif node.op == "GatherV2" and position == 1 and len(inputs) > 2:
            axis = _scalar(self.producer(function, inputs[2], stack)[1])
            rows = None if axis is None else self.rows(function, inputs[0], stack, int(axis))
        elif node.op == "OneHot" and position == 0:
            rows = _scalar(self.producer(function, inputs[1], stack)[1])
        return (0, int(rows)) if rows else None

    def walk(self, start: str) -> tuple[list[tuple[int, int]], bool]:
        """(bounds, used as a mask) for the values of the top-level tensor `start`."""
        bounds, mask, seen = [], False, set()
        todo = [(None, tensor_node(start), ())]
        while todo:
            function, name, stack = todo.pop()
            key = (function, name, tuple(id(call) for _, call in stack))  # NodeDefs are not hashable
            if key in seen or len(stack) > 16:
                continue
            seen.add(key)
            for node, position in self.consumers(function, name):
                bound = self.bound(function, node, position, stack)
                other = data_inputs(node)[1 - position] if len(data_inputs(node)) == 2 else None
                if bound is not None:
                    bounds.append(bound)
                elif node.op == "Cast" and node.attr["DstT"].type == 10:  # DT_BOOL
                    mask = True
                elif node.op in _ZERO_TESTS and other and _scalar(self.producer(function, other, stack)[1]) == 0:
                    mask = True
                elif node.op == "Sub" and position == 1 and _scalar(self.producer(function, other, stack)[1]) == 1:
                    mask = True
                elif node.op in CALL_OPS and node.attr["f"].func.name in self.graph.library:
                    callee = node.attr["f"].func.name
                    args = self.graph.args(callee)
                    if position < len(args):
                        todo.append((callee, args[position], stack + ((function, node),)))
                elif _PASS_THROUGH.get(node.op, ()) is None or position in _PASS_THROUGH.get(node.op, ()):
                    todo.append((function, node.name, stack))
        return bounds, mask


def graph_int_ranges(meta_graph, signatures: dict) -> dict[str, tuple[int, int]]:
    """{integer input key: (LO, HI)} for the inputs of `signatures` (savedmodel.signatures_of's form) whose values
    the graph bounds; a key several signatures share gets the tightest of their ranges."""
    walker = _Walker(meta_graph)
    ranges: dict[str, tuple[int, int]] = {}
    for name, signature in signatures.items():
        signature_def = meta_graph.signature_def.get(name)
        if signature_def is None:
            continue
        for key, info in signature.get("inputs", {}).items():
            if not is_integer(info.get("dtype") or "") or key not in signature_def.inputs:
                continue
            if signature_def.inputs[key].WhichOneof("encoding") != "name":
                continue
            bounds, mask = walker.walk(signature_def.inputs[key].name)
            found = (max(b[0] for b in bounds), min(b[1] for b in bounds)) if bounds else _MASK if mask else None
            if found and found[0] < found[1]:
                old = ranges.get(key)
                ranges[key] = found if old is None else (max(old[0], found[0]), min(old[1], found[1]))
    return {k: v for k, v in ranges.items() if v[0] < v[1]}


def savedmodel_int_ranges(flags: IntRangeFlags, manifest, meta_graph, signatures: dict) -> IntRanges:
    """The ranges a SavedModel's generated inputs are drawn from: what its export recorded, else what its graph
    bounds (read only then), else the default; --int-range (`flags`) over them."""
    recorded = manifest is not None and manifest.golden
    derived = None if recorded or flags.plain is not None else graph_int_ranges(meta_graph, signatures)
    return recorded_int_ranges(flags, manifest, signatures, derived)
