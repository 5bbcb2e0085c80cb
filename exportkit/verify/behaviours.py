"""What a server exposes beyond one request: batching, repeated requests, JSON. Pure checks over outputs.

- Batch independence: TF Serving's batching scheduler concatenates requests, so a row's answer must not depend
  on the other rows. The generated batch of N rows starts with the row of the generated batch of 1; the two
  answers for that row are compared in every runtime (no extra run).
- Determinism: the batch of 1 is run a second time in every runtime (one extra row per runtime); answers that
  differ mean a sampling model, or state that changes between requests.
- JSON: REST answers are compared exactly with the gRPC answers of the same server; what differs was lost in
  JSON. int64 values beyond 2**53 are flagged even when they arrive intact, because JavaScript and every
  double-based JSON parser round them.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from exportkit.findings import Finding
from exportkit.compare.outputs import compare_outputs
from exportkit.compare.tolerances import Tolerance

JS_SAFE_INT = 2 ** 53
BYTES_SUFFIX = "_bytes"


def _failing(reference: dict, actual: dict, tolerance: Callable[[str, str], Tolerance]) -> list[str]:
    return [c.key for c in compare_outputs(reference, actual, tolerance) if not c.passed]


def _first_rows(outputs: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    return {k: np.asarray(v)[:rows] if np.ndim(v) else np.asarray(v) for k, v in outputs.items()}


def nondeterministic_outputs(first: dict, again: dict, tolerance) -> list[str]:
    """Outputs whose answers to the very same request differ (beyond tolerance) between two runs."""
    return _failing(first, again, tolerance)


def batch_dependent_outputs(alone: dict, in_batch: dict, rows: int, tolerance) -> list[str]:
    """Outputs whose first `rows` rows differ between running them alone and inside a larger batch.

    The batch size changes how CPU kernels (oneDNN/Eigen matmuls) block and order their sums, so a row's answer
    moves by round-off even in a correct model: a dot product over K terms moves by about K x eps x the sum of
    |terms|, the scale of the output's largest values, not of each element (a 5000-wide float32 matmul: ~2e-4 on
    values near 100, failing an element-wise 1e-5 relative test where an answer is near zero). So an output's
    atol here is raised by rtol x its largest |value|; a row that really depends on the batch (statistics of the
    batch, as a training-mode BatchNormalization) differs by the order of the values themselves.
    """
    batched = {k: v for k, v in in_batch.items() if np.ndim(v)}  # per-batch scalars are not rows
    reference = {k: v for k, v in alone.items() if k in batched}
    return _failing(reference, _first_rows(batched, rows), _scaled_to_outputs(tolerance, reference))


def _scaled_to_outputs(tolerance, outputs: dict) -> Callable[[str, str], Tolerance]:
    """`tolerance` with each float output's atol raised by rtol x the output's largest finite |value|."""
    def scaled(key: str, dtype: str) -> Tolerance:
        tol = tolerance(key, dtype)
        values = np.asarray(outputs.get(key, ()))
        if values.dtype.kind not in "fc" or not values.size:
            return tol
        finite = np.abs(values[np.isfinite(values)])
        return Tolerance(tol.atol + tol.rtol * float(finite.max()), tol.rtol) if finite.size else tol
    return scaled


def behaviour_findings(per_runtime: dict[str, tuple[dict | None, dict | None, dict | None]], rows: int, tolerance,
                       allow_nondeterministic: bool) -> tuple[list[Finding], set[str]]:
    """Findings `nondeterministic` and `batch-dependent` over {runtime: (alone, again, in_batch)} outputs.

    Returns the findings and the nondeterministic output keys (their batch check is meaningless, and with
    `allow_nondeterministic` their cross-runtime comparison is too).
    """
    noisy: dict[str, list[str]] = {}
    dependent: dict[str, list[str]] = {}
    for label, (alone, again, in_batch) in per_runtime.items():
        if alone is None:
            continue
        if again is not None:
            for key in nondeterministic_outputs(alone, again, tolerance):
                noisy.setdefault(key, []).append(label)
        if in_batch is not None:
            for key in batch_dependent_outputs(alone, in_batch, rows, tolerance):
                if key not in noisy:
                    dependent.setdefault(key, []).append(label)
    findings = []
    if noisy:
        severity = "warning" if allow_nondeterministic else "error"
        findings.append(Finding(severity, "nondeterministic", (
            f"output(s) {_names(noisy)} differ between two runs of the same request; "
            + ("allowed by --allow-nondeterministic: they are left out of the comparisons" if allow_nondeterministic
               else "fix: remove randomness from the serving graph (training-mode dropout, sampling), or pass "
                    "--allow-nondeterministic for a model that samples on purpose"))))
    if dependent:
        findings.append(Finding("error", "batch-dependent", (
            f"output(s) {_names(dependent)} of a row change when other rows share its batch, as TF Serving's "
            f"batching does; fix: export the model in inference mode (no batch statistics: BatchNormalization "
            f"with training=False, no ops that reduce over the batch dimension)")))
    return findings, set(noisy)


def _names(where: dict[str, list[str]]) -> str:
    return ", ".join(f"'{k}' ({', '.join(v)})" for k, v in sorted(where.items()))


def json_findings(grpc: list[dict | None], rest: list[dict | None], output_dtypes: dict[str, str]) -> list[Finding]:
    """Warnings `rest-json` for what REST (JSON) answers lose against gRPC answers of the same server."""
    lost: dict[str, list[str]] = {}
    largest: dict[str, int] = {}
    for g, r in zip(grpc, rest):
        if g is None or r is None:
            continue
        for key in sorted(set(g) & set(r)):
            a, b = np.asarray(g[key]), np.asarray(r[key])
            dtype = output_dtypes.get(key, "")
            if dtype == "int64" and a.size:
                largest[key] = max(largest.get(key, 0), int(np.max(np.abs(a.astype(object)))))
            why = _json_loss(key, dtype, a, b)
            if why and why not in lost.get(key, []):
                lost.setdefault(key, []).append(why)
    for key, value in largest.items():
        if value >= JS_SAFE_INT:
            lost.setdefault(key, []).insert(0, (
                f"int64 values up to {value} exceed 2**53: JavaScript and other clients that read JSON numbers as "
                f"doubles round them (use gRPC, or return them as strings)"))
    return [Finding("warning", "rest-json", f"REST output '{key}': {'; '.join(reasons)}")
            for key, reasons in sorted(lost.items())]


def _json_loss(key: str, dtype: str, grpc: np.ndarray, rest: np.ndarray) -> str | None:
    if grpc.shape != rest.shape:
        return f"shape {rest.shape} over REST, {grpc.shape} over gRPC"
    if dtype == "string":
        differ = [i for i, (x, y) in enumerate(zip(grpc.reshape(-1), rest.reshape(-1))) if bytes(x) != bytes(y)]
        if differ:
            suffix = "" if key.endswith(BYTES_SUFFIX) else (
                f": strings that are not UTF-8 reach JSON clients mangled; name the output '{key}{BYTES_SUFFIX}' so "
                f"TF Serving sends it as {{\"b64\": ...}}")
            return f"strings differ from gRPC{suffix}"
        return None
    if dtype == "bool":
        return None if np.array_equal(grpc.astype(bool), rest.astype(bool)) else "booleans differ from gRPC"
    try:
        same = np.array_equal(grpc, rest.astype(grpc.dtype), equal_nan=grpc.dtype.kind == "f")
    except (TypeError, ValueError):
        same = False
    if same:
        return None
    if grpc.dtype.kind == "f":
        return "floats rounded in JSON (they differ from gRPC's)"
    return "values differ from gRPC"
