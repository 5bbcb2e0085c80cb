"""The command line. Thin: parse options, call the API, render, exit with the documented code.

Exit codes (every command): 0 success; 1 the model fails a check; 2 bad usage or input; 3 infrastructure.
TensorFlow is imported lazily by the commands that need it, so `inspect` stays fast.
"""
from __future__ import annotations

import errno
import functools
import inspect as _inspect  # (the `inspect` command below takes the name)
import os
import signal
import sys
import warnings
from typing import List, NamedTuple, Optional, get_type_hints

import typer

from exportkit.errors import EXIT_INFRA, ExportkitError, MissingModule
from exportkit.files import GuardedStream, OutputFault, reopen_closed_stdio

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Export Keras/TensorFlow models for TF Serving and prove they compute what the model computed.")


def _print_version(value: bool) -> None:
    if value:
        from exportkit.version import __version__

        typer.echo(f"exportkit {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                       help="Print exportkit's version and exit.")) -> None:
    """Export Keras/TensorFlow models for TF Serving and prove they compute what the model computed."""


def _fail(message: str, remedy: str | None, code: int) -> None:
    typer.echo(f"error: {message}", err=True)
    if remedy:
        typer.echo(f"  fix: {remedy}", err=True)
    raise typer.Exit(code)


def _run(fn, debug: bool) -> None:
    """Call `fn` (which returns an exit code) and turn every failure into one clear message and its exit code."""
    try:
        code = fn()
    except ExportkitError as err:
        if debug:
            raise
        _fail(err.message, err.remedy, err.exit_code)
    except OutputFault as fault:
        _output_fault(fault)
    except KeyboardInterrupt:
        _fail("interrupted", "run the command again; nothing half-written was left behind (an export leaves its base "
                             "directory as it was)", 130)
    except typer.Exit:
        raise
    except Exception as err:  # an unexpected failure is ours or the environment's, never silent
        if debug:
            raise
        if isinstance(err, ModuleNotFoundError) and err.name:  # this Python lacks a package (h11 for REST, ...)
            missing = MissingModule(err.name, sys.executable)
            _fail(missing.message, missing.remedy, missing.exit_code)
        _fail(f"unexpected {type(err).__name__}: {err}", "re-run with --debug for the traceback and report it", EXIT_INFRA)
    else:
        raise typer.Exit(code or 0)


DEBUG = typer.Option(False, "--debug", help="Show tracebacks.")
CONTAINER_CLI = typer.Option("docker", "--container-cli", help="--serving docker: the container CLI (docker, podman or a path).")
PULL = typer.Option(False, "--pull", help="--serving docker: pull the image if it is not on this machine.")
CUSTOM_OBJECTS = typer.Option(None, "--custom-objects", help="module or module:Name offering custom Keras objects (repeatable).")
PYTHON_PATH = typer.Option(None, "--python-path", help="Directory searched first for custom objects and builders (repeatable).")
BUILDER = typer.Option(None, "--builder", help="module:function that builds the model for a checkpoint.")
BUILDER_ARG = typer.Option(None, "--builder-arg", help="key=value passed to the builder; values parsed as Python literals (repeatable).")
MODEL_CONFIG = typer.Option(None, "--model-config", help="model.json (Keras config) to rebuild a checkpoint's model from.")
POLICY = typer.Option(None, "--policy", help="Dtype policy to build under when rebuilding from code (e.g. mixed_float16).")
FORMAT = typer.Option(None, "--format", help="Source format: h5, keras, saved_model, checkpoint, weights (detected by default).")
KERAS = typer.Option(None, "--keras", metavar="2|3", help="Load the source with Keras 3 or tf.keras 2 (tf_keras); default: the Keras that wrote it.")
MAX_MEMORY = typer.Option(None, "--max-memory", metavar="SIZE",
                          help="Fail (exit 1) when the model's peak memory in the session runtime exceeds SIZE "
                               "(512MB = 512*10^6 bytes, 2GiB = 2*2^30).")
MAX_SWAP_MEMORY = typer.Option(None, "--max-swap-memory", metavar="SIZE",
                               help="Fail (exit 1) when the swap from the version served before (both loaded, as TF "
                                    "Serving swaps) needs more than SIZE.")
SPEC = typer.Option(None, "--spec", help="exportkit.toml with the export options (default: next to the source).")
UNSAFE = typer.Option(False, "--unsafe", help="Let Keras deserialize Lambda layers / bytecode (unsafe for untrusted files).")
REFERENCE = typer.Option(None, "--reference", help="Training-time reference (.npz from exportkit.record_reference); "
                         "default: SRC.reference.npz next to the source, or `reference` in exportkit.toml.")
ALLOW_INCOMPLETE = typer.Option(False, "--allow-incomplete-config",
                                help="Custom objects whose get_config() misses __init__ arguments are warnings, not errors.")
HTML = typer.Option(None, "--html", metavar="FILE", help="Also write a self-contained HTML report here (needs exportkit[report]).")
SUMMARY = typer.Option(None, "--summary", metavar="FILE", help="Also write the verdict as GitHub-flavoured Markdown here.")
OP_LIBRARY = typer.Option(None, "--op-library", metavar="PATH.so|MODULE",
                          help="Op library loaded into every TensorFlow worker (repeatable; also op_libraries in "
                               "./exportkit.toml). The verdict still says stock TF Serving lacks its ops.")


def _with_op_libraries(go, libraries):
    """`go` with --op-library (and exportkit.toml's op_libraries) passed to the workers it starts."""

    def wrapped():
        from exportkit.tfversions.oplibs import OpLibraryError, op_libraries_env
        from exportkit.errors import UsageError

        try:
            with op_libraries_env(libraries):
                return go()
        except OpLibraryError as err:  # exportkit.toml's op_libraries is not a list of strings
            raise UsageError(err.message, err.fix) from err

    return wrapped


def _pop_op_libraries(argv: list[str]) -> list[str]:
    """`serve`'s --op-library values, taken out of the TF Serving flags (which have no such flag)."""
    libraries, rest = [], []
    args = iter(argv)
    for arg in args:
        if arg == "--op-library":
            libraries.append(next(args, ""))
        elif arg.startswith("--op-library="):
            libraries.append(arg.partition("=")[2])
        else:
            rest.append(arg)
    argv[:] = rest
    return libraries


SERVER_FLAG = typer.Option(None, "--server-flag", help="NAME=VALUE: a tensorflow_model_server flag the deployment "
                           "runs with (xla_cpu_compilation_enabled, xla_gpu_compilation_enabled, "
                           "enable_signature_method_name_check, per_process_gpu_memory_fraction; repeatable): the "
                           "verdict and a launched server follow it.")
INPUT_SPEC = typer.Option(None, "--input-spec", help="name:shape:dtype, e.g. tokens:-1,16:int32 (repeatable override).")
# verify and compat: generated inputs and tolerances
SEED = typer.Option(0, "--seed", help="Seed for generated inputs.")
GENERATED_INT_RANGE = typer.Option(None, "--int-range", help="NAME=LO:HI for one integer input, LO:HI for every one "
                                   "(repeatable; default: the export's, else 0:10).")
ATOL = typer.Option(None, "--atol", help="Absolute tolerance for every output.")
RTOL = typer.Option(None, "--rtol", help="Relative tolerance for every output.")
TOL = typer.Option(None, "--tol", help="KEY=ATOL,RTOL for one output (repeatable).")


class SourceFlags(NamedTuple):
    """The flags that say how to load a training source (export SRC, verify --against SRC, inspect SRC)."""

    format: Optional[str] = FORMAT
    builder: Optional[str] = BUILDER
    builder_arg: Optional[List[str]] = BUILDER_ARG
    model_config: Optional[str] = MODEL_CONFIG
    spec: Optional[str] = SPEC
    custom_objects: Optional[List[str]] = CUSTOM_OBJECTS
    python_path: Optional[List[str]] = PYTHON_PATH
    policy: Optional[str] = POLICY
    unsafe: bool = UNSAFE
    keras: Optional[str] = KERAS

    def options(self, src: str):
        """The flags (plus exportkit.toml) as one SourceOptions for `src`."""
        from exportkit.options.source import source_from_flags

        return source_from_flags(src, self._asdict())


def source_flags(command):
    """The one definition of the source flags: adds SourceFlags' fields to `command`'s options (before --debug)
    and hands them to it as one `source: SourceFlags`."""
    signature = _inspect.signature(command, eval_str=True)
    own = [p for p in signature.parameters.values() if p.name != "source"]
    types = get_type_hints(SourceFlags, globals())
    added = [_inspect.Parameter(name, _inspect.Parameter.KEYWORD_ONLY, default=SourceFlags._field_defaults[name],
                                annotation=types[name]) for name in SourceFlags._fields]
    at = next((i for i, p in enumerate(own) if p.name == "debug"), len(own))
    params = [p.replace(kind=_inspect.Parameter.KEYWORD_ONLY) for p in own[:at] + added + own[at:]]

    @functools.wraps(command)
    def with_source(**kwargs):
        source = SourceFlags(**{name: kwargs.pop(name) for name in SourceFlags._fields})
        return command(source=source, **kwargs)

    with_source.__signature__ = signature.replace(parameters=params)
    with_source.__annotations__ = {p.name: p.annotation for p in params}
    return with_source


@app.command()
@source_flags
def export(
    src: str = typer.Argument(..., metavar="SRC", help="A .h5/.hdf5 or .keras file, a checkpoint directory or a .weights.h5 file."),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="Model base directory; the version goes below it (default: `output` in exportkit.toml, else ./export/<name>)."),
    version: Optional[int] = typer.Option(None, "--version", help="Version number (default: highest + 1, else 1)."),
    asset: Optional[List[str]] = typer.Option(None, "--asset", help="File copied into assets/ and tracked (repeatable)."),
    signature_name: Optional[str] = typer.Option(None, "--signature-name", help="Signature key (default serving_default)."),
    signature: Optional[List[str]] = typer.Option(None, "--signature", metavar="SPEC",
                                                  help="NAME[:key=value,...] with outputs=a+b, input=tensors|examples, "
                                                       "method=predict|classify|regress, scores=OUTPUT, classes=FILE "
                                                       "(repeatable; default: one serving_default)."),
    feature_spec: Optional[str] = typer.Option(None, "--feature-spec", help="JSON overriding the tf.Example features derived from the model's inputs."),
    output_names: Optional[str] = typer.Option(None, "--output-names", help="Comma-separated keys for the outputs of a model returning a list or tuple, in order."),
    input_spec: Optional[List[str]] = INPUT_SPEC,
    int_range: Optional[List[str]] = typer.Option(None, "--int-range", help="NAME=LO:HI for one integer input, LO:HI for every one (repeatable; default: derived from the embedding/one-hot each input reaches, else 0:10)."),
    keep_output_dtype: bool = typer.Option(False, "--keep-output-dtype", help="Keep float16/bfloat16 outputs (default: cast to float32)."),
    no_verify: bool = typer.Option(False, "--no-verify", help="Skip the self-check after writing."),
    reference: Optional[str] = REFERENCE,
    allow_incomplete_config: bool = ALLOW_INCOMPLETE,
    batching_parameters: Optional[str] = typer.Option(None, "--batching-parameters", metavar="FILE",
                                                      help="TF Serving BatchingParameters text proto the model is "
                                                           "served with: the warm-up covers every allowed_batch_sizes entry."),
    server_flag: Optional[List[str]] = SERVER_FLAG,
    json_out: Optional[str] = typer.Option(None, "--json", help="Write a JSON summary here ('-' for stdout)."),
    html: Optional[str] = HTML,
    summary: Optional[str] = SUMMARY,
    debug: bool = DEBUG,
    source: SourceFlags = None,
):
    """Export a model to BASE_DIR/<version>/ as a TF-Serving-ready SavedModel, then (unless --no-verify) check it
    the way TF Serving loads it."""

    def go():
        from exportkit.export.pipeline import export_command
        from exportkit.options.export import export_options
        from exportkit.options.source import source_keywords

        options = export_options(
            src, output, source.spec, version=version, assets=asset or [], signature_name=signature_name,
            input_specs=input_spec or [], keep_output_dtype=keep_output_dtype, no_verify=no_verify,
            int_range=int_range or [], allow_incomplete_config=allow_incomplete_config, reference=reference,
            signatures=signature or [], feature_spec=feature_spec, output_names=output_names,
            batching_parameters=batching_parameters, server_flag=server_flag or [],
            **source_keywords(source._asdict()))
        return export_command(options, json_out=json_out, html=html, summary=summary)

    _run(go, debug)


