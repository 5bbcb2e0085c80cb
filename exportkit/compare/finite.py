"""NaN and Inf in outputs: a model whose every runtime answers NaN "agrees" with itself, so the comparison alone
passes it. Pure functions over arrays, for verify's batches (`non_finite_findings`) and --data's stream
(`NonFiniteCounter`).

warning non-finite-output   NaN/Inf in an output every runtime produced (the model computes them)
error   non-finite-output   NaN/Inf where the reference (golden record, --against, record_reference) was finite
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from exportkit.findings import Finding

REFERENCES = ("golden", "trained", "keras")  # runtimes whose outputs are what the model computed before export


def non_finite(value) -> tuple[int, tuple[int, ...] | None]:
    """(how many elements are NaN or +-Inf, the index of the first); (0, None) for non-float outputs."""
    arr = np.asarray(value)
    if arr.dtype.kind not in "fc":
        return 0, None
    bad = ~np.isfinite(arr)
    count = int(bad.sum())
    if not count:
        return 0, None
    return count, tuple(int(i) for i in np.unravel_index(int(np.argmax(bad.reshape(-1))), arr.shape))


def _kinds(value) -> str:
    arr = np.asarray(value)
    kinds = [name for name, mask in (("NaN", np.isnan(arr)), ("Inf", np.isinf(arr))) if mask.any()]
    return "/".join(kinds)


@dataclass
class _Found:
    count: int = 0
    elements: int = 0
    first: str | None = None  # "batch 0 [3, 1]" or "record 17 [1]"
    kinds: str = ""
    runtimes: tuple = ()


def _message(key: str, found: _Found, where: str) -> str:
    return (f"output '{key}' is {found.kinds or 'not finite'} in {', '.join(found.runtimes)}: {found.count} of "
            f"{found.elements} values, first at {found.first}{where}")


def non_finite_findings(outputs: dict[str, list], signature: str | None = None) -> list[Finding]:
    """Per output key: a warning when the runtimes answered NaN/Inf, an error when a reference runtime (REFERENCES)
    had finite values at those places in the same batch. `outputs`: {runtime label: [outputs of each batch or
    None]}, as verify's execution holds them."""
    references = [label for label in outputs if label.split("@")[0] in REFERENCES]
    runtimes = [label for label in outputs if label not in references]
    keys = list(dict.fromkeys(k for label in runtimes for out in outputs[label] if out for k in out))
    findings = []
    for key in keys:
        found, broken = _Found(), _Found()
        for label in runtimes:
            counted = not found.runtimes  # the counts are the first such runtime's; the others are named
            elements = 0
            for i, out in enumerate(outputs[label]):
                if not out or key not in out:
                    continue
                value = np.asarray(out[key])
                count, first = non_finite(value)
                elements += value.size
                if not count:
                    continue
                if counted:
                    found.count += count
                    found.elements = elements  # completed after the loop
                found.first = found.first or f"batch {i} {list(first)}"
                found.kinds = found.kinds or _kinds(value)
                found.runtimes = tuple(dict.fromkeys((*found.runtimes, label)))
                for ref in references:
                    expected = (outputs[ref][i] or {}).get(key) if i < len(outputs[ref]) else None
                    expected = None if expected is None else np.asarray(expected)
                    if expected is None or expected.shape != value.shape or expected.dtype.kind not in "fc":
                        continue
                    where = ~np.isfinite(value) & np.isfinite(expected)
                    if where.any():
                        if not broken.runtimes or broken.runtimes[0] == f"{label} (vs {ref})":  # the first's counts
                            broken.count += int(where.sum())
                            broken.elements += value.size
                        index = np.unravel_index(int(np.argmax(where.reshape(-1))), value.shape)
                        broken.first = broken.first or f"batch {i} {[int(j) for j in index]}"
                        broken.kinds = broken.kinds or _kinds(value[where])
                        broken.runtimes = tuple(dict.fromkeys((*broken.runtimes, f"{label} (vs {ref})")))
            if counted and found.runtimes:
                found.elements = elements
        prefix = f"signature '{signature}': " if signature else ""
        if broken.count:
            findings.append(Finding("error", "non-finite-output", prefix + _message(key, broken, "") +
                                    "; the reference had finite values there: the SavedModel computes what the model "
                                    "did not (a layer or op that differs in the export: compare with `--against SRC`)"))
        elif found.count:
            findings.append(Finding("warning", "non-finite-output", prefix + _message(key, found, "") +
                                    "; no reference had finite values there: the model itself computes them (check its "
                                    "weights and inputs: clients get NaN/Inf too)"))
    return findings


class NonFiniteCounter:
    """--data: NaN/Inf counted per (runtime, output) batch after batch (no reference: they are warnings)."""

    def __init__(self):
        self.found: dict[str, _Found] = {}

    def add(self, label: str, outputs: dict, first_record: int) -> None:
        for key, value in outputs.items():
            value = np.asarray(value)
            found = self.found.setdefault(key, _Found())
            count, first = non_finite(value)
            found.elements += value.size
            if count:
                found.count += count
                found.first = found.first or f"record {first_record + first[0]} {list(first[1:])}"
                found.kinds = found.kinds or _kinds(value)
                found.runtimes = tuple(dict.fromkeys((*found.runtimes, label)))

    def findings(self) -> list[Finding]:
        return [Finding("warning", "non-finite-output", _message(key, found, " (records counted from 0)") +
                        "; the model computes them for these records (a client gets NaN/Inf too)")
                for key, found in self.found.items() if found.count]
