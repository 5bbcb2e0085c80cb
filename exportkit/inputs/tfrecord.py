"""TFRecord framing and its masked CRC-32C, written and read as TensorFlow does (tsl/lib/io/record_writer.cc):
each record is `uint64 length, uint32 masked crc32c(length), data, uint32 masked crc32c(data)`, little-endian.
Checkpoint index blocks (savedmodel.checkpoint) carry the same masked CRC."""
from __future__ import annotations

import functools
import gzip
import struct
import zlib
from typing import Iterator

from exportkit import storage
from exportkit.errors import UsageError

_FIX_TFRECORD = "pass TFRecord files (tf.io.TFRecordWriter), uncompressed or GZIP, or .npz shards"
_FIX_DAMAGED = "the file is damaged (TensorFlow's reader refuses it too: DataLossError): write it again, or leave it out"
DEFLATE_MAX_RATIO = 1032  # deflate's largest expansion: bounds a gzipped record's length and an .npz member's size
_READ_BLOCK = 1 << 20  # TFRecord files are read a block of this size at a time (tfrecord_blocks)
_MASK_DELTA = 0xA282EAD8
_HEADER, _CRC = struct.Struct("<QI"), struct.Struct("<I")  # a record's length and its CRC; the data's CRC


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as TF's tsl/lib/hash/crc32c: google-crc32c's C code (a 64 MiB block in milliseconds).
    Where that package is missing, pure Python (about 4 MB/s), so that reading a checkpoint's small index never
    fails for it; TFRecord data files are large, so tfrecord_blocks requires the package."""
    try:
        import google_crc32c
    except ImportError:
        return _crc32c_python(data)
    return google_crc32c.value(bytes(data))


@functools.cache
def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


def _crc32c_python(data: bytes) -> int:
    crc, table = 0xFFFFFFFF, _crc32c_table()
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def mask_crc(crc: int) -> int:
    """The form TF stores a CRC-32C in (crc32c.h's Mask): rotated right by 15 bits, plus a constant."""
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """The CRC TFRecordWriter and checkpoint index blocks store."""
    return mask_crc(crc32c(data))


def tfrecord_frame(data: bytes) -> bytes:
    """One record as TFRecordWriter writes it (uncompressed)."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))


def tfrecord_records(path: str) -> Iterator[bytes]:
    """The data of every record of a TFRecord file, checked as tfrecord_blocks checks it."""
    for _, _, records, _ in tfrecord_blocks(path):
        yield from records


def tfrecord_blocks(path: str) -> Iterator[tuple[int, list[int], list[bytes], int]]:
    """(index of the first, offsets, data, compressed position read so far) of the records of a TFRecord file, one
    block of the file at a time (GZIP is detected by its magic bytes). Both CRCs are checked, as TensorFlow's reader
    does (a mismatch is its DataLossError), and a length is bounded by what the file can hold: a bad record is a
    UsageError naming FILE:INDEX, raised once the records before it were given. Records are cut out of whole blocks:
    a read or two per record cost `verify --data` a third of a second per 100k records."""
    from google_crc32c import value as fast_crc32c  # required here (see crc32c)

    with storage.open_read(path) as raw:  # a bucket's object streamed in blocks
        size = storage.size(path)
        gzipped = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        stream = gzip.GzipFile(fileobj=raw, mode="rb") if gzipped else raw
        index, offset, buf, need, ended, failure = 0, 0, b"", 12, False, None

        def bad(problem: str, fix: str = _FIX_DAMAGED) -> UsageError:
            if failure is not None:  # the file could not be read further: that is why the record is short
                return UsageError(f"record {path}:{index}: cannot read it: {failure}",
                                  "pass TFRecord files, uncompressed or GZIP (other compressions are not supported)")
            return UsageError(f"record {path}:{index} (byte {offset}): {problem}", fix)

        header, crc_of = _HEADER.unpack_from, _CRC.unpack_from  # (compiled once: 1M records of diff --data)
        while True:
            parts, have = [buf], len(buf)
            while have < need and not ended:  # a lying length costs what the file holds, not what it claims
                try:
                    block = stream.read(_READ_BLOCK)
                except (OSError, EOFError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
                    block, failure = b"", err
                ended = not block
                parts.append(block)
                have += len(block)
            buf = b"".join(parts)
            pos, first, offsets, records, problem = 0, index, [], [], None
            while have - pos >= 12:
                length, length_crc = header(buf, pos)
                if mask_crc(fast_crc32c(buf[pos:pos + 8])) != length_crc:
                    problem = bad("its length CRC does not match (corrupted, or not TFRecord framing)", _FIX_TFRECORD)
                    break
                if length > (size * DEFLATE_MAX_RATIO if gzipped else size - offset - 16):
                    problem = bad(f"declares {length} bytes, more than the file can hold (truncated, or a damaged "
                                  "length)")
                    break
                end = pos + 16 + length
                if end > have:
                    break
                data = buf[pos + 12:end - 4]
                if mask_crc(fast_crc32c(data)) != crc_of(buf, end - 4)[0]:
                    problem = bad("its data CRC does not match (the record is corrupted)")
                    break
                records.append(data)
                offsets.append(offset)
                offset, index, pos = offset + 16 + length, index + 1, end
            if records:  # the records before a bad one are given first
                yield first, offsets, records, raw.tell()
            if problem is not None:
                raise problem
            buf, need = buf[pos:], (12 if have - pos < 12 else end - pos)
            if ended:
                if buf or failure is not None:  # bad() names a failed read as the reason
                    raise bad("truncated" if len(buf) >= 12 else "truncated (the file ends inside its length field)")
                return
