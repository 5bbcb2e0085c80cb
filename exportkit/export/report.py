"""export's result and its renderings: the text summary `exportkit export` prints, the `--json` document
(docs/report-schema.md), the HTML page and the Markdown summary, of a written version or of a failed export."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from exportkit import storage
from exportkit.errors import ExportkitError
from exportkit.findings import Finding
from exportkit.inputs.spec import InputSpec
from exportkit.report.base import Report
from exportkit.report.format import shorten
from exportkit.report.html import e, page, severity_class, table
from exportkit.report.markdown import cell, heading, table as markdown_table

SCHEMA_VERSION = 1  # of the `export --json` summary (docs/report-schema.md)


@dataclass
class ExportResult(Report):
    """A written version: where, its signatures, how the self-check loaded it, the stages' seconds, the findings."""

    path: Path | str  # a bucket URL (export -o gs://...) stays a str
    version: int
    signature_name: str
    inputs: list[InputSpec]
    outputs: dict[str, str]  # key -> dtype in the signature
    policy: str
    source_format: str
    checked: bool
    checked_how: str = ""  # where and how the self-check loaded the SavedModel
    stage_seconds: dict[str, float] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)  # custom-object contracts (warnings, infos)
    reference: dict | None = None  # the manifest's "reference" entry when a training-time reference was used
    signatures: list[dict] = field(default_factory=list)  # per signature: name, method, inputs, outputs

    @property
    def passed(self) -> bool:
        """Always: an export that fails raises (the version is not written), so a result is a passed export."""
        return True

    @property
    def verdict(self) -> str:
        return export_verdict(self)

    @property
    def version_dir(self) -> Path | str:
        return self.path if storage.is_url(self.path) else Path(self.path)

    def to_dict(self) -> dict:
        """The JSON summary, as `export --json` writes it."""
        return summary_json(self)

    @classmethod
    def from_json(cls, doc: dict) -> "ExportResult":
        """The result back from `export --json`'s document (the Python API runs the export in a child process)."""
        return cls(path=doc["path"] if storage.is_url(doc["path"]) else Path(doc["path"]), version=doc["version"], signature_name=doc["signature_name"],
                   inputs=[InputSpec(key, spec["dtype"], spec["shape"]) for key, spec in doc["inputs"].items()],
                   outputs={key: spec["dtype"] for key, spec in doc["outputs"].items()}, policy=doc["dtype_policy"],
                   source_format=doc["source_format"], checked=doc["self_check"] == "passed",
                   checked_how=doc["self_check_how"] or "", stage_seconds=dict(doc["stage_seconds"]),
                   findings=[Finding(**f) for f in doc["findings"]], reference=doc["reference"],
                   signatures=doc["signatures"])


def render_summary(result: ExportResult) -> str:
    """The text `exportkit export` prints: the version, its signatures, the self-check, the verdict last."""
    lines = [f"exported {result.path} (version {result.version}, from {result.source_format}, policy {result.policy})"]
    for entry in result.signatures:
        method = entry["method"].rpartition("/")[2]
        lines.append(f"signature '{entry['name']}' ({method}{', tf.Example' if entry['input'] == 'examples' else ''}):")
        for key, spec in entry["inputs"].items():
            lines.append(f"  input   {key:<24} {spec['dtype']:<9} {spec['shape']}")
        for key, dtype in entry["outputs"].items():
            lines.append(f"  output  {key:<24} {dtype}")
    lines.append(f"self-check: passed ({result.checked_how})" if result.checked else "self-check: skipped (--no-verify)")
    if result.reference:
        links = ", ".join(f"{link} {verdict}" for link, verdict in result.reference["links"].items())
        lines.append(f"training-time reference: {result.reference['path']} ({links})")
    lines += [f"{f.severity}: {f.code}: {f.message}" for f in result.findings if f.severity == "warning"]
    lines += ["", export_verdict(result)]
    return "\n".join(lines)


def export_verdict(result: ExportResult) -> str:
    """The last line: what was written and whether the TF-Serving-style load reproduced eager Keras."""
    outputs = sum(len(entry["outputs"]) for entry in result.signatures)
    where = f"{result.path} (version {result.version})"
    if not result.checked:
        return f"EXPORTED {where}, not checked (--no-verify): run `exportkit verify {result.path}`"
    noun = f"{len(result.signatures)} signature{'s' if len(result.signatures) != 1 else ''}"
    warnings = sum(1 for f in result.findings if f.severity == "warning")
    return (f"PASSED: exported {where}; loaded as TF Serving loads it, it reproduces eager Keras on {outputs} "
            f"output{'s' if outputs != 1 else ''} of {noun}" + (f"; {warnings} warning{'s' if warnings != 1 else ''}"
                                                                 if warnings else ""))


def summary_json(result: ExportResult) -> dict:
    """The `export --json` document (docs/report-schema.md)."""
    return {"schema_version": SCHEMA_VERSION, "path": str(result.path), "version": result.version, "signature_name": result.signature_name,
            "inputs": {s.key: {"dtype": s.dtype, "shape": s.shape} for s in result.inputs},
            "outputs": {k: {"dtype": d} for k, d in result.outputs.items()}, "dtype_policy": result.policy,
            "source_format": result.source_format, "self_check": "passed" if result.checked else "skipped",
            "self_check_how": result.checked_how or None,
            "reference": result.reference, "findings": [f.to_dict() for f in result.findings],
            "stage_seconds": {k: round(v, 3) for k, v in result.stage_seconds.items()},
            "signatures": result.signatures}


def failure_verdict(err: ExportkitError) -> str:
    """The verdict of the report files of an export that failed (the error itself is raised on)."""
    return f"FAILED: {shorten(err.message, 180)}"


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
                [(e(f["severity"]), severity_class(f["severity"])), e(f["code"]),
                 e(f["message"])] for f in summary["findings"]], id="findings")]
        stages = summary.get("stage_seconds") or {}
        if stages:
            body += ["<h2>Stages</h2>", table(["stage", "seconds"], [[e(k), (f"{v:.2f}", "num")]
                                                                   for k, v in stages.items()])]
    return page("exportkit export", verdict, passed, body)


def export_markdown(summary: dict | None, verdict: str, passed: bool) -> str:
    """`summary`: export's summary_json, None when the export failed."""
    lines = [heading("export", (summary or {}).get("path", ""), passed), ""]
    if summary:
        rows = [[s["name"], "input", k, v["dtype"], v["shape"]] for s in summary["signatures"]
                for k, v in s["inputs"].items()]
        rows += [[s["name"], "output", k, d, ""] for s in summary["signatures"] for k, d in s["outputs"].items()]
        lines += markdown_table(["signature", "", "key", "dtype", "shape"], rows)
    return "\n".join(lines + ["", f"**{cell(verdict)}**", ""])
