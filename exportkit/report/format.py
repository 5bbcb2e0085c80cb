"""Formatting shared by every report and every rendering: numbers and shares as the tables print them, text made
safe for a terminal, and the one verdict line (short enough for a screen, each cause once)."""
from __future__ import annotations

import re
from typing import Any

VERDICT_LIMIT = 200  # characters of the last line: it must fit on a screen

_ANSI = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[@-Z\\-_])")
_CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_UNKNOWN_OP = re.compile(r"Op type not registered '([^']+)'|unknown op '?([\w>./-]+)")


def number(x: Any) -> str:
    """A number in 3 significant digits (`-` for None, `nan`, `inf`, `0`); anything else as str()."""
    if x is None:
        return "-"
    if isinstance(x, float):
        if x != x:
            return "nan"
        if x in (float("inf"), float("-inf")):
            return "inf" if x > 0 else "-inf"
        if x == 0:
            return "0"
        return f"{x:.3g}"
    return str(x)


def percent(frac: float | None) -> str:
    """A share as `12.5%` (`<0.01%` below that, `-` for None)."""
    if frac is None:
        return "-"
    if frac == 0:
        return "0%"
    p = 100 * frac
    return f"{p:.3g}%" if p >= 0.01 else "<0.01%"


def clean(s: str | None) -> str:
    """Text without ANSI escape sequences or control characters (newlines and tabs kept)."""
    return _CTRL.sub("", _ANSI.sub("", s or ""))


def first_line(s: str | None) -> str:
    """The first line of cleaned text ("" for none): a table cell has room for one."""
    s = clean(s).strip()
    return s.splitlines()[0] if s else ""


def shorten(text: str, limit: int = 110) -> str:
    """`text` cut at a word boundary to at most `limit` characters, "..." marking the cut."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[:limit - 3].rsplit(" ", 1)[0].rstrip(" ,;:(")
    return cut + "..."


def error_cause(error: str | None) -> str:
    """A runtime error in a few words: the same cause reads the same whichever runtime (and TF) hit it."""
    text = clean(error)
    op = _UNKNOWN_OP.search(text)
    if op:
        return f"could not load the model (unknown op {op.group(1) or op.group(2)})"
    return "error: " + shorten(first_line(error) or "unknown error", 90)


def join_verdict(head: str, parts: list[str], limit: int = VERDICT_LIMIT) -> str:
    """`HEAD: a; b; c` within `limit` characters: parts that do not fit are counted ("+2 more, see above")."""
    line = f"{head}: " + "; ".join(parts)
    for keep in range(len(parts) - 1, 0, -1):
        if len(line) <= limit:
            break
        line = f"{head}: " + "; ".join(parts[:keep]) + f"; +{len(parts) - keep} more (see above)"
    return line


def text_table(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """Columns padded to their widest cell, two spaces apart, one line per row (headers first)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = []
    for row in (headers, *rows):
        cells = [c.ljust(w) for c, w in zip(row, widths)]
        lines.append("  ".join(cells).rstrip())
    return lines


# Sizes: decimal units are powers of 10 (MB = 10^6), binary ones powers of 2 (MiB = 2^20), as IEC 80000-13 says;
# a bare number is bytes. "M" or "G" alone would be ambiguous between the two, so they are refused.
SIZE_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
              "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*")


def parse_size(text: str | int) -> int | None:
    """Bytes from `512MB`, `1.5 GiB`, `800000000` (None when `text` is not a size; the caller says which flag)."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text if text >= 0 else None
    match = _SIZE.fullmatch(str(text))
    unit = SIZE_UNITS.get(match.group(2).lower() if match and match.group(2) else "b") if match else None
    return None if unit is None else int(float(match.group(1)) * unit)


DECIMAL_UNITS = (("kB", 10**3), ("MB", 10**6), ("GB", 10**9), ("TB", 10**12))


def size_text(n: int | None) -> str:
    """`520 MB` (3 significant digits, decimal units: MB = 10^6 bytes), `-` for None."""
    if n is None:
        return "-"
    sign, n = ("-" if n < 0 else ""), abs(n)
    return f"{sign}{n} B" if n < 1000 else sign + scaled(n, DECIMAL_UNITS)


def scaled(n: float, units: tuple[tuple[str, int], ...]) -> str:
    """`n` (>= 0) at 3 significant digits in the first of `units` (smallest first) where that reads below 1000:
    999,999 bytes is `1 MB`, not `1e+03 kB`; the last unit takes any larger figure."""
    for unit, scale in units:
        shown = float(f"{n / scale:.3g}")
        if shown < 1000:
            break
    return f"{shown:g} {unit}"
