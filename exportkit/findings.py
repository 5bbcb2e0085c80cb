"""Findings of the static checks, shared by inspect, verify and the baseline comparison."""
from __future__ import annotations

from dataclasses import asdict, dataclass

SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True)
class Finding:
    severity: str  # "error" | "warning" | "info"
    code: str  # stable, machine-readable, e.g. "py-func", "fixed-batch"
    message: str  # one sentence for humans, with the fix where there is one
    op: str | None = None  # the op type a graph-level finding is about (compat findings)
    node: str | None = None  # the node ("function/node" inside a function) it was found on

    def to_dict(self) -> dict:
        """Without op/node where they do not apply, so lint findings keep their three keys."""
        return {k: v for k, v in asdict(self).items() if v is not None or k not in ("op", "node")}


def has_errors(findings: list[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)
