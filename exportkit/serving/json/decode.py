"""JSON values -> tensors: a Predict request's `instances` (row format) or `inputs` (columnar format) checked against
the signature's inputs as json_tensor.cc does it, in TF Serving's words; `{"b64": ...}` for binary strings.
"""
from __future__ import annotations

import base64
import itertools

import grpc
import numpy as np

from exportkit.serving.json.parse import debug_string, json_type, tf_type_name
from exportkit.serving.server.status import RpcError, invalid_argument as _invalid

MAX_RANK = 64  # numpy's limit (NPY_MAXDIMS); TF's is 254
_END = object()


def fill_predict_request(doc: dict, infomap: dict, signature_name: str) -> tuple[dict[str, np.ndarray], bool]:
    """json_tensor.cc FillPredictRequestFromJson after the signature lookup: (input arrays, row format?)."""
    if not infomap:
        raise _invalid(f"Failed to get input map for signature: {signature_name or 'DEFAULT'}")
    if "instances" in doc:
        if "inputs" in doc:
            raise _invalid(f"JSON Value: {debug_string(doc)} Not formatted correctly expecting only one of "
                           "'inputs' or 'instances' keys to exist ")
        instances = array_member(doc, "instances", "Expecting 'instances' to be an list/array",
                                 "No values in 'instances' array")
        return inputs_from_instances(instances, infomap), True
    if "inputs" in doc:
        return inputs_from_columns(doc["inputs"], infomap), False
    raise _invalid("Missing 'inputs' or 'instances' key")


def array_member(doc: dict, key: str, not_array: str, empty: str) -> list:
    value = doc[key]
    if not isinstance(value, list):
        raise _invalid(f"JSON Value: {debug_string(doc)} {not_array}")
    if not value:
        raise _invalid(f"JSON Value: {debug_string(doc)} {empty}")
    return value


def signature_name(doc: dict) -> str:
    name = doc.get("signature_name", "")
    if not isinstance(name, str):
        raise _invalid(f"JSON Value: {debug_string(doc)} not formatted correctly. 'signature_name' key must be a "
                       "string value.")
    return name


def inputs_from_instances(instances: list, infomap: dict) -> dict[str, np.ndarray]:
    """json_tensor.cc FillTensorMapFromInstancesList (row format)."""
    def is_object(value):
        return isinstance(value, dict) and not is_b64(value)


    if not is_object(instances[0]) and len(infomap) > 1:
        raise _invalid("instances is a plain list, but expecting list of objects as multiple input tensors required "
                       "as per tensorinfo_map")
    objects = is_object(instances[0])
    names = sorted(infomap)
    rows: dict[str, list] = {}
    for count, element in enumerate(instances):
        if objects:
            if not is_object(element):
                raise _invalid(f"Expecting object but got list at item {count} of input list")
            items = element
        else:
            if is_object(element):
                raise _invalid(f"Expecting value/list but got object at item {count} of input list")
            items = {names[0]: element}
        for name, value in items.items():
            try:
                if name not in infomap:
                    raise _invalid(f"JSON object: does not have named input: {name}")
                tensor = tensor_from_json(value, infomap[name])
                if rows.get(name):
                    first = rows[name][0]
                    if first.size != tensor.size:
                        raise _invalid(f"Expecting tensor size: {first.size} but got: {tensor.size}")
                    if first.shape != tensor.shape:
                        raise _invalid(f"Expecting shape [{','.join(map(str, first.shape))}] but got: "
                                       f"[{','.join(map(str, tensor.shape))}]")
            except RpcError as err:
                key = f" key: {name}" if objects else ""
                raise _invalid(f"Failed to process element: {count}{key} of 'instances' list. Error: "
                               f"{_status_text(err)}") from None
            rows.setdefault(name, []).append(tensor)
        if objects and set(items) != set(names):
            raise _invalid(f"Failed to process element: {count} of 'instances' list. JSON object: "
                           f"{debug_string(element)} keys must be equal to: {','.join(names)}")
    return {name: np.stack(values) for name, values in rows.items()}


def inputs_from_columns(inputs, infomap: dict) -> dict[str, np.ndarray]:
    """json_tensor.cc FillTensorMapFromInputsMap (columnar format). Keys not in the signature are ignored."""
    if not isinstance(inputs, dict) or is_b64(inputs):
        if len(infomap) > 1:
            raise _invalid("inputs is a plain value/list, but expecting an object as multiple input tensors required "
                           "as per tensorinfo_map")
        name = next(iter(infomap))
        return {name: tensor_from_json(inputs, infomap[name])}
    out = {}
    for name in sorted(infomap):
        if name not in inputs:
            raise _invalid(f"Missing named input: {name} in 'inputs' object.")
        out[name] = tensor_from_json(inputs[name], infomap[name])
    return out


