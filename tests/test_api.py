"""The Python API (exportkit.export / verify / inspect / compat, the reports' methods, the errors, the pytest plugin),
used as a release script uses it: only the public names of the package.

The slow tests run the API in a fresh Python (a release script's process: no TensorFlow imported, Keras' dtype
policy set by the caller), one process for the whole round trip.
"""
from __future__ import annotations

import html
import json
import subprocess
import sys
import textwrap
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli

SCRIPT_PRELUDE = """
import json, logging, sys, threading
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
logging.getLogger("exportkit").addHandler(Keep())
logging.getLogger("exportkit").setLevel(logging.INFO)
import exportkit
"""


def run_script(body: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`body` after SCRIPT_PRELUDE in a fresh Python; the script prints nothing itself except one JSON line on
    stderr (stdout must stay empty: the API prints nothing)."""
    code = SCRIPT_PRELUDE + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd=REPO)


def result_of(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == "", f"the API printed on stdout: {proc.stdout[:500]!r}"
    lines = [line for line in proc.stderr.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


# --------------------------------------------------------------------------------------------------- fast


def test_import_is_cheap_and_names_are_there():
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import sys, exportkit
        names = ["export", "verify", "inspect", "compat", "diff", "record_reference", "warm_start", "ExportkitError",
                 "UsageError", "InfraError", "__version__"]
        missing = [n for n in names if not hasattr(exportkit, n)]
        heavy = [m for m in ("tensorflow", "keras", "numpy", "typer", "grpc") if m in sys.modules]
        import exportkit.verify.plan, exportkit.export.writer, exportkit.tfversions.registry  # the subpackages still work
        print(missing, heavy, all(callable(getattr(exportkit, n)) for n in names[:7]))
        """)], capture_output=True, text=True, timeout=60)
    assert proc.stdout.split("\n")[0] == "[] [] True", proc.stdout + proc.stderr


def test_one_version_everywhere():
    import exportkit

    changelog = (REPO / "CHANGELOG.md").read_text()
    assert f"## {exportkit.__version__} " in changelog, "CHANGELOG.md has no entry for the package's version"
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "exportkit.version.__version__"}
    from importlib.metadata import version

    assert version("exportkit") == exportkit.__version__
    proc = run_cli("--version")
    assert (proc.returncode, proc.stdout.strip()) == (0, f"exportkit {exportkit.__version__}")


def _cli_params(command: str) -> dict:
    """{python parameter name: click parameter} of a CLI command."""
    import typer.main

    from exportkit.cli import app

    group = typer.main.get_command(app)
    return {p.name: p for p in group.commands[command].params}


def test_verify_options_are_the_cli_flags_with_the_cli_defaults():
    """Every flag of `exportkit verify` is a keyword of exportkit.verify, named after the flag, with its default."""
    from exportkit.options.verify import VerifyOptions, verify_options

    defaults = verify_options("m")
    assert isinstance(defaults, VerifyOptions)
    checked = 0
    for name, param in _cli_params("verify").items():
        if name in ("path", "debug", "json_out", "junit", "html", "summary", "against", "op_library"):
            continue
        longest = max((o for o in param.opts if o.startswith("--")), key=len).lstrip("-").replace("-", "_")
        keyword = {"signature": "signature_name"}.get(longest, longest)
        field = {"tf": "tf_versions", "beam_option": "beam_options"}.get(keyword, keyword)
        options = verify_options("m", **{keyword: param.default})  # the keyword exists...
        if hasattr(defaults, field):  # ...and, where VerifyOptions holds it, defaults as the CLI does
            cli_default = param.default if not param.multiple else list(param.default or [])
            assert getattr(defaults, field) == cli_default, f"--{longest}: API default differs from the CLI's"
            assert getattr(options, field) == cli_default
            checked += 1
    assert checked > 30


def test_source_flags_are_the_cli_source_flags():
    from exportkit.cli import SourceFlags
    from exportkit.options.source import SOURCE_FLAGS

    assert tuple(SourceFlags._fields) == SOURCE_FLAGS


