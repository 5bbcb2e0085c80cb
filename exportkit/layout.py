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
from pathlib import Path

from exportkit.batches import load_batches, save_batches
from exportkit.errors import UsageError
from exportkit.findings import Finding

ASSET_DIRS = ("assets", "assets.extra")
WARMUP = Path("assets.extra") / "tf_serving_warmup_requests"
EXTRA_DIR = Path("assets.extra") / "exportkit"
MANIFEST = EXTRA_DIR / "manifest.json"
GOLDEN_INPUTS = "golden_inputs"  # batch-file prefixes inside EXTRA_DIR (exportkit.batches.save_batches)
GOLDEN_OUTPUTS = "golden_outputs"
REFERENCE_OUTPUTS = "reference_outputs"  # outputs of the model as trained (exportkit.record_reference)


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


def write_golden(version_dir: Path, inputs: list[dict], outputs: list[dict]) -> None:
    save_batches(version_dir / EXTRA_DIR, inputs, GOLDEN_INPUTS)
    save_batches(version_dir / EXTRA_DIR, outputs, GOLDEN_OUTPUTS)


def read_golden(version_dir: Path) -> tuple[list[dict], list[dict]] | tuple[None, None]:
    """(inputs, outputs) recorded at export, or (None, None) when there is no golden record."""
    folder = version_dir / EXTRA_DIR
    try:
        return load_batches(folder, GOLDEN_INPUTS), load_batches(folder, GOLDEN_OUTPUTS)
    except UsageError:
        return None, None


def write_reference_outputs(version_dir: Path, outputs: list[dict]) -> None:
    save_batches(version_dir / EXTRA_DIR, outputs, REFERENCE_OUTPUTS)


def read_reference_outputs(version_dir: Path) -> list[dict]:
    return load_batches(version_dir / EXTRA_DIR, REFERENCE_OUTPUTS)
