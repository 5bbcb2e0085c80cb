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

log = logging.getLogger("exportkit")

# The flags that say how to load a training source (cli.SourceFlags; tests/test_api.py keeps the two equal).
SOURCE_FLAGS = ("format", "builder", "builder_arg", "model_config", "spec", "custom_objects", "python_path",
                "policy", "unsafe", "keras")
# Report files are the reports' methods, not options.
_FILE_FLAGS = ("json", "junit", "html", "summary")


def _listed(value) -> list:
    """A repeatable flag's value: None -> [], one string -> [it]."""
    if value is None:
        return []
    return [value] if isinstance(value, (str, os.PathLike)) else list(value)


def _source_options(src: str, flags: dict):
    from exportkit.options.spec import source_options

    return source_options(str(src), flags.get("spec"), format=flags.get("format"), builder=flags.get("builder"),
                          builder_args=_listed(flags.get("builder_arg")), model_config=flags.get("model_config"),
                          custom_objects=_listed(flags.get("custom_objects")),
                          python_path=_listed(flags.get("python_path")), policy=flags.get("policy"),
                          unsafe=bool(flags.get("unsafe")), keras=flags.get("keras"))


def _unknown(command: str, given: dict, known) -> None:
    bad = sorted(set(given) - set(known))
    if bad:
        raise UsageError(f"exportkit.{command}() has no option {', '.join(bad)}",
                         f"pass the CLI's flags as keyword arguments (`exportkit {command} --help`): "
                         f"{', '.join(sorted(known))}")


# ---------------------------------------------------------------------------------------------------- verify

_VERIFY_RENAMES = {"tf": "tf_versions", "beam_option": "beam_options", "json": "json_out"}


def verify_options(path, **flags):
    """VerifyOptions from the CLI's flags by name (the CLI and `verify()` both build them here)."""
    from exportkit.options.spec import VerifyOptions

    fields = {f.name for f in dataclasses.fields(VerifyOptions)} - {"path", "against", "tf_versions", "beam_options",
                                                                    "json_out"}
    known = fields - {"server_flags"} | set(_VERIFY_RENAMES) | set(SOURCE_FLAGS) | {"against", "op_library",
                                                                                    "server_flag"}
    _unknown("verify", flags, known)
    if "server_flag" in flags:
        from exportkit.options.server_flags import parse_server_flags

        flags["server_flags"] = parse_server_flags([str(f) for f in _listed(flags.pop("server_flag"))])
    against = flags.pop("against", None)
    source = {name: flags.pop(name) for name in SOURCE_FLAGS if name in flags}
    flags.pop("op_library", None)
    values = {_VERIFY_RENAMES.get(k, k): v for k, v in flags.items()}
    for name in ("int_range", "tol", "tf_versions", "beam_options"):
        if name in values:
            values[name] = [str(v) for v in _listed(values[name])]
    return VerifyOptions(path=str(path), against=_source_options(against, source) if against else None, **values)


def verify(path, **options):
    """Verify a SavedModel (a version directory, a base directory or any SavedModel) through every runtime, as
    `exportkit verify PATH` does. Returns the VerifyReport (`.passed`, `.exit_code`, `.verdict`, `.runtimes`,
    `.outputs`, `.findings`, `.to_dict()`); raises UsageError on bad input and InfraError when the environment
    failed (the partial report is the error's `.report`)."""
    _unknown("verify", {k: v for k, v in options.items() if k in _FILE_FLAGS}, ())
    libraries = _listed(options.get("op_library"))
    o = verify_options(path, **options)
    from exportkit.verify.command import run_verify

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

    known = {"device", "signature_name", "samples", "seed", "int_range", "atol", "rtol", "tol", "serving",
             "container_cli", "pull", "load_timeout", "server", "op_library", "server_flag"}
    _unknown("compat", options, known)
    libraries = _listed(options.pop("op_library", None))
    launch = _launch_options(options.pop("container_cli", "docker"), options.pop("pull", False),
                             _listed(options.pop("server_flag", None)))
    for name in ("int_range", "tol"):
        if name in options:
            options[name] = [str(v) for v in _listed(options[name])]
    with _op_libraries(libraries):
        return _as(CompatReport, run_compat(path=str(path), tf=_listed(tf) or None, run=run, launch=launch,
                                              **options))


def _launch_options(container_cli: str, pull: bool, server_flag: list):
    from exportkit.options.server_flags import parse_server_flags
    from exportkit.serving.launch.launcher import LaunchOptions

    return LaunchOptions(container_cli=container_cli, pull=pull,
                         server_flags=parse_server_flags([str(f) for f in server_flag]))


# ---------------------------------------------------------------------------------------------------- diff


def diff(old, new=None, **options):
    """What NEW changes for the clients of OLD, as `exportkit diff OLD NEW`: signatures first, then both versions'
    answers on the same inputs (generated and golden batches, or `data=` records). OLD may be a base directory
    (its newest two versions, NEW left out), or NEW alone with `serving="HOST:PORT"` for the deployed OLD.
    Returns the DiffReport (`.passed`, `.exit_code`, `.verdict`, `.outputs`, `.gates`, `.to_dict()`)."""
    from exportkit.diff.command import DiffOptions, run_diff

    renames = {"beam_option": "beam_options"}
    fields = {f.name for f in dataclasses.fields(DiffOptions)} - {"paths", "beam_options", "json_out", "html",
                                                                  "summary"}
    _unknown("diff", options, fields | set(renames))
    values = {renames.get(k, k): v for k, v in options.items()}
    for name in ("max_abs_change", "beam_options"):
        if name in values:
            values[name] = [str(v) for v in _listed(values[name])]
    paths = [str(old)] + ([str(new)] if new is not None else [])
    return _as(DiffReport, run_diff(DiffOptions(paths=paths, **values)))