def test_bad_input_raises_usage_error_with_fix():
    import exportkit

    with pytest.raises(exportkit.UsageError) as err:
        exportkit.verify("/no/such/model")
    assert "no such file" in err.value.message and err.value.fix
    assert isinstance(err.value, exportkit.ExportkitError) and err.value.exit_code == 2
    with pytest.raises(exportkit.UsageError) as err:
        exportkit.verify("/no/such/model", tolerance=1)
    assert "tolerance" in err.value.message and "atol" in err.value.fix
    with pytest.raises(exportkit.UsageError):
        exportkit.verify("/no/such/model", html="r.html")  # report files are the report's methods
    with pytest.raises(exportkit.UsageError):
        exportkit.inspect("/no/such/model")
    with pytest.raises(exportkit.UsageError):
        exportkit.compat("/no/such/model", tf="2.99")


# --------------------------------------------------------------------------------------------------- slow


@pytest.fixture(scope="module")
def api_round_trip(sample, tmp_path_factory):
    """One release script: export a mixed-precision Keras source with custom layers, verify, compat, inspect, write
    every report file, and check what the caller's process imported and printed."""
    entry = sample("mixed_functional.keras")
    out = tmp_path_factory.mktemp("api")
    proc = run_script(f"""
        from keras import mixed_precision  # the caller's own Keras state, which the API must leave as it was
        mixed_precision.set_global_policy("mixed_bfloat16")
        result = exportkit.export({entry["path"]!r}, {str(out / "ranker")!r},
                                  custom_objects="sample_models.custom_layers", python_path={str(REPO)!r})
        report = exportkit.verify(result.version_dir, runtimes="golden,saved_model,session,serving,rest")
        matrix = exportkit.compat(result.version_dir, tf=["2.12", "2.21"])
        info = exportkit.inspect(result.version_dir)
        change = exportkit.diff(result.version_dir, result.version_dir, max_abs_change="p99=0")
        files = [str(report.write_json({str(out / "v.json")!r})), str(report.write_junit({str(out / "v.xml")!r})),
                 str(report.write_summary({str(out / "v.md")!r})), str(matrix.write_summary({str(out / "c.md")!r})),
                 str(result.write_summary({str(out / "e.md")!r})), str(report.write_html({str(out / "v.html")!r}))]
        worst = {{k: {{r: c.max_abs_err for r, c in by.items()}} for k, by in report.outputs.items()}}
        print("RESULT " + json.dumps({{
            "policy_after": mixed_precision.global_policy().name,
            "export": result.to_dict(), "version": result.version, "version_dir": str(result.version_dir),
            "verify": report.to_dict(), "passed": report.passed, "exit_code": report.exit_code,
            "verdict": report.verdict, "outputs": worst, "runtimes": [r.name for r in report.runtimes],
            "compat": matrix.to_dict(), "compat_exit": matrix.exit_code,
            "versions": [[v.tf, v.predicted] for v in matrix.versions],
            "inspect": info.to_dict(), "inspect_exit": info.exit_code, "files": files, "logged": records,
            "diff": change.to_dict(), "diff_exit": change.exit_code, "diff_verdict": change.verdict,
        }}, default=str), file=sys.stderr)
        """)
    return result_of(proc), out


@pytest.mark.slow
def test_api_release_script_round_trip(api_round_trip):
    got, out = api_round_trip
    assert got["policy_after"] == "mixed_bfloat16", "the caller's dtype policy was changed"
    assert got["version"] == 1 and Path(got["version_dir"]).name == "1"
    assert got["export"]["self_check"] == "passed" and got["export"]["dtype_policy"] == "mixed_float16"
    assert got["export"]["schema_version"] == 1
    assert got["passed"] is True and got["exit_code"] == 0 and got["verdict"].startswith("PASSED")
    assert set(got["runtimes"]) == {"golden", "saved_model", "session", "serving", "rest"}
    assert set(got["outputs"]) == {"score", "embedding"}
    assert got["verify"]["passed"] is True and got["verify"]["verdict"] == got["verdict"]
    assert got["compat_exit"] == 0 and got["versions"] == [["2.12", "ok"], ["2.21", "ok"]]
    assert got["inspect"]["signatures"]["serving_default"]["inputs"].keys() == {"features", "ids"}
    assert got["inspect_exit"] == 0
    assert got["diff_exit"] == 0 and got["diff"]["passed"] is True and got["diff_verdict"] == got["diff"]["verdict"]
    assert {o["key"] for o in got["diff"]["outputs"]} >= {"score", "embedding"}
    # progress reached the logger, not stdout (run_script checked stdout is empty)
    assert any("check" in line and "TF1 loader" in line for line in got["logged"]), got["logged"]
    assert [Path(p).name for p in got["files"]] == ["v.json", "v.xml", "v.md", "c.md", "e.md", "v.html"]
    document = json.loads((out / "v.json").read_text())
    assert document["verdict"] == got["verdict"] and document["schema_version"] == 1
    suites = ET.parse(out / "v.xml").getroot()
    compared = sum(len(r["outputs"]) for r in got["verify"]["runtimes"] if r["status"] == "ok")
    assert len(suites.findall("./testsuite/testcase")) == int(suites.get("tests")) == compared > 0
    assert suites.get("failures") == suites.get("errors") == "0"
    verify_md = (out / "v.md").read_text().splitlines()
    assert "exportkit verify: passed" in verify_md[0] and verify_md[-1] == f"**{got['verdict']}**"
    compat_md = (out / "c.md").read_text()
    assert "exportkit compat (cpu): passed" in compat_md and "| 2.12 |" in compat_md and "| 2.21 |" in compat_md
    assert compat_md.rstrip().endswith("**PASSED on 2.12, 2.21**")
    export_md = (out / "e.md").read_text()
    assert "exportkit export: passed" in export_md and export_md.rstrip().splitlines()[-1].startswith("**PASSED: exported")
    page = (out / "v.html").read_text()
    assert f"<title>exportkit verify {got['version_dir']}</title>" in page and html.escape(got["verdict"]) in page


