"""The training-time reference: inputs and the outputs of the model *as trained*, recorded in the training process.

The golden record of an export is computed from the model exportkit *reloaded*; it proves the SavedModel equals
the reloaded model, not that the reloaded model equals the trained one (a get_config() that forgets an argument
reloads with its default). `record_reference` runs in the training script and writes one .npz (no pickle):

    meta.npy                 uint8 bytes of a JSON document (format, versions, dtype policy, inputs, outputs)
    inputs/<i>/<key>.npy     batch i, keyed by signature input name (strings as fixed-width bytes)
    outputs/<i>/<key>.npy    the eager outputs, keyed like the signature (float16/bfloat16 cast to float32)

Export and verify compare the chain trained -> reloaded -> SavedModel -> serving against it.
"""
from __future__ import annotations

import datetime
import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from exportkit.inputs.generate import generate_batches
from exportkit.inputs.load import cast_input
from exportkit.inputs.npz import read_batch_members, write_batch_members
from exportkit.inputs.ranges import parse_int_range_flags
from exportkit.inputs.spec import InputSpec
from exportkit.dtypes import HALF_DTYPES, name_of
from exportkit.errors import UsageError
from exportkit.files import atomic_path

FORMAT = "exportkit-reference/1"
SUFFIX = ".reference.npz"  # model.keras -> model.keras.reference.npz is found without a flag
LINKS = ("trained -> reloaded", "reloaded -> SavedModel", "SavedModel -> serving")


@dataclass
class Reference:
    path: str
    meta: dict
    inputs: list[dict]
    outputs: list[dict]


def _given_batches(inputs, specs: list[InputSpec]) -> list[dict]:
    """`inputs` as batches keyed by input name: a dict (one batch), a list of dicts, or an array (one input)."""
    if isinstance(inputs, dict):
        inputs = [inputs]
    elif not isinstance(inputs, list):
        if len(specs) != 1:
            raise UsageError(f"the model has {len(specs)} inputs; pass inputs as a dict keyed by input name",
                             f"e.g. inputs={{{', '.join(repr(s.key) + ': ...' for s in specs)}}}")
        inputs = [{specs[0].key: inputs}]
    batches = []
    for batch in inputs:
        unknown = sorted(set(batch) - {s.key for s in specs})
        missing = [s.key for s in specs if s.key not in batch]
        if unknown or missing:
            raise UsageError(f"reference inputs: missing {missing or 'nothing'}, unknown {unknown or 'nothing'}",
                             f"key the inputs by the model's input names: {', '.join(s.key for s in specs)}")
        batches.append({s.key: cast_input(s.key, np.asarray(batch[s.key]) if not isinstance(batch[s.key], np.ndarray)
                                          else batch[s.key], s, "reference inputs") for s in specs})
    return batches


def _ranges_meta(ranges) -> dict:
    entry = ranges.to_manifest()
    return entry if entry["int_ranges"] else {"int_range": entry["int_range"]}


def record_reference(model, path, inputs=None, samples: int = 8, seed: int = 0, int_range=None) -> Path:
    """Write `inputs` (default: generated like export's golden inputs) and the model's eager outputs to `path`.
    `int_range`: LO:HI or NAME=LO:HI (a string or a list), over the ranges derived from the model, as export does."""
    import tensorflow as tf

    from exportkit.sources.int_ranges import int_ranges_for
    from exportkit.sources.kerases import keras_of
    from exportkit.version import __version__
    from exportkit.sources.load import model_policy
    from exportkit.sources.model_io import feed_model, flat_outputs, model_input_specs, output_keys

    specs = model_input_specs(model, [])  # either Keras: the model's own (exportkit.sources.kerases)
    ranges = int_ranges_for(model, specs, parse_int_range_flags(int_range)) if inputs is None else None
    batches = (generate_batches(specs, samples=samples, seed=seed, int_range=ranges)
               if inputs is None else _given_batches(inputs, specs))
    outputs, compute = [], {}
    for batch in batches:
        raw = feed_model(model, {s.key: tf.constant(batch[s.key]) for s in specs})
        keys = output_keys(model, raw)
        flat = flat_outputs(raw, keys)
        compute = {k: name_of(t.dtype) for k, t in zip(keys, flat)}
        # as the signature gives them by default: float16/bfloat16 cast to float32
        outputs.append({k: np.asarray(t).astype(np.float32) if compute[k] in HALF_DTYPES else np.asarray(t)
                        for k, t in zip(keys, flat)})
    meta = {
        "format": FORMAT,
        "exportkit_version": __version__,
        "tensorflow_version": tf.__version__,
        "keras_version": keras_of(model).version,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "dtype_policy": model_policy(model),
        "inputs": {s.key: {"dtype": s.dtype, "shape": s.shape} for s in specs},
        "outputs": {k: {"dtype": name_of(v.dtype), "compute_dtype": compute[k]} for k, v in outputs[0].items()},
        "batches": len(batches),
        "generated": {"samples": samples, "seed": seed, **_ranges_meta(ranges)} if inputs is None else None,
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path, f"the reference {path}") as tmp:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
            with zf.open("meta.npy", "w") as fh:
                np.lib.format.write_array(fh, np.frombuffer(json.dumps(meta).encode(), np.uint8), allow_pickle=False)
            for i, (batch, out) in enumerate(zip(batches, outputs)):
                write_batch_members(zf, batch, f"inputs/{i}/")
                write_batch_members(zf, out, f"outputs/{i}/")
    return path


def read_reference(path: str | os.PathLike) -> Reference:
    path = Path(path)
    remedy = "write it in the training script with exportkit.record_reference(model, path)"
    if not path.is_file():
        raise UsageError(f"reference file {path} does not exist", remedy)
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(z["meta"].tobytes().decode())
            if meta.get("format") != FORMAT:
                raise ValueError(f"format {meta.get('format')!r}")
            n = int(meta["batches"])
            inputs = [read_batch_members(z, f"inputs/{i}/") for i in range(n)]
            outputs = [read_batch_members(z, f"outputs/{i}/") for i in range(n)]
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as err:
        raise UsageError(f"{path} is not an exportkit reference file ({type(err).__name__}: {err})", remedy) from None
    return Reference(path=str(path.resolve()), meta=meta, inputs=inputs, outputs=outputs)


def find_reference(src: str | None, explicit: str | None = None, from_spec: str | None = None) -> str | None:
    """--reference FILE, else `reference` in exportkit.toml, else SRC.reference.npz next to the source."""
    if explicit or from_spec:
        return explicit or from_spec
    if not src:
        return None
    candidate = Path(str(src).rstrip("/\\") + SUFFIX)
    return str(candidate) if candidate.is_file() else None


def reference_batches(reference: Reference, specs: list[InputSpec]) -> list[dict]:
    """The reference's inputs checked against (and cast to) the signature's inputs."""
    keys = {s.key for s in specs}
    for i, batch in enumerate(reference.inputs):
        if set(batch) != keys:
            raise UsageError(f"reference {reference.path} has inputs {', '.join(sorted(batch))}, the model has "
                             f"{', '.join(sorted(keys))}", "record the reference from the model you export")
    return [{s.key: cast_input(s.key, b[s.key], s, Path(reference.path).name) for s in specs} for b in reference.inputs]


def recorded_with(reference: Reference) -> dict:
    """What the manifest keeps about a reference."""
    meta = reference.meta
    return {k: meta.get(k) for k in ("exportkit_version", "tensorflow_version", "keras_version", "created",
                                     "dtype_policy")}
