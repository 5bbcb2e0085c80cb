"""Tensors and results -> JSON answers as TF Serving writes them (json_tensor.cc): Predict in the row and columnar
formats, Classify/Regress results, errors; floats as WriteDecimal prints them (the shortest of `%.6g` that reads
back as the value, else max_digits10), so precision a JSON client loses here it loses there.
"""
from __future__ import annotations

import base64
import json
import math

import numpy as np

from exportkit.serving.json.digits import FOUR_DIGITS, TEN_TO
from exportkit.serving.json.parse import tf_type_name
from exportkit.serving.server.status import invalid_argument as _invalid

BYTES_SUFFIX = "_bytes"  # a string output named so is written as {"b64": ...}


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
    raise _invalid(f"Failed to write JSON value for tensor type: {tf_type_name(dtype)}")


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
    scale = TEN_TO[65 - np.floor(np.log10(magnitude)).astype(np.int64)]  # 10**(5 - exponent): 6 digits
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
                              FOUR_DIGITS])
_UNITS_WORDS = np.concatenate([_words((b"%d" % i).rjust(4, b"\0") for i in range(10000)), FOUR_DIGITS])
# four digits of fraction by number + 10000 * (whether digits follow) + 20000 * (".0": a positional whole number)
_FRACTION_WORDS = np.concatenate([_words((b"%04d" % i).rstrip(b"0") for i in range(10000)), FOUR_DIGITS,
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
    return x * TEN_TO[60 + np.maximum(k, 0)] / TEN_TO[60 - np.minimum(k, 0)]


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
    scaled = magnitude * TEN_TO[68 - exponent]
    exponent += scaled >= 1e9  # log10 one off next to a power of ten
    exponent -= scaled < 1e8
    nine = magnitude * TEN_TO[68 - exponent]
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
    unit = TEN_TO[68 - point]
    whole = np.floor(digits / unit)
    fraction = (digits - whole * unit) * TEN_TO[64 + point]  # 12 digits after the point
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
