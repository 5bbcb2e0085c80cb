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
import time

import grpc

from exportkit.serving.classifier import run_classify
from exportkit.serving.multi_inference import run_multi_inference
from exportkit.serving.predict import run_predict
from exportkit.serving.regressor import run_regress
from exportkit.serving.status import RpcError, grpc_code
from exportkit.tfenv import import_tf

log = logging.getLogger("exportkit.serve")

# saved_model_warmup_util.cc: each record through its own API
WARMUP_APIS = {"PredictRequest": run_predict, "ClassificationRequest": run_classify, "RegressionRequest": run_regress,
               "MultiInferenceRequest": run_multi_inference}
UNIMPLEMENTED = grpc.StatusCode.UNIMPLEMENTED.value[0]


class ServedModel:
    """One model version and its state: LOADING -> AVAILABLE, or END with `error` (tf error code, message)."""

    def __init__(self, location, name: str, device: str = "cpu", session_config=None, batching=None,
                 method_name_check: bool = False):
        """`location`: the version's ModelLocation (savedmodel.resolve_model_path). `method_name_check`:
        --enable_signature_method_name_check (off in TF Serving by default: the signature's structure decides)."""
        self.location = location
        self.version_dir = location.version_dir
        self.name = name
        self.version = location.version
        self.device = device
        self.session_config = session_config
        self.batching = batching  # BatchingParameters, or None for no batching
        self.method_name_check = method_name_check
        self.state = "LOADING"
        self.error: tuple[int, str] | None = None
        self.model = None
        self._batcher = None

    @property
    def signatures(self) -> dict:
        return self.model.signatures

    def load(self, model=None) -> None:
        """Load like TF Serving, then replay warm-up; any failure = the version failed to load.
        `model`: a Tf1SavedModel already loaded from this version (verify's worker shares its session's load)."""
        from exportkit.tf1_loader import Tf1SavedModel

        tf = import_tf()
        started = time.monotonic()
        try:
            if model is None:
                from exportkit.compat.oplibs import load_for_worker

                self._refuse_other_formats()
                load_for_worker(self.version_dir)  # the ops the stock server links; --op-library
            self.model = model or Tf1SavedModel(self.version_dir, device=self.device, config=self.session_config)
            if self.batching is not None:
                from exportkit.serving.batching import Batcher

                self._batcher = Batcher(self.batching, self._session_run)
            count = self._warm_up()
        except RpcError as err:
            self._fail(err.code.value[0], err.message)
            return
        except tf.errors.OpError as err:
            self._fail(err.error_code, f"{type(err).__name__}: {err.message}")
            return
        except Exception as err:  # noqa: BLE001 — anything else is a load failure too, reported with its type
            self._fail(2, f"{type(err).__name__}: {err}")
            return
        self.state = "AVAILABLE"
        log.info("model '%s' version %d loaded in %.2fs (%d warm-up record(s) replayed)",
                 self.name, self.version, time.monotonic() - started, count)

    def _refuse_other_formats(self) -> None:
        """What TF Serving says for the formats it does not load as a SavedModel."""
        has = lambda f: os.path.exists(os.path.join(self.version_dir, f))  # noqa: E731
        if has("saved_model.pb") or has("saved_model.pbtxt"):
            return
        if has("export.meta"):  # session_bundle/oss/session_bundle_util.cc
            raise RpcError(grpc.StatusCode.UNIMPLEMENTED, "Session Bundle is deprecated and removed.")
        if has("model.tflite"):
            raise RpcError(grpc.StatusCode.UNIMPLEMENTED,
                           f"{self.version_dir} holds a TFLite model (model.tflite): exportkit serve does not serve "
                           "TFLite (TF Serving does only with --prefer_tflite_model=true)")

    def _fail(self, code: int, message: str) -> None:
        self.error = (code, message)
        self.state = "END"

    def _warm_up(self) -> int:
        """Replay the warm-up records like TF Serving, each through its own API; returns how many."""
        from exportkit.layout import warmup_path
        from exportkit.serving.warmup import read_warmup_records

        path = warmup_path(self.version_dir)
        if not os.path.exists(path):
            return 0
        try:
            requests = read_warmup_records(path)
        except ValueError as err:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, f"invalid warm-up file: {err}") from None
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
        """Session::Run on tensor names; TF errors become their gRPC status."""
        if self._batcher is not None:
            return self._batcher.run(feed_names, arrays, fetch_names)
        return self._session_run(feed_names, arrays, fetch_names)

    def _session_run(self, feed_names: list[str], arrays: list, fetch_names: list[str]) -> list:
        tf = import_tf()
        try:  # a callable runs through TF_SessionRunCallable: TensorFlow's C++ checks only, as in TF Serving
            call = self.model.session_callable(feed_names, fetch_names)
        except tf.errors.OpError as err:
            raise RpcError(grpc_code(err.error_code), err.message) from None
        try:
            return list(call(*arrays))
        except tf.errors.OpError as err:
            raise RpcError(grpc_code(err.error_code), err.message) from None
        except (TypeError, ValueError) as err:  # numpy could not make a tensor of what was sent
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, f"{type(err).__name__}: {err}") from None

    def close(self) -> None:
        if self._batcher is not None:
            self._batcher.close()
        if self.model is not None:
            self.model.close()
