"""The verify report: plain dataclasses, rendered in one place as text, JSON (schema: docs/report-schema.md)
and JUnit XML. No TensorFlow, no printing."""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from exportkit.savedmodel.deployment import VERDICTS
from exportkit.dtypes import name_of_array
from exportkit.errors import EXIT_INFRA
from exportkit.findings import Finding
from exportkit.compare.outputs import OutputComparison, to_jsonable
from exportkit.verify.latency import latency_text
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
class VerifyReport:
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


# --------------------------------------------------------------------------------------------- helpers


def _g(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if x != x:
            return "nan"
        if x in (float("inf"), float("-inf")):
            return "inf" if x > 0 else "-inf"
        if x == 0:
            return "0"
        return f"{x:.3g}"
    return str(x)


def _pct(frac: float | None) -> str:
    if frac is None:
        return "-"
    if frac == 0:
        return "0%"
    p = 100 * frac
    return f"{p:.3g}%" if p >= 0.01 else "<0.01%"


def _tol(c: OutputComparison) -> str:
    if c.exact or (c.atol == 0 and c.rtol == 0):
        return "exact"
    return f"atol={_g(c.atol)} rtol={_g(c.rtol)}"


def needs(c: OutputComparison) -> str | None:
    """'needs atol >= 3e-05 or rtol >= 0.0012' for a failing numeric comparison that a tolerance can fix."""
    if c.passed or c.required_atol is None or c.exact or c.expected_dtype != c.actual_dtype:
        return None
    inf = float("inf")
    parts = []
    if c.required_atol != inf:
        parts.append(f"atol >= {_g(c.required_atol)}")
    if c.required_rtol is not None and c.required_rtol != inf:
        parts.append(f"rtol >= {_g(c.required_rtol)}")
    if not parts:
        return "no tolerance passes"
    return "needs " + " or ".join(parts)


_ANSI = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[@-Z\\-_])")
_CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def clean(s: str | None) -> str:
    """Text without ANSI escape sequences or control characters (newlines and tabs kept)."""
    return _CTRL.sub("", _ANSI.sub("", s or ""))


def _first_line(s: str | None) -> str:
    s = clean(s).strip()
    return s.splitlines()[0] if s else ""


def toolchain_text(t: dict) -> str:
    """`Python 3.11.7, TensorFlow 2.21.0 (CUDA 12.5.1, cuDNN 9), Keras 3.15.1`: one line of tfenv.toolchain()."""
    build = t.get("tensorflow_build") or {}
    cuda = f" (CUDA {build.get('cuda_version')}, cuDNN {build.get('cudnn_version')})" if build.get("is_cuda_build") else ""
    keras = t.get("keras") or {}
    kerases = (f"{keras['package']} {keras.get('version')}" if "package" in keras else
               ", ".join(f"{k} {v}" for k, v in keras.items() if k in ("keras", "tf_keras") and v))
    return f"Python {t.get('python')}, TensorFlow {t.get('tensorflow')}{cuda}" + (f", {kerases}" if kerases else "")


def _server_text(server: dict | None) -> str:
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


def _compared_keys(report: VerifyReport) -> list[str]:
    return sorted({c.key for r in report.runtimes for c in r.comparisons})


def _several(report: VerifyReport) -> bool:
    return len(report.signatures) > 1


def _who(report: VerifyReport, r: RuntimeResult) -> str:
    """A runtime's name, with its signature when several are verified."""
    return f"{r.signature}/{r.name}" if _several(report) and r.signature and r.kind != "agreement" else r.name


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
        out.append(f"lint: {len(errors)} error{'s' if len(errors) != 1 else ''} ({codes})")
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
            by_cause.setdefault(error_cause(r.error), []).append(_who(report, r))
            continue
        for c in r.comparisons:
            if not c.passed:
                key = f"{r.signature}/{c.key}" if _several(report) and r.signature else c.key
                by_output.setdefault(key, []).append((_who(report, r), c))
    out += [f"{', '.join(dict.fromkeys(names))}: {cause}" for cause, names in by_cause.items()]
    for key, failed in by_output.items():
        worst = max((c for _, c in failed), key=lambda c: (c.mismatched or 0, c.required_atol or 0.0))
        s = f"{', '.join(dict.fromkeys(n for n, _ in failed))}: output '{key}' {shorten(worst.reason or '', 70)}"
        n = needs(worst)
        out.append(f"{s} ({n})" if n else s)
    return out


