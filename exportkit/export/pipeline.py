"""exportkit export: load -> build -> trace -> write -> check, with one progress line per stage."""
from __future__ import annotations

import datetime
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


from exportkit import __version__, layout
from exportkit.errors import CheckFailed, UsageError
from exportkit.dtypes import HALF_DTYPES, name_of
from exportkit.export import signature as sig
from exportkit.export import writer
from exportkit.runtimes.session import SessionRuntime
from exportkit.sources.load import detect_format, load_source
from exportkit.sources.model_io import feed_model, keyed_outputs, model_input_specs, parse_input_spec
from exportkit.spec import ExportOptions, export_options
from exportkit.tfenv import import_tf
from exportkit.verify.compare import Tolerance, compare_batches, default_tolerance
from exportkit.batches import InputSpec, generate_batches, parse_int_range

GOLDEN_SAMPLES = 8
GOLDEN_SEED = 0


class Progress:
    """`  load      0.42 s  detail` lines on stderr, so stdout carries only the summary."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.start = time.perf_counter()
        self.times: dict[str, float] = {}

    def stage(self, name: str, detail: str = "") -> None:
        now = time.perf_counter()
        self.times[name] = now - self.start
        self.stream.write(f"  {name:<6} {now - self.start:6.2f} s  {detail}\n")
        self.stream.flush()
        self.start = now


@dataclass
class ExportResult:
    path: Path
    version: int
    signature_name: str
    inputs: list[InputSpec]
    outputs: dict[str, str]  # key -> dtype in the signature
    policy: str
    source_format: str
    checked: bool
    stage_seconds: dict[str, float] = field(default_factory=dict)


def _tolerance_dtype(policy: str, raw_dtype: str) -> str:
    """Outputs computed in half precision are compared with half-precision tolerances, even when cast."""
    if raw_dtype in HALF_DTYPES:
        return raw_dtype
    if policy.startswith("mixed_") and raw_dtype.startswith("float"):
        return policy.removeprefix("mixed_")
    return raw_dtype


@dataclass
class GoldenRecord:
    """Reference inputs and the eager Keras outputs for them, keyed like the signature."""

    specs: list[InputSpec]
    keys: list[str]
    inputs: list[dict]
    outputs: list[dict]
    raw_dtypes: dict[str, str]  # output key -> dtype the model computed it in
    out_dtypes: dict[str, str]  # output key -> dtype in the signature


def _golden_record(model, specs: list[InputSpec], keep_output_dtype: bool, int_range: tuple[int, int]) -> GoldenRecord:
    import tensorflow as tf

    inputs = generate_batches(specs, samples=GOLDEN_SAMPLES, seed=GOLDEN_SEED, int_range=int_range)
    try:
        raws = [feed_model(model, {s.key: tf.constant(b[s.key]) for s in specs}) for b in inputs]
    except (tf.errors.OpError, ValueError, TypeError) as err:
        detail = " ".join(str(err).split())[:300]
        raise UsageError(f"the model fails on generated inputs ({type(err).__name__}: {detail})",
                         "pass --int-range LO:HI that fits the integer inputs (e.g. 0:VOCAB_SIZE), or --input-spec "
                         "name:shape:dtype for inputs whose shape or dtype cannot be read from the model") from err
    first = keyed_outputs(model, raws[0])
    keys = list(first)
    raw_dtypes = {k: name_of(v.dtype) for k, v in first.items()}
    outputs = [{k: v.numpy() for k, v in sig.serving_outputs(raw, keys, keep_output_dtype).items()} for raw in raws]
    out_dtypes = {k: name_of(v.dtype) for k, v in outputs[0].items()}
    return GoldenRecord(specs, keys, inputs, outputs, raw_dtypes, out_dtypes)


def _archive(model, golden: GoldenRecord, options: ExportOptions, assets: list[Path]):
    import keras
    import tensorflow as tf

    archive = keras.export.ExportArchive()
    archive.track(model)
    # ExportArchive.track() only collects lookup-table resources; an Asset must hang off the saved root
    # object to be copied into assets/ and listed in the MetaGraph's asset_file_def.
    archive._tf_trackable.exportkit_assets = [tf.saved_model.Asset(str(path)) for path in assets]
    serve = sig.make_serving_fn(model, golden.specs, golden.keys, options.keep_output_dtype)
    archive.add_endpoint(options.signature_name, serve, input_signature=sig.tensor_specs(golden.specs))
    return archive


def _manifest(loaded, golden: GoldenRecord, options: ExportOptions, tolerances: dict) -> dict:
    import keras
    import tensorflow as tf

    return {
        "exportkit_version": __version__,
        "tensorflow_version": tf.__version__,
        "keras_version": keras.__version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "source": {"path": loaded.path, "format": loaded.format, "sha256": loaded.sha256},
        "dtype_policy": loaded.policy,
        "signature_name": options.signature_name,
        "signature": {
            "inputs": {s.key: {"dtype": s.dtype, "shape": s.shape} for s in golden.specs},
            "outputs": {k: {"dtype": golden.out_dtypes[k], "compute_dtype": golden.raw_dtypes[k]} for k in golden.keys},
        },
        "tolerances": tolerances,
        "golden": {"dir": str(layout.EXTRA_DIR), "inputs": layout.GOLDEN_INPUTS, "outputs": layout.GOLDEN_OUTPUTS,
                   "batch_sizes": [len(next(iter(b.values()))) for b in golden.inputs], "seed": GOLDEN_SEED,
                   "int_range": options.int_range},
        "assets": [Path(a).name for a in options.assets],
        "custom_objects": sorted(loaded.custom_objects),
    }


def _write_version(staging: Path, archive, loaded, golden: GoldenRecord, options: ExportOptions,
                   model_name: str, tolerances: dict) -> None:
    from exportkit.serving.warmup import write_warmup_records

    archive.write_out(str(staging), verbose=False)
    write_warmup_records(str(staging), model_name, options.signature_name, golden.inputs)
    layout.write_golden(staging, golden.inputs, golden.outputs)
    layout.write_manifest(staging, _manifest(loaded, golden, options, tolerances))


def export_model(options: ExportOptions, progress: Progress | None = None) -> ExportResult:
    progress = progress or Progress()
    # Everything that can be checked without TensorFlow is checked first; an existing version is never touched.
    base = Path(options.output)
    version = writer.choose_version(base, options.version)
    overrides = [parse_input_spec(text) for text in options.input_specs]
    assets = writer.check_assets(options.assets)
    int_range = parse_int_range(options.int_range)
    detect_format(options.source.src, options.source.format)

    # The serving-equivalent worker starts now: its TensorFlow import overlaps with loading and tracing.
    session = SessionRuntime(str(base / str(version)), options.signature_name, device="cpu") if options.verify else None
    if session is not None:
        session.start()
    try:
        import_tf()
        loaded = load_source(options.source)
        progress.stage("load", f"{loaded.format} {options.source.src} (policy {loaded.policy})")

        specs = model_input_specs(loaded.model, overrides)
        golden = _golden_record(loaded.model, specs, options.keep_output_dtype, int_range)
        progress.stage("build", f"{len(golden.specs)} input(s), {len(golden.keys)} output(s), golden record of "
                                f"{len(golden.inputs)} batches")

        archive = _archive(loaded.model, golden, options, assets)
        progress.stage("trace", f"signature '{options.signature_name}'")

        tolerances = {k: vars(default_tolerance(_tolerance_dtype(loaded.policy, golden.raw_dtypes[k])))
                      for k in golden.keys}
        with writer.staged_version_dir(base, version) as staging:
            _write_version(staging, archive, loaded, golden, options, base.resolve().name, tolerances)
            progress.stage("write", f"{base / str(version)}")
            if session is not None:
                session.path = str(staging.resolve())
                _self_check(session, golden.inputs, golden.outputs, tolerances)
                progress.stage("check", "TF1 loader in a fresh process agrees with eager Keras on the golden record")
    finally:
        if session is not None:
            session.close()

    return ExportResult(path=base / str(version), version=version, signature_name=options.signature_name,
                        inputs=golden.specs, outputs=golden.out_dtypes, policy=loaded.policy,
                        source_format=loaded.format, checked=options.verify, stage_seconds=progress.times)


def _self_check(session, inputs, expected, tolerances) -> None:
    """The TF-Serving-equivalent load must reproduce the eager outputs; otherwise the export fails."""
    session.load()
    actual = [session.run(batch) for batch in inputs]
    results = compare_batches(expected, actual, lambda key, dtype: Tolerance(**tolerances[key]))
    failed = [r for r in results if not r.passed]
    if failed:
        detail = "; ".join(f"output '{r.key}': {r.reason} (max abs err {r.max_abs_err})" for r in failed)
        raise CheckFailed(f"the exported SavedModel does not reproduce eager Keras: {detail}",
                          "the version was not written; re-run with --debug, or --no-verify to keep it for inspection")


def render_summary(result: ExportResult) -> str:
    lines = [f"exported {result.path} (version {result.version}, from {result.source_format}, policy {result.policy})",
             f"signature '{result.signature_name}':"]
    for spec in result.inputs:
        lines.append(f"  input   {spec.key:<24} {spec.dtype:<9} {spec.shape}")
    for key, dtype in result.outputs.items():
        lines.append(f"  output  {key:<24} {dtype}")
    lines.append("self-check: passed (TF1 loader, fresh process)" if result.checked else "self-check: skipped (--no-verify)")
    return "\n".join(lines)


def summary_json(result: ExportResult) -> dict:
    return {"path": str(result.path), "version": result.version, "signature_name": result.signature_name,
            "inputs": {s.key: {"dtype": s.dtype, "shape": s.shape} for s in result.inputs},
            "outputs": {k: {"dtype": d} for k, d in result.outputs.items()}, "dtype_policy": result.policy,
            "source_format": result.source_format, "self_check": "passed" if result.checked else "skipped",
            "stage_seconds": {k: round(v, 3) for k, v in result.stage_seconds.items()}}


def export_command(*, src, output, spec_path=None, json_out=None, **flags) -> int:
    options = export_options(src, output, spec_path, **flags)
    result = export_model(options)
    if json_out == "-":
        print(json.dumps(summary_json(result), indent=2))
        return 0
    print(render_summary(result))
    if json_out:
        Path(json_out).write_text(json.dumps(summary_json(result), indent=2) + "\n")
    return 0
