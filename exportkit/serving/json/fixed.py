"""The fixed-width fast path of REST Predict: float32 arrays in one exact JSON layout, written by the client and read
by the server with numpy (the text stays plain JSON to every other server and parser).
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from exportkit.serving.json.digits import FOUR_DIGITS, TEN_TO
from exportkit.serving.json.parse import parse_json
from exportkit.serving.server.status import RpcError

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
_LEAD = (np.arange(10, dtype=_U64) + ord("0")) << _U64(8) | _U64(ord(".")) << _U64(16)  # bytes 1-2, by first digit
_HIGH = FOUR_DIGITS.astype(_U64) << _U64(24)  # bytes 3-6: digits 2-5
_LOW_0 = (FOUR_DIGITS.astype(_U64) & _U64(0xFF)) << _U64(56)  # digits 6-9: byte 7 ...
_LOW_1 = FOUR_DIGITS.astype(_U64) >> _U64(8)  # ... and bytes 8-10
_EXPONENTS = np.arange(-60, 61)
_EXPONENT = (_U64(ord("e")) << _U64(24) | np.where(_EXPONENTS < 0, ord("-"), ord("+")).astype(_U64) << _U64(32) |
             np.frombuffer(b"".join(b"%02d" % abs(k) for k in _EXPONENTS), "<u2").astype(_U64) << _U64(40))
_SIGN = np.array([ord(" "), ord("-")], _U64)
_FIXED_MAX_RANK = 32
_BLOCK_NUMBERS = 1 << 16  # numbers of a block of text
_CHUNK_NUMBERS = 1 << 14  # numbers converted at a time: the temporaries stay in cache
# rapidjson's Pow10 table (internal/pow10.h): the correctly rounded doubles of the literals 1e0 ... 1e308
_POW10 = np.array([float(f"1e{k}") for k in range(309)])


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
    significand = np.rint(magnitude * TEN_TO[68 - exponent])
    for off, step in ((significand >= 1e9, 1), (significand < 1e8, -1)):  # log10 one off next to a power of ten
        if off.any():
            exponent[off] += step
            significand[off] = np.rint(magnitude[off] * TEN_TO[68 - exponent[off]])
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
