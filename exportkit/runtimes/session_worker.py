"""The TensorFlow worker process: the SavedModel loaded the ways TF Serving and TF2 users load it, and the embedded
server on top of the TF1 load, in one process with no user code importable.

Started as `python -I -m exportkit.runtimes.session_worker` from a neutral working directory, so neither the
caller's cwd nor PYTHONPATH is on sys.path. It imports TensorFlow at once (so the import overlaps with the
caller's work), says {"ok": true, "ready": true, "tf": VERSION}, then answers one JSON request per line on stdin,
each in a thread of its own (the caller orders what must be ordered by waiting for the reply: `session`'s runs
before the server's warm-up, say). Every reply carries the request's "id" (when it had one):

    {"op": "load", "loader": "session"|"saved_model", "path": DIR, "signature": NAME, "device": "cpu"}
        -> {"ok": true}; loads run in threads, so both loaders load at the same time (replies come when done)
    {"op": "run", "loader": ..., "dir": DIR, "inputs": PREFIX, "outputs": PREFIX, "signature": NAME,
     "input_dtypes": {...}}                          -> {"ok": true, "placed_on": "cpu:0"|null}
    {"op": "unload", "loader": ...}                   -> {"ok": true}; the loader's model and variables dropped
    {"op": "memory", "loader": "session"}             -> {"ok": true, "memory": {...}}: what its load costs this
        process (exportkit.tfversions.worker.MemoryMeter; loads go one at a time so each is measured alone), with
        "previous": the RSS a load of loader "previous" (the version served before, for the swap) added after it
    {"op": "serve", "model_name": NAME, "rest": bool} -> {"ok": true, "address": ..., "rest": ..., "version": N}
        TF Serving's gRPC (and REST) API over the session loader's graph and session, after replaying the warm-up
        records as TF Serving does before AVAILABLE. So `session` answers by a direct Session.run on the state
        before warm-up, and the server through its request handling: one load, two different paths.
    failures -> {"ok": false, "kind": "model"|"infra", "message": ..., "remedy": ...}; a module this Python lacks
        -> {"ok": false, "kind": "infra", "missing_module": NAME} (also on the ready line, then the worker exits)

"loader" defaults to "session" (the protocol of exportkit/tfversions/worker.py for other TensorFlow versions).
"""
from __future__ import annotations

import json
import os
import sys
import threading
import traceback
from concurrent.futures import Future

from exportkit.tfversions.worker import MemoryMeter


