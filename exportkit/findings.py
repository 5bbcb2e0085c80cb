"""Findings of the static checks, shared by inspect, verify and the baseline comparison."""
from __future__ import annotations

from dataclasses import asdict, dataclass

SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True)
class Finding:
    severity: str  # "error" | "warning" | "info"
    code: str  # stable, machine-readable, e.g. "py-func", "fixed-batch"
    message: str  # one sentence for humans, with the fix where there is one

    def to_dict(self) -> dict:
        return asdict(self)


def has_errors(findings: list[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)
