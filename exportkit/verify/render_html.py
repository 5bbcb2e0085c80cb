"""verify's report as one self-contained HTML page (`--html FILE`), verify --data's too: the matrix runtime x output,
the servers, inputs, findings, the training-time reference, a section per output (grouped where runtimes answered
alike) with its error histograms, and the errors in full."""
from __future__ import annotations

import json

from exportkit.compare.outputs import to_jsonable
from exportkit.report import plots
from exportkit.report.format import error_cause, first_line, number, percent
from exportkit.report.html import e, page, precise, severity_class, table
from exportkit.verify.latency import latency_text
from exportkit.verify.memory import MEMORY_HEADERS, memory_rows
from exportkit.verify.messages import MESSAGE_HEADERS, message_rows
from exportkit.verify.report import (OutputComparison, RuntimeResult, VerifyReport, batch_sizes_text, context_lines,
                                     needs, server_text, tolerance_text, verdict_line, who)

FIGURES = 40  # at most this many runtime x output figures per page (the rest keep their tables)


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
        cause = error_cause(r.error) if r.status == "error" else first_line(r.error) if r.status == "skipped" else ""
        latency = (f'{e(latency_text(r.latency))}<br><small>{r.latency["requests"]} request(s)</small>'
                   if r.latency else "-")
        row = [e(who(report, r)), e(r.device or "-"), e(r.kind), f"{r.seconds:.2f} s",
               (latency, "num", f' data-latency="{e(who(report, r))}"'),
               (f"{word}<br><small>{e(cause)}</small>" if cause else word, cls,
                f' data-runtime="{e(who(report, r))}" data-output=""')]
        for key in keys:
            c = by_key.get(key)
            word, cls = _status(r, c)
            attrs = f' data-runtime="{e(who(report, r))}" data-output="{e(key)}"'
            if c is not None:
                detail = f"max abs err {number(c.max_abs_err)}" if c.passed else (c.reason or "")
                text = f'<a href="#{_anchor(r, key)}">{word}</a><br><small>{e(detail)}</small>'
            else:
                text = word
            row.append((text, cls, attrs))
        rows.append(row)
    return table(["runtime", "device", "kind", "time", "first/p50/p99 ms", "result", *keys], rows, id="matrix")


def _worst_table(c: OutputComparison) -> str:
    if c.worst_elements:
        rows = [[e(w["index"]), precise(w["expected"]), precise(w["actual"]),
                 (e(number(w["abs_err"])), "num"), (e(number(w["excess"])), "fail num" if w["excess"] > 0 else "num")]
                for w in c.worst_elements]
        return ('<h3>worst elements (index: [batch, ...] over several batches)</h3>'
                + table(["index", "reference", "runtime", "abs err", "beyond allowance"], rows,
                        id=f"worst-{c.key}"))
    if c.worst_records:
        rows = [[e(f"{w['file']}:{w['index']}"), e(w["element"]), precise(w["expected"]), precise(w["actual"]),
                 (e(number(w.get("abs_err"))), "num"), (e(number(w.get("excess"))), "num")] for w in c.worst_records]
        return ("<h3>worst records (FILE:INDEX, records counted from 0)</h3>"
                + table(["record", "element", "reference", "runtime", "abs err", "beyond allowance"], rows))
    return ""


def _quantiles(c: OutputComparison) -> str:
    if c.records is None:
        return ""
    q_abs, q_rel = c.abs_err_quantiles or {}, c.rel_err_quantiles or {}
    rows = [[e("absolute"), *(e(number(q_abs.get(p))) for p in ("p50", "p99", "p99.9")), e(number(c.max_abs_err))],
            [e("relative"), *(e(number(q_rel.get(p))) for p in ("p50", "p99", "p99.9")), e(number(c.max_rel_err))]]
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
             f"tolerance {e(tolerance_text(c))}", f"max abs err {e(number(c.max_abs_err))}",
             f"max rel err {e(number(c.max_rel_err))}", f"over tolerance {e(percent(c.mismatch_fraction))}"]
    if c.worst_index is not None:
        facts.append(f"worst element {e(list(c.worst_index))}: reference {precise(c.worst_expected)}, "
                     f"runtime {precise(c.worst_actual)}")
    names = ", ".join(who(report, x) for x in runtimes)
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
    servers = list(dict.fromkeys((r.name, server_text(r.server)) for r in report.runtimes if r.server))
    if servers:
        body += ["<h2>Which server answered</h2>", table(["runtime", "server"], [[e(n), e(t)] for n, t in servers],
                                                         id="servers")]
    body += ["<h2>Inputs</h2>", _inputs(report)]
    if report.memory:
        body += ["<h2>Memory</h2>", table(list(MEMORY_HEADERS), [[e(c) for c in row]
                                                                for row in memory_rows(report.memory)], id="memory")]
    if report.messages:
        body += ["<h2>gRPC messages</h2>", "<p>At the largest batch tried. TF Serving sends and accepts up to 2 GiB; a "
                 "default gRPC client receives up to 4 MiB (4,194,304 bytes).</p>",
                 table([h.lower() for h in MESSAGE_HEADERS], [[e(c) for c in row] for row in message_rows(report.messages)],
                       id="messages")]
    if report.findings:
        body += ["<h2>Findings</h2>", table(["severity", "code", "finding (with its fix)"], [
            [(e(f.severity), severity_class(f.severity)), e(f.code),
             e(f.message)] for f in report.findings], id="findings")]
    if report.chain:
        body += ["<h2>Training-time reference</h2>", table(["link", "runtimes", "output", "result", "max abs err", "note"], [
            [e(c["link"]), e(f"{c['from'] or '-'} vs {c['to'] or '-'}"), e(c["output"] or "-"),
             ({True: "PASS", False: "BROKEN", None: "-"}[c["passed"]],
              {True: "pass", False: "fail", None: "none"}[c["passed"]]), e(number(c.get("max_abs_err"))),
             e(c["reason"] or "")] for c in report.chain], id="chain")]
    groups = _same_outcome(report)
    if groups:
        body.append("<h2>Outputs</h2>")
        body += [_output_section(report, runtimes, c, i < FIGURES) for i, (runtimes, c) in enumerate(groups)]
    errors = [r for r in report.runtimes if r.status == "error" and r.error]
    if errors:
        body.append("<h2>Errors</h2>")
        body += [f"<h3>{e(who(report, r))}</h3><pre>{e(r.error)}</pre>" for r in errors]
    return page(f"exportkit verify {report.path}", verdict_line(report), report.passed, body)
