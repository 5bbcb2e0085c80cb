"""exportkit export: load -> build -> audit (custom-object contracts, training-time reference) -> trace -> write -> check,
with one progress line per stage."""
from __future__ import annotations

import datetime
import gc
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from exportkit.savedmodel import extras as layout
from exportkit.version import __version__
from exportkit.sources import reference as refs
from exportkit.errors import CheckFailed, ExportkitError, UsageError
from exportkit.files import print_report
from exportkit.dtypes import HALF_DTYPES, name_of, name_of_array
from exportkit.export import selfcheck
from exportkit.export import signature as sig
from exportkit.export import writer
from exportkit.findings import Finding, has_errors
from exportkit.runtimes.factory import RuntimeSpec, build
from exportkit.sources.int_ranges import generated_inputs_failure, int_ranges_for
from exportkit.sources.kerases import prepare_process
from exportkit.sources.load import detect_format, load_source, sha256_of
from exportkit.sources.model_io import feed_model, keyed_outputs, model_input_specs, parse_input_spec
from exportkit.options.export import ExportOptions
from exportkit.tfenv import import_tf, tensorflow_version, toolchain
from exportkit.compare.outputs import compare_batches, compare_with_default_tolerances
from exportkit.compare.tolerances import Tolerance, default_tolerance
from exportkit.inputs.generate import generate_batches
from exportkit.inputs.ranges import IntRanges
from exportkit.inputs.spec import InputSpec
from exportkit.tfexample.features import ExampleFeature, apply_feature_spec, derive_features, encode_examples, to_manifest

SCHEMA_VERSION = 1  # of the `export --json` summary (docs/report-schema.md)
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
    checked_how: str = ""  # where and how the self-check loaded the SavedModel
    stage_seconds: dict[str, float] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)  # custom-object contracts (warnings, infos)
    reference: dict | None = None  # the manifest's "reference" entry when a training-time reference was used
    signatures: list[dict] = field(default_factory=list)  # per signature: name, method, inputs, outputs

    exit_code = 0  # an export that fails raises (the version is not written)

    @property
    def version_dir(self) -> Path:
        return Path(self.path)

    def to_dict(self) -> dict:
        """The JSON summary, as `export --json` writes it."""
        return summary_json(self)

    @classmethod
    def from_json(cls, doc: dict) -> "ExportResult":
        """The result back from `export --json`'s document (the Python API runs the export in a child process)."""
        return cls(path=Path(doc["path"]), version=doc["version"], signature_name=doc["signature_name"],
                   inputs=[InputSpec(key, spec["dtype"], spec["shape"]) for key, spec in doc["inputs"].items()],
                   outputs={key: spec["dtype"] for key, spec in doc["outputs"].items()}, policy=doc["dtype_policy"],
                   source_format=doc["source_format"], checked=doc["self_check"] == "passed",
                   checked_how=doc["self_check_how"] or "", stage_seconds=dict(doc["stage_seconds"]),
                   findings=[Finding(**f) for f in doc["findings"]], reference=doc["reference"],
                   signatures=doc["signatures"])


def _tolerance_dtype(policy: str, raw_dtype: str) -> str:
    """Outputs computed in half precision are compared with half-precision tolerances, even when cast."""
    if raw_dtype in HALF_DTYPES:
        return raw_dtype
    if policy.startswith("mixed_") and raw_dtype.startswith("float"):
        return policy.removeprefix("mixed_")
    return raw_dtype


@dataclass
class SignatureRecord:
    """One signature's golden record: its inputs (tensors, or serialized Examples of the same values) and the
    eager Keras outputs mapped to its keys."""

    plan: sig.SignaturePlan
    specs: list[InputSpec]  # the model's inputs, as the tensor signatures declare them
    inputs: list[dict]
    outputs: list[dict]
    out_dtypes: dict[str, str]  # output key -> dtype in the signature
    compute_dtypes: dict[str, str]  # output key -> dtype the model computed it in
    features: list[ExampleFeature] | None = None

    @property
    def input_specs(self) -> dict:
        """The inputs as the written signature declares them (-1 for every free dimension)."""
        if self.plan.input == "examples":
            return {self.plan.examples_key: {"dtype": "string", "shape": [-1]}}
        return {s.key: {"dtype": s.dtype, "shape": None if s.shape is None else list(s.shape)} for s in self.specs}


