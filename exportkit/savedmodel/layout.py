"""The version directory on disk: where the SavedModel's extras live, and the manifest and golden record.

    BASE/<version>/saved_model.pb, variables/, assets/
                   assets.extra/tf_serving_warmup_requests           (TF Serving replays it before serving)
                   assets.extra/exportkit/manifest.json              (what exportkit knew at export time)
                   assets.extra/exportkit/golden_{inputs,outputs}_*  (reference inputs and eager outputs)
                   assets.extra/exportkit/reference_outputs_*        (training-time reference's outputs, if any;
                                                                      its inputs are golden batches, see manifest)

One place reads and writes these, so export, verify, inspect and the server agree on them.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from exportkit.inputs.batches import load_batches, save_batches
from exportkit.errors import UsageError
from exportkit.findings import Finding

ASSET_DIRS = ("assets", "assets.extra")
WARMUP = Path("assets.extra") / "tf_serving_warmup_requests"
EXTRA_DIR = Path("assets.extra") / "exportkit"
MANIFEST = EXTRA_DIR / "manifest.json"
GOLDEN_INPUTS = "golden_inputs"  # batch-file prefixes inside EXTRA_DIR (exportkit.inputs.batches.save_batches)
GOLDEN_OUTPUTS = "golden_outputs"
REFERENCE_OUTPUTS = "reference_outputs"  # outputs of the model as trained (exportkit.record_reference)


def variables_bytes(version_dir: str | Path) -> int:
    """Bytes of the files under variables/ (what every load reads and holds): inspect reports it, verify decides
    from it whether to load one way at a time."""
    total = 0
    for dirpath, _dirnames, filenames in os.walk(Path(version_dir) / "variables"):
        for name in filenames:
            try:
                total += (Path(dirpath) / name).stat().st_size
            except OSError:
                pass
    return total


def warmup_path(version_dir: str | Path) -> Path:
    return Path(version_dir) / WARMUP


def write_manifest(version_dir: Path, manifest: dict) -> None:
    path = version_dir / MANIFEST
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def read_manifest(version_dir: Path) -> tuple[dict | None, list[Finding]]:
    """The manifest (None for SavedModels exportkit did not write) and findings about a damaged one."""
    path = version_dir / MANIFEST
    if not path.is_file():
        return None, []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        return None, [Finding("warning", "bad-manifest", f"{MANIFEST} cannot be read ({err}); export again")]
    if not isinstance(data, dict):
        return None, [Finding("warning", "bad-manifest", f"{MANIFEST} is not a JSON object; export again")]
    return data, []


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


def signature_entries(manifest: dict | None) -> dict:
    """{signature name: its manifest entry}; exports from before several signatures list only one."""
    if not manifest:
        return {}
    if isinstance(manifest.get("signatures"), dict):
        return manifest["signatures"]
    if manifest.get("signature_name"):
        entry = dict(manifest.get("signature") or {})
        entry["tolerances"] = manifest.get("tolerances", {})
        entry["golden"] = {"inputs": GOLDEN_INPUTS, "outputs": GOLDEN_OUTPUTS}
        return {manifest["signature_name"]: entry}
    return {}


def read_golden(version_dir: Path, signature: str | None = None,
                manifest: dict | None = None) -> tuple[list[dict], list[dict]] | tuple[None, None]:
    """(inputs, outputs) recorded at export for `signature` (default: the only one, in the legacy layout), or
    (None, None) when there is no golden record for it."""
    folder = version_dir / EXTRA_DIR
    prefixes = {"inputs": GOLDEN_INPUTS, "outputs": GOLDEN_OUTPUTS}
    if signature is not None:
        entry = signature_entries(manifest).get(signature)
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
