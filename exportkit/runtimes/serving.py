"""The `serving` runtime: the model as clients see it, over TF Serving's gRPC API (binary, remote or embedded).

Beyond computing outputs it gives what only a server shows: the served signatures (GetModelMetadata), and the
warm-up records replayed through their APIs; and the same server over REST (RestRuntime).
"""
from __future__ import annotations

import numpy as np

from exportkit.errors import CheckFailed, InfraError
from exportkit.findings import Finding
from exportkit.runtimes import Runtime
from exportkit.savedmodel.signature_defs import serving_api
from exportkit.signature_constants import DEFAULT_SIGNATURE


def _closed_error(when: str) -> InfraError:
    """A lane reached a runtime that verify had already closed (Ctrl-C, SIGTERM): no server may start after that."""
    return InfraError(f"the serving runtime was closed {when}", "run the check again")


class ServingRuntime(Runtime):
    """Runtime protocol on top of launcher + client. `server` describes who answered (kind, version, address)."""

    name = "serving"
    kind = "grpc"

    def __init__(self, path: str | None, mode: str = "auto", *, model_name: str | None = None,
                 model_version: int | None = None, signature_name: str = DEFAULT_SIGNATURE,
                 binary: str | None = None, device: str = "cpu", load_timeout: float = 120.0,
                 timeout: float = 30.0, signatures: dict | None = None, rest: bool = False, worker=None,
                 launch=None):
        """`mode`: auto | binary | embedded | docker[:TAG] | HOST:PORT (see serving.launch.modes.start); `launch`:
        options.launch.LaunchOptions (container CLI, --pull, batching parameters). `worker`: a
        runtimes.session.TfWorker for the model; the embedded server then runs in it, on its session loader's load.

        `signatures` ({name: savedmodel.signatures_of's form}) pick the API of the signature in use: Classify or
        Regress for signatures with
        those method names (as clients of Estimator/TFX exports call them), Predict otherwise. `rest`: the launched
        server also serves the REST API (for a RestRuntime on top of this one).
        """
        self.rest = rest
        self.worker = worker
        if worker is not None:
            worker.attach()
        self.signatures = signatures or {}
        self.path = path
        self.mode = mode
        self.model_name = model_name
        self.model_version = model_version
        self.signature_name = signature_name
        self.binary = binary
        self.launch = launch
        self.load_timeout = load_timeout
        self.timeout = timeout
        # A remote server's device is not ours to know.
        self.device = device if mode in ("auto", "binary", "embedded") or mode.startswith("docker") else None
        self._device = device
        self.server: dict | None = None
        self.loaded = False
        self._closed = False
        self._pending = None
        self._handle = None
        self._client = None

    def start(self) -> None:
        """Spawn the server now (cheap) so its TF import and model load overlap other runtimes' work."""
        from exportkit.serving.launch.binary import find_binary
        from exportkit.serving.launch.modes import start

        if self._closed:  # closed while a lane was on its way here (Ctrl-C): no server may start after that
            raise _closed_error("before its server started")
        if self._pending is not None or self._handle is not None:
            return
        embedded = self.mode == "embedded" or (self.mode == "auto" and not find_binary(self.binary))
        if embedded and self.worker is not None and not self._xla_disabled_here():
            self.worker.start()  # its TensorFlow import overlaps the other runtimes' work
            self._pending = _serve_in_worker(self.worker, self.model_name, self.rest, self._device, self.launch)
            return
        self._pending = start(self.mode, self.path, model_name=self.model_name, model_version=self.model_version,
                              binary=self.binary, device=self._device, load_timeout=self.load_timeout, rest=self.rest,
                              launch=self.launch)

    def _xla_disabled_here(self) -> bool:
        """The server must refuse XLA (stock flags) and the model has functions that need it: an `exportkit serve`
        process of its own, which disables XLA as tensorflow_model_server does, not the worker, whose session runtime
        and loaders would be disabled with it (DisableXlaCompilation is process-wide)."""
        from exportkit.savedmodel.deployment import xla_uses
        from exportkit.savedmodel.reader import read_saved_model_proto, select_meta_graph

        flags = getattr(self.launch, "server_flags", None)
        if self.path is None or (flags is not None and flags.xla_enabled):
            return False
        return bool(xla_uses(select_meta_graph(read_saved_model_proto(self.path)), self.path))

    def load(self) -> None:
        """Wait for a server with the model AVAILABLE (CheckFailed if it fails to load, InfraError if no server)."""
        from exportkit.serving.client.grpc_client import ServingClient

        if self.loaded:
            return
        self.start()
        try:  # `_pending` stays set while it loads: a close() from another thread (Ctrl-C, SIGTERM) then stops it
            self._handle = self._pending.wait()
        finally:
            self._pending = None
        if self._closed:
            self._handle.stop()
            raise _closed_error("while its server loaded the model")
        self.server = dict(self._handle.description, api=self.api)
        try:
            self._client = ServingClient(self._handle.address, self._handle.model_name, self._handle.model_version,
                                         self.signature_name, timeout=self.timeout)
        except BaseException:
            handle, self._handle = self._handle, None
            handle.stop()
            raise
        self.loaded = True

    def use_signature(self, name: str, input_dtypes: dict[str, str]) -> None:
        super().use_signature(name, input_dtypes)
        if self.server is not None:  # a new dict: results already reported keep the API they were answered by
            self.server = dict(self.server, api=self.api)

    @property
    def signature(self) -> dict:
        return self.signatures.get(self.signature_name) or {}

    @property
    def api(self) -> str:
        return serving_api(self.signature)[0]

    def _raise(self, err, what: str):
        from exportkit.serving.client.grpc_client import INFRA_CODES, as_exportkit_error

        where = f"{self.server['kind']} server at {self.server['address']}" if self.server else "server"
        refused = output_refusal(err.message, f"{what} on the {where}", self.api)
        if refused:
            raise refused from None
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
        from exportkit.serving.client.grpc_client import ServingError

        if self._client is None:
            raise RuntimeError("ServingRuntime.run() before load()")
        api = self.api
        try:
            if api == "Classify":
                got = self._client.classify(inputs[next(iter(inputs))], self.signature_name)
                return {k: got[k] for k in self.signature["outputs"] if k in got}
            if api == "Regress":
                values = self._client.regress(inputs[next(iter(inputs))], self.signature_name)
                return {"outputs": regress_shaped(values, self.signature, lambda: self._client.predict(
                    inputs, signature_name=self.signature_name))}
            return self._client.predict(inputs, signature_name=self.signature_name)
        except ServingError as err:
            self._raise(err, f"{api}(signature '{self.signature_name}')")

    def memory(self) -> dict:
        """What the server it launched holds now (ServerHandle.memory_now); {} for the worker's embedded server, whose
        memory is the session runtime's load (verify/memory.py), and for a remote one."""
        if self._handle is None or (self.worker is not None and self._handle.process is self.worker.process):
            return {}
        return self._handle.memory_now()

    def close(self) -> None:
        self.loaded = False
        self._closed = True
        if self._pending is not None:
            self._pending.stop()
            self._pending = None
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._handle is not None:
            self._handle.stop()
            self._handle = None
        worker, self.worker = self.worker, None
        if worker is not None:
            worker.detach()

    # -- what only a server shows -----------------------------------------------------------------------------
    def served_signatures(self) -> dict:
        """{signature name: {"inputs", "outputs"}} as the server reports them (GetModelMetadata)."""
        from exportkit.savedmodel.signature_defs import tensor_info_dict
        from exportkit.serving.client.grpc_client import ServingError

        try:
            served = self._client.metadata()
        except ServingError as err:
            self._raise(err, "GetModelMetadata")
        return {name: {"inputs": {k: tensor_info_dict(v) for k, v in sig.inputs.items()},
                       "outputs": {k: tensor_info_dict(v) for k, v in sig.outputs.items()}}
                for name, sig in served.items()}

    def replay_warmup(self, path: str) -> list[Finding]:
        """Send the warm-up records (file, or version dir's assets.extra file) through the server, each through its
        own API (Predict, Classify, Regress, MultiInference), as TF Serving replays them; findings for records that
        fail (error) and for a missing file (info: TF Serving treats it as optional).

        Model name/version are set to the served ones, as TF Serving ignores them during its own warm-up.
        """
        from exportkit.savedmodel.layout import WARMUP
        from exportkit.serving.client.grpc_client import ServingError
        from exportkit.serving.warmup import read_warmup_records

        try:
            requests = read_warmup_records(path)
        except FileNotFoundError:
            return [Finding("info", "serving-warmup",
                            f"no {WARMUP}: TF Serving loads the model without warm-up, so the first "
                            f"requests pay for its initialisation (optional; exportkit export writes one)")]
        except (ValueError, OSError) as err:
            return [Finding("error", "serving-warmup", f"warm-up file unreadable: {err}")]
        except Exception as err:  # noqa: BLE001 — tf.errors.DataLossError etc.: a corrupt TFRecord
            return [Finding("error", "serving-warmup", f"warm-up file unreadable: {type(err).__name__}: {err}")]
        findings = []
        for i, request in enumerate(requests):
            specs = [t.model_spec for t in request.tasks] if hasattr(request, "tasks") else [request.model_spec]
            for spec in specs:
                spec.name = self._handle.model_name
                if self._handle.model_version is not None:
                    spec.version.value = int(self._handle.model_version)
            try:
                self._client.call(request)
            except ServingError as err:
                findings.append(Finding("error", "serving-warmup", f"warm-up record {i} ({type(request).__name__}): "
                                                                   f"{err.code}: {err.message}"))
        return findings