VERDICT_LIMIT = 200  # characters of the last line: it must fit on a screen


def shorten(text: str, limit: int = 110) -> str:
    """`text` cut at a word boundary to at most `limit` characters, "..." marking the cut."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[:limit - 3].rsplit(" ", 1)[0].rstrip(" ,;:(")
    return cut + "..."


_UNKNOWN_OP = re.compile(r"Op type not registered '([^']+)'|unknown op '?([\w>./-]+)")


def error_cause(error: str | None) -> str:
    """A runtime error in a few words: the same cause reads the same whichever runtime (and TF) hit it."""
    text = clean(error)
    op = _UNKNOWN_OP.search(text)
    if op:
        return f"could not load the model (unknown op {op.group(1) or op.group(2)})"
    return "error: " + shorten(_first_line(error) or "unknown error", 90)


def join_verdict(head: str, parts: list[str], limit: int = VERDICT_LIMIT) -> str:
    """`HEAD: a; b; c` within `limit` characters: parts that do not fit are counted ("+2 more, see above")."""
    line = f"{head}: " + "; ".join(parts)
    for keep in range(len(parts) - 1, 0, -1):
        if len(line) <= limit:
            break
        line = f"{head}: " + "; ".join(parts[:keep]) + f"; +{len(parts) - keep} more (see above)"
    return line


_PATH_IN_PARENS = re.compile(r" \(/[^\s()]*\)")  # "tensorflow_model_server (/long/path/to/it)": the report has it


def infra_verdict(report: VerifyReport) -> str:
    """'ERROR (infrastructure): serving: the server ...' for a run an infrastructure failure stopped (exit 3): the
    environment failed, not the model; what else failed follows after "also failed"."""
    cause = _first_line(getattr(report.stopped, "message", None) or str(report.stopped)) or "unknown error"
    hit = [r for r in report.runtimes if r.status == "error" and _first_line(r.error) == cause]
    rest = failures(replace(report, runtimes=[r for r in report.runtimes if all(r is not h for h in hit)]))
    who = ", ".join(dict.fromkeys(_who(report, r) for r in hit))
    cause = _PATH_IN_PARENS.sub("", cause)
    parts = [shorten(f"{who}: {cause}" if who else cause, 150)] + [f"also failed: {p}" if i == 0 else p
                                                                   for i, p in enumerate(rest)]
    return join_verdict("ERROR (infrastructure)", parts)


def verdict_line(report: VerifyReport) -> str:
    if report.exit_code == EXIT_INFRA:
        return infra_verdict(report)
    if not report.passed:
        return join_verdict("FAILED", failures(report))
    ok = [r for r in report.runtimes if r.status == "ok" and r.kind != "agreement"]
    skipped = list(dict.fromkeys(_who(report, r) for r in report.runtimes if r.status == "skipped"))
    keys = _compared_keys(report)
    compared = [r for r in ok if not r.is_reference and r.comparisons]
    runtimes = len({r.name for r in ok})
    if not compared:
        line = f"PASSED: nothing compared (reference: {report.reference})"
    elif _several(report):
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
    notes = list(dict.fromkeys(notes))  # Keras 3's export: `serve` and `serving_default` say the same once
    return "; but " + ", ".join(notes) + " (see findings)" if notes else ""


def tensors_of(batch: dict) -> dict:
    """{input: {"dtype", "shape"}} of one batch of inputs, for the report's `inputs.tensors`."""
    return {key: {"dtype": name_of_array(np.asarray(value)), "shape": list(np.shape(value))}
            for key, value in batch.items()}


# --------------------------------------------------------------------------------------------- text

