"""Report rendering: text, JSON, JUnit XML (no TensorFlow)."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from exportkit.findings import Finding
from exportkit.compare.outputs import compare_batches, compare_outputs
from exportkit.compare.tolerances import Tolerance, resolve_tolerance
from exportkit.verify.render_junit import to_junit_xml
from exportkit.verify.render_text import render_text
from exportkit.verify.report import RuntimeResult, VerifyReport, to_json, verdict_line


def tols(key, dtype):
    return resolve_tolerance(key, dtype)


REF = {"score": np.linspace(0, 1, 16, dtype=np.float32).reshape(8, 2) + 1, "label": np.arange(8)}


def _bad_score():
    bad = {k: v.copy() for k, v in REF.items()}
    bad["score"].reshape(-1)[:3] += np.float32(1e-3)
    return bad


def _report(*, session_bad=False, serving_error=False, lint_error=False, skipped=True, warning=True) -> VerifyReport:
    rts = [
        RuntimeResult("golden", "recorded", None, is_reference=True, seconds=0.0),
        RuntimeResult("keras", "in-process", "cpu", seconds=1.25, comparisons=compare_outputs(REF, REF, tols)),
        RuntimeResult("saved_model", "in-process", "cpu", seconds=0.5, comparisons=compare_outputs(REF, REF, tols)),
        RuntimeResult("session", "subprocess", "cpu", seconds=2.0,
                      comparisons=compare_outputs(REF, _bad_score() if session_bad else REF, tols)),
    ]
    server = {"kind": "embedded", "version": "2.21.0", "address": "127.0.0.1:8500"}
    if serving_error:
        rts.append(RuntimeResult("serving", "grpc", "cpu", server=server, status="error", seconds=3.0,
                                 error="\x1b[31mModel failed to load\x1b[0m: Could not find variable dense/kernel\nstack..."))
    elif skipped:
        rts.append(RuntimeResult("serving", "grpc", None, status="skipped", error="no server binary; --serving none"))
    else:
        rts.append(RuntimeResult("serving", "grpc", "cpu", server=server, seconds=1.0,
                                 comparisons=compare_outputs(REF, REF, tols)))
    findings = []
    if warning:
        findings.append(Finding("warning", "fixed-batch", "input 'x' has a fixed batch dim 8"))
    if lint_error:
        findings.append(Finding("error", "py-func", "the graph calls tf.py_function; TF Serving cannot run it"))
    return VerifyReport(path="models/ranker/3", signature="serving_default", reference="golden", runtimes=rts,
                        findings=findings, inputs={"source": "generated", "batch_sizes": [1, 8], "seed": 0},
                        tf32=None)


# ------------------------------------------------------------------ pass rule


def test_passed_report():
    r = _report()
    assert r.passed
    assert all(rt.passed for rt in r.runtimes)  # skipped counts as not failing
    assert verdict_line(r) == "PASSED: 4 runtimes agree on 2 outputs (reference: golden); skipped: serving"


def test_passed_without_skips():
    r = _report(skipped=False)
    assert verdict_line(r) == "PASSED: 5 runtimes agree on 2 outputs (reference: golden)"


def test_failed_by_comparison():
    r = _report(session_bad=True)
    assert not r.passed
    assert not r.runtimes[3].passed and r.runtimes[1].passed
    line = verdict_line(r)
    assert line.startswith("FAILED: session: output 'score' 3 of 16 elements over tolerance")
    assert "needs atol >= " in line


def test_failed_by_runtime_error():
    r = _report(serving_error=True)
    assert not r.passed
    assert verdict_line(r) == "FAILED: serving: error: Model failed to load: Could not find variable dense/kernel"


def test_infrastructure_failure_does_not_blame_the_model():
    """Exit 3 (report.stopped holds an InfraError): the verdict names the environment's failure, not the model's;
    `passed` stays false, and a real model failure beside it is still listed."""
    from exportkit.errors import InfraError

    r = _report(serving_error=True, session_bad=True)
    r.runtimes[-1].error = "the server was killed by SIGKILL\nits log tail\nfix: run it again"
    r.stopped = InfraError("the server was killed by SIGKILL\nits log tail", "run it again")
    assert r.exit_code == 3 and not r.passed and to_json(r)["passed"] is False
    line = verdict_line(r)
    assert line.startswith("ERROR (infrastructure): serving: the server was killed by SIGKILL; ")
    assert "FAILED" not in line and "also failed: session: output 'score'" in line
    assert to_json(r)["verdict"] == line and render_text(r).splitlines()[-1] == line
    from exportkit.verify.render_markdown import verify_markdown

    heading = verify_markdown(r).splitlines()[0]
    assert "error (infrastructure)" in heading and "FAILED" not in heading

def test_failed_by_lint_error_only():
    r = _report(lint_error=True)
    assert not r.passed
    assert verdict_line(r) == "FAILED: 1 error finding (py-func)"


def test_warning_finding_does_not_fail_but_is_reported():
    """The same finding decides the verdict as an error and only informs as a warning."""
    warned, clean = _report(skipped=False, warning=True), _report(skipped=False, warning=False)
    assert warned.passed and verdict_line(warned) == verdict_line(clean)
    assert "warning  fixed-batch" in render_text(warned) and "fixed-batch" not in render_text(clean)
    assert [(f["severity"], f["code"]) for f in to_json(warned)["findings"]] == [("warning", "fixed-batch")]
    as_error = _report(skipped=False, warning=False)
    as_error.findings.append(Finding("error", "fixed-batch", "input 'x' has a fixed batch dim 8"))
    assert not as_error.passed and verdict_line(as_error) == "FAILED: 1 error finding (fixed-batch)"


def test_nothing_compared():
    r = VerifyReport("p", "serving_default", "golden", [RuntimeResult("golden", "recorded", is_reference=True)])
    assert r.passed and verdict_line(r).startswith("PASSED: nothing compared")


# ------------------------------------------------------------------ text


def test_text_table_passed():
    text = render_text(_report())
    assert "\x1b" not in text
    lines = text.rstrip("\n").splitlines()
    assert lines[-1] == "PASSED: 4 runtimes agree on 2 outputs (reference: golden); skipped: serving"
    assert sum(1 for line in lines if line.startswith(("PASSED", "FAILED"))) == 1
    assert "RUNTIME" in text and "MAX ABS ERR" in text
    assert "SKIP" in text and "no server binary" in text
    assert "fixed-batch" in text
    assert "inputs: generated, batch sizes 1, 8, seed 0" in text
    assert text.count(" PASS ") >= 6


def test_text_table_failed_and_agrees_with_json():
    r = _report(session_bad=True, serving_error=True, lint_error=True)
    text = render_text(r)
    doc = json.loads(json.dumps(to_json(r), allow_nan=False))
    assert "\x1b" not in text
    assert doc["passed"] is False and text.rstrip().splitlines()[-1] == doc["verdict"]
    assert "ERROR" in text and "Could not find variable" in text
    assert "server: serving: embedded server version 2.21.0 at 127.0.0.1:8500" in text
    # every failing output in the JSON appears in the text with its reason, errors and needed tolerance
    session = next(rt for rt in doc["runtimes"] if rt["name"] == "session")
    fails = [o for o in session["outputs"] if not o["passed"]]
    assert [o["key"] for o in fails] == ["score"]
    o = fails[0]
    row = next(line for line in text.splitlines() if " score " in line and "FAIL" in line)
    assert o["reason"] in row
    assert f"{o['max_abs_err']:.3g}" in row
    assert f"{o['required_atol']:.3g}" in row
    assert f"{100 * o['mismatch_fraction']:.3g}%" in row
    assert "atol=1e-05 rtol=1e-05" in row


def test_text_is_plain_ascii_table():
    text = render_text(_report(session_bad=True))
    text.encode("ascii")  # no box drawing, no escape codes: fine in any CI log


# ------------------------------------------------------------------ JSON


def test_json_schema_and_round_trip():
    r = _report(session_bad=True, serving_error=True, lint_error=True)
    doc = to_json(r)
    back = json.loads(json.dumps(doc, allow_nan=False))
    assert back == doc
    assert set(doc) >= {"schema_version", "passed", "path", "signature", "reference", "inputs", "tf32",
                        "exportkit_version", "runtimes", "findings"}
    assert doc["schema_version"] == 1
    assert doc["tf32"] is None and doc["inputs"]["batch_sizes"] == [1, 8]
    names = [rt["name"] for rt in doc["runtimes"]]
    assert names == ["golden", "keras", "saved_model", "session", "serving"]
    for rt in doc["runtimes"]:
        assert set(rt) == {"name", "kind", "device", "server", "status", "error", "seconds", "is_reference",
                           "passed", "outputs", "signature", "latency"}
    serving = doc["runtimes"][-1]
    assert serving["status"] == "error" and serving["passed"] is False
    assert "\x1b" not in serving["error"]
    assert serving["server"]["kind"] == "embedded"
    golden = doc["runtimes"][0]
    assert golden["is_reference"] and golden["outputs"] == []
    assert doc["findings"][-1] == {"severity": "error", "code": "py-func",
                                   "message": "the graph calls tf.py_function; TF Serving cannot run it"}
    # passed flags agree with the dataclasses
    assert [rt["passed"] for rt in doc["runtimes"]] == [rt.passed for rt in r.runtimes]


def test_json_nonfinite_values_are_strings():
    ref = {"x": np.array([np.nan, 1.0], np.float32)}
    act = {"x": np.array([0.0, 1.0], np.float32)}
    rt = RuntimeResult("keras", "in-process", "cpu", comparisons=compare_outputs(ref, act, tols))
    r = VerifyReport("p", "s", "golden", [RuntimeResult("golden", "recorded", is_reference=True), rt])
    doc = json.loads(json.dumps(to_json(r), allow_nan=False))
    out = doc["runtimes"][1]["outputs"][0]
    assert out["worst_expected"] == "nan" and out["required_atol"] == "inf"
    text = render_text(r)
    assert "NaN/Inf mismatch" in text and "no tolerance passes" in text


def test_json_batch_results():
    refs = [{"x": np.ones((1, 2))}, {"x": np.ones((4, 2))}]
    acts = [{"x": np.ones((1, 2))}, {"x": np.ones((4, 2)) * 2}]
    rt = RuntimeResult("keras", "in-process", "cpu", comparisons=compare_batches(refs, acts, tols))
    r = VerifyReport("p", "s", "golden", [RuntimeResult("golden", "recorded", is_reference=True), rt],
                     inputs={"source": "file", "path": "in.npz", "batch_sizes": (1, 4), "seed": None})
    doc = json.loads(json.dumps(to_json(r)))
    out = doc["runtimes"][1]["outputs"][0]
    assert out["worst_index"][0] == 1 and out["expected_shape"] == [-1, 2] and out["batches"] == 2
    assert doc["inputs"]["batch_sizes"] == [1, 4]
    assert "inputs: file, in.npz, batch sizes 1, 4" in render_text(r)


# ------------------------------------------------------------------ JUnit


def _junit(r: VerifyReport) -> ET.Element:
    return ET.fromstring(to_junit_xml(r).encode("utf-8"))


def _counts(el: ET.Element) -> tuple[int, int, int, int]:
    return tuple(int(el.get(k)) for k in ("tests", "failures", "errors", "skipped"))


def test_junit_passed_counts():
    root = _junit(_report())
    suite = root.find("testsuite")
    cases = suite.findall("testcase")
    # keras, saved_model, session x 2 outputs + 1 skipped serving
    assert _counts(suite) == (7, 0, 0, 1) == _counts(root)
    assert len(cases) == 7
    assert {(c.get("classname"), c.get("name")) for c in cases} >= {
        ("exportkit.verify.keras", "score"), ("exportkit.verify.keras", "label"),
        ("exportkit.verify.session", "score"), ("exportkit.verify.serving", "runtime")}
    skipped = [c for c in cases if c.find("skipped") is not None]
    assert len(skipped) == 1 and "no server binary" in skipped[0].find("skipped").get("message")


def test_junit_failure_error_and_lint_counts():
    root = _junit(_report(session_bad=True, serving_error=True, lint_error=True))
    suite = root.find("testsuite")
    cases = suite.findall("testcase")
    assert _counts(suite) == (8, 2, 1, 0)
    assert len(cases) == 8
    assert len([c for c in cases if c.find("failure") is not None]) == 2
    assert len([c for c in cases if c.find("error") is not None]) == 1
    fail = next(c for c in cases if c.get("classname") == "exportkit.verify.session" and c.get("name") == "score")
    msg = fail.find("failure").get("message")
    assert msg.startswith("3 of 16 elements over tolerance") and "needs atol >=" in msg
    assert "max_abs_err" in fail.find("failure").text
    err = next(c for c in cases if c.find("error") is not None)
    assert err.get("classname") == "exportkit.verify.serving"
    assert err.find("error").get("message") == "Model failed to load: Could not find variable dense/kernel"
    lint = [c for c in cases if c.get("classname") == "exportkit.savedmodel.lint"]
    assert [c.get("name") for c in lint] == ["py-func"]  # warnings are not testcases
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["path"] == "models/ranker/3" and props["server.serving"].startswith("embedded server")


def test_junit_counts_match_json():
    r = _report(session_bad=True, serving_error=True, lint_error=True)
    doc = to_json(r)
    suite = _junit(r).find("testsuite")
    n_fail = sum(1 for rt in doc["runtimes"] if rt["status"] == "ok" for o in rt["outputs"] if not o["passed"])
    n_fail += sum(1 for f in doc["findings"] if f["severity"] == "error")
    assert int(suite.get("failures")) == n_fail
    assert int(suite.get("errors")) == sum(1 for rt in doc["runtimes"] if rt["status"] == "error")


def test_junit_survives_control_characters_and_markup():
    rt = RuntimeResult("session", "subprocess", "cpu", status="error",
                       error="bad \x00\x07 <tag> & \"quotes\" \x1b[1mbold\x1b[0m")
    r = VerifyReport("p<&>", "s", "golden", [RuntimeResult("golden", "recorded", is_reference=True), rt])
    root = _junit(r)
    err = root.find("testsuite").find("testcase").find("error")
    assert err.get("message") == "bad  <tag> & \"quotes\" bold"


@pytest.mark.parametrize("kw", [{}, {"session_bad": True}, {"serving_error": True}, {"lint_error": True}])
def test_three_renderings_agree_on_the_verdict(kw):
    r = _report(**kw)
    doc = to_json(r)
    suite = _junit(r).find("testsuite")
    junit_ok = int(suite.get("failures")) == 0 and int(suite.get("errors")) == 0
    text_ok = render_text(r).rstrip().splitlines()[-1].startswith("PASSED")
    assert doc["passed"] == junit_ok == text_ok == r.passed


def test_explicit_tolerance_shows_in_table():
    ref = {"x": np.array([1.0, 2.0], np.float32)}
    act = {"x": np.array([1.0, 2.001], np.float32)}
    comps = compare_outputs(ref, act, lambda k, d: Tolerance(1e-2, 0))
    rt = RuntimeResult("keras", "in-process", "cpu", comparisons=comps)
    r = VerifyReport("p", "s", "golden", [RuntimeResult("golden", "recorded", is_reference=True), rt])
    assert r.passed and "atol=0.01 rtol=0" in render_text(r)


def test_sizes_print_below_1000_of_their_unit_at_every_boundary():
    from exportkit.report.format import size_text
    from exportkit.verify.messages import size_text as with_binary

    assert [size_text(n) for n in (999, 1000, 999_499, 999_500, 999_999, 10**6, 999_999_999, 1_234_000_000)] == [
        "999 B", "1 kB", "999 kB", "1 MB", "1 MB", "1 MB", "1 GB", "1.23 GB"]
    assert size_text(-999_999) == "-1 MB" and size_text(1500 * 10**12) == "1500 TB" and size_text(None) == "-"
    # the binary figure beside it: MiB = 2^20, and 2^30 - 1 bytes is 1 GiB, not 1.02e+03 MiB
    assert with_binary(10**6) == "1 MB (0.954 MiB)" and with_binary(2**30 - 1) == "1.07 GB (1 GiB)"
    assert with_binary(9_600_000) == "9.6 MB (9.16 MiB)"
