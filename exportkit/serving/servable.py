"""One loaded model version (servables/tensorflow/saved_model_bundle_factory + saved_model_warmup_util.cc).

It loads the SavedModel the way TF Serving does (MetaGraph + Session, no user Python imported) and replays the
warm-up records through the APIs before the version counts as AVAILABLE; any failure = the version failed to load
(state END with the error, as GetModelStatus reports it).
"""
from __future__ import annotations

import logging
import os
import time

import grpc

from exportkit.savedmodel import ModelLocation
from exportkit.serving.classifier import run_classify
from exportkit.serving.multi_inference import run_multi_inference
from exportkit.serving.predict import run_predict
from exportkit.serving.regressor import run_regress
from exportkit.serving.status import RpcError
from exportkit.tfenv import import_tf

log = logging.getLogger("exportkit.serve")

# saved_model_warmup_util.cc: each record through its own API
WARMUP_APIS = {"PredictRequest": run_predict, "ClassificationRequest": run_classify, "RegressionRequest": run_regress,
               "MultiInferenceRequest": run_multi_inference}


class ServedModel:
    """One model version and its state: LOADING -> AVAILABLE, or END with `error` (tf error code, message)."""

    def __init__(self, location: ModelLocation, name: str, device: str):
        self.location = location
        self.name = name
        self.version = location.version
        self.device = device
        self.state = "LOADING"
        self.error: tuple[int, str] | None = None
        self.model = None

    def load(self, model=None) -> None:
        """Load like TF Serving, then replay warm-up; any failure = the version failed to load.
        `model`: a Tf1SavedModel already loaded from this version (verify's worker shares its session's load)."""
        from exportkit.tf1_loader import Tf1SavedModel

        tf = import_tf()
        started = time.monotonic()
        try:
            self.model = model or Tf1SavedModel(self.location.version_dir, device=self.device)
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

    def _fail(self, code: int, message: str) -> None:
        self.error = (code, message)
        self.state = "END"

    def _warm_up(self) -> int:
        """Replay the warm-up records like TF Serving, each through its own API; returns how many."""
        from exportkit.layout import warmup_path
        from exportkit.serving.warmup import read_warmup_records

        path = warmup_path(self.location.version_dir)
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

    def close(self) -> None:
        if self.model is not None:
            self.model.close()
