"""Which values each integer input of a Keras model may take, read from the graph the model traces to.

Token ids index an embedding table, segment ids a smaller one, a padding mask only tells zero from non-zero:
one range for every integer input cannot fit them all. The model is traced once with symbolic inputs; from
each integer input the graph is followed through ops that pass its values on unchanged (casts, reshapes,
slices, selects, ...) to the ops that bound it:

* a gather's indices (an embedding lookup, `ops.take`, a constant table): [0, rows of the table);
* `one_hot`: [0, depth); a bincount: [0, size); a segment reduction: [0, num_segments);
* a cast to bool or a comparison with 0 (a mask, maybe after a minimum/maximum/product with another mask), or
  `1 - mask` (the additive attention mask of Hugging Face's TF models: `(1.0 - mask) * -10000.0` adds a large
  negative number where the mask is 0 and nothing where it is 1): [0, 2), used only where nothing above bounds
  the input.

Several bounds on one input intersect. An input that reaches none keeps the default range. Lookups
(IntegerLookup, hashing) accept any value, so they bound nothing.
"""
from __future__ import annotations

from exportkit.inputs.ranges import IntRangeFlags, IntRanges, integer_keys, resolve_int_ranges
from exportkit.inputs.spec import InputSpec
from exportkit.errors import UsageError

# Ops whose output holds values of the listed inputs, unchanged (op type -> input positions; None: all).
_PASS_THROUGH = {
    "Identity": (0,), "Snapshot": (0,), "StopGradient": (0,), "PreventGradient": (0,), "EnsureShape": (0,),
    "Reshape": (0,), "ExpandDims": (0,), "Squeeze": (0,), "Transpose": (0,), "StridedSlice": (0,),
    "Slice": (0,), "Tile": (0,), "BroadcastTo": (0,), "Pack": None, "Unpack": (0,), "Split": (1,),
    "SplitV": (0,), "SelectV2": (1, 2), "Select": (1, 2), "GatherV2": (0,), "ReverseV2": (0,),
}
# Ops whose output is zero where the input is (a mask combined with another): followed to mask uses only.
_ZERO_PRESERVING = {"Minimum", "Maximum", "Mul"}
_ZERO_TESTS = {"Greater", "NotEqual", "Equal"}
_MASK = (0, 2)


def _const(tensor) -> int | None:
    """The value of a scalar tensor the graph computes from constants alone (a Const, a cast of one), else None."""
    import numpy as np
    import tensorflow as tf

    try:
        value = tf.get_static_value(tensor)
    except (TypeError, ValueError):
        return None
    return int(value) if value is not None and np.ndim(value) == 0 else None


def _is_one(tensor) -> bool:
    """A scalar constant 1 (or 1.0)."""
    import numpy as np
    import tensorflow as tf

    try:
        value = tf.get_static_value(tensor)
    except (TypeError, ValueError):
        return False
    return value is not None and np.ndim(value) == 0 and value == 1


def _rows(tensor, axis: int | None, resources: dict) -> int | None:
    """The size of `tensor` (a table, or a resource variable's handle) along `axis`, if it is known."""
    shape = resources.get(id(tensor)) if tensor.dtype.name == "resource" else tensor.shape
    if shape is None or axis is None or shape.rank is None or not -shape.rank <= axis < shape.rank:
        return None
    return shape[axis]


def _bound(op, position: int, resources: dict) -> tuple[int, int] | None:
    """The range `op` accepts at input `position`, if the op bounds it."""
    kind = op.type
    if kind == "GatherV2" and position == 1:
        rows = _rows(op.inputs[0], _const(op.inputs[2]), resources)
    elif kind in ("ResourceGather", "Gather") and position == 1:
        rows = _rows(op.inputs[0], 0, resources)
    elif kind == "OneHot" and position == 0:
        rows = _const(op.inputs[1])
    elif kind in ("Bincount", "DenseBincount") and position == 0:  # the size may be computed: read the output
        rows = _const(op.inputs[1]) or (op.outputs[0].shape[-1] if op.outputs[0].shape.rank else None)
    elif kind.startswith("UnsortedSegment") and position == 1:
        rows = _const(op.inputs[2])
    else:
        return None
    return (0, int(rows)) if rows else None


