"""verify --data: every runtime over the records of a dataset, compared batch by batch with the reference and
accumulated in streaming statistics (exportkit.compare.stats), so memory stays flat however many records there are.

In-process (default): one batch at a time goes through every runtime in the same order, then is dropped.
`--runner beam`: the same batches and statistics as an Apache Beam pipeline (exportkit.data.beam).
"""
from __future__ import annotations

import math
import time

import numpy as np

from exportkit.data.records import DataSource, Feeder, FailureWriter, data_signature, signature_feed
from exportkit.data.predictionlog import LOGGED
from exportkit.compare.stats import OutputStats, compare_into
from exportkit.errors import CheckFailed, InfraError, UsageError
from exportkit.savedmodel.manifest import signature_entries
from exportkit.options.verify import VerifyOptions
from exportkit.verify.checks import serving_checks, signature_message_sizes
from exportkit.compare.outputs import streamed_comparison
from exportkit.runtimes.loop import BatchLoop
from exportkit.verify.execute import started
from exportkit.compare.finite import NonFiniteCounter
from exportkit.verify.latency import latency_findings, latency_summary
from exportkit.verify.plan import Model, Plan, SignatureCheck, plan_runtimes, tolerances_for
from exportkit.verify.report import RuntimeResult, VerifyReport
from exportkit.log import log

PROGRESS_EVERY = 5.0  # seconds between progress lines on stderr (a short run prints none)
SHOWN_WORST = 5


def check_data_options(o: VerifyOptions, devices: list[str]) -> None:
    """Flags that make no sense with --data, refused before anything starts."""
    clashes = [flag for flag, value in (("--inputs", o.inputs), ("--save-inputs", o.save_inputs),
                                        ("--save-outputs", o.save_outputs), ("--reference", o.reference)) if value]
    if clashes:
        raise UsageError(f"--data cannot be combined with {', '.join(clashes)}",
                         "the records are the inputs; use --save-failures DIR to keep the failing ones")
    if len(devices) > 1:
        raise UsageError("--data runs on one device", "pass --device cpu or --device gpu")
    if o.runner not in ("in-process", "beam"):
        raise UsageError(f"--runner {o.runner!r} is not in-process or beam", "pass --runner beam, or leave it out")
    if o.runner == "beam" and o.save_failures:
        raise UsageError("--save-failures is not supported with --runner beam yet",
                         "re-run the worst records (listed with their file and index) in-process with --save-failures")


def verify_data(o: VerifyOptions, report: VerifyReport, model: Model, names, devices, per_output) -> None:
    """--data streams records of one signature's inputs (--signature NAME, else serving_default or the only one)
    into `report`."""
    import dataclasses

    from exportkit.tfexample.signatures import input_specs
    from exportkit.savedmodel.reader import select_meta_graph

    version_dir, signatures, selected = model.version_dir, model.signatures, model.selected
    pattern = data_pattern(o.data, version_dir)
    name = o.signature_name or data_signature(pattern, signatures, selected)
    if name not in signatures:
        raise UsageError(f"--data needs one signature, and there is no '{name}' (available: {', '.join(signatures)})",
                         "pass --signature NAME for the signature the records are inputs of")
    o = dataclasses.replace(o, signature_name=name)
    report.signature, report.signatures = name, [name]
    signature = signatures[name]
    specs = input_specs(select_meta_graph(model.proto), name, signature, version_dir)  # tf.Example inputs found here
    tolerance = tolerances_for(o.atol, o.rtol, per_output, signature_entries(model.manifest).get(name))
    check_data_options(o, devices)
    source = DataSource(pattern, specs, batch_size=o.batch_size, sample=o.sample, seed=o.seed, limit=o.limit)
    example_key, replayer = signature_feed(source, specs, name, signature, signatures, o.model_name)
    logs = replayer is not None
    names = [n for n in names if n not in ("golden", "trained")]  # recorded outputs exist only for their inputs
    tolerances = {k: _tol(tolerance(k, v["dtype"])) for k, v in signature["outputs"].items()}
    report.inputs = {"source": "data", "path": o.data, "files": len(source.files), "batch_size": o.batch_size,
                     "sample": o.sample, "seed": o.seed if o.sample else None, "limit": o.limit, "runner": o.runner,
                     "examples": example_key is not None}
    if logs:
        report.inputs["prediction_logs"] = True
    if o.runner == "beam":
        stats, records, results, skipped = _run_beam(o, source, version_dir, specs, signature, names, example_key,
                                                     tolerances, devices[0], replayer)
    else:
        stats, records, results = _run_in_process(o, source, version_dir, specs, signature, names, devices,
                                                  example_key, tolerances, report, replayer)
        skipped = replayer.skipped if replayer else {}
    report.runtimes = results
    report.inputs["records"] = records
    if logs:
        report.inputs["skipped"] = dict(sorted(skipped.items()))
    _attach(report, stats, source)
    report.findings += latency_findings(report.runtimes, o.max_latency_ms)


