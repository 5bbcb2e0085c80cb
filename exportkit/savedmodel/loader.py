"""The TF1-style loader: how TF Serving loads a SavedModel (MetaGraph + Session.run on SignatureDef tensors).

Used by the `session` runtime and by `exportkit serve`. Both run it in a process that never imports user code,
so a SavedModel that only works when the training code is importable fails here as it would in TF Serving.
export's self-check runs it in the exporting process, after static checks of what that process could hide
(exportkit/export/selfcheck.py).
"""
from __future__ import annotations

import threading

import numpy as np

from exportkit.errors import CheckFailed
from exportkit.tfenv import import_tf

MISSING_VARIABLE_REMEDY = ("export with `exportkit export` (keras.export.ExportArchive tracks every variable the "
                           "signature uses; tf.saved_model.save of a Keras 3 model does not)")


class Tf1SavedModel:
    """A SavedModel loaded with `tf.compat.v1.saved_model.loader.load` into its own graph and session."""

    def __init__(self, path: str, tags: tuple[str, ...] = ("serve",), device: str | None = None, config=None):
        """`config`: a ConfigProto for the session (the model server's thread-pool sizes), else the default."""
        tf = import_tf()
        self.path = path
        self.graph = tf.Graph()
        config = config or tf.compat.v1.ConfigProto()
        if device == "cpu":
            config.device_count["GPU"] = 0
        self.session = tf.compat.v1.Session(graph=self.graph, config=config)
        with self.graph.as_default():
            self.meta_graph = tf.compat.v1.saved_model.loader.load(self.session, list(tags), path)
        self.signatures = dict(self.meta_graph.signature_def)
        self._tf_outputs: dict = {}
        self._lock = threading.Lock()

    def run(self, signature_name: str, inputs: dict[str, np.ndarray],
            output_keys: list[str] | None = None) -> dict[str, np.ndarray]:
        """Feed `inputs` by signature key, fetch outputs by signature key (all of them unless `output_keys`)."""
        signature = self.signatures[signature_name]
        feeds = sorted(inputs)
        keys = list(output_keys) if output_keys else sorted(signature.outputs)
        names = [signature.inputs[key].name for key in feeds]
        fetches = [signature.outputs[key].name for key in keys]
        values = self.session_run(names, [self._as_feed(name, inputs[key]) for name, key in zip(names, feeds)], fetches)
        return dict(zip(keys, values))

    def tf_outputs(self, feeds: list[str], fetches: list[str]) -> tuple[list, list]:
        """The graph's TF_Outputs for these tensor names (cached); a missing name is the KeyError Session.run gives."""
        key = (tuple(feeds), tuple(fetches))
        with self._lock:
            if key not in self._tf_outputs:
                tensor = self.graph.get_tensor_by_name
                self._tf_outputs[key] = ([tensor(n)._as_tf_output() for n in feeds],  # noqa: SLF001
                                         [tensor(n)._as_tf_output() for n in fetches])  # noqa: SLF001
            return self._tf_outputs[key]

    def session_run(self, feeds: list[str], values: list, fetches: list[str], timeout_ms: int = 0) -> list:
        """Session::Run through TF_SessionRun, what TF Serving's C++ session runs: no Python-side checks (Session.run
        first checks every feed against the placeholder's static shape and refuses, e.g., x of shape [1] for a
        [-1, 1] placeholder, which TF Serving's session takes and answers). With `timeout_ms`, RunOptions'
        timeout: DEADLINE_EXCEEDED once it passes.

        The session runtime and the embedded server of verify's worker both run here: the C++ session keeps one
        pruned and optimised graph (Grappler, most of a first call's time) per set of feeds and fetches, so the
        second of them reuses the first one's, as one TF Serving session would."""
        feed_outputs, fetch_outputs = self.tf_outputs(feeds, fetches)
        options = None
        if timeout_ms > 0:
            from tensorflow.core.protobuf import config_pb2
            from tensorflow.python.client import pywrap_tf_session

            options = pywrap_tf_session.TF_NewBufferFromString(
                config_pb2.RunOptions(timeout_in_ms=timeout_ms).SerializeToString())
        try:
            return list(self.session._call_tf_sessionrun(  # noqa: SLF001 — what Session.run calls, unchecked
                options, dict(zip(feed_outputs, values)), fetch_outputs, [], None))
        finally:
            if options is not None:
                pywrap_tf_session.TF_DeleteBuffer(options)

    def _as_feed(self, name: str, value) -> np.ndarray:
        """The value as an array of the tensor's dtype (Session.run converts feeds so; the callable does not)."""
        dtype = self.graph.get_tensor_by_name(name).dtype
        if dtype.name == "string":
            return np.asarray(value, dtype=object)
        return np.asarray(value, dtype=dtype.as_numpy_dtype)

    def close(self) -> None:
        self.session.close()


def failure_message(err: BaseException) -> str:
    """One line for a load or run failure: the exception's type and the first 500 characters of its text without
    the Python stack TF2 puts before the cause ("Detected at node X defined at (most recent call last): File ...")."""
    return f"{type(err).__name__}: {' '.join(_without_stacks(str(err)).split())[:500]}"


def _without_stacks(text: str) -> str:
    kept, in_frame = [], False
    for line in text.splitlines():
        if line.startswith("  File \""):
            in_frame = True
        elif not (in_frame and line.startswith("    ")):
            in_frame = False
            if not line.endswith("(most recent call last):"):
                kept.append(line)
    return "\n".join(kept)


def load_failure(err: BaseException) -> CheckFailed:
    """The model's failure in the TF1 loader, with the remedy for the known causes."""
    return loader_failure(failure_message(err))


def loader_failure(message: str, remedy: str | None = None) -> CheckFailed:
    """A TF1 loader failure by its message (also one reported by a worker process), with the remedy for the known
    causes, else `remedy`, else the general one."""
    remedy = (MISSING_VARIABLE_REMEDY if "find variable" in message else
              remedy or "this SavedModel will fail the same way in TF Serving; see the message, re-run with --debug")
    return CheckFailed(f"TF1 loader (as TF Serving loads models): {message}", remedy)
