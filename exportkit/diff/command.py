"""exportkit diff OLD NEW: what a new version changes for the clients of the old one.

    signatures (verify.baseline: can every client of OLD call NEW?) -> the same inputs through both versions
    (generated/golden batches, or --data records streamed as verify --data streams them) -> per output the
    streamed changes (data.changes.ChangeStats) -> gates -> report (diff/report.py)

Both versions run in the serving-equivalent session runtime, each in its own worker process (the TF1 loader TF
Serving uses, no user code, one model load per process; on Beam one load per worker), or OLD is the deployed
model (`--serving HOST:PORT`, its signatures from GetModelMetadata).
"""
from __future__ import annotations

import collections
import concurrent.futures
import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from exportkit.data.changes import ChangeStats
from exportkit.data.records import DataSource, Fed, Feeder, data_signature, signature_feed
from exportkit import storage
from exportkit.errors import CheckFailed, InfraError, UsageError
from exportkit.findings import Finding
from exportkit.inputs.npz import batch_bytes
from exportkit.runtimes.loop import BatchLoop
from exportkit.runtimes.wrappers import top1_sources
from exportkit.options.diff import DiffOptions
from exportkit.savedmodel.versions import list_versions, resolve_savedmodel_dir, version_path
from exportkit.signature_constants import REGRESS_METHOD
from exportkit.verify.baseline import compare_signature_sets
from exportkit.verify.dataset import data_pattern
from exportkit.diff.report import DiffReport, Gate, OutputChange, finish_diff, output_change


READ_AHEAD = 32 << 20  # bytes of inputs read ahead of the versions' answers (see _stream)


@dataclass
class Version:
    """One side of the diff: a version dir, or the deployed model (`address`)."""

    label: str  # old | new
    path: Path | None
    signatures: dict
    address: str | None = None

    @property
    def description(self) -> str:
        return f"deployed at {self.address}" if self.address else storage.display(self.path)


def resolve_versions(o: DiffOptions) -> tuple[Path | None, Path]:
    """(OLD version dir or None for --serving, NEW version dir)."""
    if o.serving:
        if len(o.paths) != 1:
            raise UsageError("with --serving HOST:PORT (the deployed OLD version) pass NEW only",
                             "exportkit diff models/ranker/7 --serving localhost:8500")
        if ":" not in o.serving:
            raise UsageError(f"--serving {o.serving!r} is not HOST:PORT", "pass --serving localhost:8500")
        return None, resolve_savedmodel_dir(o.paths[0])
    if len(o.paths) == 1:
        base = o.paths[0] if storage.is_url(o.paths[0]) else Path(storage.local_path(o.paths[0]))
        versions = list_versions(base)
        if len(versions) < 2:
            raise UsageError(f"{base} holds {len(versions)} version(s); a diff needs two",
                             "pass OLD and NEW version directories, or NEW with --serving HOST:PORT")
        return tuple(resolve_savedmodel_dir(version_path(base, v)) for v in versions[-2:])  # `007` is version 7
    if len(o.paths) != 2:
        raise UsageError(f"diff takes OLD and NEW, got {len(o.paths)} paths", "exportkit diff models/ranker/6 models/ranker/7")
    return resolve_savedmodel_dir(o.paths[0]), resolve_savedmodel_dir(o.paths[1])


# -- the command ----------------------------------------------------------------------------------------------


def diff_command(o: DiffOptions) -> int:
    """The CLI's diff: run_diff, rendered where the flags say."""
    from exportkit.report.artifacts import check_report_options

    check_report_options(o.html, o.summary)
    return finish_diff(run_diff(o), o.json_out, o.html, o.summary)


