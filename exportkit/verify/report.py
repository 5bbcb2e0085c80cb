"""The verify report: plain dataclasses, their verdict and the JSON document (schema: docs/report-schema.md).
The renderings are beside it: render_text.py, render_junit.py, render_html.py, render_markdown.py. No TensorFlow, no
printing."""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import numpy as np

from exportkit.savedmodel.deployment import VERDICTS
from exportkit.dtypes import name_of_array
from exportkit.errors import EXIT_INFRA
from exportkit.findings import Finding
from exportkit.compare.outputs import OutputComparison, to_jsonable
from exportkit.report.base import Report
from exportkit.report.format import clean, error_cause, first_line, join_verdict, number, shorten, size_text
from exportkit.serving.messages import CLIENT_MAX_RECEIVE
from exportkit.version import __version__

SCHEMA_VERSION = 1


@dataclass
class RuntimeResult:
    name: str  # trained | golden | keras | saved_model | session | serving
    kind: str  # recorded | in-process | subprocess | grpc
    device: str | None = None  # "cpu", "gpu:0", ... (None: not applicable or unknown)
    server: dict | None = None  # serving only, e.g. {"kind": "embedded", "version": "2.21.0", "address": "127.0.0.1:1234"}
    status: str = "ok"  # ok | error | skipped
    error: str | None = None  # status error: what failed; status skipped: why it was skipped
    seconds: float = 0.0
    is_reference: bool = False
    comparisons: list[OutputComparison] = field(default_factory=list)
    signature: str | None = None  # the signature these outputs answer for
    latency: dict | None = None  # {"requests", "first_ms", "p50_ms", "p99_ms"} (verify/latency.py); None: not timed

    @property
    def passed(self) -> bool:
        """Not failing: no error and every comparison passed (a skipped runtime does not fail)."""
        return self.status != "error" and all(c.passed for c in self.comparisons)


@dataclass
class VerifyReport(Report):
    path: str
    signature: str
    reference: str  # name of the reference runtime
    runtimes: list[RuntimeResult] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    inputs: dict = field(default_factory=dict)  # {"source": "golden"|"file"|"generated", "batch_sizes": [..], "seed": int|None, "path"?: str}
    tf32: bool | None = None
    exportkit_version: str = __version__
    # training-time reference: per link of trained -> reloaded -> SavedModel -> serving and output, a dict
    # {link, from, to, output, passed, max_abs_err?, reason}
    chain: list[dict] = field(default_factory=list)
    signatures: list[str] = field(default_factory=list)  # every signature verified, in order
    references: dict[str, str] = field(default_factory=dict)  # signature -> its reference runtime
    toolchain: dict = field(default_factory=dict)  # tfenv.toolchain(): Python, TensorFlow + build, Keras
    server_flags: list[str] = field(default_factory=list)  # --server-flag, as tensorflow_model_server arguments
    # why the run stopped early: a graph verify refuses to execute (CheckFailed) or an infrastructure failure
    stopped: Exception | None = field(default=None, repr=False, compare=False)
    # the signatures compared with the released ones: {"new", "old", "source": previous-version | serving |
    # --baseline | none, "why"?} (verify/checks.py baseline_findings); None: not compared
    baseline: dict | None = None
    # what the version costs the server: TF Serving's estimate, the measured figures, the swap (verify/memory.py)
    memory: dict | None = None
    # per signature: the gRPC request and answer at each batch size tried, the most rows a default client and TF
    # Serving's server take (verify/messages.py signature_sizes)
    messages: list[dict] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """No error finding, no runtime with status error, every comparison passed. Skipped runtimes don't fail."""
        return (not any(f.severity == "error" for f in self.findings)
                and all(r.passed for r in self.runtimes))

    @property
    def exit_code(self) -> int:
        """The CLI's exit code for this report: 0 passed, 1 the model fails a check, 3 infrastructure."""
        if self.stopped is not None:
            return getattr(self.stopped, "exit_code", 3)
        return 0 if self.passed else 1

    @property
    def verdict(self) -> str:
        return verdict_line(self)

    @property
    def outputs(self) -> dict[str, dict[str, OutputComparison]]:
        """Every comparison: {output key ("SIGNATURE/key" when several signatures were verified): {runtime: it}}."""
        several = len(self.signatures) > 1
        table: dict[str, dict[str, OutputComparison]] = {}
        for r in self.runtimes:
            for c in r.comparisons:
                key = f"{r.signature}/{c.key}" if several and r.signature else c.key
                table.setdefault(key, {})[r.name] = c
        return table

    def to_dict(self) -> dict:
        """The JSON report, as `verify --json` writes it (docs/report-schema.md)."""
        return to_json(self)


