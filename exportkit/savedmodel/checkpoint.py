"""What a SavedModel's checkpoint holds, read from `variables/variables.index` without importing TensorFlow.

The index of a TF tensor bundle is a LevelDB-style table (tsl/lib/io: format.cc, block.cc, table.cc): a 48-byte
footer (metaindex and index block handles, padding, magic number), an index block whose values are handles of the
data blocks, and data blocks of prefix-compressed keys with restart points; every block is followed by a 5-byte
trailer (compression type, masked crc32c). Each key maps to a `BundleEntryProto` (dtype, shape, shard, offset,
size, crc32c of the bytes in the data shard); the "" key holds the `BundleHeaderProto`
(tensorflow/core/util/tensor_bundle/tensor_bundle.cc). TensorFlow's own writer stores blocks uncompressed; other
builds wrote them snappy-compressed (TF Serving's testdata has such indexes), and TF's reader takes both
(tsl/lib/io/format.cc ReadBlock), so this reader does too.

Reading it takes milliseconds, so `inspect` can say how big the variables are and whether the same tensor is
stored twice (`duplicates`), without loading a byte of the data shards.
"""
from __future__ import annotations

import functools
import os
import struct
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

from exportkit.errors import UsageError
from exportkit.inputs.tfrecord import masked_crc32c
from exportkit.savedmodel.protos import protos
from exportkit.savedmodel.reader import dtype_name, shape_list

VARIABLES_DIR = "variables"
INDEX_NAME = "variables.index"
HEADER_KEY = b""
OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"  # the object graph proto, saved as a string tensor
TABLE_MAGIC = 0xDB4775248B80FB57  # kTableMagicNumber (tsl/lib/io/format.h)
FOOTER_SIZE = 48  # two BlockHandles of at most 20 bytes each, padded, then the 8-byte magic
TRAILER_SIZE = 5  # compression type byte + masked crc32c of block and type
NO_COMPRESSION, SNAPPY_COMPRESSION = 0, 1
DUPLICATE_MIN_BYTES = 1 << 20  # smaller tensors that happen to be equal are not worth a finding
# Keras 3's ExportArchive saves each weight twice, under `variables/N/...` and `_all_variables/M/...` (it tracks the
# Keras Variable and the tf.Variable inside it); exportkit export writes `variables/N/...` only.
KERAS_DUPLICATE_PREFIX = "_all_variables/"
SLICE_KEY_PREFIX = b"\x00"  # keys of the slices of partitioned variables start with a 0 byte (see _slice_key_prefix)

_CORRUPT_FIX = "the checkpoint is damaged or incomplete; copy or export the model again"


# ------------------------------------------------------------------------------------------------- table
class _Corrupt(Exception):
    """A structural problem in the index file; turned into a UsageError naming the file."""


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while pos < end and shift <= 63:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
    raise _Corrupt("bad varint")


def _block(data: bytes, handle: bytes, what: str) -> bytes:
    """The contents of the block a BlockHandle points at, after checking bounds, trailer crc and compression."""
    offset, pos = _varint(handle, 0, len(handle))
    size, _ = _varint(handle, pos, len(handle))
    if offset + size + TRAILER_SIZE > len(data) - FOOTER_SIZE:
        raise _Corrupt(f"{what} block at offset {offset} ({size} bytes) lies past the end of the file (truncated?)")
    kind = data[offset + size]
    stored = struct.unpack_from("<I", data, offset + size + 1)[0]
    if masked_crc32c(data[offset:offset + size + 1]) != stored:
        raise _Corrupt(f"{what} block at offset {offset}: checksum mismatch")
    if kind == SNAPPY_COMPRESSION:
        try:
            return snappy_uncompress(data[offset:offset + size])
        except _Corrupt as err:
            raise _Corrupt(f"{what} block at offset {offset}: corrupted compressed block contents ({err})") from None
    if kind != NO_COMPRESSION:
        raise _Corrupt(f"{what} block at offset {offset}: unknown compression type {kind}")
    return data[offset:offset + size]


# Snappy emits at most 64 bytes per 2-byte copy element (format_description.txt): a declared length beyond this many
# times the input is corrupt, so the work is bounded by the bytes read, not by what a header claims.
_SNAPPY_MAX_RATIO = 32


