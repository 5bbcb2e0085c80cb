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
def test_warmup_kinds_not_replayed_are_a_warning_not_an_error(third_party, tmp_path):
    proc = invoke("verify", third_party["mixed_warmup"], "--serving", "embedded", "--runtimes", "saved_model,serving",
                  "--json", tmp_path / "r.json")
    report = json.loads((tmp_path / "r.json").read_text())
    assert proc.returncode == 0, proc.stdout + proc.stderr  # the embedded server loaded it, as TF Serving would
    skipped = [f for f in report["findings"] if f["code"] == "serving-warmup-not-replayed"]
    assert len(skipped) == 1 and skipped[0]["severity"] == "warning"
    assert "2 warm-up record(s)" in skipped[0]["message"] and "2 multi_inference_log" in skipped[0]["message"]
    assert not [f for f in report["findings"] if f["severity"] == "error"]


def test_reading_every_log_kind(tf, warmup_logs, tmp_path):
    from exportkit.serving.warmup import log_kind, read_warmup_logs, read_warmup_records

    path = tmp_path / "assets.extra" / "tf_serving_warmup_requests"
    path.parent.mkdir()
    kinds = ["predict", "classify", "regress", "multi_inference"]
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in warmup_logs(kinds):
            writer.write(record)
    assert [log_kind(log) for log in read_warmup_logs(str(tmp_path))] == [f"{k}_log" for k in kinds]
    assert len(read_warmup_records(str(tmp_path))) == 3  # the kinds exportkit replays
    with pytest.raises(FileNotFoundError):
        read_warmup_logs(str(tmp_path / "nowhere"))
