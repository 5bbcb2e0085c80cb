"""verify's report as plain text (no ANSI codes), as `exportkit verify` prints it: a header, the table runtime x
output, the --data sections, error details, servers, findings and the verdict line."""
from __future__ import annotations

from typing import Any

from exportkit.report.format import clean, first_line, number, percent, text_table
from exportkit.verify.latency import latency_text
from exportkit.verify.memory import MEMORY_HEADERS, memory_rows
from exportkit.verify.messages import MESSAGE_HEADERS, message_rows
from exportkit.verify.report import (RuntimeResult, VerifyReport, batch_sizes_text, context_lines, needs, server_text,
                                     several, tolerance_text, verdict_line)

_HEADERS = ("RUNTIME", "DEVICE", "OUTPUT", "RESULT", "MAX ABS ERR", "MAX REL ERR", "OVER TOL", "TOLERANCE", "TIME",
            "FIRST/P50/P99 MS", "NOTE")


def _rows(report: VerifyReport) -> list[tuple[str, ...]]:
    rows = []
    for r in report.runtimes:
        rows += [((r.signature or "-") if i == 0 else "", *row) if several(report) else row
                 for i, row in enumerate(_runtime_rows(r))]
    return rows


def _runtime_rows(r: RuntimeResult) -> list[tuple[str, ...]]:
    dev = r.device or "-"
    t, ms = f"{r.seconds:.2f}s", latency_text(r.latency)
    if r.status == "error":
        return [(r.name, dev, "-", "ERROR", "-", "-", "-", "-", t, ms, first_line(r.error))]
    if r.status == "skipped":
        return [(r.name, dev, "-", "SKIP", "-", "-", "-", "-", t, ms, first_line(r.error))]
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
                     number(c.max_abs_err), number(c.max_rel_err), percent(c.mismatch_fraction), tolerance_text(c),
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
                         *(number(q_abs.get(p)) for p in ("p50", "p99", "p99.9")),
                         *(number(q_rel.get(p)) for p in ("p50", "p99", "p99.9"))))
            if not c.passed and c.worst_records:
                worst.append(f"  {r.name} / {c.key}:")
                for w in c.worst_records[:5]:
                    at = f" (byte {w['offset']})" if w.get("offset") is not None else ""
                    err = f", abs err {number(w['abs_err'])}" if w.get("abs_err") is not None else ""
                    worst.append(f"    {w['file']}:{w['index']}{at} element {list(w['element'])}: "
                                 f"expected {_v(w['expected'])}, got {_v(w['actual'])}{err}")
    skipped = [f"  {n} x {why}" for why, n in (report.inputs.get("skipped") or {}).items()]
    lines = ["", "PredictionLog records skipped (as TF Serving would refuse them, or for another signature):"] \
        + skipped if skipped else []
    if not rows:
        return lines
    lines += ["", "error quantiles per element (log-binned, within 1.2%):"] + text_table(_QUANTILE_HEADERS, rows)
    if worst:
        lines += ["", "worst records (FILE:INDEX, records counted from 0):"] + worst
    return lines


DETAIL_LINES = 60  # of one runtime's error (a server's log tail): --json has them all


def render_text(report: VerifyReport) -> str:
    """Plain text (no ANSI codes): header, table runtime x output, servers, findings, one verdict line."""
    inp = report.inputs or {}
    noun = "signatures" if several(report) else "signature"
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
    headers = ("SIGNATURE", *_HEADERS) if several(report) else _HEADERS
    lines = head + [""] + text_table(headers, _rows(report))
    if report.chain:
        lines += ["", "training-time reference (links of trained -> reloaded -> SavedModel -> serving):"]
        rows = [(c["link"], f"{c['from'] or '-'} vs {c['to'] or '-'}", c["output"] or "-",
                 {True: "PASS", False: "BROKEN", None: "-"}[c["passed"]], number(c.get("max_abs_err")),
                 c["reason"] or "") for c in report.chain]
        lines += ["  " + line for line in text_table(("LINK", "RUNTIMES", "OUTPUT", "RESULT", "MAX ABS ERR", "NOTE"), rows)]
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
    servers = list(dict.fromkeys((r.name, server_text(r.server)) for r in report.runtimes if r.server))
    if servers:
        lines.append("")
        lines += [f"server: {name}: {text}" for name, text in servers]
    if report.memory:
        lines += ["", "memory (what this version costs the server; MB = 10^6 bytes):"]
        lines += ["  " + line for line in text_table(MEMORY_HEADERS, memory_rows(report.memory))]
    if report.messages:
        lines += ["", "gRPC messages at the largest batch tried (TF Serving sends and accepts up to 2 GiB; a default "
                      "gRPC client receives up to 4 MiB = 4,194,304 bytes):"]
        lines += ["  " + line for line in text_table(MESSAGE_HEADERS, message_rows(report.messages))]
    if report.findings:
        lines.append("")
        lines.append("findings:")
        w = max(len(f.code) for f in report.findings)
        lines += [f"  {f.severity:<7}  {f.code:<{w}}  {clean(f.message)}" for f in report.findings]
    lines.append("")
    lines.append(verdict_line(report))
    return "\n".join(lines)  # no trailing newline: callers print() it
