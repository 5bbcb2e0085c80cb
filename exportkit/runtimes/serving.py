"""The `serving` runtime: the model as clients see it, over TF Serving's gRPC API (binary, remote or embedded).

Beyond computing outputs it gives what only a server shows: the served signatures (GetModelMetadata), and the
warm-up records replayed through Predict.
"""
from __future__ import annotations

import numpy as np

from exportkit.findings import Finding
from exportkit.runtimes import Runtime
from exportkit.savedmodel import DEFAULT_SIGNATURE


class ServingRuntime(Runtime):
    """Runtime protocol on top of launcher + client. `server` describes who answered (kind, version, address)."""

    name = "serving"
    kind = "grpc"

    def __init__(self, path: str | None, mode: str = "auto", *, model_name: str | None = None,
                 model_version: int | None = None, signature_name: str = DEFAULT_SIGNATURE,
                 binary: str | None = None, device: str = "cpu", load_timeout: float = 120.0,
                 timeout: float = 30.0):
        """`mode`: auto | binary | embedded | HOST:PORT (see serving.launcher.start)."""
        self.path = path
        self.mode = mode
        self.model_name = model_name
        self.model_version = model_version
        self.signature_name = signature_name
        self.binary = binary
        self.load_timeout = load_timeout
        self.timeout = timeout
        # A remote server's device is not ours to know.
        self.device = device if mode in ("auto", "binary", "embedded") else None
        self._device = device
        self.server: dict | None = None
        self.loaded = False
        self._pending = None
        self._handle = None
        self._client = None

    def start(self) -> None:
        """Spawn the server now (cheap) so its TF import and model load overlap other runtimes' work."""
        from exportkit.serving.launcher import start

        if self._pending is None and self._handle is None:
            self._pending = start(self.mode, self.path, model_name=self.model_name, model_version=self.model_version,
                                  binary=self.binary, device=self._device, load_timeout=self.load_timeout)

    def load(self) -> None:
        """Wait for a server with the model AVAILABLE (CheckFailed if it fails to load, InfraError if no server)."""
        from exportkit.serving.client import ServingClient

        if self.loaded:
            return
        self.start()
        pending, self._pending = self._pending, None
        self._handle = pending.wait()
        self.server = dict(self._handle.description)
        try:
            self._client = ServingClient(self._handle.address, self._handle.model_name, self._handle.model_version,
                                         self.signature_name, timeout=self.timeout)
        except BaseException:
            self.close()
            raise
        self.loaded = True

    def _raise(self, err, what: str):
        from exportkit.serving.client import INFRA_CODES, as_exportkit_error

        where = f"{self.server['kind']} server at {self.server['address']}" if self.server else "server"
        if err.code not in INFRA_CODES:
            raise as_exportkit_error(err, f"{what} on the {where}",
                                     "the server's answer says what it refused; the SavedModel's signature "
                                     "(`exportkit inspect PATH`) says what it expects") from None
        error = as_exportkit_error(err, f"{what} on the {where}",
                                   "the server stopped answering (did it crash or run out of memory?); run the check "
                                   "again, and read the server log if it happens again")
        died = self._handle.died() if self._handle is not None else None
        if died:
            tail = self._handle.tail() if self._handle.tail else ""
            error.message += f" (the server {died})" + (f"\nserver log:\n{tail}" if tail.strip() else "")
        raise error from None

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from exportkit.serving.client import ServingError

        if self._client is None:
            raise RuntimeError("ServingRuntime.run() before load()")
        try:
            return self._client.predict(inputs, signature_name=self.signature_name)
        except ServingError as err:
            self._raise(err, f"Predict(signature '{self.signature_name}')")

    def close(self) -> None:
        self.loaded = False
        if self._pending is not None:
            self._pending.stop()
            self._pending = None
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._handle is not None:
            self._handle.stop()
            self._handle = None

    # -- what only a server shows -----------------------------------------------------------------------------
    def served_signatures(self) -> dict:
        """{signature name: {"inputs", "outputs"}} as the server reports them (GetModelMetadata)."""
        from exportkit.savedmodel import tensor_info_dict
        from exportkit.serving.client import ServingError

        try:
            served = self._client.metadata()
        except ServingError as err:
            self._raise(err, "GetModelMetadata")
        return {name: {"inputs": {k: tensor_info_dict(v) for k, v in sig.inputs.items()},
                       "outputs": {k: tensor_info_dict(v) for k, v in sig.outputs.items()}}
                for name, sig in served.items()}

    def replay_warmup(self, path: str) -> list[Finding]:
        """Send the warm-up records (file, or version dir's assets.extra file) through the server, each through the
        API of its log kind (`_WARMUP_REPLAY`); findings for records that fail (error), kinds not replayed yet
        (warning) and a missing file (info: TF Serving treats it as optional).

        Model name/version are set to the served ones, as TF Serving ignores them during its own warm-up.
        """
        from exportkit.layout import WARMUP
        from exportkit.serving.warmup import log_kind, read_warmup_logs

        try:
            logs = read_warmup_logs(path)
        except FileNotFoundError:
            return [Finding("info", "serving-warmup",
                            f"no {WARMUP}: TF Serving loads the model without warm-up, so the first "
                            f"requests pay for its initialisation (optional; exportkit export writes one)")]
        except (ValueError, OSError) as err:
            return [Finding("error", "serving-warmup", f"warm-up file unreadable: {err}")]
        except Exception as err:  # noqa: BLE001 — tf.errors.DataLossError etc.: a corrupt TFRecord
            return [Finding("error", "serving-warmup", f"warm-up file unreadable: {type(err).__name__}: {err}")]
        findings, skipped = [], {}
        for i, log in enumerate(logs):
            kind = log_kind(log)
            replay = _WARMUP_REPLAY.get(kind)
            if replay is None:
                skipped[kind] = skipped.get(kind, 0) + 1
                continue
            problem = replay(self, log)
            if problem:
                findings.append(Finding("error", "serving-warmup", f"warm-up record {i} ({kind}): {problem}"))
        if skipped:
            kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(skipped.items()))
            findings.append(Finding(
                "warning", "serving-warmup-not-replayed",
                f"{sum(skipped.values())} warm-up record(s) not replayed ({kinds}): exportkit does not replay this "
                f"kind yet (it replays predict, classify and regress records), so whether TF Serving's warm-up of "
                f"them succeeds is unchecked"))
        return findings

    def _replay_as_predict(self, log) -> str | None:
        """Predict records as they are; Classify/Regress records as the Predict they amount to (their Examples
        into the signature's string input), as the embedded server replays them."""
        from exportkit.serving.client import ServingError
        from exportkit.serving.warmup import as_predict_request, log_kind

        request = as_predict_request(getattr(log, log_kind(log)).request)
        request.model_spec.name = self._handle.model_name
        if self._handle.model_version is not None:
            request.model_spec.version.value = int(self._handle.model_version)
        try:
            self._client.predict_request(request)
        except ServingError as err:
            return f"{err.code}: {err.message}"
        return None


# Warm-up log kind -> how to replay one record (returns a problem or None). Kinds missing here are reported as
# not replayed (a warning); add multi_inference_log (or real Classify/Regress calls) here when the client has them.
_WARMUP_REPLAY = {"predict_log": ServingRuntime._replay_as_predict, "classify_log": ServingRuntime._replay_as_predict,
                  "regress_log": ServingRuntime._replay_as_predict}
