"""exportkit verify: the same inputs through every runtime, every runtime compared with the reference.

Order of work: every flag is checked and the SavedModel is read and linted first (pure protobuf, no TensorFlow
import, nothing started), so a graph verify refuses to execute (I/O ops) is refused before any process starts.
Then the TensorFlow worker starts (saved_model, session and the embedded server, one import, both loads at once)
while this process plans the batches; this process imports TensorFlow only for eager Keras (--against).

Every signature is checked (or the one --signature names) through every runtime; each runtime is started and
loaded once and is pointed at one signature after the other. A tf.Example signature exportkit exported is fed
Examples encoded from the very tensor batches its tensor twin gets, and the two must answer the same.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from exportkit import __version__
from exportkit.batches import InputSpec, generate_batches, load_inputs, parse_int_range_flags, recorded_int_ranges
from exportkit.dtypes import HALF_DTYPES, numpy_dtype
from exportkit.errors import CheckFailed, InfraError, UsageError
from exportkit.findings import Finding
from exportkit.layout import read_golden, read_manifest, signature_entries
from exportkit.runtimes import RUNTIME_KINDS, RUNTIME_NAMES
from exportkit.spec import VerifyOptions
from exportkit.verify.baseline import served_signature_findings
from exportkit.tfexample import encode_examples, from_manifest, lossless
from exportkit.verify.compare import Tolerance, compare_batches, parse_tol, resolve_tolerance
from exportkit.verify.report import RuntimeResult, VerifyReport




def _devices(device: str) -> list[str]:
    if device not in ("cpu", "gpu", "all"):
        raise UsageError(f"--device {device!r} is not cpu, gpu or all", "pass --device cpu, --device gpu or --device all")
    return ["cpu", "gpu"] if device == "all" else [device]


PROTOCOLS = ("grpc", "rest", "both")


def _protocol(protocol: str | None, serving: str) -> str:
    """--serving-protocol; by default both for servers exportkit launches, gRPC for a remote one (REST port unknown)."""
    if protocol is None:
        return "both" if serving in ("auto", "binary", "embedded") else "grpc"
    if protocol not in PROTOCOLS:
        raise UsageError(f"--serving-protocol {protocol!r} is not grpc, rest or both", "pass --serving-protocol both")
    if protocol != "grpc" and serving not in ("auto", "binary", "embedded", "none"):
        raise UsageError(f"--serving-protocol {protocol} needs a server exportkit launches (REST port unknown for "
                         f"{serving})", "pass --serving-protocol grpc for a remote server")
    return protocol


def _selected_runtimes(spec: str | None, serving: str, against, protocol: str = "grpc") -> list[str]:
    if spec:
        names = [n.strip() for n in spec.split(",") if n.strip()]
        unknown = sorted(set(names) - set(RUNTIME_NAMES))
        if unknown:
            raise UsageError(f"--runtimes: unknown runtime(s) {', '.join(unknown)}", f"use some of {','.join(RUNTIME_NAMES)}")
        if "keras" in names and not against:
            raise UsageError("--runtimes keras needs the training source", "pass --against SRC (and its source options)")
        return names
    names = [n for n in RUNTIME_NAMES if n != "keras" or against]  # "trained" is dropped later without a reference
    if serving == "none":
        return [n for n in names if n not in ("serving", "rest")]
    return [n for n in names if (n != "serving" or protocol != "rest") and (n != "rest" or protocol != "grpc")]


class _Labeled:
    """A runtime with a display name that includes its device when several devices run."""

    def __init__(self, runtime, label: str):
        self.runtime = runtime
        self.label = label


MAX_BATCH_ROWS = 256


def _rows(batch: dict[str, np.ndarray]) -> int:
    """The batch size: the leading dimension the inputs share (1 for scalars or disagreeing inputs)."""
    rows = {np.shape(v)[0] for v in batch.values() if np.ndim(v)}
    return rows.pop() if len(rows) == 1 else 1


def _chunks(batch: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """Rows of a large batch in slices of MAX_BATCH_ROWS, so memory grows with the work, not with --samples."""
    n = _rows(batch)
    if n <= MAX_BATCH_ROWS:
        return [batch]
    return [{k: v[i:i + MAX_BATCH_ROWS] for k, v in batch.items()} for i in range(0, n, MAX_BATCH_ROWS)]


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.shape(a[k]) == np.shape(b[k]) and np.array_equal(a[k], b[k]) for k in a)


def _read_model(path: str):
    """(version dir, SavedModel proto, {signature name: signature in savedmodel.signatures_of's form})."""
    from exportkit.savedmodel import read_saved_model_proto, resolve_savedmodel_dir, select_meta_graph, signatures_of

    version_dir = resolve_savedmodel_dir(path)
    proto = read_saved_model_proto(version_dir)
    return version_dir, proto, signatures_of(select_meta_graph(proto))


@dataclass
class SignatureCheck:
    """One signature to verify: its inputs, its batches, and what the export recorded about it."""

    name: str
    method: str
    specs: list[InputSpec]
    output_dtypes: dict[str, str]
    entry: dict  # the manifest's entry ({} for SavedModels exportkit did not write)
    batches: list = field(default_factory=list)  # [(origin, batch)]
    golden: tuple = (None, None)
    twin: str | None = None  # a tensor signature answering the same model outputs (for Example signatures)

    @property
    def examples_input(self) -> bool:
        return bool(self.entry.get("features"))


def _selected_signatures(requested: str | None, signatures: dict) -> list[str]:
    """Every servable signature, or the one asked for (a missing one is reported as a lint finding)."""
    if requested is not None:
        return [requested] if requested in signatures else []
    return list(signatures)


def _twin(name: str, entry: dict, entries: dict, selected: list[str]) -> str | None:
    """A tensor-input signature that returns every model output `name` returns (both must answer the same)."""
    wanted = {o.get("model_output") for o in entry.get("outputs", {}).values()} - {None}
    for other in selected:
        e = entries.get(other, {})
        if other != name and e and not e.get("features"):
            have = {o.get("model_output") for o in e.get("outputs", {}).values()}
            if wanted and wanted <= have:
                return other
    return None


def _tensor_batches(o: VerifyOptions, specs, lo_hi, explicit: bool) -> list:
    """--inputs batches (with several signatures: only for those whose inputs the file holds), then generated
    batches of sizes 1 and --samples."""
    found = []
    if o.inputs:
        try:
            found = [("file", b) for b in load_inputs(o.inputs, specs)]
        except UsageError:
            if explicit:
                raise
    generated = generate_batches(specs, samples=o.samples, seed=o.seed, int_range=lo_hi)
    # The batch of 1 is sent again (determinism): verify/behaviours.py needs no other runs.
    return found + [("generated", b) for b in generated] + [("repeat", {k: v.copy() for k, v in generated[0].items()})]


def _plan_checks(o: VerifyOptions, signatures: dict, names: list[str], version_dir, manifest, lo_hi):
    """A SignatureCheck per signature, with its batches: golden, --inputs, then generated.

    A tf.Example signature exportkit exported (its manifest lists the features) gets serialized Examples encoded
    from tensor batches: its twin tensor signature's, so that both answer the same values; else generated ones.
    """
    if o.samples < 1:
        raise UsageError(f"--samples {o.samples} must be at least 1", "pass --samples 8 (for example)")
    from exportkit.examples import input_specs
    from exportkit.savedmodel import read_saved_model_proto, select_meta_graph

    meta_graph = select_meta_graph(read_saved_model_proto(version_dir))
    entries = signature_entries(manifest)
    checks = []
    for name in names:
        signature = signatures[name]
        specs = input_specs(meta_graph, name, signature, version_dir)  # with ExampleSpecs for tf.Example inputs
        check = SignatureCheck(name, signature.get("method") or "", specs,
                               {k: v["dtype"] for k, v in signature["outputs"].items()}, entries.get(name, {}))
        check.golden = read_golden(version_dir, name, manifest) if manifest else (None, None)
        checks.append(check)
    by_name = {c.name: c for c in checks}
    explicit = len(names) == 1
    for check in sorted(checks, key=lambda c: c.examples_input):  # tensor twins first
        golden = [("golden", b) for b in (check.golden[0] or [])]
        if not check.examples_input:
            check.batches = golden + _unrecorded(_tensor_batches(o, check.specs, lo_hi, explicit), golden)
            continue
        features = from_manifest(check.entry["features"])
        key = check.specs[0].key
        check.twin = _twin(check.name, check.entry, entries, names)
        if check.twin:
            tensors = [(origin, b) for origin, b in by_name[check.twin].batches if origin != "golden"]
        else:
            specs = sorted((InputSpec(f.input, f.dtype, [-1, *f.shape]) for f in features), key=lambda s: s.key)
            tensors = _tensor_batches(o, specs, lo_hi, explicit)
        check.batches = golden + _unrecorded([(origin, {key: encode_examples(b, features)}) for origin, b in tensors],
                                             golden)
    if o.inputs and not any(origin == "file" for c in checks for origin, _ in c.batches):
        load_inputs(o.inputs, checks[0].specs)  # raises the UsageError that names the mismatch
    for check in checks:
        check.batches = [(origin, chunk) for origin, batch in check.batches for chunk in _chunks(batch)]
    return checks


def _unrecorded(batches: list, golden: list) -> list:
    """Generated batches the golden record already holds are not run twice (export generates its golden batches the
    same way, with verify's default seed); the behaviour checks then use the golden ones."""
    return [(origin, b) for origin, b in batches
            if origin != "generated" or not any(_same(b, g) for _, g in golden)]


def _per_output_tolerances(atol, rtol, per_output, entry):
    recorded = (entry or {}).get("tolerances", {})
    compute = {k: v.get("compute_dtype") for k, v in (entry or {}).get("outputs", {}).items()}

    def tolerance(key: str, dtype: str) -> Tolerance:
        if key not in per_output and atol is None and rtol is None and key in recorded:
            return Tolerance(**recorded[key])
        return resolve_tolerance(key, compute.get(key) or dtype, atol=atol, rtol=rtol, per_output=per_output)

    return tolerance


def _trained_reference(reference, manifest, version_dir, golden_inputs, against, specs):
    """(inputs, outputs, inputs to add to the batches, path) of the training-time reference, or None.

    --reference FILE wins; else the one the export recorded (its inputs are golden batches); else one found next
    to --against SRC (SRC.reference.npz or `reference` in its exportkit.toml)."""
    from exportkit import reference as refs

    recorded = (manifest or {}).get("reference")
    if not reference and recorded and golden_inputs is not None:
        from exportkit.layout import read_reference_outputs

        inputs = [golden_inputs[i] for i in recorded["golden_batches"]]
        return inputs, read_reference_outputs(version_dir), [], recorded.get("path")
    if not reference and against is not None:
        reference = refs.find_reference(against.src, None, against.reference)
    if not reference:
        return None
    loaded = refs.read_reference(reference)
    inputs = refs.reference_batches(loaded, specs)
    return inputs, loaded.outputs, inputs, loaded.path


def _trained_check(o: VerifyOptions, manifest, version_dir, checks: list[SignatureCheck]):
    """(the signature the training-time reference answers, _trained_reference's tuple), or (None, None).

    The reference holds the model's inputs and outputs: it answers the export's first signature (the model's
    tensors, every output), or for other SavedModels the first signature that takes tensors. Its batches are
    added to that signature's (and so to its tf.Example twins')."""
    first = (manifest or {}).get("signature_name")
    check = next((c for c in checks if c.name == first), None) if first else next(
        (c for c in checks if not c.examples_input), None)
    if check is None or check.examples_input:
        return None, None
    trained = _trained_reference(o.reference, manifest, version_dir, check.golden[0], o.against, check.specs)
    if trained is not None and trained[2]:
        golden = [b for origin, b in check.batches if origin == "golden"]
        extra = [("reference", chunk) for b in trained[2] if not any(_same(b, g) for g in golden) for chunk in _chunks(b)]
        at = len(golden)
        check.batches[at:at] = extra
        for other in checks:  # an Example twin gets the same values, as Examples, at the same place
            if other.twin == check.name:
                key, features = other.specs[0].key, from_manifest(other.entry["features"])
                other.batches[at:at] = [(origin, {key: encode_examples(b, features)}) for origin, b in extra]
    return check, trained


def _verify_data(o: VerifyOptions, report, version_dir, proto, signatures, selected, manifest, names, devices,
                 per_output) -> int:
    """--data streams records of one signature's inputs: --signature NAME, else serving_default (or the only one)."""
    import dataclasses

    from exportkit.savedmodel import DEFAULT_SIGNATURE
    from exportkit.verify.dataset import verify_data

    name = o.signature_name or (DEFAULT_SIGNATURE if DEFAULT_SIGNATURE in signatures or len(selected) != 1
                                else selected[0])
    if name not in signatures:
        raise UsageError(f"--data needs one signature, and there is no '{name}' (available: {', '.join(signatures)})",
                         "pass --signature NAME for the signature the records are inputs of")
    o = dataclasses.replace(o, signature_name=name)
    report.signature, report.signatures = name, [name]
    signature = signatures[name]
    from exportkit.examples import input_specs
    from exportkit.savedmodel import select_meta_graph

    specs = input_specs(select_meta_graph(proto), name, signature, version_dir)  # tf.Example inputs found here
    tolerance = _per_output_tolerances(o.atol, o.rtol, per_output, signature_entries(manifest).get(name))
    return verify_data(o, report, version_dir, proto, signature, specs, names, devices, tolerance)


class InputsRejected(Exception):
    """A runtime rejected inputs exportkit generated: the inputs were wrong for the model, not the model."""


def _rejects_inputs(err: Exception) -> bool:
    text = f"{type(err).__name__} {err}"
    return "InvalidArgument" in text or "INVALID_ARGUMENT" in text


def _one_line(err: Exception, limit: int = 300) -> str:
    text = " ".join(str(getattr(err, "message", None) or err).split())
    return (text[:limit] + "...") if len(text) > limit else text or type(err).__name__


def _run_all(runtime, batches) -> list:
    """Outputs per batch. Generated batches the model rejects as invalid arguments are the inputs' fault: they
    get None (not compared) when real inputs (golden, reference or --inputs) exist, else InputsRejected says so."""
    if not runtime.loaded:
        runtime.load()
    has_real = any(origin in ("golden", "reference", "file") for origin, _ in batches)

    def run(item):
        origin, batch = item
        try:
            return runtime.run(batch)
        except InfraError:
            raise
        except Exception as err:
            if origin not in ("generated", "repeat") or not _rejects_inputs(err):
                raise
            if not has_real:
                raise InputsRejected(_one_line(err)) from err
            runtime.rejected_generated = _one_line(err)
            return None

    return [run(item) for item in batches]


def verify_command(options: VerifyOptions) -> int:
    o = options
    devices = _devices(o.device)
    if o.data and o.tf_versions:
        raise UsageError("--tf runs on the generated/golden batches, not on --data records (not supported yet)",
                         "run `exportkit verify PATH --tf X.Y` and `exportkit verify PATH --data GLOB` separately")
    names = _selected_runtimes(o.runtimes, o.serving, o.against, _protocol(o.serving_protocol, o.serving))
    if "serving" in names or "rest" in names:
        from exportkit.serving.launcher import check_serving_mode

        check_serving_mode(o.serving)
    parse_int_range_flags(o.int_range)
    per_output = dict(parse_tol(t) for t in o.tol)
    from exportkit.lint import IO_OP_REFUSAL, asset_findings, lint_saved_model

    version_dir, proto, signatures = _read_model(o.path)
    selected = _selected_signatures(o.signature_name, signatures)
    findings = lint_saved_model(proto, o.signature_name) + asset_findings(version_dir)
    if selected:
        _check_tol_keys(per_output, {k for name in selected for k in signatures[name]["outputs"]})
    refused = [f for f in findings if f.code == "io-op" and f.severity == "error"]
    if refused and o.allow_io_ops:
        findings = [Finding("warning", f.code, f.message.replace(IO_OP_REFUSAL, " Executed anyway (--allow-io-ops)."))
                    if f in refused else f for f in findings]
        refused = []
    if "gpu" in devices and not refused:
        from exportkit.runtimes.local import require_gpu

        require_gpu()  # before any process is started: no GPU is an infrastructure failure (exit 3)
    manifest, manifest_findings = read_manifest(version_dir)
    findings += manifest_findings
    # the ranges the model was exported with fit its integer inputs (e.g. vocabularies); --int-range over them
    lo_hi = recorded_int_ranges(o.int_range, manifest, signatures)
    if o.baseline:
        findings += _baseline_findings(o, signatures, selected)

    report = VerifyReport(path=str(version_dir), signature=", ".join(selected) or (o.signature_name or ""),
                          reference="", runtimes=[], findings=list(findings), inputs={}, tf32=None,
                          exportkit_version=__version__, signatures=list(selected))
    if not selected:
        return _finish(report, o.json_out, o.junit)
    if refused:  # static findings come first: nothing was started, nothing runs
        report.inputs = {"source": "none (not run)"}
        maybe_reference = o.reference or (manifest or {}).get("reference") or o.against
        for name in names:
            if (name == "trained" and not maybe_reference) or (name == "golden" and manifest is None):
                continue  # nothing recorded to look for (dropped the same way below)
            report.runtimes.append(RuntimeResult(name=name, kind=RUNTIME_KINDS[name], status="skipped",
                                                 error="not run: the graph reaches I/O ops (see findings)"))
        _finish(report, o.json_out, o.junit)
        raise CheckFailed("verify did not execute the model: its signatures reach ops that touch files, the network "
                          "or the console (finding io-op)",
                          "pass --allow-io-ops to execute it anyway, if you trust the model and where it came from")
    # Managed TF X.Y environments next (after the static verdict): a missing one is installed (or exit 3) before
    # any process starts.
    versioned = versioned_pythons(o.tf_versions)

    if o.data:
        return _verify_data(o, report, version_dir, proto, signatures, selected, manifest, names, devices, per_output)
    # Without a golden record (a third-party SavedModel), the other runtimes still agree or not.
    checks = _plan_checks(o, signatures, selected, version_dir, manifest, lo_hi)
    if "golden" in names and all(c.golden[0] is None for c in checks):
        names.remove("golden")
    trained_check, trained = _trained_check(o, manifest, version_dir, checks)
    if trained is None and "trained" in names:
        names.remove("trained")
    origins = sorted({origin for c in checks for origin, _ in c.batches if origin != "repeat"} | {"generated"},
                     key=["golden", "reference", "file", "generated"].index)  # (generated ones may be golden ones)
    report.inputs = {"source": "+".join(origins), "batch_sizes": [_rows(b) for _, b in checks[0].batches],
                     "seed": o.seed}
    if trained is not None:
        report.inputs["reference"] = trained[3]
    examples = {f"{c.name}.{s.key}" if len(checks) > 1 else s.key: f"serialized tf.Example ({s.examples.parse_op}: "
                f"{s.examples.describe()})" for c in checks for s in c.specs if s.examples is not None}
    if examples:
        report.inputs["examples"] = examples
    if o.save_inputs:
        for c in checks:
            _save(o.save_inputs, "inputs" if len(checks) == 1 else f"inputs.{c.name}", [b for _, b in c.batches])

    # The worker first: it imports TensorFlow while we work here.
    runtimes_ = _build_runtimes(o, names, devices, version_dir, checks[0], trained_check, trained, signatures,
                                (manifest or {}).get("output_names"))
    runtimes_ += versioned_sessions(versioned, version_dir, checks[0].name)
    outputs: dict[str, dict[str, list]] = {c.name: {} for c in checks}
    results: dict[str, list[RuntimeResult]] = {c.name: [] for c in checks}
    infra: list[InfraError] = []  # a runtime's environment failed: its row says so, the exit code is 3
    try:
        from exportkit.tfenv import import_tf, tf32

        if any(r.runtime.kind == "in-process" for r in runtimes_):
            import_tf()
        report.tf32 = o.allow_tf32 if "gpu" in devices else None
        with tf32(o.allow_tf32) if "gpu" in devices else contextlib.nullcontext():
            for item in runtimes_:
                for check in checks:
                    result = _execute(item, check, outputs[check.name], infra)
                    if result is not None:
                        results[check.name].append(result)
        _serving_checks(runtimes_, signatures, selected, version_dir, results, report, infra)
        rejected = [(item.label, item.runtime.rejected_generated) for item in runtimes_
                    if getattr(item.runtime, "rejected_generated", None)]
        if rejected:
            report.findings.append(Finding("warning", "generated-inputs-rejected", (
                f"the model rejects exportkit's generated inputs ({rejected[0][0]}: {rejected[0][1]}); they were "
                f"left out and only the golden/--inputs batches compared. The inputs were wrong, not the model")))
    finally:
        _close_all(runtimes_)

    by_name = {c.name: c for c in checks}
    for check in checks:
        sub = VerifyReport(path=report.path, signature=check.name, reference="", runtimes=results[check.name])
        tolerance = _per_output_tolerances(o.atol, o.rtol, per_output, check.entry)
        noisy = _behaviours(report, outputs[check.name], check.batches, tolerance, o.allow_nondeterministic,
                            check.output_dtypes, check.name if len(checks) > 1 else None)
        if noisy and o.allow_nondeterministic:
            for per_batch in outputs[check.name].values():
                for out in per_batch:
                    for key in noisy & set(out or {}):
                        del out[key]
        _compare_all(sub, outputs[check.name], check.batches, tolerance, devices)
        for result in sub.runtimes:
            result.signature = check.name
        report.runtimes += sub.runtimes
        report.references[check.name] = sub.reference
        if check is checks[0]:
            report.reference = sub.reference
            report.inputs.update({k: v for k, v in sub.inputs.items() if k == "reference_without_golden"})
        if check is trained_check:
            report.chain = _reference_chain(sub, outputs[check.name], tolerance)
        if check.twin:
            report.runtimes += _agreement(check, by_name[check.twin], outputs)
    if o.save_outputs:
        for check in checks:
            for label, per_batch in outputs[check.name].items():
                _save(o.save_outputs, label if len(checks) == 1 else f"{label}.{check.name}",
                      [out for out in per_batch if out is not None])
    code = _finish(report, o.json_out, o.junit)
    if infra:  # the report above shows what did run; the infrastructure failure decides the exit code
        raise infra[0]
    return code


def _check_tol_keys(per_output: dict, output_keys: set[str]) -> None:
    unknown = sorted(set(per_output) - set(output_keys))
    if unknown:
        raise UsageError(f"--tol names output(s) {', '.join(unknown)} that the signature does not have",
                         f"use the output keys: {', '.join(sorted(output_keys))}")


def _agreement(check: SignatureCheck, twin: SignatureCheck, outputs) -> list[RuntimeResult]:
    """The Example signature must answer what its tensor twin answers for the same values, runtime by runtime:
    exactly when every input survives tf.Example storage (float64 does not: then within the tolerance)."""
    features = from_manifest(check.entry["features"])
    by_model_output = {v.get("model_output"): k for k, v in twin.entry.get("outputs", {}).items()}
    mapping = {k: by_model_output[v["model_output"]] for k, v in check.entry.get("outputs", {}).items()
               if v.get("model_output") in by_model_output}
    # Both signatures' batches were built from the same tensor batches in the same order (golden ones first).
    results = []
    for label, answers in outputs[check.name].items():
        theirs = outputs[twin.name].get(label)
        if theirs is None or label == "golden" or len(theirs) != len(answers):
            continue
        pairs = [(b, a) for a, b in zip(answers, theirs) if a is not None and b is not None]
        if not pairs:
            continue
        expected = [{k: _like(b[mapping[k]], a[k]) for k in mapping} for b, a in pairs]
        actual = [{k: a[k] for k in mapping} for _, a in pairs]
        tolerance = ((lambda key, dtype: Tolerance(0.0, 0.0)) if lossless(features)
                     else _per_output_tolerances(None, None, {}, check.entry))
        results.append(RuntimeResult(name=f"{label}: {check.name} = {twin.name}", kind="agreement", device=None,
                                     server=None, status="ok", error=None, seconds=0.0, is_reference=False,
                                     comparisons=compare_batches(expected, actual, tolerance), signature=check.name))
    return results


def versioned_pythons(tf_versions) -> dict[str, str]:
    """{X.Y: interpreter with TensorFlow X.Y} for `--tf` (repeatable, each a list/range/all), installing the
    managed environments that are missing (progress on stderr; exit 3 when they cannot be built)."""
    if not tf_versions:
        return {}
    from exportkit.compat import parse_versions
    from exportkit.compat.envs import python_for

    return {v: python_for(v) for v in parse_versions(list(tf_versions))}


def versioned_sessions(pythons: dict[str, str], version_dir, signature_name) -> list[_Labeled]:
    """`session@X.Y`: the serving-equivalent session runtime on TensorFlow X.Y (CPU), one process each, started."""
    from exportkit.compat.envs import WORKER, install_command
    from exportkit.runtimes.session import SessionRuntime

    built = [_Labeled(SessionRuntime(str(version_dir), signature_name, device="cpu", python=python, worker=str(WORKER),
                                     broken_remedy=f"the TF {v} environment may be damaged: `exportkit runtimes "
                                                   f"remove {v}` then `{install_command(v)}`"),
                      f"session@{v}") for v, python in pythons.items()]
    for item in built:
        item.runtime.start()
    return built


def _close_all(runtimes_) -> None:
    """Close every runtime at once: worker and server shutdowns overlap instead of adding up."""

    def close(item):
        try:
            item.runtime.close()
        except Exception:  # closing must never hide the verdict
            pass

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(runtimes_))) as pool:
        list(pool.map(close, runtimes_))


