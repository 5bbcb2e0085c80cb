"""TF Serving's JSON tensor codec (tensorflow_serving/util/json_tensor.cc), the part both server and client share.

JSON values -> tensors for the row (`instances`) and columnar (`inputs`) formats, `{"b64": ...}` for binary strings,
JSON Examples for Classify/Regress, tensors and results -> JSON text with TF Serving's float printing (shortest of
`%.6g` that round-trips, else max_digits10), so precision a JSON client loses here it loses there.
"""
from __future__ import annotations

import base64
import itertools
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import numpy as np

from exportkit.serving.server.status import RpcError, invalid_argument

# DataTypeString spellings used in TF Serving's messages
_TF_TYPE_NAMES = {"float32": "float", "float64": "double", "float16": "half"}
BYTES_SUFFIX = "_bytes"
MAX_RANK = 64  # numpy's limit (NPY_MAXDIMS); TF's is 254

_invalid = invalid_argument


def _debug(value, limit: int = 256) -> str:
    """json_tensor.cc JsonValueToDebugString: rapidjson's PrettyWriter (arrays on one line), stopped once `limit`
    bytes are written. Iterative: a value nested 500,000 deep prints its first levels, it does not exhaust a stack."""
    parts: list[str] = []
    size = 0
    stack: list[list] = []  # open containers: [is_object, iterator, tokens written inside]

    def write(text: str) -> bool:
        nonlocal size
        if size >= limit:
            return False
        parts.append(text)
        size += len(text.encode("utf-8", "surrogatepass"))
        return True

    def prefix() -> str:
        if not stack:
            return ""
        is_object, _, count = stack[-1]
        stack[-1][2] += 1
        if not is_object:
            return ", " if count else ""
        if count % 2:
            return ": "
        return (",\n" if count else "\n") + " " * 4 * len(stack)

    def open_value(item) -> None:
        if isinstance(item, (dict, list)):
            if write(prefix() + ("{" if isinstance(item, dict) else "[")):
                stack.append([isinstance(item, dict), iter(item.items() if isinstance(item, dict) else item), 0])
        else:
            write(prefix() + _debug_scalar(item))

    open_value(value)
    while stack and size < limit:
        is_object, items, count = stack[-1]
        item = next(items, _END)
        if item is _END:
            stack.pop()
            write(("\n" + " " * 4 * len(stack) + "}" if count else "}") if is_object else "]")
        elif is_object:
            if write(prefix() + json.dumps(item[0], ensure_ascii=False)):
                open_value(item[1])
        else:
            open_value(item)
    return "".join(parts)


_END = object()


def _debug_scalar(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "NaN" if math.isnan(value) else "-Infinity" if value < 0 else "Infinity"
        return repr(value).replace("e+", "e").replace("e-0", "e-")  # rapidjson: 1e21, 1e-7
    if isinstance(value, int):
        return str(value)
    return json.dumps(value, ensure_ascii=False)


def _json_type(value) -> str:
    if value is None:
        return "Null"
    if isinstance(value, bool):
        return "True" if value else "False"
    return {dict: "Object", list: "Array", str: "String"}.get(type(value), "Number")


# ------------------------------------------------------------------------------------------------ floats
def format_float(value, double: bool = False) -> str:
    """json_tensor.cc WriteDecimal: `%.6g` if it reads back as the same value, else max_digits10; NaN, Infinity."""
    v = float(value)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "-Infinity" if v < 0 else "Infinity"
    cast = float if double else np.float32
    text = "%.6g" % v
    if cast(float(text)) != cast(v):
        text = "%.17g" % v if double else "%.9g" % v
    if "." not in text and "e" not in text:
        text += ".0"
    return text


# ------------------------------------------------------------------------------------------------ JSON -> tensors
def _is_b64(value) -> bool:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("b64"), str)


def _b64decode(value) -> bytes:
    try:
        return base64.b64decode(value["b64"], validate=True)
    except (ValueError, TypeError):
        raise _invalid("Unable to base64 decode") from None


def _scalar(value, dtype: str):
    """json_tensor.cc AddValueToTensor: one JSON value checked against the input's dtype."""
    def type_error():
        return _invalid(f"JSON Value: {_debug(value)} Type: {_json_type(value)} is not of expected type: "
                        f"{_TF_TYPE_NAMES.get(dtype, dtype)}")

    is_int = isinstance(value, int) and not isinstance(value, bool)
    if isinstance(value, dict):
        if dtype == "string":
            if not _is_b64(value):
                raise _invalid(f"JSON Value: {_debug(value)} not formatted correctly for base64 data")
            return _b64decode(value)
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
                 f"Conversion of JSON Value: {_debug(value)} to type: {_TF_TYPE_NAMES.get(dtype, dtype)}")


def _numpy_dtype(dtype: str):
    return object if dtype == "string" else np.dtype(dtype)


_INT_RANGES = {"int8": (-2 ** 31, 2 ** 31), "int16": (-2 ** 31, 2 ** 31), "int32": (-2 ** 31, 2 ** 31),
               "uint8": (-2 ** 31, 2 ** 31), "int64": (-2 ** 63, 2 ** 63), "uint32": (0, 2 ** 32), "uint64": (0, 2 ** 64)}


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
                raise _invalid(f"JSON Value: {_debug(item)} found at incorrect level: {level + 1} in the JSON DOM. "
                               f"Expected at level: {rank}")
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
        raise _invalid(f"JSON Value: {_debug(value)} is a tensor of rank {rank}; at most {MAX_RANK} dimensions are "
                       "supported")
    out = np.empty(len(flat), dtype=_numpy_dtype(dtype)) if dtype == "string" else None
    if out is not None:
        out[:] = flat
        return out.reshape(shape)
    return np.array(flat, dtype=_numpy_dtype(dtype)).reshape(shape)


def _status_text(err) -> str:
    return f"{err.code.name}: {err.message}"


def inputs_from_instances(instances: list, infomap: dict) -> dict[str, np.ndarray]:
    """json_tensor.cc FillTensorMapFromInstancesList (row format)."""
    def is_object(value):
        return isinstance(value, dict) and not _is_b64(value)


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
            raise _invalid(f"Failed to process element: {count} of 'instances' list. JSON object: {_debug(element)} "
                           f"keys must be equal to: {','.join(names)}")
    return {name: np.stack(values) for name, values in rows.items()}


def inputs_from_columns(inputs, infomap: dict) -> dict[str, np.ndarray]:
    """json_tensor.cc FillTensorMapFromInputsMap (columnar format). Keys not in the signature are ignored."""
    if not isinstance(inputs, dict) or _is_b64(inputs):
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


