"""Runtimes wrapped for --data and diff: the same lifecycle, answers shaped for the comparison.

* `ExampleParsing`: a model that takes tensors (eager Keras), on a signature over serialized tf.Example, parses the
  records itself, so it sees the very records the other runtimes see.
* `Top1Outputs`: answers that also hold each output's top-1 (`KEY/top1`), compared like any other output (diff).

Both are built by runtimes.factory from a RuntimeSpec (`parse_examples`, `top1`), in-process and on Beam workers.
"""
from __future__ import annotations

import numpy as np

from exportkit.runtimes import Runtime

TOP1 = "/top1"  # suffix of a derived top-1 output


class Wrapped(Runtime):
    """A runtime around another: the same lifecycle, name and kind; `feed` reshapes the inputs it is given and
    `answer` the outputs the inner runtime gives back."""

    def __init__(self, inner: Runtime):
        self.inner = inner
        self.name, self.kind, self.device = inner.name, inner.kind, inner.device

    def start(self) -> None:
        self.inner.start()

    def load(self) -> None:
        self.inner.load()
        self.loaded = True

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        outputs = self.inner.run(self.feed(inputs))
        self.placed_on, self.server = self.inner.placed_on, self.inner.server
        return None if outputs is None else self.answer(outputs)

    def close(self) -> None:
        self.inner.close()
        self.loaded = False

    def feed(self, inputs: dict) -> dict:
        return inputs

    def answer(self, outputs: dict) -> dict:
        return outputs


class ExampleParsing(Wrapped):
    """A runtime whose model takes tensors, on a signature over serialized tf.Example: it parses the records into
    its model's own inputs (the keras runtime from --against), so it sees the same records as the others.
    `name_record(row)` names a record in errors; the caller sets it per batch when it knows the positions."""

    def __init__(self, inner: Runtime, example_key: str):
        super().__init__(inner)
        self.example_key = example_key
        self.name_record = lambda row: f"#{row} of its batch"
        self._parser = None

    def load(self) -> None:
        from exportkit.tfexample.parser import ExampleParser

        super().load()
        self._parser = ExampleParser(self.inner.input_specs())

    def feed(self, inputs: dict) -> dict:
        return self._parser(list(inputs[self.example_key]), self.name_record)


def top1_sources(signature: dict) -> dict[str, tuple[str, str | None]]:
    """{derived output: (scores output, classes output or None)}: what `Top1Outputs` adds for a signature.

    A classify signature's top-1 is its `classes` label at the highest score (the first class without scores), and
    so is that of `scores` beside `classes` (Classify-style pairs); any other output of [batch, k] floats (k >= 2:
    probabilities or logits), whatever it is called, has the argmax as its top-1. An unknown k is decided on the
    answers (`top1_of`: none for k = 1)."""
    from exportkit.signature_constants import CLASSIFY_CLASSES, CLASSIFY_METHOD, CLASSIFY_SCORES

    outputs = signature["outputs"]
    derived = {}
    if signature.get("method") == CLASSIFY_METHOD or (CLASSIFY_CLASSES in outputs and CLASSIFY_SCORES in outputs):
        if CLASSIFY_SCORES in outputs:
            derived[CLASSIFY_SCORES + TOP1] = (CLASSIFY_SCORES, CLASSIFY_CLASSES if CLASSIFY_CLASSES in outputs else None)
        elif CLASSIFY_CLASSES in outputs:
            derived[CLASSIFY_CLASSES + TOP1] = (None, CLASSIFY_CLASSES)
    for key, t in outputs.items():
        shape = t.get("shape")
        if (key + TOP1 not in derived and t.get("dtype", "").startswith(("float", "bfloat"))
                and shape is not None and len(shape) == 2 and (shape[1] >= 2 or shape[1] == -1)):
            derived[key + TOP1] = (key, None)
    return derived


def top1_of(outputs: dict[str, np.ndarray], derived: dict[str, tuple[str, str | None]]) -> dict[str, np.ndarray]:
    """The derived top-1 outputs of one batch's answers (labels where there are classes, else argmax indices)."""
    top = {}
    for name, (scores, classes) in derived.items():
        s = None if scores is None else outputs.get(scores)
        c = None if classes is None else outputs.get(classes)
        if s is not None and np.ndim(s) == 2 and np.shape(s)[1] >= (1 if c is not None else 2):
            best = np.argmax(np.asarray(s), axis=1)
            top[name] = best.astype(np.int64) if c is None else np.asarray(c)[np.arange(len(best)), best]
        elif c is not None and np.ndim(c) == 2 and np.shape(c)[1]:
            top[name] = np.asarray(c)[:, 0]
    return top


class Top1Outputs(Wrapped):
    """A runtime whose answers also hold the derived top-1 outputs (`top1_sources`), so that they are compared like
    any other output (in-process and on Beam workers alike)."""

    def __init__(self, inner: Runtime, derived: dict[str, tuple[str, str | None]]):
        super().__init__(inner)
        self.derived = derived

    def answer(self, outputs: dict) -> dict:
        return {**outputs, **top1_of(outputs, self.derived)}