def _like(value: np.ndarray, like: np.ndarray) -> np.ndarray:
    """A tensor signature's output in the dtype the Example signature returns it (classify/regress: float32)."""
    value, like = np.asarray(value), np.asarray(like)
    return value.astype(like.dtype) if value.dtype != like.dtype and like.dtype.kind == "f" else value


def _baseline_findings(o: VerifyOptions, signatures: dict, selected: list[str]) -> list[Finding]:
    """Every released signature against its new self: a removed signature is breaking, an added one is not."""
    from exportkit.verify.baseline import compare_signature_sets

    _, _, old = _read_model(o.baseline)
    if o.signature_name is not None:
        if o.signature_name not in old:
            raise UsageError(f"baseline {o.baseline} has no signature '{o.signature_name}'",
                             "pass the previous release's SavedModel")
        old = {o.signature_name: old[o.signature_name]}
        signatures = {k: v for k, v in signatures.items() if k in selected}
    return compare_signature_sets(old, signatures)


def _build_runtimes(o: VerifyOptions, names, devices, version_dir, first: SignatureCheck,
                    trained_check: SignatureCheck | None = None, trained=None, signatures=None,
                    output_names: list[str] | None = None) -> list[_Labeled]:
    """Every runtime once; each is pointed at one signature after the other.

    One TensorFlow worker process per device holds both loads (`saved_model`, `session`, loading at the same time)
    and the embedded server, which answers from the session's load: one TensorFlow import and one TF1 load instead
    of three processes (a 1 GB model needed 7.8 GB that way). `saved_model` runs in this process only when eager
    Keras (`--against`) imports TensorFlow here anyway."""
    from exportkit.runtimes.local import GoldenRuntime, KerasRuntime
    from exportkit.runtimes.session import TfWorker, WorkerRuntime

    built: list[_Labeled] = []
    multi = len(devices) > 1
    workers = {dev: TfWorker(str(version_dir), dev, o.allow_tf32) for dev in devices}

    def label(name, dev):
        return f"{name}@{dev}" if multi else name

    input_dtypes = {s.key: s.dtype for s in first.specs}
    for dev in devices:
        if "saved_model" in names and "keras" in names:  # TensorFlow is imported here anyway: no round trips
            from exportkit.runtimes.local import SavedModelRuntime

            built.append(_Labeled(SavedModelRuntime(str(version_dir), first.name, input_dtypes, device=dev),
                                  label("saved_model", dev)))
        elif "saved_model" in names:
            built.append(_Labeled(WorkerRuntime(workers[dev], "saved_model", first.name, preload=True,
                                                input_dtypes=input_dtypes), label("saved_model", dev)))
        if "session" in names:
            built.append(_Labeled(WorkerRuntime(workers[dev], "session", first.name, preload=True),
                                  label("session", dev)))
    if "serving" in names or "rest" in names:
        from exportkit.runtimes.serving import RestRuntime, ServingRuntime

        runtime = ServingRuntime(str(version_dir), mode=o.serving, signature_name=first.name,
                                 model_name=o.model_name, model_version=o.model_version, binary=o.model_server_bin,
                                 load_timeout=o.load_timeout, device=devices[-1], signatures=signatures,
                                 rest="rest" in names, worker=workers[devices[-1]])
        if "serving" in names:
            built.append(_Labeled(runtime, "serving"))
        if "rest" in names:
            built.append(_Labeled(RestRuntime(runtime, owns="serving" not in names), "rest"))
    if "golden" in names:
        built.insert(0, _Labeled(GoldenRuntime([], []), "golden"))
    if "trained" in names:  # recorded as float32 where the model computed in half precision: as the signature has it
        dtypes = trained_check.output_dtypes
        as_signed = [{k: v.astype(numpy_dtype(dtypes[k])) if k in dtypes and v.dtype.kind == "f"
                      and dtypes[k] in HALF_DTYPES else v for k, v in out.items()} for out in trained[1]]
        built.insert(0, _Labeled(GoldenRuntime(trained[0], as_signed, name="trained"), "trained"))
        built[0].runtime.signature_name = trained_check.name
    if "keras" in names:
        for dev in devices:
            built.append(_Labeled(KerasRuntime(o.against, first.output_dtypes, device=dev, output_names=output_names),
                                  label("keras", dev)))
    order = {n: i for i, n in enumerate(RUNTIME_NAMES)}
    built.sort(key=lambda item: (order[item.runtime.name], item.label))
    for item in built:  # the slow ones (worker import, server launch) get going now, in parallel
        item.runtime.start()
    return built


