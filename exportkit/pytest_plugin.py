"""pytest plugin (registered through the `pytest11` entry point, so pytest loads it only where pytest runs): a release
suite gates its models in plain tests.

    def test_ranker(exportkit_verify):
        exportkit_verify("models/ranker", tol="score=1e-3")

A failing verify fails the test with the verdict and, per failing output, the worst element in the message.
"""
from __future__ import annotations

import pytest


def failure_message(report) -> str:
    """The verdict, then one line per failing comparison: runtime, output, reason and the worst element."""
    lines = [report.verdict]
    for output, by_runtime in report.outputs.items():
        for runtime, c in by_runtime.items():
            if c.passed:
                continue
            worst = ""
            if c.worst_index is not None:
                worst = (f"; worst element {list(c.worst_index)}: expected {c.worst_expected}, got {c.worst_actual}"
                         + (f" (|error| {c.max_abs_err:.3g}, allowed atol {c.atol:g} rtol {c.rtol:g})"
                            if c.max_abs_err is not None and c.atol is not None and c.rtol is not None else ""))
            lines.append(f"  {runtime} {output}: {c.reason}{worst}")
    errors = [f for f in report.findings if f.severity == "error"]
    lines += [f"  error {f.code}: {f.message}" for f in errors]
    return "\n".join(lines)


@pytest.fixture(scope="session")
def exportkit_warm_start():
    """The session's `exportkit.warm_start()`: every verify in it forks its worker from one TensorFlow import."""
    import exportkit

    with exportkit.warm_start():
        yield


@pytest.fixture
def exportkit_verify(exportkit_warm_start):
    """`exportkit_verify(path, **options)`: exportkit.verify(path, **options), asserting that it passed; returns
    the VerifyReport."""
    import exportkit

    def check(path, **options):
        report = exportkit.verify(path, **options)
        if not report.passed:
            pytest.fail(failure_message(report), pytrace=False)
        return report

    return check
