"""Record sources for `verify --data`: TFRecord files of tf.Example (uncompressed or GZIP, detected by the
gzip magic bytes) and .npz shards keyed by input name, read in batches that never span two read units (a large
file or an .npz shard alone, a run of small TFRecord files together: see read_units).

The batches are a pure function of (files and their sizes, batch size, sample rate, seed, limit), so the in-process run and
every Beam worker form the very same batches: a model's float results can depend on the batch size, and the
two runners must agree to the last bit. Every record keeps its position (file number, index in the file, byte
offset in the uncompressed stream) so a failing record can be found and re-run.

TFRecord framing is read and written in Python by exportkit.inputs.tfrecord (its tfrecord_blocks checks both CRCs,
as TensorFlow's reader does); a bad record is a UsageError naming FILE:INDEX. Files may be bucket URLs: listed,
sized and streamed through exportkit.storage, by the driver and by each Beam worker alike.
"""
from __future__ import annotations

import contextlib
import glob as globlib
import json
import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from exportkit import storage
from exportkit.inputs.load import cast_input, load_inputs
from exportkit.inputs.spec import InputSpec
from exportkit.inputs.tfrecord import tfrecord_blocks, tfrecord_frame, tfrecord_records
from exportkit.errors import UsageError
from exportkit.files import os_error
from exportkit.tfexample.signatures import check_examples
from exportkit.tfexample.parser import ExampleParser

DEFAULT_BATCH_SIZE = 256


