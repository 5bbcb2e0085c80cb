"""`exportkit diff`'s report: plain dataclasses (DiffReport, OutputChange, Gate) and their renderings in one place:
the text table, JSON (docs/diff.md documents the schema), the Markdown summary and the HTML page (report/html.py's
page and tables, report/plots.py's histograms)."""
from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass, field

from exportkit.data.changes import ChangeStats
from exportkit.findings import Finding, has_errors
from exportkit.compare.outputs import to_jsonable
from exportkit.compare.summaries import histogram_summary
from exportkit.report import plots
from exportkit.report.artifacts import print_report, write_report_files
from exportkit.report.base import Report
from exportkit.report.format import clean, join_verdict, number, size_text, text_table
from exportkit.report.html import e, page, table
from exportkit.report.markdown import cell, heading, table as markdown_table
from exportkit.verify.memory import MEMORY_HEADERS, memory_rows
from exportkit.version import __version__

SCHEMA_VERSION = 1  # of `diff --json` (docs/diff.md), as every other JSON document of exportkit
CONFUSION_CLASSES = 10


@dataclass
class OutputChange:
    """One output's change from the old version to the new one, over every record compared."""

    key: str
    kind: str  # top1 (a derived top-1 output) | numeric | categorical (strings, bools)
    records: int
    changed_records: int
    changed_share: float | None
    abs_change: dict | None = None  # {"p50", "p99", "p99.9", "max"} of |new - old| per element
    rel_change: dict | None = None  # the same of |new - old| / |old|
    mean_shift: float | None = None  # mean of new - old per element
    top1_changed_share: float | None = None
    confusion: dict | None = None  # {"classes": [...], "counts": [[old x new]], "other": n}
    most_changed: list[dict] = field(default_factory=list)  # {file, index, offset, element, old, new, abs_change}
    metric: dict | None = None  # {"name", "old", "new", "delta", "gain"}
    abs_histogram: dict | None = None
    rel_histogram: dict | None = None
    problem: str | None = None  # the output is missing on one side, or its shape changed


@dataclass
class Gate:
    name: str  # max-changed-top1 | max-abs-change pNN | min-metric-delta (metric)
    output: str
    limit: float
    value: float
    passed: bool


@dataclass
class DiffReport(Report):
    old: str
    new: str
    signature: str
    findings: list[Finding] = field(default_factory=list)  # the signature comparison (verify.baseline)
    inputs: dict = field(default_factory=dict)
    outputs: list[OutputChange] = field(default_factory=list)
    gates: list[Gate] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    memory: dict | None = None  # NEW's memory and the swap's (verify/memory.py measure_diff); None: not measured

    @property
    def passed(self) -> bool:
        return not has_errors(self.findings) and all(g.passed for g in self.gates)

    @property
    def verdict(self) -> str:
        return verdict_line(self)

    def to_dict(self) -> dict:
        """The JSON report, as `diff --json` writes it (docs/diff.md)."""
        return to_json(self)


def output_change(st: ChangeStats, files: list[str], regression: bool) -> OutputChange:
    """The report's view of one output's streamed statistics."""
    kind = "top1" if st.top1 else ("numeric" if st.max_abs is not None else "categorical")
    c = OutputChange(key=st.key, kind=kind, records=st.records, changed_records=st.changed,
                     changed_share=st.changed / st.records if st.records else None,
                     problem="; ".join(st.structural) or None)
    if kind == "numeric":
        c.abs_change = {**st.abs_hist.quantiles(cap=st.max_abs), "max": st.max_abs}
        rel_max = None if not st.rel_hist.total else st.rel_hist.quantile(1.0)
        c.rel_change = {**st.rel_hist.quantiles(cap=rel_max), "max": rel_max} if st.rel_hist.total else None
        c.mean_shift = st.mean_shift
        c.abs_histogram, c.rel_histogram = histogram_summary(st.abs_hist), histogram_summary(st.rel_hist)
    if kind == "top1":
        c.top1_changed_share = c.changed_share
        c.confusion = st.confusion(CONFUSION_CLASSES)
    c.most_changed = [{"file": files[f] if 0 <= f < len(files) else str(f), "index": i,
                       "offset": off if off >= 0 else None, "element": element, "old": old, "new": new,
                       "abs_change": None if math.isinf(change) else change}
                      for change, f, i, off, element, old, new in st.most]
    metric = st.metric(regression)
    if metric:
        name, old, new = metric
        delta = None if old is None or new is None else new - old
        c.metric = {"name": name, "old": old, "new": new, "delta": delta,
                    "gain": None if delta is None else (-delta if name == "mse" else delta)}
    return c


# -- text -----------------------------------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    """A share of records in 3 digits however small (a diff counts single records, unlike format.percent)."""
    return "-" if x is None else f"{100 * x:.3g}%"