def _tol(t) -> tuple[float, float]:
    return (float(t.atol), float(t.rtol))


def data_pattern(data: str, version_dir) -> str:
    """--data GLOB, or `warmup`: the SavedModel's own warm-up file (PredictionLog records TF Serving replays)."""
    from exportkit.savedmodel.layout import warmup_path

    if data != "warmup":
        return data
    path = warmup_path(version_dir)
    if not path.is_file():
        raise UsageError(f"--data warmup: {version_dir} has no warm-up file ({path})",
                         "export with warm-up records, or pass --data GLOB of PredictionLog or tf.Example records")
    return str(path)


def _run_in_process(o, source, version_dir, specs, signature, names, devices, example_key, tolerances, report,
                    replayer=None):
    feed = Feeder(source, specs, example_key, replayer)  # before any runtime starts: a bad --data fails fast
    writer = FailureWriter(o.save_failures, source) if o.save_failures else None  # so does a bad --save-failures
    plan = _plan(o, version_dir, specs, signature, names, devices)
    with started(o, plan, parse_examples=example_key) as runtimes_:
        return _stream(o, source, signature, runtimes_, feed, writer, example_key, tolerances, version_dir, report)


def _plan(o, version_dir, specs, signature, names, devices) -> Plan:
    """The runtimes of `names` over the one signature the records are inputs of."""
    output_dtypes = {k: v["dtype"] for k, v in signature["outputs"].items()}
    check = SignatureCheck(o.signature_name, signature.get("method") or "", specs, output_dtypes, {})
    return Plan(version_dir, devices, [check], plan_runtimes(names, devices), [], signatures={check.name: signature})


def _stream(o, source, signature, runtimes_, feed, writer, example_key, tolerances, version_dir, report):
    """Batch after batch through every live runtime, compared with the first (the reference) into the statistics."""
    from exportkit.runtimes.wrappers import ExampleParsing

    parsing = [item.runtime for item in runtimes_ if isinstance(item.runtime, ExampleParsing)]
    loops = {item.label: BatchLoop(item.runtime) for item in runtimes_}
    results = {item.label: RuntimeResult(name=item.label, kind=item.runtime.kind, device=item.runtime.device)
               for item in runtimes_}
    logged = RuntimeResult(name=LOGGED, kind="recorded", device=None)  # the answers the logs carry, if any
    stats: dict[tuple[str, str], OutputStats] = {}
    nonfinite = NonFiniteCounter()
    records, completed = 0, False
    sampled = {}  # rows -> (inputs, the reference's answer) of the first batch of that size: the message sizes
    try:
        live = [item for item in runtimes_ if _timed(results[item.label], lambda: loops[item.label].load() or True)]
        progress = _Progress(source, o.limit)
        for batch in source.batches():
            fed = feed.fed(batch)
            progress.update(records)
            if not len(fed):
                continue  # every log of the batch was skipped
            inputs = fed.inputs
            for runtime in parsing:
                runtime.name_record = lambda row, b=fed: source.where(b.file_nos[row], int(b.indices[row]))
            outputs = {}
            for item in list(live):
                out = _timed(results[item.label], lambda: loops[item.label].run(inputs))
                if out is None:
                    live.remove(item)
                else:
                    outputs[item.label] = out
                    nonfinite.add(item.label, out, records)
            if not live or live[0].label not in outputs:
                break  # no reference left
            reference = live[0].label
            sampled.setdefault(len(fed), (inputs, outputs[reference]))
            failing = np.zeros(len(fed), dtype=bool)
            for label, out in outputs.items():
                if label != reference:
                    failing |= compare_into(stats, label, outputs[reference], out, tolerances, fed.file_nos,
                                            fed.indices, fed.offsets)
            if fed.logged is not None:
                rows = fed.logged_rows
                failing[rows] |= compare_into(stats, LOGGED, {k: v[rows] for k, v in outputs[reference].items()},
                                              fed.logged, tolerances, fed.file_nos[rows], fed.indices[rows],
                                              fed.offsets[rows])
            if writer:
                failing_records = np.zeros(len(batch), dtype=bool)
                failing_records[fed.record_of_row[failing]] = True
                writer.write(batch, failing_records)
            records += len(fed)
        progress.done(records)
        report.findings += nonfinite.findings()
        if not records:
            skipped = feed.replayer.skipped_text() if feed.replayer else ""
            raise UsageError(f"--data {o.data!r}: no records" + (" were sampled" if o.sample else "")
                             + (f" (PredictionLog records skipped: {skipped})" if skipped else ""),
                             "pass TFRecord files of tf.Example, PredictionLog or .npz shards that hold records"
                             + (" for this model and signature (--signature NAME, --model-name NAME)" if skipped else ""))
        if live:
            results[live[0].label].is_reference = True
            report.reference = live[0].label
        for item in runtimes_:
            result = results[item.label]
            result.server, result.device = item.runtime.server, item.runtime.placed_on or item.runtime.device
            result.latency = latency_summary(loops[item.label].timings)
        ordered = [results[item.label] for item in runtimes_] + ([logged] if any(k[0] == LOGGED for k in stats) else [])
        report.runtimes = ordered
        serving_checks(runtimes_, {o.signature_name: signature}, [o.signature_name], version_dir,
                       {o.signature_name: ordered}, report)
        signature_message_sizes(o, version_dir, o.signature_name, signature, [i for i, _ in sampled.values()],
                                [a for _, a in sampled.values()], report)
        completed = True
    finally:
        if writer:
            writer.close(commit=completed)
    if writer:
        report.inputs["failures_saved"] = writer.count
    return stats, records, ordered