def _walk(start, resources: dict) -> tuple[list[tuple[int, int]], bool]:
    """(bounds, used as a mask) for the values of tensor `start`."""
    import tensorflow as tf

    bounds, mask, seen, todo = [], False, set(), [(start, True)]
    while todo:
        tensor, exact = todo.pop()  # exact: the values are the input's; else only its zeros are
        if (id(tensor), exact) in seen:
            continue
        seen.add((id(tensor), exact))
        for op in tensor.consumers():
            for position in [i for i, t in enumerate(op.inputs) if t is tensor]:
                bound = _bound(op, position, resources) if exact else None
                if bound is not None:
                    bounds.append(bound)
                elif op.type == "Cast" and op.get_attr("DstT") == tf.bool:
                    mask = True
                elif op.type in _ZERO_TESTS and _const(op.inputs[1 - position]) == 0:
                    mask = True
                elif op.type == "Sub" and position == 1 and _is_one(op.inputs[0]):
                    mask = True
                elif op.type == "Cast":  # to another integer or a float type: the (small) values stay
                    todo += [(t, exact) for t in op.outputs]
                elif op.type in _ZERO_PRESERVING:
                    todo += [(t, False) for t in op.outputs]
                elif _PASS_THROUGH.get(op.type, ()) is None or position in _PASS_THROUGH.get(op.type, ()):
                    todo += [(t, exact) for t in op.outputs]
    return bounds, mask


def _resource_shapes(graph) -> dict:
    """id(captured resource placeholder) -> the shape of the variable behind it."""
    internal = {id(external): placeholder for external, placeholder in graph.captures}
    return {id(internal[id(v.handle)]): v.shape for v in graph.variables
            if id(getattr(v, "handle", None)) in internal}


def derive_int_ranges(model, specs: list[InputSpec]) -> dict[str, tuple[int, int]]:
    """{integer input key: (LO, HI)} for the inputs whose values the traced graph bounds; {} when the model does
    not trace (the golden record then says what fails)."""
    import tensorflow as tf

    from exportkit.sources.model_io import feed_model

    integer = integer_keys(specs)
    if not integer:
        return {}
    signature = {s.key: tf.TensorSpec([None if d is None or d < 0 else d for d in s.shape]
                                      if s.shape is not None else None, s.dtype, name=s.key) for s in specs}
    placeholders = {}

    def traced(inputs):
        placeholders.update(inputs)
        return feed_model(model, inputs)

    try:
        graph = tf.function(traced).get_concrete_function(signature).graph
    except Exception:  # a model that does not trace symbolically: no derived ranges, the default applies
        return {}
    resources = _resource_shapes(graph)
    ranges = {}
    for key in integer:
        bounds, mask = _walk(placeholders[key], resources)
        if bounds:
            lo, hi = max(b[0] for b in bounds), min(b[1] for b in bounds)
            if lo < hi:
                ranges[key] = (lo, hi)
        elif mask:
            ranges[key] = _MASK
    return ranges


def int_ranges_for(model, specs: list[InputSpec], flags: IntRangeFlags) -> IntRanges:
    """The ranges golden inputs are generated from: the --int-range values over the derived ones (the model is
    traced only when some integer input has no range of its own from the flags)."""
    keys = integer_keys(specs)
    derived = derive_int_ranges(model, specs) if flags.plain is None and set(keys) - set(flags.named) else {}
    return resolve_int_ranges(flags, keys, IntRanges(by_input=derived))


def generated_inputs_failure(err: Exception, specs: list[InputSpec], ranges: IntRanges) -> UsageError:
    """The model fails on generated inputs (mostly: an integer out of a table's range): what to pass instead."""
    detail = " ".join(str(err).split())[:300]
    used = f"; integers drawn from {ranges.describe()}" if ranges.by_input else ""
    return UsageError(f"the model fails on generated inputs ({type(err).__name__}: {detail}){used}",
                      "pass --int-range NAME=LO:HI for each integer input that must stay in a range (e.g. "
                      "token_ids=0:VOCAB_SIZE; a plain LO:HI sets every integer input), or --input-spec "
                      "name:shape:dtype for inputs whose shape or dtype cannot be read from the model")