def tensor_from_json(value, dtype: str) -> np.ndarray:
    """json_tensor.cc FillTensorProto: the shape follows the first element at each level; all levels must agree."""
    fast = _regular_numbers(value, dtype)
    if fast is not None:
        return fast
    shape, probe = [], value
    while isinstance(probe, list):
        shape.append(len(probe))
        if not probe:
            break
        probe = probe[0]
    flat = []
    rank = len(shape)
    stack = [iter((value,))]  # FillTensorProto without recursion: 990 levels inside a value are just a long stack
    while stack:
        item = next(stack[-1], _END)
        level = len(stack) - 1
        if item is _END:
            stack.pop()
        elif not isinstance(item, list):
            if level != rank:
                raise _invalid(f"JSON Value: {debug_string(item)} found at incorrect level: {level + 1} in the JSON "
                               f"DOM. Expected at level: {rank}")
            flat.append(_scalar(item, dtype))
        elif level >= rank:
            raise _invalid(f"Encountered list at unexpected level: {level} expected < {rank}")
        elif len(item) != shape[level]:
            raise _invalid(f"Encountered list at unexpected size: {len(item)} at level: {level} expected size: "
                           f"{shape[level]}")
        else:
            stack.append(iter(item))
    if rank > MAX_RANK:
        # TF refuses more than 254 dimensions (TensorShape::IsValid), numpy more than 64.
        raise _invalid(f"JSON Value: {debug_string(value)} is a tensor of rank {rank}; at most {MAX_RANK} "
                       "dimensions are supported")
    out = np.empty(len(flat), dtype=_numpy_dtype(dtype)) if dtype == "string" else None
    if out is not None:
        out[:] = flat
        return out.reshape(shape)
    return np.array(flat, dtype=_numpy_dtype(dtype)).reshape(shape)


def _status_text(err) -> str:
    return f"{err.code.name}: {err.message}"


def _regular_numbers(value, dtype: str) -> np.ndarray | None:
    """The fast path of tensor_from_json: a regular nested list of JSON numbers of the types `_scalar` accepts for
    `dtype`, converted by numpy; None for anything else (the element-wise path then accepts it or says why not)."""
    if dtype not in ("float32", "float64", "bool") and dtype not in _INT_RANGES:
        return None
    try:
        arr = np.array(value)
    except (ValueError, OverflowError):
        return None
    if arr.dtype.kind not in "bif" or arr.size == 0:
        return None
    flat = [value] if arr.ndim == 0 else value
    for _ in range(arr.ndim - 1):
        flat = list(itertools.chain.from_iterable(flat))
    types = set(map(type, flat))
    allowed = {bool} if dtype == "bool" else {int, float} if dtype.startswith("float") else {int}
    if not types <= allowed:
        return None
    if dtype in _INT_RANGES:
        low, high = _INT_RANGES[dtype]
        if not (low <= int(arr.min()) and int(arr.max()) < high):
            return None
    with np.errstate(over="ignore"):  # a double beyond float32's range is inf, as GetFloat() gives
        return arr.astype(dtype)


def is_b64(value) -> bool:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("b64"), str)


def b64decode(value) -> bytes:
    try:
        return base64.b64decode(value["b64"], validate=True)
    except (ValueError, TypeError):
        raise _invalid("Unable to base64 decode") from None


def _scalar(value, dtype: str):
    """json_tensor.cc AddValueToTensor: one JSON value checked against the input's dtype."""
    def type_error():
        return _invalid(f"JSON Value: {debug_string(value)} Type: {json_type(value)} is not of expected type: "
                        f"{tf_type_name(dtype)}")

    is_int = isinstance(value, int) and not isinstance(value, bool)
    if isinstance(value, dict):
        if dtype == "string":
            if not is_b64(value):
                raise _invalid(f"JSON Value: {debug_string(value)} not formatted correctly for base64 data")
            return b64decode(value)
        raise type_error()
    if dtype in ("float32", "float64"):
        if not (is_int or isinstance(value, float)):
            raise type_error()
        return float(value)
    if dtype in ("int32", "int16", "int8", "uint8"):
        if not is_int or not -2 ** 31 <= value < 2 ** 31:
            raise type_error()
        return value
    if dtype == "int64":
        if not is_int or not -2 ** 63 <= value < 2 ** 63:
            raise type_error()
        return value
    if dtype in ("uint32", "uint64"):
        if not is_int or not 0 <= value < 2 ** (32 if dtype == "uint32" else 64):
            raise type_error()
        return value
    if dtype == "string":
        if not isinstance(value, str):
            raise type_error()
        return value.encode("utf-8")
    if dtype == "bool":
        if not isinstance(value, bool):
            raise type_error()
        return value
    raise RpcError(grpc.StatusCode.UNIMPLEMENTED,
                   f"Conversion of JSON Value: {debug_string(value)} to type: {tf_type_name(dtype)}")


def _numpy_dtype(dtype: str):
    return object if dtype == "string" else np.dtype(dtype)


_INT_RANGES = {"int8": (-2 ** 31, 2 ** 31), "int16": (-2 ** 31, 2 ** 31), "int32": (-2 ** 31, 2 ** 31),
               "uint8": (-2 ** 31, 2 ** 31), "int64": (-2 ** 63, 2 ** 63), "uint32": (0, 2 ** 32), "uint64": (0, 2 ** 64)}
