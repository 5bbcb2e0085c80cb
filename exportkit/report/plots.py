"""Figures of the HTML report as inline SVG strings, drawn with matplotlib (the `exportkit[report]` extra).

Only matplotlib's object API is used (`Figure`, never pyplot): no backend is chosen and no global state changes
beyond `rc_context`, which restores the settings it changes. Text stays text in the SVG (`svg.fonttype: none`)
and every figure gets its own id salt, so many figures can be inlined into one page without clashing ids.
"""
from __future__ import annotations

import io
import itertools
import math
import re

from exportkit.errors import UsageError

REPORT_EXTRA = "pip install 'exportkit[report]'  (it adds matplotlib)"
PASS_COLOUR, FAIL_COLOUR, NEUTRAL_COLOUR, TOLERANCE_COLOUR = "#4c78a8", "#d62728", "#7f7f7f", "#222222"
_salts = itertools.count()


def require_matplotlib() -> None:
    """UsageError (exit 2) naming what to install when --html is asked for without the report extra."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("--html needs matplotlib to draw its plots, and it is not installed", REPORT_EXTRA) from None


def _svg(fig) -> str:
    import matplotlib

    out = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": f"exportkit-{next(_salts)}"}):
        fig.savefig(out, format="svg", bbox_inches="tight")
    text = out.getvalue()
    text = text[text.index("<svg"):]  # no XML declaration or DOCTYPE inside HTML
    return re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)  # nor a creation date: pages reproduce


def _figure(panels: int):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3.6 * panels, 2.6))
    return fig, fig.subplots(1, panels, squeeze=False)[0]


def _histogram(ax, hist: dict, tolerance: float | None, label: str, tolerance_name: str) -> None:
    """Bars on a log axis: the elements within tolerance in blue, the ones over it in red; the tolerance dashed."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    step = 1.0 / hist["bins_per_decade"]
    counts, over = hist["counts"], hist["over"]
    if counts:
        edges = [10 ** (hist["start"] + i * step) for i in range(len(counts) + 1)]
        widths = [b - a for a, b in zip(edges, edges[1:])]
        if over is None:  # streamed --data statistics: counts only
            ax.bar(edges[:-1], counts, width=widths, align="edge", color=NEUTRAL_COLOUR, label="elements")
        else:
            within = [c - o for c, o in zip(counts, over)]
            ax.bar(edges[:-1], within, width=widths, align="edge", color=PASS_COLOUR, label="within tolerance")
            ax.bar(edges[:-1], over, width=widths, align="edge", bottom=within, color=FAIL_COLOUR,
                   label="over tolerance")
        ax.set_xscale("log")
        ax.set_yscale("log")  # a count of 1 in the tail stays visible next to thousands in the bulk
        ax.set_ylim(0.5, max(counts) * 2)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    if tolerance and counts:
        ax.axvline(tolerance, color=TOLERANCE_COLOUR, linestyle="--", linewidth=1, label=f"{tolerance_name} {tolerance:.3g}")
    zeros = f"; {hist['zeros']} exact" if hist.get("zeros") else ""
    ax.set_title(f"{label}{zeros}", fontsize=9)
    ax.set_xlabel(label, fontsize=8)
    ax.set_ylabel("elements", fontsize=8)
    ax.tick_params(labelsize=7)
    if counts:
        ax.legend(fontsize=7, loc="upper right")


def _scatter(ax, pairs: dict, worst: list[dict] | None) -> None:
    """Reference (x) against runtime (y): on the diagonal they agree; the worst elements in red."""
    xs, ys = pairs["expected"], pairs["actual"]
    ax.scatter(xs, ys, s=6, color=PASS_COLOUR, label="sample")
    bad = [w for w in worst or [] if isinstance(w.get("expected"), float) and isinstance(w.get("actual"), float)
           and math.isfinite(w["expected"]) and math.isfinite(w["actual"]) and w["excess"] > 0]
    if bad:
        ax.scatter([w["expected"] for w in bad], [w["actual"] for w in bad], s=14, color=FAIL_COLOUR,
                   label="over tolerance")
    values = xs + ys + [w["expected"] for w in bad] + [w["actual"] for w in bad]
    if values:
        lo, hi = min(values), max(values)
        ax.plot([lo, hi], [lo, hi], color=TOLERANCE_COLOUR, linewidth=0.8, linestyle="--")
    ax.set_title("reference vs runtime", fontsize=9)
    ax.set_xlabel("reference", fontsize=8)
    ax.set_ylabel("runtime", fontsize=8)
    ax.tick_params(labelsize=7)
    if bad:
        ax.legend(fontsize=7, loc="upper left")


def comparison_figure(abs_hist: dict | None, rel_hist: dict | None, pairs: dict | None, worst: list | None,
                      atol: float | None, rtol: float | None) -> str | None:
    """One row of panels for one output of one runtime: |error| and relative error histograms, the scatter."""
    panels = [p for p in (("abs", abs_hist), ("rel", rel_hist), ("scatter", pairs)) if p[1]]
    if not panels:
        return None
    fig, axes = _figure(len(panels))
    for ax, (kind, data) in zip(axes, panels):
        if kind == "abs":
            _histogram(ax, data, atol, "absolute error", "atol")
        elif kind == "rel":
            _histogram(ax, data, rtol, "relative error", "rtol")
        else:
            _scatter(ax, data, worst)
    return _svg(fig)

