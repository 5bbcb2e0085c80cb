"""The Python API: every command as a function that returns the report the CLI renders.

    exportkit.export(source, base_dir, **options) -> ExportResult
    exportkit.verify(path, **options)              -> VerifyReport
    exportkit.inspect(path, **options)             -> Inspection (a SavedModel) or SourceInspection (a source)
    exportkit.compat(path, tf=[...], run=False, **options) -> CompatReport
    exportkit.diff(old, new, **options)            -> DiffReport

Options are the CLI's flags as keyword arguments (`--custom-objects` is `custom_objects=[...]`, a repeatable flag
takes a list or one string), with the CLI's defaults. The report files (`--json`, `--html`, `--summary`,
`--junit`) are the reports' methods. A model that fails a check is a report that did not pass; bad input raises
UsageError, infrastructure InfraError (both ExportkitError, with `.message` and `.fix`).

A good library citizen: nothing on stdout (notes and progress go to the `exportkit` logger), no signal handlers,
no sys.exit. TensorFlow work runs in worker processes as in the CLI, so the caller's TensorFlow and Keras state
(dtype policy, devices, TF32) is not touched: `export` and `inspect` of a model source run the CLI's own code in
a child process (the Keras a source needs is chosen before TensorFlow is imported); `verify(against=SRC)` rebuilds
the eager model in this process, as the CLI does. Calls from several threads are safe, except with
`op_library=`, which sets an environment variable the workers inherit (one op-library set per process at a time).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from exportkit.errors import EXIT_INFRA, EXIT_USAGE, ExportkitError, InfraError, UsageError
from exportkit.options.flags import REPORT_FILES, listed, refuse_unknown

log = logging.getLogger("exportkit")


# ---------------------------------------------------------------------------------------------------- verify


def verify(path, **options):
    """Verify a SavedModel (a version directory, a base directory or any SavedModel) through every runtime, as
    `exportkit verify PATH` does. Returns the VerifyReport (`.passed`, `.exit_code`, `.verdict`, `.runtimes`,
    `.outputs`, `.findings`, `.to_dict()`); raises UsageError on bad input and InfraError when the environment
    failed (the partial report is the error's `.report`)."""
    from exportkit.options.verify import verify_options
    from exportkit.verify.command import run_verify

    refuse_unknown("verify", {k for k in options if k in REPORT_FILES}, ())
    libraries = listed(options.get("op_library"))
    o = verify_options(path, **options)
    with _op_libraries(libraries):
        report = _as(VerifyReport, run_verify(o))
    if report.stopped is not None and report.exit_code == EXIT_INFRA:
        report.stopped.report = report
        raise report.stopped
    return report


# ---------------------------------------------------------------------------------------------------- compat


def compat(path, tf=None, run=False, **options):
    """Will the SavedModel load, run and agree on TF Serving X.Y? As `exportkit compat PATH --tf ...`: predicted
    statically, observed with `run=True` (managed TF X.Y environments) and on TF Serving's image with
    `serving="docker"`. Returns the CompatReport (`.versions`, `.passed`, `.exit_code`, `.to_dict()`)."""
    from exportkit.compat.command import run_compat
    from exportkit.options.compat import compat_options

    refuse_unknown("compat", {k for k in options if k in REPORT_FILES}, ())
    libraries = listed(options.get("op_library"))
    o = compat_options(path, tf, run, **options)
    with _op_libraries(libraries):
        return _as(CompatReport, run_compat(o))


# ---------------------------------------------------------------------------------------------------- diff


def diff(old, new=None, **options):
    """What NEW changes for the clients of OLD, as `exportkit diff OLD NEW`: signatures first, then both versions'
    answers on the same inputs (generated and golden batches, or `data=` records). OLD may be a base directory
    (its newest two versions, NEW left out), or NEW alone with `serving="HOST:PORT"` for the deployed OLD.
    Returns the DiffReport (`.passed`, `.exit_code`, `.verdict`, `.outputs`, `.gates`, `.to_dict()`)."""
    from exportkit.diff.command import run_diff
    from exportkit.options.diff import diff_options

    refuse_unknown("diff", {k for k in options if k in REPORT_FILES}, ())
    o = diff_options([old] + ([new] if new is not None else []), **options)
    return _as(DiffReport, run_diff(o))


# ---------------------------------------------------------------------------------------------------- inspect


def inspect(path, **options):
    """Signatures, dtypes, shapes, ops, assets and findings of a SavedModel (no TensorFlow import), as `exportkit
    inspect PATH`; a model source (.h5, .keras, checkpoint) is described by the CLI in a child process. Returns
    an Inspection (`.signatures`, `.findings`, `.exit_code`, `.to_dict()`) or, for a source, a SourceInspection."""
    from exportkit import storage
    from exportkit.inspection.command import SOURCE_SUFFIXES, is_model_source, read_info
    from exportkit.savedmodel.versions import check_path

    url = storage.is_url(path)  # a bucket URL is read as the CLI reads it (docs/storage.md)
    p = str(path) if url else Path(path).expanduser()
    if not url:
        check_path(p, "pass a SavedModel (version or base directory) or a model source (.h5, .keras, checkpoint)")
    if is_model_source(p, options.get("format")) or (url and p.lower().endswith(SOURCE_SUFFIXES)):
        doc, code = _cli("inspect", [str(p), "--json"], options)
        return SourceInspection(doc, code)
    refuse_unknown("inspect", options, ("strict",))
    info = _as(Inspection, read_info(p))
    info.strict = bool(options.get("strict"))
    return info


# ---------------------------------------------------------------------------------------------------- export


def export(source, base_dir=None, **options):
    """Export a model source (.h5, .keras, a checkpoint or .weights.h5 with `builder=`, a Keras 2 SavedModel) to
    BASE_DIR/<version>/, self-checked, as `exportkit export SOURCE -o BASE_DIR` does. Returns the ExportResult
    (`.version_dir`, `.version`, `.signatures`, `.findings`, `.to_dict()`)."""
    refuse_unknown("export", {k for k in options if k in REPORT_FILES + ("output",)}, ())
    with tempfile.TemporaryDirectory(prefix="exportkit-api-") as tmp:
        summary = Path(tmp) / "export.json"
        args = [str(source)] + (["-o", str(base_dir)] if base_dir is not None else []) + ["--json", str(summary)]
        _cli("export", args, options, json_file=summary)
        doc = json.loads(summary.read_text())
    return ExportResult.from_json(doc)


# ------------------------------------------------------------------------------------------ the CLI as a child


def _argv(options: dict) -> list[str]:
    """Keyword arguments as the CLI's flags: `custom_objects=["m"]` -> `--custom-objects m`."""
    argv = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            for item in value:
                argv += [flag, str(item)]
        else:
            argv += [flag, str(value)]
    return argv


def _cli(command: str, args: list[str], options: dict, json_file: Path | None = None) -> tuple[dict | None, int]:
    """Run `python -m exportkit COMMAND ARGS OPTIONS` (the CLI's own code, in a fresh process that chooses its Keras
    before importing TensorFlow). Its stderr lines go to the `exportkit` logger; its error (the CLI's `error:` and
    `fix:` lines) is raised as the ExportkitError of its exit code. Returns (the JSON it printed or wrote, code)."""
    argv = [sys.executable, "-m", "exportkit", command, *args, *_argv(options)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "3"))
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    err_lines: list[str] = []
    reader = threading.Thread(target=_log_lines, args=(proc.stderr, err_lines), daemon=True)
    reader.start()
    try:
        out = proc.stdout.read()
        code = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    reader.join()
    if code not in (0, 1):
        raise _error_of(code, err_lines, command)
    text = json_file.read_text() if json_file is not None and json_file.is_file() else out
    try:
        return (json.loads(text) if text.strip() else None), code
    except json.JSONDecodeError:
        raise InfraError(f"exportkit {command} printed no JSON report", "report it; run the same command with the "
                         "CLI to see its output") from None


