"""verify's verdict as GitHub-flavoured Markdown (`--summary FILE`): a heading, one short table, the verdict line.

Made for `$GITHUB_STEP_SUMMARY` and merge-request comments; verify appends to `$GITHUB_STEP_SUMMARY` when it is set
(GitHub shows the file on the run's page). The table is short on purpose: the HTML report has the details.
"""
from __future__ import annotations

from exportkit.errors import EXIT_INFRA
from exportkit.report.format import clean, error_cause, number, percent, shorten
from exportkit.report.markdown import cell, heading, table
from exportkit.verify.latency import latency_text
from exportkit.verify.memory import MEMORY_HEADERS, memory_rows
from exportkit.verify.messages import CODE as MESSAGE_SIZE, MESSAGE_HEADERS, message_rows
from exportkit.verify.report import VerifyReport, context_lines, needs, verdict_line, who


def verify_markdown(report: VerifyReport) -> str:
    rows = []
    for r in report.runtimes:
        if r.status != "ok" or not r.comparisons:
            word = {"error": "❌ error", "skipped": "skipped"}.get(r.status, "reference" if r.is_reference else "-")
            note = error_cause(r.error) if r.status == "error" else shorten(clean(r.error or ""), 120)
            rows.append([who(report, r), "", word, "", "", latency_text(r.latency), note])
            continue
        for i, c in enumerate(r.comparisons):
            note = "" if c.passed else (c.reason or "")
            n = needs(c)
            rows.append([who(report, r), c.key, "✅ pass" if c.passed else "❌ FAIL", number(c.max_abs_err),
                         percent(c.mismatch_fraction), latency_text(r.latency) if i == 0 else "",
                         f"{note}; {n}" if n else note])
    infra = "error (infrastructure)" if report.exit_code == EXIT_INFRA else None
    lines = [heading("verify", report.path, report.passed, infra), ""]
    context = [f"{cell(line)}  " for line in context_lines(report).values()]  # two spaces: a line break
    lines += context + [""] if context else []
    lines += table(["runtime", "output", "result", "max abs err", "over tol", "first/p50/p99 ms", "note"], rows)
    if report.memory:
        lines += [""] + table([h.lower() for h in MEMORY_HEADERS], [list(row) for row in memory_rows(report.memory)])
    if any(f.code == MESSAGE_SIZE for f in report.findings):  # only when a limit is passed: the table is short
        lines += [""] + table([h.lower() for h in MESSAGE_HEADERS], [list(row) for row in message_rows(report.messages)])
    errors = [f for f in report.findings if f.severity == "error" or f.code == MESSAGE_SIZE]
    if errors:
        lines += [""] + [f"- **{cell(f.code)}**: {cell(f.message)}" for f in errors]
    return "\n".join(lines + ["", f"**{cell(verdict_line(report))}**", ""])
