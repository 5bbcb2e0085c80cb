"""exportkit compat: will this SavedModel load, run and agree on TF Serving X.Y?  One row per version.

predicted: the static analysis of exportkit.compat.analysis for the device asked (no TensorFlow import).
observed (`--run`): the serving-equivalent session runtime on TensorFlow X.Y (`session@X.Y`, a managed
environment), fed the golden inputs and generated batches, compared with the reference (the golden outputs,
else the session runtime on this Python's TensorFlow) with verify's tolerances. Versions run two at a time.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from exportkit.errors import UsageError
from exportkit.findings import Finding

PARALLEL_VERSIONS = 2


@dataclass
class VersionRow:
    tf: str
    predicted: str  # ok | warn | fails
    observed: str | None = None  # ok | fails | None (not run)
    findings: list[Finding] = field(default_factory=list)
    error: str | None = None  # why the observed run failed (load/run error or disagreement)
    agreement: str | None = None  # observed ok: how close to the reference, e.g. "golden, max abs err 3e-07"

    @property
    def failed(self) -> bool:
        return self.predicted == "fails" or self.observed == "fails"

    def reason(self) -> str:
        """One line: the observed failure, else the first error/warning finding, else why it is fine."""
        problems = [f for f in self.findings if f.severity != "info"]
        notes = [f for f in self.findings if f.severity == "info"]
        if self.observed == "fails" and self.error:
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
        return " ".join(text.split())


@dataclass
class CompatReport:
    path: str
    device: str
    versions: list[VersionRow]

    @property
    def passed(self) -> bool:
        return not any(v.failed for v in self.versions)

    def to_json(self) -> dict:
        return {"path": self.path, "device": self.device, "passed": self.passed,
                "versions": [{"tf": v.tf, "predicted": v.predicted, "observed": v.observed,
                              "findings": [{"severity": f.severity, "code": f.code, "op": f.op, "node": f.node,
                                            "message": f.message} for f in v.findings],
                              "error": v.error} for v in self.versions]}


def render_text(report: CompatReport, run: bool) -> str:
    rows = [("TF", "PREDICTED", "OBSERVED", "REASON")]
    for v in report.versions:
        rows.append((v.tf, v.predicted, v.observed or "-", v.reason()[:160]))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"compat: {report.path}  (device {report.device}; predicted from shipped op/kernel registries"
             + ("; observed with the TF1 loader of each version, CPU)" if run else "; --run to observe)")]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3] for r in rows]
    failing = [v.tf for v in report.versions if v.failed]
    details = [f"  {v.tf}: {f.severity} {f.code} {f.op} at {f.node}: {f.message}"
               for v in report.versions for f in v.findings[1:6]]
    if details:
        lines += ["", "more findings:"] + details
    lines.append("")
    lines.append(f"FAILED on {', '.join(failing)}" if failing else
                 f"PASSED on {', '.join(v.tf for v in report.versions)}")
    return "\n".join(lines)


def compat_command(*, path, tf=None, device="cpu", run=False, signature_name="serving_default", samples=8, seed=0,
                   int_range=None, atol=None, rtol=None, tol=None, json_out=None) -> int:
    from exportkit.compat import analysis, parse_versions
    from exportkit.savedmodel import select_meta_graph
    from exportkit.verify.run import _read_model

    versions = parse_versions(tf)
    if device not in ("cpu", "gpu"):
        raise UsageError(f"--device {device!r} is not cpu or gpu", "pass --device cpu or --device gpu")
    if run and device == "gpu":
        raise UsageError("--run observes on the CPU only (the managed environments hold tensorflow-cpu)",
                         "drop --run for the GPU forecast, or use --device cpu --run")
    version_dir, proto, signatures = _read_model(path)
    signature = signatures.get(signature_name)
    meta_graph = select_meta_graph(proto)
    predicted = analysis.analyze(meta_graph, versions, device)
    rows = [VersionRow(r.tf, r.predicted, findings=r.findings) for r in predicted]
    if run:
        if signature is None:
            raise UsageError(f"{version_dir} has no signature '{signature_name}' to run",
                             "pass --signature-name with one of its signatures")
        _observe(rows, version_dir, signature_name, signature, samples, seed, int_range, atol, rtol, tol)
    report = CompatReport(path=str(version_dir), device=device, versions=rows)
    if json_out == "-":
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(render_text(report, run))
        if json_out:
            Path(json_out).write_text(json.dumps(report.to_json(), indent=2) + "\n")
    sys.stdout.flush()
    return 0 if report.passed else 1


def _observe(rows, version_dir, signature_name, signature, samples, seed, int_range, atol, rtol, tol) -> None:
    """Fill `observed`/`error` of each row from session@X.Y, compared with the reference like verify does."""
    from exportkit.batches import recorded_int_ranges
    from exportkit.layout import read_manifest
    from exportkit.spec import VerifyOptions
    from exportkit.verify.compare import parse_tol
    from exportkit.verify.report import VerifyReport
    from exportkit.verify.run import (_build_runtimes, _close_all, _compare_all, _execute, _per_output_tolerances,
                                      _plan_checks, versioned_pythons, versioned_sessions)

    pythons = versioned_pythons([",".join(r.tf for r in rows)])  # installs what is missing, before anything runs
    manifest, _ = read_manifest(version_dir)
    lo_hi = recorded_int_ranges(int_range or [], manifest, {signature_name: signature})
    options = VerifyOptions(path=str(version_dir), signature_name=signature_name, serving="none", samples=samples,
                            seed=seed)
    check = _plan_checks(options, {signature_name: signature}, [signature_name], version_dir, manifest, lo_hi)[0]
    batches = check.batches
    # The reference: the golden record where there is one, else the session runtime on this Python's TF.
    names = ["golden", "session"] if check.golden[0] is not None else ["session"]
    references = _build_runtimes(options, names, ["cpu"], version_dir, check)
    report = VerifyReport(path=str(version_dir), signature=signature_name, reference="")
    outputs: dict[str, list] = {}
    versions = list(pythons)
    waves = [versions[i:i + PARALLEL_VERSIONS] for i in range(0, len(versions), PARALLEL_VERSIONS)]
    wave = versioned_sessions({v: pythons[v] for v in waves[0]}, version_dir, signature_name)  # overlaps
    try:
        for item in references:
            report.runtimes.append(_execute(item, check, outputs))
    finally:
        _close_all(references)
    for index in range(len(waves)):
        if index:
            wave = versioned_sessions({v: pythons[v] for v in waves[index]}, version_dir, signature_name)
        try:
            for item in wave:
                report.runtimes.append(_execute(item, check, outputs))
        finally:
            _close_all(wave)
    per_output = dict(parse_tol(t) for t in tol or [])
    _compare_all(report, outputs, batches, _per_output_tolerances(atol, rtol, per_output, check.entry), ["cpu"])
    by_label = {r.name: r for r in report.runtimes}
    for row in rows:
        result = by_label[f"session@{row.tf}"]
        if result.status == "error":
            row.observed, row.error = "fails", result.error
            continue
        bad = [c for c in result.comparisons if not c.passed]
        row.observed = "fails" if bad else "ok"
        errors = [c.max_abs_err for c in result.comparisons if c.max_abs_err is not None]
        row.agreement = f"with {report.reference}, max abs err {max(errors):.2g}" if errors else f"with {report.reference}"
        if bad:
            row.error = "; ".join(f"output '{c.key}' disagrees with {report.reference}: {c.reason}" for c in bad)