_HEADERS = ("RUNTIME", "DEVICE", "OUTPUT", "RESULT", "MAX ABS ERR", "MAX REL ERR", "OVER TOL", "TOLERANCE", "TIME",
            "FIRST/P50/P99 MS", "NOTE")


def _rows(report: VerifyReport) -> list[tuple[str, ...]]:
    rows = []
    for r in report.runtimes:
        rows += [((r.signature or "-") if i == 0 else "", *row) if _several(report) else row
                 for i, row in enumerate(_runtime_rows(r))]
    return rows


def _runtime_rows(r: RuntimeResult) -> list[tuple[str, ...]]:
    dev = r.device or "-"
    t, ms = f"{r.seconds:.2f}s", latency_text(r.latency)
    if r.status == "error":
        return [(r.name, dev, "-", "ERROR", "-", "-", "-", "-", t, ms, _first_line(r.error))]
    if r.status == "skipped":
        return [(r.name, dev, "-", "SKIP", "-", "-", "-", "-", t, ms, _first_line(r.error))]
    if r.is_reference and not r.comparisons:
        return [(r.name, dev, "*", "REF", "-", "-", "-", "-", t, ms, "reference")]
    if not r.comparisons:
        return [(r.name, dev, "-", "PASS", "-", "-", "-", "-", t, ms, "no outputs compared")]
    rows = []
    for i, c in enumerate(r.comparisons):
        note = "" if c.passed else c.reason or ""
        n = needs(c)
        if n:
            note = f"{note}; {n}" if note else n
        rows.append((r.name if i == 0 else "", dev if i == 0 else "", c.key, "PASS" if c.passed else "FAIL",
                     _g(c.max_abs_err), _g(c.max_rel_err), _pct(c.mismatch_fraction), _tol(c),
                     t if i == 0 else "", ms if i == 0 else "", note))
    return rows


def _v(x: Any) -> str:
    """A value of a worst record, precise enough to see the difference (float32 has ~7 digits)."""
    return f"{x:.7g}" if isinstance(x, float) else str(x)


_QUANTILE_HEADERS = ("RUNTIME", "OUTPUT", "RECORDS", "FAILING", "ABS P50", "ABS P99", "ABS P99.9", "REL P50",
                     "REL P99", "REL P99.9")


def _data_sections(report: VerifyReport) -> list[str]:
    """--data runs: error quantiles per runtime x output, and the worst records of failing outputs."""
    rows, worst = [], []
    for r in report.runtimes:
        for c in r.comparisons:
            if c.records is None:
                continue
            q_abs, q_rel = c.abs_err_quantiles or {}, c.rel_err_quantiles or {}
            rows.append((r.name, c.key, str(c.records), str(c.failing_records or 0),
                         *(_g(q_abs.get(p)) for p in ("p50", "p99", "p99.9")),
                         *(_g(q_rel.get(p)) for p in ("p50", "p99", "p99.9"))))
            if not c.passed and c.worst_records:
                worst.append(f"  {r.name} / {c.key}:")
                for w in c.worst_records[:5]:
                    at = f" (byte {w['offset']})" if w.get("offset") is not None else ""
                    err = f", abs err {_g(w['abs_err'])}" if w.get("abs_err") is not None else ""
                    worst.append(f"    {w['file']}:{w['index']}{at} element {list(w['element'])}: "
                                 f"expected {_v(w['expected'])}, got {_v(w['actual'])}{err}")
    skipped = [f"  {n} x {why}" for why, n in (report.inputs.get("skipped") or {}).items()]
    lines = ["", "PredictionLog records skipped (as TF Serving would refuse them, or for another signature):"] \
        + skipped if skipped else []
    if not rows:
        return lines
    lines += ["", "error quantiles per element (log-binned, within 1.2%):"] + _table(_QUANTILE_HEADERS, rows)
    if worst:
        lines += ["", "worst records (FILE:INDEX, records counted from 0):"] + worst
    return lines


