"""Server-side batching as TF Serving does it: BatchingSession (batching/batching_session.cc) over a
SharedBatchScheduler queue (tensorflow/core/kernels/batching_util/shared_batch_scheduler.h), configured from
BatchingParameters as servables/tensorflow/bundle_factory_util.cc GetQueueOptions does.

- One queue per TensorSignature (feed and fetch *names*, not shapes): concurrent Session.runs are merged along
  dimension 0 into batches of at most `max_batch_size` rows (`max_execution_batch_size` with
  `enable_large_batch_splitting`, which cuts a bigger request into pieces that fill the open batch and the next
  ones; each request answers once all its pieces have run). A batch runs once full or `batch_timeout_micros` after
  its first task, on one of `num_batch_threads` threads shared by every queue of the servable.
- At most `max_enqueued_batches` batches wait (the open one included, the running ones not); a task that does not
  fit is UNAVAILABLE "The batch scheduling queue to which this task was submitted is full ...".
- A batch is padded up to the next `allowed_batch_sizes` with copies of the first row of its last task; with
  `pad_variable_length_inputs` each input's dimensions 1.. are padded to the batch's largest with the tensor's own
  first element; without it, requests whose shapes differ beyond dimension 0 fail the batch (FAILED_PRECONDITION),
  as in TF Serving. Outputs are split back by rows: a padded request gets padded outputs.
- Each task keeps its RunOptions deadline: a batch runs with the latest one of its tasks; a batch whose tasks have
  all timed out while queued is RESOURCE_EXHAUSTED "Run() timeout exceeded while waiting in batching queue".

A model whose rows influence each other (batch statistics, a reduction over the batch) answers differently under
batching; serving it this way shows that as TF Serving would.
"""
from __future__ import annotations

import collections
import os
import threading
import time
from dataclasses import dataclass, field

import grpc
import numpy as np

from exportkit.serving.server.status import RpcError

# SharedBatchScheduler::QueueOptions defaults (shared_batch_scheduler.h)
DEFAULT_MAX_BATCH_SIZE = 1000
DEFAULT_MAX_ENQUEUED_BATCHES = 10


def _value(parameters, name: str, default):
    return getattr(parameters, name).value if parameters.HasField(name) else default


@dataclass
class _Request:
    """One Session.run waiting for its answer (possibly cut into pieces)."""
    pieces: int
    deadline: float | None  # time.monotonic(); None = no timeout
    outputs: list = field(default_factory=list)  # per piece: list of arrays
    error: BaseException | None = None
    left: int = 0
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Task:
    """Rows of one request (a piece of it when split) in one batch."""
    request: _Request
    index: int  # which piece
    arrays: list
    size: int


class _Queue:
    def __init__(self, feed_names: tuple, fetch_names: tuple):
        self.feed_names, self.fetch_names = feed_names, fetch_names
        self.batches: collections.deque[list[_Task]] = collections.deque([[]])  # the back one is open
        self.open_since = 0.0

    def open_size(self) -> int:
        return sum(t.size for t in self.batches[-1])


