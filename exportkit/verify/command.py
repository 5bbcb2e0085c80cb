"""exportkit verify: the same inputs through every runtime, every runtime compared with the reference.

    static checks -> plan (plan.py) -> execute (execute.py) -> compare (pairs.py over compare.py) -> checks
    (checks.py) -> report (report.py, written out by output.py)

Order of work: every flag is checked first. The TensorFlow worker (saved_model, session and the embedded server:
one import, both loads at once) is started then, so its TensorFlow import overlaps the rest; it loads nothing until
asked. The SavedModel is read and linted (pure protobuf, no TensorFlow import here), so a graph verify refuses to
execute (I/O ops) is refused before any process loads it; then this process plans the batches. This process
imports TensorFlow only for eager Keras (--against).

Every signature is checked (or the one --signature names) through every runtime; each runtime is started and
loaded once and is pointed at one signature after the other. A tf.Example signature exportkit exported is fed
Examples encoded from the very tensor batches its tensor twin gets, and the two must answer the same.
"""
from __future__ import annotations

from exportkit.inputs.ranges import parse_int_range_flags
from exportkit.savedmodel.int_ranges import savedmodel_int_ranges
from exportkit.savedmodel.reader import select_meta_graph
from exportkit import storage
from exportkit.errors import CheckFailed, UsageError
from exportkit.savedmodel.manifest import read_manifest
from exportkit.runtimes import RUNTIME_KINDS
from exportkit.runtimes.session import TfWorker, runs_in_worker
from exportkit.runtimes.verdicts import signature_state, tf2_only_failures
from exportkit.options.verify import VerifyOptions
from exportkit.tfenv import toolchain
from exportkit.verify import checks
from exportkit.report.artifacts import check_report_options
from exportkit.compare.tolerances import parse_tol
from exportkit.verify.dataset import verify_data
from exportkit.verify.execute import Execution, installed_workers, run_plan, started, versioned_pythons
from exportkit.inputs.loader import rows
from exportkit.verify.latency import latency_findings
from exportkit.verify.memory import measure, unmeasured
from exportkit.verify.output import finish, save
from exportkit.verify.pairs import agreement, compare_all
from exportkit.verify.plan import (Model, Plan, check_tol_keys, devices_of, make_plan, protocol_of, read_model,
                                   selected_runtimes, selected_signatures)
from exportkit.verify.report import RuntimeResult, VerifyReport, tensors_of
from exportkit.version import __version__


def verify_command(o: VerifyOptions) -> int:
    """The CLI's verify: the report rendered where the flags say; then a refusal to execute, or an infrastructure
    failure, is raised so that the CLI says why (exit 1 or 3)."""
    check_report_options(o.html, o.summary)
    report = run_verify(o)
    code = finish(report, o)
    if report.stopped is not None:
        raise report.stopped
    return code


def run_verify(o: VerifyOptions) -> VerifyReport:
    """Every check of verify, rendered nowhere: the Python API's `exportkit.verify` and the CLI both call it. A
    model that fails is a report that did not pass; bad usage raises UsageError; `report.stopped` holds why the
    run stopped early (a graph verify refuses to execute, or an infrastructure failure)."""
    devices, names, per_output = _options(o)
    needed = [] if o.data or not runs_in_worker(names, o.serving) else [(device, None, None) for device in devices]
    needed += [("cpu", python, worker) for python, worker in ([] if o.data else installed_workers(o.tf_versions))]
    TfWorker.discard_prestarted(keep=needed)  # one the CLI started for a run that needs none (or another device)
    for device, python, worker in needed:  # their TensorFlow imports overlap the reading and planning below
        TfWorker.prestart(device, python=python, worker=worker)
    try:
        return _verify(o, devices, names, per_output)
    finally:
        TfWorker.discard_prestarted()  # not taken: the model was refused, or its plan needs no worker