@dataclass
class RecordBatch:
    """Consecutive kept records of one read unit (see DataSource.units): serialized Examples (`records`) or npz
    rows (`rows`), each with the number of the file it came from."""

    file_nos: np.ndarray  # file number of each record
    indices: np.ndarray  # record index in the file (row for npz)
    offsets: np.ndarray  # byte offset of the record in the uncompressed stream (-1 for npz rows)
    records: list[bytes] | None = None
    rows: dict[str, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def key(self) -> tuple[int, int]:
        """The batch's id (file number and index of its first record): what Beam joins the runtimes' outputs on."""
        return (int(self.file_nos[0]), int(self.indices[0]))


_REMOTE_CALLS = 16  # metadata requests in flight when listing bucket files (each costs a round trip)
SMALL_FILE = 1 << 20  # TFRecord files smaller than this are read together, their records batched across them
UNIT_BYTES = 16 << 20  # ... up to this many bytes per read unit


def read_units(files: list[str], sizes: list[int]) -> list[list[int]]:
    """Files (by number) grouped into read units, a pure function of their names and sizes: a large file or an .npz
    shard alone, runs of small TFRecord files together (10,000 files of one record are 40 batches of 256, not
    10,000 batches of one: every batch costs a round trip through each runtime)."""
    units, current, size = [], [], 0
    for file_no, (path, n) in enumerate(zip(files, sizes)):
        if path.endswith(".npz") or n >= SMALL_FILE:
            units += [current, [file_no]] if current else [[file_no]]
            current, size = [], 0
            continue
        current.append(file_no)
        size += n
        if size >= UNIT_BYTES:
            units.append(current)
            current, size = [], 0
    return units + [current] if current else units


@dataclass
class DataSource:
    """Files matched by a glob (or a comma-separated list of globs), sorted, and how to batch them."""

    pattern: str
    specs: list[InputSpec]
    batch_size: int = DEFAULT_BATCH_SIZE
    sample: float | None = None
    seed: int = 0
    limit: int | None = None
    files: list[str] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)  # each file's size in bytes (compressed)
    units: list[list[int]] = field(default_factory=list)  # read_units(files), fixed once (Beam workers share it)
    bytes_read: int = 0  # progress: compressed bytes consumed so far (this process)

    def __post_init__(self):
        if self.batch_size < 1:
            raise UsageError(f"--batch-size {self.batch_size} must be at least 1", "pass --batch-size 256 (for example)")
        if self.sample is not None and not (0 < self.sample <= 1):
            raise UsageError(f"--sample {self.sample} must be in (0, 1]", "pass --sample 0.1 to keep one record in ten")
        if self.limit is not None and self.limit < 1:
            raise UsageError(f"--limit {self.limit} must be at least 1", "pass --limit 10000 (for example)")
        if not self.files:
            self.files = expand(self.pattern)
        if not self.sizes:
            self.sizes = _sizes(self.files)
        if not self.units:
            self.units = read_units(self.files, self.sizes)

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)

    def batches(self) -> Iterator[RecordBatch]:
        """Every batch of every read unit, in file order, up to `limit` kept records."""
        left = self.limit
        for unit_no in range(len(self.units)):
            for batch in self.unit_batches(unit_no, left):
                if left is not None:
                    left -= len(batch)
                yield batch
            if left is not None and left <= 0:
                return

    def unit_batches(self, unit_no: int, limit: int | None = None) -> Iterator[RecordBatch]:
        """The batches of one read unit: an npz shard's rows, or the kept records of its TFRecord files in order."""
        unit = self.units[unit_no]
        if self.files[unit[0]].endswith(".npz"):
            yield from self._npz_batches(unit[0], self._rng(unit[0]), limit)
            return
        files, indices, offsets, records = [], [], [], []  # kept records not yet in a batch
        for file_no in unit:
            rng, last_pos = self._rng(file_no), 0
            for first, block_offsets, block_records, position in tfrecord_blocks(self.files[file_no]):
                n, block_indices = len(block_records), range(first, first + len(block_records))
                if rng is not None:
                    keep = self._sampled(rng, n)
                    block_indices, block_offsets, block_records = (
                        [x for x, k in zip(column, keep) if k] for column in (block_indices, block_offsets, block_records))
                    n = len(block_records)
                if limit is not None:
                    n = min(n, limit - len(records))
                files += [file_no] * n
                indices += block_indices[:n]
                offsets += block_offsets[:n]
                records += block_records[:n]
                while len(records) >= self.batch_size:
                    yield self._batch(files, indices, offsets, records, self.batch_size)
                    if limit is not None:
                        limit -= self.batch_size
                self.bytes_read += position - last_pos
                last_pos = position
                if limit is not None and len(records) >= limit:
                    break
            if limit is not None and len(records) >= limit:
                break
        if records:
            yield self._batch(files, indices, offsets, records, len(records))

    @staticmethod
    def _batch(files: list, indices: list, offsets: list, records: list, n: int) -> RecordBatch:
        """The first n pending records as a batch, taken off the pending lists."""
        batch = RecordBatch(np.asarray(files[:n]), np.asarray(indices[:n]), np.asarray(offsets[:n]), records=records[:n])
        for column in (files, indices, offsets, records):
            del column[:n]
        return batch

    def _rng(self, file_no: int):
        """The file's own sample draws, seeded by its name (None without --sample: seeding costs ~0.1 ms a file)."""
        if self.sample is None:
            return None
        name = os.path.basename(self.files[file_no])
        return np.random.default_rng([int(self.seed) & 0xFFFFFFFF, zlib.crc32(name.encode())])

    def _sampled(self, rng, n: int) -> np.ndarray:
        """Which of the next n records to keep: one uniform draw per record, so the choice is the same whatever
        the chunking, and the same in every process."""
        if self.sample is None:
            return np.ones(n, dtype=bool)
        return rng.random(n) < self.sample

    def _npz_batches(self, file_no, rng, limit) -> Iterator[RecordBatch]:
        path = self.files[file_no]
        (rows,) = load_inputs(storage.local_copy(path), self.specs)  # a zip is read at random: a bucket's is copied
        n = {np.shape(v)[0] for v in rows.values() if np.ndim(v)}
        if len(n) != 1:
            raise UsageError(f"{path}: the inputs need one shared leading (record) dimension",
                             "write each shard with numpy.savez(path, key=array_with_one_row_per_record)")
        kept = np.flatnonzero(self._sampled(rng, n.pop()))
        if limit is not None:
            kept = kept[:limit]
        self.bytes_read += self.sizes[file_no]
        for start in range(0, len(kept), self.batch_size):
            idx = kept[start:start + self.batch_size]
            yield RecordBatch(np.full(len(idx), file_no), idx, np.full(len(idx), -1),
                              rows={k: v[idx] for k, v in rows.items()})

    def where(self, file_no: int, index: int) -> str:
        """A record's position as a user can find it again: FILE:INDEX (records count from 0)."""
        return f"{self.files[file_no]}:{index}"