# What TF Serving's Classify/Regress say about an output they cannot answer (classifier.cc, regressor.cc).
OUTPUT_REFUSALS = ("Expected output Tensor", "Expected Tensor shape", "Input batch size did not match output batch",
                   "Expected scores Tensor", "Expected classes Tensor", "Expected one output Tensor",
                   "Expected one or two output Tensors", "Tensor shapes for scores and classes",
                   "Expected classification signature outputs")


def output_refusal(message: str, what: str, api: str) -> CheckFailed | None:
    """The model's failure when Classify/Regress refused its output (INVALID_ARGUMENT, as for a bad request, but
    the output is at fault: not "the inputs were wrong"), else None."""
    text = " ".join(str(message or "").split())
    if not any(words in text for words in OUTPUT_REFUSALS):
        return None
    return CheckFailed(f"{what}: {api} refuses the model's output: {text}",
                       f"the model's fault, not the inputs': TF Serving's {api} answers only outputs of the shapes "
                       f"and dtypes its API defines; export the signature's outputs so, or call it with Predict")


def regress_shaped(values: np.ndarray, signature: dict, predict) -> np.ndarray:
    """Regress answers one float per Example, flat, whether the output tensor is [batch] or [batch, 1]
    (regressor.cc accepts both). Shaped as the tensor is: by the signature's rank, or, when the signature leaves
    the rank unknown, by `predict()` (Predict on the same signature, which returns the tensor as it is)."""
    shape = signature["outputs"].get("outputs", {}).get("shape")
    if shape is None:
        tensor = predict().get("outputs")
        return values.reshape(tensor.shape) if tensor is not None and tensor.size == values.size else values
    return values.reshape(-1, 1) if len(shape) == 2 else values


