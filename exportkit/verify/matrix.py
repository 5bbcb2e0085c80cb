"""exportkit compat: will this SavedModel load, run and agree on TF Serving X.Y?  One row per version.

predicted: the static analysis of exportkit.compat.analysis for the device asked (no TensorFlow import).
observed (`--run`): the serving-equivalent session runtime on TensorFlow X.Y (`session@X.Y`, a managed
environment), fed the golden inputs and generated batches, compared with the reference (the golden outputs,
else the session runtime on this Python's TensorFlow) with verify's tolerances. Versions run two at a time.
served (`--serving docker[:TAG]`): the real TF Serving X.Y, its official image in a container, asked through gRPC
and compared the same way: the ground truth the prediction and the managed loaders are checked against.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field

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

    @property
    def passed(self) -> bool:
        return not any(v.failed for v in self.versions)

    def to_json(self) -> dict:
        return {"path": self.path, "device": self.device, "passed": self.passed,
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


def compat_command(*, path, tf=None, device="cpu", run=False, signature_name="serving_default", samples=8, seed=0,
                   int_range=None, atol=None, rtol=None, tol=None, json_out=None, html=None, summary=None,
                   serving=None, launch=None, load_timeout=120.0, server="stock") -> int:
    """`serving`: None, or docker[:TAG] to observe each version on TF Serving's own image (`launch`: its
    LaunchOptions). `server`: stock (TF X.Y and the op libraries tensorflow_model_server links) or tf-only."""
    from exportkit.compat import analysis, parse_versions
    from exportkit.compat.registry import SERVERS
    from exportkit.files import write_atomic
    from exportkit.savedmodel import select_meta_graph
    from exportkit.spec import check_tolerances
    from exportkit.verify.artifacts import check_report_options, write_compat
    from exportkit.verify.plan import read_model

    check_tolerances(atol, rtol)
    check_report_options(html, summary)
    versions = parse_versions(tf)
    if server not in SERVERS:
        raise UsageError(f"--server {server!r} is not one of {', '.join(SERVERS)}",
                         "pass --server stock (what tensorflow_model_server links) or --server tf-only")
    if device not in ("cpu", "gpu"):
        raise UsageError(f"--device {device!r} is not cpu or gpu", "pass --device cpu or --device gpu")
    if run and device == "gpu":
        raise UsageError("--run observes on the CPU only (the managed environments hold tensorflow-cpu)",
                         "drop --run for the GPU forecast, or use --device cpu --run")
    if serving is not None:
        _check_server_choice(serving, versions)
    version_dir, proto, signatures = read_model(path)
    signature = signatures.get(signature_name)
    meta_graph = select_meta_graph(proto)
    predicted = analysis.analyze(meta_graph, versions, device, server)
    rows = [VersionRow(r.tf, r.predicted, findings=r.findings) for r in predicted]
    if run or serving:
        if signature is None:
            raise UsageError(f"{version_dir} has no signature '{signature_name}' to run",
                             "pass --signature-name with one of its signatures")
        servers = _servers(serving, [r.tf for r in rows], device, launch) if serving else {}
        _observe(rows, version_dir, signature_name, signature, samples, seed, int_range, atol, rtol, tol,
                 run=run, servers=servers, device=device, launch=launch, load_timeout=load_timeout)
    report = CompatReport(path=str(version_dir), device=device, versions=rows)
    if json_out == "-":
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(render_text(report, run))
        if json_out:
            write_atomic(json_out, json.dumps(report.to_json(), indent=2) + "\n", f"--json {json_out}")
    sys.stdout.flush()
    # the HTML shows the static forecast of the other device too (cheap: no TensorFlow), as a version x device matrix
    other = "gpu" if device == "cpu" else "cpu"
    other_rows = [VersionRow(r.tf, r.predicted, findings=r.findings)
                  for r in analysis.analyze(meta_graph, versions, other)] if html else None
    write_compat(report, html, summary, other_rows)
    return 0 if report.passed else 1


def _check_server_choice(serving: str, versions: list[str]) -> None:
    from exportkit.serving.container import is_container_mode

    if not is_container_mode(serving):
        raise UsageError(f"compat --serving {serving!r}: compat observes TF Serving X.Y through its official image",
                         "pass --serving docker (each version's image) or --serving docker:TAG with one --tf X.Y")
    if serving != "docker" and len(versions) != 1:
        raise UsageError(f"--serving {serving} names one image, and --tf names {len(versions)} versions",
                         "pass --serving docker (each version's own image), or one --tf X.Y")


def _servers(serving: str, versions: list[str], device: str, launch) -> dict[str, str]:
    """{X.Y: the --serving mode of its image}: the one named, or the newest local tensorflow/serving:X.Y.Z."""
    from exportkit.serving import container

    if serving != "docker":
        return {versions[0]: serving}
    cli = container.ContainerCli(launch.container_cli if launch else "docker")
    return {v: f"docker:{container.image_of_version(cli, v, device)}" for v in versions}


def _observe(rows, version_dir, signature_name, signature, samples, seed, int_range, atol, rtol, tol, *,
             run=True, servers=None, device="cpu", launch=None, load_timeout=120.0) -> None:
    """Fill `observed`/`error` of each row from session@X.Y (`run`) and `served` from TF Serving X.Y's image
    (`servers`: {X.Y: docker mode}), compared with the reference like verify does."""
    from exportkit.batches import recorded_int_ranges
    from exportkit.layout import read_manifest
    from exportkit.spec import VerifyOptions
    from exportkit.verify.compare import parse_tol
    from exportkit.verify.report import VerifyReport
    from exportkit.verify.execute import build_runtimes, close_all, run_signature, started, versioned_pythons
    from exportkit.verify.pairs import compare_all
    from exportkit.verify.plan import Plan, plan_runtimes, signature_checks, tolerances_for

    from exportkit.runtimes.serving import ServingRuntime
    from exportkit.verify.execute import Labeled

    # installs what is missing, before anything runs
    pythons = versioned_pythons([",".join(r.tf for r in rows)]) if run else {}
    manifest, _ = read_manifest(version_dir)
    lo_hi = recorded_int_ranges(int_range or [], manifest, {signature_name: signature})
    options = VerifyOptions(path=str(version_dir), signature_name=signature_name, serving="none", samples=samples,
                            seed=seed)
    check = signature_checks(options, {signature_name: signature}, [signature_name], version_dir, manifest, lo_hi)[0]
    batches = check.batches
    # The reference: the golden record where there is one, else the session runtime on this Python's TF.
    names = ["golden", "session"] if check.golden[0] is not None else ["session"]

    def plan(names, pythons=None):
        return Plan(version_dir, ["cpu"], [check], plan_runtimes(names, ["cpu"], pythons), [])

    report = VerifyReport(path=str(version_dir), signature=signature_name, reference="")
    outputs: dict[str, list] = {}
    versions = list(pythons)
    waves = [versions[i:i + PARALLEL_VERSIONS] for i in range(0, len(versions), PARALLEL_VERSIONS)]
    with started(options, plan(names)) as references:
        # overlaps the references
        wave = build_runtimes(options, plan([], {v: pythons[v] for v in waves[0]})) if waves else []
        for item in references:
            report.runtimes.append(run_signature(item, check, outputs))
    for version, mode in (servers or {}).items():  # one container at a time: each holds the model
        server = Labeled(ServingRuntime(str(version_dir), mode, signature_name=signature_name, device=device,
                                        signatures={signature_name: signature}, load_timeout=load_timeout,
                                        launch=launch), f"serving@{version}")
        try:
            report.runtimes.append(run_signature(server, check, outputs))
        finally:
            close_all([server])
    for index in range(len(waves)):
        if index:
            wave = build_runtimes(options, plan([], {v: pythons[v] for v in waves[index]}))
        try:
            for item in wave:
                report.runtimes.append(run_signature(item, check, outputs))
        finally:
            close_all(wave)
    per_output = dict(parse_tol(t) for t in tol or [])
    compare_all(report, outputs, batches, tolerances_for(atol, rtol, per_output, check.entry), ["cpu"])
    by_label = {r.name: r for r in report.runtimes}
    for row in rows:
        if f"serving@{row.tf}" in by_label:
            result = by_label[f"serving@{row.tf}"]
            row.served, row.server_error, _ = _verdict(result, report.reference)
            row.server = result.server
        if f"session@{row.tf}" in by_label:
            row.observed, row.error, row.agreement = _verdict(by_label[f"session@{row.tf}"], report.reference)


def _verdict(result, reference: str) -> tuple[str, str | None, str | None]:
    """(ok | fails, why it fails, how close it came to the reference) of one runtime's result."""
    if result.status == "error":
        return "fails", result.error, None
    bad = [c for c in result.comparisons if not c.passed]
    errors = [c.max_abs_err for c in result.comparisons if c.max_abs_err is not None]
    agreement = f"with {reference}, max abs err {max(errors):.2g}" if errors else f"with {reference}"
    if bad:
        return "fails", "; ".join(f"output '{c.key}' disagrees with {reference}: {c.reason}" for c in bad), agreement
    return "ok", None, agreement