def _log_lines(stream, keep: list[str]) -> None:
    """The child's stderr: progress and notes to the logger; from its error on, kept only (it is raised)."""
    failed = False
    for line in stream:
        line = line.rstrip("\n")
        keep.append(line)
        failed = failed or line.startswith(("error: ", "Usage: "))
        if line.strip() and not failed:
            log.info(line)


def _error_of(code: int, lines: list[str], command: str) -> ExportkitError:
    """The CLI's `error: MESSAGE` / `  fix: FIX` lines (or click's `Error: ...` for an unknown flag) as the error."""
    message, fix = None, None
    for line in lines:
        text = line.strip().lstrip("│ ").rstrip(" │")
        if line.startswith("error: "):
            message, fix = line[len("error: "):], None
        elif text.startswith("Error: ") or text.startswith("No such option"):
            message, fix = text.removeprefix("Error: "), f"see `exportkit {command} --help` for the options"
        elif line.startswith("  fix: ") and message is not None:
            fix = line[len("  fix: "):]
    message = message or f"exportkit {command} ended with exit code {code}"
    kind = UsageError if code == EXIT_USAGE else InfraError
    if code not in (EXIT_USAGE, EXIT_INFRA):  # a signal or an interrupt
        fix = fix or "run the command again; see the `exportkit` logger for what it printed"
    return kind(message, fix)


class _op_libraries:
    """--op-library for the workers a call starts (an environment variable: one set per process at a time)."""

    _lock = threading.Lock()

    def __init__(self, libraries: list[str]):
        self.libraries = libraries

    def __enter__(self):
        if not self.libraries:
            self.inner = None
            return self
        from exportkit.tfversions.oplibs import op_libraries_env

        self._lock.acquire()
        self.inner = op_libraries_env(self.libraries)
        self.inner.__enter__()
        return self

    def __exit__(self, *exc):
        if self.inner is None:
            return False
        try:
            return self.inner.__exit__(*exc)
        finally:
            self._lock.release()