@dataclass
class GoldenRecord:
    """Reference inputs and the eager Keras outputs for them, keyed like the model (all outputs, as the first
    signature without --signature has them); `signatures` holds each signature's own record."""

    specs: list[InputSpec]
    int_ranges: IntRanges  # what the generated integer inputs were drawn from
    keys: list[str]
    inputs: list[dict]
    outputs: list[dict]
    raw_dtypes: dict[str, str]  # output key -> dtype the model computed it in
    out_dtypes: dict[str, str]  # output key -> dtype in the signature
    generated: int = 0  # the first `generated` batches are generated; the rest are the reference's inputs
    reference_batches: list[int] = field(default_factory=list)  # golden batch of each reference batch
    signatures: list[SignatureRecord] = field(default_factory=list)


def _golden_record(model, specs: list[InputSpec], options: ExportOptions, int_ranges: IntRanges,
                   extra_inputs: list[dict] = ()) -> GoldenRecord:
    import tensorflow as tf

    inputs = generate_batches(specs, samples=GOLDEN_SAMPLES, seed=GOLDEN_SEED, int_range=int_ranges)
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
        raise generated_inputs_failure(err, specs, int_ranges) from err
    keyed = [keyed_outputs(model, raw, options.output_names) for raw in raws]
    keys = list(keyed[0])
    raw_dtypes = {k: name_of(v.dtype) for k, v in keyed[0].items()}
    outputs = [{k: v.numpy() for k, v in sig.serving_outputs(raw, keys, options.keep_output_dtype).items()}
               for raw in raws]
    out_dtypes = {k: name_of(v.dtype) for k, v in outputs[0].items()}
    golden = GoldenRecord(specs, int_ranges, keys, inputs, outputs, raw_dtypes, out_dtypes, generated,
                          reference_batches)
    golden.signatures = _signature_records(specs, keyed, inputs, raw_dtypes, options)
    return golden


def _signature_records(specs, keyed: list[dict], inputs: list[dict], raw_dtypes: dict,
                       options: ExportOptions) -> list[SignatureRecord]:
    """Each signature's golden record: its inputs (the golden tensors, or Examples of them) and the eager outputs
    mapped to its keys by the very function the traced signature uses."""
    import tensorflow as tf

    shapes = {k: tuple(v.shape) for k, v in keyed[0].items()}
    plans = sig.resolve_all(options.signatures or sig.default_signatures(options.signature_name), list(keyed[0]),
                            shapes)
    features = None
    if any(plan.input == "examples" for plan in plans):
        features = derive_features(specs, next(p.name for p in plans if p.input == "examples"))
        if options.feature_spec:
            features = apply_feature_spec(features, options.feature_spec)
    records = []
    for plan in plans:
        labels = tf.constant(plan.classes) if plan.classes else None
        outputs = [{k: v.numpy() for k, v in sig.signature_outputs(plan, kv, options.keep_output_dtype, labels).items()}
                   for kv in keyed]
        if plan.input == "examples":
            sig_inputs = [{plan.examples_key: encode_examples(batch, features)} for batch in inputs]
        else:
            sig_inputs = inputs
        compute = {k: (raw_dtypes[src] if src else "string") for k, src in plan.outputs.items()}
        records.append(SignatureRecord(plan, specs, sig_inputs, outputs, {k: name_of_array(v) for k, v in outputs[0].items()},
                                       compute, features if plan.input == "examples" else None))
    return records


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