OMIT = ""  # _prepare: the runtime has nothing to say about this signature (no row in the report)


def _prepare(runtime, check: SignatureCheck) -> str | None:
    """Point `runtime` at `check`'s signature; returns why it cannot answer for it (it is then skipped)."""
    from exportkit.runtimes.local import GoldenRuntime, KerasRuntime

    if isinstance(runtime, GoldenRuntime) and runtime.name == "trained":
        return None if check.name == runtime.signature_name else OMIT
    if isinstance(runtime, GoldenRuntime):
        runtime.record(check.golden[0] or [], check.golden[1] or [])
        return None if check.golden[0] is not None else "no golden record for this signature"
    if isinstance(runtime, KerasRuntime):
        if check.examples_input or not check.method.endswith("predict"):
            return ("eager Keras takes the model's tensors; this signature is checked against the golden record "
                    "and its tensor twin")
        outputs = check.entry.get("outputs", {})
        runtime.use_outputs({k: v.get("model_output") or k for k, v in outputs.items()} or None,
                            check.output_dtypes)
        return None
    runtime.use_signature(check.name, {s.key: s.dtype for s in check.specs})
    return None


def _error_text(err) -> str:
    """The full failure for the report: first line the summary, then details (a server's log tail), then the fix."""
    text = err.message if hasattr(err, "message") else str(err)
    remedy = getattr(err, "remedy", None)
    return f"{text}\nfix: {remedy}" if remedy else text