def expand(pattern: str) -> list[str]:
    """The files of a comma-separated list of globs or paths, local or in a bucket (each sorted; directories left
    out, a file named twice kept once)."""
    files: list[str] = []
    for part in [p.strip() for p in pattern.split(",") if p.strip()]:
        if storage.is_url(part):
            matched = storage.glob(part) if globlib.has_magic(part) else [part] if storage.exists(part) else []
            files += _remote_files(matched)
            continue
        matched = sorted(globlib.glob(part, recursive=True)) if globlib.has_magic(part) else [part]
        files += [f for f in matched if os.path.isfile(f)]
    if not files:
        raise UsageError(f"--data {pattern!r} matches no file",
                         "pass a glob of TFRecord files of tf.Example (e.g. 'data/part-*.tfrecord.gz') or .npz shards")
    return list(dict.fromkeys(files))


def _remote_files(urls: list[str]) -> list[str]:
    """The objects among `urls` (a bucket glob also matches prefixes, 'directories'), asked in parallel."""
    with ThreadPoolExecutor(_REMOTE_CALLS) as pool:
        dirs = list(pool.map(storage.isdir, urls))
    return [url for url, is_dir in zip(urls, dirs) if not is_dir]


def _sizes(files: list[str]) -> list[int]:
    """Each file's size: a stat on disk; in a bucket, one metadata request per object, in parallel."""
    if not any(storage.is_url(f) for f in files):
        return [os.path.getsize(f) for f in files]
    with ThreadPoolExecutor(_REMOTE_CALLS) as pool:
        return list(pool.map(storage.size, files))


# --------------------------------------------------------------------------------------------- failures


class FailureWriter:
    """`--save-failures DIR`: failing TFRecord records as they were read (failures.tfrecord), npz rows as
    failures-N.npz, and where each came from (failures.index.jsonl). Written into a staging directory and moved
    into DIR when the run completes (storage.staged_dir: renames on disk; in a bucket, uploads, the index last), so
    an interrupted run (or a full disk) leaves no half-written files; a DIR that cannot be written is refused before
    any runtime starts (exit 2; a full disk is exit 3)."""

    def __init__(self, directory: str, source: DataSource):
        self.what = f"--save-failures {directory}"
        self.source = source
        self.count = 0
        self._records = None  # the open failures.tfrecord (TFRecord framing, as TFRecordWriter writes it)
        self._npz = 0
        self._staging = contextlib.ExitStack()  # left by close(): committed, or aborted by an exception
        self._stage = self._staging.enter_context(storage.staged_dir(directory, self.what, "failures.index.jsonl"))
        try:
            self._index = (self._stage / "failures.index.jsonl").open("w")
        except OSError as err:
            self._abort()
            raise os_error(err, self.what) from None

    def write(self, batch: RecordBatch, failing: np.ndarray) -> None:
        rows = np.flatnonzero(failing)
        if not len(rows):
            return
        try:
            self._write(batch, rows)
        except OSError as err:
            raise os_error(err, self.what) from None

    def _write(self, batch: RecordBatch, rows: np.ndarray) -> None:
        if batch.records is not None:
            if self._records is None:
                self._records = (self._stage / "failures.tfrecord").open("wb")
            for r in rows:
                self._records.write(tfrecord_frame(batch.records[r]))
        else:
            from exportkit.inputs.npz import write_npz

            write_npz(self._stage / f"failures-{self._npz}.npz", {k: v[rows] for k, v in batch.rows.items()})
            self._npz += 1
        for r in rows:
            self._index.write(json.dumps({"file": self.source.files[batch.file_nos[r]], "index": int(batch.indices[r]),
                                          "offset": int(batch.offsets[r])}) + "\n")
        self.count += len(rows)

    def close(self, commit: bool) -> None:
        """Move the files into place (commit), else remove them; a close that fails (a full disk flushing the
        last bytes) removes them too."""
        failure = None
        for stream in (self._records, self._index):
            try:
                if stream is not None:
                    stream.close()
            except OSError as err:
                commit, failure = False, failure or os_error(err, self.what)
        if commit:
            self._staging.close()
        else:
            self._abort()
        if failure:
            raise failure

    def _abort(self) -> None:
        self._staging.__exit__(_Aborted, _Aborted(), None)  # storage.staged_dir removes what it staged