def _check_asset_names(golden: GoldenRecord, assets: list[Path]) -> None:
    """Label files and --asset files all land in assets/ by name: two different files may not share one."""
    names = {p.name: p for p in assets}
    for path in (r.plan.classes_file for r in golden.signatures if r.plan.classes_file is not None):
        if names.setdefault(path.name, path) != path:
            raise UsageError(f"classes file {path} and --asset {names[path.name]} have the same name",
                             "rename one: assets/ holds files by name")


def _archive(loaded, golden: GoldenRecord, options: ExportOptions, assets: list[Path]):
    import tensorflow as tf

    model = loaded.model
    archive, root = loaded.keras.export_archive()
    archive.track(model)
    # ExportArchive.track() only collects lookup-table resources; an Asset must hang off the saved root
    # object to be copied into assets/ and listed in the MetaGraph's asset_file_def.
    _check_asset_names(golden, assets)
    root.exportkit_assets = [tf.saved_model.Asset(str(path)) for path in assets]
    tables = {}
    for record in golden.signatures:
        plan = record.plan
        labels = None
        if plan.classes_file is not None:
            if plan.classes_file not in tables:
                tables[plan.classes_file] = _label_table(plan.classes_file)
                archive.track(tables[plan.classes_file])
            labels = _labels(tables[plan.classes_file], len(plan.classes))
        fn, input_signature = sig.make_signature_fn(model, plan, golden.specs, golden.keys, options.keep_output_dtype,
                                                    record.features, labels)
        archive.add_endpoint(plan.name, fn, input_signature=input_signature)
    loaded.keras.track_each_variable_once(root)
    return archive


def _label_table(path: Path):
    """Line number -> class label, initialised from the label file, which TF ships as an asset (the way
    Estimator classification heads did): the served graph reads the labels the file in assets/ holds."""
    import tensorflow as tf

    initializer = tf.lookup.TextFileInitializer(str(path), tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER,
                                                tf.string, tf.lookup.TextFileIndex.WHOLE_LINE)
    return tf.lookup.StaticHashTable(initializer, default_value="")


def _labels(table, count: int):
    def labels():
        import tensorflow as tf

        return table.lookup(tf.range(count, dtype=tf.int64))

    return labels


def _tolerances(loaded, record: SignatureRecord) -> dict:
    return {k: vars(default_tolerance(_tolerance_dtype(loaded.policy, record.compute_dtypes[k])))
            for k in record.plan.outputs}


def _signature_manifest(loaded, record: SignatureRecord, index: int) -> dict:
    plan = record.plan
    entry = {
        "method": plan.method_name,
        "input": plan.input,
        "inputs": record.input_specs,
        "outputs": {k: {"dtype": record.out_dtypes[k], "compute_dtype": record.compute_dtypes[k],
                        "model_output": src or None} for k, src in plan.outputs.items()},
        "tolerances": _tolerances(loaded, record),
        "golden": layout.golden_prefixes(index),
    }
    if record.features is not None:
        entry["features"] = to_manifest(record.features)
    if plan.classes_file is not None:
        entry["classes"] = plan.classes_file.name
    return entry


