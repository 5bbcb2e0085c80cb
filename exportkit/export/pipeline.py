"""exportkit export: load -> build -> audit (custom-object contracts, training-time reference) -> trace -> write -> check,
with one progress line per stage."""
from __future__ import annotations

import datetime
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from exportkit import __version__, layout
from exportkit import reference as refs
from exportkit.errors import CheckFailed, UsageError
from exportkit.dtypes import HALF_DTYPES, name_of
from exportkit.export import signature as sig
from exportkit.export import writer
from exportkit.findings import Finding, has_errors
from exportkit.runtimes.session import SessionRuntime
from exportkit.sources.load import detect_format, load_source, sha256_of
from exportkit.sources.model_io import feed_model, keyed_outputs, model_input_specs, parse_input_spec
from exportkit.spec import ExportOptions, export_options
from exportkit.tfenv import import_tf
from exportkit.verify.compare import Tolerance, compare_batches, compare_with_default_tolerances, default_tolerance
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
    findings: list[Finding] = field(default_factory=list)  # custom-object contracts (warnings, infos)
    reference: dict | None = None  # the manifest's "reference" entry when a training-time reference was used


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
    generated: int = 0  # the first `generated` batches are generated; the rest are the reference's inputs
    reference_batches: list[int] = field(default_factory=list)  # golden batch of each reference batch


def _golden_record(model, specs: list[InputSpec], keep_output_dtype: bool, int_range: tuple[int, int],
                   extra_inputs: list[dict] = ()) -> GoldenRecord:
    import tensorflow as tf

    inputs = generate_batches(specs, samples=GOLDEN_SAMPLES, seed=GOLDEN_SEED, int_range=int_range)
    generated = len(inputs)
    reference_batches = []
    for batch in extra_inputs:  # a reference generated like the golden record has the very same inputs
        same = [i for i, b in enumerate(inputs) if b.keys() == batch.keys()
                and all(b[k].shape == batch[k].shape and np.array_equal(b[k], batch[k]) for k in b)]
        if not same:
            inputs.append(batch)
        reference_batches.append(same[0] if same else len(inputs) - 1)
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
    return GoldenRecord(specs, keys, inputs, outputs, raw_dtypes, out_dtypes, generated, reference_batches)


def _check_contracts(loaded, golden: GoldenRecord, options: ExportOptions, progress) -> list[Finding]:
    """Custom objects must rebuild from their config; errors stop the export before anything is written."""
    from exportkit.sources.contracts import check_contracts

    findings = check_contracts(loaded.model, golden.inputs[:golden.generated], loaded.custom_objects,
                               options.allow_incomplete_config, compare=compare_with_default_tolerances)
    for f in findings:
        if f.severity == "warning":  # infos (layers whose outputs were not compared) are in --json only
            progress.stream.write(f"  {f.severity}: {f.code}: {f.message}\n")
    if has_errors(findings):
        detail = "\n".join(f"  {f.code}: {f.message}" for f in findings if f.severity == "error")
        raise CheckFailed(f"custom objects break their config contract, so the reloaded model is not the trained "
                          f"one:\n{detail}", "fix get_config() of these classes, or pass --allow-incomplete-config "
                          "if the missing arguments are really derived from the others")
    return findings


def _load_reference(options: ExportOptions, specs: list[InputSpec]):
    """The training-time reference (--reference, exportkit.toml, or SRC.reference.npz), or None."""
    path = refs.find_reference(options.source.src, options.reference)
    if path is None:
        return None, []
    reference = refs.read_reference(path)
    return reference, refs.reference_batches(reference, specs)


def _as_expected_dtypes(expected: dict, actual: dict) -> dict:
    """Outputs kept in float16/bfloat16 (--keep-output-dtype) are compared with a float32 reference as float32."""
    return {k: (np.asarray(v).astype(expected[k].dtype) if k in expected and expected[k].dtype.kind == "f"
                and np.asarray(v).dtype != expected[k].dtype else v) for k, v in actual.items()}


def _check_trained(reference, golden: GoldenRecord, tolerances: dict) -> dict:
    """trained -> reloaded: the reloaded model must compute what the training process recorded."""
    recomputed = [_as_expected_dtypes(e, golden.outputs[i]) for e, i in zip(reference.outputs, golden.reference_batches)]
    results = compare_batches(reference.outputs, recomputed, lambda key, dtype: Tolerance(**tolerances[key])
                              if key in tolerances else default_tolerance(dtype))
    failed = [r for r in results if not r.passed]
    if failed:
        detail = "; ".join(f"output '{r.key}': {r.reason} (max abs err {r.max_abs_err})" for r in failed)
        raise CheckFailed(f"link {refs.LINKS[0]} broke: the reloaded model does not compute what the trained model "
                          f"computed on the reference {reference.path}: {detail}",
                          "a custom layer's get_config() probably drops a constructor argument (the reloaded model "
                          "uses its default), or the source holds other weights than the trained model; nothing "
                          "was written")
    return {"path": reference.path, "sha256": _sha256(reference.path), "recorded_with": refs.recorded_with(reference),
            "golden_batches": golden.reference_batches,
            "outputs": layout.REFERENCE_OUTPUTS, "links": {refs.LINKS[0]: "passed"}}


