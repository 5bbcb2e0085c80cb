"""Server-side batching (batching/batching_session.cc): concurrent Session.runs with the same feeds and fetches are
merged along dimension 0 into one run, padded up to the next `allowed_batch_sizes`, and the outputs split back.

A model whose rows influence each other (batch statistics, a reduction over the batch) answers differently under
batching; serving it this way shows that as TF Serving would.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

import grpc
import numpy as np

from exportkit.serving.status import RpcError


@dataclass
class _Task:
    arrays: list
    size: int
    done: threading.Event = field(default_factory=threading.Event)
    outputs: list | None = None
    error: BaseException | None = None


class Batcher:
    """One queue + scheduler thread per (feeds, fetches) signature of a servable, as BatchingSession keeps one
    batch scheduler per TensorSignature."""

    def __init__(self, parameters, run):
        self.max_batch_size = parameters.max_batch_size.value if parameters.HasField("max_batch_size") else 1000
        self.timeout = (parameters.batch_timeout_micros.value if parameters.HasField("batch_timeout_micros") else 0) / 1e6
        self.allowed = sorted(parameters.allowed_batch_sizes)
        if self.allowed and self.allowed[-1] != self.max_batch_size:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                           "Last entry in allowed_batch_sizes must match max_batch_size; last entry was "
                           f"{self.allowed[-1]}; expected {self.max_batch_size}")
        self.pad_variable_length = parameters.pad_variable_length_inputs
        self._run = run  # (feed names, arrays, fetch names) -> list of arrays
        self._queues: dict[tuple, queue.Queue] = {}
        self._lock = threading.Lock()
        self._closed = False

    def run(self, feed_names: list[str], arrays: list, fetch_names: list[str]) -> list:
        sizes = set()
        for array in arrays:
            if np.ndim(array) == 0:
                raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                               "Batching session Run() input tensors must have at least one dimension")
            sizes.add(np.shape(array)[0])
        if len(sizes) != 1:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                           "Batching session Run() input tensors must have equal 0th-dimension size")
        size = sizes.pop()
        if size > self.max_batch_size:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"Task size {size} is larger than maximum input batch size {self.max_batch_size}")
        key = (tuple(feed_names), tuple(fetch_names), tuple(np.shape(a)[1:] for a in arrays))
        with self._lock:
            pending = self._queues.get(key)
            if pending is None:
                pending = self._queues[key] = queue.Queue()
                threading.Thread(target=self._schedule, args=(key, pending), daemon=True, name="batch").start()
        task = _Task(list(arrays), size)
        pending.put(task)
        task.done.wait()
        if task.error is not None:
            raise task.error
        return task.outputs

    def close(self) -> None:
        self._closed = True
        for pending in list(self._queues.values()):
            pending.put(None)

    def _schedule(self, key, pending: queue.Queue) -> None:
        feed_names, fetch_names, _ = key
        while True:
            first = pending.get()
            if first is None:
                return
            batch, total = [first], first.size
            deadline = time.monotonic() + self.timeout
            while total < self.max_batch_size:
                try:
                    task = pending.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if task is None:
                    pending.put(None)
                    break
                if total + task.size > self.max_batch_size:
                    pending.put(task)  # next batch (order among waiting tasks is not promised)
                    break
                batch.append(task)
                total += task.size
            self._run_batch(list(feed_names), list(fetch_names), batch, total)

    def _padded_size(self, total: int) -> int:
        for size in self.allowed:
            if size >= total:
                return size
        return total

    def _run_batch(self, feed_names, fetch_names, batch: list[_Task], total: int) -> None:
        padded = self._padded_size(total)
        try:
            merged = []
            for i in range(len(feed_names)):
                parts = [np.asarray(t.arrays[i]) for t in batch]
                if padded > total:  # batching_session.cc pads with copies of the first row
                    parts.append(np.repeat(parts[0][:1], padded - total, axis=0))
                merged.append(np.concatenate(parts, axis=0))
            outputs = self._run(feed_names, merged, fetch_names)
            for out in outputs:
                if np.ndim(out) == 0:
                    raise RpcError(grpc.StatusCode.FAILED_PRECONDITION, "Batched output tensor has 0 dimensions")
                if np.shape(out)[0] != padded:
                    raise RpcError(grpc.StatusCode.FAILED_PRECONDITION,
                                   "Batched output tensor's 0th dimension does not equal the sum of the 0th dimension "
                                   "sizes of the input tensors")
            offset = 0
            for task in batch:
                task.outputs = [out[offset:offset + task.size] for out in outputs]
                offset += task.size
        except BaseException as err:  # noqa: BLE001 — every waiting request gets the batch's error
            for task in batch:
                task.error = err
        for task in batch:
            task.done.set()