def _manifest(loaded, golden: GoldenRecord, options: ExportOptions, reference: dict | None = None) -> dict:
    import tensorflow as tf

    first = golden.signatures[0]
    signatures = {r.plan.name: _signature_manifest(loaded, r, i) for i, r in enumerate(golden.signatures)}
    return {
        "exportkit_version": __version__,
        "tensorflow_version": tf.__version__,
        "keras_version": loaded.keras.version,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "source": {"path": loaded.path, "format": loaded.format, "sha256": loaded.sha256},
        "dtype_policy": loaded.policy,
        # The first signature, as older readers expect it; `signatures` holds every one.
        "signature_name": first.plan.name,
        "signature": {"inputs": first.input_specs,
                      "outputs": signatures[first.plan.name]["outputs"]},
        "tolerances": signatures[first.plan.name]["tolerances"],
        "signatures": signatures,
        "golden": {"dir": str(layout.EXTRA_DIR), "inputs": signatures[first.plan.name]["golden"]["inputs"],
                   "outputs": signatures[first.plan.name]["golden"]["outputs"],
                   "batch_sizes": [len(next(iter(b.values()))) for b in golden.inputs], "seed": GOLDEN_SEED,
                   **golden.int_ranges.to_manifest()},
        "output_names": list(options.output_names),
        "assets": list(dict.fromkeys([Path(a).name for a in options.assets] + [
            r.plan.classes_file.name for r in golden.signatures if r.plan.classes_file is not None])),
        "custom_objects": sorted(loaded.custom_objects),
        "reference": reference,  # a training-time reference was used (exportkit.record_reference), or null
        # Python, TensorFlow's build (CUDA/cuDNN) and the Keras package that loaded the source
        "toolchain": toolchain(loaded.keras.package),
    }


def _write_version(staging: Path, archive, loaded, golden: GoldenRecord, options: ExportOptions,
                   model_name: str, manifest: dict, reference=None) -> None:
    from exportkit.serving.warmup import resized_batches, warmup_records, write_warmup_file

    loaded.keras.write_archive(archive, str(staging))
    writer.set_method_names(staging, {r.plan.name: r.plan.method_name for r in golden.signatures})
    records = []
    for record in golden.signatures:  # with --batching-parameters: a record of every allowed batch size too
        batches = resized_batches(record.inputs[:golden.generated], manifest.get("warmup_batch_sizes", []))
        records += warmup_records(model_name, record.plan.name, batches, method=record.plan.method)
    write_warmup_file(str(staging), records)
    for record, entry in zip(golden.signatures, manifest["signatures"].values()):
        layout.write_golden(staging, record.inputs, record.outputs, entry["golden"])
    if reference is not None:
        layout.write_reference_outputs(staging, reference.outputs)
    layout.write_manifest(staging, manifest)


def _summary_signature(record: SignatureRecord) -> dict:
    return {"name": record.plan.name, "method": record.plan.method_name, "input": record.plan.input,
            "inputs": record.input_specs, "outputs": dict(record.out_dtypes)}