class Batcher:
    """The batching session of one servable version: `run` blocks until its rows have been run in a batch."""

    def __init__(self, parameters, run):
        """`run(feed names, arrays, fetch names, timeout_ms)` is the wrapped session's Run."""
        self.max_batch_size = _value(parameters, "max_batch_size", DEFAULT_MAX_BATCH_SIZE)  # input_batch_size_limit
        self.timeout = _value(parameters, "batch_timeout_micros", 0) / 1e6
        self.max_enqueued_batches = _value(parameters, "max_enqueued_batches", DEFAULT_MAX_ENQUEUED_BATCHES)
        self.split = _value(parameters, "enable_large_batch_splitting", False)
        self.max_execution_batch_size = (_value(parameters, "max_execution_batch_size", self.max_batch_size)
                                         if self.split else self.max_batch_size)
        threads = _value(parameters, "num_batch_threads", os.cpu_count() or 1)  # port::MaxParallelism()
        self.allowed = list(parameters.allowed_batch_sizes)
        self.pad_variable_length = parameters.pad_variable_length_inputs
        self._check(threads)
        self._run = run
        self._queues: dict[tuple, _Queue] = {}
        self._cv = threading.Condition()
        self._closed = False
        self._next = 0  # round robin over the queues
        self._threads = [threading.Thread(target=self._work, daemon=True, name=f"batch-{i}") for i in range(threads)]
        for thread in self._threads:
            thread.start()

    def _check(self, threads: int) -> None:
        def invalid(message):
            return RpcError(grpc.StatusCode.INVALID_ARGUMENT, message)

        if threads < 1:
            raise invalid(f"num_batch_threads must be positive; was {threads}")
        if self.allowed and self.allowed[-1] != self.max_batch_size:  # bundle_factory_util.cc WrapSessionForBatching
            raise invalid("Last entry in allowed_batch_sizes must match max_batch_size; last entry was "
                          f"{self.allowed[-1]}; expected {self.max_batch_size}")
        if self.split and self.max_batch_size < self.max_execution_batch_size:
            raise invalid("When enable_large_batch_splitting is true, input_batch_size_limit must be greater than "
                          "or equal to max_execution_batch_size.")

    # -- the caller's side (BatchingSession::InternalRun + Queue::Schedule) --------------------------------------
    def run(self, feed_names: list[str], arrays: list, fetch_names: list[str], timeout_ms: int = 0) -> list:
        size = _input_size(arrays)
        if size > self.max_batch_size:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"Task size {size} is larger than maximum input batch size {self.max_batch_size}")
        request = _Request(0, time.monotonic() + timeout_ms / 1000 if timeout_ms > 0 else None)
        key = (tuple(feed_names), tuple(fetch_names))
        with self._cv:
            if self._closed:
                raise RpcError(grpc.StatusCode.UNAVAILABLE, "the batching session of this version was closed")
            queue = self._queues.get(key)
            if queue is None:
                queue = self._queues[key] = _Queue(*key)
            self._enqueue(queue, request, [np.asarray(a) for a in arrays], size)
            self._cv.notify_all()
        request.done.wait()
        if request.error is not None:
            raise request.error
        return [np.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
                for parts in zip(*request.outputs)]

    def _enqueue(self, queue: _Queue, request: _Request, arrays: list, size: int) -> None:
        limit = self.max_execution_batch_size
        room = limit - queue.open_size()
        if not self.split:
            if size > room:
                if len(queue.batches) >= self.max_enqueued_batches:
                    raise RpcError(grpc.StatusCode.UNAVAILABLE,
                                   "The batch scheduling queue to which this task was submitted is full; currently "
                                   f"{len(queue.batches)} batches enqueued and max_enqueued_batches is "
                                   f"{self.max_enqueued_batches}")
                self._new_batch(queue)
            pieces = [size]
        else:
            capacity = room + (self.max_enqueued_batches - len(queue.batches)) * limit
            if size > capacity:
                raise RpcError(grpc.StatusCode.UNAVAILABLE,
                               f"The batch scheduling queue to which this task was submitted is full; task size is "
                               f"{size} but scheduling capacity is only {capacity} (num_enqueued_batches="
                               f"{len(queue.batches)}, max_enqueued_batches={self.max_enqueued_batches}, "
                               f"open_batch_size={queue.open_size()}, max_execution_batch_size={limit})")
            pieces = _split_sizes(size, room, limit) or [0]  # InputSplitMetadata
        request.pieces = request.left = len(pieces)
        request.outputs = [None] * len(pieces)
        offset = 0
        for index, rows in enumerate(pieces):
            if queue.open_size() + rows > limit:
                self._new_batch(queue)
            if not queue.batches[-1]:
                queue.open_since = time.monotonic()
            queue.batches[-1].append(_Task(request, index, [a[offset:offset + rows] for a in arrays], rows))
            offset += rows

    def _new_batch(self, queue: _Queue) -> None:
        queue.batches.append([])

    def close(self) -> None:
        """Queue::CloseAndWaitUntilEmpty: what is queued still runs; then the threads end."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(60)

    # -- the batch threads (SharedBatchScheduler::ThreadLogic, Queue::ScheduleBatch) ------------------------------
    def _work(self) -> None:
        while True:
            with self._cv:
                while True:
                    found = self._schedulable()
                    if found is not None:
                        break
                    if self._closed and not any(q.batches[0] for q in self._queues.values()):
                        return
                    self._cv.wait(self._next_wake())
            queue, batch = found
            self._process(queue, batch)

    def _schedulable(self):
        queues = list(self._queues.values())
        for i in range(len(queues)):
            queue = queues[(self._next + i) % len(queues)]
            if len(queue.batches) > 1:  # a closed batch waits at the front
                batch = queue.batches.popleft()
            elif queue.batches[0] and (queue.open_size() >= self.max_execution_batch_size or self._closed
                                       or time.monotonic() - queue.open_since >= self.timeout):
                batch = queue.batches.popleft()
                queue.batches.append([])
            else:
                continue
            self._next = (self._next + i + 1) % len(queues)
            return queue, batch
        return None

    def _next_wake(self) -> float:
        waits = [queue.open_since + self.timeout - time.monotonic()
                 for queue in self._queues.values() if len(queue.batches) == 1 and queue.batches[0]]
        return max(0.0, min(waits)) if waits else 1.0

    def _process(self, queue: _Queue, batch: list[_Task]) -> None:
        """BatchingSession::ProcessBatch: deadline, merge (padding), one Session.run, split back."""
        try:
            outputs = self._run_batch(queue, batch)
        except BaseException as err:  # noqa: BLE001 — every request of the batch gets the batch's error
            for task in batch:
                task.request.error = err
            outputs = None
        for i, task in enumerate(batch):
            if outputs is not None:
                task.request.outputs[task.index] = outputs[i]
            with self._cv:
                task.request.left -= 1
                finished = task.request.left == 0
            if finished:
                task.request.done.set()

    def _run_batch(self, queue: _Queue, batch: list[_Task]) -> list[list]:
        now = time.monotonic()
        deadlines = [t.request.deadline for t in batch]
        live = [d for d in deadlines if d is None or d > now]
        if not live:
            raise RpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "Run() timeout exceeded while waiting in batching queue")
        timeout_ms = 0 if None in live else max(1, int((max(live) - now) * 1000))
        total = sum(t.size for t in batch)
        padded = next((s for s in self.allowed if s >= total), total)  # RoundToLowestAllowedBatchSize
        merged = [self._merge(name, [t.arrays[i] for t in batch], padded - total)
                  for i, name in enumerate(queue.feed_names)]
        outputs = self._run(list(queue.feed_names), merged, list(queue.fetch_names), timeout_ms)
        for out in outputs:
            if np.ndim(out) == 0:
                raise RpcError(grpc.StatusCode.FAILED_PRECONDITION, "Batched output tensor has 0 dimensions")
            if np.shape(out)[0] != padded:
                raise RpcError(grpc.StatusCode.FAILED_PRECONDITION,
                               "Batched output tensor's 0th dimension does not equal the sum of the 0th dimension "
                               "sizes of the input tensors")
        per_task, offset = [], 0
        for task in batch:
            per_task.append([out[offset:offset + task.size] for out in outputs])
            offset += task.size
        return per_task

    def _merge(self, name: str, parts: list[np.ndarray], padding: int) -> np.ndarray:
        """MergeInputTensors for one input: optional variable-length padding, then rows up to the allowed size."""
        if self.pad_variable_length:
            widest = np.max([p.shape for p in parts], axis=0)  # CalculateMaxDimSizes (dimension 0 is not padded)
            parts = [_pad_to(p, widest) for p in parts]
        elif any(p.shape[1:] != parts[0].shape[1:] for p in parts):
            raise RpcError(grpc.StatusCode.FAILED_PRECONDITION,
                           f"Tensors with name '{name}' from different tasks have different shapes and padding is "
                           "turned off. Set pad_variable_length_inputs to true, or ensure that all tensors with the "
                           "same name have equal dimensions starting with the first dim.")
        if padding:  # copies of the first row of the last task's tensor
            parts = parts + [np.repeat(parts[-1][:1], padding, axis=0)]
        return np.concatenate(parts, axis=0)


def _input_size(arrays: list) -> int:
    """ComputeInputSize (batching_util.h): every input has dimension 0, all of one size."""
    if not arrays:
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, "Batching Run() must have at least one input tensor")
    sizes = set()
    for array in arrays:
        if np.ndim(array) == 0:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                           "Batching Run() input tensors must have at least one dimension")
        sizes.add(np.shape(array)[0])
    if len(sizes) != 1:
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                       "Batching Run() input tensors must have equal 0th-dimension size")
    return sizes.pop()


def _split_sizes(size: int, room: int, limit: int) -> list[int]:
    """InputSplitMetadata: the first piece fills what is left of the open batch, the rest `limit` rows each."""
    pieces = []
    first = min(size, room) if room > 0 else 0
    if first:
        pieces.append(first)
        size -= first
    while size > 0:
        pieces.append(min(size, limit))
        size -= pieces[-1]
    return pieces


def _pad_to(value: np.ndarray, widest) -> np.ndarray:
    """batching_util.cc AddPadding: pad dimensions 1.. at their end with the tensor's first element (ranks 1-6)."""
    if not 1 <= value.ndim <= 6:
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, "Only tensors with rank from 1 to 6 can be padded.")
    pad = [(0, 0)] + [(0, int(w) - d) for w, d in zip(widest[1:], value.shape[1:])]
    if not any(after for _, after in pad):
        return value
    if value.size == 0:
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, "Got empty tensor in batch of non-empty tensors.")
    if value.dtype == object:  # np.pad's constant mode does not take object arrays' values
        out = np.full(tuple(d + a for d, (_, a) in zip(value.shape, pad)), value.flat[0], dtype=object)
        out[tuple(slice(0, d) for d in value.shape)] = value
        return out
    return np.pad(value, pad, mode="constant", constant_values=value.flat[0])
