"""exportkit export on every source format: layout, signature, manifest, golden record, warm-up, errors."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import invoke, run_cli, tree_snapshot
from exportkit.sources.load import sha256_of

# sample name -> (extra export args, expected input keys, expected output keys, expected policy)
CASES = {
    "mixed_functional.h5": ([], ["features", "ids"], ["embedding", "score"], "mixed_float16"),
    "mixed_functional.keras": ([], ["features", "ids"], ["embedding", "score"], "mixed_float16"),
    "ranker_ckpt": ([], ["features"], ["score"], "mixed_bfloat16"),
    "ranker.weights.h5": ([], ["features"], ["score"], "float32"),
    "multi_io.keras": ([], ["context", "item", "user"], ["click", "dwell"], "float32"),
    "text.keras": ([], ["text"], ["logits"], "float32"),
    "subclassed.keras": ([], ["inputs"], ["output"], "float32"),
    "tfk2_functional.h5": ([], ["features", "ids"], None, "float32"),
    "tfk2_mixed.h5": ([], ["features", "ids"], None, "mixed_float16"),
}


def export_args(entry, out, *extra):
    return ["export", entry["path"], "-o", str(out), *entry["export_args"], *extra]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_every_source_format_exports_a_serving_ready_version(exported, sample, name):
    proc, version_dir = exported(name).proc, exported(name).path
    assert proc.returncode == 0, proc.stderr
    for stage in ("load", "build", "trace", "write", "check"):
        assert f"  {stage}" in proc.stderr
    assert "self-check: passed" in proc.stdout
    for part in ("saved_model.pb", "variables", "assets.extra/tf_serving_warmup_requests",
                 "assets.extra/exportkit/manifest.json", "assets.extra/exportkit/golden_inputs_batch_0.npz"):
        assert (version_dir / part).exists(), part
    manifest = json.loads((version_dir / "assets.extra/exportkit/manifest.json").read_text())
    _, inputs, outputs, policy = CASES[name]
    assert manifest["dtype_policy"] == policy
    assert sorted(manifest["signature"]["inputs"]) == inputs
    if outputs:
        assert sorted(manifest["signature"]["outputs"]) == outputs
    for key, spec in manifest["signature"]["inputs"].items():
        assert spec["shape"][0] == -1, f"{key}: batch dimension must be free"
    for key, spec in manifest["signature"]["outputs"].items():
        assert not key.startswith("keras_tensor"), key
        if spec["compute_dtype"] in ("float16", "bfloat16"):
            assert spec["dtype"] == "float32", f"{key} must be cast to float32"
    assert manifest["source"]["sha256"] == sha256_of(sample(name)["path"])  # hashed beside the load
    assert manifest["exportkit_version"] and manifest["tensorflow_version"] and manifest["keras_version"]


@pytest.mark.slow
def test_signature_as_tf_serving_sees_it(exported):
    """saved_model.pb itself (not our manifest) carries the names, dtypes and the free batch dimension."""
    from exportkit.savedmodel.reader import read_saved_model_proto, select_meta_graph
    from exportkit.savedmodel.signature_defs import signatures_of

    version_dir = exported("mixed_functional.keras").path
    signature = signatures_of(select_meta_graph(read_saved_model_proto(version_dir)))["serving_default"]
    assert signature["inputs"]["features"]["dtype"] == "float32"
    assert signature["inputs"]["features"]["shape"] == [-1, 8]
    assert signature["inputs"]["ids"]["dtype"] == "int32"
    assert signature["outputs"]["embedding"]["dtype"] == "float32"  # float16 in the model, cast for serving
    assert signature["method"] == "tensorflow/serving/predict"


@pytest.mark.slow
def test_tf1_loader_without_user_code_matches_eager_keras(exported, sample, tmp_path):
    """Load every export the way TF Serving does, in a process where sample_models cannot be imported,
    and compare with eager Keras computed here from the original source files."""
    import keras
    import tensorflow as tf

    from exportkit.sources.model_io import feed_model, keyed_outputs
    from exportkit.sources.load import load_source
    from exportkit.options.source import source_options
    from exportkit.compare.outputs import compare_outputs
    from exportkit.compare.tolerances import default_tolerance
    from exportkit.inputs.npz import load_batches

    script = textwrap.dedent("""
        import sys, json, importlib.util
        assert importlib.util.find_spec("sample_models") is None, "user code must not be importable"
        from exportkit.savedmodel.loader import Tf1SavedModel
        from exportkit.inputs.npz import load_batches, save_batches
        for version_dir, out_dir in json.loads(sys.argv[1]):
            model = Tf1SavedModel(version_dir)
            batches = load_batches(version_dir + "/assets.extra/exportkit", "golden_inputs")
            save_batches(out_dir, [model.run("serving_default", b) for b in batches], "tf1")
    """)
    exports = {name: exported(name) for name in CASES}
    jobs = [(str(e.path), str(tmp_path / name)) for name, e in exports.items() if e.proc.returncode == 0]
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("PYTHON")}
    proc = subprocess.run([sys.executable, "-I", "-c", script, json.dumps(jobs)], cwd="/", env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(jobs) == len(CASES)
    for name, export in exports.items():
        version_dir, entry = export.path, sample(name)
        flags = dict(zip(entry["export_args"][::2], entry["export_args"][1::2]))
        options = source_options(entry["path"], custom_objects=[flags["--custom-objects"]] if "--custom-objects" in flags else [],
                                 python_path=[flags["--python-path"]] if "--python-path" in flags else [],
                                 model_config=flags.get("--model-config"))
        model = load_source(options).model
        manifest = json.loads((version_dir / "assets.extra/exportkit/manifest.json").read_text())
        inputs = load_batches(version_dir / "assets.extra/exportkit", "golden_inputs")
        served = load_batches(tmp_path / name, "tf1")
        for batch, served_outputs in zip(inputs, served):
            raw = keyed_outputs(model, feed_model(model, {k: tf.constant(v) for k, v in batch.items()}))
            eager = {k: np.asarray(keras.ops.cast(v, "float32")) for k, v in raw.items()}
            compute = {k: v["compute_dtype"] for k, v in manifest["signature"]["outputs"].items()}
            tol_dtype = lambda key, dtype: "bfloat16" if manifest["dtype_policy"] == "mixed_bfloat16" else (  # noqa: E731
                "float16" if manifest["dtype_policy"] == "mixed_float16" else compute[key])
            results = compare_outputs(eager, served_outputs, lambda k, d: default_tolerance(tol_dtype(k, d)))
            assert all(r.passed for r in results), (name, [(r.key, r.reason) for r in results if not r.passed])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_warmup_records_are_the_golden_inputs_with_the_signature_keys_and_dtypes(exported, name):
    """One PredictionLog per golden batch, holding exactly that batch under the signature's keys and dtypes."""
    from exportkit.inputs.npz import load_batches
    from exportkit.savedmodel.reader import read_saved_model_proto, select_meta_graph
    from exportkit.savedmodel.signature_defs import signatures_of
    from exportkit.serving.tensors import to_ndarray
    from exportkit.serving.warmup import read_warmup_records

    version_dir = exported(name).path
    manifest = json.loads((version_dir / "assets.extra/exportkit/manifest.json").read_text())
    signature_name = manifest["signature_name"]
    signature = signatures_of(select_meta_graph(read_saved_model_proto(version_dir)))[signature_name]["inputs"]
    golden = load_batches(version_dir / "assets.extra/exportkit", "golden_inputs")
    requests = read_warmup_records(str(version_dir))
    assert len(golden) == len(manifest["golden"]["batch_sizes"]) >= 2  # batch 1 and a larger one
    assert len(requests) == len(golden)
    as_bytes = lambda a: [v.encode() if isinstance(v, str) else v for v in np.ravel(a).tolist()]  # noqa: E731
    for request, batch in zip(requests, golden):
        assert request.model_spec.name == exported(name).base.name
        assert request.model_spec.signature_name == signature_name
        assert sorted(request.inputs) == sorted(signature)
        for key, proto in request.inputs.items():
            array = to_ndarray(proto)
            got = "string" if array.dtype.kind in "OS" else array.dtype.name
            assert got == signature[key]["dtype"], (key, got)
            assert array.shape == batch[key].shape and as_bytes(array) == as_bytes(batch[key]), key


