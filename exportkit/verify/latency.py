"""Request latency per runtime: the first request (what a client waits for right after a load: graph tracing, lazy
initialisation, a warm-up that did not cover it) and the steady state after it. Pure functions over the seconds
each batch took in `runtime.run` (for the serving runtimes: the whole gRPC/REST round trip).

`--max-latency-ms N` gates on the steady-state p99 of each runtime that executes the model (not the recorded
golden/trained ones), per signature: the batches after the first; a runtime that ran one batch is judged on it.
"""
from __future__ import annotations

import numpy as np

from exportkit.findings import Finding


def latency_summary(seconds: list[float]) -> dict | None:
    """{"requests", "first_ms", "p50_ms", "p99_ms"} (steady state: every request after the first; p50/p99 of the
    one request when it is the only one), or None when nothing ran."""
    if not seconds:
        return None
    ms = np.asarray(seconds, dtype=float) * 1000.0
    steady = ms[1:] if len(ms) > 1 else ms
    return {"requests": int(len(ms)), "first_ms": round(float(ms[0]), 3),
            "p50_ms": round(float(np.percentile(steady, 50)), 3), "p99_ms": round(float(np.percentile(steady, 99)), 3)}


def latency_findings(results, max_ms: float | None) -> list[Finding]:
    """An error per runtime row whose steady-state p99 exceeds `max_ms` (`results`: RuntimeResults)."""
    if max_ms is None:
        return []
    over = [r for r in results if r.latency and r.latency["p99_ms"] > max_ms]
    return [Finding("error", "latency-over-limit",
                    f"{r.name}" + (f" (signature '{r.signature}')" if r.signature else "") +
                    f": steady-state p99 {r.latency['p99_ms']:g} ms over {r.latency['requests'] - 1 or 1} request(s) "
                    f"exceeds --max-latency-ms {max_ms:g} (p50 {r.latency['p50_ms']:g} ms, first request "
                    f"{r.latency['first_ms']:g} ms); make the model faster, or raise the limit")
            for r in over]


def latency_text(latency: dict | None) -> str:
    """'120/3.1/4.2' (first/p50/p99 in ms) for the report table."""
    if not latency:
        return "-"
    return "/".join(f"{latency[k]:.3g}" for k in ("first_ms", "p50_ms", "p99_ms"))