class _Aborted(Exception):
    """Thrown into storage.staged_dir to leave it without writing anything."""


@dataclass
class Fed:
    """One batch as the runtimes get it: the inputs, one position per row (a PredictionLog's request may hold several
    rows, or none when it is skipped), the logged answers of the rows that carry them, and the serialized tf.Example
    of each row where the records are Examples (for `diff --label`)."""

    inputs: dict[str, np.ndarray]
    file_nos: np.ndarray
    indices: np.ndarray
    offsets: np.ndarray
    record_of_row: np.ndarray  # the row's record in its RecordBatch (for --save-failures)
    logged: dict[str, np.ndarray] | None = None
    logged_rows: np.ndarray | None = None  # the rows `logged` answers, in order
    examples: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.indices)


def records_are_logs(source: DataSource) -> bool:
    """True if the first TFRecord record of the data is a PredictionLog (then every TFRecord file must hold them)."""
    from exportkit.data.predictionlog import is_prediction_log

    for path in source.files:
        if not path.endswith(".npz"):
            for data in tfrecord_records(path):
                return is_prediction_log(data)
    return False


def signature_feed(source: DataSource, specs: list[InputSpec], name: str, signature: dict, signatures: dict,
                   model_name: str | None) -> tuple[str | None, object]:
    """(example_key, replayer) for one signature's records: the input of a signature over serialized tf.Example,
    which takes the records as they are (None: the records are parsed into its tensors), and the
    predictionlog.LogReplayer when the records are PredictionLogs (None otherwise)."""
    from exportkit.data.predictionlog import LogReplayer

    example_key = specs[0].key if len(specs) == 1 and specs[0].examples else None
    replayer = LogReplayer(name, signature, signatures, model_name) if records_are_logs(source) else None
    return example_key, replayer


def data_signature(pattern: str | None, signatures: dict, selected: list[str]) -> str:
    """The signature `--data` records are the inputs of when no --signature is given: the one the first
    PredictionLog names (TF Serving's default when it names none), else serving_default (or the only one selected)."""
    from exportkit.data.predictionlog import signature_of
    from exportkit.signature_constants import DEFAULT_SIGNATURE

    source = DataSource(pattern, []) if pattern else None
    if source is not None and records_are_logs(source):
        for path in (f for f in source.files if not f.endswith(".npz")):
            name = next((signature_of(data) for data in tfrecord_records(path)), None)
            if name:
                return name
    return DEFAULT_SIGNATURE if DEFAULT_SIGNATURE in signatures or len(selected) != 1 else selected[0]


