"""The one place runtimes are constructed: a RuntimeSpec (a plain, picklable description) -> a Runtime.

    runtime = build(RuntimeSpec("session", path, signature="serving_default"))     # a worker of its own
    pool = Shared(path, allow_tf32=False)                                          # verify: one worker per device,
    runtimes = [build(spec, pool) for spec in specs]                               # one server for serving + rest

Without a `Shared` pool every runtime stands alone (Beam workers, diff, export's self-check, compat's servers):
`session` in a TensorFlow worker of its own, `saved_model` in this process, a server launched for itself. With one
(verify), `saved_model`, `session` and the embedded server share one TfWorker per device (one TensorFlow import,
one TF1 load for the session and the server: what keeps verify's memory near `saved_model_cli run`'s), and
`serving` and `rest` share one ServingRuntime.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from exportkit.errors import UsageError
from exportkit.runtimes import RUNTIME_NAMES, Runtime
from exportkit.signature_constants import DEFAULT_SIGNATURE

BROKEN_PYTHON = "check that exportkit is installed in this Python environment"


@dataclass
class ServerSpec:
    """How the `serving` runtime finds its server: `mode` auto | binary | embedded | docker[:TAG] | HOST:PORT;
    `launch`: serving's LaunchOptions (container CLI, --pull, batching parameters, server flags) or None."""

    mode: str = "auto"
    model_name: str | None = None
    model_version: int | None = None
    binary: str | None = None
    load_timeout: float = 120.0
    launch: object = None
    rest: bool = False  # the server also serves REST (a `rest` runtime rides on it)
    owned_by_rest: bool = False  # --serving-protocol rest: the `rest` runtime starts and closes the server


@dataclass
class RuntimeSpec:
    """A runtime to build (here or on a Beam worker): `name` is one of RUNTIME_NAMES, `path` the version dir."""

    name: str
    path: str | None = None
    signature: str = DEFAULT_SIGNATURE
    device: str | None = "cpu"
    input_dtypes: dict = field(default_factory=dict)  # the signature's inputs ({key: dtype}): tf.saved_model.load's
    label: str = ""  # the row it answers for (default: its name)
    allow_tf32: bool = False
    preload: bool = False  # a worker's load is sent at start() (the SavedModel exists by then)
    in_process: bool = False  # saved_model in this process although a Shared pool is given (Keras imports TF here)
    server: ServerSpec | None = None  # serving, rest
    signatures: dict | None = None  # {name: savedmodel.signatures_of's form}: which API a server is asked through
    python: str | None = None  # session on a managed TF X.Y: its interpreter and standalone worker script
    worker: str | None = None
    broken_remedy: str = BROKEN_PYTHON  # the fix when that worker's Python is broken
    source_options: object = None  # keras: the training source (--against)
    output_dtypes: dict = field(default_factory=dict)  # keras: outputs cast to the signature's dtypes
    output_names: list | None = None  # keras: the manifest's --output-names
    recorded: tuple | None = None  # golden, trained: (inputs, outputs) batches
    parse_examples: str | None = None  # the Example input a tensor-taking model parses itself (keras on --data)
    top1: dict | None = None  # derived top-1 outputs (wrappers.top1_sources) added to its answers (diff)

    def __post_init__(self):
        if self.name not in RUNTIME_NAMES:
            raise UsageError(f"unknown runtime {self.name!r}", f"use one of {', '.join(RUNTIME_NAMES)}")
        self.label = self.label or self.name


class Shared:
    """verify's shared processes: one TensorFlow worker per device (made when a runtime needs it) and the one
    ServingRuntime that `serving` and `rest` share."""

    def __init__(self, path: str, allow_tf32: bool = False):
        self.path, self.allow_tf32 = path, allow_tf32
        self.workers: dict = {}
        self.server = None

    def worker(self, device: str | None):
        from exportkit.runtimes.session import TfWorker

        if device not in self.workers:
            self.workers[device] = TfWorker.for_model(self.path, device, self.allow_tf32)
        return self.workers[device]


def build(spec: RuntimeSpec, shared: Shared | None = None) -> Runtime:
    """The runtime `spec` describes, not started; wrapped as `parse_examples` and `top1` ask."""
    runtime = _build(spec, shared)
    if spec.top1:
        from exportkit.runtimes.wrappers import Top1Outputs

        runtime = Top1Outputs(runtime, spec.top1)
    if spec.parse_examples:
        from exportkit.runtimes.wrappers import ExampleParsing

        runtime = ExampleParsing(runtime, spec.parse_examples)
    return runtime


def _build(spec: RuntimeSpec, shared: Shared | None) -> Runtime:
    if spec.name in ("golden", "trained"):
        from exportkit.runtimes.local import GoldenRuntime

        inputs, outputs = spec.recorded or ([], [])
        runtime = GoldenRuntime(inputs, outputs, name=spec.name)
        if spec.name == "trained":
            runtime.signature_name = spec.signature
        return runtime
    if spec.name == "keras":
        from exportkit.runtimes.local import KerasRuntime

        return KerasRuntime(spec.source_options, spec.output_dtypes, device=spec.device, output_names=spec.output_names)
    if spec.name == "saved_model" and (shared is None or spec.in_process):
        from exportkit.runtimes.local import SavedModelRuntime

        return SavedModelRuntime(spec.path, spec.signature, spec.input_dtypes, device=spec.device)
    if spec.name in ("saved_model", "session"):
        return _worker_runtime(spec, shared)
    return _server_runtime(spec, shared)


def _worker_runtime(spec: RuntimeSpec, shared: Shared | None) -> Runtime:
    """`session` (or `saved_model`) in the shared worker of its device, else in a worker of its own (a managed
    TF X.Y environment's when `python` is given)."""
    from exportkit.runtimes.session import SessionRuntime, WorkerRuntime

    if shared is None or spec.python:
        return SessionRuntime(spec.path, spec.signature, device=spec.device, allow_tf32=spec.allow_tf32,
                              python=spec.python, worker=spec.worker, broken_remedy=spec.broken_remedy)
    return WorkerRuntime(shared.worker(spec.device), spec.name, spec.signature, preload=spec.preload,
                         input_dtypes=spec.input_dtypes if spec.name == "saved_model" else None)


def _server_runtime(spec: RuntimeSpec, shared: Shared | None) -> Runtime:
    """`serving` (the server, shared with `rest` in a pool), or `rest` on top of it."""
    from exportkit.runtimes.serving import RestRuntime, ServingRuntime

    server = shared.server if shared is not None else None
    if server is None:
        s = spec.server or ServerSpec()
        server = ServingRuntime(spec.path, mode=s.mode, signature_name=spec.signature, model_name=s.model_name,
                                model_version=s.model_version, binary=s.binary, load_timeout=s.load_timeout,
                                device=spec.device, signatures=spec.signatures, rest=s.rest,
                                worker=shared.worker(spec.device) if shared is not None else None,
                                launch=s.launch)
        if shared is not None:
            shared.server = server
    if spec.name == "serving":
        return server
    return RestRuntime(server, owns=bool(spec.server and spec.server.owned_by_rest))