def _timed(result: RuntimeResult, fn):
    """fn() with its time added to the result; a failure marks the runtime as errored (returns None)."""
    began = time.perf_counter()
    try:
        return fn() if result.status == "ok" else None
    except CheckFailed as err:
        result.status, result.error = "error", str(err)
    except (InfraError, UsageError):
        raise
    except Exception as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        result.status, result.error = "error", f"{type(err).__name__}: {first}"
    finally:
        result.seconds += time.perf_counter() - began
    return None


class _Progress:
    """Records, records per second and an ETA on stderr every few seconds (from --limit, else bytes read)."""

    def __init__(self, source: DataSource, limit: int | None):
        self.source, self.limit = source, limit
        self.total_bytes = source.total_bytes
        self.began = self.last = time.monotonic()
        self.printed = False

    def update(self, records: int) -> None:
        now = time.monotonic()
        if now - self.last < PROGRESS_EVERY:
            return
        self.last = now
        rate = records / max(now - self.began, 1e-9)
        done = records / self.limit if self.limit else self.source.bytes_read / max(self.total_bytes, 1)
        eta = (now - self.began) * (1 - done) / done if done > 0 else math.inf
        eta_text = "?" if math.isinf(eta) else f"{int(eta // 60)}:{int(eta % 60):02d}"
        log.info(f"verify --data: {records} records, {rate:.0f} records/s, {100 * min(done, 1):.0f}%, ETA {eta_text}")
        self.printed = True

    def done(self, records: int) -> None:
        if self.printed:
            elapsed = time.monotonic() - self.began
            log.info(f"verify --data: {records} records in {elapsed:.1f} s")


def _run_beam(o, source, version_dir, specs, signature, names, example_key, tolerances, device, replayer=None):
    try:
        from exportkit.data.beam import BeamPlan, run_pipeline
    except ModuleNotFoundError as err:
        if not (err.name or "").startswith("apache_beam"):
            raise
        raise UsageError("--runner beam needs Apache Beam", "pip install 'exportkit[beam]'") from None
    from exportkit.verify.execute import runtime_spec

    plan = _plan(o, version_dir, specs, signature, names, [device])
    runtime_specs, skipped = [], []
    for planned in plan.runtimes:
        if planned.name == "serving" and ":" not in o.serving:  # workers talk to a deployment, they start no server
            skipped.append(RuntimeResult(name="serving", kind="grpc", status="skipped",
                                         error="Beam workers only talk to a deployment: pass --serving HOST:PORT"))
        elif planned.name in ("keras", "saved_model", "session", "serving"):
            spec = runtime_spec(o, plan, planned)  # the spec verify builds, on a worker without a shared pool
            spec.parse_examples = example_key if planned.name == "keras" else None
            runtime_specs.append(spec)
    if len(runtime_specs) < 2:
        raise UsageError(f"--runner beam needs two runtimes to compare, got {[r.label for r in runtime_specs]}",
                         "pass --against SRC, or --serving HOST:PORT, or --runtimes saved_model,session")
    plan = BeamPlan(source=source, example_key=example_key, runtimes=runtime_specs, tolerances=tolerances,
                    replayer=replayer)
    began = time.perf_counter()
    stats, records = run_pipeline(plan, o.beam_options)
    seconds = time.perf_counter() - began
    kinds = {"keras": "in-process", "saved_model": "in-process", "session": "subprocess", "serving": "grpc"}
    results = [RuntimeResult(name=r.label, kind=kinds[r.name], device=None if r.name == "serving" else device,
                             seconds=seconds, is_reference=(i == 0)) for i, r in enumerate(runtime_specs)]
    if any(label == LOGGED for label, _ in stats):
        results.append(RuntimeResult(name=LOGGED, kind="recorded", seconds=seconds))
    return stats, records, results + skipped, (replayer.skipped if replayer else {})


def _attach(report: VerifyReport, stats: dict, source: DataSource) -> None:
    """The statistics as OutputComparisons of their runtimes (sorted by output key)."""
    by_label = {r.name: r for r in report.runtimes}
    reference = next((r.name for r in report.runtimes if r.is_reference), "")
    report.reference = reference
    for (label, _), st in sorted(stats.items()):
        if label in by_label:
            by_label[label].comparisons.append(streamed_comparison(st, source.files))
