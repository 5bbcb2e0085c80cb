"""`exportkit serve` (model_servers/server.cc): TF Serving's gRPC and REST APIs over the TF1-style loader.

For machines without the `tensorflow_model_server` binary. It loads the SavedModel the way TF Serving does
(MetaGraph + Session, no user Python imported), replays the warm-up records before reporting AVAILABLE, and
answers with TF Serving's status codes, so a client or a check that passes here behaves the same against the
real server. It is a stand-in, not TF Serving: reports must say which server answered.

Two spellings of one command. `exportkit serve PATH [--port N] [--rest-port N] [--model-name M]` serves exactly
that version; `tensorflow_model_server`'s flags (`--model_base_path`, `--model_config_file`, ... see FLAGS) serve
what the config says, polling the config file and the file system if asked. Both do what server.cc does: load
every model (retrying a failed load `--max_num_load_retries` times; none for PATH, whose version is complete), then
open the ports, then print exactly one line (`ADDRESS_LINE`) on stdout; a stdout nobody reads any more does not
end the server. A load failure logs the error and exits 1. SIGINT/SIGTERM (or, when EXPORTKIT_SERVE_WATCH_STDIN=1,
EOF on stdin: the launcher died) stop the server with exit 0.
"""
from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import threading
from dataclasses import dataclass

from exportkit import storage
from exportkit.errors import CheckFailed, UsageError
from exportkit.savedmodel.versions import resolve_model_path
from exportkit.options.server_flags import check_fraction
from exportkit.serving.server.config import (SPECIFIC, ModelConfig, model_configs, read_batching_parameters,
                                      read_model_server_config, read_monitoring_config)
from exportkit.serving.server.grpc_service import channel_arguments, start_grpc
from exportkit.serving.server.server_core import NO_RETRIES, LoadRetries, ServerCore
from exportkit.serving.server.status import RpcError
from exportkit.tfenv import quiet_env

ADDRESS_LINE = "exportkit serve: model '{name}' version {version} AVAILABLE at {address}"
REST_SUFFIX = " rest {rest_address}"
ADDRESS_RE = re.compile(r"^exportkit serve: model '(?P<name>.*)' version (?P<version>\d+) AVAILABLE at (?P<address>\S+)"
                        r"(?: rest (?P<rest>\S+))?\s*$")
WATCH_STDIN_ENV = "EXPORTKIT_SERVE_WATCH_STDIN"

log = logging.getLogger("exportkit.serve")


