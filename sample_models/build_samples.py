"""Build the sample models into a directory and describe them in DIR/samples.json.

    python sample_models/build_samples.py --out build/samples [--only NAME ...]

Importable: `build_all(out_dir, names=None) -> {name: entry}` and one `build_<sample>(out_dir) -> entry`
function per sample, so tests can build only what they need. Every sample has seeded random weights, so
two builds give identical files' numerics. Global dtype policies (Keras 3 and tf.keras 2) are only changed
inside try/finally blocks that restore them.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

REPO_ROOT = str(Path(__file__).resolve().parent.parent)
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from exportkit.tfenv import dtype_policy as keras_policy  # noqa: E402  (the Keras 3 policy, restored on exit)

SEED = 1234
CUSTOM_ARGS = ["--custom-objects", "sample_models.custom_layers", "--python-path", REPO_ROOT]
RANKER_ARGS = {"num_features": 8, "hidden": 16}


# --------------------------------------------------------------------------------------------- helpers

@contextlib.contextmanager
def tf_keras_policy(name: str):
    """tf.keras 2 global mixed-precision policy for the block; restored afterwards."""
    import tf_keras

    previous = tf_keras.mixed_precision.global_policy()
    tf_keras.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        tf_keras.mixed_precision.set_global_policy(previous)


def _randomize_norm_stats(model, rng) -> None:
    """Give BatchNormalization layers non-trivial moving statistics (as a trained model would have)."""
    for layer in _all_layers(model):
        if type(layer).__name__ == "BatchNormalization":
            mean, var = layer.moving_mean, layer.moving_variance
            mean.assign(rng.normal(0.0, 0.5, size=tuple(mean.shape)).astype("float32"))
            var.assign(rng.uniform(0.5, 2.0, size=tuple(var.shape)).astype("float32"))


def _all_layers(model):
    for layer in model.layers:
        yield layer
        if hasattr(layer, "layers"):
            yield from _all_layers(layer)


def _seed_keras(seed: int = SEED):
    import keras
    import numpy as np

    keras.utils.set_random_seed(seed)
    return np.random.default_rng(seed)


def _entry(name, path, fmt, export_args, policy, notes):
    return {"name": name, "path": str(path), "format": fmt, "export_args": list(export_args),
            "policy": policy, "notes": notes}


def _save_sample(out_dir, name: str, model, export_args, policy: str, notes: str) -> dict:
    """Save `model` as out_dir/name (.h5 or .keras by the name) and return its samples.json entry."""
    path = Path(out_dir) / name
    _quiet_save(model, path)
    return _entry(name, path, "h5" if name.endswith(".h5") else "keras", export_args, policy, notes)


def _quiet_save(model, path) -> None:
    """model.save without Keras' 'HDF5 is legacy' warning."""
    import logging
    import warnings

    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.save(str(path))
    finally:
        absl_logger.setLevel(level)


# --------------------------------------------------------------------------------------------- samples
def _mixed_functional_model():
    from sample_models import builders

    rng = _seed_keras()
    with keras_policy("mixed_float16"):
        model = builders.build_mixed_functional()
    _randomize_norm_stats(model, rng)
    return model


def build_mixed_functional_h5(out_dir) -> dict:
    return _save_sample(out_dir, "mixed_functional.h5", _mixed_functional_model(), CUSTOM_ARGS, "mixed_float16",
                  "Keras 3 functional model under mixed_float16; inputs features (None,8) float32 and ids "
                  "(None,4) int32; outputs score (float32 layer) and embedding (float16, must be cast). Uses "
                  "registered ScaledDense and unregistered FeatureCross (needs --custom-objects).")


def build_mixed_functional_keras(out_dir) -> dict:
    return _save_sample(out_dir, "mixed_functional.keras", _mixed_functional_model(), CUSTOM_ARGS, "mixed_float16",
                  "Same model and weights as mixed_functional.h5, in the .keras zip format.")


def build_ranker_ckpt(out_dir, policy: str = "mixed_bfloat16") -> dict:
    """TF checkpoint of builders.build_ranker(**RANKER_ARGS) + exportkit.toml next to it."""
    import tensorflow as tf

    from sample_models import builders

    folder = Path(out_dir) / "ranker_ckpt"
    folder.mkdir(parents=True, exist_ok=True)
    _seed_keras()
    with keras_policy(policy):
        model = builders.build_ranker(**RANKER_ARGS)
    prefix = tf.train.Checkpoint(model=model).save(str(folder / "ckpt"))
    (folder / "vocab.txt").write_text("\n".join(f"feature_{i}" for i in range(RANKER_ARGS["num_features"])) + "\n")
    args_toml = "\n".join(f"{k} = {json.dumps(v)}" for k, v in RANKER_ARGS.items())
    (folder / "exportkit.toml").write_text(
        "# Written by sample_models/build_samples.py: how to rebuild the model this checkpoint belongs to.\n"
        'format = "checkpoint"\n'
        'builder = "sample_models.builders:build_ranker"\n'
        f'policy = "{policy}"\n'
        f"python_path = [{json.dumps(REPO_ROOT)}]\n"
        'signature_name = "serving_default"\n'
        'assets = ["vocab.txt"]\n'
        "\n[builder_args]\n"
        f"{args_toml}\n"
    )
    return _entry("ranker_ckpt", folder, "checkpoint", [], policy,
                  f"tf.train.Checkpoint(model=build_ranker(**{RANKER_ARGS})).save -> {Path(prefix).name}; "
                  "exportkit.toml in the directory names builder, builder_args, policy, python_path, assets "
                  "(no flags needed). A checkpoint only holds variables: built under float32 it would "
                  "silently run in float32.")