def export_model(options: ExportOptions, progress: Progress | None = None) -> ExportResult:
    progress = progress or Progress()
    # Everything that can be checked without TensorFlow is checked first; an existing version is never touched.
    base = Path(options.output)
    writer.choose_version(base, options.version)
    overrides = [parse_input_spec(text) for text in options.input_specs]
    assets = writer.check_assets(options.assets)
    from exportkit.serving.warmup import warmup_batch_sizes

    warmup_sizes = warmup_batch_sizes(options.batching_parameters)  # a bad file fails before anything is loaded
    # before TensorFlow is imported: which Keras `tf.keras` means in the user's modules
    prepare_process(options.source, detect_format(options.source.src, options.source.format))

    # The version is reserved (and BASE_DIR proven writable) before the long stages.
    with writer.staged_version_dir(base, options.version) as staging:
        version = writer.staging_version(staging)
        # The self-check runs in this process when the installed TensorFlow's stock ops ship with exportkit (to
        # prove no op is known only here); otherwise in the serving-equivalent worker, started now so its
        # TensorFlow import overlaps with loading and tracing.
        stock = selfcheck.stock_version(tensorflow_version()) if options.verify else None
        session = (build(RuntimeSpec("session", str(base / str(version)), options.signature_name, "cpu"))
                   if options.verify and stock is None else None)
        checked_how = ""
        try:
            if session is not None:
                session.start()
            import_tf()
            loaded = load_source(options.source)
            progress.stage("load", f"{loaded.format} {options.source.src} (policy {loaded.policy})")

            specs = model_input_specs(loaded.model, overrides)
            reference, reference_inputs = _load_reference(options, specs)
            int_ranges = int_ranges_for(loaded.model, specs, options.int_range)
            golden = _golden_record(loaded.model, specs, options, int_ranges, reference_inputs)
            names = [r.plan.name for r in golden.signatures]
            progress.stage("build", f"{len(golden.specs)} input(s), {len(golden.keys)} output(s), golden record of "
                                    f"{len(golden.inputs)} batches" + (
                                        f" (integers: {int_ranges.describe()})" if int_ranges.by_input else ""))

            tolerances = {k: vars(default_tolerance(_tolerance_dtype(loaded.policy, golden.raw_dtypes[k])))
                          for k in golden.keys}
            findings = _check_contracts(loaded, golden, options, progress)
            reference_entry = _check_trained(reference, golden, tolerances) if reference is not None else None
            progress.stage("audit", "custom objects rebuild from their configs" + (
                f"; {refs.LINKS[0]} agrees on the training-time reference" if reference is not None else ""))

            archive = _archive(loaded, golden, options, assets)
            progress.stage("trace", f"signature{'s' if len(names) > 1 else ''} {', '.join(repr(n) for n in names)}")

            manifest = _manifest(loaded, golden, options, reference_entry)
            if warmup_sizes:
                manifest["warmup_batch_sizes"] = warmup_sizes  # --batching-parameters' allowed_batch_sizes
            _write_version(staging, archive, loaded, golden, options, base.resolve().name, manifest, reference)
            selfcheck.external_files_check(staging)  # static, so even with --no-verify
            progress.stage("write", f"{base / str(version)}")
            if options.verify:
                del archive  # the traced functions hold the model's variables too
                _drop_model(loaded)
                if session is None:
                    selfcheck.static_check(staging, stock)
                    session = selfcheck.InProcessSession(str(staging.resolve()))
                    checked_how = f"TF1 loader in this process; stock TensorFlow {stock} ops, no py_function"
                else:
                    session.path = str(staging.resolve())
                    checked_how = "TF1 loader in a fresh process"
                _self_check(session, golden, manifest, reference is not None)
                progress.stage("check", f"{checked_how}: agrees with eager Keras on the golden record"
                                        + (f" ({len(names)} signatures)" if len(names) > 1 else ""))
                if reference_entry is not None:
                    reference_entry["links"][refs.LINKS[1]] = "passed"
                    layout.write_manifest(staging, {**manifest, "reference": reference_entry})  # the model is gone
        finally:
            if session is not None:
                session.close()

    first = golden.signatures[0]
    return ExportResult(path=base / str(version), version=version, signature_name=first.plan.name,
                        inputs=golden.specs, outputs=first.out_dtypes, policy=loaded.policy,
                        source_format=loaded.format, checked=options.verify, checked_how=checked_how,
                        stage_seconds=progress.times,
                        findings=findings, reference=reference_entry,
                        signatures=[_summary_signature(r) for r in golden.signatures])


def _drop_model(loaded) -> None:
    """The check needs only the written files and the golden record: the model (its weights, its traced graphs) goes
    before the SavedModel's own copy is restored. Keras objects hold each other in cycles, so only a full collection
    frees them (~0.2 s; MobileNetV2's export peaks 40 MB lower)."""
    loaded.model = None
    gc.collect()


def _self_check(session, golden: GoldenRecord, manifest: dict, with_reference: bool = False) -> None:
    """The TF-Serving-equivalent load must reproduce the eager outputs, signature by signature; otherwise the
    export fails. `session`: selfcheck.InProcessSession, or the session runtime (fresh process)."""
    session.load()
    problems = []
    for record in golden.signatures:
        tolerances = manifest["signatures"][record.plan.name]["tolerances"]
        session.use_signature(record.plan.name, {})
        actual = [session.run(batch) for batch in record.inputs]
        results = compare_batches(record.outputs, actual, lambda key, dtype: Tolerance(**tolerances[key]))
        problems += [f"signature '{record.plan.name}' output '{r.key}': {r.reason} (max abs err {r.max_abs_err})"
                     for r in results if not r.passed]
    if problems:
        link = f"link {refs.LINKS[1]} (TF1 loader, as TF Serving loads it) broke: " if with_reference else ""
        raise CheckFailed(f"{link}the exported SavedModel does not reproduce eager Keras: {'; '.join(problems)}",
                          "the version was not written; re-run with --debug, or --no-verify to keep it for inspection")