def _table(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = []
    for row in (headers, *rows):
        cells = [c.ljust(w) for c, w in zip(row, widths)]
        lines.append("  ".join(cells).rstrip())
    return lines


DETAIL_LINES = 60


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


def render_text(report: VerifyReport) -> str:
    """Plain text (no ANSI codes): header, table runtime x output, servers, findings, one verdict line."""
    inp = report.inputs or {}
    noun = "signatures" if _several(report) else "signature"
    head = [f"exportkit verify {report.path}  ({noun} {report.signature}, exportkit {report.exportkit_version})"]
    desc = [f"inputs: {inp.get('source', '?')}"]
    if inp.get("path"):
        desc.append(str(inp["path"]))
    if inp.get("batch_sizes"):
        desc.append("batch sizes " + batch_sizes_text(inp["batch_sizes"]))
    if inp.get("seed") is not None and inp.get("source") == "generated":
        desc.append(f"seed {inp['seed']}")
    if inp.get("records") is not None:
        desc.append(f"{inp['records']} records in {inp.get('files')} file(s)"
                    + (f", sampled at {inp['sample']:g} (seed {inp['seed']})" if inp.get("sample") else "")
                    + (f", {inp['runner']} runner" if inp.get("runner") else ""))
    tf32 = {None: "n/a", True: "on", False: "off"}[report.tf32]
    head.append(", ".join(desc) + f"; reference: {report.reference}; tf32: {tf32}")
    head += context_lines(report).values()
    headers = ("SIGNATURE", *_HEADERS) if _several(report) else _HEADERS
    lines = head + [""] + _table(headers, _rows(report))
    if report.chain:
        lines += ["", "training-time reference (links of trained -> reloaded -> SavedModel -> serving):"]
        rows = [(c["link"], f"{c['from'] or '-'} vs {c['to'] or '-'}", c["output"] or "-",
                 {True: "PASS", False: "BROKEN", None: "-"}[c["passed"]], _g(c.get("max_abs_err")),
                 c["reason"] or "") for c in report.chain]
        lines += ["  " + line for line in _table(("LINK", "RUNTIMES", "OUTPUT", "RESULT", "MAX ABS ERR", "NOTE"), rows)]
    lines += _data_sections(report)
    details = [(r.name, clean(r.error).strip().splitlines()) for r in report.runtimes if r.status == "error" and r.error]
    details = [(name, text) for name, text in details if len(text) > 1]
    if details:  # a dead server's log tail, a worker's traceback line: the table only has room for the first line
        lines.append("")
        for name, text in details:
            lines.append(f"{name} error:")
            lines += [f"  {ln}" for ln in text[:DETAIL_LINES]]
            if len(text) > DETAIL_LINES:
                lines.append(f"  ... {len(text) - DETAIL_LINES} more lines (--json has them all)")
    servers = list(dict.fromkeys((r.name, _server_text(r.server)) for r in report.runtimes if r.server))
    if servers:
        lines.append("")
        lines += [f"server: {name}: {text}" for name, text in servers]
    if report.findings:
        lines.append("")
        lines.append("findings:")
        w = max(len(f.code) for f in report.findings)
        lines += [f"  {f.severity:<7}  {f.code:<{w}}  {clean(f.message)}" for f in report.findings]
    lines.append("")
    lines.append(verdict_line(report))
    return "\n".join(lines)  # no trailing newline: callers print() it


# --------------------------------------------------------------------------------------------- JSON


def runtime_to_dict(r: RuntimeResult) -> dict:
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
    }


# --------------------------------------------------------------------------------------------- JUnit


_XML_BAD = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _x(s: Any) -> str:
    """Text safe for XML 1.0 (TF error logs may hold ANSI escapes and other control characters)."""
    return _XML_BAD.sub("?", clean("" if s is None else str(s)))


SUMMARY_FIELDS = ("abs_err_histogram", "rel_err_histogram", "worst_elements", "sample_pairs")  # for plots, not text


def _failure_text(c: OutputComparison) -> str:
    lines = [f"{k}: {v}" for k, v in c.to_dict().items() if v is not None and k not in SUMMARY_FIELDS]
    return "\n".join(lines)