def build_ranker_weights(out_dir) -> dict:
    """model.save_weights -> ranker.weights.h5 and model.to_json() -> ranker_config.json."""
    from sample_models import builders

    out = Path(out_dir)
    _seed_keras()
    model = builders.build_ranker(**RANKER_ARGS)
    weights = out / "ranker.weights.h5"
    model.save_weights(str(weights))
    config = out / "ranker_config.json"
    config.write_text(model.to_json())
    return _entry("ranker.weights.h5", weights, "weights",
                  ["--model-config", str(config)] + CUSTOM_ARGS, "float32",
                  "Weights only (Keras 3 .weights.h5) of build_ranker(); the architecture comes from "
                  "ranker_config.json (model.to_json()) via --model-config, or alternatively from "
                  "--builder sample_models.builders:build_ranker --python-path <repo root>.")


def build_multi_io_keras(out_dir) -> dict:
    from sample_models import builders

    _seed_keras()
    return _save_sample(out_dir, "multi_io.keras", builders.build_multi_io(), [], "float32",
                  "Inputs user (None,6), item (None,6), context (None,3) float32 given as a dict; dict "
                  "outputs {'click': sigmoid, 'dwell': softplus}. Built-in layers only.")


def build_text_keras(out_dir) -> dict:
    from sample_models import builders

    _seed_keras()
    return _save_sample(out_dir, "text.keras", builders.build_text_classifier(), [], "float32",
                  "String input text (None,1) -> StringLookup (fixed 10-word vocabulary, 1 OOV index) -> "
                  "Embedding -> GlobalAveragePooling1D -> Dense; output logits (None,3) float32.")


def build_subclassed_keras(out_dir) -> dict:
    from sample_models import builders

    _seed_keras()
    return _save_sample(out_dir, "subclassed.keras", builders.build_subclassed(), CUSTOM_ARGS, "float32",
                  "Registered subclassed keras.Model ResidualMLP (uses ScaledDense), built by calling it on "
                  "a (1,8) float32 batch, so its build_config records input_shape [1, 8] (batch 1, not None); no named "
                  "inputs: the input signature has to come from the build config (relax the batch dimension).")


def _tfk2_model(policy: str):
    import numpy as np
    import tf_keras

    from sample_models import builders

    tf_keras.utils.set_random_seed(SEED)
    with tf_keras_policy(policy):
        model = builders.build_tfk2_functional()
    _randomize_norm_stats(model, np.random.default_rng(SEED))
    return model


def build_tfk2_functional_h5(out_dir) -> dict:
    return _save_sample(out_dir, "tfk2_functional.h5", _tfk2_model("float32"), [], "float32",
                  "Written by tf.keras 2 (tf_keras): functional, inputs features (None,8) float32 and ids "
                  "(None,4) int32, a nested functional model (feature_tower) and a nested Sequential (block), outputs "
                  "score and embedding. Built-in layers only. Keras 3 load_model fails on it (nested-model node "
                  "numbering); exportkit.sources.h5compat.load_h5 loads it.")


def build_tfk2_mixed_h5(out_dir) -> dict:
    return _save_sample(out_dir, "tfk2_mixed.h5", _tfk2_model("mixed_float16"), [], "mixed_float16",
                  "Same architecture as tfk2_functional.h5, written by tf.keras 2 under mixed_float16: "
                  "its config stores tf.keras 'Policy' dtype objects, which keras.models.load_model (Keras 3) "
                  "cannot read; exportkit.sources.h5compat.load_h5 rewrites them. score is float32 (an "
                  "Activation with dtype float32), embedding is float16.")


SAMPLES = {
    "mixed_functional.h5": build_mixed_functional_h5,
    "mixed_functional.keras": build_mixed_functional_keras,
    "ranker_ckpt": build_ranker_ckpt,
    "ranker.weights.h5": build_ranker_weights,
    "multi_io.keras": build_multi_io_keras,
    "text.keras": build_text_keras,
    "subclassed.keras": build_subclassed_keras,
    "tfk2_functional.h5": build_tfk2_functional_h5,
    "tfk2_mixed.h5": build_tfk2_mixed_h5,
}


def build_all(out_dir, names=None) -> dict:
    """Build the samples (all, or only `names`) into out_dir and return {name: entry} for those built.

    out_dir/samples.json gets the same mapping (a partial build keeps existing entries of other samples)."""
    from exportkit.tfenv import import_tf

    import_tf()  # quiet TensorFlow import
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    unknown = sorted(set(names or ()) - set(SAMPLES))
    if unknown:
        raise ValueError(f"unknown sample(s) {unknown}; known: {sorted(SAMPLES)}")
    entries = {}
    for name, fn in SAMPLES.items():
        if names is None or name in names:
            entries[name] = fn(out)
    listing = out / "samples.json"
    merged = {}
    if names is not None and listing.is_file():  # a partial rebuild keeps the other samples' entries
        try:
            merged = {k: v for k, v in json.loads(listing.read_text()).items() if Path(v["path"]).exists()}
        except (ValueError, KeyError, TypeError, AttributeError):
            merged = {}
    merged.update(entries)
    listing.write_text(json.dumps({k: merged[k] for k in SAMPLES if k in merged}, indent=2) + "\n")
    return entries


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="Directory to write the samples and samples.json into.")
    parser.add_argument("--only", action="append", choices=sorted(SAMPLES), help="Build only this sample (repeatable).")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    entries = build_all(args.out, args.only)
    for entry in entries.values():
        print(f"{entry['format']:<10} {entry['policy']:<15} {entry['path']}")
    print(f"{len(entries)} samples in {time.perf_counter() - start:.1f}s -> {Path(args.out).resolve() / 'samples.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