def _verify(o: VerifyOptions, devices: list[str], names: list[str], per_output: dict) -> VerifyReport:
    model, report, refused = _read(o, devices, per_output)
    if not model.selected:
        return report
    if refused:  # static findings come first: nothing has loaded the model, nothing runs
        return _refuse(o, report, names, model.manifest)
    # Managed TF X.Y environments next (after the static verdict): a missing one is installed (or exit 3) before
    # any process starts.
    pythons = versioned_pythons(o.tf_versions)
    if o.data:
        verify_data(o, report, model, names, devices, per_output)
        return report

    plan = make_plan(o, model, names, devices, per_output, pythons)
    report.inputs = _inputs_summary(o, plan)
    if o.save_inputs:
        save(o.save_inputs, "--save-inputs", {"inputs" if len(plan.checks) == 1 else f"inputs.{c.name}":
                                              [b for _, b in c.batches] for c in plan.checks})
    report.tf32 = o.allow_tf32 if "gpu" in devices else None
    with started(o, plan) as runtimes_:  # the worker first: it imports TensorFlow while we work here
        execution = run_plan(o, plan, runtimes_)
        checks.serving_checks(runtimes_, model.signatures, model.selected, model.version_dir, execution.results,
                              report, execution.infra)
        report.findings += checks.rejected_inputs_findings(runtimes_)
        checks.dynamic_dims(o, plan.checks, runtimes_, execution.results, report, model.int_range, execution.infra)
        report.findings += tf2_only_failures([r for per in execution.results.values() for r in per])
        checks.message_sizes(o, plan, execution, report)
        # read from the workers' /proc after every run (the peak covers every batch size); the swap loads the
        # version served before beside this one, in the same worker
        report.memory, memory_found = measure(runtimes_, model.version_dir, report.baseline,
                                              {"max_memory": o.max_memory, "max_swap_memory": o.max_swap_memory})
        report.findings += memory_found
        unmeasured(report.memory, names)
        loaded_by = next((p for item in runtimes_ if (p := getattr(item.runtime, "keras_package", None))), None)
        if loaded_by:  # the report names the Keras that rebuilt the training source
            report.toolchain = toolchain(loaded_by)
    _judge(o, plan, execution, report, model)
    report.findings += latency_findings(report.runtimes, o.max_latency_ms)
    if o.save_outputs:
        save(o.save_outputs, "--save-outputs", {label if len(plan.checks) == 1 else f"{label}.{c.name}":
                                                [out for out in per_batch if out is not None]
                                                for c in plan.checks
                                                for label, per_batch in execution.outputs[c.name].items()})
    if execution.infra:  # the report shows what did run; the infrastructure failure decides the exit code
        report.stopped = execution.infra[0]
    return report


def _options(o: VerifyOptions):
    """(devices, runtime names, per-output tolerances): the flags that need no model, checked first."""
    devices = devices_of(o.device)
    if o.baseline and o.no_baseline:
        raise UsageError("--baseline and --no-baseline contradict each other", "pass one of them")
    if o.max_latency_ms is not None and not o.max_latency_ms > 0:
        raise UsageError(f"--max-latency-ms {o.max_latency_ms:g} must be a positive number of milliseconds",
                         "pass --max-latency-ms 50 (for example)")
    if o.data and o.tf_versions:
        raise UsageError("--tf runs on the generated/golden batches, not on --data records (not supported yet)",
                         "run `exportkit verify PATH --tf X.Y` and `exportkit verify PATH --data GLOB` separately")
    names = selected_runtimes(o.runtimes, o.serving, o.against, protocol_of(o.serving_protocol, o.serving))
    if o.data and (o.max_memory or o.max_swap_memory):  # a gate measures what it names, never a silent pass
        gate = "--max-memory" if o.max_memory else "--max-swap-memory"
        raise UsageError(f"{gate} is measured on verify's own batches, which --data does not run",
                         f"run `exportkit verify PATH {gate} SIZE` without --data")
    if o.max_latency_ms is not None and all(RUNTIME_KINDS[n] == "recorded" for n in names):
        raise UsageError(f"--max-latency-ms has nothing to measure: runtimes {', '.join(names)} replay recorded "
                         f"answers and run no model", "add a runtime that runs it (--runtimes session,serving), or "
                                                      "leave --max-latency-ms out")
    if o.against:  # before TensorFlow is imported: which Keras `tf.keras` means in the training code
        from exportkit.sources.kerases import prepare_process
        from exportkit.sources.load import source_format

        prepare_process(o.against, source_format(o.against))
    if "serving" in names or "rest" in names:
        from exportkit.serving.launch.modes import check_serving_mode

        check_serving_mode(o.serving)
    return devices, names, dict(parse_tol(t) for t in o.tol)


def _read(o: VerifyOptions, devices: list[str], per_output: dict):
    """(Model, the report with the static findings, the io-op findings that refuse execution): the SavedModel read
    and linted (pure protobuf, no TensorFlow import, nothing started)."""
    int_range = parse_int_range_flags(o.int_range)  # a bad --int-range fails before the model is read
    version_dir, proto, signatures = read_model(o.path)
    selected = selected_signatures(o.signature_name, signatures)
    findings, refused = checks.static_findings(o, proto, version_dir)
    if selected:
        check_tol_keys(per_output, {k for name in selected for k in signatures[name]["outputs"]})
    if "gpu" in devices and not refused:
        from exportkit.runtimes.local import require_gpu

        require_gpu()  # before any process is started: no GPU is an infrastructure failure (exit 3)
    manifest, manifest_findings = read_manifest(version_dir)
    findings += manifest_findings
    # the ranges the model was exported with fit its integer inputs (e.g. vocabularies), else the ones its graph
    # bounds (a server only gets valid ids); --int-range over them
    lo_hi = savedmodel_int_ranges(int_range, manifest, select_meta_graph(proto), signatures)
    baseline_found, baseline = checks.baseline_findings(o, signatures, selected, version_dir)
    findings += baseline_found
    report = VerifyReport(path=storage.display(version_dir), signature=", ".join(selected) or (o.signature_name or ""),
                          reference="", runtimes=[], findings=list(findings), inputs={}, tf32=None,
                          exportkit_version=__version__, signatures=list(selected),
                          toolchain=toolchain(), server_flags=o.server_flags.argv(), baseline=baseline)
    return Model(version_dir, proto, signatures, selected, manifest, lo_hi), report, refused


