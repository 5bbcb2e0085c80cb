"""Good models exportkit did not write must not get wrong verdicts (warm-up is optional; other log kinds exist)."""
from __future__ import annotations

import json

import pytest

from conftest import invoke


@pytest.mark.slow
def test_plain_module_without_warmup_passes_with_an_info(third_party, tmp_path):
    proc = invoke("verify", third_party["plain"], "--serving", "embedded", "--runtimes", "saved_model,serving",
                   "--json", tmp_path / "r.json")
    report = json.loads((tmp_path / "r.json").read_text())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    warmup = [f for f in report["findings"] if f["code"].startswith("serving-warmup")]
    assert [f["severity"] for f in warmup] == ["info"] and "tf_serving_warmup_requests" in warmup[0]["message"]
    assert all(r["status"] == "ok" for r in report["runtimes"])


@pytest.mark.slow
def test_classify_regress_multi_inference_records_are_reported_not_replayed(third_party, tmp_path):
    proc = invoke("verify", third_party["mixed_warmup"], "--serving", "embedded", "--runtimes", "saved_model,serving",
                   "--json", tmp_path / "r.json")
    report = json.loads((tmp_path / "r.json").read_text())
    assert proc.returncode == 0, proc.stdout + proc.stderr  # the embedded server loaded it, as TF Serving would
    skipped = [f for f in report["findings"] if f["code"] == "serving-warmup-not-replayed"]
    assert len(skipped) == 1 and skipped[0]["severity"] == "warning"
    message = skipped[0]["message"]
    assert "4 warm-up record(s)" in message and "2 classify_log" in message and "1 regress_log" in message
    assert "1 multi_inference_log" in message and "Predict" in message
    assert not [f for f in report["findings"] if f["severity"] == "error"]


def test_reading_every_log_kind(third_party):
    from exportkit.serving.warmup import log_kind, read_warmup_logs, read_warmup_records

    path = str(third_party["mixed_warmup"] / "1")
    assert [log_kind(log) for log in read_warmup_logs(path)] == [
        "predict_log", "classify_log", "regress_log", "multi_inference_log", "classify_log"]
    assert len(read_warmup_records(path)) == 1  # the Predict requests only
    with pytest.raises(FileNotFoundError):
        read_warmup_logs(str(third_party["plain"] / "1"))