@app.command()
@source_flags
def verify(
    path: str = typer.Argument(..., metavar="PATH", help="A version directory, a model base directory or any SavedModel."),
    against: Optional[str] = typer.Option(None, "--against", help="The training source to rebuild in eager Keras."),
    signature_name: Optional[str] = typer.Option(None, "--signature", "--signature-name",
                                                 help="Verify only this signature (default: every one)."),
    inputs: Optional[str] = typer.Option(None, "--inputs", help=".npz keyed by input name, JSON, or a .tfrecord of tf.Example."),
    reference: Optional[str] = typer.Option(None, "--reference", help="Training-time reference (.npz from "
                                            "exportkit.record_reference); default: the one recorded at export."),
    samples: int = typer.Option(8, "--samples", help="Batch size of the generated input batch (batch 1 is always added)."),
    seed: int = SEED,
    int_range: Optional[List[str]] = GENERATED_INT_RANGE,
    save_inputs: Optional[str] = typer.Option(None, "--save-inputs", help="Write the inputs used, to reproduce a failure."),
    save_outputs: Optional[str] = typer.Option(None, "--save-outputs", help="Write every runtime's outputs."),
    atol: Optional[float] = ATOL,
    rtol: Optional[float] = RTOL,
    tol: Optional[List[str]] = TOL,
    runtimes: Optional[str] = typer.Option(None, "--runtimes", help="Comma-separated subset of golden,keras,saved_model,session,serving,rest."),
    serving: str = typer.Option("auto", "--serving", help="auto | binary | embedded | docker[:TAG] | none | HOST:PORT "
                                "(docker: TF Serving's official image, e.g. docker:2.14.1, docker:2.14.1-gpu)."),
    serving_protocol: Optional[str] = typer.Option(None, "--serving-protocol", help="grpc | rest | both (default: both for servers exportkit launches, grpc for HOST:PORT)."),
    model_server_bin: Optional[str] = typer.Option(None, "--model-server-bin", help="Path of tensorflow_model_server."),
    container_cli: str = CONTAINER_CLI,
    pull: bool = PULL,
    batching_parameters: Optional[str] = typer.Option(None, "--batching-parameters", help="Run a launched server "
                                                      "with TF Serving's batching (--enable_batching) and this "
                                                      "BatchingParameters text proto."),
    model_name: Optional[str] = typer.Option(None, "--model-name", help="Model name on the server (default: base directory name)."),
    model_version: Optional[int] = typer.Option(None, "--model-version", help="Version to ask a remote server for."),
    load_timeout: float = typer.Option(120.0, "--load-timeout", help="Seconds to wait for the server to report AVAILABLE."),
    device: str = typer.Option("cpu", "--device", help="cpu | gpu | all, for the in-process runtimes."),
    allow_tf32: bool = typer.Option(False, "--allow-tf32", help="Keep TensorFloat-32 on during GPU runs."),
    allow_io_ops: bool = typer.Option(False, "--allow-io-ops", help="Execute graphs that read/write files, use the network or print (refused by default)."),
    allow_nondeterministic: bool = typer.Option(False, "--allow-nondeterministic", help="Outputs that differ between two identical requests are a warning (and not compared), not an error."),
    baseline: Optional[str] = typer.Option(None, "--baseline", help="Previously released SavedModel: fail on breaking signature changes "
                                           "(default: the newest lower version in the base directory, or with --serving HOST:PORT the deployed model)."),
    no_baseline: bool = typer.Option(False, "--no-baseline", help="Do not compare the signatures with a released version."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the JSON report here ('-' for stdout)."),
    junit: Optional[str] = typer.Option(None, "--junit", help="Write a JUnit XML report here."),
    html: Optional[str] = HTML,
    summary: Optional[str] = SUMMARY,
    data: Optional[str] = typer.Option(None, "--data", help="GLOB of TFRecord files of tf.Example or PredictionLog (plain or GZIP) or .npz shards, or `warmup` (the SavedModel's warm-up file): verify on these records."),
    limit: Optional[int] = typer.Option(None, "--limit", help="--data: at most N records."),
    batch_size: int = typer.Option(256, "--batch-size", help="--data: records per batch."),
    sample: Optional[float] = typer.Option(None, "--sample", help="--data: keep each record with this probability (seeded by --seed)."),
    save_failures: Optional[str] = typer.Option(None, "--save-failures", help="--data: write the failing records to DIR."),
    runner: str = typer.Option("in-process", "--runner", help="--data: in-process | beam (Apache Beam, needs exportkit[beam])."),
    beam_option: Optional[List[str]] = typer.Option(None, "--beam-option", help="--runner beam: KEY=VALUE pipeline option (repeatable)."),
    tf_versions: Optional[List[str]] = typer.Option(None, "--tf", help="Also run the session runtime on TensorFlow X.Y (2.12-2.21; a list, a range or all; repeatable), in a managed environment."),
    op_library: Optional[List[str]] = OP_LIBRARY,
    server_flag: Optional[List[str]] = SERVER_FLAG,
    max_latency_ms: Optional[float] = typer.Option(None, "--max-latency-ms", metavar="MS",
                                                   help="Fail (exit 1) when a runtime's steady-state p99 request "
                                                        "latency (the batches after its first) exceeds MS."),
    max_memory: Optional[str] = MAX_MEMORY,
    max_swap_memory: Optional[str] = MAX_SWAP_MEMORY,
    debug: bool = DEBUG,
    source: SourceFlags = None,
):
    """Prove the SavedModel computes what the model computed, in every runtime. Exit 0 only if all agree."""

    def go():
        from exportkit.options.verify import verify_options
        from exportkit.verify.command import verify_command

        return verify_command(verify_options(
            path, against=against, **source._asdict(), signature_name=signature_name,
            inputs=inputs, samples=samples, seed=seed,
            int_range=int_range, save_inputs=save_inputs, save_outputs=save_outputs, atol=atol, rtol=rtol,
            tol=tol, runtimes=runtimes, serving=serving, serving_protocol=serving_protocol,
            model_server_bin=model_server_bin, container_cli=container_cli, pull=pull,
            batching_parameters=batching_parameters, model_name=model_name, model_version=model_version,
            load_timeout=load_timeout, device=device, allow_tf32=allow_tf32, allow_io_ops=allow_io_ops,
            allow_nondeterministic=allow_nondeterministic, reference=reference, baseline=baseline, json=json_out,
            junit=junit, html=html, summary=summary, data=data, limit=limit, batch_size=batch_size, sample=sample,
            save_failures=save_failures, runner=runner, beam_option=beam_option, tf=tf_versions,
            server_flag=server_flag, max_latency_ms=max_latency_ms, no_baseline=no_baseline,
            max_memory=max_memory, max_swap_memory=max_swap_memory))

    _run(_with_op_libraries(go, op_library), debug)


@app.command()
@source_flags
def inspect(
    path: str = typer.Argument(..., metavar="PATH", help="A SavedModel (version or base directory) or a source (.h5, .keras, checkpoint)."),
    json_out: bool = typer.Option(False, "--json", help="Print exactly one JSON document."),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 if a finding is an error."),
    requests: Optional[str] = typer.Option(None, "--requests", help="Write a ready request per signature here: curl + JSON (REST), JSON for grpcurl."),
    model_name: Optional[str] = typer.Option(None, "--model-name", help="Model name in the --requests URLs (default: base directory name)."),
    allow_incomplete_config: bool = ALLOW_INCOMPLETE,
    int_range: Optional[List[str]] = typer.Option(None, "--int-range", help="NAME=LO:HI for one integer input, LO:HI for every one, for the batch a source is run on and --requests (repeatable; default: derived, or the export's)."),
    debug: bool = DEBUG,
    source: SourceFlags = None,
):
    """Signatures, dtypes, shapes, ops, assets and findings of a SavedModel (or a source's inputs and outputs)."""

    def go():
        from exportkit.inspection.command import inspect_command

        return inspect_command(path, json_out=json_out, strict=strict, source=lambda: source.options(path),
            allow_incomplete_config=allow_incomplete_config, requests=requests, model_name=model_name,
            int_range=int_range or [])

    _run(go, debug)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []})