@pytest.mark.slow
def test_checkpoint_exports_from_its_toml_alone_with_assets(exported):
    proc, version_dir = exported("ranker_ckpt").proc, exported("ranker_ckpt").path
    assert proc.returncode == 0
    assert (version_dir / "assets" / "vocab.txt").is_file()
    from exportkit.savedmodel.reader import read_saved_model_proto

    text = str(read_saved_model_proto(version_dir))
    assert "vocab.txt" in text  # tracked by the graph (asset_file_def / object graph), not just copied


@pytest.mark.slow
def test_keep_output_dtype_and_version_numbering(sample, tmp_path):
    entry = sample("mixed_functional.keras")
    base = tmp_path / "ranker"
    first = invoke(*export_args(entry, base, "--keep-output-dtype", "--no-verify"))
    assert first.returncode == 0, first.stderr
    second = invoke(*export_args(entry, base, "--no-verify", "--signature-name", "rank", "--json", "-"))
    assert second.returncode == 0, second.stderr
    summary = json.loads(second.stdout)  # --json -: exactly one JSON document on stdout
    assert summary["version"] == 2 and summary["self_check"] == "skipped"
    assert summary["outputs"]["embedding"]["dtype"] == "float32" and summary["inputs"]["ids"]["dtype"] == "int32"
    assert sorted(p.name for p in base.iterdir()) == ["1", "2"]
    kept = json.loads((base / "1/assets.extra/exportkit/manifest.json").read_text())
    cast = json.loads((base / "2/assets.extra/exportkit/manifest.json").read_text())
    assert kept["signature"]["outputs"]["embedding"]["dtype"] == "float16"
    assert cast["signature"]["outputs"]["embedding"]["dtype"] == "float32"
    assert cast["signature_name"] == "rank"
    assert "self-check: skipped" in first.stdout


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_checkpoint_rebuilt_under_another_policy(sample, tmp_path, policy):
    entry = sample("ranker_ckpt")
    proc = invoke("export", entry["path"], "-o", tmp_path / "m", "--policy", policy)
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((tmp_path / "m/1/assets.extra/exportkit/manifest.json").read_text())
    assert manifest["dtype_policy"] == policy