class Worker:
    def __init__(self, channel):
        self.channel = channel
        self.lock = threading.Lock()
        self.loads: dict[str, Future] = {}  # loader -> its loaded model (Tf1SavedModel | SavedModelRuntime)
        self.signature: dict[str, str] = {}  # loader -> the signature it answers unless told otherwise
        self.servers = []
        self.meter = MemoryMeter()
        self.ran: set[tuple[str, str]] = set()  # (loader, signature) that have run once

    def reply(self, request: dict, **payload) -> None:
        if "id" in request:
            payload["id"] = request["id"]
        with self.lock:
            self.channel.write(json.dumps(payload) + "\n")
            self.channel.flush()

    def fail(self, request: dict, err: BaseException) -> None:
        from exportkit.errors import ExportkitError, InfraError

        if isinstance(err, ModuleNotFoundError) and err.name:  # e.g. the server's h11: this Python's fault
            self.reply(request, ok=False, kind="infra", missing_module=err.name, message=f"no module {err.name!r}")
        elif isinstance(err, ExportkitError):
            self.reply(request, ok=False, kind="infra" if isinstance(err, InfraError) else "model",
                       message=err.message, remedy=err.remedy)
        else:
            from exportkit.savedmodel.loader import failure_message

            self.reply(request, ok=False, kind="model", message=failure_message(err), detail=traceback.format_exc()[-4000:])

    # -- ops ------------------------------------------------------------------------------------------------------
    def load(self, request: dict) -> None:
        loader = request.get("loader", "session")
        future = self._start_load(loader, request)

        def done(f: Future) -> None:
            err = f.exception()
            if err is not None:
                self.fail(request, err)
                return
            try:
                if loader != "previous":  # the version served before: loaded for its memory only
                    self._check_signature(loader, request["signature"])
                self.reply(request, ok=True)
            except Exception as e:  # noqa: BLE001
                self.fail(request, e)

        future.add_done_callback(done)

    def _start_load(self, loader: str, request: dict) -> Future:
        with self.lock:
            if loader in self.loads:
                return self.loads[loader]
            future: Future = Future()
            self.loads[loader] = future
            self.signature[loader] = request["signature"]

        def work() -> None:
            try:
                future.set_result(self.meter.load(loader, lambda: _load(loader, request), reset_peak=loader == "session"))
            except BaseException as err:  # noqa: BLE001 — reported to whoever waits for this load
                future.set_exception(err)

        threading.Thread(target=work, daemon=True, name=f"load-{loader}").start()
        return future

    def _check_signature(self, loader: str, name: str) -> None:
        from exportkit.errors import CheckFailed
        from exportkit.savedmodel.signature_defs import signature_names

        model = self.loads[loader].result()
        if loader == "saved_model":
            model.use_signature(name, {})
        elif name not in model.signatures:
            raise CheckFailed(f"no signature {name!r} (available: {', '.join(signature_names(model.signatures)) or 'none'})",
                              "pass --signature with one of them")

    def run(self, request: dict) -> None:
        from exportkit.inputs.npz import load_batches, save_batches

        loader = request.get("loader", "session")
        name = request.get("signature") or self.signature[loader]
        model = self.loads[loader].result()
        self._check_signature(loader, name)
        batches = load_batches(request["dir"], request["inputs"])

        def answer() -> list:
            if loader == "saved_model":
                model.use_signature(name, request.get("input_dtypes") or {})
                return [model.run(batch) for batch in batches]
            return [model.run(name, batch) for batch in batches]

        with self.lock:
            first, _ = (loader, name) not in self.ran, self.ran.add((loader, name))
        # a signature's first run builds what it keeps (executors, the TF2 function's instantiation): it counts to its
        # loader, measured one at a time like the loads; the later runs go on side by side
        outputs = self.meter.load(loader, answer) if first else answer()
        self.meter.sample()
        save_batches(request["dir"], outputs, request["outputs"])
        self.reply(request, ok=True, placed_on=model.placed_on if loader == "saved_model" else None)

    def unload(self, request: dict) -> None:
        """Drop a loader's model, its variables with it (one load at a time for large models: see
        verify.execute.ONE_LOAD_AT_A_TIME_BYTES); a later load of that loader loads again."""
        import gc

        with self.lock:
            future = self.loads.pop(request["loader"], None)

        def drop() -> None:
            nonlocal future
            if future is not None and future.done() and future.exception() is None:
                future.result().close()
            future = None
            gc.collect()  # tf.saved_model.load's object graph has cycles: free its variables now, not some time later

        self.meter.release(request["loader"], drop)
        with self.lock:
            self.ran = {(loader, name) for loader, name in self.ran if loader != request["loader"]}
        self.reply(request, ok=True)

    def memory(self, request: dict) -> None:
        """The figures of a loader's load (MemoryMeter.figures), the previous version's growth, and on a GPU TF's own
        statistics of GPU:0 (its allocator's current and peak bytes)."""
        figures = self.meter.figures(request.get("loader", "session"))
        if "previous" in self.meter.loads:
            figures["previous_loaded_bytes"] = self.meter.loads["previous"]["grown"]
        if request.get("device") == "gpu":
            import tensorflow as tf

            info = tf.config.experimental.get_memory_info("GPU:0")
            figures["gpu"] = {"current_bytes": info["current"], "peak_bytes": info["peak"]}
        self.reply(request, ok=True, memory=figures)

    def serve(self, request: dict) -> None:
        """TF Serving's APIs over the session loader's model: warm-up first, as TF Serving does before AVAILABLE.
        The server's own code and sockets are measured apart ("server"): they are not the model's memory."""
        from exportkit.errors import CheckFailed
        from exportkit.savedmodel.versions import resolve_model_path

        model = self._start_load("session", dict(request, signature=request.get("signature", ""))).result()

        def server_code():
            from exportkit.serving.server import grpc_service, servable, server_core

            if request.get("rest"):
                from exportkit.serving.server import http_handler  # noqa: F401
            return grpc_service.start_grpc, servable.ServedModel, server_core.ServerCore

        start_grpc, ServedModel, ServerCore = self.meter.load("server", server_code)
        location = resolve_model_path(request["path"])
        batching = None
        if request.get("batching"):  # --batching-parameters: TF Serving's batching session over the same load
            from exportkit.serving.server.config import read_batching_parameters

            batching = read_batching_parameters(request["batching"])
        served = ServedModel(location, request["model_name"], request.get("device") or "cpu",
                             method_name_check=bool(request.get("method_name_check")), batching=batching)
        served.load(model)
        if served.state != "AVAILABLE":
            raise CheckFailed(f"model '{served.name}' version {served.version} failed to load: {served.error[1]}",
                              "the warm-up record or the model is at fault; `exportkit inspect` shows both")
        core = ServerCore([served])
        server, port = self.meter.load("server", lambda: start_grpc(core, 0))
        self.servers.append(server)
        reply = {"address": f"127.0.0.1:{port}", "version": served.version}
        if request.get("rest"):
            from exportkit.serving.server.http_handler import start_rest

            rest, rest_port = self.meter.load("server", lambda: start_rest(core, 0))
            self.servers.append(rest)
            reply["rest"] = f"127.0.0.1:{rest_port}"
        self.reply(request, ok=True, **reply)