def snappy_uncompress(block: bytes) -> bytes:
    """Raw snappy (google/snappy format_description.txt): a varint length, then literals and back-copies.
    Raises _Corrupt as TF's Snappy_Uncompress fails: a bad length, a copy before the start, output past the
    declared length, or output short of it."""
    length, pos = _varint(block, 0, len(block))
    if length > _SNAPPY_MAX_RATIO * len(block):
        raise _Corrupt(f"declares {length} bytes from {len(block)}")
    out, end = bytearray(), len(block)
    while pos < end:
        tag = block[pos]
        pos += 1
        kind = tag & 3
        if kind == 0:  # literal: length-1 in the tag, or in the next 1-4 bytes
            n = tag >> 2
            if n >= 60:
                width = n - 59
                if pos + width > end:
                    raise _Corrupt("truncated literal length")
                n = int.from_bytes(block[pos:pos + width], "little")
                pos += width
            n += 1
            if pos + n > end:
                raise _Corrupt("truncated literal")
            out += block[pos:pos + n]
            pos += n
        else:
            if kind == 1:
                if pos + 1 > end:
                    raise _Corrupt("truncated copy")
                n, distance = ((tag >> 2) & 7) + 4, ((tag >> 5) << 8) | block[pos]
                pos += 1
            else:
                width = 2 if kind == 2 else 4
                if pos + width > end:
                    raise _Corrupt("truncated copy")
                n, distance = (tag >> 2) + 1, int.from_bytes(block[pos:pos + width], "little")
                pos += width
            if distance == 0 or distance > len(out):
                raise _Corrupt(f"copy from {distance} bytes back at output offset {len(out)}")
            start = len(out) - distance
            while n > 0:  # an overlapping copy repeats the last `distance` bytes
                piece = out[start:start + min(n, distance)]
                out += piece
                n -= len(piece)
                start += len(piece)
        if len(out) > length:
            raise _Corrupt(f"more than the declared {length} bytes")
    if len(out) != length:
        raise _Corrupt(f"{len(out)} bytes, {length} declared")
    return bytes(out)


def _block_entries(block: bytes, what: str):
    """(key, value) pairs of one block: each entry is varints shared/non_shared/value_length, then the key's new
    suffix and the value; the block ends with uint32 restart offsets and their count (block.cc)."""
    if len(block) < 4:
        raise _Corrupt(f"{what} block too short")
    restarts = struct.unpack_from("<I", block, len(block) - 4)[0]
    if restarts > (len(block) - 4) // 4:
        raise _Corrupt(f"{what} block: bad restart count {restarts}")
    end = len(block) - 4 * (restarts + 1)
    pos, key = 0, b""
    while pos < end:
        shared, pos = _varint(block, pos, end)
        non_shared, pos = _varint(block, pos, end)
        value_len, pos = _varint(block, pos, end)
        if shared > len(key) or pos + non_shared + value_len > end:
            raise _Corrupt(f"{what} block: bad entry at offset {pos}")
        key = key[:shared] + block[pos:pos + non_shared]
        pos += non_shared
        yield key, block[pos:pos + value_len]
        pos += value_len


def table_entries(data: bytes) -> list[tuple[bytes, bytes]]:
    """Every (key, value) of a LevelDB-style table held in `data`, in key order. Raises _Corrupt."""
    if len(data) < FOOTER_SIZE:
        raise _Corrupt(f"{len(data)} bytes is too short for a table (the footer alone is {FOOTER_SIZE})")
    footer = data[-FOOTER_SIZE:]
    lo, hi = struct.unpack_from("<II", footer, FOOTER_SIZE - 8)
    if (hi << 32 | lo) != TABLE_MAGIC:
        raise _Corrupt("bad magic number: not a checkpoint index (or truncated)")
    handles = FOOTER_SIZE - 8
    _meta_offset, pos = _varint(footer, 0, handles)  # the metaindex block: empty in TF's tables, not needed
    _meta_size, index_handle = _varint(footer, pos, handles)
    entries: list[tuple[bytes, bytes]] = []
    for _last_key, handle in _block_entries(_block(data, footer[index_handle:handles], "index"), "index"):
        for key, value in _block_entries(_block(data, handle, "data"), "data"):
            if entries and key <= entries[-1][0]:
                raise _Corrupt(f"keys out of order at {key!r}")
            entries.append((key, value))
    return entries


