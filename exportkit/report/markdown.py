"""The building blocks of every Markdown summary (`--summary FILE`, `$GITHUB_STEP_SUMMARY`): a heading with the
outcome, short GitHub-flavoured tables, cells that cannot break them."""
from __future__ import annotations

from exportkit.report.format import clean


def cell(x) -> str:
    """Text safe inside a Markdown table cell (pipes escaped, one line)."""
    return " ".join(clean("" if x is None else str(x)).split()).replace("|", "\\|")


def table(headers: list[str], rows: list[list]) -> list[str]:
    """A GitHub table's lines; every cell goes through `cell`."""
    return (["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
            + ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows])


def heading(command: str, subject: str, passed: bool, outcome: str | None = None) -> str:
    """`### ✅ exportkit verify: passed — `models/m/1``; `outcome` replaces "passed"/"FAILED" (an infrastructure
    error is no failure of the model)."""
    mark, word = ("⚠️", outcome) if outcome else ("✅", "passed") if passed else ("❌", "FAILED")
    return f"### {mark} exportkit {command}: {word} — `{cell(subject)}`"