def fill_predict_request(doc: dict, infomap: dict, signature_name: str) -> tuple[dict[str, np.ndarray], bool]:
    """json_tensor.cc FillPredictRequestFromJson after the signature lookup: (input arrays, row format?)."""
    if not infomap:
        raise _invalid(f"Failed to get input map for signature: {signature_name or 'DEFAULT'}")
    if "instances" in doc:
        if "inputs" in doc:
            raise _invalid(f"JSON Value: {_debug(doc)} Not formatted correctly expecting only one of 'inputs' or "
                           "'instances' keys to exist ")
        instances = _array_member(doc, "instances", "Expecting 'instances' to be an list/array",
                                  "No values in 'instances' array")
        return inputs_from_instances(instances, infomap), True
    if "inputs" in doc:
        return inputs_from_columns(doc["inputs"], infomap), False
    raise _invalid("Missing 'inputs' or 'instances' key")


def _array_member(doc: dict, key: str, not_array: str, empty: str) -> list:
    value = doc[key]
    if not isinstance(value, list):
        raise _invalid(f"JSON Value: {_debug(doc)} {not_array}")
    if not value:
        raise _invalid(f"JSON Value: {_debug(doc)} {empty}")
    return value


def parse_json(body: bytes) -> dict:
    """json_tensor.cc ParseJson: rapidjson, NaN/Infinity allowed, rapidjson's own number parsing and error texts
    ("JSON Parse error: Invalid value. at offset: 0"). python-rapidjson refuses nesting past the interpreter's
    recursion limit where TF Serving's iterative parse goes on; such documents are read by `_parse_iteratively`."""
    import rapidjson

    if not body:
        raise _invalid("JSON Parse error: The document is empty")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _invalid(f"JSON Parse error: Invalid encoding in string. at offset: {err.start}") from None
    try:
        doc = rapidjson.loads(text, number_mode=rapidjson.NM_NATIVE | rapidjson.NM_NAN)
    except rapidjson.JSONDecodeError as err:
        raise _invalid(_rapidjson_error(str(err))) from None
    except RecursionError:
        doc = _parse_iteratively(text)
    if not isinstance(doc, dict):
        raise _invalid(f"JSON Value: {_debug(doc)} Is not object")
    return doc


def _rapidjson_error(text: str) -> str:
    """python-rapidjson's "Parse error at offset 7: Invalid value." as TF Serving words it."""
    match = re.fullmatch(r"Parse error at offset (\d+): (.*)", text, re.S)
    return f"JSON Parse error: {match[2]} at offset: {match[1]}" if match else f"JSON Parse error: {text}"


_SPACES = (" ", "\t", "\n", "\r")  # not "": the end of the text
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_OPEN_ARRAYS = re.compile(r"\[(?:[ \t\n\r]*\[)*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_LITERALS = {"true": True, "false": False, "null": None, "NaN": math.nan, "-NaN": math.nan,  # kParseNanAndInfFlag
             "Infinity": math.inf, "-Infinity": -math.inf, "Inf": math.inf, "-Inf": -math.inf}  # longest first


def _parse_iteratively(text: str):
    """A JSON reader with an explicit stack (rapidjson's kParseIterativeFlag), for documents nested too deep for the
    C parser's recursion guard. Slower, and only reached by such documents; errors in rapidjson's words."""
    def fail(message: str, at: int):
        raise _invalid(f"JSON Parse error: {message} at offset: {at}")

    stack: list = []  # open containers
    keys: list = []  # the pending member name of each open object
    state, pos, root = "value", 0, _END
    while root is _END:
        char = text[pos:pos + 1]
        if char in _SPACES:
            pos = _WHITESPACE.match(text, pos).end()
            char = text[pos:pos + 1]
        value = _END
        if state in ("value", "first value"):
            if char == "]" and state == "first value":
                value, pos = stack.pop(), pos + 1
            elif char == "[":  # a run of them at once: deep documents are mostly runs of brackets
                run = _OPEN_ARRAYS.match(text, pos)
                stack.extend([] for _ in range(run[0].count("[")))
                state, pos = "first value", run.end()
            elif char == "{":
                stack.append({})
                keys.append(None)
                state, pos = "first key", pos + 1
            elif char == '"':
                value, pos = _string(text, pos, fail)
            else:
                literal = next((w for w in _LITERALS if text.startswith(w, pos)), None) if char in "tfnNI-" else None
                number = _NUMBER.match(text, pos) if literal is None else None
                if literal is not None:
                    value, pos = _LITERALS[literal], pos + len(literal)
                elif number:
                    value = float(number[0]) if number[1] or number[2] else int(number[0])
                    pos = number.end()
                else:
                    fail("Invalid value.", pos)
        elif state in ("key", "first key"):
            if char == "}" and state == "first key":
                value, pos = stack.pop(), pos + 1
                keys.pop()
            elif char == '"':
                keys[-1], pos = _string(text, pos, fail)
                state = "colon"
            else:
                fail("Missing a name for object member.", pos)
        elif state == "colon":
            if char != ":":
                fail("Missing a colon after a name of object member.", pos)
            state, pos = "value", pos + 1
        else:  # after a value inside a container
            is_list = isinstance(stack[-1], list)
            if char == ",":
                state, pos = "value" if is_list else "key", pos + 1
            elif char == ("]" if is_list else "}"):
                value, pos = stack.pop(), pos + 1
                if not is_list:
                    keys.pop()
            else:
                fail("Missing a comma or ']' after an array element." if is_list else
                     "Missing a comma or '}' after an object member.", pos)
        if value is _END:
            continue
        if not stack:
            root = value
        elif isinstance(stack[-1], list):
            stack[-1].append(value)
        else:
            stack[-1][keys[-1]] = value
        state = "after"
    pos = _WHITESPACE.match(text, pos).end()
    if pos != len(text):
        fail("The document root must not be followed by other values.", pos)
    return root


def _string(text: str, pos: int, fail):
    from json.decoder import scanstring

    try:
        return scanstring(text, pos + 1, True)
    except ValueError as err:
        fail("Missing a closing quotation mark in string." if "Unterminated" in str(err) else
             "Invalid escape character in string.", pos)


def signature_name(doc: dict) -> str:
    name = doc.get("signature_name", "")
    if not isinstance(name, str):
        raise _invalid(f"JSON Value: {_debug(doc)} not formatted correctly. 'signature_name' key must be a string "
                       "value.")
    return name