def to_junit_xml(report: VerifyReport) -> str:
    """JUnit XML: one testcase per runtime x output (classname exportkit.verify.<runtime>, name <output>),
    one testcase named "runtime" for a runtime that errored (<error>) or was skipped (<skipped>),
    one testcase per error finding (classname exportkit.savedmodel.lint, name <code>, <failure>). Suite properties: what the
    text report's header says (toolchain, server_flags, baseline), the servers, latency.<runtime>."""
    suite = ET.Element("testsuite", name="exportkit.verify")
    props = ET.SubElement(suite, "properties")
    for k, v in (("path", report.path), ("signature", report.signature), ("reference", report.reference),
                 ("tf32", report.tf32), ("exportkit_version", report.exportkit_version),
                 ("toolchain", toolchain_text(report.toolchain) if report.toolchain else ""),
                 ("server_flags", " ".join(report.server_flags) or "stock"),
                 ("inputs", ", ".join(f"{a}={b}" for a, b in (report.inputs or {}).items()))):
        ET.SubElement(props, "property", name=k, value=_x(v))
    if report.baseline:
        ET.SubElement(props, "property", name="baseline", value=_x(baseline_text(report.baseline)))
    for r in report.runtimes:
        if r.server:
            ET.SubElement(props, "property", name=f"server.{r.name}", value=_x(_server_text(r.server)))
    for r in report.runtimes:
        if r.latency:  # first/p50/p99 ms (verify/latency.py), per runtime row
            ET.SubElement(props, "property", name=f"latency.{_who(report, r)}",
                          value=_x(f"{latency_text(r.latency)} ms (first/p50/p99) over {r.latency['requests']} "
                                   f"request(s)"))
    tests = failures_n = errors = skipped = 0
    total_time = 0.0
    for r in report.runtimes:
        cls = f"exportkit.verify.{r.signature}.{r.name}" if _several(report) else f"exportkit.verify.{r.name}"
        total_time += float(r.seconds)
        if r.status in ("error", "skipped"):
            tc = ET.SubElement(suite, "testcase", classname=cls, name="runtime", time=f"{r.seconds:.3f}")
            tests += 1
            if r.status == "error":
                errors += 1
                el = ET.SubElement(tc, "error", message=_x(_first_line(r.error) or "error"), type="RuntimeError")
                el.text = _x(r.error)
            else:
                skipped += 1
                ET.SubElement(tc, "skipped", message=_x(_first_line(r.error) or "skipped"))
            continue
        for c in r.comparisons:
            tc = ET.SubElement(suite, "testcase", classname=cls, name=_x(c.key), time="0")
            tests += 1
            if c.records is not None:  # --data: the streamed statistics
                tc_props = ET.SubElement(tc, "properties")
                for name, value in (("records", c.records), ("failing_records", c.failing_records),
                                    ("max_abs_err", c.max_abs_err), ("max_rel_err", c.max_rel_err)):
                    ET.SubElement(tc_props, "property", name=name, value=_x(_g(value)))
                for kind, q in (("abs_err", c.abs_err_quantiles), ("rel_err", c.rel_err_quantiles)):
                    for p, value in (q or {}).items():
                        ET.SubElement(tc_props, "property", name=f"{kind}_{p}", value=_x(_g(value)))
            if not c.passed:
                failures_n += 1
                n = needs(c)
                msg = f"{c.reason}" + (f" ({n})" if n else "")
                el = ET.SubElement(tc, "failure", message=_x(msg), type="OutputMismatch")
                el.text = _x(_failure_text(c))
    for f in report.findings:
        if f.severity != "error":
            continue
        tc = ET.SubElement(suite, "testcase", classname="exportkit.savedmodel.lint", name=_x(f.code), time="0")
        tests += 1
        failures_n += 1
        el = ET.SubElement(tc, "failure", message=_x(f.message), type="LintError")
        el.text = _x(f.message)
    for k, v in (("tests", tests), ("failures", failures_n), ("errors", errors), ("skipped", skipped),
                 ("time", f"{total_time:.3f}")):
        suite.set(k, str(v))
    root = ET.Element("testsuites", name="exportkit", tests=str(tests), failures=str(failures_n),
                      errors=str(errors), skipped=str(skipped), time=f"{total_time:.3f}")
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
