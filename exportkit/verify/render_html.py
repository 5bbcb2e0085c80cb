"""HTML reports of verify, verify --data, compat and export: one self-contained file each (inline CSS and SVG; no
script, no font, no network), built with the standard library from the same results the text report uses.
Plots come from verify.plots (matplotlib); exportkit.report.artifacts writes the files.
"""
from __future__ import annotations

import html
import json
from typing import Any

from exportkit.report import plots
from exportkit.compare.outputs import to_jsonable
from exportkit.verify.latency import latency_text
from exportkit.verify.report import (OutputComparison, RuntimeResult, VerifyReport, _g, _pct, _server_text, _tol,
                                     _who, batch_sizes_text, clean, context_lines, error_cause, needs, verdict_line)

FIGURES = 40  # at most this many runtime x output figures per page (the rest keep their tables)

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:1.5em auto;max-width:1200px;
     color:#222;padding:0 1em}
h1{font-size:1.4em;margin-bottom:.2em} h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
h3{font-size:1em;margin-bottom:.3em} code,pre{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.85em}
pre{background:#f6f6f6;padding:.6em;overflow-x:auto;white-space:pre-wrap;max-height:24em}
table{border-collapse:collapse;margin:.4em 0} th,td{border:1px solid #ccc;padding:.25em .5em;text-align:left;
     vertical-align:top;font-size:.9em} th{background:#f0f0f0}
.verdict{font-size:1.1em;font-weight:600;padding:.6em .8em;border-radius:4px}
.pass,.ok{background:#d9f2d9} .fail,.fails,.error{background:#f8d0d0} .warn{background:#fcefc7}
.skip,.ref,.none{background:#eee} .meta{color:#555} .num{text-align:right;font-variant-numeric:tabular-nums}
figure{margin:.4em 0} figure svg{max-width:100%;height:auto}
"""


# --------------------------------------------------------------------------------------------- building blocks


def e(x: Any) -> str:
    return html.escape(clean("" if x is None else str(x)), quote=True)


def page(title: str, verdict: str, passed: bool, body: list[str]) -> str:
    cls = "pass" if passed else "fail"
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{e(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{e(title)}</h1>", f'<p id="verdict" class="verdict {cls}">{e(verdict)}</p>', *body, "</body></html>", ""])


def table(headers: list[str], rows: list[list[str]], id: str | None = None) -> str:
    """Cells are HTML already (escape with `e`); a cell given as (html, css_class, attrs) gets a class."""
    out = [f'<table id="{e(id)}">' if id else "<table>"]
    if any(headers):
        out.append("<tr>" + "".join(f"<th>{e(h)}</th>" for h in headers) + "</tr>")
    for row in rows:
        cells = []
        for cell in row:
            if isinstance(cell, tuple):
                text, cls, attrs = (*cell, "")[:3]
                cells.append(f'<td class="{cls}"{attrs}>{text}</td>')
            else:
                cells.append(f"<td>{cell}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _value(x: Any) -> str:
    return e(f"{x:.7g}" if isinstance(x, float) else x)


# --------------------------------------------------------------------------------------------- verify


def _status(r: RuntimeResult, c: OutputComparison | None) -> tuple[str, str]:
    if r.status == "error":
        return "ERROR", "error"
    if r.status == "skipped":
        return "SKIP", "skip"
    if c is None:
        return ("REF", "ref") if r.is_reference else ("-", "none")
    return ("PASS", "pass") if c.passed else ("FAIL", "fail")


def _anchor(r: RuntimeResult, key: str) -> str:
    return "out-" + "".join(ch if ch.isalnum() else "-" for ch in f"{r.signature or ''}-{r.name}-{key}")


def _matrix(report: VerifyReport) -> str:
    keys = sorted({c.key for r in report.runtimes for c in r.comparisons})
    rows = []
    for r in report.runtimes:
        by_key = {c.key: c for c in r.comparisons}
        word, cls = _status(r, None) if r.status != "ok" or r.is_reference else (
            ("PASS", "pass") if r.passed else ("FAIL", "fail"))
        cause = error_cause(r.error) if r.status == "error" else _first(r.error) if r.status == "skipped" else ""
        latency = (f'{e(latency_text(r.latency))}<br><small>{r.latency["requests"]} request(s)</small>'
                   if r.latency else "-")
        row = [e(_who(report, r)), e(r.device or "-"), e(r.kind), f"{r.seconds:.2f} s",
               (latency, "num", f' data-latency="{e(_who(report, r))}"'),
               (f"{word}<br><small>{e(cause)}</small>" if cause else word, cls,
                f' data-runtime="{e(_who(report, r))}" data-output=""')]
        for key in keys:
            c = by_key.get(key)
            word, cls = _status(r, c)
            attrs = f' data-runtime="{e(_who(report, r))}" data-output="{e(key)}"'
            if c is not None:
                detail = f"max abs err {_g(c.max_abs_err)}" if c.passed else (c.reason or "")
                text = f'<a href="#{_anchor(r, key)}">{word}</a><br><small>{e(detail)}</small>'
            else:
                text = word
            row.append((text, cls, attrs))
        rows.append(row)
    return table(["runtime", "device", "kind", "time", "first/p50/p99 ms", "result", *keys], rows, id="matrix")


def _first(text: str | None) -> str:
    lines = clean(text).strip().splitlines()
    return lines[0] if lines else ""


def _worst_table(c: OutputComparison) -> str:
    if c.worst_elements:
        rows = [[e(w["index"]), _value(w["expected"]), _value(w["actual"]),
                 (e(_g(w["abs_err"])), "num"), (e(_g(w["excess"])), "fail num" if w["excess"] > 0 else "num")]
                for w in c.worst_elements]
        return ('<h3>worst elements (index: [batch, ...] over several batches)</h3>'
                + table(["index", "reference", "runtime", "abs err", "beyond allowance"], rows,
                        id=f"worst-{c.key}"))
    if c.worst_records:
        rows = [[e(f"{w['file']}:{w['index']}"), e(w["element"]), _value(w["expected"]), _value(w["actual"]),
                 (e(_g(w.get("abs_err"))), "num"), (e(_g(w.get("excess"))), "num")] for w in c.worst_records]
        return ("<h3>worst records (FILE:INDEX, records counted from 0)</h3>"
                + table(["record", "element", "reference", "runtime", "abs err", "beyond allowance"], rows))
    return ""


def _quantiles(c: OutputComparison) -> str:
    if c.records is None:
        return ""
    q_abs, q_rel = c.abs_err_quantiles or {}, c.rel_err_quantiles or {}
    rows = [[e("absolute"), *(e(_g(q_abs.get(p))) for p in ("p50", "p99", "p99.9")), e(_g(c.max_abs_err))],
            [e("relative"), *(e(_g(q_rel.get(p))) for p in ("p50", "p99", "p99.9")), e(_g(c.max_rel_err))]]
    return (f"<p>{c.records} records, {c.failing_records or 0} failing</p>"
            + table(["error", "p50", "p99", "p99.9", "max"], rows, id=f"quantiles-{c.key}"))


def _same_outcome(report: VerifyReport) -> list[tuple[list[RuntimeResult], OutputComparison]]:
    """Comparisons grouped where runtimes answered identically (the same errors element by element), failing
    groups first: four runtimes that are off the same way make one section, not four."""
    groups: dict[tuple, tuple[list[RuntimeResult], OutputComparison]] = {}
    for r in report.runtimes:
        for c in r.comparisons:
            key = (r.signature, c.key, c.passed, c.reason, c.max_abs_err, json.dumps(to_jsonable(
                [c.abs_err_histogram, c.rel_err_histogram, c.worst_elements, c.worst_records])))
            groups.setdefault(key, ([], c))[0].append(r)
    return sorted(groups.values(), key=lambda group: group[1].passed)  # stable: report order within each


def _output_section(report: VerifyReport, runtimes: list[RuntimeResult], c: OutputComparison, draw: bool) -> str:
    r = runtimes[0]
    word, cls = _status(r, c)
    n = needs(c)
    facts = [f"{e(c.actual_dtype)} {e(list(c.actual_shape) if c.actual_shape is not None else '-')}",
             f"tolerance {e(_tol(c))}", f"max abs err {e(_g(c.max_abs_err))}", f"max rel err {e(_g(c.max_rel_err))}",
             f"over tolerance {e(_pct(c.mismatch_fraction))}"]
    if c.worst_index is not None:
        facts.append(f"worst element {e(list(c.worst_index))}: reference {_value(c.worst_expected)}, "
                     f"runtime {_value(c.worst_actual)}")
    names = ", ".join(_who(report, x) for x in runtimes)
    parts = [f'<section id="{_anchor(r, c.key)}" data-output="{e(c.key)}" data-runtimes="{e(names)}">',
             *(f'<a id="{_anchor(x, c.key)}"></a>' for x in runtimes[1:]),
             f'<h3><span class="{cls}">{word}</span> {e(names)} / output {e(c.key)}</h3>',
             f'<p class="meta">{"; ".join(facts)}</p>']
    if c.reason:
        parts.append(f"<p>{e(c.reason)}{e('; ' + n) if n else ''}</p>")
    parts.append(_quantiles(c))
    if draw:
        svg = plots.comparison_figure(c.abs_err_histogram, c.rel_err_histogram, c.sample_pairs, c.worst_elements,
                                      c.atol, c.rtol)
        if svg:
            parts.append(f"<figure>{svg}</figure>")
    parts.append(_worst_table(c))
    parts.append("</section>")
    return "\n".join(p for p in parts if p)


def _inputs(report: VerifyReport) -> str:
    inp = dict(report.inputs or {})
    tensors = inp.pop("tensors", None) or {}
    rows = []
    for k, v in inp.items():
        if v is None:
            continue
        if k == "batch_sizes":
            v = batch_sizes_text(v)
        rows.append([e(k), e(v)])
    out = table(["", ""], rows, id="inputs")
    if tensors:
        out += table(["input", "dtype", "shape (first batch)"],
                     [[e(k), e(t.get("dtype")), e(t.get("shape"))] for k, t in tensors.items()], id="input-tensors")
    return out


def verify_html(report: VerifyReport) -> str:
    body = [f'<p class="meta">{e(report.path)} &middot; signature {e(report.signature)} &middot; reference '
            f'{e(report.reference or "-")} &middot; exportkit {e(report.exportkit_version)}</p>',
            *(f'<p class="meta" id="{name}">{e(line)}</p>' for name, line in context_lines(report).items()),
            "<h2>Runtimes &times; outputs</h2>", _matrix(report)]
    servers = list(dict.fromkeys((r.name, _server_text(r.server)) for r in report.runtimes if r.server))
    if servers:
        body += ["<h2>Which server answered</h2>", table(["runtime", "server"], [[e(n), e(t)] for n, t in servers],
                                                         id="servers")]
    body += ["<h2>Inputs</h2>", _inputs(report)]
    if report.findings:
        body += ["<h2>Findings</h2>", table(["severity", "code", "finding (with its fix)"], [
            [(e(f.severity), {"error": "fail", "warning": "warn"}.get(f.severity, "none")), e(f.code),
             e(f.message)] for f in report.findings], id="findings")]
    if report.chain:
        body += ["<h2>Training-time reference</h2>", table(["link", "runtimes", "output", "result", "max abs err", "note"], [
            [e(c["link"]), e(f"{c['from'] or '-'} vs {c['to'] or '-'}"), e(c["output"] or "-"),
             ({True: "PASS", False: "BROKEN", None: "-"}[c["passed"]],
              {True: "pass", False: "fail", None: "none"}[c["passed"]]), e(_g(c.get("max_abs_err"))),
             e(c["reason"] or "")] for c in report.chain], id="chain")]
    groups = _same_outcome(report)
    if groups:
        body.append("<h2>Outputs</h2>")
        body += [_output_section(report, runtimes, c, i < FIGURES) for i, (runtimes, c) in enumerate(groups)]
    errors = [r for r in report.runtimes if r.status == "error" and r.error]
    if errors:
        body.append("<h2>Errors</h2>")
        body += [f"<h3>{e(_who(report, r))}</h3><pre>{e(r.error)}</pre>" for r in errors]
    return page(f"exportkit verify {report.path}", verdict_line(report), report.passed, body)


# --------------------------------------------------------------------------------------------- compat


def compat_html(report, other_device: list | None = None) -> str:
    """`report`: verify.matrix.CompatReport; `other_device`: the static forecast rows for the other device."""
    from exportkit.compat.report import compat_verdict

    devices = [report.device] + ([("gpu" if report.device == "cpu" else "cpu")] if other_device else [])
    run = any(v.observed for v in report.versions)
    headers = ["TF", f"{report.device} predicted"] + ([f"{report.device} observed"] if run else [])
    if other_device:
        headers.append(f"{devices[1]} predicted")
    others = {v.tf: v for v in other_device or []}
    rows = []
    for v in report.versions:
        reason = v.reason()
        row = [e(v.tf), (f"{e(v.predicted)}<br><small>{e(_predicted_reason(v))}</small>", v.predicted,
                         f' data-tf="{e(v.tf)}" data-device="{e(report.device)}" data-kind="predicted"')]
        if run:
            observed = v.observed or "none"
            row.append((f"{e(v.observed or '-')}<br><small>{e(v.error or reason if v.observed else '')}</small>",
                        observed, f' data-tf="{e(v.tf)}" data-device="{e(report.device)}" data-kind="observed"'))
        if other_device:
            o = others.get(v.tf)
            row.append((f"{e(o.predicted)}<br><small>{e(_predicted_reason(o))}</small>", o.predicted,
                        f' data-tf="{e(v.tf)}" data-device="{e(devices[1])}" data-kind="predicted"') if o else "-")
        rows.append(row)
    body = [f'<p class="meta">{e(report.path)} &middot; predicted from the op/kernel registries shipped with '
            f'exportkit{"; observed with each version&#39;s TF1 loader (CPU)" if run else "; --run to observe"}</p>',
            "<h2>TensorFlow version &times; device</h2>", table(headers, rows, id="matrix")]
    if run:
        observed = [v for v in report.versions if v.observed]
        agree = [v for v in observed if (v.predicted == "fails") == (v.observed == "fails")]
        body += ["<h2>Predicted vs observed</h2>",
                 "<p class=\"meta\">predicted: will it load and run (ops, attrs, dtypes, kernels; no TensorFlow "
                 "imported); observed: does it load, run and agree with the reference in that version</p>",
                 f'<p id="agreement">predicted and observed agree on {len(agree)} of {len(observed)} versions</p>',
                 table(["TF", "predicted", "observed", "agree"], [
                     [e(v.tf), (e(v.predicted), v.predicted), (e(v.observed), v.observed),
                      ("yes", "pass") if v in agree else ("no", "fail")] for v in observed])]
    findings = [(v.tf, f) for v in report.versions for f in v.findings]
    if findings:
        body += ["<h2>Findings</h2>", table(["TF", "severity", "code", "op", "node", "message"], [
            [e(tf), (e(f.severity), {"error": "fail", "warning": "warn"}.get(f.severity, "none")), e(f.code),
             e(f.op), e(f.node), e(f.message)] for tf, f in findings[:200]])]
    return page(f"exportkit compat {report.path}", compat_verdict(report), report.passed, body)


def _predicted_reason(v) -> str:
    problems = [f for f in v.findings if f.severity != "info"]
    if not problems:
        return "every op, attr, dtype and kernel found"
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{problems[0].code}: {problems[0].message}{more}"


# --------------------------------------------------------------------------------------------- export


def export_html(summary: dict | None, verdict: str, passed: bool, error: tuple[str, str | None] | None = None) -> str:
    """`summary`: export's summary_json (None when the export failed); `error`: (message, fix) of a failure."""
    body = []
    if error:
        message, remedy = error
        body += ["<h2>What failed</h2>", f"<pre id=\"error\">{e(message)}</pre>"]
        if remedy:
            body.append(f'<p id="fix">fix: {e(remedy)}</p>')
    if summary:
        body.append(f'<p class="meta">{e(summary["path"])} &middot; from {e(summary["source_format"])} &middot; '
                    f'policy {e(summary["dtype_policy"])} &middot; self-check {e(summary["self_check"])}'
                    f'{" (" + e(summary["self_check_how"]) + ")" if summary.get("self_check_how") else ""}</p>')
        for s in summary.get("signatures") or []:
            rows = [[e("input"), e(k), e(v["dtype"]), e(v["shape"])] for k, v in s["inputs"].items()]
            rows += [[e("output"), e(k), e(d), ""] for k, d in s["outputs"].items()]
            body += [f"<h2>Signature {e(s['name'])} ({e(s['method'].rpartition('/')[2])}"
                     f"{', tf.Example' if s.get('input') == 'examples' else ''})</h2>",
                     table(["", "key", "dtype", "shape"], rows, id=f"signature-{s['name']}")]
        if summary.get("reference"):
            ref = summary["reference"]
            body += ["<h2>Training-time reference</h2>", table(["link", "verdict"], [
                [e(link), (e(v), "pass" if v == "passed" else "none")] for link, v in ref.get("links", {}).items()])]
        if summary.get("findings"):
            body += ["<h2>Findings</h2>", table(["severity", "code", "message"], [
                [(e(f["severity"]), {"error": "fail", "warning": "warn"}.get(f["severity"], "none")), e(f["code"]),
                 e(f["message"])] for f in summary["findings"]], id="findings")]
        stages = summary.get("stage_seconds") or {}
        if stages:
            body += ["<h2>Stages</h2>", table(["stage", "seconds"], [[e(k), (f"{v:.2f}", "num")]
                                                                   for k, v in stages.items()])]
    return page("exportkit export", verdict, passed, body)