def serve(ctx: typer.Context):
    """Serve SavedModels over TF Serving's gRPC and REST APIs on 127.0.0.1: `serve PATH [--port N] [--rest-port N]
    [--model-name M] [--device cpu|gpu] [--op-library LIB]`, or tensorflow_model_server's flags (`exportkit serve
    --help` lists them)."""
    argv = list(ctx.args)
    op_libraries = _pop_op_libraries(argv)

    def go():
        from exportkit.serving.server.model_server import serve_main

        return serve_main(argv)

    _run(_with_op_libraries(go, op_libraries), "--debug" in argv)


@app.command()
def compat(
    path: str = typer.Argument(..., metavar="PATH", help="A version directory, a model base directory or any SavedModel."),
    tf: Optional[List[str]] = typer.Option(None, "--tf", help="Versions: a list 2.12,2.17, a range 2.14-2.21, or all (default; repeatable)."),
    device: str = typer.Option("cpu", "--device", help="cpu | gpu: the device the servers run on."),
    run: bool = typer.Option(False, "--run", help="Also load and run it in TensorFlow X.Y's TF1 loader (managed environments, CPU)."),
    signature_name: str = typer.Option("serving_default", "--signature-name", help="Signature to run with --run."),
    samples: int = typer.Option(8, "--samples", help="Batch size of the generated batch for --run."),
    seed: int = SEED,
    int_range: Optional[List[str]] = GENERATED_INT_RANGE,
    atol: Optional[float] = ATOL,
    rtol: Optional[float] = RTOL,
    tol: Optional[List[str]] = TOL,
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the JSON matrix here ('-' for stdout)."),
    html: Optional[str] = HTML,
    summary: Optional[str] = SUMMARY,
    serving: Optional[str] = typer.Option(None, "--serving", help="docker | docker:TAG: also observe each version "
                                          "on TF Serving's official image (tensorflow/serving:X.Y.Z)."),
    container_cli: str = CONTAINER_CLI,
    pull: bool = PULL,
    load_timeout: float = typer.Option(120.0, "--load-timeout", help="--serving: seconds to wait for AVAILABLE."),
    server: str = typer.Option("stock", "--server", help="stock: TF X.Y plus the TF Text and TF-DF ops the stock "
                               "tensorflow_model_server links | tf-only: TF X.Y alone (a custom build without them)."),
    op_library: Optional[List[str]] = OP_LIBRARY,
    server_flag: Optional[List[str]] = SERVER_FLAG,
    debug: bool = DEBUG,
):
    """Will it load, run and agree on TF Serving 2.12 ... 2.21? Predicted statically; observed with --run, and on
    TF Serving itself with --serving docker."""

    def go():
        from exportkit.compat.command import compat_command
        from exportkit.options.compat import compat_options

        return compat_command(compat_options(
            path, tf, run, device=device, signature_name=signature_name, samples=samples, seed=seed,
            int_range=int_range, atol=atol, rtol=rtol, tol=tol, serving=serving, container_cli=container_cli,
            pull=pull, load_timeout=load_timeout, server=server, server_flag=server_flag, json=json_out, html=html,
            summary=summary))

    _run(_with_op_libraries(go, op_library), debug)