def _sha256(path: str) -> str:
    return sha256_of(path)


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


def _manifest(loaded, golden: GoldenRecord, options: ExportOptions, tolerances: dict, reference: dict | None) -> dict:
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
        "reference": reference,  # a training-time reference was used (exportkit.record_reference), or null
    }


def _write_version(staging: Path, archive, loaded, golden: GoldenRecord, options: ExportOptions,
                   model_name: str, tolerances: dict, reference=None, reference_entry: dict | None = None) -> None:
    from exportkit.serving.warmup import write_warmup_records

    archive.write_out(str(staging), verbose=False)
    write_warmup_records(str(staging), model_name, options.signature_name, golden.inputs[:golden.generated])
    layout.write_golden(staging, golden.inputs, golden.outputs)
    if reference is not None:
        layout.write_reference_outputs(staging, reference.outputs)
    layout.write_manifest(staging, _manifest(loaded, golden, options, tolerances, reference_entry))


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
        reference, reference_inputs = _load_reference(options, specs)
        golden = _golden_record(loaded.model, specs, options.keep_output_dtype, int_range, reference_inputs)
        progress.stage("build", f"{len(golden.specs)} input(s), {len(golden.keys)} output(s), golden record of "
                                f"{len(golden.inputs)} batches")

        tolerances = {k: vars(default_tolerance(_tolerance_dtype(loaded.policy, golden.raw_dtypes[k])))
                      for k in golden.keys}
        findings = _check_contracts(loaded, golden, options, progress)
        reference_entry = _check_trained(reference, golden, tolerances) if reference is not None else None
        progress.stage("audit", "custom objects rebuild from their configs" + (
            f"; {refs.LINKS[0]} agrees on the training-time reference" if reference is not None else ""))

        archive = _archive(loaded.model, golden, options, assets)
        progress.stage("trace", f"signature '{options.signature_name}'")

        with writer.staged_version_dir(base, version) as staging:
            _write_version(staging, archive, loaded, golden, options, base.resolve().name, tolerances,
                           reference, reference_entry)
            progress.stage("write", f"{base / str(version)}")
            if session is not None:
                session.path = str(staging.resolve())
                _self_check(session, golden.inputs, golden.outputs, tolerances, reference is not None)
                progress.stage("check", "TF1 loader in a fresh process agrees with eager Keras on the golden record")
                if reference_entry is not None:
                    reference_entry["links"][refs.LINKS[1]] = "passed"
                    layout.write_manifest(staging, _manifest(loaded, golden, options, tolerances, reference_entry))
    finally:
        if session is not None:
            session.close()

    return ExportResult(path=base / str(version), version=version, signature_name=options.signature_name,
                        inputs=golden.specs, outputs=golden.out_dtypes, policy=loaded.policy,
                        source_format=loaded.format, checked=options.verify, stage_seconds=progress.times,
                        findings=findings, reference=reference_entry)


def _self_check(session, inputs, expected, tolerances, with_reference: bool = False) -> None:
    """The TF-Serving-equivalent load must reproduce the eager outputs; otherwise the export fails."""
    session.load()
    actual = [session.run(batch) for batch in inputs]
    results = compare_batches(expected, actual, lambda key, dtype: Tolerance(**tolerances[key]))
    failed = [r for r in results if not r.passed]
    if failed:
        detail = "; ".join(f"output '{r.key}': {r.reason} (max abs err {r.max_abs_err})" for r in failed)
        link = f"link {refs.LINKS[1]} (TF1 loader, as TF Serving loads it) broke: " if with_reference else ""
        raise CheckFailed(f"{link}the exported SavedModel does not reproduce eager Keras: {detail}",
                          "the version was not written; re-run with --debug, or --no-verify to keep it for inspection")


def render_summary(result: ExportResult) -> str:
    lines = [f"exported {result.path} (version {result.version}, from {result.source_format}, policy {result.policy})",
             f"signature '{result.signature_name}':"]
    for spec in result.inputs:
        lines.append(f"  input   {spec.key:<24} {spec.dtype:<9} {spec.shape}")
    for key, dtype in result.outputs.items():
        lines.append(f"  output  {key:<24} {dtype}")
    lines.append("self-check: passed (TF1 loader, fresh process)" if result.checked else "self-check: skipped (--no-verify)")
    if result.reference:
        links = ", ".join(f"{link} {verdict}" for link, verdict in result.reference["links"].items())
        lines.append(f"training-time reference: {result.reference['path']} ({links})")
    lines += [f"{f.severity}: {f.code}: {f.message}" for f in result.findings if f.severity == "warning"]
    return "\n".join(lines)


def summary_json(result: ExportResult) -> dict:
    return {"path": str(result.path), "version": result.version, "signature_name": result.signature_name,
            "inputs": {s.key: {"dtype": s.dtype, "shape": s.shape} for s in result.inputs},
            "outputs": {k: {"dtype": d} for k, d in result.outputs.items()}, "dtype_policy": result.policy,
            "source_format": result.source_format, "self_check": "passed" if result.checked else "skipped",
            "reference": result.reference, "findings": [f.to_dict() for f in result.findings],
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