def run_diff(o: DiffOptions) -> DiffReport:
    """The signatures, then both versions' answers on the same inputs, rendered nowhere (the Python API's
    `exportkit.diff` and the CLI call it)."""
    from exportkit.verify.plan import read_model

    old_dir, new_dir = resolve_versions(o)
    _, _, new_signatures = read_model(new_dir)
    new = Version("new", new_dir, new_signatures)
    old = Version("old", old_dir, read_model(old_dir)[2] if old_dir else {}, o.serving)
    data = _data_pattern(o.data, new_dir, old_dir)
    name = _signature(o, data, new.signatures)
    if old.address:  # the deployed version's signatures, as its server reports them
        _runtime(o, old, name, new.signatures).close()
    report = DiffReport(old=old.description, new=new.description, signature=name)
    report.findings = compare_signature_sets(old.signatures, new.signatures)
    if name not in old.signatures:  # a new signature: there are no old answers to compare with
        report.findings.append(Finding("warning", "diff-not-compared", f"signature '{name}' is not in the old version "
                                       f"(it has: {', '.join(old.signatures)}): no answers compared"))
        return report
    signature = new.signatures[name]
    derived = top1_sources(signature)
    measurable(o, name, signature, derived)
    accumulator = functools.partial(ChangeStats, label_key=o.label)
    if o.runner == "beam":
        stats, records, skipped = _beam(o, data, old, new, name, signature, derived, accumulator, report)
    else:
        runtimes = [_runtime(o, old, name, new.signatures, derived)]
        try:
            runtimes.append(_runtime(o, new, name, new.signatures, derived))
        except BaseException:
            runtimes[0].close()
            raise
        stats, records, skipped = _in_process(o, data, new, name, signature, runtimes, accumulator, report)
    report.inputs.update({"records": records, "runner": o.runner, "label": o.label})
    if skipped is not None:
        report.inputs["skipped"] = dict(sorted(skipped.items()))
    regression = signature.get("method") == REGRESS_METHOD
    report.outputs = [output_change(st, report.files, regression) for _, st in sorted(stats.items())]
    report.gates = gates(report.outputs, o.max_changed_top1, o.max_abs_change, o.min_metric_delta)
    report.gates += memory_gates(report.memory)
    measured(o, report)
    return report


def _data_pattern(data: str | None, new_dir: Path, old_dir: Path | None) -> str | None:
    """--data GLOB, or `warmup`: NEW's warm-up file (else OLD's)."""
    from exportkit.savedmodel.layout import warmup_path

    if data != "warmup" or old_dir is None or warmup_path(new_dir).is_file():
        return data and data_pattern(data, new_dir)
    return data_pattern(data, old_dir)


def _signature(o: DiffOptions, data: str | None, signatures: dict) -> str:
    """--signature, else the one the first PredictionLog names, else serving_default (or the only one)."""
    name = o.signature_name or data_signature(data, signatures, list(signatures))
    if name not in signatures:
        raise UsageError(f"the new version has no signature '{name}' (it has: {', '.join(signatures)})",
                         "pass --signature NAME")
    return name


def _spec(o: DiffOptions, version: Version, name: str, signatures: dict, derived: dict | None = None):
    """A version's runtime: the session runtime of its dir (a worker of its own), or the deployed server; with
    `derived`, its answers also hold their top-1 (runtimes.wrappers.Top1Outputs)."""
    from exportkit.runtimes.factory import RuntimeSpec, ServerSpec

    if version.address:
        return RuntimeSpec("serving", None, name, o.device, label=version.label, signatures=signatures, top1=derived,
                           server=ServerSpec(version.address, o.model_name, o.model_version,
                                             load_timeout=o.load_timeout))
    return RuntimeSpec("session", str(version.path), name, o.device, label=version.label, top1=derived)


def _runtime(o: DiffOptions, version: Version, name: str, signatures: dict, derived: dict | None = None):
    """A version's runtime, started; the deployed server's is loaded, and its signatures (GetModelMetadata) become
    the version's."""
    from exportkit.runtimes.factory import build

    runtime = build(_spec(o, version, name, signatures, derived))
    if not version.address:
        runtime.start()
        return runtime
    try:
        runtime.load()
        version.signatures = getattr(runtime, "inner", runtime).served_signatures()
    except BaseException:
        runtime.close()
        raise
    for key, sig in version.signatures.items():  # metadata has no method name: the request API is NEW's
        sig.setdefault("method", (signatures.get(key) or {}).get("method"))
    return runtime


