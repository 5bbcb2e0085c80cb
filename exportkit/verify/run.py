"""exportkit verify: the same inputs through every runtime, every runtime compared with the reference.

Order of work, chosen so fixed costs overlap: subprocess runtimes (session worker, embedded server) are started
first and import TensorFlow while this process reads the SavedModel, lints it and runs the in-process runtimes.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import json
import sys
import time
from pathlib import Path

import numpy as np

from exportkit import __version__
from exportkit.batches import InputSpec, generate_batches, load_inputs, parse_int_range
from exportkit.dtypes import HALF_DTYPES, numpy_dtype
from exportkit.errors import CheckFailed, InfraError, UsageError
from exportkit.findings import Finding
from exportkit.layout import read_golden, read_manifest
from exportkit.runtimes import RUNTIME_NAMES
from exportkit.spec import VerifyOptions
from exportkit.verify.baseline import served_signature_findings
from exportkit.verify.compare import Tolerance, compare_batches, parse_tol, resolve_tolerance
from exportkit.verify.report import RuntimeResult, VerifyReport



def _devices(device: str) -> list[str]:
    if device not in ("cpu", "gpu", "all"):
        raise UsageError(f"--device {device!r} is not cpu, gpu or all", "pass --device cpu, --device gpu or --device all")
    return ["cpu", "gpu"] if device == "all" else [device]


def _selected_runtimes(spec: str | None, serving: str, against) -> list[str]:
    if spec:
        names = [n.strip() for n in spec.split(",") if n.strip()]
        unknown = sorted(set(names) - set(RUNTIME_NAMES))
        if unknown:
            raise UsageError(f"--runtimes: unknown runtime(s) {', '.join(unknown)}", f"use some of {','.join(RUNTIME_NAMES)}")
        if "keras" in names and not against:
            raise UsageError("--runtimes keras needs the training source", "pass --against SRC (and its source options)")
        return names
    names = [n for n in RUNTIME_NAMES if n != "keras" or against]  # "trained" is dropped later without a reference
    return [n for n in names if n != "serving" or serving != "none"]


class _Labeled:
    """A runtime with a display name that includes its device when several devices run."""

    def __init__(self, runtime, label: str):
        self.runtime = runtime
        self.label = label


def _read_model(path: str, signature_name: str):
    """(version dir, SavedModel proto, the signature in savedmodel.signatures_of's form or None)."""
    from exportkit.savedmodel import read_saved_model_proto, resolve_savedmodel_dir, select_meta_graph, signatures_of

    version_dir = resolve_savedmodel_dir(path)
    proto = read_saved_model_proto(version_dir)
    return version_dir, proto, signatures_of(select_meta_graph(proto)).get(signature_name)


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


def _input_batches(specs, golden_inputs, inputs_file, samples, seed, int_range, reference_inputs=()):
    """[(origin, batch)]: golden batches, the reference's (unless among the golden ones), --inputs batches, then
    generated ones (batch sizes 1 and N)."""
    batches = [("golden", b) for b in (golden_inputs or [])]
    batches += [("reference", b) for b in reference_inputs if not any(_same(b, g) for g in golden_inputs or [])]
    if inputs_file:
        batches += [("file", b) for b in load_inputs(inputs_file, specs)]
    if samples < 1:
        raise UsageError(f"--samples {samples} must be at least 1", "pass --samples 8 (for example)")
    batches += [("generated", b) for b in generate_batches(specs, samples=samples, seed=seed, int_range=int_range)]
    return [(origin, chunk) for origin, batch in batches for chunk in _chunks(batch)]


def _per_output_tolerances(atol, rtol, per_output, manifest):
    recorded = (manifest or {}).get("tolerances", {})
    compute = {k: v.get("compute_dtype") for k, v in (manifest or {}).get("signature", {}).get("outputs", {}).items()}

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


def _run_all(runtime, batches) -> list:
    runtime.load()
    return [runtime.run(batch) for _, batch in batches]


def verify_command(options: VerifyOptions) -> int:
    o = options
    devices = _devices(o.device)
    if o.data and o.tf_versions:
        raise UsageError("--tf runs on the generated/golden batches, not on --data records (not supported yet)",
                         "run `exportkit verify PATH --tf X.Y` and `exportkit verify PATH --data GLOB` separately")
    # Managed TF X.Y environments come first: a missing one is installed (or exit 3) before any process starts.
    versioned = versioned_pythons(o.tf_versions)
    names = _selected_runtimes(o.runtimes, o.serving, o.against)
    lo_hi = parse_int_range(o.int_range) if o.int_range else None
    per_output = dict(parse_tol(t) for t in o.tol)
    if "gpu" in devices:
        from exportkit.runtimes.local import require_gpu

        require_gpu()  # before any process is started: no GPU is an infrastructure failure (exit 3)
    from exportkit.lint import lint_saved_model

    version_dir, proto, signature = _read_model(o.path, o.signature_name)
    findings = lint_saved_model(proto, o.signature_name)
    manifest, manifest_findings = read_manifest(version_dir)
    findings += manifest_findings
    # Without a golden record (a third-party SavedModel), the other runtimes still agree or not.
    golden_inputs, golden_outputs = read_golden(version_dir) if manifest else (None, None)
    if lo_hi is None:  # the range the model was exported with fits its integer inputs (e.g. a vocabulary)
        lo_hi = parse_int_range((manifest or {}).get("golden", {}).get("int_range") or "0:10")
    if "golden" in names and golden_inputs is None:
        names.remove("golden")

    if o.baseline:
        from exportkit.verify.baseline import compare_signatures

        _, _, old_signature = _read_model(o.baseline, o.signature_name)
        if old_signature is None:
            raise UsageError(f"baseline {o.baseline} has no signature '{o.signature_name}'",
                             "pass the previous release's SavedModel")
        if signature is not None:
            findings = findings + compare_signatures(old_signature, signature)

    report = VerifyReport(path=str(version_dir), signature=o.signature_name, reference="", runtimes=[],
                          findings=list(findings), inputs={}, tf32=None, exportkit_version=__version__)
    if signature is None:
        return _finish(report, o.json_out, o.junit)

    specs = [InputSpec(key=k, dtype=v["dtype"], shape=v["shape"] if v["shape"] is not None else [-1])
             for k, v in signature["inputs"].items()]
    if o.data:
        from exportkit.verify.dataset import verify_data

        return verify_data(o, report, version_dir, proto, signature, specs, names, devices,
                           _per_output_tolerances(o.atol, o.rtol, per_output, manifest))
    output_dtypes = {k: v["dtype"] for k, v in signature["outputs"].items()}
    trained = _trained_reference(o.reference, manifest, version_dir, golden_inputs, o.against, specs)
    if trained is None and "trained" in names:
        names.remove("trained")
    batches = _input_batches(specs, golden_inputs, o.inputs, o.samples, o.seed, lo_hi, trained[2] if trained else ())
    origins = sorted({origin for origin, _ in batches}, key=["golden", "reference", "file", "generated"].index)
    report.inputs = {"source": "+".join(origins), "batch_sizes": [_rows(b) for _, b in batches], "seed": o.seed}
    if trained is not None:
        report.inputs["reference"] = trained[3]
    if o.save_inputs:
        _save(o.save_inputs, "inputs", [b for _, b in batches])

    # Subprocess runtimes first: they import TensorFlow while we work here.
    runtimes_ = _build_runtimes(o, names, devices, version_dir, specs, output_dtypes, golden_inputs, golden_outputs,
                                trained)
    runtimes_ += versioned_sessions(versioned, version_dir, o.signature_name)
    outputs: dict[str, list] = {}
    try:
        from exportkit.tfenv import import_tf, tf32

        if any(r.runtime.kind == "in-process" for r in runtimes_):
            import_tf()
        report.tf32 = o.allow_tf32 if "gpu" in devices else None
        with tf32(o.allow_tf32) if "gpu" in devices else contextlib.nullcontext():
            for item in runtimes_:
                report.runtimes.append(_execute(item, batches, outputs))
        _serving_checks(runtimes_, signature, version_dir, report)
    finally:
        _close_all(runtimes_)

    tolerance = _per_output_tolerances(o.atol, o.rtol, per_output, manifest)
    _compare_all(report, outputs, batches, tolerance, devices)
    report.chain = _reference_chain(report, outputs, tolerance)
    if o.save_outputs:
        for label, per_batch in outputs.items():
            _save(o.save_outputs, label, [out for out in per_batch if out is not None])
    return _finish(report, o.json_out, o.junit)


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


def _build_runtimes(o: VerifyOptions, names, devices, version_dir, specs, output_dtypes, golden_inputs,
                    golden_outputs, trained=None) -> list[_Labeled]:
    from exportkit.runtimes.local import GoldenRuntime, KerasRuntime, SavedModelRuntime

    built: list[_Labeled] = []
    multi = len(devices) > 1

    def label(name, dev):
        return f"{name}@{dev}" if multi else name

    # Subprocess runtimes are constructed (and so started) first.
    if "session" in names:
        from exportkit.runtimes.session import SessionRuntime

        for dev in devices:
            built.append(_Labeled(SessionRuntime(str(version_dir), o.signature_name, device=dev,
                                                 allow_tf32=o.allow_tf32),
                                  label("session", dev)))
    if "serving" in names:
        from exportkit.runtimes.serving import ServingRuntime

        runtime = ServingRuntime(str(version_dir), mode=o.serving, signature_name=o.signature_name,
                                 model_name=o.model_name, model_version=o.model_version, binary=o.model_server_bin,
                                 load_timeout=o.load_timeout, device=devices[-1])
        built.append(_Labeled(runtime, "serving"))
    if "golden" in names:
        built.insert(0, _Labeled(GoldenRuntime(golden_inputs, golden_outputs), "golden"))
    if "trained" in names:  # recorded as float32 where the model computed in half precision: as the signature has it
        as_signed = [{k: v.astype(numpy_dtype(output_dtypes[k])) if k in output_dtypes and v.dtype.kind == "f"
                      and output_dtypes[k] in HALF_DTYPES else v for k, v in out.items()} for out in trained[1]]
        built.insert(0, _Labeled(GoldenRuntime(trained[0], as_signed, name="trained"), "trained"))
    if "keras" in names:
        for dev in devices:
            built.append(_Labeled(KerasRuntime(o.against, output_dtypes, device=dev), label("keras", dev)))
    if "saved_model" in names:
        dtypes = {s.key: s.dtype for s in specs}
        for dev in devices:
            built.append(_Labeled(SavedModelRuntime(str(version_dir), o.signature_name, dtypes, device=dev),
                                  label("saved_model", dev)))
    order = {n: i for i, n in enumerate(RUNTIME_NAMES)}
    built.sort(key=lambda item: (order[item.runtime.name], item.label))
    for item in built:  # the slow ones (worker import, server launch) get going now, in parallel
        item.runtime.start()
    return built


def _execute(item: _Labeled, batches, outputs) -> RuntimeResult:
    runtime = item.runtime
    began = time.perf_counter()
    result = RuntimeResult(name=item.label, kind=runtime.kind, device=runtime.device, server=runtime.server,
                           status="ok", error=None, seconds=0.0, is_reference=False, comparisons=[])
    try:
        outputs[item.label] = _run_all(runtime, batches)
    except CheckFailed as err:  # the model cannot load or run here: the model's failure
        result.status, result.error = "error", str(err)
    except InfraError:
        raise
    except Exception as err:
        result.status, result.error = "error", f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
    result.server = runtime.server
    result.device = runtime.placed_on or runtime.device
    result.seconds = time.perf_counter() - began
    return result


def _serving_checks(runtimes_, signature, version_dir, report) -> None:
    from exportkit.runtimes.serving import ServingRuntime

    for item in runtimes_:
        runtime = item.runtime
        if not isinstance(runtime, ServingRuntime) or not runtime.loaded:
            continue
        result = next(r for r in report.runtimes if r.name == item.label)
        if result.status != "ok":
            continue
        report.findings += served_signature_findings(report.signature, signature, runtime.served_signatures())
        for problem in runtime.replay_warmup(str(version_dir)):
            report.findings.append(Finding("error", "serving-warmup", problem))


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