def _execute(item: _Labeled, check: SignatureCheck, outputs, infra: list | None = None) -> RuntimeResult | None:
    runtime = item.runtime
    began = time.perf_counter()
    result = RuntimeResult(name=item.label, kind=runtime.kind, device=runtime.device, server=runtime.server,
                           status="ok", error=None, seconds=0.0, is_reference=False, comparisons=[],
                           signature=check.name)
    try:
        skip = _prepare(runtime, check)
        if skip == OMIT:
            return None
        if skip:
            result.status, result.error = "skipped", skip
        else:
            outputs[item.label] = _run_all(runtime, check.batches)
    except InputsRejected as err:  # our inputs were wrong: say so instead of blaming the model
        result.status = "error"
        result.error = (f"the generated inputs are not valid for this model ({err}): the inputs were wrong, not "
                        f"the model; pass real inputs with --inputs (.npz, .json, or a .tfrecord of tf.Example)")
    except CheckFailed as err:  # the model cannot load or run here: the model's failure
        result.status, result.error = "error", _error_text(err)
    except InfraError as err:  # not the model's fault: shown in the table, exit 3 once the report is out
        if infra is None:
            raise
        result.status, result.error = "error", _error_text(err)
        infra.append(err)
    except Exception as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else ""
        result.status, result.error = "error", f"{type(err).__name__}: {first_line}"
    result.server = runtime.server
    result.device = runtime.placed_on or runtime.device
    result.seconds = time.perf_counter() - began
    return result