@app.command()
def diff(
    paths: List[str] = typer.Argument(..., metavar="OLD NEW", help="Two version directories, a model base directory "
                                      "(its newest two versions), or NEW alone with --serving HOST:PORT (the deployed OLD)."),
    serving: Optional[str] = typer.Option(None, "--serving", help="HOST:PORT of the deployed OLD version (gRPC)."),
    model_name: Optional[str] = typer.Option(None, "--model-name", help="Model name on the server; PredictionLog records for other names are skipped."),
    model_version: Optional[int] = typer.Option(None, "--model-version", help="--serving: the version to ask for."),
    signature_name: Optional[str] = typer.Option(None, "--signature", "--signature-name", help="Signature to compare (default: the logs', else serving_default)."),
    data: Optional[str] = typer.Option(None, "--data", help="GLOB of TFRecord files (tf.Example or PredictionLog, plain or GZIP) or .npz shards, or `warmup` (NEW's warm-up file); default: golden and generated batches."),
    limit: Optional[int] = typer.Option(None, "--limit", help="--data: at most N records."),
    batch_size: int = typer.Option(1024, "--batch-size", help="--data: records per batch (both versions answer the same batches)."),
    sample: Optional[float] = typer.Option(None, "--sample", help="--data: keep each record with this probability (seeded by --seed)."),
    seed: int = SEED,
    samples: int = typer.Option(8, "--samples", help="Without --data: batch size of the generated batch."),
    label: Optional[str] = typer.Option(None, "--label", metavar="KEY", help="Feature of the records' tf.Examples holding the label: each version's accuracy, AUC or MSE."),
    max_changed_top1: Optional[str] = typer.Option(None, "--max-changed-top1", help="Gate: fail when more than this share of top-1 answers change (0.5% or 0.005)."),
    max_abs_change: Optional[List[str]] = typer.Option(None, "--max-abs-change", help="Gate: QUANTILE=VALUE on |new - old| per element, e.g. p99=0.05 (p50, p99, p99.9, max; repeatable)."),
    min_metric_delta: Optional[float] = typer.Option(None, "--min-metric-delta", help="Gate (with --label): fail when the metric gets worse by more than this, e.g. -0.002."),
    runner: str = typer.Option("in-process", "--runner", help="--data: in-process | beam (Apache Beam, needs exportkit[beam])."),
    beam_option: Optional[List[str]] = typer.Option(None, "--beam-option", help="--runner beam: KEY=VALUE pipeline option (repeatable)."),
    device: str = typer.Option("cpu", "--device", help="cpu | gpu for the two session runtimes."),
    load_timeout: float = typer.Option(120.0, "--load-timeout", help="--serving: seconds to wait for the model."),
    max_memory: Optional[str] = MAX_MEMORY,
    max_swap_memory: Optional[str] = MAX_SWAP_MEMORY,
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the JSON report here ('-' for stdout)."),
    html: Optional[str] = HTML,
    summary: Optional[str] = SUMMARY,
    debug: bool = DEBUG,
):
    """What NEW changes for the clients of OLD: signatures first, then the answers on the same inputs. Exit 1 when
    a signature change breaks old clients or a gate fails."""

    def go():
        from exportkit.diff.command import diff_command
        from exportkit.options.diff import diff_options

        return diff_command(diff_options(
            paths, serving=serving, model_name=model_name, model_version=model_version,
            signature_name=signature_name, data=data, limit=limit, batch_size=batch_size, sample=sample, seed=seed,
            samples=samples, label=label, max_changed_top1=max_changed_top1, max_abs_change=max_abs_change,
            min_metric_delta=min_metric_delta, runner=runner, beam_option=beam_option, device=device,
            load_timeout=load_timeout, json=json_out, html=html, summary=summary, max_memory=max_memory,
            max_swap_memory=max_swap_memory))

    _run(go, debug)