def _serve_in_worker(worker, model_name: str | None, rest: bool, device: str, launch=None):
    """The embedded server inside the TensorFlow worker: TF Serving's APIs over the session loader's graph and
    session, started (warm-up replayed first) when waited for, so `session` runs before the warm-up, as a fresh
    TF Serving load would answer them. `batching`: a BatchingParameters file, served with TF Serving's batching."""
    from exportkit.options.launch import batching_file
    from exportkit.version import __version__
    from exportkit.savedmodel.versions import resolve_model_path
    from exportkit.serving.launch.process import PendingServer, ServerHandle

    name = model_name or resolve_model_path(worker.path).default_name

    def finish() -> ServerHandle:
        flags = getattr(launch, "server_flags", None)
        reply = worker.request(op="serve", path=worker.path, model_name=name, rest=rest, device=device,
                               method_name_check=bool(flags and flags.enable_signature_method_name_check),
                               batching=batching_file(launch))
        if not reply.get("ok"):
            error = InfraError if reply.get("kind") == "infra" else CheckFailed
            raise error(f"embedded server: {reply.get('message', '')}",
                        reply.get("remedy") or "the message says why the model did not load")
        description = {"kind": "embedded", "version": f"exportkit {__version__} serve (TensorFlow {worker.tf_version})",
                       "address": reply["address"], "binary": None, "model_name": name,
                       "model_version": reply["version"], "process": "the worker of the session runtime, same load"}
        return ServerHandle(reply["address"], description, name, reply["version"], None, worker.process,
                            worker.log_tail, rest_address=reply.get("rest"))

    return PendingServer(finish)