def _load(loader: str, request: dict):
    from exportkit.errors import CheckFailed
    from exportkit.tfenv import import_tf

    tf = import_tf()
    if request.get("device") == "gpu":
        from exportkit.tfenv import gpu_memory_growth

        gpu_memory_growth()  # the in-process Keras run (and a server) use the same GPU
    from exportkit.tfversions.oplibs import load_for_worker

    load_for_worker(request["path"])  # TF Text / TF-DF ops, as the stock server links them; --op-library
    # TensorFloat-32 would make GPU float32 results differ from CPU by ~1e-3: off unless allowed.
    tf.config.experimental.enable_tensor_float_32_execution(bool(request.get("allow_tf32")))
    if loader == "saved_model":
        from exportkit.runtimes.factory import RuntimeSpec, build

        runtime = build(RuntimeSpec("saved_model", request["path"], request["signature"], device=request.get("device")))
        runtime.load_model()
        return runtime
    if loader in ("session", "previous"):
        from exportkit.savedmodel.loader import Tf1SavedModel

        return Tf1SavedModel(request["path"], device=request.get("device"))
    raise CheckFailed(f"unknown loader {loader!r}", "this is a bug in exportkit")


def prepare():
    """What a worker does before its ready line; the fork server (exportkit.runtimes.forkserver) does it once for
    all the workers it forks."""
    from exportkit.tfversions.worker import NOT_FOR_LOADING
    from exportkit.tfenv import import_tf

    sys.modules.update(dict.fromkeys(NOT_FOR_LOADING))  # this process loads SavedModels only: see NOT_FOR_LOADING
    return import_tf()


def main() -> int:
    # Keep our protocol channel clean: anything TF prints goes to stderr.
    channel = sys.stdout
    sys.stdout = sys.stderr
    worker = Worker(channel)
    try:
        tf = prepare()
    except ModuleNotFoundError as err:  # said on the ready line: the caller makes it exit 3 with the pip command
        worker.reply({}, ok=False, ready=True, kind="infra", missing_module=err.name or "tensorflow",
                     message=f"no module {err.name!r}")
        return 1
    worker.reply({}, ok=True, ready=True, tf=tf.__version__)
    ops = {"load": worker.load, "run": worker.run, "serve": worker.serve, "unload": worker.unload,
           "memory": worker.memory}

    def answer(request: dict) -> None:
        try:
            ops[request["op"]](request)
        except Exception as err:  # the model's failure: report it, stay alive for the caller to close
            worker.fail(request, err)

    for line in sys.stdin:  # each request in a thread: one loader's runs need not wait for the other's
        request = json.loads(line)
        threading.Thread(target=answer, args=(request,), daemon=True, name=f"{request['op']}-{request.get('id')}").start()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    os._exit(code)  # stdin closed: the caller is done; TensorFlow's teardown would only make it wait
