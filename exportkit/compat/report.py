"""The compat matrix: one row per TF (Serving) version, predicted (static), observed (`--run`: session@X.Y in a
managed environment) and served (`--serving docker`: TF Serving X.Y's own image); rendered as text and JSON here,
as HTML and Markdown by verify/html.py and verify/summary.py. The command is verify/compat_command.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from exportkit.findings import Finding

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
class CompatReport:
    path: str
    device: str
    versions: list[VersionRow]
    run: bool = False  # observed with the TF1 loader of each version (--run)
    server: str = "stock"  # --server: the op set predicted (stock | tf-only)
    flags: Any = None  # serverflags.ServerFlags the servers are predicted (and started) with; None: stock

    @property
    def passed(self) -> bool:
        return not any(v.failed for v in self.versions)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    @property
    def verdict(self) -> str:
        return compat_verdict(self)

    def to_dict(self) -> dict:
        """The JSON matrix, as `compat --json` writes it."""
        return self.to_json()

    def to_json(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "path": self.path, "device": self.device, "passed": self.passed,
                "versions": [{"tf": v.tf, "predicted": v.predicted, "observed": v.observed,
                              "findings": [{"severity": f.severity, "code": f.code, "op": f.op, "node": f.node,
                                            "message": f.message} for f in v.findings],
                              "error": v.error, "served": v.served, "server": v.server,
                              "server_error": v.server_error} for v in self.versions]}


def render_text(report: CompatReport, run: bool) -> str:
    served = any(v.served for v in report.versions)
    rows = [("TF", "PREDICTED", "OBSERVED") + (("TF SERVING",) if served else ()) + ("REASON",)]
    for v in report.versions:
        rows.append((v.tf, v.predicted, v.observed or "-") + ((v.served or "-",) if served else ())
                    + (v.reason()[:160],))
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
    from exportkit.verify.report import error_cause, join_verdict, shorten

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
