"""exportkit export: load -> build -> audit (custom-object contracts, training-time reference) -> trace -> write -> check,
with one progress line per stage."""
from __future__ import annotations

import dataclasses
import gc
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from exportkit import storage
from exportkit.savedmodel import layout
from exportkit.savedmodel.manifest import write_manifest
from exportkit.sources import reference as refs
from exportkit.errors import CheckFailed, ExportkitError, UsageError
from exportkit.export import selfcheck
from exportkit.export.golden import GoldenRecord, SignatureRecord, golden_record, tolerances_for
from exportkit.export.manifest import build_manifest
from exportkit.export.report import (ExportResult, export_html, export_markdown, export_verdict, failure_verdict,
                                     render_summary, summary_json)
from exportkit.export import signature as sig
from exportkit.export import writer
from exportkit.findings import Finding, has_errors
from exportkit.runtimes.factory import RuntimeSpec, build
from exportkit.runtimes.loop import BatchLoop
from exportkit.sources.int_ranges import int_ranges_for
from exportkit.sources.kerases import prepare_process
from exportkit.sources.load import load_source, sha256_of, source_format
from exportkit.sources.model_io import model_input_specs, parse_input_spec
from exportkit.options.export import ExportOptions
from exportkit.tfenv import import_tf, tensorflow_version
from exportkit.compare.outputs import compare_batches, compare_with_default_tolerances
from exportkit.compare.tolerances import Tolerance, default_tolerance
from exportkit.inputs.spec import InputSpec


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
    write_manifest(staging, manifest)


def _summary_signature(record: SignatureRecord) -> dict:
    return {"name": record.plan.name, "method": record.plan.method_name, "input": record.plan.input,
            "inputs": record.input_specs, "outputs": dict(record.out_dtypes)}


def export_model(options: ExportOptions, progress: Progress | None = None) -> ExportResult:
    progress = progress or Progress()
    if storage.is_url(options.output):
        return _export_to_bucket(options, progress)
    return _export(options, progress)


def _export_to_bucket(options: ExportOptions, progress: Progress) -> ExportResult:
    """-o gs://.../NAME: the version is built and self-checked in a local temporary base directory named NAME, as
    any export, then published into the bucket (storage.publish_dir: TF Serving's poller never sees it
    half-written; docs/export.md)."""
    storage.require_bucket(options.output, "-o")
    url = options.output.rstrip("/")
    if not storage.exists(storage.bucket(url)):
        raise storage.not_found(url, "-o")  # before anything is loaded: says the bucket does not exist
    version = writer.choose_version(url, options.version)  # before anything is loaded, as on disk
    with tempfile.TemporaryDirectory(prefix="exportkit-export-") as tmp:
        local = dataclasses.replace(options, output=str(Path(tmp) / storage.name(url)), version=version)
        result = _export(local, progress, published=storage.join(url, str(version)))
        storage.publish_dir(result.path, storage.join(url, str(version)))
    progress.stage("publish", storage.join(url, str(version)))
    return dataclasses.replace(result, path=storage.join(url, str(version)))


def _export(options: ExportOptions, progress: Progress, published: str | None = None) -> ExportResult:
    """The export into a local base directory (`published`: the bucket URL the version goes to afterwards)."""
    # Everything that can be checked without TensorFlow is checked first; an existing version is never touched.
    base = Path(options.output)
    writer.choose_version(base, options.version)
    overrides = [parse_input_spec(text) for text in options.input_specs]
    assets = writer.check_assets(options.assets)
    from exportkit.serving.warmup import warmup_batch_sizes

    warmup_sizes = warmup_batch_sizes(options.batching_parameters)  # a bad file fails before anything is loaded
    # before TensorFlow is imported: which Keras `tf.keras` means in the user's modules
    prepare_process(options.source, source_format(options.source))

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
            progress.stage("load", f"{loaded.format} {storage.display(options.source.src)} (policy {loaded.policy})")

            specs = model_input_specs(loaded.model, overrides)
            reference, reference_inputs = _load_reference(options, specs)
            int_ranges = int_ranges_for(loaded.model, specs, options.int_range)
            golden = golden_record(loaded.model, specs, options, int_ranges, reference_inputs)
            names = [r.plan.name for r in golden.signatures]
            progress.stage("build", f"{len(golden.specs)} input(s), {len(golden.keys)} output(s), golden record of "
                                    f"{len(golden.inputs)} batches" + (
                                        f" (integers: {int_ranges.describe()})" if int_ranges.by_input else ""))

            tolerances = tolerances_for(loaded.policy, golden.raw_dtypes, golden.keys)
            findings = _check_contracts(loaded, golden, options, progress)
            reference_entry = _check_trained(reference, golden, tolerances) if reference is not None else None
            progress.stage("audit", "custom objects rebuild from their configs" + (
                f"; {refs.LINKS[0]} agrees on the training-time reference" if reference is not None else ""))

            archive = _archive(loaded, golden, options, assets)
            progress.stage("trace", f"signature{'s' if len(names) > 1 else ''} {', '.join(repr(n) for n in names)}")

            manifest = build_manifest(loaded, golden, options, reference_entry)
            if warmup_sizes:
                manifest["warmup_batch_sizes"] = warmup_sizes  # --batching-parameters' allowed_batch_sizes
            _write_version(staging, archive, loaded, golden, options, base.resolve().name, manifest, reference)
            selfcheck.external_files_check(staging)  # static, so even with --no-verify
            findings = findings + selfcheck.xla_check(staging, options.server_flags)
            progress.stage("write", f"{base / str(version)}" + (f" (to publish as {published})" if published else ""))
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
                    write_manifest(staging, {**manifest, "reference": reference_entry})  # the model is gone
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
    loop = BatchLoop(session, timed=False)
    for record in golden.signatures:
        tolerances = manifest["signatures"][record.plan.name]["tolerances"]
        session.use_signature(record.plan.name, {})
        actual = [loop.run(batch) for batch in record.inputs]
        results = compare_batches(record.outputs, actual, lambda key, dtype: Tolerance(**tolerances[key]))
        problems += [f"signature '{record.plan.name}' output '{r.key}': {r.reason} (max abs err {r.max_abs_err})"
                     for r in results if not r.passed]
    if problems:
        link = f"link {refs.LINKS[1]} (TF1 loader, as TF Serving loads it) broke: " if with_reference else ""
        raise CheckFailed(f"{link}the exported SavedModel does not reproduce eager Keras: {'; '.join(problems)}",
                          "the version was not written; re-run with --debug, or --no-verify to keep it for inspection")


def export_command(options: ExportOptions, *, json_out=None, html=None, summary=None) -> int:
    """The CLI's export: export_model, its summary printed and the report files written where the flags say."""
    from exportkit.report.artifacts import check_report_options, print_report, write_report_files

    check_report_options(html, summary)
    if options.output_origin:
        print(f"exportkit: no -o given: exporting to {options.output} ({options.output_origin})", file=sys.stderr,
              flush=True)
    try:
        result = export_model(options)
    except ExportkitError as err:  # the report says what failed; the error itself goes on as it would
        if html or summary:
            verdict, error = failure_verdict(err), (err.message, err.remedy)
            write_report_files(html, summary, lambda: export_html(None, verdict, False, error),
                               lambda: export_markdown(None, verdict, False))
        raise
    doc, verdict = summary_json(result), export_verdict(result)
    print_report(render_summary(result), doc, json_out)
    write_report_files(html, summary, lambda: export_html(doc, verdict, True), lambda: export_markdown(doc, verdict, True))
    return result.exit_code
