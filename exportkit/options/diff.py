"""`exportkit diff`'s options, from the CLI's flags or the Python API's keyword arguments (the same names); the
gates are parsed here, so a bad one fails before any version is read."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from exportkit.errors import UsageError
from exportkit.options.flags import refuse_unknown, size_flag, texts

QUANTILE_NAMES = ("p50", "p99", "p99.9", "max")


@dataclass
class DiffOptions:
    """`exportkit diff`: the two versions, the inputs, the gates and the reports."""

    paths: list[str]  # [OLD, NEW], [BASE_DIR] (its newest two), or [NEW] with `serving`
    serving: str | None = None  # HOST:PORT of the deployed OLD version
    model_name: str | None = None
    model_version: int | None = None
    signature_name: str | None = None
    data: str | None = None
    limit: int | None = None
    batch_size: int = 1024  # larger than verify --data's: both versions see the same batches, and each batch costs
    # a round trip through two worker processes
    sample: float | None = None
    seed: int = 0
    samples: int = 8
    label: str | None = None
    max_changed_top1: float | None = None  # --max-changed-top1 0.5% or 0.005, as a share
    max_abs_change: dict[str, float] = field(default_factory=dict)  # --max-abs-change p99=0.05: {"p99": 0.05}
    min_metric_delta: float | None = None
    runner: str = "in-process"
    beam_options: list[str] = field(default_factory=list)
    device: str = "cpu"
    load_timeout: float = 120.0
    json_out: str | None = None
    html: str | None = None
    summary: str | None = None
    # NEW's peak memory, and the swap's (OLD loaded beside NEW), over which the diff fails (verify/memory.py)
    max_memory: int | None = None
    max_swap_memory: int | None = None


# keyword (the flag's longest name) -> DiffOptions field
_RENAMES = {"beam_option": "beam_options", "json": "json_out"}


def diff_options(paths, **flags) -> DiffOptions:
    """DiffOptions from the flags by name (the CLI and `exportkit.diff()` both build them here), gates parsed."""
    fields = set(DiffOptions.__dataclass_fields__) - {"paths", *_RENAMES.values()}
    refuse_unknown("diff", flags, fields | set(_RENAMES))
    values = {_RENAMES.get(k, k): v for k, v in flags.items()}
    values["max_changed_top1"] = parse_share(values.get("max_changed_top1"))
    values["max_abs_change"] = parse_abs_gates(texts(values.get("max_abs_change")))
    for name in ("max_memory", "max_swap_memory"):
        values[name] = size_flag("--" + name.replace("_", "-"), values.get(name))
    if "beam_options" in values:
        values["beam_options"] = texts(values["beam_options"])
    o = DiffOptions(paths=[str(p) for p in paths], **values)
    if o.min_metric_delta is not None and not o.label:
        raise UsageError("--min-metric-delta needs --label KEY", "pass --label with the feature that holds the label")
    if o.runner not in ("in-process", "beam"):
        raise UsageError(f"--runner {o.runner!r} is not in-process or beam", "pass --runner beam, or leave it out")
    return o


def parse_share(text) -> float | None:
    """`0.5%` or `0.005` -> 0.005."""
    if text is None:
        return None
    text = str(text)
    try:
        value = float(text[:-1]) / 100 if text.strip().endswith("%") else float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 1:
        raise UsageError(f"--max-changed-top1 {text!r} is not a share", "pass a percentage (0.5%) or a fraction (0.005)")
    if value == 1 and not text.strip().endswith("%"):  # a gate that never fails; "1" most likely meant 1%
        raise UsageError(f"--max-changed-top1 {text!r} reads as the fraction 1 (100%: a gate that never fails)",
                         "write 1% for one percent (or 100% to allow every top-1 answer to change)")
    return value


def parse_abs_gates(items: list[str]) -> dict[str, float]:
    """`p99=0.05` (repeatable) -> {"p99": 0.05}."""
    gates = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not sep or name not in QUANTILE_NAMES or not (number >= 0):
            raise UsageError(f"--max-abs-change {item!r} is not QUANTILE=VALUE",
                             f"write it as --max-abs-change p99=0.05 (quantiles: {', '.join(QUANTILE_NAMES)})")
        gates[name] = number
    return gates