@pytest.mark.slow
def test_api_documents_equal_the_cli_json(api_round_trip):
    """report.to_dict() is the --json document of the same command (timings aside)."""
    got, out = api_round_trip
    version_dir = got["version_dir"]
    proc = run_cli("verify", version_dir, "--runtimes", "golden,saved_model,session,serving,rest", "--json", "-")
    cli = json.loads(proc.stdout)
    api = got["verify"]

    def untimed(doc):
        doc = json.loads(json.dumps(doc))
        for r in doc["runtimes"]:
            r.pop("seconds"), r.pop("latency", None)
            if r.get("server"):
                r["server"].pop("address", None)
        for row in doc["memory"]["measured"]:  # measured in two processes: the fields, not their bytes
            row.update({k: type(v).__name__ for k, v in row.items() if k.endswith("_bytes") or k in ("pid", "ratio")})
        return doc

    assert untimed(api) == untimed(cli)
    proc = run_cli("compat", version_dir, "--tf", "2.12,2.21", "--json", "-")
    assert json.loads(proc.stdout) == got["compat"]
    proc = run_cli("inspect", version_dir, "--json")
    assert json.loads(proc.stdout) == got["inspect"]


@pytest.mark.slow
def test_verify_compat_inspect_import_no_tensorflow_and_infra_errors_carry_the_report(api_round_trip):
    """The API's promise to a release script: verify, compat and inspect of a SavedModel leave TensorFlow out of the
    caller's process (their TensorFlow work runs in workers); an infrastructure failure is an InfraError whose
    `.report` is the partial report (here: a deployed server that never answers)."""
    got, _ = api_round_trip
    proc = run_script(f"""
        path = {got["version_dir"]!r}
        imported = {{}}
        exportkit.verify(path, runtimes="golden,saved_model,session,serving,rest")
        imported["verify"] = "tensorflow" in sys.modules
        exportkit.compat(path, tf=["2.12", "2.21"])
        imported["compat"] = "tensorflow" in sys.modules
        exportkit.inspect(path)
        imported["inspect"] = "tensorflow" in sys.modules
        try:
            exportkit.verify(path, runtimes="golden,serving", serving="127.0.0.1:9", load_timeout=3)
            infra = None
        except exportkit.InfraError as err:
            partial = err.report
            infra = {{"exit_code": err.exit_code, "message": err.message, "report": partial and {{
                "passed": partial.passed, "exit_code": partial.exit_code, "verdict": partial.to_dict()["verdict"],
                "runtimes": {{r.name: r.status for r in partial.runtimes}}}}}}
        print("RESULT " + json.dumps({{"imported": imported, "infra": infra}}, default=str), file=sys.stderr)
        """)
    result = result_of(proc)
    assert result["imported"] == {"verify": False, "compat": False, "inspect": False}
    infra = result["infra"]
    assert infra is not None and infra["exit_code"] == 3, infra
    report = infra["report"]
    assert report is not None and report["passed"] is False and report["exit_code"] == 3, report
    assert report["runtimes"]["golden"] == "ok" and report["runtimes"]["serving"] == "error", report