# ---- bad input: exit 2, one clear message with the fix, no traceback, BASE_DIR unchanged ----------------

def _assert_clean_failure(proc, code, *needles):
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("error: ") == 1 and proc.stderr.count("fix: ") == 1
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)


@pytest.fixture
def existing_base(sample, tmp_path):
    """A base directory that already holds version 1 (plus an unrelated file), to prove it stays untouched."""
    base = tmp_path / "models" / "ranker"
    (base / "1").mkdir(parents=True)
    (base / "1" / "saved_model.pb").write_bytes(b"not really a model")
    (base / "README").write_text("keep me")
    return base


@pytest.mark.slow  # a real CLI process (its own TensorFlow import)
def test_missing_unregistered_custom_object_in_h5(sample, existing_base):
    before = tree_snapshot(existing_base)
    proc = run_cli("export", sample("mixed_functional.h5")["path"], "-o", existing_base)
    _assert_clean_failure(proc, 2, "Unknown layer", "FeatureCross", "mixed_functional.h5", "--custom-objects")
    assert tree_snapshot(existing_base) == before


def test_missing_custom_object_in_keras_names_the_module(sample, tmp_path):
    proc = invoke("export", sample("mixed_functional.keras")["path"], "-o", tmp_path / "new")
    _assert_clean_failure(proc, 2, "FeatureCross", "--custom-objects sample_models.custom_layers")
    assert not (tmp_path / "new").exists()


