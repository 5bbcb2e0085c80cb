"""verify's report as JUnit XML (`--junit FILE`), for CI systems that show test results: one testcase per runtime x
output, one per runtime that errored or was skipped, one per error finding."""
from __future__ import annotations

import xml.etree.ElementTree as ET

from exportkit.compare.outputs import OutputComparison
from exportkit.report.format import first_line, number
from exportkit.report.junit import junit_document, xml_text
from exportkit.verify.latency import latency_text
from exportkit.verify.report import (VerifyReport, baseline_text, needs, server_text, several, toolchain_text,
                                     who)

SUMMARY_FIELDS = ("abs_err_histogram", "rel_err_histogram", "worst_elements", "sample_pairs")  # for plots, not text


def _failure_text(c: OutputComparison) -> str:
    lines = [f"{k}: {v}" for k, v in c.to_dict().items() if v is not None and k not in SUMMARY_FIELDS]
    return "\n".join(lines)


def to_junit_xml(report: VerifyReport) -> str:
    """JUnit XML: one testcase per runtime x output (classname exportkit.verify.<runtime>, name <output>),
    one testcase named "runtime" for a runtime that errored (<error>) or was skipped (<skipped>),
    one testcase per error finding (classname exportkit.savedmodel.lint, name <code>, <failure>). Suite properties: what the
    text report's header says (toolchain, server_flags, baseline), the servers, latency.<runtime>."""
    suite = ET.Element("testsuite", name="exportkit.verify")
    props = ET.SubElement(suite, "properties")
    for k, v in (("path", report.path), ("signature", report.signature), ("reference", report.reference),
                 ("tf32", report.tf32), ("exportkit_version", report.exportkit_version),
                 ("toolchain", toolchain_text(report.toolchain) if report.toolchain else ""),
                 ("server_flags", " ".join(report.server_flags) or "stock"),
                 ("inputs", ", ".join(f"{a}={b}" for a, b in (report.inputs or {}).items()))):
        ET.SubElement(props, "property", name=k, value=xml_text(v))
    if report.baseline:
        ET.SubElement(props, "property", name="baseline", value=xml_text(baseline_text(report.baseline)))
    for r in report.runtimes:
        if r.server:
            ET.SubElement(props, "property", name=f"server.{r.name}", value=xml_text(server_text(r.server)))
    for r in report.runtimes:
        if r.latency:  # first/p50/p99 ms (verify/latency.py), per runtime row
            ET.SubElement(props, "property", name=f"latency.{who(report, r)}",
                          value=xml_text(f"{latency_text(r.latency)} ms (first/p50/p99) over {r.latency['requests']} "
                                   f"request(s)"))
    tests = failures_n = errors = skipped = 0
    total_time = 0.0
    for r in report.runtimes:
        cls = f"exportkit.verify.{r.signature}.{r.name}" if several(report) else f"exportkit.verify.{r.name}"
        total_time += float(r.seconds)
        if r.status in ("error", "skipped"):
            tc = ET.SubElement(suite, "testcase", classname=cls, name="runtime", time=f"{r.seconds:.3f}")
            tests += 1
            if r.status == "error":
                errors += 1
                el = ET.SubElement(tc, "error", message=xml_text(first_line(r.error) or "error"), type="RuntimeError")
                el.text = xml_text(r.error)
            else:
                skipped += 1
                ET.SubElement(tc, "skipped", message=xml_text(first_line(r.error) or "skipped"))
            continue
        for c in r.comparisons:
            tc = ET.SubElement(suite, "testcase", classname=cls, name=xml_text(c.key), time="0")
            tests += 1
            if c.records is not None:  # --data: the streamed statistics
                tc_props = ET.SubElement(tc, "properties")
                for name, value in (("records", c.records), ("failing_records", c.failing_records),
                                    ("max_abs_err", c.max_abs_err), ("max_rel_err", c.max_rel_err)):
                    ET.SubElement(tc_props, "property", name=name, value=xml_text(number(value)))
                for kind, q in (("abs_err", c.abs_err_quantiles), ("rel_err", c.rel_err_quantiles)):
                    for p, value in (q or {}).items():
                        ET.SubElement(tc_props, "property", name=f"{kind}_{p}", value=xml_text(number(value)))
            if not c.passed:
                failures_n += 1
                n = needs(c)
                msg = f"{c.reason}" + (f" ({n})" if n else "")
                el = ET.SubElement(tc, "failure", message=xml_text(msg), type="OutputMismatch")
                el.text = xml_text(_failure_text(c))
    for f in report.findings:
        if f.severity != "error":
            continue
        tc = ET.SubElement(suite, "testcase", classname="exportkit.savedmodel.lint", name=xml_text(f.code), time="0")
        tests += 1
        failures_n += 1
        el = ET.SubElement(tc, "failure", message=xml_text(f.message), type="LintError")
        el.text = xml_text(f.message)
    for k, v in (("tests", tests), ("failures", failures_n), ("errors", errors), ("skipped", skipped),
                 ("time", f"{total_time:.3f}")):
        suite.set(k, str(v))
    return junit_document(suite)
