"""The report out: text (or JSON with `--json -`) on stdout, `--json FILE`, `--junit FILE`, `--html FILE`,
`--summary FILE` (and $GITHUB_STEP_SUMMARY); the exit code.

The renderings are verify/report.py's and render_*.py's; this only decides where each one goes.
"""
from __future__ import annotations

import sys

from exportkit.options.verify import VerifyOptions
from exportkit.verify.report import VerifyReport


def finish(report: VerifyReport, o: VerifyOptions) -> int:
    from exportkit.report.artifacts import print_report, write_report_files, write_text
    from exportkit.verify.render_html import verify_html
    from exportkit.verify.render_junit import to_junit_xml
    from exportkit.verify.render_markdown import verify_markdown
    from exportkit.verify.render_text import render_text
    from exportkit.verify.report import to_json

    json_out, junit = o.json_out, o.junit
    print_report(render_text(report) if json_out != "-" else "", to_json(report), json_out)
    if junit:
        write_text(junit, to_junit_xml(report), f"--junit {junit}")
    sys.stdout.flush()
    write_report_files(o.html, o.summary, lambda: verify_html(report), lambda: verify_markdown(report),
                       append_step_summary=True)
    return 0 if report.passed else 1


def save(directory: str, flag: str, sets: dict[str, list]) -> None:
    """--save-inputs / --save-outputs DIR: one .npz per batch, `<name>_batch_<i>.npz` for each name of `sets`,
    all of them or none."""
    from exportkit.inputs.npz import save_batch_sets

    save_batch_sets(directory, sets, f"{flag} {directory}")
