"""The version directory on disk: where the SavedModel's extras live, and the golden record (the manifest's reader
and writer: exportkit.savedmodel.manifest).

    BASE/<version>/saved_model.pb, variables/, assets/
                   assets.extra/tf_serving_warmup_requests           (TF Serving replays it before serving)
                   assets.extra/exportkit/manifest.json              (what exportkit knew at export time)
                   assets.extra/exportkit/golden_{inputs,outputs}_*  (reference inputs and eager outputs)
                   assets.extra/exportkit/reference_outputs_*        (training-time reference's outputs, if any;
                                                                      its inputs are golden batches, see manifest)

One place reads and writes these, so export, verify, inspect and the server agree on them.
"""
from __future__ import annotations

import os
from pathlib import Path

from exportkit.inputs.npz import load_batches, save_batches
from exportkit.errors import UsageError

ASSET_DIRS = ("assets", "assets.extra")
WARMUP = Path("assets.extra") / "tf_serving_warmup_requests"
EXTRA_DIR = Path("assets.extra") / "exportkit"
MANIFEST = EXTRA_DIR / "manifest.json"
GOLDEN_INPUTS = "golden_inputs"  # batch-file prefixes inside EXTRA_DIR (exportkit.inputs.npz.save_batches)
GOLDEN_OUTPUTS = "golden_outputs"
REFERENCE_OUTPUTS = "reference_outputs"  # outputs of the model as trained (exportkit.record_reference)


def variables_bytes(version_dir: str | Path) -> int:
    """Bytes of the files under variables/ (what every load reads and holds): inspect reports it, verify decides
    from it whether to load one way at a time."""
    return tree_bytes(Path(version_dir) / "variables")


def tree_bytes(directory: str | Path, follow_links: bool = False) -> int:
    """Bytes of every file under `directory`, recursively (a file that cannot be read counts 0)."""
    total = 0
    for dirpath, _dirnames, filenames in os.walk(directory, followlinks=follow_links):
        for name in filenames:
            try:
                total += (Path(dirpath) / name).stat().st_size
            except OSError:
                pass
    return total


def warmup_path(version_dir: str | Path) -> Path:
    return Path(version_dir) / WARMUP


def golden_prefixes(index: int) -> dict:
    """Batch-file prefixes of the golden record of an export's `index`-th signature (the first keeps the names
    exports with one signature always had)."""
    suffix = f".{index}" if index else ""
    return {"inputs": GOLDEN_INPUTS + suffix, "outputs": GOLDEN_OUTPUTS + suffix}


def write_golden(version_dir: Path, inputs: list[dict], outputs: list[dict], prefixes: dict | None = None) -> None:
    """One signature's golden record; `prefixes` ({"inputs", "outputs"}, recorded in the manifest) tell the
    signatures of one export apart."""
    prefixes = prefixes or {"inputs": GOLDEN_INPUTS, "outputs": GOLDEN_OUTPUTS}
    save_batches(version_dir / EXTRA_DIR, inputs, prefixes["inputs"])
    save_batches(version_dir / EXTRA_DIR, outputs, prefixes["outputs"])


def read_golden(version_dir: Path, signature: str | None = None,
                manifest=None) -> tuple[list[dict], list[dict]] | tuple[None, None]:
    """(inputs, outputs) recorded at export for `signature` (default: the only one, in the legacy layout), or
    (None, None) when there is no golden record for it."""
    folder = version_dir / EXTRA_DIR
    prefixes = {"inputs": GOLDEN_INPUTS, "outputs": GOLDEN_OUTPUTS}
    if signature is not None:
        entry = (manifest.signatures if manifest is not None else {}).get(signature)  # a savedmodel.manifest.Manifest
        if entry is None:
            return None, None
        prefixes = entry.get("golden") or prefixes
    try:
        return load_batches(folder, prefixes["inputs"]), load_batches(folder, prefixes["outputs"])
    except UsageError:
        return None, None


def write_reference_outputs(version_dir: Path, outputs: list[dict]) -> None:
    save_batches(version_dir / EXTRA_DIR, outputs, REFERENCE_OUTPUTS)


def read_reference_outputs(version_dir: Path) -> list[dict]:
    return load_batches(version_dir / EXTRA_DIR, REFERENCE_OUTPUTS)
