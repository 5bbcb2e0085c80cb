"""exportkit's manifest of a version (assets.extra/exportkit/manifest.json): written by export, read by verify,
compat, diff and inspect as one typed Manifest. The JSON on disk is what export builds (export/manifest.py);
`data` keeps it whole, so `inspect` shows every key and older or newer exports read the same way."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from exportkit.findings import Finding
from exportkit.savedmodel.layout import GOLDEN_INPUTS, GOLDEN_OUTPUTS, MANIFEST


@dataclass(frozen=True)
class Manifest:
    """What the readers use of a manifest; `data` is the JSON object as written."""

    data: dict = field(repr=False)
    signatures: dict[str, dict]  # {name: entry}: method, inputs, outputs, tolerances, golden prefixes, features
    signature_name: str | None  # the first signature, as readers of one signature expect it
    signature: dict  # that signature's inputs and outputs
    golden: dict | None  # the golden record: dir, batch sizes, seed, the integer ranges of generated inputs
    reference: dict | None  # the training-time reference export recorded (exportkit.record_reference), if any
    output_names: list[str] | None  # --output-names (a model returning a list)
    toolchain: dict | None  # Python, TensorFlow's build and the Keras package that wrote the export

    @classmethod
    def from_dict(cls, data: dict) -> "Manifest":
        return cls(data=data, signatures=_signature_entries(data), signature_name=data.get("signature_name"),
                   signature=data.get("signature") or {}, golden=data.get("golden"), reference=data.get("reference"),
                   output_names=data.get("output_names"), toolchain=data.get("toolchain"))

    def to_dict(self) -> dict:
        return self.data


def _signature_entries(data: dict) -> dict:
    """{signature name: its manifest entry}; exports from before several signatures list only one."""
    if isinstance(data.get("signatures"), dict):
        return data["signatures"]
    if data.get("signature_name"):
        entry = dict(data.get("signature") or {})
        entry["tolerances"] = data.get("tolerances", {})
        entry["golden"] = {"inputs": GOLDEN_INPUTS, "outputs": GOLDEN_OUTPUTS}
        return {data["signature_name"]: entry}
    return {}


def signature_entries(manifest: Manifest | None) -> dict:
    """{signature name: its manifest entry}; {} for a SavedModel exportkit did not write."""
    return manifest.signatures if manifest is not None else {}


def write_manifest(version_dir: Path, data: dict) -> None:
    path = version_dir / MANIFEST
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def read_manifest(version_dir: Path) -> tuple[Manifest | None, list[Finding]]:
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
    return Manifest.from_dict(data), []