def _feeder(o: DiffOptions, data: str, new: Version, name: str, signature: dict):
    from exportkit.tfexample.signatures import input_specs
    from exportkit.savedmodel.reader import read_saved_model_proto, select_meta_graph

    specs = input_specs(select_meta_graph(read_saved_model_proto(new.path)), name, signature, new.path)
    source = DataSource(data, specs, batch_size=o.batch_size, sample=o.sample, seed=o.seed, limit=o.limit)
    example_key, replayer = signature_feed(source, specs, name, signature, new.signatures, o.model_name)
    if replayer is not None:  # TF Serving's request logs carry its answers too: a diff compares the versions only
        replayer.responses = False
    return source, Feeder(source, specs, example_key, replayer)


def _generated(o: DiffOptions, new: Version, name: str):
    """Without --data: NEW's golden batches and generated ones (as verify makes them), as Fed batches."""
    from exportkit.inputs.ranges import IntRangeFlags
    from exportkit.savedmodel.int_ranges import savedmodel_int_ranges
    from exportkit.savedmodel.manifest import read_manifest
    from exportkit.savedmodel.reader import read_saved_model_proto, select_meta_graph
    from exportkit.verify.plan import signature_checks

    manifest, _ = read_manifest(new.path)
    # what NEW's export recorded, else what its graph bounds (a Hugging Face SavedModel's token_type_ids: 0:2)
    meta_graph = None if manifest and manifest.golden else select_meta_graph(read_saved_model_proto(new.path))
    lo_hi = savedmodel_int_ranges(IntRangeFlags(), manifest, meta_graph, new.signatures)
    (check,) = signature_checks(new.signatures, [name], new.path, manifest, lo_hi, samples=o.samples, seed=o.seed)
    files, start = ["<golden>", "<generated>"], {0: 0, 1: 0}
    batches = []
    for origin, batch in check.batches:
        file_no = 0 if origin == "golden" else 1
        n = len(next(iter(batch.values()))) if batch else 0
        idx = np.arange(start[file_no], start[file_no] + n)
        start[file_no] += n
        examples = batch.get(check.specs[0].key) if check.specs and check.specs[0].examples else None
        batches.append(Fed(batch, np.full(n, file_no), idx, np.full(n, -1), np.arange(n), examples=examples))
    return files, batches


def _in_process(o, data, new, name, signature, runtimes, accumulator, report):
    from exportkit.verify.memory import measure_diff

    try:
        streamed = _stream(o, data, new, name, signature, runtimes, accumulator, report)
        # NEW's memory and the swap (OLD loaded beside it in NEW's worker), read before the workers close
        report.memory = measure_diff(runtimes[0], runtimes[1], new.path,
                                     {"max_memory": o.max_memory, "max_swap_memory": o.max_swap_memory})
        return streamed
    finally:
        for runtime in runtimes:
            try:
                runtime.close()
            except Exception:  # closing must never hide the verdict
                pass


def _stream(o, data, new, name, signature, runtimes, accumulator, report):
    """Batch after batch through both versions into the per-output statistics."""
    stats: dict[str, ChangeStats] = {}
    feeder = None
    if data:
        source, feeder = _feeder(o, data, new, name, signature)
        files, fed_batches = source.files, (feeder.fed(b) for b in source.batches())
        report.inputs.update({"source": "data", "path": o.data, "files": len(files)})
    else:
        files, fed_batches = _generated(o, new, name)
        report.inputs.update({"source": "golden+generated", "seed": o.seed})
    report.files = files
    records = 0
    # The two worker processes answer batches while this process reads the next ones: one thread per runtime, so
    # each runtime gets its batches one after the other. Reading goes on up to READ_AHEAD bytes of inputs ahead of
    # the answers, so that it overlaps the workers' start (TensorFlow's import and the loads: ~3 s of 1M records).
    pools = [concurrent.futures.ThreadPoolExecutor(max_workers=1) for _ in runtimes]
    loops = [BatchLoop(runtime, timed=False) for runtime in runtimes]
    try:
        loads = [pool.submit(loop.load) for pool, loop in zip(pools, loops)]
        pending, ahead = collections.deque(), 0  # (the batch, its two answers to come, its bytes), oldest first
        for fed in (f for f in fed_batches if len(f)):
            size = batch_bytes(fed.inputs)
            pending.append((fed, [pool.submit(_run, loop, fed.inputs) for pool, loop in zip(pools, loops)], size))
            ahead += size
            while pending and (ahead > READ_AHEAD or all(f.done() for f in pending[0][1])):
                for load in loads:  # a failed load is said as such, not as its batches' failure
                    load.result()
                done, answers, size = pending.popleft()
                records += _add(stats, accumulator, done, *(f.result() for f in answers))
                ahead -= size
        for load in loads:
            load.result()
        for done, answers, _ in pending:
            records += _add(stats, accumulator, done, *(f.result() for f in answers))
    finally:
        for pool in pools:
            pool.shutdown(cancel_futures=True)
    _no_records(records, o, feeder.replayer if feeder else None)
    return stats, records, (feeder.replayer.skipped if feeder and feeder.replayer else None)


