"""The report out: text (or JSON with `--json -`) on stdout, `--json FILE`, `--junit FILE`, `--html FILE`,
`--summary FILE` (and $GITHUB_STEP_SUMMARY); the exit code.

Rendering itself is verify/report.py's; this only decides where each rendering goes.
"""
from __future__ import annotations

import sys

from exportkit.files import print_report, write_atomic
from exportkit.options.verify import VerifyOptions
from exportkit.verify.report import VerifyReport


def finish(report: VerifyReport, o: VerifyOptions) -> int:
    from exportkit.report.artifacts import write_verify
    from exportkit.verify.report import render_text, to_json, to_junit_xml

    json_out, junit = o.json_out, o.junit
    print_report(render_text(report) if json_out != "-" else "", to_json(report), json_out)
    if junit:
        write_atomic(junit, to_junit_xml(report), f"--junit {junit}")
    sys.stdout.flush()
    write_verify(report, o.html, o.summary)
    return 0 if report.passed else 1


def save(directory: str, flag: str, sets: dict[str, list]) -> None:
    """--save-inputs / --save-outputs DIR: one .npz per batch, `<name>_batch_<i>.npz` for each name of `sets`,
    all of them or none."""
    from exportkit.inputs.batches import save_batch_sets

    save_batch_sets(directory, sets, f"{flag} {directory}")