def render_summary(result: ExportResult) -> str:
    lines = [f"exported {result.path} (version {result.version}, from {result.source_format}, policy {result.policy})"]
    for entry in result.signatures:
        method = entry["method"].rpartition("/")[2]
        lines.append(f"signature '{entry['name']}' ({method}{', tf.Example' if entry['input'] == 'examples' else ''}):")
        for key, spec in entry["inputs"].items():
            lines.append(f"  input   {key:<24} {spec['dtype']:<9} {spec['shape']}")
        for key, dtype in entry["outputs"].items():
            lines.append(f"  output  {key:<24} {dtype}")
    lines.append(f"self-check: passed ({result.checked_how})" if result.checked else "self-check: skipped (--no-verify)")
    if result.reference:
        links = ", ".join(f"{link} {verdict}" for link, verdict in result.reference["links"].items())
        lines.append(f"training-time reference: {result.reference['path']} ({links})")
    lines += [f"{f.severity}: {f.code}: {f.message}" for f in result.findings if f.severity == "warning"]
    lines += ["", export_verdict(result)]
    return "\n".join(lines)


def export_verdict(result: ExportResult) -> str:
    """The last line: what was written and whether the TF-Serving-style load reproduced eager Keras."""
    outputs = sum(len(entry["outputs"]) for entry in result.signatures)
    where = f"{result.path} (version {result.version})"
    if not result.checked:
        return f"EXPORTED {where}, not checked (--no-verify): run `exportkit verify {result.path}`"
    noun = f"{len(result.signatures)} signature{'s' if len(result.signatures) != 1 else ''}"
    warnings = sum(1 for f in result.findings if f.severity == "warning")
    return (f"PASSED: exported {where}; loaded as TF Serving loads it, it reproduces eager Keras on {outputs} "
            f"output{'s' if outputs != 1 else ''} of {noun}" + (f"; {warnings} warning{'s' if warnings != 1 else ''}"
                                                                 if warnings else ""))


def summary_json(result: ExportResult) -> dict:
    return {"schema_version": SCHEMA_VERSION, "path": str(result.path), "version": result.version, "signature_name": result.signature_name,
            "inputs": {s.key: {"dtype": s.dtype, "shape": s.shape} for s in result.inputs},
            "outputs": {k: {"dtype": d} for k, d in result.outputs.items()}, "dtype_policy": result.policy,
            "source_format": result.source_format, "self_check": "passed" if result.checked else "skipped",
            "self_check_how": result.checked_how or None,
            "reference": result.reference, "findings": [f.to_dict() for f in result.findings],
            "stage_seconds": {k: round(v, 3) for k, v in result.stage_seconds.items()},
            "signatures": result.signatures}


def export_command(options: ExportOptions, *, json_out=None, html=None, summary=None) -> int:
    """The CLI's export: export_model, its summary printed and the report files written where the flags say."""
    from exportkit.report.artifacts import check_report_options, write_export
    from exportkit.verify.report import shorten

    check_report_options(html, summary)
    if options.output_origin:
        print(f"exportkit: no -o given: exporting to {options.output} ({options.output_origin})", file=sys.stderr,
              flush=True)
    try:
        result = export_model(options)
    except ExportkitError as err:  # the report says what failed; the error itself goes on as it would
        if html or summary:
            write_export(None, f"FAILED: {shorten(err.message, 180)}", False, html, summary, (err.message, err.remedy))
        raise
    print_report(render_summary(result), summary_json(result), json_out)
    write_export(summary_json(result), export_verdict(result), True, html, summary)
    return 0