def _add(stats: dict, accumulator, fed: Fed, old_out: dict, new_out: dict) -> int:
    """One batch's answers of both versions into the per-output statistics; returns its record count."""
    for key in sorted(set(old_out) | set(new_out)):
        if key not in stats:
            stats[key] = accumulator(key)
        stats[key].add(old_out.get(key), new_out.get(key), fed.file_nos, fed.indices, fed.offsets, fed.examples)
    return len(fed)


def _run(loop: BatchLoop, inputs) -> dict:
    """One batch through one version; a version that cannot answer is the model's failure (exit 1)."""
    try:
        return loop.run(inputs)
    except (CheckFailed, InfraError, UsageError):
        raise
    except Exception as err:
        first = (str(err).strip().splitlines() or [""])[0]
        raise CheckFailed(f"the {loop.runtime.name} runtime failed: {type(err).__name__}: {first}",
                          "run `exportkit verify` on that version") from None


def _no_records(records: int, o: DiffOptions, replayer) -> None:
    if records:
        return
    skipped = replayer.skipped_text() if replayer else ""
    raise UsageError(f"--data {o.data!r}: no records to compare" + (f" (skipped: {skipped})" if skipped else ""),
                     "pass records of the signature's inputs (--signature NAME, --model-name NAME)")


def _beam(o, data, old, new, name, signature, derived, accumulator, report):
    if not data:
        raise UsageError("--runner beam needs --data GLOB", "pass --data, or leave --runner out")
    try:
        from exportkit.data.beam import BeamPlan, run_pipeline
    except ModuleNotFoundError as err:
        if not (err.name or "").startswith("apache_beam"):
            raise
        raise UsageError("--runner beam needs Apache Beam", "pip install 'exportkit[beam]'") from None
    source, feeder = _feeder(o, data, new, name, signature)
    report.files = source.files
    report.inputs.update({"source": "data", "path": o.data, "files": len(source.files)})

    specs = [_spec(o, version, name, new.signatures, derived) for version in (old, new)]
    plan = BeamPlan(source=source, example_key=feeder.example_key, runtimes=specs, tolerances={},
                    replayer=feeder.replayer, accumulator=accumulator)
    stats, records = run_pipeline(plan, o.beam_options)
    _no_records(records, o, feeder.replayer)
    return ({key: st for (label, key), st in stats.items() if label == "new"}, records,
            feeder.replayer.skipped if feeder.replayer else None)


# -- the gates ------------------------------------------------------------------------------------------------


def _outputs_text(signature: dict) -> str:
    return ", ".join(f"{k} {t.get('dtype')} {t.get('shape')}" for k, t in sorted(signature["outputs"].items()))


def _numeric(t: dict) -> bool:
    return t.get("dtype") not in (None, "string", "bool")


