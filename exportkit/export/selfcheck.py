"""export's self-check: the written SavedModel, loaded the way TF Serving loads it, must reproduce eager Keras.

It runs in the exporting process, with the TF1 loader (its own tf.Graph and Session: the graph alone decides what
runs), so it costs no second TensorFlow import and no second process. What a fresh process without user code
guaranteed is checked on saved_model.pb before the load:

* no py_function op is reachable from a signature: here its Python callback is registered and would run;
* every op of the graph and its function library is registered in stock TensorFlow of the installed X.Y (the
  compat registry shipped for it): an op that only this process knows (a custom op library the user's code loaded
  with tf.load_op_library) would load here and fail in TF Serving.

Everything else (variables the serving loader cannot find, ...) fails the TF1 load itself, as in a fresh process.
When no registry ships for the installed TensorFlow, the check runs in a fresh process instead (`stock_version`
returns None and the pipeline falls back to the session runtime), so nothing goes unchecked.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from exportkit.savedmodel import lint
from exportkit.savedmodel.graph import function_label, graph_of
from exportkit.tfversions import registry as registries
from exportkit.errors import CheckFailed, ExportkitError
from exportkit.savedmodel.reader import read_saved_model_proto, select_meta_graph
from exportkit.savedmodel.loader import Tf1SavedModel, load_failure

REFUSED = "the version was not written; "


def stock_version(tf_version: str | None) -> str | None:
    """"X.Y" of the installed TensorFlow (`tf_version` like "2.21.0") when its registry ships, else None."""
    version = ".".join((tf_version or "").split(".")[:2])
    return version if version in registries.available() else None


def static_check(path: str | Path, version: str) -> None:
    """Refuse what an in-process load would accept but a process without user code (TF Serving) would not;
    `version` names the registry of stock ops (`stock_version`)."""
    registry = registries.load(version)
    meta_graph = select_meta_graph(read_saved_model_proto(path))
    py_funcs = sorted({f"{node.op} '{node.name}' in {function_label(function)}"
                       for function, node in lint.reachable_py_funcs(graph_of(meta_graph))})
    if py_funcs:
        raise CheckFailed(f"the signatures run Python code (tf.py_function/tf.numpy_function): {lint.few(py_funcs)}; "
                          f"TF Serving cannot run it", REFUSED + "replace them with TensorFlow ops in the model")
    unknown = lint.unregistered_ops(meta_graph, registry.names())
    if unknown:
        origins = {op: registry.provider(op) for op in unknown}
        listed = "; ".join(f"'{op}' (in {lint.few(places)}{f', from {origins[op]}' if origins[op] else ''})"
                           for op, places in unknown.items())
        raise CheckFailed(f"ops not registered in the stock TF Serving {version} ({registry.server}): {listed}; "
                          f"only a server built with their op library linked in can load the model",
                          REFUSED + "build TF Serving with the op's kernel library linked in and export with "
                          "--no-verify, or replace the op with stock TensorFlow ops")


def external_files_check(path: str | Path) -> None:
    """Refuse a SavedModel that reads files from outside it (exportkit.savedmodel.deployment): it works on this machine only."""
    from exportkit.savedmodel.deployment import EXTERNAL_FILE_FIX, file_reads

    outside = [r for r in file_reads(select_meta_graph(read_saved_model_proto(path))) if r.outside]
    if outside:
        listed = "; ".join(f"'{r.path}' ({r.op} at {'load time' if r.when == 'load' else 'each request'}, captured by "
                           f"{r.owner or r.node})" for r in outside)
        raise CheckFailed(f"the SavedModel reads files from outside it: {listed}; TF Serving in a container or on "
                          f"another host does not have them", REFUSED + EXTERNAL_FILE_FIX.removeprefix("fix: "))


def xla_check(path: str | Path, flags) -> list:
    """Refuse, under the stock flags, a SavedModel that needs XLA (exportkit.savedmodel.deployment): the self-check's
    TF1 loader compiles it, the stock tensorflow_model_server refuses every request. With the deployment's
    --server-flag xla_cpu_compilation_enabled=true: the info finding, for the export's report."""
    from exportkit.savedmodel.deployment import xla_findings

    findings = xla_findings(select_meta_graph(read_saved_model_proto(path)), flags, directory=path)
    for finding in findings:
        if finding.severity == "error":
            why, _, fix = finding.message.partition(" fix: ")
            raise CheckFailed(why, REFUSED + fix)
    return findings


class InProcessSession:
    """Tf1SavedModel behind the calls `_self_check` makes of the session runtime: load, use_signature, run, close.
    Load and run failures are the model's (CheckFailed), as the session worker reports them."""

    def __init__(self, path: str):
        self.path = path
        self.signature_name = None
        self._model = None

    def load(self) -> None:
        try:
            self._model = Tf1SavedModel(str(self.path), device="cpu")
        except Exception as err:  # noqa: BLE001  (whatever the loader raises, TF Serving would fail the same way)
            raise load_failure(err) from err

    def use_signature(self, name: str, input_dtypes: dict) -> None:
        self.signature_name = name

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            return self._model.run(self.signature_name, inputs)
        except ExportkitError:
            raise
        except Exception as err:  # noqa: BLE001
            raise load_failure(err) from err

    def close(self) -> None:
        if self._model is not None:
            self._model.close()
            self._model = None
