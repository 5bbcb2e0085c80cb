"""The plan's pairs over the runtimes' outputs: each pair's batches through the pure comparisons of
compare/outputs.py, into the comparisons of the report's rows. A new kind of pair (verify/plan.py) is compared here.
"""
from __future__ import annotations

import numpy as np

from exportkit.tfexample.features import from_manifest, lossless
from exportkit.compare.outputs import compare_batches
from exportkit.compare.tolerances import Tolerance
from exportkit.verify.plan import Pair, SignatureCheck, pairs_for, tolerances_for
from exportkit.verify.report import RuntimeResult, VerifyReport


def _reference(pair: Pair, outputs: dict[str, list], index: int) -> str | None:
    """The first of the pair's expected runtimes that answered batch `index`."""
    return next((label for label in pair.expected if label in outputs and outputs[label][index] is not None), None)


def compare_all(report: VerifyReport, outputs: dict[str, list], batches, tolerance, devices,
                pairs: list[Pair] | None = None) -> None:
    """One signature's `reference` and `device` pairs (by default every runtime of `report` against the ones before
    it): per batch, the reference is the first runtime in RUNTIME_NAMES order that has outputs for it."""
    labels = [r.name for r in report.runtimes if r.name in outputs]
    if not labels:
        return
    if pairs is None:
        pairs = pairs_for(report.signature, [r.name for r in report.runtimes], devices)
    firsts = [next((lab for lab in labels if outputs[lab][i] is not None), None) for i in range(len(batches))]
    primary = firsts[0]
    report.reference = primary or ""
    others = sorted({r for r in firsts if r and r != primary})
    if others:
        report.inputs["reference_without_golden"] = ", ".join(others)
    by_label = {r.name: r for r in report.runtimes}
    if primary in by_label:
        by_label[primary].is_reference = True
    for pair in pairs:
        if pair.kind == "reference" and pair.actual in outputs:
            mine = outputs[pair.actual]
            found = [(_reference(pair, outputs, i), i) for i in range(len(batches)) if mine[i] is not None]
            found = [(ref, i) for ref, i in found if ref]
            if found:
                by_label[pair.actual].comparisons = compare_batches([outputs[ref][i] for ref, i in found],
                                                                    [mine[i] for _, i in found], tolerance)
    for pair in pairs:  # --device all: also GPU against CPU, runtime by runtime
        cpu = pair.expected[0]
        if pair.kind == "device" and cpu in outputs and pair.actual in outputs:
            both = [(a, b) for a, b in zip(outputs[cpu], outputs[pair.actual]) if a is not None and b is not None]
            report.runtimes.append(RuntimeResult(
                name=f"{pair.actual} vs cpu", kind="comparison", device="gpu", server=None, status="ok",
                error=None, seconds=0.0, is_reference=False,
                comparisons=compare_batches([p[0] for p in both], [p[1] for p in both], tolerance)))


def agreement(check: SignatureCheck, twin: SignatureCheck, outputs, pairs: list[Pair]) -> list[RuntimeResult]:
    """The Example signature must answer what its tensor twin answers for the same values, runtime by runtime:
    exactly when every input survives tf.Example storage (float64 does not: then within the tolerance)."""
    features = from_manifest(check.entry["features"])
    by_model_output = {v.get("model_output"): k for k, v in twin.entry.get("outputs", {}).items()}
    mapping = {k: by_model_output[v["model_output"]] for k, v in check.entry.get("outputs", {}).items()
               if v.get("model_output") in by_model_output}
    # Both signatures' batches were built from the same tensor batches in the same order (golden ones first).
    results = []
    for pair in pairs:
        label = pair.actual
        answers, theirs = outputs[check.name].get(label), outputs[twin.name].get(label)
        if answers is None or theirs is None or len(theirs) != len(answers):
            continue
        both = [(b, a) for a, b in zip(answers, theirs) if a is not None and b is not None]
        if not both:
            continue
        expected = [{k: _like(b[mapping[k]], a[k]) for k in mapping} for b, a in both]
        actual = [{k: a[k] for k in mapping} for _, a in both]
        tolerance = ((lambda key, dtype: Tolerance(0.0, 0.0)) if lossless(features)
                     else tolerances_for(None, None, {}, check.entry))
        results.append(RuntimeResult(name=f"{label}: {check.name} = {twin.name}", kind="agreement", device=None,
                                     server=None, status="ok", error=None, seconds=0.0, is_reference=False,
                                     comparisons=compare_batches(expected, actual, tolerance), signature=check.name))
    return results


def _like(value: np.ndarray, like: np.ndarray) -> np.ndarray:
    """A tensor signature's output in the dtype the Example signature returns it (classify/regress: float32)."""
    value, like = np.asarray(value), np.asarray(like)
    return value.astype(like.dtype) if value.dtype != like.dtype and like.dtype.kind == "f" else value