def measurable(o: DiffOptions, name: str, signature: dict, derived: dict) -> None:
    """Before anything runs: every gate asked for has an output of NEW's signature to measure (a top-1, a number,
    a one-value output or a top-1 for a metric), else a usage error naming what is missing. A gate that measures
    nothing must not pass."""
    outputs = signature["outputs"]
    where = f"signature '{name}' (outputs: {_outputs_text(signature)})"
    if o.max_changed_top1 is not None and not derived:
        raise UsageError(f"--max-changed-top1 has nothing to measure: {where} has no top-1 output (a [batch, k >= 2] "
                         f"float output, or classes)",
                         "gate its numbers with --max-abs-change p99=VALUE, or leave --max-changed-top1 out")
    if o.max_abs_change and not any(_numeric(t) for t in outputs.values()):
        raise UsageError(f"--max-abs-change has nothing to measure: {where} has no numeric output",
                         "gate its top-1 with --max-changed-top1 1%, or leave --max-abs-change out")
    one_value = [k for k, t in outputs.items() if _numeric(t) and t.get("shape") is not None
                 and len(t["shape"]) in (1, 2) and t["shape"][1:] in ([], [1])]
    if o.min_metric_delta is not None and not derived and not one_value:
        raise UsageError(f"--min-metric-delta has nothing to measure: {where} has no top-1 output (accuracy) and no "
                         f"one-value output (AUC, mean squared error)",
                         "gate its answers with --max-abs-change or --max-changed-top1, or leave --min-metric-delta out")


def measured(o: DiffOptions, report: DiffReport) -> None:
    """After the run: every gate asked for measured at least one output, else a usage error saying why not."""
    names = {g.name.split(" ")[0] for g in report.gates}
    compared = report.inputs.get("records")
    if o.max_changed_top1 is not None and "max-changed-top1" not in names:
        raise UsageError(f"--max-changed-top1 has nothing to measure: no top-1 output was answered by both versions "
                         f"({', '.join(c.key + ': ' + (c.problem or c.kind) for c in report.outputs)})",
                         "gate outputs both versions answer, or leave --max-changed-top1 out")
    if o.max_abs_change and "max-abs-change" not in names:
        raise UsageError("--max-abs-change has nothing to measure: no numeric output was answered by both versions",
                         "gate outputs both versions answer, or leave --max-abs-change out")
    if o.min_metric_delta is not None and "min-metric-delta" not in names:
        metric = next((c.metric for c in report.outputs if c.metric), None)
        why = (f"none of the {compared} records compared has the label feature '{o.label}'" if metric is None else
               f"its {metric['name']} is undefined on these labels (AUC needs both labels 0 and 1)")
        raise UsageError(f"--min-metric-delta has nothing to measure: {why}",
                         "pass --data records whose tf.Examples carry the label, and --label with its feature name")


def memory_gates(memory: dict | None) -> list[Gate]:
    """--max-memory on NEW's peak, --max-swap-memory on the swap's (bytes; verify/memory.py measures them)."""
    if not memory:
        return []
    limits, found = memory["limits"], []
    if limits.get("max_memory_bytes") is not None:
        found += [Gate("max-memory", f"{row['runtime']} peak", limits["max_memory_bytes"], row["peak_bytes"],
                       row["peak_bytes"] <= limits["max_memory_bytes"]) for row in memory["measured"]]
    swap = memory.get("swap") or {}
    if limits.get("max_swap_memory_bytes") is not None and swap.get("peak_bytes") is not None:
        found.append(Gate("max-swap-memory", "swap peak (old and new loaded)", limits["max_swap_memory_bytes"],
                          swap["peak_bytes"], swap["peak_bytes"] <= limits["max_swap_memory_bytes"]))
    return found


def gates(outputs: list[OutputChange], share: float | None, abs_gates: dict[str, float],
          min_metric_delta: float | None) -> list[Gate]:
    """Each gate against every output it applies to (pure). An output one version lacks, or whose shape changed, is
    not measured (its changed share would read 0; the signature comparison fails the diff for it)."""
    result = []
    for c in outputs:
        if c.problem:
            continue
        if share is not None and c.top1_changed_share is not None:
            result.append(Gate("max-changed-top1", c.key, share, c.top1_changed_share,
                               c.top1_changed_share <= share))
        for q, limit in abs_gates.items():
            value = (c.abs_change or {}).get(q)
            if value is not None:
                result.append(Gate(f"max-abs-change {q}", c.key, limit, value, value <= limit))
        if min_metric_delta is not None and c.metric and c.metric.get("gain") is not None:
            result.append(Gate(f"min-metric-delta ({c.metric['name']})", c.key, min_metric_delta, c.metric["gain"],
                               c.metric["gain"] >= min_metric_delta))
    return result