# ------------------------------------------------------------------------------------------------ fixed-width float32
# A float32 array as JSON numbers all 15 bytes wide (" 1.23456789e-05", "-0.00000000e+00"): the float32's 9
# significant digits (within 0.51 units of the last), which any parse within 2**-30 of the decimal reads back as
# the same float32 (docs/performance.md has the proof; benchmarks/rest_exact.py checks every float32). It is plain
# JSON to every server; this one reads it with numpy instead of building a Python float per number, and only when
# the whole array is exactly in this layout (anything else is read by rapidjson as before). Both directions work
# through the array in blocks of rows, so no temporary is larger than a block: fresh memory costs more than the
# arithmetic on it. The client sends each block as soon as it is written, and the server reads each one as it
# arrives (FixedBodyReader), so the two overlap.
#
# A number's 15 bytes and the byte after it ("," or "]") are its record, written and read as two little-endian
# 64-bit words: byte 0 the sign (" " or "-"), 1 the first digit, 2 ".", 3-10 eight digits, 11 "e", 12 the
# exponent's sign, 13-14 its two digits, 15 the separator. Whole words, not byte fields: a strided byte costs as
# much as a word.
FIXED_WIDTH = 15
_RECORD = np.dtype((np.void, FIXED_WIDTH + 1))
_U64 = np.uint64
_FOUR_DIGITS = np.frombuffer(b"".join(b"%04d" % i for i in range(10000)), "<u4")  # ASCII, as a word holds them
_LEAD = (np.arange(10, dtype=_U64) + ord("0")) << _U64(8) | _U64(ord(".")) << _U64(16)  # bytes 1-2, by first digit
_HIGH = _FOUR_DIGITS.astype(_U64) << _U64(24)  # bytes 3-6: digits 2-5
_LOW_0 = (_FOUR_DIGITS.astype(_U64) & _U64(0xFF)) << _U64(56)  # digits 6-9: byte 7 ...
_LOW_1 = _FOUR_DIGITS.astype(_U64) >> _U64(8)  # ... and bytes 8-10
_EXPONENTS = np.arange(-60, 61)
_EXPONENT = (_U64(ord("e")) << _U64(24) | np.where(_EXPONENTS < 0, ord("-"), ord("+")).astype(_U64) << _U64(32) |
             np.frombuffer(b"".join(b"%02d" % abs(k) for k in _EXPONENTS), "<u2").astype(_U64) << _U64(40))
_SIGN = np.array([ord(" "), ord("-")], _U64)
_FIXED_MAX_RANK = 32
_BLOCK_NUMBERS = 1 << 16  # numbers of a block of text
_CHUNK_NUMBERS = 1 << 14  # numbers converted at a time: the temporaries stay in cache
# rapidjson's Pow10 table (internal/pow10.h): the correctly rounded doubles of the literals 1e0 ... 1e308
_POW10 = np.array([float(f"1e{k}") for k in range(309)])
_TEN_TO = np.array([float(f"1e{k}") for k in range(-60, 61)])  # 10**k at k + 60, for the encoders' scaling


def _bytes_of(value: int, positions) -> int:
    """A word with `value` in each of the byte positions."""
    return sum(value << (8 * p) for p in positions)


def fixed_words(array: np.ndarray, separators: np.ndarray | int = ord(",")) -> np.ndarray:
    """A finite float32 array's numbers as records, (n, 2) words; `separators` (the byte after each number,
    broadcast over them) in byte 15."""
    flat = np.ravel(array)
    separators = np.broadcast_to(np.asarray(separators, _U64), flat.shape)
    words = np.empty((flat.size, 2), _U64)
    for start in range(0, flat.size, _CHUNK_NUMBERS):
        end = start + _CHUNK_NUMBERS
        words[start:end] = _fixed_chunk_words(flat[start:end], separators[start:end])
    return words


def _fixed_chunk_words(array: np.ndarray, separators: np.ndarray) -> np.ndarray:
    """fixed_words of a chunk."""
    value = array.astype(np.float64)
    magnitude = np.abs(value)
    zero = magnitude == 0
    magnitude[zero] = 1.0
    exponent = np.floor(np.log10(magnitude)).astype(np.intp)
    # magnitude * 10**(8 - exponent), rounded: within 2**-52 before the rounding, so the decimal is within 0.51
    # units of its 9th digit of the float32 (the proof has room for 2.9)
    significand = np.rint(magnitude * _TEN_TO[68 - exponent])
    for off, step in ((significand >= 1e9, 1), (significand < 1e8, -1)):  # log10 one off next to a power of ten
        if off.any():
            exponent[off] += step
            significand[off] = np.rint(magnitude[off] * _TEN_TO[68 - exponent[off]])
    significand[zero] = 0
    exponent[zero] = 0
    digits = significand.astype(np.intp)
    lead, rest = np.divmod(digits, 100000000)
    high, low = np.divmod(rest, 10000)
    words = np.empty((value.size, 2), _U64)
    first, second = words[:, 0], words[:, 1]
    np.take(_LEAD, lead, out=first)
    first |= _HIGH[high]
    first |= _LOW_0[low]
    first |= _SIGN[np.signbit(value).view(np.uint8)]
    np.take(_LOW_1, low, out=second)
    exponent += 60
    second |= _EXPONENT[exponent]
    second |= separators << _U64(56)
    return words


def _fixed_row(shape: tuple[int, ...]) -> tuple[bytes, list[int]]:
    """The text of one element of the outermost dimension, blanks for its numbers; the distance between consecutive
    indices of each dimension in the whole array's text (its numbers are a strided view of the text)."""
    row, strides = b" " * FIXED_WIDTH, [FIXED_WIDTH + 1]
    for size in reversed(shape[1:]):
        row = b"[" + b",".join([row] * size) + b"]"
        strides.insert(0, len(row) + 1)
    return row, strides