# ------------------------------------------------------------------------------------------------ bundle
@dataclass(frozen=True)
class TensorEntry:
    """One tensor of the checkpoint, as its BundleEntryProto describes it."""

    name: str
    dtype: str  # exportkit.dtypes spelling: float32, int64, string, ...
    shape: tuple[int, ...]
    shard: int
    offset: int
    size: int  # bytes in the data shard (of all its slices, for a partitioned variable)
    crc32c: int  # masked crc32c of those bytes, as stored (0 for a partitioned variable)
    slices: int = 0  # >0: a partitioned variable whose slices are stored under keys of their own


@dataclass(frozen=True)
class Checkpoint:
    """The index of a tensor bundle: its tensors (by key, sorted, as `tf.train.load_checkpoint` lists them) and
    how many data shards hold them."""

    index: str  # the index file
    num_shards: int
    tensors: tuple[TensorEntry, ...]

    @property
    def variables(self) -> list[TensorEntry]:
        """The tensors that hold the model's values (not the object graph)."""
        return [t for t in self.tensors if t.name != OBJECT_GRAPH_KEY]

    @property
    def total_bytes(self) -> int:
        return sum(t.size for t in self.variables)

    @property
    def model_is_root(self) -> bool:
        """Whether the model is the checkpoint's root object, as Keras' model.save_weights(prefix) writes it (keys
        `layer_with_weights-0/...`), rather than an attribute of one, as tf.train.Checkpoint(model=m) writes it
        (keys `model/...`)."""
        names = [t.name for t in self.variables]
        return not any(n.startswith("model/") for n in names) \
            and any(n.startswith(("layer_with_weights-", "layer-")) for n in names)

    def duplicates(self, min_bytes: int = DUPLICATE_MIN_BYTES) -> list[list[TensorEntry]]:
        """Groups of tensors of at least `min_bytes` with the same dtype, shape, size and crc32c: the same bytes
        stored more than once. Largest first. Partitioned variables (no single crc32c) are left out."""
        groups: dict[tuple, list[TensorEntry]] = defaultdict(list)
        for t in self.variables:
            if t.size >= min_bytes and not t.slices:
                groups[(t.dtype, t.shape, t.size, t.crc32c)].append(t)
        return sorted((g for g in groups.values() if len(g) > 1), key=lambda g: (-g[0].size, g[0].name))

    def keras_copies(self) -> list[tuple[TensorEntry, TensorEntry]]:
        """Keras 3's second copies, any size: (`_all_variables/...` entry, the entry holding the same bytes). The
        keys say they are one variable written twice, so no size threshold is needed."""
        originals = {(t.dtype, t.shape, t.size, t.crc32c): t for t in self.variables
                     if not t.slices and not t.name.startswith(KERAS_DUPLICATE_PREFIX)}
        return [(t, originals[key]) for t in self.variables if t.name.startswith(KERAS_DUPLICATE_PREFIX)
                and not t.slices and (key := (t.dtype, t.shape, t.size, t.crc32c)) in originals]

    def duplicate_bytes(self, min_bytes: int = DUPLICATE_MIN_BYTES) -> int:
        """Bytes a checkpoint holding each tensor once would not need: Keras 3's second copies when it has them,
        else the extra copies of equal tensors of at least `min_bytes`."""
        keras = self.keras_copies()
        if keras:
            return sum(copy.size for copy, _ in keras)
        return sum(g[0].size * (len(g) - 1) for g in self.duplicates(min_bytes))


def index_path(saved_model_dir: str | Path) -> Path:
    return Path(saved_model_dir) / VARIABLES_DIR / INDEX_NAME


def data_shard_path(index: str | Path, shard: int, num_shards: int) -> Path:
    """`PREFIX.data-00000-of-00001` next to `PREFIX.index` (tensor_bundle/naming.cc)."""
    index = Path(index)
    return index.with_name(f"{index.name[:-len('.index')]}.data-{shard:05d}-of-{num_shards:05d}")


