"""The building blocks of every HTML report (verify, verify --data, diff, compat, export): one self-contained page
(inline CSS and SVG; no script, no font, no network), tables whose cells may carry a CSS class, and escaping.
Built with the standard library; the figures come from report/plots.py."""
from __future__ import annotations

import html
from typing import Any

from exportkit.report.format import clean

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:1.5em auto;max-width:1200px;
     color:#222;padding:0 1em}
h1{font-size:1.4em;margin-bottom:.2em} h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
h3{font-size:1em;margin-bottom:.3em} code,pre{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.85em}
pre{background:#f6f6f6;padding:.6em;overflow-x:auto;white-space:pre-wrap;max-height:24em}
table{border-collapse:collapse;margin:.4em 0} th,td{border:1px solid #ccc;padding:.25em .5em;text-align:left;
     vertical-align:top;font-size:.9em} th{background:#f0f0f0}
.verdict{font-size:1.1em;font-weight:600;padding:.6em .8em;border-radius:4px}
.pass,.ok{background:#d9f2d9} .fail,.fails,.error{background:#f8d0d0} .warn{background:#fcefc7}
.skip,.ref,.none{background:#eee} .meta{color:#555} .num{text-align:right;font-variant-numeric:tabular-nums}
figure{margin:.4em 0} figure svg{max-width:100%;height:auto}
"""


def e(x: Any) -> str:
    """Text escaped for HTML, control characters and ANSI codes removed (one letter: every cell calls it)."""
    return html.escape(clean("" if x is None else str(x)), quote=True)


def page(title: str, verdict: str, passed: bool, body: list[str]) -> str:
    """The whole document: title, the verdict in green or red, then `body` (HTML already)."""
    cls = "pass" if passed else "fail"
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{e(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{e(title)}</h1>", f'<p id="verdict" class="verdict {cls}">{e(verdict)}</p>', *body, "</body></html>", ""])


def table(headers: list[str], rows: list[list[str]], id: str | None = None) -> str:
    """Cells are HTML already (escape with `e`); a cell given as (html, css_class, attrs) gets a class."""
    out = [f'<table id="{e(id)}">' if id else "<table>"]
    if any(headers):
        out.append("<tr>" + "".join(f"<th>{e(h)}</th>" for h in headers) + "</tr>")
    for row in rows:
        cells = []
        for cell in row:
            if isinstance(cell, tuple):
                text, cls, attrs = (*cell, "")[:3]
                cells.append(f'<td class="{cls}"{attrs}>{text}</td>')
            else:
                cells.append(f"<td>{cell}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def precise(x: Any) -> str:
    """A value escaped, floats to 7 significant digits (float32 has ~7: enough to see two values differ)."""
    return e(f"{x:.7g}" if isinstance(x, float) else x)


def severity_class(severity: str) -> str:
    """The CSS class of a finding's severity cell."""
    return {"error": "fail", "warning": "warn"}.get(severity, "none")
