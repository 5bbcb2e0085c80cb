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
def test_a_multi_inference_warmup_record_is_replayed_like_tf_serving(third_party, tmp_path):
    """TF Serving replays MultiInference warm-up records too; one without tasks fails the version's load there, so
    the embedded server refuses it the same way and the report names the record."""
    proc = invoke("verify", third_party["mixed_warmup"], "--serving", "embedded", "--runtimes", "saved_model,serving",
                  "--json", tmp_path / "r.json")
    report = json.loads((tmp_path / "r.json").read_text())
    assert proc.returncode == 1, proc.stdout + proc.stderr
    serving = next(r for r in report["runtimes"] if r["name"] == "serving")
    assert serving["status"] == "error" and "warm-up record 1" in serving["error"], serving
    assert next(r for r in report["runtimes"] if r["name"] == "saved_model")["status"] == "ok"


def test_reading_every_log_kind(tf, warmup_logs, tmp_path):
    from exportkit.serving.warmup import read_warmup_records

    path = tmp_path / "assets.extra" / "tf_serving_warmup_requests"
    path.parent.mkdir()
    kinds = ["predict", "classify", "regress", "multi_inference"]
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in warmup_logs(kinds):
            writer.write(record)
    requests = read_warmup_records(str(tmp_path))  # every kind, each replayed through its own API
    assert [type(r).__name__ for r in requests] == ["PredictRequest", "ClassificationRequest", "RegressionRequest",
                                                    "MultiInferenceRequest"]
    with pytest.raises(FileNotFoundError):
        read_warmup_records(str(tmp_path / "nowhere"))