def read_checkpoint(index: str | Path) -> Checkpoint:
    """Parse a tensor bundle index (`PREFIX.index`). A damaged or unsupported file is a UsageError that names it;
    data shards that are missing or shorter than the index says are one too (TF could not restore from them)."""
    index = Path(index)
    pb = protos()["tensor_bundle"]
    try:
        data = index.read_bytes()
    except OSError as err:
        raise UsageError(f"cannot read {index}: {err.strerror or err}", _CORRUPT_FIX) from err
    try:
        entries = table_entries(data)
        if not entries or entries[0][0] != HEADER_KEY:
            raise _Corrupt("no bundle header (the \"\" key)")
        header = pb.BundleHeaderProto.FromString(entries[0][1])
        parsed = [(key, pb.BundleEntryProto.FromString(value)) for key, value in entries[1:]]
    except _Corrupt as err:
        raise UsageError(f"cannot read the checkpoint index {index}: {err}", _CORRUPT_FIX) from None
    except Exception as err:  # protobuf DecodeError
        raise UsageError(f"cannot read the checkpoint index {index}: {type(err).__name__}: {err}",
                         _CORRUPT_FIX) from None
    num_shards = max(1, header.num_shards)
    pieces = [(key, entry, TensorEntry(
        name=key.decode("utf-8", "backslashreplace"), dtype=_dtype_name(entry.dtype),
        shape=tuple(shape_list(entry.shape) or ()), shard=entry.shard_id, offset=entry.offset, size=entry.size,
        crc32c=entry.crc32c)) for key, entry in parsed]
    _check_shards(index, num_shards, [t for _, _, t in pieces])
    slices = [(key, t) for key, _, t in pieces if key.startswith(SLICE_KEY_PREFIX)]
    tensors = []
    for key, entry, tensor in pieces:
        if key.startswith(SLICE_KEY_PREFIX):
            continue
        if entry.slices:
            prefix = _slice_key_prefix(key)
            tensor = replace(tensor, size=sum(t.size for k, t in slices if k.startswith(prefix)), crc32c=0,
                             slices=len(entry.slices))
        tensors.append(tensor)
    return Checkpoint(index=str(index), num_shards=num_shards, tensors=tuple(tensors))


def _slice_key_prefix(name: bytes) -> bytes:
    """Slices of a partitioned variable are keyed `EncodeTensorNameSlice(name, slice)`
    (tensorflow/core/util/saved_tensor_slice_util.cc): orderedcode number 0, then the name as an orderedcode
    string (0x00 and 0xff escaped, terminated by 0x00 0x01), then the slice's extents."""
    escaped = b"".join(b"\x00\xff" if c == 0 else b"\xff\x00" if c == 0xFF else bytes([c]) for c in name)
    return SLICE_KEY_PREFIX + escaped + b"\x00\x01"


_dtype_name = functools.lru_cache(maxsize=None)(dtype_name)  # a checkpoint has thousands of entries, few dtypes


def _check_shards(index: Path, num_shards: int, tensors: list[TensorEntry]) -> None:
    needed: dict[int, int] = defaultdict(int)
    for t in tensors:
        if t.shard >= num_shards:
            raise UsageError(f"{index}: tensor {t.name} names data shard {t.shard} of {num_shards}", _CORRUPT_FIX)
        needed[t.shard] = max(needed[t.shard], t.offset + t.size)
    for shard, end in sorted(needed.items()):
        path = data_shard_path(index, shard, num_shards)
        try:
            size = os.stat(path).st_size
        except OSError:
            raise UsageError(f"{path} is missing: the index {index.name} refers to it", _CORRUPT_FIX) from None
        if size < end:
            raise UsageError(f"{path} has {size} bytes, the index {index.name} says it holds {end} (truncated)",
                             _CORRUPT_FIX)


def saved_model_checkpoint(saved_model_dir: str | Path) -> Checkpoint | None:
    """The checkpoint of a SavedModel version directory; None when it has none (a model without variables)."""
    path = index_path(saved_model_dir)
    return read_checkpoint(path) if path.is_file() else None


def format_bytes(n: int) -> str:
    """`512 B`, `16.0 MiB (16777216 bytes)`: readable, and exact for those who compare."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit} ({n} bytes)"
        size /= 1024
    return f"{n} B"