# --------------------------------------------------------------------------------------------- phrases


def tolerance_text(c: OutputComparison) -> str:
    """`exact` or `atol=1e-05 rtol=1e-05`."""
    if c.exact or (c.atol == 0 and c.rtol == 0):
        return "exact"
    return f"atol={number(c.atol)} rtol={number(c.rtol)}"


def needs(c: OutputComparison) -> str | None:
    """'needs atol >= 3e-05 or rtol >= 0.0012' for a failing numeric comparison that a tolerance can fix."""
    if c.passed or c.required_atol is None or c.exact or c.expected_dtype != c.actual_dtype:
        return None
    inf = float("inf")
    parts = []
    if c.required_atol != inf:
        parts.append(f"atol >= {number(c.required_atol)}")
    if c.required_rtol is not None and c.required_rtol != inf:
        parts.append(f"rtol >= {number(c.required_rtol)}")
    if not parts:
        return "no tolerance passes"
    return "needs " + " or ".join(parts)


def toolchain_text(t: dict) -> str:
    """`Python 3.11.7, TensorFlow 2.21.0 (CUDA 12.5.1, cuDNN 9), Keras 3.15.1`: one line of tfenv.toolchain()."""
    build = t.get("tensorflow_build") or {}
    cuda = f" (CUDA {build.get('cuda_version')}, cuDNN {build.get('cudnn_version')})" if build.get("is_cuda_build") else ""
    keras = t.get("keras") or {}
    kerases = (f"{keras['package']} {keras.get('version')}" if "package" in keras else
               ", ".join(f"{k} {v}" for k, v in keras.items() if k in ("keras", "tf_keras") and v))
    return f"Python {t.get('python')}, TensorFlow {t.get('tensorflow')}{cuda}" + (f", {kerases}" if kerases else "")


def server_text(server: dict | None) -> str:
    """`embedded server version 2.21.0 at 127.0.0.1:8500`: which server answered."""
    if not server:
        return ""
    kind = server.get("kind", "?")
    bits = [f"{kind} server"]
    if server.get("version"):
        bits.append(f"version {server['version']}")
    if server.get("address"):
        bits.append(f"at {server['address']}")
    extra = {k: v for k, v in server.items() if k not in ("kind", "version", "address") and v is not None}
    if extra:
        bits.append("(" + ", ".join(f"{k}={v}" for k, v in extra.items()) + ")")
    return " ".join(bits)


def compared_keys(report: VerifyReport) -> list[str]:
    """Every output key some runtime compared, sorted."""
    return sorted({c.key for r in report.runtimes for c in r.comparisons})


def several(report: VerifyReport) -> bool:
    """Several signatures were verified: runtimes and outputs are named with theirs."""
    return len(report.signatures) > 1


def who(report: VerifyReport, r: RuntimeResult) -> str:
    """A runtime's name, with its signature when several are verified."""
    return f"{r.signature}/{r.name}" if several(report) and r.signature and r.kind != "agreement" else r.name


