"""Will a SavedModel load, run and agree on TF Serving X.Y?  Two answers that check each other:

* predicted: static analysis of what a server executes against the op/kernel registries of TF 2.12 ... 2.21
  (package data under `registries/`, built by tools/build_registries.py), without importing TensorFlow;
* observed: the serving-equivalent session runtime inside a managed `tensorflow-cpu==X.Y.*` environment.
"""
from __future__ import annotations

import re

from exportkit.errors import UsageError

SUPPORTED = tuple(f"2.{minor}" for minor in range(12, 22))  # wheels for the project's Python 3.11
RANGE = f"{SUPPORTED[0]}-{SUPPORTED[-1]}"


def _minor(version: str) -> int:
    return int(version.split(".")[1])


def check_version(text: str) -> str:
    """'2.14' (or '2.14.1') -> '2.14'; anything outside the supported range is a UsageError naming it."""
    m = re.fullmatch(r"\s*(\d+)\.(\d+)(?:\.\d+)?\s*", text or "")
    version = f"{m.group(1)}.{m.group(2)}" if m else None
    if version not in SUPPORTED:
        raise UsageError(f"TensorFlow version {text.strip()!r} is not supported (supported: {RANGE})",
                         f"pick versions in {RANGE}, e.g. --tf 2.12,2.17 or --tf {RANGE} or --tf all")
    return version


def parse_versions(spec: str | list[str] | None) -> list[str]:
    """`all` (or nothing), a list `2.12,2.17`, a range `2.14-2.21`, or several of those -> sorted versions."""
    parts = [spec] if isinstance(spec, str) or spec is None else list(spec)
    chosen: set[str] = set()
    for part in parts:
        for item in (part or "all").split(","):
            item = item.strip()
            if item in ("all", ""):
                chosen.update(SUPPORTED)
            elif "-" in item:
                lo, hi = (check_version(x) for x in item.split("-", 1))
                if _minor(lo) > _minor(hi):
                    raise UsageError(f"--tf range {item!r} runs backwards", f"write it low-high, e.g. {hi}-{lo}")
                chosen.update(v for v in SUPPORTED if _minor(lo) <= _minor(v) <= _minor(hi))
            else:
                chosen.add(check_version(item))
    return sorted(chosen, key=_minor)
