"""A MetaGraph's SignatureDefs: names, inputs and outputs as plain dicts, the TF Serving API each is called with,
the static shapes the graph gives their tensors, and the tensors they name that the graph lacks."""
from __future__ import annotations

from exportkit.savedmodel.graph import graph_of, tensor_info_names, tensor_node
from exportkit.savedmodel.reader import dtype_name, shape_list
from exportkit.signature_constants import (CLASSIFY_CLASSES, CLASSIFY_METHOD, CLASSIFY_SCORES, INIT_OP_SIGNATURE,
                                           REGRESS_METHOD, REGRESS_OUTPUTS)


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
                variable = graph.node(None, tensor_node(consumer.input[0]))
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
                    if tensor and tensor_node(tensor) not in nodes:
                        missing.append((name, f"{noun} {key!r}", tensor))
    return missing
