"""JSON text -> Python values as TF Serving reads a REST body (json_tensor.cc ParseJson: rapidjson, iterative),
and the words its messages use for values: rapidjson's debug text of a value, its type name, TF's dtype names.
"""
from __future__ import annotations

import json
import math
import re

from exportkit.serving.server.status import invalid_argument as _invalid

# DataTypeString spellings used in TF Serving's messages
_TF_TYPE_NAMES = {"float32": "float", "float64": "double", "float16": "half"}
_END = object()


def tf_type_name(dtype: str) -> str:
    """A numpy dtype name as TF Serving's messages spell it (DataTypeString): "float", "double", "int64"."""
    return _TF_TYPE_NAMES.get(dtype, dtype)


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
        raise _invalid(f"JSON Value: {debug_string(doc)} Is not object")
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


def debug_string(value, limit: int = 256) -> str:
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


def json_type(value) -> str:
    """The JSON type of a value as TF Serving's messages name it (rapidjson's kTypeNames)."""
    if value is None:
        return "Null"
    if isinstance(value, bool):
        return "True" if value else "False"
    return {dict: "Object", list: "Array", str: "String"}.get(type(value), "Number")