class RestRuntime(Runtime):
    """The same server over TF Serving's REST API (JSON), on top of a ServingRuntime that launched it.

    Predict in the row format (`instances`, what most REST clients send), Classify/Regress with JSON Examples.
    Outputs come back through JSON, so whatever JSON loses (see verify's rest-json findings) shows here.
    """

    name = "rest"
    kind = "rest"

    def __init__(self, grpc_runtime: ServingRuntime, owns: bool = False):
        self.grpc = grpc_runtime
        self.owns = owns  # --serving-protocol rest: the gRPC runtime only launches the server
        self.device = grpc_runtime.device
        self.server: dict | None = None
        self._client = None

    def start(self) -> None:
        if self.owns:
            self.grpc.start()

    def use_signature(self, name: str, input_dtypes: dict[str, str]) -> None:
        super().use_signature(name, input_dtypes)
        self.grpc.use_signature(name, input_dtypes)
        if self.server is not None:
            self.server = dict(self.server, api=self.grpc.api)

    def refusal(self) -> str | None:
        from exportkit.runtimes.verdicts import rest_refusal

        return rest_refusal(self.grpc.signature)

    def load(self) -> None:
        from exportkit.serving.client.rest_client import RestClient

        self.grpc.load()
        handle = self.grpc._handle
        if handle.rest_address is None:
            raise CheckFailed(f"the {self.grpc.server['kind']} server at {handle.address} serves no REST API",
                              "pass --serving-protocol grpc for a server without REST")
        self.server = dict(self.grpc.server, address=handle.rest_address, protocol="REST")
        self._client = RestClient(handle.rest_address, handle.model_name, handle.model_version,
                                  self.grpc.signature_name, timeout=self.grpc.timeout)
        self.loaded = True

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from exportkit.serving.client.grpc_client import ServingError

        api, signature, name = self.grpc.api, self.grpc.signature, self.grpc.signature_name
        try:
            if api == "Classify":
                got = self._client.classify(inputs[next(iter(inputs))], name)
                return {k: got[k] for k in signature["outputs"] if k in got}
            dtypes = {k: v["dtype"] for k, v in signature["outputs"].items()}
            input_dtypes = {k: v["dtype"] for k, v in signature["inputs"].items()}
            if api == "Regress":
                values = self._client.regress(inputs[next(iter(inputs))], name)
                return {"outputs": regress_shaped(values, signature, lambda: self._client.predict(
                    inputs, dtypes, name, input_dtypes))}
            return self._client.predict(inputs, dtypes, name, input_dtypes)
        except ServingError as err:
            if err.code == "UNAVAILABLE":
                raise InfraError(f"REST {api.lower()} at {self.server['address']} failed: {err.message}") from None
            refused = output_refusal(err.message, f"REST :{api.lower()} (signature '{name}') at "
                                                  f"{self.server['address']}", api)
            if refused:
                raise refused from None
            raise CheckFailed(f"REST :{api.lower()} (signature '{self.grpc.signature_name}') at "
                              f"{self.server['address']} failed: {err.code}: {err.message}") from None

    def close(self) -> None:
        self.loaded = False
        self._client = None
        if self.owns:
            self.grpc.close()