# ------------------------------------------------------------------------------------------------ the results
# The core reports (plain dataclasses of the pipeline) with the report files as methods: the renderers sit above
# the reports in the layers, so the methods are added here.

from exportkit.export.report import ExportResult as _ExportResult  # noqa: E402
from exportkit.diff.report import DiffReport as _DiffReport  # noqa: E402
from exportkit.inspection.report import SavedModelInfo as _SavedModelInfo  # noqa: E402
from exportkit.compat.report import CompatReport as _CompatReport  # noqa: E402
from exportkit.verify.report import VerifyReport as _VerifyReport  # noqa: E402


def _as(cls, value):
    """`value` (a core report dataclass) as the API's subclass of it."""
    return cls(**{f.name: getattr(value, f.name) for f in dataclasses.fields(value)})


def _write(path, text: str, what: str) -> Path | str:
    """`text` into `path` whole or not at all; a bucket URL (returned as given) is one object upload."""
    from exportkit import storage
    from exportkit.report.artifacts import write_text

    write_text(str(path), text, f"the {what} {path}")
    return str(path) if storage.is_url(path) else Path(path)


class _Document:
    """`write_json`: the document `--json` writes (`to_dict()`), for every result of the API."""

    def write_json(self, path) -> Path:
        from exportkit.report.artifacts import json_text

        return _write(path, json_text(self.to_dict()), "JSON document")


class _Rendered(_Document):
    """`write_html` and `write_summary` (`--html`, `--summary`), each rendered by the command's own
    `_render("html" | "markdown")`."""

    def write_html(self, path) -> Path:
        from exportkit.report.plots import require_matplotlib

        require_matplotlib()
        return _write(path, self._render("html"), "HTML report")

    def write_summary(self, path) -> Path:
        return _write(path, self._render("markdown"), "summary")


class VerifyReport(_Rendered, _VerifyReport):
    """verify's report: `.passed`, `.exit_code`, `.verdict`, `.runtimes`, `.outputs`, `.findings`, `.to_dict()`."""

    def write_junit(self, path) -> Path:
        from exportkit.verify.render_junit import to_junit_xml

        return _write(path, to_junit_xml(self), "JUnit report")

    def _render(self, kind: str) -> str:
        from exportkit.verify.render_html import verify_html
        from exportkit.verify.render_markdown import verify_markdown

        return verify_html(self) if kind == "html" else verify_markdown(self)


class CompatReport(_Rendered, _CompatReport):
    """compat's matrix: `.versions` (one row per TF version), `.passed`, `.exit_code`, `.verdict`, `.to_dict()`."""

    def _render(self, kind: str) -> str:
        from exportkit.compat.command import other_device_rows
        from exportkit.compat.report import compat_html, compat_markdown

        return compat_html(self, other_device_rows(self)) if kind == "html" else compat_markdown(self)


class DiffReport(_Rendered, _DiffReport):
    """diff's report: `.passed`, `.exit_code`, `.verdict`, `.findings` (signatures), `.outputs` (OutputChange per
    output: change quantiles, top-1 share, confusion, metrics), `.gates`, `.to_dict()`."""

    def _render(self, kind: str) -> str:
        from exportkit.diff.report import diff_html, diff_markdown

        return diff_html(self) if kind == "html" else diff_markdown(self)


class ExportResult(_Rendered, _ExportResult):
    """export's result: `.version_dir`, `.version`, `.signatures`, `.findings`, `.to_dict()`."""

    def _render(self, kind: str) -> str:
        from exportkit.export.report import export_html, export_markdown, export_verdict

        render = export_html if kind == "html" else export_markdown
        return render(self.to_dict(), export_verdict(self), True)


class Inspection(_Document, _SavedModelInfo):
    """inspect's view of a SavedModel: `.signatures`, `.ops`, `.assets`, `.findings`, `.exit_code`, `.to_dict()`."""

    strict = False  # exit 1 on an error finding, as `inspect --strict`

    @property
    def exit_code(self) -> int:
        from exportkit.findings import has_errors

        return 1 if self.strict and has_errors(self.findings) else 0


@dataclasses.dataclass
class SourceInspection:
    """inspect's view of a model source (as `inspect SRC --json` prints it): inputs, outputs, dtype policy, the
    custom objects it needs and the contract findings."""

    document: dict
    exit_code: int = 0  # 1 with strict=True and an error finding, as `inspect SRC --strict`

    @property
    def findings(self) -> list:
        from exportkit.findings import Finding

        return [Finding(**f) for f in self.document.get("findings", [])]

    def to_dict(self) -> dict:
        return self.document