class Feeder:
    """A batch -> the signature's inputs: npz rows as they are, serialized Examples as they are for a signature
    over tf.Example (`example_key`), PredictionLog requests replayed (`replayer`: predictionlog.LogReplayer), else
    tf.Examples parsed into the inputs."""

    def __init__(self, source: DataSource, specs: list[InputSpec], example_key: str | None, replayer=None):
        self.source, self.example_key, self.replayer = source, example_key, replayer
        self.specs = {s.key: s for s in specs}
        self._examples = next((s.examples for s in specs if s.key == example_key), None)
        needs_parser = example_key is None and replayer is None and any(not f.endswith(".npz") for f in source.files)
        self._parser = ExampleParser(specs) if needs_parser else None
        key = replayer.example_input if replayer is not None else None  # the logs' common case (_logged_examples)
        taken_as_is = key is not None and (key not in self.specs or self.specs[key].examples is not None)  # _cast
        self._log_key = key if taken_as_is else None

    def fed(self, batch: RecordBatch) -> Fed:
        """The batch's inputs and the position of each of their rows."""
        if self.replayer is not None:
            return self._replayed(batch)
        examples = np.asarray(batch.records, dtype=object) if batch.records is not None else None
        return Fed(self(batch), batch.file_nos, batch.indices, batch.offsets, np.arange(len(batch)),
                   examples=examples)

    def _replayed(self, batch: RecordBatch) -> Fed:
        """PredictionLog requests of one batch, their rows concatenated (logs the replayer skips left out)."""
        fed = self._logged_examples(batch)
        if fed is not None:
            return fed
        parts = []
        for r, record in enumerate(batch.records):
            replayed = self.replayer.replay(record, lambda r=r: self.source.where(batch.file_nos[r], int(batch.indices[r])))
            if replayed is not None and replayed.rows:
                parts.append((r, replayed))
        record_of_row = np.repeat(np.asarray([r for r, _ in parts], dtype=np.int64),
                                  [p.rows for _, p in parts]).astype(np.int64)
        fed = Fed({}, batch.file_nos[record_of_row], batch.indices[record_of_row], batch.offsets[record_of_row],
                  record_of_row)
        if not parts:
            return fed
        for key in parts[0][1].inputs:
            values = [self._cast(key, p.inputs[key], batch, r) for r, p in parts]
            try:
                fed.inputs[key] = np.concatenate(values)
            except ValueError:
                first = self.source.where(batch.file_nos[parts[0][0]], int(batch.indices[parts[0][0]]))
                shapes = ", ".join(sorted({str(v.shape) for v in values}))
                raise UsageError(f"the PredictionLog requests from {first} on send input {key!r} in shapes that do not "
                                 f"stack ({shapes})", "pass --batch-size 1 to replay each request on its own") from None
        if all(p.examples is not None for _, p in parts):
            fed.examples = np.concatenate([np.asarray(p.examples, dtype=object).reshape(-1) for _, p in parts])
        answered = [(start, p) for start, (_, p) in zip(np.cumsum([0] + [p.rows for _, p in parts]), parts)
                    if p.logged]
        keys = set.intersection(*(set(p.logged) for _, p in answered)) if answered else set()
        if keys:
            fed.logged = {k: np.concatenate([p.logged[k] for _, p in answered]) for k in sorted(keys)}
            fed.logged_rows = np.concatenate([np.arange(start, start + p.rows) for start, p in answered])
        return fed

    def _logged_examples(self, batch: RecordBatch) -> Fed | None:
        """_replayed's Fed when every log of the batch is the replayer's common case (LogReplayer.example_values:
        serialized inputs to take as they are), without a Replayed per log; None: some log is not."""
        taken = self.replayer.example_values(batch.records) if self._log_key is not None and batch.records else None
        if taken is None:
            return None
        values, counts = taken
        examples = np.empty(len(values), dtype=object)
        examples[:] = values
        record_of_row = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
        return Fed({self._log_key: examples}, batch.file_nos[record_of_row], batch.indices[record_of_row],
                   batch.offsets[record_of_row], record_of_row, examples=examples)

    def _cast(self, key: str, value: np.ndarray, batch: RecordBatch, r: int) -> np.ndarray:
        spec = self.specs.get(key)
        if spec is None or spec.examples is not None:
            return value
        return cast_input(key, value, spec, self.source.where(batch.file_nos[r], int(batch.indices[r])))

    def __call__(self, batch: RecordBatch) -> dict[str, np.ndarray]:
        if batch.rows is not None:
            return batch.rows
        if self.example_key is not None:
            records = np.asarray(batch.records, dtype=object)
            self._check_examples(batch, records)
            return {self.example_key: records}
        return self._parser(batch.records, lambda row: self.source.where(batch.file_nos[row], int(batch.indices[row])))

    def _check_examples(self, batch: RecordBatch, records: np.ndarray) -> None:
        """Records the signature cannot parse are the data's fault, not the model's: a UsageError naming
        FILE:INDEX before any runtime sees them."""
        if self._examples is None or check_examples(self._examples, records) is None:
            return
        for row, record in enumerate(records):
            problem = check_examples(self._examples, [record])  # "element 0 ..." of a one-record batch
            if problem:
                raise UsageError(f"record {self.source.where(batch.file_nos[row], int(batch.indices[row]))}"
                                 f"{problem[len('element 0'):]} (the signature parses {self._examples.describe()})",
                                 "write tf.train.Example protos with the features the model parses")