runtimes_app = typer.Typer(no_args_is_help=True, help="Managed TensorFlow X.Y environments used by compat --run and verify --tf.")
app.add_typer(runtimes_app, name="runtimes")


@runtimes_app.command("list")
def runtimes_list(debug: bool = DEBUG):
    """Every supported TensorFlow version and whether its environment is installed."""

    def go():
        from exportkit.tfversions.envs import list_envs, root

        typer.echo(f"managed environments in {root()}")
        for env in list_envs():
            size = f"{env.bytes / 1e9:.1f} GB" if env.bytes else ""
            where = "this Python's TensorFlow" if env.state == "built-in" else (env.path or "")
            detail = f"tensorflow {env.tensorflow}, numpy {env.numpy}" if env.tensorflow else ""
            typer.echo(f"  {env.version:<5} {env.state:<9} {detail:<36} {size:>7}  {where}".rstrip())
        return 0

    _run(go, debug)


@runtimes_app.command("install")
def runtimes_install(version: str = typer.Argument(..., metavar="X.Y"),
                     force: bool = typer.Option(False, "--force", help="Rebuild an existing environment."),
                     debug: bool = DEBUG):
    """Create the environment of TensorFlow X.Y (tensorflow-cpu from PyPI, about a minute and 1.7 GB)."""

    def go():
        from exportkit.tfversions.envs import install

        env = install(version, force=force)
        typer.echo(f"TensorFlow {env.version}: {env.state} (tensorflow {env.tensorflow}, numpy {env.numpy}) "
                   f"{env.python}")
        return 0

    _run(go, debug)


