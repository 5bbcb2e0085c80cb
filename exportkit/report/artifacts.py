"""Where a command's renderings go: the text (or the JSON document with `--json -`) on stdout, `--json FILE`, and
the report files for a person or a CI page: `--html FILE`, `--summary FILE` (Markdown) and `$GITHUB_STEP_SUMMARY`.
Each command hands over its renderers; nothing here knows a command.

Writing the report files never decides a command's exit code: files are written atomically (temp file + rename)
and, should rendering or writing fail after the check ran, a warning says so on stderr and the check's verdict
stands. What can be known before the check runs is refused first, with exit 2 (`check_report_options`): a
directory that does not exist or cannot be written, `--html` without matplotlib.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Callable

from exportkit import storage
from exportkit.errors import UsageError
from exportkit.files import append_whole, write_atomic

STEP_SUMMARY = "GITHUB_STEP_SUMMARY"


def json_text(doc: dict) -> str:
    """A JSON document as every command writes it: indented, one newline at the end."""
    return json.dumps(doc, indent=2) + "\n"


def write_text(path: str, text: str, what: str) -> None:
    """`text` into the file `path` whole or not at all: renamed into place, or one object upload to a bucket URL."""
    if storage.is_url(path):
        with storage.open_write(path, what) as fh:
            fh.write(text.encode("utf-8"))
    else:
        write_atomic(path, text, what)


def print_report(text: str, doc: dict, json_out: str | None) -> None:
    """A command's report: `text` on stdout, and `doc` as JSON in --json FILE; `--json -` prints only the JSON."""
    if json_out == "-":
        print(json.dumps(doc, indent=2))
        return
    print(text)
    if json_out:
        write_text(json_out, json_text(doc), f"--json {json_out}")


def check_report_options(html: str | None, summary: str | None) -> None:
    """Before any work: the report paths can be written, and --html has what it needs to draw."""
    check_report_path(html, "--html")
    check_report_path(summary, "--summary")
    if html:
        from exportkit.report.plots import require_matplotlib

        require_matplotlib()


def check_report_path(path: str | None, what: str = "--html") -> None:
    """Refuse (exit 2) a report path whose directory does not exist or cannot be written, before any work."""
    if not path or storage.is_url(path):  # a bucket: its errors come with the upload, named by the URL
        return
    parent = Path(path).resolve().parent
    if Path(path).is_dir():
        raise UsageError(f"{what} {path} is a directory", f"pass a file name, e.g. {what} {Path(path) / 'report.html'}")
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise UsageError(f"{what} {path}: directory {parent} does not exist or is not writable",
                         f"create {parent} first, or pass {what} with a path in a writable directory")


def write_report(path: str, render: Callable[[], str], what: str = "HTML report") -> bool:
    """Render and write atomically; a failure here is reported on stderr and never raised (the check decided)."""
    try:
        write_text(path, render(), f"the {what} {path}")
    except Exception as err:  # noqa: BLE001  (the report is a by-product: the check's exit code stands)
        message = getattr(err, "message", None) or f"{type(err).__name__}: {err}"
        print(f"warning: the {what} {path} was not written: {message}", file=sys.stderr)
        return False
    print(f"{what}: {path}", file=sys.stderr)
    return True


def write_report_files(html: str | None, summary: str | None, render_html: Callable[[], str],
                       render_markdown: Callable[[], str], append_step_summary: bool = False) -> None:
    """`--html FILE` and `--summary FILE` (and $GITHUB_STEP_SUMMARY when asked and set), each rendered only when
    wanted."""
    if html:
        write_report(html, render_html)
    write_summary(summary, render_markdown, append_step_summary)


def write_summary(path: str | None, render: Callable[[], str], append_step_summary: bool = False) -> None:
    """--summary FILE (written atomically), and appended to $GITHUB_STEP_SUMMARY when asked and set. Rendered
    only when wanted; a failure is a warning on stderr (the check's exit code stands)."""
    if path:
        write_report(path, render, "summary")
    step = os.environ.get(STEP_SUMMARY)
    if append_step_summary and step and (not path or Path(step).resolve() != Path(path).resolve()):
        try:
            append_whole(step, render() + "\n", f"${STEP_SUMMARY} ({step})")
        except Exception as err:  # noqa: BLE001
            message = getattr(err, "message", None) or f"{type(err).__name__}: {err}"
            print(f"warning: nothing appended to ${STEP_SUMMARY}: {message}", file=sys.stderr)