def failures(report: VerifyReport) -> list[str]:
    """One short sentence per reason the report fails, in report order (the whole reasons are in the sections
    above the verdict). Runtimes that failed the same way, or on the same output, share one sentence."""
    out = []
    breaking = [f.message.split(";")[0].split(" (compared with")[0] for f in report.findings
                if f.severity == "error" and f.code.startswith("baseline-")]
    if breaking:
        old = (report.baseline or {}).get("old") or "the released version"
        out.append(shorten(f"breaks clients of {old}: {'; '.join(breaking)}", 150))
    errors = [f.code for f in report.findings if f.severity == "error" and not f.code.startswith("baseline-")]
    if errors:
        codes = ", ".join(dict.fromkeys(errors))
        # not only lint's: XLA, memory and message-size findings are errors too
        out.append(f"{len(errors)} error finding{'s' if len(errors) != 1 else ''} ({codes})")
        out += [VERDICTS[code] for code in dict.fromkeys(errors) if code in VERDICTS]
    broken = {}
    for c in report.chain:
        if c["passed"] is False:
            broken.setdefault(c["output"], c)
    for key, c in broken.items():
        out.append(shorten(f"output '{key}': link {c['link']} broke ({c['from']} vs {c['to']}: {c['reason']})"))
    by_cause: dict[str, list[str]] = {}
    by_output: dict[str, list[tuple[str, OutputComparison]]] = {}
    for r in report.runtimes:
        if r.status == "error":
            by_cause.setdefault(error_cause(r.error), []).append(who(report, r))
            continue
        for c in r.comparisons:
            if not c.passed:
                key = f"{r.signature}/{c.key}" if several(report) and r.signature else c.key
                by_output.setdefault(key, []).append((who(report, r), c))
    out += [f"{', '.join(dict.fromkeys(names))}: {cause}" for cause, names in by_cause.items()]
    for key, failed in by_output.items():
        worst = max((c for _, c in failed), key=lambda c: (c.mismatched or 0, c.required_atol or 0.0))
        s = f"{', '.join(dict.fromkeys(n for n, _ in failed))}: output '{key}' {shorten(worst.reason or '', 70)}"
        n = needs(worst)
        out.append(f"{s} ({n})" if n else s)
    return out


_PATH_IN_PARENS = re.compile(r" \(/[^\s()]*\)")  # "tensorflow_model_server (/long/path/to/it)": the report has it


def infra_verdict(report: VerifyReport) -> str:
    """'ERROR (infrastructure): serving: the server ...' for a run an infrastructure failure stopped (exit 3): the
    environment failed, not the model; what else failed follows after "also failed"."""
    cause = first_line(getattr(report.stopped, "message", None) or str(report.stopped)) or "unknown error"
    hit = [r for r in report.runtimes if r.status == "error" and first_line(r.error) == cause]
    rest = failures(replace(report, runtimes=[r for r in report.runtimes if all(r is not h for h in hit)]))
    names = ", ".join(dict.fromkeys(who(report, r) for r in hit))
    cause = _PATH_IN_PARENS.sub("", cause)
    parts = [shorten(f"{names}: {cause}" if names else cause, 150)] + [f"also failed: {p}" if i == 0 else p
                                                                       for i, p in enumerate(rest)]
    return join_verdict("ERROR (infrastructure)", parts)


def verdict_line(report: VerifyReport) -> str:
    """The last line of every rendering: PASSED, FAILED or ERROR (infrastructure), and why in a few words."""
    if report.exit_code == EXIT_INFRA:
        return infra_verdict(report)
    if not report.passed:
        return join_verdict("FAILED", failures(report))
    ok = [r for r in report.runtimes if r.status == "ok" and r.kind != "agreement"]
    skipped = list(dict.fromkeys(who(report, r) for r in report.runtimes if r.status == "skipped"))
    keys = compared_keys(report)
    compared = [r for r in ok if not r.is_reference and r.comparisons]
    runtimes = len({r.name for r in ok})
    if not compared:
        line = f"PASSED: nothing compared (reference: {report.reference})"
    elif several(report):
        agreements = [r for r in report.runtimes if r.kind == "agreement"]
        line = (f"PASSED: {len(report.signatures)} signatures, each through {runtimes} runtime"
                f"{'s' if runtimes != 1 else ''} that agree")
        if agreements:
            pairs = sorted({r.name.partition(": ")[2] for r in agreements})
            line += f"; tf.Example signatures answer what their tensor twins answer ({', '.join(pairs)})"
        refs = sorted(set(report.references.values()))
        line += f" (reference: {', '.join(refs) or report.reference})"
    else:
        line = (f"PASSED: {runtimes} runtime{'s' if runtimes != 1 else ''} agree on {len(keys)} "
                f"output{'s' if len(keys) != 1 else ''} (reference: {report.reference})")
    if skipped:
        line += "; skipped: " + ", ".join(skipped)
    return line + verdict_notes(report)


_NON_FINITE = re.compile(r"output '([^']+)' is (\S+) in")


_OPEN_DIM = re.compile(r"(input '[^']+' dims? [\d, ]+) \(.*?\) set to (\d+)")


