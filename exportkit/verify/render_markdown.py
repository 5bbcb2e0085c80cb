"""The verdict as GitHub-flavoured Markdown (`--summary FILE`): a heading, one short table, the verdict line.

Made for `$GITHUB_STEP_SUMMARY` and merge-request comments; verify appends to `$GITHUB_STEP_SUMMARY` when it is set
(GitHub shows the file on the run's page). The tables are short on purpose: the HTML report has the details.
"""
from __future__ import annotations

from exportkit.errors import EXIT_INFRA
from exportkit.verify.latency import latency_text
from exportkit.verify.report import (VerifyReport, _g, _pct, _who, clean, context_lines, error_cause, needs, shorten,
                                     verdict_line)


def cell(x) -> str:
    """Text safe inside a Markdown table cell (pipes escaped, one line)."""
    return " ".join(clean("" if x is None else str(x)).split()).replace("|", "\\|")


def _table(headers: list[str], rows: list[list]) -> list[str]:
    return (["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
            + ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows])


def _heading(command: str, subject: str, passed: bool, outcome: str | None = None) -> str:
    """`outcome` replaces "passed"/"FAILED" (an infrastructure error is no failure of the model)."""
    mark, word = ("⚠️", outcome) if outcome else ("✅", "passed") if passed else ("❌", "FAILED")
    return f"### {mark} exportkit {command}: {word} — `{cell(subject)}`"


def verify_markdown(report: VerifyReport) -> str:
    rows = []
    for r in report.runtimes:
        if r.status != "ok" or not r.comparisons:
            word = {"error": "❌ error", "skipped": "skipped"}.get(r.status, "reference" if r.is_reference else "-")
            note = error_cause(r.error) if r.status == "error" else shorten(clean(r.error or ""), 120)
            rows.append([_who(report, r), "", word, "", "", latency_text(r.latency), note])
            continue
        for i, c in enumerate(r.comparisons):
            note = "" if c.passed else (c.reason or "")
            n = needs(c)
            rows.append([_who(report, r), c.key, "✅ pass" if c.passed else "❌ FAIL", _g(c.max_abs_err),
                         _pct(c.mismatch_fraction), latency_text(r.latency) if i == 0 else "",
                         f"{note}; {n}" if n else note])
    infra = "error (infrastructure)" if report.exit_code == EXIT_INFRA else None
    lines = [_heading("verify", report.path, report.passed, infra), ""]
    context = [f"{cell(line)}  " for line in context_lines(report).values()]  # two spaces: a line break
    lines += context + [""] if context else []
    lines += _table(["runtime", "output", "result", "max abs err", "over tol", "first/p50/p99 ms", "note"], rows)
    errors = [f for f in report.findings if f.severity == "error"]
    if errors:
        lines += [""] + [f"- **{cell(f.code)}**: {cell(f.message)}" for f in errors]
    return "\n".join(lines + ["", f"**{cell(verdict_line(report))}**", ""])


def compat_markdown(report) -> str:
    """`report`: verify.matrix.CompatReport."""
    from exportkit.compat.report import compat_verdict

    run = any(v.observed for v in report.versions)
    mark = {"ok": "✅ ok", "warn": "⚠️ warn", "fails": "❌ fails", None: "-"}
    rows = [[v.tf, mark.get(v.predicted, v.predicted), *([mark.get(v.observed, v.observed)] if run else []),
             v.reason()[:160]] for v in report.versions]
    lines = [_heading(f"compat ({report.device})", report.path, report.passed), ""]
    lines += _table(["TF", "predicted", *(["observed"] if run else []), "reason"], rows)
    return "\n".join(lines + ["", f"**{cell(compat_verdict(report))}**", ""])


def export_markdown(summary: dict | None, verdict: str, passed: bool) -> str:
    """`summary`: export's summary_json, None when the export failed."""
    lines = [_heading("export", (summary or {}).get("path", ""), passed), ""]
    if summary:
        rows = [[s["name"], "input", k, v["dtype"], v["shape"]] for s in summary["signatures"]
                for k, v in s["inputs"].items()]
        rows += [[s["name"], "output", k, d, ""] for s in summary["signatures"] for k, d in s["outputs"].items()]
        lines += _table(["signature", "", "key", "dtype", "shape"], rows)
    return "\n".join(lines + ["", f"**{cell(verdict)}**", ""])
