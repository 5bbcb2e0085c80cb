"""One loaded model version (servables/tensorflow/saved_model_bundle_factory.cc + saved_model_warmup_util.cc).

It loads the SavedModel the way TF Serving does (MetaGraph + Session, no user Python imported) and replays the
warm-up records through the APIs before the version counts as AVAILABLE; any failure = the version failed to load
(state END with the error, as GetModelStatus reports it). Every API runs the session through `run`, which feeds
tensors the way TF Serving's C++ Session::Run does: no Python-side shape check (a [1] tensor for a [-1, 1]
placeholder is the graph's business), and with batching on, through the Batcher.
"""
from __future__ import annotations

import logging
import os
import threading
import time

import grpc

from exportkit import storage
from exportkit.errors import ExportkitError, InfraError
from exportkit.serving.server.classifier import run_classify
from exportkit.serving.server.multi_inference import run_multi_inference
from exportkit.serving.server.predict import run_predict
from exportkit.serving.server.regressor import run_regress
from exportkit.serving.server.status import RpcError, grpc_code
from exportkit.tfenv import import_tf

log = logging.getLogger("exportkit.serve")

# saved_model_warmup_util.cc: each record through its own API
WARMUP_APIS = {"PredictRequest": run_predict, "ClassificationRequest": run_classify, "RegressionRequest": run_regress,
               "MultiInferenceRequest": run_multi_inference}
UNIMPLEMENTED = grpc.StatusCode.UNIMPLEMENTED.value[0]