# ---------------------------------------------------------------------------------------------------- inspect


def inspect(path, **options):
    """Signatures, dtypes, shapes, ops, assets and findings of a SavedModel (no TensorFlow import), as `exportkit
    inspect PATH`; a model source (.h5, .keras, checkpoint) is described by the CLI in a child process. Returns
    an Inspection (`.signatures`, `.findings`, `.exit_code`, `.to_dict()`) or, for a source, a SourceInspection."""
    from exportkit.inspection.command import is_model_source, read_info
    from exportkit.savedmodel.reader import check_path

    p = Path(path).expanduser()
    check_path(p, "pass a SavedModel (version or base directory) or a model source (.h5, .keras, checkpoint)")
    if is_model_source(p, options.get("format")):
        doc, code = _cli("inspect", [str(p), "--json"], options)
        return SourceInspection(doc, code)
    _unknown("inspect", options, ("strict",))
    info = _as(Inspection, read_info(p))
    info.strict = bool(options.get("strict"))
    return info


# ---------------------------------------------------------------------------------------------------- export


def export(source, base_dir=None, **options):
    """Export a model source (.h5, .keras, a checkpoint or .weights.h5 with `builder=`, a Keras 2 SavedModel) to
    BASE_DIR/<version>/, self-checked, as `exportkit export SOURCE -o BASE_DIR` does. Returns the ExportResult
    (`.version_dir`, `.version`, `.signatures`, `.findings`, `.to_dict()`)."""
    _unknown("export", {k: v for k, v in options.items() if k in _FILE_FLAGS + ("output",)}, ())
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
from exportkit.inspection.command import SavedModelInfo as _SavedModelInfo  # noqa: E402
from exportkit.compat.report import CompatReport as _CompatReport  # noqa: E402
from exportkit.verify.report import VerifyReport as _VerifyReport  # noqa: E402


def _as(cls, value):
    """`value` (a core report dataclass) as the API's subclass of it."""
    return cls(**{f.name: getattr(value, f.name) for f in dataclasses.fields(value)})


def _write(path, text: str, what: str) -> Path:
    from exportkit.files import write_atomic

    write_atomic(path, text, f"the {what} {path}")
    return Path(path)


class _Document:
    """`write_json`: the document `--json` writes (`to_dict()`), for every result of the API."""

    def write_json(self, path) -> Path:
        from exportkit.report.artifacts import json_text

        return _write(path, json_text(self.to_dict()), "JSON document")


class VerifyReport(_Document, _VerifyReport):
    """verify's report: `.passed`, `.exit_code`, `.verdict`, `.runtimes`, `.outputs`, `.findings`, `.to_dict()`."""

    def write_junit(self, path) -> Path:
        from exportkit.verify.render_junit import to_junit_xml

        return _write(path, to_junit_xml(self), "JUnit report")

    def write_html(self, path) -> Path:
        from exportkit.verify.render_html import verify_html
        from exportkit.report.plots import require_matplotlib

        require_matplotlib()
        return _write(path, verify_html(self), "HTML report")

    def write_summary(self, path) -> Path:
        from exportkit.verify.render_markdown import verify_markdown

        return _write(path, verify_markdown(self), "summary")


class CompatReport(_Document, _CompatReport):
    """compat's matrix: `.versions` (one row per TF version), `.passed`, `.exit_code`, `.verdict`, `.to_dict()`."""

    def write_html(self, path) -> Path:
        from exportkit.compat.command import other_device_rows
        from exportkit.compat.report import compat_html
        from exportkit.report.plots import require_matplotlib

        require_matplotlib()
        return _write(path, compat_html(self, other_device_rows(self)), "HTML report")

    def write_summary(self, path) -> Path:
        from exportkit.compat.report import compat_markdown

        return _write(path, compat_markdown(self), "summary")


class DiffReport(_Document, _DiffReport):
    """diff's report: `.passed`, `.exit_code`, `.verdict`, `.findings` (signatures), `.outputs` (OutputChange per
    output: change quantiles, top-1 share, confusion, metrics), `.gates`, `.to_dict()`."""

    def write_html(self, path) -> Path:
        from exportkit.diff.report import diff_html
        from exportkit.report.plots import require_matplotlib

        require_matplotlib()
        return _write(path, diff_html(self), "HTML report")

    def write_summary(self, path) -> Path:
        from exportkit.diff.report import diff_markdown

        return _write(path, diff_markdown(self), "summary")


class ExportResult(_Document, _ExportResult):
    """export's result: `.version_dir`, `.version`, `.signatures`, `.findings`, `.to_dict()`."""

    def write_html(self, path) -> Path:
        from exportkit.export.report import export_verdict
        from exportkit.export.report import export_html
        from exportkit.report.plots import require_matplotlib

        require_matplotlib()
        return _write(path, export_html(self.to_dict(), export_verdict(self), True), "HTML report")

    def write_summary(self, path) -> Path:
        from exportkit.export.report import export_verdict
        from exportkit.export.report import export_markdown

        return _write(path, export_markdown(self.to_dict(), export_verdict(self), True), "summary")


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