def _setup_logging() -> None:
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("exportkit serve: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def _watch_stdin(stop: threading.Event) -> None:
    """The launcher keeps our stdin open; EOF means it is gone, so do not outlive it."""
    try:
        while os.read(0, 4096):  # raw fd: a daemon thread blocked in a buffered read aborts the exit
            pass
    except (OSError, ValueError):
        pass
    log.info("stdin closed (launcher gone): stopping")
    stop.set()


@dataclass
class ServerOptions:
    """What the flags ask for (tensorflow_serving/model_servers/main.cc spellings; `path` = exportkit's form)."""

    path: str | None = None
    port: int = 8500
    rest_api_port: int = 0
    model_name: str | None = None
    model_base_path: str | None = None
    model_config_file: str | None = None
    model_config_file_poll_wait_seconds: int = 0
    file_system_poll_wait_seconds: int = 1
    grpc_socket_path: str | None = None
    monitoring_config_file: str | None = None
    enable_batching: bool = False
    batching_parameters_file: str | None = None
    rest_api_timeout_in_ms: int = 30000
    max_num_load_retries: int | None = None  # None: TF Serving's 5 with its flags, 0 for exportkit's PATH
    load_retry_interval_micros: int = LoadRetries.load_retry_interval_micros
    grpc_channel_arguments: str = ""
    tensorflow_intra_op_parallelism: int = 0
    tensorflow_inter_op_parallelism: int = 0
    enable_signature_method_name_check: bool = False
    xla_cpu_compilation_enabled: bool = False  # off: DisableXlaCompilation(), as main.cc does
    xla_gpu_compilation_enabled: bool = False
    per_process_gpu_memory_fraction: float = 0.0  # server.cc: the session config's GPUOptions
    device: str = "cpu"
    debug: bool = False


def _bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one clear message instead of argparse's usage dump and exit 2
        raise UsageError(f"exportkit serve: {message}",
                         "run `exportkit serve --help` for the flags (TF Serving's tensorflow_model_server spellings "
                         "or PATH --port --rest-port --model-name --device)")


def parse_flags(argv: list[str]) -> ServerOptions:
    """Both spellings: `--model_base_path=/m` and `--model_base_path /m`; bools as `--enable_batching[=true]`."""
    p = _Parser(prog="exportkit serve", allow_abbrev=False,
                description="Serve SavedModels over TF Serving's gRPC and REST APIs on 127.0.0.1 "
                            "(a stand-in for tensorflow_model_server, same flags).")
    p.add_argument("path", nargs="?", metavar="PATH",
                   help="exportkit's form: a model base directory (highest version) or a version directory")
    p.add_argument("--port", type=int, default=8500, help="gRPC port (0 picks a free one)")
    p.add_argument("--rest_api_port", "--rest-port", dest="rest_api_port", type=int, default=0,
                   help="REST port (0 = no REST API)")
    p.add_argument("--model_name", "--model-name", dest="model_name",
                   help="model name (TF Serving's default: 'default'; PATH form: the base directory's name)")
    p.add_argument("--model_base_path", help="the model's base directory (integer-named version subdirectories)")
    p.add_argument("--model_config_file", help="a ModelServerConfig text proto: several models, policies, labels")
    p.add_argument("--model_config_file_poll_wait_seconds", type=int, default=0,
                   help="re-read --model_config_file every N seconds (0 = never)")
    p.add_argument("--file_system_poll_wait_seconds", type=int, default=1,
                   help="look for new/removed versions every N seconds (0 = only at start)")
    p.add_argument("--grpc_socket_path", help="also serve gRPC on this Unix socket")
    p.add_argument("--monitoring_config_file", help="a MonitoringConfig text proto (Prometheus on the REST port)")
    p.add_argument("--enable_batching", type=_bool, nargs="?", const=True, default=False,
                   help="merge concurrent requests into one Session.run")
    p.add_argument("--batching_parameters_file", help="a BatchingParameters text proto")
    p.add_argument("--rest_api_timeout_in_ms", type=int, default=30000,
                   help="each REST request's Session.run timeout (DEADLINE_EXCEEDED, HTTP 504); 0 = none")
    p.add_argument("--max_num_load_retries", type=int, default=None,
                   help="retries of a failed version load (TF Serving's default 5; PATH form: 0)")
    p.add_argument("--load_retry_interval_micros", type=int, default=LoadRetries.load_retry_interval_micros,
                   help="wait between load retries (default one minute; negative = no wait)")
    p.add_argument("--grpc_channel_arguments", default="", help="k=v,k2=v2 gRPC server arguments")
    p.add_argument("--tensorflow_intra_op_parallelism", type=int, default=0, help="threads per op (0 = TF's choice)")
    p.add_argument("--tensorflow_inter_op_parallelism", type=int, default=0, help="ops at once (0 = TF's choice)")
    p.add_argument("--enable_signature_method_name_check", type=_bool, nargs="?", const=True, default=False,
                   help="Classify/Regress/Predict check the signature's method_name (TF Serving's default: off)")
    p.add_argument("--xla_cpu_compilation_enabled", type=_bool, nargs="?", const=True, default=False,
                   help="compile with XLA what must be (jit_compile=True functions, a JAX export's XlaCallModule; "
                        "TF Serving's default: off, and their requests fail with 'XLA compilation disabled')")
    p.add_argument("--xla_gpu_compilation_enabled", type=_bool, nargs="?", const=True, default=False,
                   help="XLA on CPU and GPU (TF Serving's default: off)")
    p.add_argument("--per_process_gpu_memory_fraction", type=float, default=0.0,
                   help="share of each GPU's memory the server takes at start (0.0: TensorFlow's choice)")
    p.add_argument("--prefer_tflite_model", type=_bool, nargs="?", const=True, default=False,
                   help="not supported: exportkit serve serves SavedModels only")
    p.add_argument("--device", default="cpu", help="cpu | gpu")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    ns = p.parse_args(argv)
    if ns.prefer_tflite_model:
        raise UsageError("--prefer_tflite_model is not supported: exportkit serve serves SavedModels, not TFLite",
                         "serve the SavedModel, or use TF Serving itself for TFLite models")
    options = ServerOptions(**{k: v for k, v in vars(ns).items() if k != "prefer_tflite_model"})
    sources = [name for name, value in (("PATH", options.path), ("--model_base_path", options.model_base_path),
                                        ("--model_config_file", options.model_config_file)) if value]
    if len(sources) != 1:
        raise UsageError(f"exportkit serve needs exactly one of PATH, --model_base_path, --model_config_file "
                         f"(got {', '.join(sources) or 'none'})",
                         "pass PATH, or --model_name=NAME --model_base_path=DIR, or --model_config_file=FILE")
    if options.device not in ("cpu", "gpu"):
        raise UsageError(f"--device must be cpu or gpu, got {options.device!r}", "pass --device cpu or --device gpu")
    for flag, value in (("--port", options.port), ("--rest_api_port", options.rest_api_port)):
        if not 0 <= value <= 65535:
            raise UsageError(f"{flag} must be 0..65535, got {value}", f"pass {flag} 8500, or 0 for a free one")
    check_fraction(options.per_process_gpu_memory_fraction)
    if options.batching_parameters_file and not options.enable_batching:
        raise UsageError("--batching_parameters_file needs --enable_batching", "add --enable_batching")
    return options


def initial_configs(options: ServerOptions) -> list[ModelConfig]:
    """BuildSingleModelConfig, the config file, or exportkit's PATH (exactly the version it resolves to)."""
    if options.model_config_file:
        return model_configs(read_model_server_config(options.model_config_file))
    if options.model_base_path:
        base = options.model_base_path
        return [ModelConfig(options.model_name or "default", base if storage.is_url(base) else os.path.abspath(base))]
    location = resolve_model_path(options.path)
    name = options.model_name or location.default_name
    return [ModelConfig(name, location.base_dir or location.version_dir, SPECIFIC, specific=(location.version,),
                        fixed_dirs={location.version: location.version_dir})]


def _session_config(options: ServerOptions):
    gpu_fraction = options.per_process_gpu_memory_fraction if options.device == "gpu" else 0.0
    if not (options.tensorflow_intra_op_parallelism or options.tensorflow_inter_op_parallelism or gpu_fraction):
        return None
    from exportkit.tfenv import import_tf

    tf = import_tf()
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=options.tensorflow_intra_op_parallelism,
                                      inter_op_parallelism_threads=options.tensorflow_inter_op_parallelism)
    if gpu_fraction:
        config.gpu_options.per_process_gpu_memory_fraction = gpu_fraction  # server.cc sets it on every session
    if options.device == "cpu":
        config.device_count["GPU"] = 0
    return config