def test_existing_version_is_refused_and_left_byte_identical(sample, existing_base):
    before = tree_snapshot(existing_base)
    proc = invoke(*export_args(sample("multi_io.keras"), existing_base, "--version", "1"))
    _assert_clean_failure(proc, 2, "version 1 already exists", "--version 2")
    assert tree_snapshot(existing_base) == before


@pytest.mark.parametrize("make_bad", ["garbage.h5", "missing.keras", "plain_dir", "notes.txt"])
def test_not_a_model(tmp_path, make_bad):
    src = tmp_path / make_bad
    if make_bad == "garbage.h5":
        src.write_bytes(b"\x00garbage")
    elif make_bad == "plain_dir":
        src.mkdir()
    elif make_bad == "notes.txt":
        src.write_text("hello")
    proc = invoke("export", src, "-o", tmp_path / "out")
    _assert_clean_failure(proc, 2, make_bad)
    assert not (tmp_path / "out").exists()


def test_checkpoint_that_does_not_fit_names_checkpoint_and_variables(sample, existing_base):
    before = tree_snapshot(existing_base)
    entry = sample("ranker_ckpt")
    proc = invoke("export", entry["path"], "-o", existing_base, "--builder", "sample_models.builders:build_other_ranker")
    _assert_clean_failure(proc, 2, "checkpoint", "ranker_ckpt", "does not fit")
    assert tree_snapshot(existing_base) == before


def test_weights_without_architecture(sample, tmp_path):
    proc = invoke("export", sample("ranker.weights.h5")["path"], "-o", tmp_path / "out")
    _assert_clean_failure(proc, 2, "--builder", "--model-config")