def _serving_checks(runtimes_, signatures, selected, version_dir, results, report, infra: list | None = None) -> None:
    """Served signatures and warm-up replay. An InfraError marks the serving rows and goes to `infra` (the caller
    prints the report, then exits 3); without `infra` it propagates."""
    from exportkit.runtimes.serving import ServingRuntime

    for item in runtimes_:
        runtime = item.runtime
        if not isinstance(runtime, ServingRuntime) or not runtime.loaded:
            continue
        if any(r.status != "ok" for per in results.values() for r in per if r.name == item.label):
            continue
        try:
            served = runtime.served_signatures()
            for name in selected:
                report.findings += served_signature_findings(name, signatures[name], served)
            report.findings += runtime.replay_warmup(str(version_dir))
        except InfraError as err:
            if infra is None:
                raise
            for per in results.values():
                for r in per:
                    if r.name == item.label:
                        r.status, r.error = "error", _error_text(err)
            infra.append(err)


def _behaviours(report: VerifyReport, outputs: dict[str, list], batches, tolerance, allow_nondeterministic: bool,
                output_dtypes: dict[str, str], signature: str | None = None) -> set[str]:
    """Batch independence and determinism in every runtime, REST against gRPC; returns nondeterministic keys."""
    from exportkit.verify.behaviours import behaviour_findings, json_findings

    def index(origin, many=False):
        return next((i for i, (o, b) in enumerate(batches) if o == origin and (_rows(b) > 1) == many), None)

    def generated(many=False):
        """The generated batch, or the golden batch equal to it (not run twice, see _unrecorded)."""
        found = index("generated", many)
        if found is None and repeat is not None:
            probe = batches[repeat][1]
            found = next((i for i, (o, b) in enumerate(batches) if o == "golden" and (_rows(b) > 1) == many
                          and _same({k: np.asarray(v)[:1] for k, v in b.items()}, probe)), None)
        return found

    repeat = index("repeat")
    single, many = generated(), generated(many=True)
    noisy: set[str] = set()
    found = []
    if single is not None and repeat is not None:
        per_runtime = {label: (per_batch[single], per_batch[repeat], per_batch[many] if many is not None else None)
                       for label, per_batch in outputs.items()}
        more, noisy = behaviour_findings(per_runtime, 1, tolerance, allow_nondeterministic)
        found += more
    if "serving" in outputs and "rest" in outputs:
        strip = [{k: v for k, v in (o or {}).items() if k not in noisy} if o is not None else None
                 for o in outputs["serving"]]
        found += json_findings(strip, outputs["rest"], output_dtypes)
    if signature:  # several signatures: say which
        found = [Finding(f.severity, f.code, f"signature '{signature}': {f.message}") for f in found]
    report.findings += found
    return noisy


