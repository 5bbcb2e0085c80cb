"""Issue 15: the export must compute what the *trained* model computed.

Custom-object contracts (exportkit.sources.contracts), weights that were not restored, and the training-time
reference (exportkit.record_reference, export/verify --reference). The "training process" is a real subprocess
that builds the models, saves every format and records the references; exportkit then runs as a user runs it.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, invoke, tree_snapshot
from t15_layers_src import KERAS3, TRAIN

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")]


@pytest.fixture(scope="session")
def trained(tmp_path_factory) -> Path:
    """A training process: models in every format, with their training-time references next to them."""
    out = tmp_path_factory.mktemp("t15")
    (out / "t15layers.py").write_text(KERAS3)
    proc = subprocess.run([sys.executable, "-c", TRAIN, str(out)], capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0 and "trained" in proc.stdout, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def layers(trained):
    sys.path.insert(0, str(trained))
    import t15layers

    return t15layers


def _flags(trained) -> list[str]:
    return ["--python-path", str(trained), "--custom-objects", "t15layers"]


def _codes(findings) -> set[tuple[str, str, str]]:
    return {(f.severity, f.code, f.message.split(":")[0]) for f in findings}


# ---------------------------------------------------------------------------------------------- contracts


def _check(model, custom_objects=None, **kw):
    from exportkit.sources.contracts import check_contracts
    from exportkit.compare.outputs import compare_with_default_tolerances

    return check_contracts(model, _golden(model), custom_objects or {}, compare=compare_with_default_tolerances, **kw)


def _golden(model):
    from exportkit.sources import model_io as sig
    from exportkit.inputs.generate import generate_batches

    return generate_batches(sig.model_input_specs(model, []), samples=4, seed=0)


def test_contracts_complete_nocfg_activation_and_nested_model_pass(layers):
    from exportkit.sources.contracts import check_contracts, custom_objects_of

    def names(model):
        return {type(o).__name__ if not callable(o) or hasattr(o, "get_config") else o.__name__
                for o in custom_objects_of(model)}

    model = layers.build()
    # Tower builds its Dense(activation=doubled) in its own code: a reloaded Tower does so again, nothing is stored
    assert {"Complete", "NoConfig", "Tower"} <= names(model) and "doubled" not in names(model)
    assert "doubled" in names(layers.build(activation=layers.doubled))  # stored by name in the model's config
    assert _check(model) == []
    assert check_contracts(model, _golden(model), {}) == []  # without output comparison


def test_contracts_incomplete_and_unserializable(layers):
    model = layers.build(forgetful=True, unserializable=True)
    findings = _check(model)
    assert _codes(findings) == {("error", "custom-config-incomplete", "Forgetful 'scaled'"),
                                ("error", "custom-config-roundtrip", "Forgetful 'scaled'"),
                                ("error", "custom-config-unserializable", "Unserializable 'table'")}
    incomplete = next(f for f in findings if f.code == "custom-config-incomplete")
    assert "'scale'" in incomplete.message and "scale=1.0 (the default)" in incomplete.message
    assert "scale=0.5" in incomplete.message  # the built instance still knows the trained value
    assert {f.severity for f in _check(model, allow_incomplete=True)} == {"warning"}


def test_contracts_unregistered_activation(layers):
    model = layers.build(activation=layers.halved)
    findings = _check(model)
    assert _codes(findings) == {("error", "custom-config-roundtrip", "function t15layers.halved is saved by name but "
                                                                      "does not deserialize back (a reloaded model "
                                                                      "cannot find it); fix")}
    assert _check(model, {"halved": layers.halved}) == []


def test_a_class_with_its_own_from_config_is_judged_by_the_round_trip():
    """Hugging Face's models take one config object and get_config() returns its fields: __init__'s argument names
    say nothing, so only the round trip judges such a class, and it still catches a config that loses a value."""
    import keras

    class Settings(keras.layers.Layer):
        def __init__(self, settings, forget=False, **kwargs):
            super().__init__(**kwargs)
            self.settings, self.forget = dict(settings), forget

        def call(self, x):
            return x * self.settings["scale"]

        def get_config(self):
            return super().get_config() if self.forget else {**super().get_config(), **self.settings}

        @classmethod
        def from_config(cls, config):
            config = dict(config)
            base = {k: config.pop(k) for k in ("name", "trainable", "dtype") if k in config}
            return cls({"scale": config.get("scale", 1.0)}, **base)

    def model(**kw):
        x = keras.Input((3,), name="x")
        return keras.Model(x, Settings({"scale": 0.5}, name="settings", **kw)(x))

    assert _check(model()) == []
    assert _codes(_check(model(forget=True))) == {("error", "custom-config-roundtrip", "Settings 'settings'")}


# ---------------------------------------------------------------------------------------------- export


def _manifest(base: Path) -> dict:
    return json.loads((base / "1" / "assets.extra" / "exportkit" / "manifest.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["keras", "h5"])
def test_drift_caught_by_contract_and_by_reference(trained, tmp_path, fmt):
    src = trained / f"drift.{fmt}"
    base = tmp_path / "out"
    r = invoke("export", src, "-o", base, *_flags(trained), "--no-verify")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "custom-config-incomplete: Forgetful 'scaled'" in r.stderr and "scale=1.0 (the default)" in r.stderr
    assert "--allow-incomplete-config" in r.stderr and not base.exists()
    # Derived arguments allowed: the reference (found next to the source) still catches the drift.
    r = invoke("export", src, "-o", base, *_flags(trained), "--no-verify", "--allow-incomplete-config")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "link trained -> reloaded broke" in r.stderr and "output 'score'" in r.stderr
    assert tree_snapshot(base) == {}


@pytest.mark.slow
def test_faithful_keras_export_and_verify_show_trained(trained, tmp_path):
    base = tmp_path / "out"
    r = invoke("export", trained / "faithful.keras", "-o", base, *_flags(trained))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "trained -> reloaded passed, reloaded -> SavedModel passed" in r.stdout
    manifest = _manifest(base)
    assert manifest["reference"]["path"] == str(trained / "faithful.keras.reference.npz")
    assert manifest["reference"]["recorded_with"]["keras_version"]
    r = invoke("verify", base, "--serving", "none", "--json", "-")
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["reference"] == "trained" and report["runtimes"][0]["name"] == "trained"
    links = {(c["link"], c["to"]): c["passed"] for c in report["reference_chain"]}
    assert links == {("trained -> reloaded", "golden"): True, ("reloaded -> SavedModel", "saved_model"): True,
                     ("SavedModel -> serving", "session"): True}


@pytest.mark.slow
def test_verify_reference_names_the_broken_link(trained, tmp_path):
    """An old export (made without the reference) of a drifted model: verify --reference says where it broke."""
    base = tmp_path / "out"
    src = tmp_path / "drift.keras"
    src.write_bytes((trained / "drift.keras").read_bytes())  # no reference next to this copy
    r = invoke("export", src, "-o", base, *_flags(trained), "--allow-incomplete-config", "--no-verify")
    assert r.returncode == 0 and _manifest(base)["reference"] is None, r.stderr
    r = invoke("verify", base, "--serving", "none", "--runtimes", "trained,golden,saved_model",
               "--reference", trained / "drift.keras.reference.npz")
    assert r.returncode == 1, r.stdout
    verdict = r.stdout.strip().splitlines()[-1]
    assert verdict.startswith("FAILED: output 'score': link trained -> reloaded broke (trained vs golden"), verdict


@pytest.mark.slow
def test_faithful_h5_and_tf_keras_2_h5(trained, tmp_path):
    for i, name in enumerate(["faithful.h5", "tfk2_faithful.h5"]):
        r = invoke("export", trained / name, "-o", tmp_path / f"out{i}", *_flags(trained), "--no-verify")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "trained -> reloaded passed" in r.stdout
    # tf.keras 2 wrote the config without `scale`: the Keras 3 class is complete, so only the reference can tell.
    r = invoke("export", trained / "tfk2_drift.h5", "-o", tmp_path / "drift", *_flags(trained), "--no-verify")
    assert r.returncode == 1 and "link trained -> reloaded broke" in r.stderr, r.stdout + r.stderr


@pytest.mark.slow
def test_checkpoint_builder_reference_and_contracts(trained, tmp_path):
    (trained / "ckpt" / "exportkit.toml").write_text(
        f'builder = "t15layers:build"\npython_path = ["{trained}"]\n[builder_args]\nscale = 0.5\n')
    ckpt = trained / "ckpt"
    r = invoke("export", ckpt, "-o", tmp_path / "ok", "--no-verify")
    assert r.returncode == 0 and "trained -> reloaded passed" in r.stdout, r.stdout + r.stderr
    # rebuilt with another argument than in training: the checkpoint restores, the reference does not agree
    r = invoke("export", ckpt, "-o", tmp_path / "wrong", "--builder-arg", "scale=2.0", "--no-verify")
    assert r.returncode == 1 and "link trained -> reloaded broke" in r.stderr, r.stdout + r.stderr
    # a builder with a forgetful class: the contract check names the value the instance really has
    r = invoke("export", ckpt, "-o", tmp_path / "forgetful", "--builder-arg", "forgetful=True", "--no-verify")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "although this instance has scale=0.5" in r.stderr and "custom-config-roundtrip" in r.stderr


def test_weights_file_with_unmatched_entries(trained, tmp_path):
    r = invoke("export", trained / "three.weights.h5", "-o", tmp_path / "out", "--python-path", trained,
               "--builder", "t15layers:build_plain", "--builder-arg", "layers=2", "--no-verify")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "does not fit the model's architecture: 2 unmatched entries (layers/dense_2/vars/0" in r.stderr


def test_weights_not_restored_warning_is_an_error():
    import warnings

    from exportkit.errors import UsageError
    from exportkit.sources.load import weights_must_restore

    with pytest.raises(UsageError, match="freshly initialized weights: Skipping variable loading for layer 'd'"):
        with weights_must_restore("loading m.keras"):
            warnings.warn("Skipping variable loading for layer 'd' because it has 2 variables")
    with weights_must_restore("loading m.keras"):
        warnings.warn("Compiled the loaded model, but the compiled metrics have yet to be built.")


def test_inspect_source_shows_contract_findings(trained):
    r = invoke("inspect", trained / "drift.keras", *_flags(trained), "--strict")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "custom-config-incomplete  Forgetful 'scaled'" in r.stdout
    r = invoke("inspect", trained / "faithful.keras", *_flags(trained), "--strict")
    assert r.returncode == 0 and "findings:" not in r.stdout, r.stdout + r.stderr


def test_record_reference_file_is_self_describing(trained):
    import numpy as np

    from exportkit.sources.reference import read_reference

    with np.load(trained / "ckpt.reference.npz", allow_pickle=False) as z:  # no pickle needed
        assert "meta" in z.files
    ref = read_reference(trained / "ckpt.reference.npz")
    assert ref.meta["dtype_policy"] == "float32" and ref.meta["generated"] == {"samples": 4, "seed": 3,
                                                                                "int_range": "0:10"}
    assert [b["x"].shape for b in ref.inputs] == [(1, 4), (4, 4)]
    assert [set(o) for o in ref.outputs] == [{"score"}, {"score"}]
    assert {"tensorflow", "keras"} & set(sys.modules) and ref.meta["tensorflow_version"]


def test_exportkit_import_is_cheap():
    code = "import sys, exportkit; assert callable(exportkit.record_reference); print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
