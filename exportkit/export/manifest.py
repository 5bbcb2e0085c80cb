"""The manifest export writes beside the SavedModel (assets.extra/, read back by savedmodel/manifest.py): provenance,
every signature with its tolerances and golden files, the integer ranges of the generated inputs, the toolchain."""
from __future__ import annotations

import datetime
from pathlib import Path

from exportkit.export.golden import GOLDEN_SEED, GoldenRecord, SignatureRecord, tolerances_for
from exportkit.options.export import ExportOptions
from exportkit.savedmodel import layout
from exportkit.tfenv import toolchain
from exportkit.tfexample.features import to_manifest
from exportkit.version import __version__


def _signature_manifest(loaded, record: SignatureRecord, index: int) -> dict:
    """One signature's entry: method, inputs, outputs with the dtypes they were computed in, tolerances, golden files."""
    plan = record.plan
    entry = {
        "method": plan.method_name,
        "input": plan.input,
        "inputs": record.input_specs,
        "outputs": {k: {"dtype": record.out_dtypes[k], "compute_dtype": record.compute_dtypes[k],
                        "model_output": src or None} for k, src in plan.outputs.items()},
        "tolerances": tolerances_for(loaded.policy, record.compute_dtypes, record.plan.outputs),
        "golden": layout.golden_prefixes(index),
    }
    if record.features is not None:
        entry["features"] = to_manifest(record.features)
    if plan.classes_file is not None:
        entry["classes"] = plan.classes_file.name
    return entry


def build_manifest(loaded, golden: GoldenRecord, options: ExportOptions, reference: dict | None = None) -> dict:
    """The manifest of a version: where it came from, its signatures with their tolerances and golden files, the
    toolchain that wrote it."""
    import tensorflow as tf

    first = golden.signatures[0]
    signatures = {r.plan.name: _signature_manifest(loaded, r, i) for i, r in enumerate(golden.signatures)}
    return {
        "exportkit_version": __version__,
        "tensorflow_version": tf.__version__,
        "keras_version": loaded.keras.version,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "source": {"path": loaded.path, "format": loaded.format, "sha256": loaded.sha256},
        "dtype_policy": loaded.policy,
        # The first signature, as older readers expect it; `signatures` holds every one.
        "signature_name": first.plan.name,
        "signature": {"inputs": first.input_specs,
                      "outputs": signatures[first.plan.name]["outputs"]},
        "tolerances": signatures[first.plan.name]["tolerances"],
        "signatures": signatures,
        "golden": {"dir": str(layout.EXTRA_DIR), "inputs": signatures[first.plan.name]["golden"]["inputs"],
                   "outputs": signatures[first.plan.name]["golden"]["outputs"],
                   "batch_sizes": [len(next(iter(b.values()))) for b in golden.inputs], "seed": GOLDEN_SEED,
                   **golden.int_ranges.to_manifest()},
        "output_names": list(options.output_names),
        "assets": list(dict.fromkeys([Path(a).name for a in options.assets] + [
            r.plan.classes_file.name for r in golden.signatures if r.plan.classes_file is not None])),
        "custom_objects": sorted(loaded.custom_objects),
        "reference": reference,  # a training-time reference was used (exportkit.record_reference), or null
        # Python, TensorFlow's build (CUDA/cuDNN) and the Keras package that loaded the source
        "toolchain": toolchain(loaded.keras.package),
    }