@runtimes_app.command("remove")
def runtimes_remove(version: str = typer.Argument(..., metavar="X.Y"), debug: bool = DEBUG):
    """Delete the environment of TensorFlow X.Y."""

    def go():
        from exportkit.tfversions.envs import env_dir, remove

        typer.echo(f"removed {env_dir(version)}" if remove(version) else f"no environment for TensorFlow {version}")
        return 0

    _run(go, debug)


def _terminated(signum, frame) -> None:
    """SIGTERM (CI cancelling a job, `timeout`) unwinds like Ctrl-C, so servers and containers are stopped."""
    raise KeyboardInterrupt


def main(closed_stdio: list[str] | None = None) -> None:
    """The CLI. `closed_stdio`: what exportkit.entry found closed (files.reopen_closed_stdio) before it started a
    worker; the command still runs and exits with its verdict, only what it prints is lost."""
    if "stdout" in (reopen_closed_stdio() if closed_stdio is None else closed_stdio):
        typer.echo("warning: standard output is closed (started with >&-): the report cannot be printed; the exit "
                   "code still gives the verdict", err=True)
        typer.echo("  fix: redirect it (>/dev/null or >FILE) instead of closing it", err=True)
    sys.stdout = GuardedStream(sys.stdout)  # SIGPIPE stays ignored: `| head` ends quietly in _output_fault
    signal.signal(signal.SIGTERM, _terminated)
    _notes_to_stderr()
    if "--debug" not in sys.argv:
        warnings.simplefilter("ignore")  # Keras' UserWarnings about the user's model are noise in a CI log
    try:
        try:
            app()
        finally:
            sys.stdout.flush()
    except OutputFault as fault:
        try:
            _output_fault(fault)
        except typer.Exit as done:
            _exit_fast(done.exit_code)
            sys.exit(done.exit_code)
    except SystemExit as done:
        _exit_fast(done.code)
        raise


def _notes_to_stderr() -> None:
    """The pipeline's notes and progress (the `exportkit` logger) as plain lines on stderr, as the CLI prints them."""
    import logging

    from exportkit.log import log

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def _output_fault(fault: OutputFault) -> None:
    """stdout failed: a reader that left (`| head`) ends the command quietly with 141 (what the shell reports for
    SIGPIPE); a full device is exit 3 with a message. Later writes go to /dev/null."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    if fault.err.errno == errno.EPIPE:
        raise typer.Exit(128 + signal.SIGPIPE)
    _fail(f"cannot write to standard output: {fault.err.strerror or fault.err}",
          "free space on the device it goes to, or redirect it elsewhere", EXIT_INFRA)


def _exit_fast(code) -> None:
    """Skip TensorFlow's interpreter teardown (about a second) once the command has finished and said its word.

    atexit handlers (which stop any server this process started) still run; stdio is flushed first.
    """
    if "tensorflow" not in sys.modules:
        return
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else (0 if code is None else EXIT_INFRA))


if __name__ == "__main__":
    main()