def _compare_all(report: VerifyReport, outputs: dict[str, list], batches, tolerance, devices) -> None:
    """Per batch, the reference is the first runtime in RUNTIME_NAMES that has outputs for it."""
    labels = [r.name for r in report.runtimes if r.name in outputs]
    if not labels:
        return
    references = []
    for index in range(len(batches)):
        ref = next((lab for lab in labels if outputs[lab][index] is not None), None)
        references.append(ref)
    primary = references[0]
    report.reference = primary or ""
    others = sorted({r for r in references if r and r != primary})
    if others:
        report.inputs["reference_without_golden"] = ", ".join(others)
    for result in report.runtimes:
        if result.name not in outputs:
            continue
        pairs = [(outputs[references[i]][i], outputs[result.name][i]) for i in range(len(batches))
                 if references[i] and references[i] != result.name and outputs[result.name][i] is not None]
        if result.name == primary:
            result.is_reference = True
        if pairs:
            result.comparisons = compare_batches([p[0] for p in pairs], [p[1] for p in pairs], tolerance)
    if len(devices) > 1:  # --device all: also GPU against CPU, runtime by runtime
        for result in list(report.runtimes):
            if not result.name.endswith("@gpu"):
                continue
            cpu = result.name[: -len("@gpu")] + "@cpu"
            if cpu in outputs and result.name in outputs:
                pairs = [(a, b) for a, b in zip(outputs[cpu], outputs[result.name]) if a is not None and b is not None]
                report.runtimes.append(RuntimeResult(
                    name=f"{result.name} vs cpu", kind="comparison", device="gpu", server=None, status="ok",
                    error=None, seconds=0.0, is_reference=False,
                    comparisons=compare_batches([p[0] for p in pairs], [p[1] for p in pairs], tolerance)))