def _refuse(o: VerifyOptions, report: VerifyReport, names: list[str], manifest) -> VerifyReport:
    """The graph reaches I/O ops: the report lists every runtime as not run, and says why it stopped (exit 1)."""
    report.inputs = {"source": "none (not run)"}
    maybe_reference = o.reference or (manifest.reference if manifest else None) or o.against
    for name in names:
        if (name == "trained" and not maybe_reference) or (name == "golden" and manifest is None):
            continue  # nothing recorded to look for (dropped the same way in plan.make_plan)
        report.runtimes.append(RuntimeResult(name=name, kind=RUNTIME_KINDS[name], status="skipped",
                                             error="not run: the graph reaches I/O ops (see findings)"))
    report.stopped = CheckFailed("verify did not execute the model: its signatures reach ops that touch files, the "
                                 "network or the console (finding io-op)",
                                 "pass --allow-io-ops to execute it anyway, if you trust the model and where it "
                                 "came from")
    return report


def _inputs_summary(o: VerifyOptions, plan: Plan) -> dict:
    """What the runtimes are fed, for the report's `inputs`."""
    origins = sorted({origin for c in plan.checks for origin in c.origins if origin != "repeat"} | {"generated"},
                     key=["golden", "reference", "file", "generated"].index)  # (generated ones may be golden ones)
    summary = {"source": "+".join(origins), "batch_sizes": [rows(b) for _, b in plan.checks[0].batches],
               "seed": o.seed, "tensors": tensors_of(plan.checks[0].batches[0][1])}
    if plan.trained is not None:
        summary["reference"] = plan.trained.path
    several = len(plan.checks) > 1
    examples = {f"{c.name}.{s.key}" if several else s.key: f"serialized tf.Example ({s.examples.parse_op}: "
                f"{s.examples.describe()})" for c in plan.checks for s in c.specs if s.examples is not None}
    if examples:
        summary["examples"] = examples
    return summary


def _judge(o: VerifyOptions, plan: Plan, execution: Execution, report: VerifyReport, model: Model) -> None:
    """Per signature: the behaviours, then the plan's pairs compared, the reference chain, the twin agreement.

    A stateful signature (its answers depend on earlier calls, runtimes/verdicts.py): the outputs that do differ
    between runs are left out of the comparisons, and the finding says the cause is state."""
    by_name = {c.name: c for c in plan.checks}
    stateful = signature_state(select_meta_graph(model.proto), [c.name for c in plan.checks])
    for c in plan.checks:
        outputs = execution.outputs[c.name]
        state = stateful.get(c.name)
        if state is not None and not state.writes:  # another signature's calls changed what it reads
            report.findings.append(state.finding)
            for label in outputs:
                outputs[label] = [None] * len(c.batches)
        sub = VerifyReport(path=report.path, signature=c.name, reference="", runtimes=execution.results[c.name])
        before = len(report.findings)
        noisy = checks.behaviours(report, outputs, c.batches, c.tolerance, o.allow_nondeterministic or state is not None,
                                 c.output_dtypes, c.name if len(plan.checks) > 1 else None)
        if noisy and state is not None:  # the cause is state, not randomness: say so instead
            report.findings[before:] = [f for f in report.findings[before:] if f.code != "nondeterministic"]
            report.findings.append(state.finding)
        if noisy and (o.allow_nondeterministic or state is not None):
            checks.drop_outputs(outputs, noisy)
        checks.non_finite(report, outputs, c.name if len(plan.checks) > 1 else None)
        compare_all(sub, outputs, c.batches, c.tolerance, plan.devices, plan.pairs_of(c, "reference")
                    + plan.pairs_of(c, "device"))
        for result in sub.runtimes:
            result.signature = c.name
        report.runtimes += sub.runtimes
        report.references[c.name] = sub.reference
        if c is plan.checks[0]:
            report.reference = sub.reference
            report.inputs.update({k: v for k, v in sub.inputs.items() if k == "reference_without_golden"})
        if plan.trained is not None and c.name == plan.trained.signature:
            report.chain = checks.reference_chain(sub, outputs, c.tolerance)
        if c.twin:
            report.runtimes += agreement(c, by_name[c.twin], execution.outputs, plan.pairs_of(c, "agreement"))
