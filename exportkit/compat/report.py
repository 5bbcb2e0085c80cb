"""The compat matrix: one row per TF (Serving) version, predicted (static), observed (`--run`: session@X.Y in a
managed environment) and served (`--serving docker`: TF Serving X.Y's own image); rendered here as text, JSON, HTML
and Markdown. The command is compat/command.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from exportkit.findings import Finding
from exportkit.report.base import Report
from exportkit.report.format import error_cause, join_verdict, shorten, size_text
from exportkit.report.html import e, page, severity_class, table
from exportkit.report.markdown import cell, heading, table as markdown_table

SCHEMA_VERSION = 1  # of `compat --json` (docs/report-schema.md)


@dataclass
class VersionRow:
    tf: str
    predicted: str  # ok | warn | fails
    observed: str | None = None  # ok | fails | None (not run)
    findings: list[Finding] = field(default_factory=list)
    error: str | None = None  # why the observed run failed (load/run error or disagreement)
    agreement: str | None = None  # observed ok: how close to the reference, e.g. "golden, max abs err 3e-07"
    served: str | None = None  # ok | fails | None: what TF Serving X.Y's image did (--serving docker)
    server: dict | None = None  # which server answered: image, digest, version
    server_error: str | None = None
    # observed: what the load and warm-up take in that TensorFlow (loaded_bytes, peak_bytes, ...: verify/memory.py)
    memory: dict | None = None

    @property
    def failed(self) -> bool:
        return self.predicted == "fails" or self.observed == "fails" or self.served == "fails"

    def reason(self) -> str:
        """One line: the observed failure, else the first error/warning finding, else why it is fine."""
        problems = [f for f in self.findings if f.severity != "info"]
        notes = [f for f in self.findings if f.severity == "info"]
        if self.served == "fails" and self.server_error:
            text = f"TF Serving: {self.server_error}"
        elif self.observed == "fails" and self.error:
            text = self.error
        elif problems:
            text = f"{problems[0].code}: {problems[0].message}"
            if len(problems) > 1:
                text += f" (+{len(problems) - 1} more)"
        else:
            text = (f"loads, runs and agrees ({self.agreement})" if self.observed == "ok" and self.agreement else
                    "loads, runs and agrees" if self.observed == "ok" else "every op, attr, dtype and kernel found")
            if notes:
                text += f" (info: {', '.join(sorted({f'{f.code} {f.op}' for f in notes}))})"
        if self.observed and (self.predicted == "fails") != (self.observed == "fails"):
            text = f"[predicted {self.predicted}, observed {self.observed}] {text}"
        if self.served and (self.predicted == "fails") != (self.served == "fails"):
            text = f"[predicted {self.predicted}, TF Serving {self.served}] {text}"
        return " ".join(text.split())


@dataclass
class CompatReport(Report):
    path: str
    device: str
    versions: list[VersionRow]
    run: bool = False  # observed with the TF1 loader of each version (--run)
    server: str = "stock"  # --server: the op set predicted (stock | tf-only)
    flags: Any = None  # options.server_flags.ServerFlags the servers are predicted (and started) with; None: stock

    @property
    def passed(self) -> bool:
        return not any(v.failed for v in self.versions)

    @property
    def verdict(self) -> str:
        return compat_verdict(self)

    def to_dict(self) -> dict:
        """The JSON matrix, as `compat --json` writes it."""
        return {"schema_version": SCHEMA_VERSION, "path": self.path, "device": self.device, "passed": self.passed,
                "versions": [{"tf": v.tf, "predicted": v.predicted, "observed": v.observed,
                              "findings": [{"severity": f.severity, "code": f.code, "op": f.op, "node": f.node,
                                            "message": f.message} for f in v.findings],
                              "error": v.error, "served": v.served, "server": v.server,
                              "server_error": v.server_error, "memory": v.memory} for v in self.versions]}


def render_text(report: CompatReport, run: bool) -> str:
    served = any(v.served for v in report.versions)
    memory = any(v.memory for v in report.versions)
    rows = [("TF", "PREDICTED", "OBSERVED") + (("TF SERVING",) if served else ()) + (("MEMORY",) if memory else ())
            + ("REASON",)]
    for v in report.versions:
        rows.append((v.tf, v.predicted, v.observed or "-") + ((v.served or "-",) if served else ())
                    + ((memory_text(v.memory),) if memory else ()) + (v.reason()[:160],))
    columns = len(rows[0]) - 1
    widths = [max(len(r[i]) for r in rows) for i in range(columns)]
    lines = [f"compat: {report.path}  (device {report.device}; predicted from shipped op/kernel registries"
             + ("; observed with the TF1 loader of each version, CPU" if run else "; --run to observe")
             + ("; TF Serving: its official image of each version)" if served else ")")]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r[:columns], widths)) + "  " + r[-1] for r in rows]
    images = [f"  {v.tf}: {v.server.get('image')} ({v.server.get('digest') or v.server.get('image_id')}), "
              f"TF Serving {v.server.get('version')}" for v in report.versions if v.server]
    if images:
        lines += ["", "servers:"] + images
    details = [f"  {v.tf}: {f.severity} {f.code} {f.op} at {f.node}: {f.message}"
               for v in report.versions for f in v.findings[1:6]]
    if details:
        lines += ["", "more findings:"] + details
    lines.append("")
    lines.append(compat_verdict(report))
    return "\n".join(lines)


def compat_verdict(report: CompatReport) -> str:
    """`FAILED: TF 2.12-2.19: could not load the model (unknown op TFText>RoundRobinTrim); TF 2.21: ...`: each
    cause once, the versions it hits listed."""
    if report.passed:
        return f"PASSED on {', '.join(v.tf for v in report.versions)}"
    by_cause: dict[str, list[str]] = {}
    for v in report.versions:
        if not v.failed:
            continue
        problems = [f for f in v.findings if f.severity == "error"]
        if v.served == "fails" and v.server_error:
            cause = "TF Serving " + error_cause(v.server_error).removeprefix("error: ")
        elif v.observed == "fails" and v.error:
            cause = error_cause(v.error).removeprefix("error: ")
        elif problems:
            first = problems[0]
            cause = (error_cause(f"unknown op '{first.op}'").removeprefix("error: ") if first.code == "op-unknown"
                     else " ".join(filter(None, (first.code, first.op)))) + (
                f" (+{len(problems) - 1} more)" if len(problems) > 1 else "")
        else:
            cause = shorten(v.reason(), 80)
        by_cause.setdefault(cause, []).append(v.tf)
    return join_verdict("FAILED", [f"TF {_spans(tfs)}: {cause}" for cause, tfs in by_cause.items()])


def _spans(versions: list[str]) -> str:
    """"2.12, 2.13, 2.14, 2.17" -> "2.12-2.14, 2.17" (versions X.Y in order)."""
    runs: list[list[str]] = []
    for v in versions:
        major, minor = v.split(".")[:2]
        if runs and runs[-1][-1].split(".")[0] == major and int(runs[-1][-1].split(".")[1]) + 1 == int(minor):
            runs[-1].append(v)
        else:
            runs.append([v])
    return ", ".join(run[0] if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


def compat_html(report: CompatReport, other_device: list[VersionRow] | None = None) -> str:
    """One page: the matrix version x device (`other_device`: the static forecast rows for the other device), predicted
    against observed, the findings."""
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
            took = f"; memory {memory_text(v.memory)}" if v.memory else ""
            row.append((f"{e(v.observed or '-')}<br><small>{e(v.error or reason if v.observed else '')}{e(took)}</small>",
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
            [e(tf), (e(f.severity), severity_class(f.severity)), e(f.code),
             e(f.op), e(f.node), e(f.message)] for tf, f in findings[:200]])]
    return page(f"exportkit compat {report.path}", compat_verdict(report), report.passed, body)


def _predicted_reason(v: VersionRow) -> str:
    """Why the static analysis predicts what it predicts, in one line."""
    problems = [f for f in v.findings if f.severity != "info"]
    if not problems:
        return "every op, attr, dtype and kernel found"
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{problems[0].code}: {problems[0].message}{more}"


def memory_text(memory: dict | None) -> str:
    """`38.7 MB (peak 40.5 MB)`: what the observed load took in that TensorFlow (MB = 10^6 bytes)."""
    if not memory:
        return "-"
    return f"{size_text(memory['loaded_bytes'])} (peak {size_text(memory['peak_bytes'])})"


def compat_markdown(report: CompatReport) -> str:
    """The matrix as a short GitHub table (`--summary FILE`), the verdict last."""
    run = any(v.observed for v in report.versions)
    mark = {"ok": "✅ ok", "warn": "⚠️ warn", "fails": "❌ fails", None: "-"}
    memory = any(v.memory for v in report.versions)
    rows = [[v.tf, mark.get(v.predicted, v.predicted), *([mark.get(v.observed, v.observed)] if run else []),
             *([memory_text(v.memory)] if memory else []), v.reason()[:160]] for v in report.versions]
    lines = [heading(f"compat ({report.device})", report.path, report.passed), ""]
    lines += markdown_table(["TF", "predicted", *(["observed"] if run else []), *(["memory"] if memory else []),
                             "reason"], rows)
    return "\n".join(lines + ["", f"**{cell(compat_verdict(report))}**", ""])
