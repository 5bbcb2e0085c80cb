"""The `serving` runtime: the model as clients see it, over TF Serving's gRPC API (binary, remote or embedded).

Beyond computing outputs it checks what only a server shows: the served signature (GetModelMetadata) against
the SavedModel's, and the warm-up records replayed through Predict.
"""
from __future__ import annotations

import numpy as np

from exportkit.errors import CheckFailed, InfraError

_INFRA_CODES = {"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "RESOURCE_EXHAUSTED"}


class ServingRuntime:
    """Runtime protocol on top of launcher + client. `server` describes who answered (kind, version, address)."""

    name = "serving"
    kind = "grpc"

    def __init__(self, path: str | None, mode: str = "auto", *, model_name: str | None = None,
                 model_version: int | None = None, signature_name: str = "serving_default",
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
        where = f"{self.server['kind']} server at {self.server['address']}" if self.server else "server"
        if err.code in _INFRA_CODES:
            raise InfraError(f"{what} on the {where} failed: {err.code}: {err.message}") from None
        raise CheckFailed(f"{what} on the {where} failed: {err.code}: {err.message}") from None

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from exportkit.serving.client import ServingError

        if self._client is None:
            raise RuntimeError("ServingRuntime.run() before load()")
        try:
            return self._client.predict(inputs)
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

    # -- checks only a server can do ------------------------------------------------------------------------
    def check_metadata(self, expected_signature_def, signature_name: str | None = None) -> list[str]:
        """Problems where the served signature (GetModelMetadata) differs from `expected_signature_def`.

        `expected_signature_def`: the SavedModel's SignatureDef for `signature_name` (default: this runtime's),
        or a {name: SignatureDef} map to compare every signature. Compares input/output keys, dtypes, shapes.
        """
        from exportkit.serving.client import ServingError

        try:
            served = self._client.metadata()
        except ServingError as err:
            self._raise(err, "GetModelMetadata")
        if _is_one_signature(expected_signature_def):
            expected = {signature_name or self.signature_name: expected_signature_def}
        else:
            expected = dict(expected_signature_def)
        problems = []
        for sig_name, want in sorted(expected.items()):
            got = served.get(sig_name)
            if got is None:
                problems.append(f"signature '{sig_name}' is not served (served: {sorted(served)})")
                continue
            want, got = _as_dict(want), _as_dict(got)
            problems += _compare_side(sig_name, "input", want["inputs"], got["inputs"])
            problems += _compare_side(sig_name, "output", want["outputs"], got["outputs"])
        return problems

    def replay_warmup(self, path: str) -> list[str]:
        """Send the warm-up records (file, or version dir's assets.extra file) through Predict; list failures.

        Model name/version are set to the served ones, as TF Serving ignores them during its own warm-up.
        """
        from exportkit.serving.client import ServingError
        from exportkit.serving.warmup import read_warmup_records

        try:
            requests = read_warmup_records(path)
        except (ValueError, OSError) as err:
            return [f"warm-up file unreadable: {err}"]
        except Exception as err:  # noqa: BLE001 — tf.errors.DataLossError etc.: a corrupt TFRecord
            return [f"warm-up file unreadable: {type(err).__name__}: {err}"]
        problems = []
        for i, request in enumerate(requests):
            request.model_spec.name = self._handle.model_name
            if self._handle.model_version is not None:
                request.model_spec.version.value = int(self._handle.model_version)
            try:
                self._client.predict_request(request)
            except ServingError as err:
                problems.append(f"warm-up record {i}: {err.code}: {err.message}")
        return problems

    def __enter__(self) -> "ServingRuntime":
        self.load()
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _is_one_signature(value) -> bool:
    """A SignatureDef proto or exportkit.savedmodel's dict form ({"inputs": {...}, "outputs": {...}})."""
    if hasattr(value, "DESCRIPTOR"):
        return True
    return isinstance(value, dict) and isinstance(value.get("inputs"), dict) and isinstance(value.get("outputs"), dict)


def _as_dict(signature) -> dict:
    """Both forms as {"inputs": {key: {"dtype", "shape"}}, "outputs": ...} (savedmodel.signatures_of's form)."""
    if isinstance(signature, dict):
        return signature
    from exportkit.savedmodel import tensor_info_dict

    return {"inputs": {k: tensor_info_dict(v) for k, v in signature.inputs.items()},
            "outputs": {k: tensor_info_dict(v) for k, v in signature.outputs.items()}}


def _compare_side(sig_name: str, side: str, want: dict, got: dict) -> list[str]:
    problems = []
    for key in sorted(set(want) - set(got)):
        problems.append(f"signature '{sig_name}': {side} '{key}' missing on the server")
    for key in sorted(set(got) - set(want)):
        problems.append(f"signature '{sig_name}': server has an extra {side} '{key}'")
    for key in sorted(set(want) & set(got)):
        w, g = want[key], got[key]
        if w.get("dtype") != g.get("dtype"):
            problems.append(f"signature '{sig_name}': {side} '{key}' dtype {w.get('dtype')} expected, "
                            f"server has {g.get('dtype')}")
        if _shape(w.get("shape")) != _shape(g.get("shape")):
            problems.append(f"signature '{sig_name}': {side} '{key}' shape {_shape(w.get('shape'))} expected, "
                            f"server has {_shape(g.get('shape'))}")
    return problems


def _shape(shape) -> str:
    return "unknown rank" if shape is None else "(" + ", ".join(str(d) for d in shape) + ")"