def verdict_notes(report: VerifyReport) -> str:
    """'; but output 'y' holds NaN' for a passing verdict: runtimes agreeing on NaN, or a model that fails at a
    size its signature allows, are no passes to be quiet about."""
    notes = [f"output '{m.group(1)}' holds {m.group(2)}" for f in report.findings
             if f.code == "non-finite-output" and f.severity == "warning" for m in [_NON_FINITE.search(f.message)] if m]
    notes += [f"{m.group(1)} fails at {m.group(2)}" for f in report.findings
              if f.code == "dynamic-dim-fails" and f.severity == "warning" for m in [_OPEN_DIM.search(f.message)] if m]
    notes += [f"a default gRPC client cannot receive the {size_text(b['response_bytes'])} {m['api']} answer to "
              f"{b['rows']} rows" for m in report.messages for b in m["batches"][-1:]
              if (b["response_bytes"] or 0) > CLIENT_MAX_RECEIVE]
    notes = list(dict.fromkeys(notes))  # Keras 3's export: `serve` and `serving_default` say the same once
    return "; but " + ", ".join(notes) + " (see findings)" if notes else ""


def tensors_of(batch: dict) -> dict:
    """{input: {"dtype", "shape"}} of one batch of inputs, for the report's `inputs.tensors`."""
    return {key: {"dtype": name_of_array(np.asarray(value)), "shape": list(np.shape(value))}
            for key, value in batch.items()}


def batch_sizes_text(sizes: list[int], limit: int = 8) -> str:
    """`1, 8` as is; runs of one size folded (`1, 256 x390, 160`), and at most `limit` groups shown."""
    groups: list[list[int]] = []
    for size in sizes:
        if groups and groups[-1][0] == size:
            groups[-1][1] += 1
        else:
            groups.append([size, 1])
    parts = [f"{size} x{n}" if n > 1 else str(size) for size, n in groups]
    if len(parts) > limit:
        parts = parts[:limit] + [f"... ({len(sizes)} batches, {sum(sizes)} rows)"]
    return ", ".join(parts)


BASELINE_SOURCES = {"previous-version": "the version TF Serving served before", "serving": "what clients get now",
                    "--baseline": "--baseline"}


def baseline_text(baseline: dict) -> str:
    """'baseline: signatures compared with models/m/1 (the version TF Serving served before)'."""
    if baseline.get("old") is None:
        return f"baseline: none ({baseline.get('why') or 'not compared'})"
    return f"baseline: signatures compared with {baseline['old']} ({BASELINE_SOURCES.get(baseline['source'], '')})"


def context_lines(report: VerifyReport) -> dict[str, str]:
    """What computed the results and what the signatures were compared with, as every rendering (text, HTML,
    Markdown) shows them under its title: {"toolchain": the toolchain and server flags, "baseline": ...}."""
    lines = {}
    if report.toolchain:
        lines["toolchain"] = (toolchain_text(report.toolchain) + "; server flags: "
                              + (" ".join(report.server_flags) or "stock"))
    if report.baseline:
        lines["baseline"] = baseline_text(report.baseline)
    return lines


# --------------------------------------------------------------------------------------------- JSON


def runtime_to_dict(r: RuntimeResult) -> dict:
    """One entry of the JSON report's `runtimes`."""
    return {
        "name": r.name, "kind": r.kind, "device": r.device, "server": to_jsonable(r.server), "status": r.status,
        "error": None if r.error is None else clean(r.error), "seconds": round(float(r.seconds), 6), "is_reference": bool(r.is_reference),
        "passed": r.passed, "outputs": [c.to_dict() for c in r.comparisons], "signature": r.signature,
        "latency": r.latency,
    }


def to_json(report: VerifyReport) -> dict:
    """The JSON report (a dict ready for json.dumps; see docs/report-schema.md)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "passed": report.passed,
        "verdict": verdict_line(report),
        "path": str(report.path),
        "signature": report.signature,
        "signatures": list(report.signatures),
        "reference": report.reference,
        "references": dict(report.references),
        "inputs": to_jsonable(report.inputs or {}),
        "tf32": report.tf32,
        "exportkit_version": report.exportkit_version,
        "toolchain": to_jsonable(report.toolchain),
        "server_flags": list(report.server_flags),
        "runtimes": [runtime_to_dict(r) for r in report.runtimes],
        "findings": [f.to_dict() for f in report.findings],
        "reference_chain": to_jsonable(report.chain),
        "baseline": to_jsonable(report.baseline),
        "memory": to_jsonable(report.memory),
        "messages": to_jsonable(report.messages),
    }
