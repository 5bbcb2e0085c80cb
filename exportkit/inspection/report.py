"""What `inspect` reports about a SavedModel (SavedModelInfo) and its text rendering (`--json` is `to_dict`).

The layout follows `saved_model_cli show --all`, sorted and aligned, plus ops, assets, files read, variables, the
static TF Serving forecast, the manifest and the findings.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from exportkit.findings import Finding
from exportkit.report.format import size_text

SCHEMA_VERSION = 1  # of `inspect --json` (docs/report-schema.md)


@dataclass
class SavedModelInfo:
    path: str  # the resolved version directory
    tags: list[str]
    tensorflow_version: str | None  # the TensorFlow that wrote the SavedModel (meta_info_def)
    signatures: dict  # see exportkit.savedmodel.signature_defs.signatures_of
    ops: dict[str, int]  # op type -> node count, graph + function library
    assets: list[str]  # paths relative to `path`, under assets/ and assets.extra/
    variables_bytes: int  # bytes of the files under variables/
    variables: dict | None  # the checkpoint's tensors (see `_variables_summary`); None without a readable one
    manifest: dict | None  # assets.extra/exportkit/manifest.json, when present and valid
    findings: list[Finding] = field(default_factory=list)
    oldest_tf_serving: str | None = None  # oldest TF (Serving) version the static compat analysis accepts, CPU
    oldest_tf_serving_with_xla: str | None = None  # the same, on a server started with --xla_cpu_compilation_enabled
    files_read: list[dict] = field(default_factory=list)  # exportkit.savedmodel.deployment.FileRead.to_dict(): assets, paths
    # TF Serving's RAM estimate before it loads the version: {"files_bytes", "estimate_bytes"} (savedmodel/resources.py)
    memory_estimate: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "path": self.path,
            "tags": list(self.tags),
            "tensorflow_version": self.tensorflow_version,
            "signatures": self.signatures,
            "ops": dict(self.ops),
            "assets": list(self.assets),
            "variables_bytes": self.variables_bytes,
            "variables": self.variables,
            "manifest": self.manifest,
            "findings": [f.to_dict() for f in self.findings],
            "oldest_tf_serving": self.oldest_tf_serving,
            "oldest_tf_serving_with_xla": self.oldest_tf_serving_with_xla,
            "files_read": list(self.files_read),
            "memory_estimate": dict(self.memory_estimate),
        }


def _fmt_shape(shape) -> str:
    if shape is None:
        return "unknown rank"
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _table(rows: list[tuple[str, ...]], indent: str) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [c.ljust(w) for c, w in zip(row, widths)]
        lines.append((indent + "  ".join(cells)).rstrip())
    return lines


def _summary(value) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(list(value)[:6]) + (", ..." if len(value) > 6 else "") + "}"
    if isinstance(value, list):
        return f"[{len(value)} items]"
    return str(value)


def _render_variables(info: SavedModelInfo) -> list[str]:
    from exportkit.savedmodel.checkpoint import format_bytes

    v = info.variables
    if v is None:
        return [f"variables: {format_bytes(info.variables_bytes)} on disk"]
    out = [f"variables: {v['tensors']} tensor{'s' if v['tensors'] != 1 else ''}, {format_bytes(v['bytes'])} in "
           f"{v['shards']} shard{'s' if v['shards'] != 1 else ''}"
           + (f"; duplicated: {format_bytes(v['duplicate_bytes'])}" if v["duplicate_bytes"] else "")
           + f"; on disk: {format_bytes(info.variables_bytes)}"]
    if v["largest"]:
        out += _table([(t["name"], t["dtype"], _fmt_shape(t["shape"]), format_bytes(t["bytes"]).split(" (")[0])
                       for t in v["largest"]], "  ")
    return out


def _render_files_read(reads: list[dict]) -> list[str]:
    rows = [(f"assets/{r['asset']}" if "asset" in r else f"{r['path']} (outside the SavedModel)", r["op"],
             "at load" if r["when"] == "load" else "per request") for r in reads]
    return [f"files read: {len(reads)}"] + _table(rows, "  ") if reads else []


def render_text(info: SavedModelInfo) -> str:
    """Human output: `saved_model_cli show --all` layout, sorted and aligned, plus ops, assets and findings."""
    out = [f"SavedModel: {info.path}",
           f"  tags: {', '.join(info.tags) or '(none)'}    written by TensorFlow {info.tensorflow_version or '?'}",
           ""]
    if not info.signatures:
        out += ["signatures: none", ""]
    else:
        listed = ", ".join(f"{name} ({(sig['method'] or '?').rpartition('/')[2]})" for name, sig in info.signatures.items())
        out += [f"signatures: {len(info.signatures)}: {listed}", ""]
    for name, sig in info.signatures.items():
        out.append(f"signature_def['{name}']:")
        for kind in ("inputs", "outputs"):
            tensors = sig[kind]
            out.append(f"  {kind}:")
            if not tensors:
                out.append("    (none)")
                continue
            rows = [("key", "dtype", "shape", "name")]
            rows += [(k, t["dtype"], _fmt_shape(t["shape"]), t.get("name") or t.get("encoding") or "")
                     for k, t in tensors.items()]
            out += _table(rows, "    ")
        out.append(f"  method name: {sig['method'] or '(none)'}")
        out.append("")

    total = sum(info.ops.values())
    out.append(f"ops: {len(info.ops)} types, {total} nodes (graph and function library)")
    if info.ops:
        out += _table([(op, str(n)) for op, n in info.ops.items()], "  ")
    out.append("")
    out.append(f"assets: {len(info.assets)}")
    out += [f"  {a}" for a in info.assets]
    out += _render_files_read(info.files_read)
    out += _render_variables(info)
    if info.memory_estimate:
        out.append(f"memory: TF Serving's estimate {size_text(info.memory_estimate['estimate_bytes'])} "
                   f"({size_text(info.memory_estimate['files_bytes'])} of files x 1.2; MB = 10^6 bytes), what its "
                   f"resource tracker admits the version on; `exportkit verify` measures what the load takes")
    from exportkit.tfversions import RANGE

    xla = (f" with stock flags ({info.oldest_tf_serving_with_xla} and newer with --xla_cpu_compilation_enabled=true)"
           if info.oldest_tf_serving_with_xla else "")
    out.append("TF Serving (static, CPU): " + (f"{info.oldest_tf_serving} and newer" if info.oldest_tf_serving else
                                               f"no version in {RANGE}{xla}") + "; `exportkit compat` for details")
    if info.manifest is None:
        out.append("manifest: none (not exported by exportkit)")
    else:
        out.append("manifest:")
        out += _table([(str(k), _summary(v)) for k, v in sorted(info.manifest.items())], "  ") if info.manifest else []
    out.append("")
    if info.findings:
        counts = [(sev, sum(f.severity == sev for f in info.findings)) for sev in ("error", "warning", "info")]
        out.append("findings: " + ", ".join(f"{n} {sev}{'s' if n != 1 else ''}" for sev, n in counts if n))
        out += [f"  {f.severity:<7}  {f.code:<22}  {f.message}" for f in info.findings]
    else:
        out.append("findings: none")
    return "\n".join(out)
