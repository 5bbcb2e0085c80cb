"""The report files a command leaves for a person or a CI page: `--html FILE`, `--summary FILE` (Markdown) and,
for verify, `$GITHUB_STEP_SUMMARY`. Each command calls one function here with its finished result.

Writing them never decides a command's exit code: files are written atomically (temp file + rename) and, should
rendering or writing fail after the check ran, a warning says so on stderr and the check's verdict stands. What
can be known before the check runs is refused first, with exit 2 (`check_report_options`): a directory that does
not exist or cannot be written, `--html` without matplotlib.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable

from exportkit.errors import UsageError
from exportkit.files import append_whole, write_atomic

STEP_SUMMARY = "GITHUB_STEP_SUMMARY"


def check_report_options(html: str | None, summary: str | None) -> None:
    """Before any work: the report paths can be written, and --html has what it needs to draw."""
    check_report_path(html, "--html")
    check_report_path(summary, "--summary")
    if html:
        from exportkit.report.plots import require_matplotlib

        require_matplotlib()


def check_report_path(path: str | None, what: str = "--html") -> None:
    """Refuse (exit 2) a report path whose directory does not exist or cannot be written, before any work."""
    if not path:
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
        write_atomic(path, render(), f"the {what} {path}")
    except Exception as err:  # noqa: BLE001  (the report is a by-product: the check's exit code stands)
        message = getattr(err, "message", None) or f"{type(err).__name__}: {err}"
        print(f"warning: the {what} {path} was not written: {message}", file=sys.stderr)
        return False
    print(f"{what}: {path}", file=sys.stderr)
    return True


def write_verify(report, html: str | None, summary: str | None) -> None:
    """verify's HTML report and Markdown summary from the finished VerifyReport (also appended to
    $GITHUB_STEP_SUMMARY when it is set)."""
    from exportkit.verify.summary import verify_markdown

    if html:
        from exportkit.verify.html import verify_html

        write_report(html, lambda: verify_html(report))
    write_summary(summary, lambda: verify_markdown(report), append_step_summary=True)


def write_compat(report, html: str | None, summary: str | None, other_device: list | None = None) -> None:
    from exportkit.verify.summary import compat_markdown

    if html:
        from exportkit.verify.html import compat_html

        write_report(html, lambda: compat_html(report, other_device))
    write_summary(summary, lambda: compat_markdown(report))


def write_export(summary_json: dict | None, verdict: str, passed: bool, html: str | None, summary: str | None,
                 error: tuple[str, str | None] | None = None) -> None:
    from exportkit.verify.summary import export_markdown

    if html:
        from exportkit.verify.html import export_html

        write_report(html, lambda: export_html(summary_json, verdict, passed, error))
    write_summary(summary, lambda: export_markdown(summary_json, verdict, passed))


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
