"""The one batch loop: a runtime loaded once, then batch after batch, each timed, its failures said as whose they are.

    loop = BatchLoop(runtime)
    loop.load()                                   # once; CheckFailed (the model's) or InfraError
    outputs = loop.run(inputs)                    # one batch; loop.timings gets its seconds
    answers = loop.run_all([(origin, batch)])     # verify's batches: generated ones the model rejects are skipped

verify's lanes, verify --data's stream, diff's two versions and the Beam DoFn all run batches through it; how they
spread the loops over threads or workers is theirs.
"""
from __future__ import annotations

import re
import time

from exportkit.errors import CheckFailed, InfraError
from exportkit.inputs.loader import REAL_ORIGINS

GENERATED = ("generated", "repeat")  # batch origins exportkit made up, whose rejection is not the model's fault

# What a PyFunc/EagerPyFunc node answers in a process that did not register its Python callback (every reload:
# tensorflow/python/ops/script_ops.py's FuncRegistry), as an InvalidArgument whatever the inputs.
PY_FUNC_UNREGISTERED = "Could not find callback with key=pyfunc"

# The batching queue's refusal of a request over max_batch_size (tensorflow/core/kernels/batching_util/
# shared_batch_scheduler.h), as TF Serving's BatchingSession answers it without enable_large_batch_splitting.
BATCH_TOO_LARGE = re.compile(r"Task size (\d+) is larger than maximum input batch size (\d+)")


class InputsRejected(Exception):
    """A runtime rejected inputs exportkit generated: the inputs were wrong for the model, not the model."""


class BatchLoop:
    """One runtime over batches: loaded once, each answered batch's seconds in `timings`, a failure that is the
    model's whatever the inputs (model_failure) raised as CheckFailed."""

    def __init__(self, runtime, timed: bool = True):
        """`timed`: keep each batch's seconds (verify's latency); a Beam worker keeps none."""
        self.runtime, self.timed = runtime, timed
        self.timings: list[float] = []

    def load(self) -> None:
        if not self.runtime.loaded:
            self.runtime.load()

    def run(self, inputs: dict, origin: str = "data"):
        """One batch's outputs (None: the runtime has no answer for it, e.g. golden on a batch it did not record).
        A batch exportkit generated (`origin` in GENERATED) that the model rejects as an invalid argument raises
        InputsRejected: the inputs were at fault."""
        try:
            return self._timed(inputs)
        except InfraError:
            raise
        except Exception as err:
            failure = model_failure(err)
            if failure is not None:
                raise failure from err
            if origin in GENERATED and rejects_inputs(err):
                raise InputsRejected(one_line(err)) from err
            raise

    def run_all(self, batches) -> list:
        """Outputs per (origin, batch). Generated batches the model rejects get None (not compared) when real
        inputs (golden, reference or --inputs) exist; without any, InputsRejected says the inputs were wrong."""
        self.load()
        has_real = any(origin in REAL_ORIGINS for origin, _ in batches)
        outputs = []
        for origin, batch in batches:
            try:
                outputs.append(self.run(batch, origin))
            except InputsRejected as rejected:
                if not has_real:
                    raise
                self.runtime.rejected_generated = str(rejected)
                outputs.append(None)
        return outputs

    def _timed(self, inputs: dict):
        if not self.timed:
            return self.runtime.run(inputs)
        began = time.perf_counter()
        outputs = self.runtime.run(inputs)
        self.timings.append(time.perf_counter() - began)
        return outputs


def rejects_inputs(err: Exception) -> bool:
    text = f"{type(err).__name__} {err}"
    return "InvalidArgument" in text or "INVALID_ARGUMENT" in text


def model_failure(err: Exception) -> CheckFailed | None:
    """A run failure that is the model's or its deployment's, whatever the inputs' values (None: not known to be)."""
    if PY_FUNC_UNREGISTERED in str(err):
        return CheckFailed(f"the graph calls Python code (tf.py_func/tf.py_function/tf.numpy_function) that only the "
                           f"process that built it had: {one_line(err, 160)}",
                           "replace the Python function with TensorFlow ops in the model")
    too_large = BATCH_TOO_LARGE.search(str(err))
    if too_large:
        size, limit = too_large.groups()
        return CheckFailed(f"a request of {size} examples is over the batching parameters' max_batch_size {limit}: "
                           f"TF Serving with these parameters refuses it the same way ({one_line(err, 160)})",
                           f"send at most {limit} examples per request (verify: --samples {limit}), or raise "
                           f"max_batch_size or set enable_large_batch_splitting: true in the batching parameters")
    return None


def one_line(err: Exception, limit: int = 300) -> str:
    text = " ".join(str(getattr(err, "message", None) or err).split())
    return (text[:limit] + "...") if len(text) > limit else text or type(err).__name__