def _xla_as_tf_serving(options: ServerOptions) -> None:
    """main.cc: `if (!xla_cpu_compilation_enabled && !xla_gpu_compilation_enabled) DisableXlaCompilation();`"""
    if options.xla_cpu_compilation_enabled or options.xla_gpu_compilation_enabled:
        return
    from exportkit.tfenv import disable_xla_compilation

    if not disable_xla_compilation():
        log.warning("this TensorFlow build does not export DisableXlaCompilation: what needs XLA compiles "
                    "here, where the stock tensorflow_model_server refuses it")


def _metrics(options: ServerOptions):
    if not options.monitoring_config_file:
        return None
    prometheus = read_monitoring_config(options.monitoring_config_file).prometheus_config
    if not prometheus.enable:
        return None
    from exportkit.serving.server.monitoring import Metrics

    return Metrics(prometheus.path or "/monitoring/prometheus/metrics")


def _retries(options: ServerOptions) -> LoadRetries:
    if options.max_num_load_retries is None and options.path is not None:
        return NO_RETRIES
    default = LoadRetries.max_num_load_retries
    return LoadRetries(default if options.max_num_load_retries is None else options.max_num_load_retries,
                       options.load_retry_interval_micros)


def _poll(stop: threading.Event, seconds: int, action, what: str) -> None:
    while not stop.wait(seconds):
        try:
            action()
        except Exception as err:  # noqa: BLE001 — a bad poll is logged, the server keeps serving what it has
            log.error("%s failed: %s", what, getattr(err, "message", err))


def _reload_config_file(core: ServerCore, path: str) -> None:
    """Server::PollFilesystemAndReloadConfig: a file that does not parse keeps the current config."""
    core.reload_config(model_configs(read_model_server_config(path)))


def serve_main(argv: list[str]) -> int:
    """`exportkit serve ARGS...` with either spelling: a process that loads SavedModels only."""
    from exportkit.tfversions.worker import NOT_FOR_LOADING

    if "tensorflow" not in sys.modules:
        sys.modules.update(dict.fromkeys(NOT_FOR_LOADING))
    return serve(parse_flags(argv))