def _block_rows(shape: tuple[int, ...]) -> int:
    return max(1, _BLOCK_NUMBERS // max(1, math.prod(shape[1:])))


def _records(text: np.ndarray | bytes, shape: tuple[int, ...], offset: int, strides: list[int],
             dtype: np.dtype = _RECORD) -> np.ndarray:
    """The numbers' records (or, with a 15-byte dtype, their texts) of a fixed_json array of `shape` in `text`, the
    first at `offset`."""
    return np.ndarray(shape, dtype, text, offset, strides)


def _row_offsets(shape: tuple[int, ...], strides: list[int]) -> np.ndarray:
    """Where each number of a row starts in the row's text, in C order."""
    offsets = np.array([len(shape) - 1])
    for size, stride in zip(shape[1:], strides[1:]):
        offsets = (offsets[:, None] + np.arange(size) * stride).ravel()
    return offsets


def fixed_json_pieces(array: np.ndarray, head: bytes = b"", tail: bytes = b"") -> tuple[int, Iterator[memoryview]]:
    """head + a finite float32 array (no dimension 0) as JSON in the fixed-width layout + tail, no whitespace around
    its brackets and commas ("[[ 1.00000000e+00, 2.00000000e+00],[...]]"): (its length in bytes, its successive
    pieces, each block's numbers written just before its piece is taken, so a client sends one while writing the
    next)."""
    row, strides = _fixed_row(array.shape)
    step, count, at = len(row) + 1, array.shape[0], len(head)
    text = np.empty(at + count * step + 1 + len(tail), np.uint8)
    text[:at] = np.frombuffer(head, np.uint8)
    text[at] = ord("[")
    rows = text[at + 1:at + 1 + count * step].reshape(count, step)
    rows[:, :-1] = np.frombuffer(row, np.uint8)
    rows[:, -1] = ord(",")
    closing = at + count * step
    text[closing] = ord("]")
    text[closing + 1:] = np.frombuffer(tail, np.uint8)
    separators = np.frombuffer(row + b",", np.uint8)[_row_offsets(array.shape, strides) + FIXED_WIDTH]

    def pieces() -> Iterator[memoryview]:
        block, done = _block_rows(array.shape), 0
        for first in range(0, count, block):
            part = array[first:first + block]
            words = fixed_words(part, np.tile(separators, len(part)))
            _records(text, part.shape, at + array.ndim + first * step, strides)[...] = \
                words.view(_RECORD).reshape(part.shape)
            text[closing] = ord("]")  # a one-dimensional array's last number wrote its separator there
            end = len(text) if first + block >= count else at + 1 + (first + block) * step
            yield text[done:end].data
            done = end

    return len(text), pieces()


def fixed_json(array: np.ndarray, head: bytes = b"", tail: bytes = b"") -> bytes:
    """fixed_json_pieces' text, whole."""
    return b"".join(fixed_json_pieces(array, head, tail)[1])


# the bytes of a record that must be digits, and the constant ones, in its two words
_DIGITS_0, _DIGITS_1 = _bytes_of(0xFF, (1, 3, 4, 5, 6, 7)), _bytes_of(0xFF, (0, 1, 2, 5, 6))
_POINT, _E = _bytes_of(0xFF, (2,)), _bytes_of(0xFF, (3,))


def _digits_and(word: np.ndarray, digits: int, constant: int, value: int) -> np.ndarray:
    """Where the word's `digits` bytes are ASCII digits and its `constant` bytes are `value`."""
    high, zeros, six = digits & 0xF0F0F0F0F0F0F0F0, digits & 0x3030303030303030, digits & 0x0606060606060606
    ok = (word & _U64(high | constant)) == _U64(zeros | value)
    ok &= ((word + _U64(six)) & _U64(high)) == _U64(zeros)  # a digit's byte + 6 stays below 0x40
    return ok


def read_fixed_words(words: np.ndarray) -> np.ndarray | None:
    """The doubles rapidjson reads from records ((n, 2) words), None unless every one has the layout's characters."""
    values = np.empty(len(words))
    for start in range(0, len(words), _CHUNK_NUMBERS):
        chunk = _read_fixed_chunk(words[start:start + _CHUNK_NUMBERS])
        if chunk is None:
            return None
        values[start:start + _CHUNK_NUMBERS] = chunk
    return values


def _read_fixed_chunk(words: np.ndarray) -> np.ndarray | None:
    """read_fixed_words of a chunk."""
    first, second = words[:, 0], words[:, 1]
    sign, exponent_sign = first & _U64(0xFF), (second >> _U64(32)) & _U64(0xFF)
    if not (_digits_and(first, _DIGITS_0, _POINT, ord(".") << 16).all() and
            _digits_and(second, _DIGITS_1, _E, ord("e") << 24).all() and
            ((sign == ord(" ")) | (sign == ord("-"))).all() and
            ((exponent_sign == ord("+")) | (exponent_sign == ord("-"))).all()):
        return None
    # reader.h ParseNumber: the digits as one integer (exact in a double), then internal/strtod.h
    # StrtodNormalPrecision (TF Serving parses without kParseFullPrecisionFlag): one division or multiplication by
    # a Pow10 double, the minus sign last
    eight = (first >> _U64(24)) | (second << _U64(40))  # bytes 3-10: the digits after the point
    eight -= _U64(0x3030303030303030)
    eight = (eight * _U64(10) + (eight >> _U64(8))) & _U64(0x00FF00FF00FF00FF)  # SWAR: pairs, fours, then eight
    eight = (eight * _U64(100) + (eight >> _U64(16))) & _U64(0x0000FFFF0000FFFF)
    eight = (eight * _U64(10000) + (eight >> _U64(32))) & _U64(0xFFFFFFFF)
    eight += (((first >> _U64(8)) & _U64(0xFF)) - _U64(ord("0"))) * _U64(100000000)
    values = eight.astype(np.float64)
    exponent = (((second >> _U64(40)) & _U64(0xFF)) * _U64(10) + ((second >> _U64(48)) & _U64(0xFF))).astype(np.intp)
    exponent -= ord("0") * 11
    power = exponent * (((second >> _U64(33)) & _U64(1)).astype(np.intp) * 2 - 1)  # bit 1: 1 in "+", 0 in "-"
    power -= 8
    scale = _POW10[np.abs(power)]
    up = power >= 0
    if up.any():
        values[up] *= scale[up]
        scale[up] = 1.0
    values /= scale
    values.view(_U64)[...] |= (first & _U64(1)) << _U64(63)  # bit 0: 0 in " ", 1 in "-": the minus, as a sign bit
    return values


def _fixed_shape(text: bytes | bytearray, total: int) -> tuple[int, ...] | None:
    """The shape a fixed_json array of `total` bytes has whose text starts `text` (its first row at least), from its
    first element's brackets; None if it cannot be one."""
    head = text[:_FIXED_MAX_RANK + 1]
    rank = len(head) - len(head.lstrip(b"["))
    if not 0 < rank <= _FIXED_MAX_RANK:
        return None
    shape, width = [], FIXED_WIDTH
    for level in range(rank - 1, -1, -1):
        # the first list of this level starts at `level` and ends with the first run of (rank - level) "]"
        span = text.find(b"]" * (rank - level)) + rank - 2 * level if level else total
        size, rest = divmod(span - 1, width + 1)
        if rest or size < 1:
            return None
        shape.append(size)
        width = span
    return tuple(reversed(shape))


class _FixedArrayStream:
    """A fixed_json array of `total` bytes read as its text arrives, a block of rows at a time, so the reading of
    one block overlaps the arrival of the next: `values` (rapidjson's doubles, in its shape) once `complete`, None
    as soon as the text is not exactly in the layout. Whatever the pieces' sizes, each byte is copied and searched
    a bounded number of times."""
    _LARGEST_ROW = 64 << 20  # text held while waiting for the first row to end: beyond this, not the layout

    def __init__(self, total: int):
        self.total, self.text, self.offset = total, bytearray(), 0  # offset: of self.text in the array's text
        self.values, self.failed, self.first, self.searched = None, total < 2, 0, 0  # first: the next row to read

    @property
    def complete(self) -> bool:
        return not self.failed and self.values is not None and self.first == self.values.shape[0]

    def feed(self, data: bytes) -> None:
        if self.failed or self.complete:
            self.failed = self.failed or bool(data)
            return
        self.text += data
        if self.values is None and not self._start():
            return
        shape, count = self.values.shape, self.values.shape[0]
        number = np.dtype((np.void, FIXED_WIDTH))
        while self.first < count:
            rows = min(self.block, count - self.first)
            last = self.first + rows == count
            end = self.total if last else 1 + (self.first + rows) * self.step  # the block's text, then "," or "]"
            if self.offset + len(self.text) < end:
                return
            at = 1 + self.first * self.step - self.offset
            part = (rows,) + shape[1:]
            # everything but the numbers as the blank text has it
            _records(self.expected, part, len(shape) - 1, self.strides, number)[...] = \
                _records(self.text, part, at + len(shape) - 1, self.strides, number)
            size = rows * self.step - last  # the last row is followed by the closing "]"
            if not np.array_equal(self.expected[:size], np.frombuffer(self.text, np.uint8, size, at)) or \
                    last and self.text[end - self.offset - 1] != ord("]"):
                self.failed = True
                return
            words = np.ascontiguousarray(_records(self.text, part, at + len(shape) - 1, self.strides))
            numbers = read_fixed_words(words.view(_U64).reshape(-1, 2))
            if numbers is None:
                self.failed = True
                return
            self.values[self.first:self.first + rows] = numbers.reshape(part)
            self.first += rows
            del self.text[:end - self.offset]
            self.offset = end
        self.failed = bool(self.text)  # nothing may follow the closing "]"

    def _start(self) -> bool:
        """The shape and layout once the text tells them (`_fixed_shape`): its rank, and its first row whole;
        False while it does not (or never will)."""
        head = self.text[:_FIXED_MAX_RANK + 1]
        rank = len(head) - len(head.lstrip(b"["))
        if rank == len(head) <= _FIXED_MAX_RANK:
            return False
        if 1 < rank <= _FIXED_MAX_RANK:  # the first row ends with the first run of rank - 1 "]"
            found = self.text.find(b"]" * (rank - 1), max(0, self.searched - rank))
            self.searched = len(self.text)
            if found < 0:
                self.failed = len(self.text) > min(self.total, self._LARGEST_ROW)
                return False
        shape = _fixed_shape(self.text, self.total)
        row, self.strides = _fixed_row(shape) if shape else (b"", [])
        self.step = len(row) + 1
        if shape is None or self.total != shape[0] * self.step + 1:
            self.failed = True
            return False
        self.block = _block_rows(shape)
        self.expected = np.tile(np.frombuffer(row + b",", np.uint8), min(self.block, shape[0]))
        self.values = np.empty(shape)
        return True


def read_fixed_array(text: bytes, start: int = 0, stop: int | None = None) -> np.ndarray | None:
    """The doubles rapidjson reads from text[start:stop] if it is a fixed_json array (in its shape), else None (then
    the JSON parser reads it)."""
    stop = len(text) if stop is None else stop
    stream = _FixedArrayStream(stop - start)
    stream.feed(text[start:stop])
    return stream.values if stream.complete else None


@dataclass(frozen=True)
class FixedBody:
    """A Predict body `{"signature_name": "...", "instances": <a fixed_json array>}`, read without its array's numbers
    becoming Python objects."""
    doc: dict  # the body as parse_json reads it, with 0 in place of the array
    values: np.ndarray  # the array's numbers as TF Serving's parse reads them (doubles), in the array's shape

    def inputs(self, infomap: dict) -> dict[str, np.ndarray] | None:
        """What fill_predict_request gives for this body, if the signature has one float input; None otherwise
        (then the whole body is read the ordinary way, so every refusal keeps its words)."""
        if len(infomap) != 1 or next(iter(infomap.values())) not in ("float32", "float64"):
            return None
        ((name, dtype),) = infomap.items()
        with np.errstate(over="ignore"):  # a double beyond float32's range is inf, as GetFloat() gives
            return {name: self.values.astype(dtype)}


class FixedBodyReader:
    """parse_fixed_body of a body of `length` bytes, fed as it arrives (http_server's body reader): its array's
    blocks are read while the client still sends the next ones."""
    _MEMBER = b'"instances":['
    _LONGEST_HEAD = 64 << 10  # the text before "instances" (a signature name): beyond this, the ordinary way

    def __init__(self, length: int):
        self.length, self.head, self.array, self.given, self.failed = length, bytearray(), None, 0, False

    def feed(self, data: bytes) -> None:
        if self.failed:
            return
        if self.array is None:
            searched, held = max(0, len(self.head) - len(self._MEMBER) + 1), len(self.head)
            self.head += data[:self._LONGEST_HEAD + len(self._MEMBER) - held]
            found = self.head.find(self._MEMBER, searched)
            if found < 0:
                self.failed = len(self.head) >= self._LONGEST_HEAD + len(self._MEMBER)
                return
            self.at = found + len(self._MEMBER) - 1  # the array's "["
            self.array = _FixedArrayStream(self.length - 1 - self.at)  # up to the body's closing "}"
            self._give(bytes(self.head[self.at:]))
            data, self.head = memoryview(data)[len(self.head) - held:], None
        self._give(data)

    def _give(self, data) -> None:
        """The array's text, and nothing after it."""
        data = data[:self.array.total - self.given]
        self.given += len(data)
        self.array.feed(data)

    def body(self, body: bytes) -> FixedBody | None:
        """The FixedBody of the whole `body` (what was fed), or None: see parse_fixed_body."""
        if self.array is None or not self.array.complete or body[-1:] != b"}" or len(body) != self.length:
            return None
        try:
            doc = parse_json(body[:self.at] + b"0}")
        except RpcError:
            return None
        if set(doc) - {"signature_name"} != {"instances"} or not isinstance(doc.get("signature_name", ""), str):
            return None
        return FixedBody(doc, self.array.values)


def parse_fixed_body(body: bytes) -> FixedBody | None:
    """A FixedBody when `body` is one (its "instances" the last member, in the fixed layout, and no other member
    than "signature_name", a string), else None. What is read is what parse_json and fill_predict_request read: the
    rest of the body goes through parse_json, the numbers through rapidjson's own arithmetic (read_fixed_words)."""
    reader = FixedBodyReader(len(body))
    reader.feed(body)
    return reader.body(body)


# ------------------------------------------------------------------------------------------------ tensors -> JSON
def _json_scalar(value, dtype: str, as_bytes: bool) -> str:
    if dtype in ("float32", "float64"):
        return format_float(value, double=dtype == "float64")
    if dtype == "bool":
        return "true" if value else "false"
    if dtype == "string":
        raw = bytes(value)
        if as_bytes:
            return '{"b64": "' + base64.b64encode(raw).decode("ascii") + '"}'
        # TF Serving writes the bytes as they are: not valid UTF-8 stays not valid UTF-8 (see write_json).
        return json.dumps(raw.decode("utf-8", "surrogateescape"), ensure_ascii=False)
    if dtype in ("int32", "int16", "int8", "uint8", "int64", "uint32", "uint64"):  # AddSingleValueAndAdvance
        return str(int(value))
    raise _invalid(f"Failed to write JSON value for tensor type: {_TF_TYPE_NAMES.get(dtype, dtype)}")


def _float_texts(value: np.ndarray, double: bool) -> list[str]:
    """format_float of every element (C order)."""
    if _by_cells(value, double):
        return _float32_rows(np.ravel(value), 0)[0].split(", ")
    return _python_float_texts(value, double)


def _float_rows(value: np.ndarray, double: bool) -> list[str]:
    """format_float of every element (C order), ", "-joined a row (last dimension) at a time."""
    step = value.shape[-1]
    if _by_cells(value, double):
        return _float32_rows(value, step)
    texts = _python_float_texts(value, double)
    return [", ".join(texts[i:i + step]) for i in range(0, len(texts), step)]


def _by_cells(value: np.ndarray, double: bool) -> bool:
    """Whether _float32_rows formats the array: float32, and enough numbers to pay for its ~45 numpy calls."""
    return not double and value.dtype == np.float32 and value.size >= _CELLS_FROM


_CELLS_FROM = 256  # below: ~90 us of numpy calls cost more than Python takes (15 us + 430 ns a number)
_CELLS_BLOCK = 1 << 14  # numbers a block: temporaries stay in the cache


def _python_float_texts(value: np.ndarray, double: bool) -> list[str]:
    """format_float of every element (C order) formatted by Python a list at a time (numpy's char functions took
    ~2 us an element), `%.6g` read back by numpy only where it may read back as the value."""
    with np.errstate(invalid="ignore"):  # a signalling NaN
        v = np.ravel(value).astype(np.float64)
    numbers = v.tolist()
    short = np.ones(v.shape, bool) if double else _may_be_six_digits(v)
    texts = [format(f, ".6g" if s else ".9g") for f, s in zip(numbers, short.tolist())]
    cast = np.float64 if double else np.float32
    finite = np.isfinite(v)
    tried = np.flatnonzero(short & finite)
    reread = np.array([texts[i] for i in tried.tolist()], dtype=np.float64)
    with np.errstate(over="ignore"):
        long = tried[reread.astype(cast) != v[tried].astype(cast)]
    spec = ".17g" if double else ".9g"
    for i in long.tolist():
        texts[i] = format(numbers[i], spec)
    texts = [t if "." in t or "e" in t or "n" in t else t + ".0" for t in texts]  # "n": nan, inf (below)
    for i in np.flatnonzero(~finite).tolist():
        texts[i] = "NaN" if math.isnan(numbers[i]) else "-Infinity" if numbers[i] < 0 else "Infinity"
    return texts


def _may_be_six_digits(v: np.ndarray) -> np.ndarray:
    """False where a float32's `%.6g` certainly does not read back as it: the 6-digit decimal nearest to it is
    more than half a float32 spacing away (computed to ~1e-9 of a 6th digit's unit, decided with a 1e-6 margin).
    Most model outputs need 9 digits; this skips formatting and reading them twice."""
    magnitude = np.abs(v)
    usual = np.isfinite(magnitude) & (magnitude > 0)
    magnitude = np.where(usual, magnitude, 1.0)
    scale = _TEN_TO[65 - np.floor(np.log10(magnitude)).astype(np.int64)]  # 10**(5 - exponent): 6 digits
    scaled = magnitude * scale
    off = np.abs(scaled - np.rint(scaled))
    with np.errstate(over="ignore"):  # the float32 maximum's spacing: inf, so never certain
        half_spacing = np.spacing(magnitude.astype(np.float32)).astype(np.float64) / 2 * scale
    certain = usual & (scaled >= 1e5) & (scaled < 1e6) & (off > half_spacing + 1e-6)
    return ~certain


# format_float for a float32 array without a Python object per number: numpy writes each number's text into a cell
# of fixed fields, NUL where the text has no character, and the NULs' removal leaves the texts one after the other.
# The cell: sign and the digit of 10**8, the digits of 10**7 ... 10**0, point, 12 digits of fraction, "e" and the
# exponent, separator (", ", or "\n" after a row). `%.6g` and `%.9g` both fit: positional when -4 <= exponent <
# precision, so at most 9 digits before the point and 12 after it.
_FLOAT_CELL = np.dtype({"names": ["head", "high", "units", "point", "f1", "f2", "f3", "exponent", "separator"],
                        "formats": ["<u2", "<u4", "<u4", "u1", "<u4", "<u4", "<u4", "<u4", "<u2"],
                        "offsets": [0, 2, 6, 10, 11, 15, 19, 23, 27], "itemsize": 29})
_TEXT_BYTES = 27  # the cell without its separator


def _words(texts, dtype="<u4") -> np.ndarray:
    """Texts as little-endian words of the dtype's size, NUL-padded on the right: one write puts several bytes."""
    size = np.dtype(dtype).itemsize
    return np.frombuffer(b"".join(t.ljust(size, b"\0") for t in texts), dtype)


# by 10 * negative + digit of 10**8
_HEADS = _words([sign + (b"%d" % d if d else b"\0") for sign in (b"\0", b"-") for d in range(10)], "<u2")
# four digits by number + 10000 * (whether digits precede); the units digit is always written (0.5, not .5)
_HIGH_WORDS = np.concatenate([_words((b"%d" % i).rjust(4, b"\0") if i else b"" for i in range(10000)),
                              _FOUR_DIGITS])
_UNITS_WORDS = np.concatenate([_words((b"%d" % i).rjust(4, b"\0") for i in range(10000)), _FOUR_DIGITS])
# four digits of fraction by number + 10000 * (whether digits follow) + 20000 * (".0": a positional whole number)
_FRACTION_WORDS = np.concatenate([_words((b"%04d" % i).rstrip(b"0") for i in range(10000)), _FOUR_DIGITS,
                                  _words([b"0"])])
_EXPONENT_WORDS = _words([b""] + [b"e%+03d" % k for k in range(-60, 61)])  # "e-05" at k + 61, none at 0
_NOT_FINITE = np.frombuffer(b"".join(t.ljust(_TEXT_BYTES, b"\0") for t in (b"NaN", b"-Infinity", b"Infinity")),
                            np.uint8).reshape(3, _TEXT_BYTES)
_SEPARATORS = np.full(_CELLS_BLOCK, ord(",") | ord(" ") << 8, np.uint16)


def _float32_rows(value: np.ndarray, step: int) -> list[str]:
    """format_float of every element of a float32 array (C order), ", "-joined `step` numbers at a time (all if 0)."""
    flat = np.ravel(value)
    step = step or flat.size
    with np.errstate(invalid="ignore", over="ignore"):  # a signalling NaN; 6 digits read back as beyond float32
        text = "".join(_float32_block(flat[i:i + _CELLS_BLOCK], step, i) for i in range(0, flat.size, _CELLS_BLOCK))
    return text.split("\n")[:-1]


def _times_ten_to(x: np.ndarray, k: np.ndarray) -> np.ndarray:
    """x * 10**k, rounded once where |k| <= 22 (10**|k| a double): multiplied by 10**k or divided by 10**-k."""
    return x * _TEN_TO[60 + np.maximum(k, 0)] / _TEN_TO[60 - np.minimum(k, 0)]


def _float32_block(value: np.ndarray, step: int, start: int) -> str:
    """The texts of float32 numbers, each followed by ", " or, where a row of `step` ends (counted from `start`), by
    a newline: json_tensor.cc WriteDecimal's `%.6g` if it reads back as the same float32, else `%.9g`. The digits
    are worked out in doubles: every value is an integer below 2**53, so exact, and floor(a / 10**k) too."""
    v = value.astype(np.float64)
    magnitude = np.abs(v)
    finite = np.isfinite(v)
    usual = finite & (magnitude > 0)
    magnitude[~usual] = 1.0
    # 9 and 6 significant digits: magnitude * 10**(8 - exponent) and * 10**(5 - exponent). Exact where that power
    # is at most 10**12 (24 bits times 5**12 fit in 53), so rint rounds a tie (1027997.375) to even as `%g` does;
    # elsewhere within 2**-52 of the product, certain unless within 1e-6 of a half: Python formats those (below)
    exponent = np.floor(np.log10(magnitude)).astype(np.intp)
    scaled = magnitude * _TEN_TO[68 - exponent]
    exponent += scaled >= 1e9  # log10 one off next to a power of ten
    exponent -= scaled < 1e8
    nine = magnitude * _TEN_TO[68 - exponent]
    six = _times_ten_to(magnitude, 5 - exponent)  # and exact ties up to exponent 7 (1234565.0)
    unsure = ((np.abs(nine - np.floor(nine) - 0.5) < 1e-6) & ((exponent < -4) | (exponent > 8)) |
              (np.abs(six - np.floor(six) - 0.5) < 1e-6) & ((exponent < -7) | (exponent > 7)))
    nine, six = np.rint(nine), np.rint(six)
    # `%.6g` read back: the double nearest the decimal six * 10**(exponent - 5) is this, from -17 to 27 (one
    # rounding); elsewhere within 2**-50 of it, and as a float32 certain unless the ends of that interval differ
    reread = _times_ten_to(six, exponent - 5)
    slack = ((exponent < -17) | (exponent > 27)) * 2 ** -50
    low = (reread * (1 - slack)).astype(np.float32)
    high = (reread * (1 + slack)).astype(np.float32)  # the float32 maximum's: inf, so unsure
    unsure |= low != high
    short = low == magnitude.astype(np.float32)
    digits = np.where(short, six * 1000, nine)  # 9 digits either way, the 6 followed by 000
    carry = digits >= 1e9  # 999999999.7 rounds to 10**9: 1.00000000e(exponent + 1)
    exponent += carry
    digits[carry] = 1e8
    digits[~usual] = 0  # 0, -0 (the others are replaced below)
    exponent[~usual] = 0
    positional = (exponent >= -4) & (exponent < 9 - 3 * short)
    point = exponent * positional  # scientific: d.dddddddd
    unit = _TEN_TO[68 - point]
    whole = np.floor(digits / unit)
    fraction = (digits - whole * unit) * _TEN_TO[64 + point]  # 12 digits after the point
    top = np.floor(whole / 1e8)
    high4 = np.floor(whole / 1e4)
    first4 = np.floor(fraction / 1e8)
    low8 = fraction - first4 * 1e8
    middle4 = np.floor(low8 / 1e4)
    last4 = low8 - middle4 * 1e4

    cells = np.empty(v.size, _FLOAT_CELL)
    cells["head"] = _HEADS[(top + 10 * np.signbit(v)).astype(np.intp)]
    cells["high"] = _HIGH_WORDS[(high4 - top * 1e4 + 1e4 * (top > 0)).astype(np.intp)]
    cells["units"] = _UNITS_WORDS[(whole - high4 * 1e4 + 1e4 * (high4 > 0)).astype(np.intp)]
    cells["point"] = (positional | (fraction > 0)) * np.uint8(ord("."))
    cells["f1"] = _FRACTION_WORDS[(first4 + 1e4 * (low8 > 0) + 2e4 * (positional & (fraction == 0))).astype(np.intp)]
    cells["f2"] = _FRACTION_WORDS[(middle4 + 1e4 * (last4 > 0)).astype(np.intp)]
    cells["f3"] = _FRACTION_WORDS[last4.astype(np.intp)]
    cells["exponent"] = _EXPONENT_WORDS[(exponent + 61) * ~positional]
    cells["separator"] = _SEPARATORS[:v.size]
    cells["separator"][(step - 1 - start) % step::step] = ord("\n")
    raw = cells.view(np.uint8).reshape(v.size, _FLOAT_CELL.itemsize)
    if not finite.all():
        special = np.flatnonzero(~finite)
        raw[special, :_TEXT_BYTES] = _NOT_FINITE[np.where(np.isnan(v[special]), 0, 1 + (v[special] > 0))]
    rare = np.flatnonzero(unsure & usual)
    if rare.size:
        texts = [t.encode("ascii").ljust(_TEXT_BYTES, b"\0") for t in _python_float_texts(value[rare], False)]
        raw[rare, :_TEXT_BYTES] = np.frombuffer(b"".join(texts), np.uint8).reshape(rare.size, _TEXT_BYTES)
    return cells.tobytes().translate(None, b"\0").decode("ascii")


def _json_array(value: np.ndarray, dtype: str, as_bytes: bool) -> str:
    if not isinstance(value, np.ndarray):
        return _json_scalar(value, dtype, as_bytes)
    if value.ndim == 0:
        return _json_scalar(value.item() if dtype != "string" else value[()], dtype, as_bytes)
    if dtype in ("float32", "float64") and value.size:
        rows = _float_rows(value, dtype == "float64")
        return "[" + (rows[0] if value.ndim == 1 else ", ".join(_nested(rows, value.shape))) + "]"
    return "[" + ", ".join(_json_array(v, dtype, as_bytes) for v in value) + "]"


def _row_texts(value: np.ndarray, dtype: str, as_bytes: bool) -> list[str]:
    """_json_array of each value[i], the floats formatted in one pass."""
    if dtype not in ("float32", "float64") or not value.size:
        return [_json_array(v, dtype, as_bytes) for v in value]
    if value.ndim == 1:
        return _float_texts(value, dtype == "float64")
    return _nested(_float_rows(value, dtype == "float64"), value.shape)


def _nested(rows: list[str], shape: tuple[int, ...]) -> list[str]:
    """The JSON arrays value[i] of an array of `shape` (rank >= 2, no dimension 0) from its rows' texts ("1.0, 2.0",
    C order): bracketed and joined a dimension at a time, not a Python call per row."""
    arrays = ["[" + row + "]" for row in rows]
    for size in reversed(shape[1:-1]):
        arrays = ["[" + ", ".join(arrays[i:i + size]) + "]" for i in range(0, len(arrays), size)]
    return arrays


def _dtype_of(value: np.ndarray) -> str:
    return "string" if value.dtype == object or value.dtype.kind in "SU" else value.dtype.name


def predict_json(outputs: dict[str, np.ndarray], row: bool) -> str:
    """json_tensor.cc MakeRowFormatJsonFromTensors / MakeColumnarFormatJsonFromTensors."""
    if not outputs:
        raise _invalid("Cannot convert empty tensor map to JSON")
    names = sorted(outputs)
    arrays = {n: np.asarray(outputs[n]) for n in names}
    kinds = {n: _dtype_of(a) for n, a in arrays.items()}
    as_bytes = {n: kinds[n] == "string" and n.endswith(BYTES_SUFFIX) for n in names}
    many = len(names) > 1
    if not row:
        parts = {n: _json_array(arrays[n], kinds[n], as_bytes[n]) for n in names}
        body = ("{" + ", ".join(f"{json.dumps(n)}: {parts[n]}" for n in names) + "}") if many else parts[names[0]]
        return '{\n    "outputs": ' + body + "\n}"
    batch = None
    for n in names:
        if arrays[n].ndim == 0:
            raise _invalid(f"Tensor name: {n} has no shape information ")
        if batch is not None and arrays[n].shape[0] != batch:
            raise _invalid(f"Tensor name: {n} has inconsistent batch size: {arrays[n].shape[0]} expecting: {batch}")
        batch = arrays[n].shape[0]
    rows = {n: _row_texts(arrays[n], kinds[n], as_bytes[n]) for n in names}
    items = []
    for i in range(batch):
        items.append(("{" + ", ".join(f"{json.dumps(n)}: {rows[n][i]}" for n in names) + "}") if many
                     else rows[names[0]][i])
    return '{\n    "predictions": [' + ",\n        ".join(items) + "\n    ]\n}"


def classify_json(result) -> str:
    if not result.classifications:
        raise _invalid("Cannot convert empty ClassificationResults to JSON")
    rows = []
    for classifications in result.classifications:
        rows.append("[" + ", ".join(f"[{json.dumps(c.label, ensure_ascii=False)}, {format_float(c.score)}]"
                                    for c in classifications.classes) + "]")
    return '{\n    "results": [' + ",\n        ".join(rows) + "\n    ]\n}"


def regress_json(result) -> str:
    if not result.regressions:
        raise _invalid("Cannot convert empty RegressionResults to JSON")
    return '{\n    "results": [' + ", ".join(format_float(r.value) for r in result.regressions) + "]\n}"


def error_json(message: str) -> str:
    return "{\n    \"error\": " + json.dumps(message, ensure_ascii=False) + "\n}"


# ------------------------------------------------------------------------------------------------ JSON Examples
def example_from_json(value, example) -> None:
    """json_tensor.cc MakeExampleFromJsonObject: strings and b64 -> bytes, JSON doubles -> floats, ints/bools -> int64."""
    if not isinstance(value, dict):
        raise _invalid(f"Example must be JSON object but got JSON {_json_type(value)}")
    for name, content in value.items():
        feature = example.features.feature[name]
        feature.Clear()
        for item in content if isinstance(content, list) else [content]:
            kind = feature.WhichOneof("kind")

            def want(k):
                if kind not in (None, k):
                    shown = {"bytes_list": "bytes", "float_list": "float", "int64_list": "int64"}[kind]
                    raise _invalid(f"Unexpected element type in feature: {name} expecting type: {shown}")

            if item is None or isinstance(item, list) or (isinstance(item, dict) and not _is_b64(item)):
                raise _invalid(f"Feature: {name} has element with unexpected JSON type: {_json_type(item)}")
            if isinstance(item, bool):
                want("int64_list")
                feature.int64_list.value.append(1 if item else 0)
            elif isinstance(item, dict):
                want("bytes_list")
                feature.bytes_list.value.append(_b64decode(item))
            elif isinstance(item, str):
                want("bytes_list")
                feature.bytes_list.value.append(item.encode("utf-8"))
            elif isinstance(item, float):
                want("float_list")
                feature.float_list.value.append(item)
            else:
                want("int64_list")
                if item >= 2 ** 63:
                    raise _invalid(f"Feature: {name} has uint64_t element. Only int64_t is supported.")
                feature.int64_list.value.append(item)


def example_to_json(serialized: bytes) -> dict:
    """A serialized tf.Example as the JSON object TF Serving's classify/regress accept (bytes as b64 unless UTF-8)."""
    from exportkit.tfexample.signatures import parse_example

    out = {}
    for name, feature in parse_example(serialized).features.feature.items():
        kind = feature.WhichOneof("kind")
        if kind == "bytes_list":
            values = []
            for raw in feature.bytes_list.value:
                try:
                    values.append(raw.decode("utf-8"))
                except UnicodeDecodeError:
                    values.append({"b64": base64.b64encode(raw).decode("ascii")})
        elif kind == "float_list":
            values = [float(v) for v in feature.float_list.value]
        elif kind == "int64_list":
            values = [int(v) for v in feature.int64_list.value]
        else:
            values = []
        out[name] = values
    return out


def fill_example_input(doc: dict, input_proto) -> None:
    """json_tensor.cc FillClassifyRegressRequestFromJson: optional `context`, required non-empty `examples`."""
    context = "context" in doc
    if context:
        example_from_json(doc["context"], input_proto.example_list_with_context.context)
    if "examples" not in doc:
        raise _invalid(f"JSON Value: {_debug(doc)} When method is classify, key 'examples' is expected and was not "
                       "found")
    examples = _array_member(doc, "examples", "Expecting 'examples' value to be an list/array",
                             "'examples' value is an empty array")
    target = input_proto.example_list_with_context if context else input_proto.example_list
    for value in examples:
        example_from_json(value, target.examples.add())
