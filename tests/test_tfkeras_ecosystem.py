"""The TensorFlow ecosystem's own SavedModels keep TF Serving's verdict (issue 30): TFX's Trainer over a
tf.Transform layer, a TF Recommenders BruteForce index, YDF, and a tf_keras model holding a hub.KerasLayer,
written by tests/tfkeras_corpus/ecosystem.py in one process (TF_USE_LEGACY_KERAS=1) and checked as they are.
"""
from __future__ import annotations

import json

import pytest

from tests.conftest import invoke
from tests.tfkeras_corpus import builders as b

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def ecosystem(tmp_path_factory) -> dict:
    return b.build_ecosystem(tmp_path_factory.mktemp("tfkeras-ecosystem"))


@pytest.mark.parametrize("name", b.ECOSYSTEM)
def test_ecosystem_exports_verify_as_tf_serving_serves_them(ecosystem, name):
    """TF Serving loads each and answers serving_default with Predict (predict_util.cc accepts any signature;
    these are all tensorflow/serving/predict). verify runs every runtime, servers included: exit 0."""
    got = invoke("verify", ecosystem[name], "--json", "-")
    assert got.returncode == 0, got.stdout[-3000:]
    report = json.loads(got.stdout)
    assert all(r["status"] == "ok" and r["passed"] for r in report["runtimes"]), report["runtimes"]
    served = [r for r in report["runtimes"] if r["name"] in ("serving", "rest")]
    assert len(served) == 2 and all(r["server"]["api"] == "Predict" for r in served), served


@pytest.mark.parametrize("name", b.ECOSYSTEM)
def test_ecosystem_exports_inspect_without_errors(ecosystem, name):
    got = invoke("inspect", ecosystem[name], "--json")
    assert got.returncode == 0, got.stderr
    info = json.loads(got.stdout)
    assert not [f for f in info["findings"] if f["severity"] == "error"], info["findings"]
    assert info["signatures"]["serving_default"]["method"] == "tensorflow/serving/predict", info["signatures"]
    if name == "tfx_trainer":  # serialized tf.Example in; the vocabulary travels in the version dir (TF Serving
        # sees nothing else: ecosystem.py deletes the transform output the export was built from)
        assert info["signatures"]["serving_default"]["inputs"]["examples"]["dtype"] == "string"
        assert info["assets"] == ["assets/vocab_compute_and_apply_vocabulary_vocabulary"], info["assets"]


@pytest.mark.compat
@pytest.mark.parametrize("name", b.ECOSYSTEM)
def test_ecosystem_exports_load_and_agree_on_tf_2_12_and_2_21(ecosystem, name):
    """compat --run: predicted and observed (the real TF1 loaders of 2.12 and 2.21) both say it serves."""
    from exportkit.tfversions.envs import info

    if info("2.12").state == "absent":
        pytest.skip("the managed TF 2.12 environment is not installed (`exportkit runtimes install 2.12`)")
    got = invoke("compat", ecosystem[name], "--tf", "2.12,2.21", "--run")
    assert got.returncode == 0, got.stdout
    assert "PASSED on 2.12, 2.21" in got.stdout, got.stdout