@pytest.mark.slow
def test_diff_of_two_different_versions_fails_its_gates(tmp_path):
    """exportkit.diff on two versions whose answers differ (classes a and b swapped): the gates that must fail do,
    the report says so, and a gate the change stays within passes."""
    import numpy as np

    from tests.test_diff import W_NEW, W_OLD, build_model

    old, new = build_model(str(tmp_path / "m" / "1"), W_OLD), build_model(str(tmp_path / "m" / "2"), W_NEW)
    proc = run_script(f"""
        change = exportkit.diff({old!r}, {new!r}, signature_name="predict", samples=64,
                                max_abs_change=["p99=0.01", "p50=1"], max_changed_top1="1%")
        print("RESULT " + json.dumps({{"doc": change.to_dict(), "passed": change.passed, "exit": change.exit_code,
                                      "verdict": change.verdict}}, default=str), file=sys.stderr)
        """)
    got = result_of(proc)
    assert got["passed"] is False and got["exit"] == 1 and got["verdict"] == got["doc"]["verdict"]
    gates = {(g["name"], g["output"]): g["passed"] for g in got["doc"]["gates"]}
    assert gates[("max-abs-change p99", "probabilities")] is False
    assert gates[("max-abs-change p50", "probabilities")] is True  # probabilities move by less than 1
    assert gates[("max-changed-top1", "probabilities/top1")] is False
    assert not np.allclose(W_OLD, W_NEW)


@pytest.mark.slow
def test_failing_model_is_a_report_and_the_plugin_shows_why(exported, tmp_path, pytester_runner):
    """A model that fails a check is a report (passed False, exit 1), not an exception; the pytest fixture fails
    the test with the verdict and the worst element."""
    import shutil

    import numpy as np

    broken = tmp_path / "broken"
    shutil.copytree(exported("mixed_functional.keras").base, broken)
    golden = next((broken / "1" / "assets.extra").rglob("golden*.npz"))
    with np.load(golden) as data:
        arrays = {k: data[k] for k in data.files}
    key = next(k for k in arrays if "score" in k and arrays[k].dtype.kind == "f")
    arrays[key] = arrays[key] + 1.0  # what the exported model computes no longer matches the record
    np.savez(golden, **arrays)
    proc = run_script(f"""
        report = exportkit.verify({str(broken)!r}, runtimes="golden,session")
        print("RESULT " + json.dumps({{"passed": report.passed, "exit_code": report.exit_code,
                                       "verdict": report.verdict}}), file=sys.stderr)
        """)
    got = result_of(proc)
    assert (got["passed"], got["exit_code"]) == (False, 1) and got["verdict"].startswith("FAILED")
    outcome = pytester_runner(f"""
        def test_gate(exportkit_verify):
            exportkit_verify({str(broken)!r}, runtimes="golden,session")

        def test_gate_passes(exportkit_verify):
            report = exportkit_verify({str(exported("mixed_functional.keras").base)!r}, runtimes="golden,session")
            assert report.passed
        """)
    assert outcome.returncode == 1, outcome.stdout
    assert "1 failed, 1 passed" in outcome.stdout
    assert "FAILED: " in outcome.stdout and "worst element" in outcome.stdout and "score" in outcome.stdout


@pytest.fixture
def pytester_runner(tmp_path):
    """Run a test file with a fresh pytest (the plugin comes from the entry point, as in a user's suite)."""

    def run(source: str) -> subprocess.CompletedProcess:
        test_file = tmp_path / "test_release.py"
        test_file.write_text(textwrap.dedent(source))
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)],
                              capture_output=True, text=True, timeout=600, cwd=tmp_path)

    return run


@pytest.mark.slow
def test_verify_from_two_threads(exported):
    """Two verifies at once from two threads of one process: both pass, each on its own model."""
    first, second = exported("mixed_functional.keras").path, exported("multi_io.keras").path
    proc = run_script(f"""
        reports = {{}}
        def run(path):
            reports[path] = exportkit.verify(path, runtimes="golden,session,serving")
        threads = [threading.Thread(target=run, args=(p,)) for p in ({str(first)!r}, {str(second)!r})]
        [t.start() for t in threads]; [t.join() for t in threads]
        print("RESULT " + json.dumps({{p: [r.passed, sorted(r.outputs)] for p, r in reports.items()}}),
              file=sys.stderr)
        """)
    got = result_of(proc)
    assert got[str(first)] == [True, ["embedding", "score"]]
    assert got[str(second)][0] is True and len(got[str(second)][1]) >= 2
