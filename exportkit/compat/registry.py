"""The op and kernel registry of one TensorFlow version, read lazily from package data.

Format of `registries/tf-X.Y.json.gz` (written by tools/build_registries.py):
  {"tf": "2.12.1", "kernel_counts": {device: registrations},
   "ops": {OP: "<JSON string>"}}  with each string, parsed only when the analysis meets that op:
     {"a": {ATTR: {"t": attr type, "d": default, "av": allowed values, "min": minimum}},
      "i": [input args], "o": [output args], "s": 1 if stateful,
      "k": {"CPU"|"GPU"|"DEFAULT": [{TYPE_ATTR: [DataType numbers]}, ...]}}   (kernels; absent: none)
Defaults and allowed values are in `attrvalue.attr_json` form.
"""
from __future__ import annotations

import functools
import gzip
import json
from importlib import resources

from exportkit.compat import SUPPORTED
from exportkit.errors import InfraError


class Registry:
    """Ops of one version; an op's definition is parsed on first use (whole registries cost ~0.15 s each)."""

    def __init__(self, version: str, release: str, raw_ops: dict[str, str]):
        self.version = version  # "2.12"
        self.release = release  # the exact release the registry was taken from, e.g. "2.12.1"
        self._raw = raw_ops
        self._parsed: dict[str, dict | None] = {}

    def op(self, name: str) -> dict | None:
        """The OpDef entry of `name` ({"a", "i", "o", "k"}), None when the op is not registered."""
        try:
            return self._parsed[name]
        except KeyError:
            raw = self._raw.get(name)
            entry = self._parsed[name] = json.loads(raw) if raw is not None else None
            return entry

    def names(self):
        return self._raw.keys()

    def kernels_for(self, op: str, device: str) -> list[dict]:
        """Type constraints of every kernel usable for `op` on `device` ("CPU"/"GPU"); DEFAULT ones count."""
        entry = (self.op(op) or {}).get("k", {})
        return entry.get(device, []) + entry.get("DEFAULT", [])


@functools.lru_cache(maxsize=None)
def load(version: str) -> Registry:
    """The registry of TF `version` (one of SUPPORTED), parsed once per process."""
    name = f"tf-{version}.json.gz"
    try:
        raw = resources.files("exportkit.compat").joinpath("registries", name).read_bytes()
    except (FileNotFoundError, OSError) as err:
        raise InfraError(f"the op registry of TensorFlow {version} ({name}) is missing from the exportkit package",
                         f"rebuild it: python tools/build_registries.py {version}") from err
    data = json.loads(gzip.decompress(raw))
    return Registry(version, data["tf"], data["ops"])


def available() -> list[str]:
    """Supported versions whose registry ships with this package."""
    folder = resources.files("exportkit.compat").joinpath("registries")
    return [v for v in SUPPORTED if folder.joinpath(f"tf-{v}.json.gz").is_file()]