def _reference_chain(report: VerifyReport, outputs: dict[str, list], tolerance) -> list[dict]:
    """On the training-time reference's batches, each link of trained -> reloaded -> SavedModel -> serving on its
    own, so a failure names the link that broke (not just every runtime differing from `trained`)."""
    from exportkit.reference import LINKS

    if "trained" not in outputs:
        return []
    index = [i for i, o in enumerate(outputs["trained"]) if o is not None]

    def runtime(*names):
        for r in report.runtimes:
            if r.name.split("@")[0] in names and r.name in outputs and all(outputs[r.name][i] is not None for i in index):
                return r.name
        return None

    reloaded, saved = runtime("golden", "keras"), runtime("saved_model")
    chain = []

    def link(name, a, b):
        if a is None or b is None:
            why = ("no reloaded model: export with the reference, or pass --against SRC" if reloaded is None
                   else "a runtime of this link did not run")
            chain.append({"link": name, "from": a, "to": b, "output": None, "passed": None, "reason": f"not checked: {why}"})
            return
        for c in compare_batches([outputs[a][i] for i in index], [outputs[b][i] for i in index], tolerance):
            chain.append({"link": name, "from": a, "to": b, "output": c.key, "passed": c.passed,
                          "max_abs_err": c.max_abs_err, "reason": c.reason or ""})

    if reloaded is None and saved is not None:  # no reloaded model here: the first two links as one
        link("trained -> SavedModel", "trained", saved)
    else:
        link(LINKS[0], "trained", reloaded)
        link(LINKS[1], reloaded, saved)
    for label in [r.name for r in report.runtimes if r.name.split("@")[0] in ("session", "serving")]:
        if label in outputs:
            link(LINKS[2], saved or reloaded, label)
    return chain


def _save(directory: str, name: str, batches) -> None:
    from exportkit.batches import save_batches

    save_batches(directory, batches, name)


def _finish(report: VerifyReport, json_out, junit) -> int:
    from exportkit.verify.report import render_text, to_json, to_junit_xml

    if json_out == "-":
        print(json.dumps(to_json(report), indent=2))
    else:
        print(render_text(report))
        if json_out:
            Path(json_out).write_text(json.dumps(to_json(report), indent=2) + "\n")
    if junit:
        Path(junit).write_text(to_junit_xml(report))
    sys.stdout.flush()
    return 0 if report.passed else 1