def verdict_line(report: DiffReport) -> str:
    breaking = [f for f in report.findings if f.severity == "error"]
    failed = [g for g in report.gates if not g.passed]
    facts = []
    for c in report.outputs:
        if c.top1_changed_share is not None:
            facts.append(f"{_pct(c.top1_changed_share)} of top-1 answers change ({c.key})")
        elif c.abs_change:
            facts.append(f"p99 |change| {number(c.abs_change.get('p99'))} ({c.key})")
    records = report.inputs.get("records", 0)
    if breaking or failed:
        parts = [f"{len(breaking)} breaking signature change(s): {breaking[0].message}"] if breaking else []
        parts += [f"{g.name} on {g.output}: {_gate_value(g, g.value)} beyond {_gate_value(g, g.limit)}"
                  for g in failed]
        return join_verdict("FAILED", parts + facts)
    unchanged = all(c.changed_records == 0 and c.problem is None for c in report.outputs)
    head = "PASSED" if report.gates else "UNCHANGED" if unchanged else "CHANGES"
    tail = [f"{len(report.gates)} gate(s) hold"] if report.gates else []
    return join_verdict(head, [f"{records} records"] + facts + tail)


def _gate_value(g: Gate, value: float) -> str:
    if g.name in ("max-memory", "max-swap-memory"):
        return size_text(value)
    return _pct(value) if g.name == "max-changed-top1" else number(value)


def render_text(report: DiffReport) -> str:
    lines = [f"exportkit diff  (signature {report.signature}, exportkit {__version__})",
             f"old: {report.old}", f"new: {report.new}",
             f"inputs: {report.inputs.get('source')}, {report.inputs.get('records')} records, "
             f"{report.inputs.get('runner')} runner", ""]
    if report.findings:
        lines += ["signatures (can clients of the old version call the new one?):"]
        lines += [f"  {f.severity:<7} {f.code}: {f.message}" for f in report.findings] + [""]
    else:
        lines += ["signatures: unchanged", ""]
    rows = [(c.key, str(c.records), _pct(c.changed_share), *(number((c.abs_change or {}).get(q))
             for q in ("p50", "p99", "p99.9", "max")), number((c.rel_change or {}).get("p99")), number(c.mean_shift),
             _pct(c.top1_changed_share), c.problem or "") for c in report.outputs]
    lines += text_table(("OUTPUT", "RECORDS", "CHANGED", "ABS P50", "ABS P99", "ABS P99.9", "ABS MAX", "REL P99",
                     "MEAN SHIFT", "TOP-1 CHANGED", "NOTE"), rows)
    for c in report.outputs:
        if c.metric:
            m = c.metric
            lines.append(f"  {c.key}: {m['name']} old {number(m['old'])}, new {number(m['new'])}, "
                         f"delta {number(m['delta'])}")
    for c in report.outputs:
        if c.confusion and c.confusion["classes"] and c.top1_changed_share:
            lines += ["", f"top-1 of {c.key}, old (rows) x new (columns), the most frequent classes:"]
            classes = [str(k) for k in c.confusion["classes"]]
            lines += text_table(("old \\ new", *classes),
                                [(k, *map(str, row)) for k, row in zip(classes, c.confusion["counts"])])
    changed = [c for c in report.outputs if c.most_changed and c.kind != "top1"]
    if changed:
        lines += ["", "records that changed most (FILE:INDEX):"]
        for c in changed:
            lines.append(f"  {c.key}:")
            lines += [f"    {m['file']}:{m['index']} element {list(m['element'])}: {_v(m['old'])} -> {_v(m['new'])}"
                      for m in c.most_changed[:5]]
    skipped = report.inputs.get("skipped") or {}
    if skipped:
        lines += ["", "PredictionLog records skipped:"] + [f"  {n} x {why}" for why, n in skipped.items()]
    if report.memory:
        lines += ["", "memory (MB = 10^6 bytes):"]
        lines += ["  " + line for line in text_table(MEMORY_HEADERS, memory_rows(report.memory))]
    if report.gates:
        lines += ["", "gates:"] + [f"  {'ok  ' if g.passed else 'FAIL'} {g.name} on {g.output}: "
                                   f"{_gate_value(g, g.value)} (limit {_gate_value(g, g.limit)})" for g in report.gates]
    return "\n".join(lines + ["", verdict_line(report)]) + "\n"


def _v(x) -> str:
    return number(x) if isinstance(x, float) else clean(str(x))


def to_json(report: DiffReport) -> dict:
    doc = {"schema_version": SCHEMA_VERSION, "exportkit_version": __version__, "passed": report.passed,
           "verdict": verdict_line(report), "old": report.old, "new": report.new, "signature": report.signature,
           "findings": [f.to_dict() for f in report.findings], "inputs": report.inputs,
           "outputs": [asdict(c) for c in report.outputs], "gates": [asdict(g) for g in report.gates],
           "memory": report.memory}
    return to_jsonable(doc)