@pytest.mark.parametrize("flag,needle", [
    (["--input-spec", "features:8"], "name:shape:dtype"),
    (["--builder", "no_such_module:build"], "no_such_module"),
    (["--builder-arg", "oops"], "key=value"),
    (["--asset", "/no/such/vocab.txt"], "vocab.txt"),
])
def test_bad_flags(sample, tmp_path, flag, needle):
    entry = sample("ranker_ckpt")
    proc = invoke("export", entry["path"], "-o", tmp_path / "out", *flag)
    _assert_clean_failure(proc, 2, needle)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_model_that_differs_between_eager_and_graph_fails_the_export(tmp_path):
    """A layer that computes something else when traced: the self-check must catch it (exit 1, nothing kept)."""
    (tmp_path / "sneaky.py").write_text(textwrap.dedent("""
        import keras, tensorflow as tf

        class EagerOnlyOffset(keras.layers.Layer):
            def call(self, x):
                return x + (0.0 if tf.executing_eagerly() else 1.0)
    """))
    script = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(tmp_path)!r})
        import keras
        from sneaky import EagerOnlyOffset
        inp = keras.Input((3,), name="x")
        out = keras.layers.Dense(2, name="y")(EagerOnlyOffset()(inp))
        keras.Model(inp, out).save({str(tmp_path / 'sneaky.keras')!r})
    """)
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, timeout=120)
    base = tmp_path / "models"
    base.mkdir()
    proc = invoke("export", tmp_path / "sneaky.keras", "-o", base, "--custom-objects", "sneaky",
                   "--python-path", tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "does not reproduce eager Keras" in proc.stderr and "'y'" in proc.stderr
    assert list(base.iterdir()) == []


@pytest.mark.slow
def test_lambda_layers_need_unsafe(tmp_path):
    script = textwrap.dedent(f"""
        import keras
        inp = keras.Input((3,), name="x")
        out = keras.layers.Lambda(lambda t: t * 2.0, name="double")(inp)
        keras.Model(inp, keras.layers.Dense(1, name="y")(out)).save({str(tmp_path / 'lambda.keras')!r})
    """)
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, timeout=120)
    proc = invoke("export", tmp_path / "lambda.keras", "-o", tmp_path / "safe")
    _assert_clean_failure(proc, 2, "Lambda", "--unsafe")
    assert not (tmp_path / "safe").exists()
    proc = invoke("export", tmp_path / "lambda.keras", "-o", tmp_path / "unsafe", "--unsafe")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "unsafe" / "1" / "saved_model.pb").is_file()


@pytest.mark.slow
def test_interrupted_export_leaves_nothing(sample, existing_base):
    """Ctrl-C in the middle of an export: the staging directory goes, the base directory is as it was."""
    import signal

    before = tree_snapshot(existing_base)
    entry = sample("multi_io.keras")
    proc = subprocess.Popen([sys.executable, "-m", "exportkit", "export", entry["path"], "-o", str(existing_base)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:  # progress lines: interrupt once the model is built, before the version is in place
        if line.strip().startswith("trace"):
            proc.send_signal(signal.SIGINT)
            break
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert tree_snapshot(existing_base) == before


@pytest.mark.slow
def test_integer_inputs_outside_the_vocabulary_ask_for_int_range(tmp_path):
    script = textwrap.dedent(f"""
        import keras
        ids = keras.Input((4,), dtype="int32", name="ids")
        x = keras.layers.Embedding(5, 3, name="emb")(ids)
        keras.Model(ids, keras.layers.Dense(1, name="y")(keras.layers.Flatten()(x))).save({str(tmp_path / 'e.keras')!r})
    """)
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, timeout=120)
    proc = invoke("export", tmp_path / "e.keras", "-o", tmp_path / "bad", "--int-range", "0:50")
    _assert_clean_failure(proc, 2, "generated inputs", "--int-range NAME=LO:HI")
    assert "ids=0:50" in proc.stderr and not (tmp_path / "bad").exists()
    proc = invoke("export", tmp_path / "e.keras", "-o", tmp_path / "good")  # the range is read from the embedding
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((tmp_path / "good/1/assets.extra/exportkit/manifest.json").read_text())
    assert manifest["golden"]["int_ranges"] == {"ids": "0:5"}
    proc = invoke("verify", tmp_path / "good", "--serving", "none")  # verify generates ints in the export's range
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def plain_keras_models(tmp_path_factory):
    """Models none of the samples cover: a Sequential .h5 with BatchNorm/Dropout, and TextVectorization inside."""
    folder = tmp_path_factory.mktemp("plain")
    script = textwrap.dedent(f"""
        import numpy as np, keras
        keras.utils.set_random_seed(7)
        seq = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="relu"),
                                keras.layers.BatchNormalization(), keras.layers.Dropout(0.5), keras.layers.Dense(2)])
        seq.save({str(folder / 'seq.h5')!r})
        tv = keras.layers.TextVectorization(max_tokens=20, output_sequence_length=4)
        tv.adapt(np.array(["the cat sat", "a dog ran home", "red mat"]))
        text = keras.Input((1,), dtype="string", name="sentence")
        x = keras.layers.Flatten()(keras.layers.Embedding(20, 4)(tv(text)))
        keras.Model(text, keras.layers.Dense(1, name="p")(x)).save({str(folder / 'tv.keras')!r})
    """)
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, timeout=180)
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("name,inputs,outputs", [("seq.h5", {"inputs": "float32"}, ["output"]),
                                                 ("tv.keras", {"sentence": "string"}, ["p"])])
def test_sequential_and_text_vectorization(plain_keras_models, name, inputs, outputs):
    base = plain_keras_models / f"out_{name}"
    proc = invoke("export", plain_keras_models / name, "-o", base, "--json", "-")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert {k: v["dtype"] for k, v in summary["inputs"].items()} == inputs
    assert sorted(summary["outputs"]) == outputs
    proc = invoke("verify", base, "--serving", "none")
    assert proc.returncode == 0, proc.stdout