class ServedModel:
    """One model version and its state: LOADING -> AVAILABLE, or END with `error` (tf error code, message)."""

    def __init__(self, location, name: str, device: str = "cpu", session_config=None, batching=None,
                 method_name_check: bool = False, metrics=None):
        """`location`: the version's ModelLocation (savedmodel.resolve_model_path). `method_name_check`:
        --enable_signature_method_name_check (off in TF Serving by default: the signature's structure decides).
        `metrics`: monitoring.Metrics, or None."""
        self.location = location
        self.version_dir = location.version_dir
        self.local_dir = location.version_dir  # what TensorFlow loads: a bucket version's local mirror
        self.name = name
        self.version = location.version
        self.device = device
        self.session_config = session_config
        self.batching = batching  # BatchingParameters, or None for no batching
        self.method_name_check = method_name_check
        self.metrics = metrics
        self.state = "LOADING"
        self.error: tuple[int, str] | None = None
        self.attempts = 0  # loads tried (a retried load counts each)
        self.model = None
        self._owns_model = True
        self._batcher = None
        self._lock = threading.Lock()
        self._holders = 0  # requests holding this version (ServableHandles): it unloads once none is left
        self._unheld = threading.Condition(self._lock)

    @property
    def signatures(self) -> dict:
        return self.model.signatures

    def load(self, model=None) -> None:
        """Load like TF Serving, then replay warm-up; any failure = the version failed to load.
        `model`: a Tf1SavedModel already loaded from this version (verify's worker shares its session's load)."""
        from exportkit.savedmodel.loader import Tf1SavedModel

        tf = import_tf()
        started = time.monotonic()
        self.state, self.error = "LOADING", None  # a retry starts afresh
        self.attempts += 1
        try:
            if model is None:
                from exportkit.tfversions.oplibs import load_for_worker

                self.local_dir = str(storage.local_copy(self.version_dir))  # gs://, s3://: fetched (changes only)
                self._refuse_other_formats()
                load_for_worker(self.local_dir)  # the ops the stock server links; --op-library
            self._owns_model = model is None
            self.model = model or Tf1SavedModel(self.local_dir, device=self.device, config=self.session_config)
            if self.batching is not None:
                from exportkit.serving.server.batching import Batcher

                self._batcher = Batcher(self.batching, self._session_run)
            count = self._warm_up()
        except RpcError as err:
            self._fail(err.code.value[0], err.message, started)
            return
        except ExportkitError as err:  # the bucket: gone (NOT_FOUND) or unreachable (UNAVAILABLE)
            self._fail(14 if isinstance(err, InfraError) else 5, err.message, started)
            return
        except tf.errors.OpError as err:
            self._fail(err.error_code, f"{type(err).__name__}: {err.message}", started)
            return
        except Exception as err:  # noqa: BLE001 — anything else is a load failure too, reported with its type
            self._fail(2, f"{type(err).__name__}: {err}", started)
            return
        if self.metrics is not None:
            self.metrics.load(self.version_dir, True, (time.monotonic() - started) * 1e6)
        self.state = "AVAILABLE"
        log.info("model '%s' version %d loaded in %.2fs (%d warm-up record(s) replayed)",
                 self.name, self.version, time.monotonic() - started, count)

    def _refuse_other_formats(self) -> None:
        """What TF Serving says for the formats it does not load as a SavedModel."""
        has = lambda f: os.path.exists(os.path.join(self.local_dir, f))  # noqa: E731
        if has("saved_model.pb") or has("saved_model.pbtxt"):
            return
        if has("export.meta"):  # session_bundle/oss/session_bundle_util.cc
            raise RpcError(grpc.StatusCode.UNIMPLEMENTED, "Session Bundle is deprecated and removed.")
        if has("model.tflite"):
            raise RpcError(grpc.StatusCode.UNIMPLEMENTED,
                           f"{self.version_dir} holds a TFLite model (model.tflite): exportkit serve does not serve "
                           "TFLite (TF Serving does only with --prefer_tflite_model=true)")
        # TF's cc/saved_model/reader.cc, what TF Serving reports for a version still being copied (then retried)
        raise RpcError(grpc.StatusCode.NOT_FOUND,
                       f"Could not find SavedModel .pb or .pbtxt at supplied export directory path: {self.version_dir}"
                       ". Check that the directory exists and that you have the right permissions for accessing it.")

    def _fail(self, code: int, message: str, started: float) -> None:
        if self.metrics is not None:
            self.metrics.load(self.version_dir, False, (time.monotonic() - started) * 1e6)
        if self._batcher is not None:
            self._batcher.close()
        if self.model is not None and self._owns_model:  # what the failed attempt opened; a retry loads anew
            self.model.close()
        self.model = self._batcher = None
        self.error = (code, message)
        self.state = "END"

    # -- handles (basic_manager.cc ServingMap: a version stays loaded while a request holds it) ------------------
    def acquire(self) -> None:
        with self._lock:
            self._holders += 1

    def release(self) -> None:
        with self._lock:
            self._holders -= 1
            if not self._holders:
                self._unheld.notify_all()

    def wait_unheld(self) -> None:
        """Block until no request holds this version (FastReadDynamicPtr::Update waits so for the old map)."""
        with self._lock:
            self._unheld.wait_for(lambda: not self._holders)

    def _warm_up(self) -> int:
        """Replay the warm-up records like TF Serving, each through its own API; returns how many."""
        from exportkit.savedmodel.layout import warmup_path
        from exportkit.serving.warmup import read_warmup_records

        path = warmup_path(self.local_dir)
        if not os.path.exists(path):
            return 0
        started = time.monotonic()
        try:
            count = self._replay(path, read_warmup_records(path))
        except ValueError as err:
            err = RpcError(grpc.StatusCode.INVALID_ARGUMENT, f"invalid warm-up file: {err}")
            self._warmup_metric(f"{err.code.name}: {err.message}", started)
            raise err from None
        except RpcError as err:
            self._warmup_metric(f"{err.code.name}: {err.message}", started)
            raise
        self._warmup_metric("OK", started)
        return count

    def _warmup_metric(self, status: str, started: float) -> None:
        if self.metrics is not None:
            self.metrics.warmup(self.version_dir, status, (time.monotonic() - started) * 1e6)

    def _replay(self, path: str, requests: list) -> int:
        for i, request in enumerate(requests):
            kind = type(request).__name__
            api = WARMUP_APIS.get(kind)
            if api is None:
                raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, f"Unsupported request type for warmup: {kind}")
            try:
                api(self, request)
            except RpcError as err:
                raise RpcError(err.code, f"warm-up record {i} of {path} failed: {err.code.name}: {err.message}") from None
        return len(requests)

    # -- running the session -------------------------------------------------------------------------------------
    def run(self, feed_names: list[str], arrays: list, fetch_names: list[str]) -> list:
        """Session::Run on tensor names, with the request's deadline (scope.py); TF errors become their status."""
        from exportkit.serving.server.scope import timeout_in_ms

        if self._batcher is not None:
            return self._batcher.run(feed_names, arrays, fetch_names, timeout_in_ms())
        return self._session_run(feed_names, arrays, fetch_names, timeout_in_ms())

    def _session_run(self, feed_names: list[str], arrays: list, fetch_names: list[str], timeout_ms: int = 0) -> list:
        """The load's Session::Run (Tf1SavedModel.session_run, as TF Serving runs it), its errors as gRPC statuses."""
        tf = import_tf()
        self._check_tensors(feed_names, fetch_names)
        try:
            return self.model.session_run(feed_names, arrays, fetch_names, timeout_ms)
        except tf.errors.OpError as err:
            raise RpcError(grpc_code(err.error_code), err.message) from None
        except (TypeError, ValueError) as err:  # numpy could not make a tensor of what was sent
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, f"{type(err).__name__}: {err}") from None

    def _check_tensors(self, feed_names: list[str], fetch_names: list[str]) -> None:
        """A name the graph lacks gets what the C++ session says of it, as TF Serving answers."""
        tf = import_tf()
        try:
            self.model.tf_outputs(feed_names, fetch_names)
        except (KeyError, ValueError):
            from tensorflow.core.protobuf import config_pb2

            options = config_pb2.CallableOptions(feed=list(feed_names), fetch=list(fetch_names))
            try:
                self.model.session._make_callable_from_options(options)  # noqa: SLF001
            except tf.errors.OpError as err:
                raise RpcError(grpc_code(err.error_code), err.message) from None
            raise

    def close(self) -> None:
        if self._batcher is not None:
            self._batcher.close()
        if self.model is not None:
            self.model.close()