def serve(options: ServerOptions) -> int:
    """Serve until SIGINT/SIGTERM (exit 0). Load failure: log it, exit 1 (CheckFailed). Bind failure: exit 3."""
    _setup_logging()
    quiet_env()
    if options.device == "cpu" and "tensorflow" not in sys.modules:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # no GPU memory grabbed by a CPU server
    configs = initial_configs(options)
    grpc_options = channel_arguments(options.grpc_channel_arguments)
    batching = read_batching_parameters(options.batching_parameters_file) if options.enable_batching else None
    metrics = _metrics(options)
    exportkit_form = options.path is not None
    core = ServerCore(device=options.device, session_config=_session_config(options), batching=batching,
                      metrics=metrics, method_name_check=options.enable_signature_method_name_check,
                      retries=_retries(options))
    core.plan(configs)

    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    servers: list = []
    load_error: list[RpcError] = []

    def load() -> None:
        try:
            _xla_as_tf_serving(options)
            core.load_pending()
        except RpcError as err:
            load_error.append(err)

    loader = threading.Thread(target=load, daemon=True, name="load")
    try:
        if os.environ.get(WATCH_STDIN_ENV) == "1":
            threading.Thread(target=_watch_stdin, args=(stop,), daemon=True, name="stdin-watch").start()
        log.info("loading %s", ", ".join(core.model_names()))
        loader.start()
        while loader.is_alive():
            if stop.wait(0.05):
                log.info("stopping")
                return 0
        _raise_load_failure(core, load_error)
        # server.cc BuildAndStart: the ports open once ServerCore::Create has loaded the initial models, so a
        # client sees a refused connection (gRPC UNAVAILABLE) until then, never a half-loaded server.
        line = _start_servers(core, options, grpc_options, metrics, servers)
        if not exportkit_form:
            if options.file_system_poll_wait_seconds > 0:
                threading.Thread(target=_poll, args=(stop, options.file_system_poll_wait_seconds,
                                                     core.poll_file_system, "file system poll"),
                                 daemon=True, name="fs-poll").start()
            if options.model_config_file and options.model_config_file_poll_wait_seconds > 0:
                threading.Thread(target=_poll, args=(stop, options.model_config_file_poll_wait_seconds,
                                                     lambda: _reload_config_file(core, options.model_config_file),
                                                     "model config reload"),
                                 daemon=True, name="config-poll").start()
        _announce(_address_line(core, line))
        stop.wait()
        log.info("stopping")
        return 0
    finally:
        core.stop_retries()  # a load waiting to retry gives up
        for server in reversed(servers):
            if hasattr(server, "server_close"):
                server.shutdown()
                server.server_close()
            else:
                server.stop(grace=2).wait(5)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if loader.is_alive():
            # Stopped mid-load: TF's C++ load cannot be interrupted, and tearing down the interpreter under it may
            # crash. Leave now; the exit code is still 0 for a requested stop.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0 if stop.is_set() else 1)
        core.close()


def _announce(line: str) -> None:
    """The readiness line on stdout. A reader that has gone (EPIPE: `| head -1`, a launcher that read it and
    closed) or a full device must not end the server: it is logged, later output goes to /dev/null."""
    try:
        print(line, flush=True)
    except Exception as err:  # noqa: BLE001 — OSError, or the CLI's OutputFault around it
        log.warning("cannot write the readiness line to stdout (%s); serving on", getattr(err, "err", err))
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
            sys.stdout.flush()  # what stayed in the buffer goes to /dev/null now, not to a later flush's error
        except Exception:  # noqa: BLE001
            pass


def _raise_load_failure(core: ServerCore, load_error: list) -> None:
    failed = core.failures()
    if failed:
        first = failed[0]
        raise CheckFailed(f"model '{first.name}' version {first.version} failed to load: {first.error[1]}",
                          "run `exportkit inspect` on the version directory; check custom ops and the warm-up file")
    if load_error:
        raise CheckFailed(load_error[0].message, "fix version_labels in --model_config_file")


def _start_servers(core: ServerCore, options: ServerOptions, grpc_options, metrics, servers: list) -> str:
    """Open gRPC (and the Unix socket) and REST; returns their addresses for _address_line."""
    server, bound = start_grpc(core, options.port, socket_path=options.grpc_socket_path, options=grpc_options)
    servers.append(server)
    address = f"127.0.0.1:{bound}"
    line = f"{address}"
    log.info("listening on %s%s", address, f" and unix:{options.grpc_socket_path}" if options.grpc_socket_path else "")
    if options.rest_api_port:
        from exportkit.serving.server.http_handler import start_rest

        rest, rest_bound = start_rest(core, options.rest_api_port, routes=_metrics_route(metrics),
                                      timeout_in_ms=options.rest_api_timeout_in_ms)
        servers.append(rest)
        line += REST_SUFFIX.format(rest_address=f"127.0.0.1:{rest_bound}")  # completed by _address_line
        log.info("REST API on 127.0.0.1:%d", rest_bound)
    return line


def _address_line(core: ServerCore, addresses: str) -> str:
    """ADDRESS_LINE for the first model and its highest AVAILABLE version, once the initial load is done."""
    first = next(iter(core.model_names()), "")
    versions = [s.version for s in core.versions(first) if s.state == "AVAILABLE"]
    address, _, rest = addresses.partition(" ")
    line = ADDRESS_LINE.format(name=first, version=max(versions, default=0), address=address)
    return f"{line} {rest}" if rest else line


def _metrics_route(metrics) -> dict:
    """GET <prometheus path> answering the metrics, on the REST server (http_rest_api_handler.cc's
    ProcessPrometheusRequest is part of the same HTTP server in TF Serving)."""
    from exportkit.serving.server.http_server import Response

    if metrics is None:
        return {}
    return {metrics.path: lambda request: Response(200, metrics.render(), "text/plain")}  # ProcessPrometheusRequest