# -- Markdown and HTML ----------------------------------------------------------------------------------------


def diff_markdown(report: DiffReport) -> str:
    rows = [[c.key, c.records, _pct(c.changed_share), number((c.abs_change or {}).get("p99")), number(c.mean_shift),
             _pct(c.top1_changed_share), "" if not c.metric else f"{c.metric['name']} {number(c.metric['delta'])}"]
            for c in report.outputs]
    lines = [heading("diff", f"{report.old} -> {report.new}", report.passed), ""]
    lines += markdown_table(["output", "records", "changed", "abs p99", "mean shift", "top-1 changed", "metric delta"],
                            rows)
    if report.memory:
        lines += [""] + markdown_table([h.lower() for h in MEMORY_HEADERS], [list(r) for r in memory_rows(report.memory)])
    lines += [""] + [f"- {'✅' if g.passed else '❌'} {cell(g.name)} on `{cell(g.output)}`: {_gate_value(g, g.value)} "
                     f"(limit {_gate_value(g, g.limit)})" for g in report.gates]
    lines += [f"- **{cell(f.code)}**: {cell(f.message)}" for f in report.findings if f.severity == "error"]
    return "\n".join(lines + ["", f"**{cell(verdict_line(report))}**", ""])


def diff_html(report: DiffReport) -> str:
    body = [f"<p class='meta'>old: {e(report.old)}<br>new: {e(report.new)}<br>signature {e(report.signature)}, "
            f"{e(report.inputs.get('records'))} records</p>"]
    if report.findings:
        body.append("<h2>Signatures</h2>" + table(["severity", "code", "message"],
                                                  [[e(f.severity), e(f.code), e(f.message)] for f in report.findings]))
    body.append("<h2>Outputs</h2>" + table(
        ["output", "records", "changed", "abs p50", "abs p99", "abs max", "rel p99", "mean shift", "top-1 changed"],
        [[e(c.key), e(c.records), e(_pct(c.changed_share)), *(e(number((c.abs_change or {}).get(q))) for q in
          ("p50", "p99", "max")), e(number((c.rel_change or {}).get("p99"))), e(number(c.mean_shift)),
          e(_pct(c.top1_changed_share))] for c in report.outputs]))
    if report.gates:
        body.append("<h2>Gates</h2>" + table(["gate", "output", "value", "limit", "result"],
                                             [[e(g.name), e(g.output), e(_gate_value(g, g.value)),
                                               e(_gate_value(g, g.limit)), "ok" if g.passed else "FAIL"]
                                              for g in report.gates]))
    if report.memory:
        body.append("<h2>Memory</h2>" + table(list(MEMORY_HEADERS), [[e(c) for c in row]
                                                                    for row in memory_rows(report.memory)]))
    for c in report.outputs:
        parts = []
        figure = plots.comparison_figure(c.abs_histogram, c.rel_histogram, None, None, None, None) \
            if c.abs_histogram else None
        if figure:
            parts.append(f"<figure>{figure}</figure>")
        if c.confusion and c.confusion["classes"]:
            classes = [str(k) for k in c.confusion["classes"]]
            parts.append("<p>top-1, old (rows) x new (columns)</p>" + table(
                ["old \\ new", *map(e, classes)], [[e(k), *map(e, row)] for k, row in zip(classes, c.confusion["counts"])]))
        if c.metric:
            parts.append(f"<p>{e(c.metric['name'])}: old {e(number(c.metric['old']))}, "
                         f"new {e(number(c.metric['new']))}, "
                         f"delta {e(number(c.metric['delta']))}</p>")
        if c.most_changed:
            parts.append(table(["record", "element", "old", "new"], [[e(f"{m['file']}:{m['index']}"),
                               e(m["element"]), e(_v(m["old"])), e(_v(m["new"]))] for m in c.most_changed]))
        if parts:
            body.append(f"<h3>{e(c.key)}</h3>" + "".join(parts))
    return page(f"exportkit diff {report.signature}", verdict_line(report), report.passed, body)


def finish_diff(report: DiffReport, json_out: str | None, html: str | None, summary: str | None) -> int:
    """Text (or JSON with --json -) on stdout, --json FILE, --html, --summary (and $GITHUB_STEP_SUMMARY); the exit
    code: 1 when a signature change breaks old clients or a gate fails."""
    print_report(render_text(report).rstrip() if json_out != "-" else "", to_json(report), json_out)
    sys.stdout.flush()
    write_report_files(html, summary, lambda: diff_html(report), lambda: diff_markdown(report),
                       append_step_summary=True)
    return report.exit_code

