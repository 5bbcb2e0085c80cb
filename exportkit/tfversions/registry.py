"""The op and kernel registry of one TensorFlow version, read lazily from package data.

Format of `registries/tf-X.Y.json.gz` (written by tools/build_registries.py):
  {"tf": "2.12.1", "kernel_counts": {device: registrations},
   "ops": {OP: "<JSON string>"}}  with each string, parsed only when the analysis meets that op:
     {"a": {ATTR: {"t": attr type, "d": default, "av": allowed values, "min": minimum}},
      "i": [input args], "o": [output args], "s": 1 if stateful,
      "k": {"CPU"|"GPU"|"DEFAULT": [{TYPE_ATTR: [DataType numbers]}, ...]}}   (kernels; absent: none)
Defaults and allowed values are in `attrvalue.attr_json` form.

The stock `tensorflow_model_server` X.Y links more than TF X.Y: `model_servers/BUILD`'s SUPPORTED_TENSORFLOW_OPS
adds TensorFlow Text's `ops_lib` and TF Decision Forests' inference ops, at the releases `workspace.bzl` pins.
`registries/servers.json` names them per version ({X.Y: {"serving": tag read, "libraries": [file, ...]}}), and
each `<library>-<release>.json.gz` holds what that library registers ({"library", "release", "built_with",
"files", "ops": {OP: "<JSON string>"}}, same entry form). `load(X.Y)` is the stock server's registry; with
server="tf-only" it is TF X.Y alone (a custom build without them).
"""
from __future__ import annotations

import functools
import gzip
import json
from importlib import resources

from exportkit.tfversions import SUPPORTED
from exportkit.errors import InfraError
from exportkit.savedmodel.lint import op_namespace_package


class Registry:
    """Ops of one version; an op's definition is parsed on first use (whole registries cost ~0.15 s each)."""

    def __init__(self, version: str, release: str, raw_ops: dict[str, str], libraries: dict[str, str] | None = None,
                 linked: tuple[str, ...] = ()):
        self.version = version  # "2.12"
        self.release = release  # the exact release the registry was taken from, e.g. "2.12.1"
        self._raw = raw_ops
        self._parsed: dict[str, dict | None] = {}
        self._library = libraries or {}  # op -> "tensorflow-text 2.12.1" for the ops a linked library adds
        self.linked = linked  # ("tensorflow-text 2.12.1", ...): the op libraries linked into this server

    @property
    def server(self) -> str:
        """What this registry stands for: "TF 2.12.1 + tensorflow-decision-forests 1.3.0 + tensorflow-text 2.12.1"."""
        return " + ".join((f"TF {self.release}",) + self.linked)

    def provider(self, op: str) -> str | None:
        """Which op library registers `op` (see the module function `provider`)."""
        return self._library.get(op) or provider(op)

    def library_of(self, op: str) -> str | None:
        """The linked library ("tensorflow-text 2.12.1") that registers `op`; None for TF's own ops."""
        return self._library.get(op)

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


SERVERS = ("stock", "tf-only")


def _read(name: str, rebuild: str) -> bytes:
    try:
        return resources.files("exportkit.tfversions").joinpath("registries", name).read_bytes()
    except (FileNotFoundError, OSError) as err:
        raise InfraError(f"the op registry file {name} is missing from the exportkit package",
                         f"rebuild it: python {rebuild}") from err


@functools.lru_cache(maxsize=None)
def servers() -> dict:
    """servers.json: {X.Y: {"serving": the TF Serving tag read, "libraries": [overlay file names]}}."""
    return json.loads(_read("servers.json", "tools/build_registries.py --server-libraries TF_SERVING_GIT_DIR"))


@functools.lru_cache(maxsize=None)
def library(name: str) -> dict:
    """One linked library's registrations (an overlay file), parsed once per process."""
    return json.loads(gzip.decompress(_read(name, "tools/build_registries.py --server-libraries TF_SERVING_GIT_DIR")))


@functools.lru_cache(maxsize=None)
def load(version: str, server: str = "stock") -> Registry:
    """The registry of TF Serving `version` (one of SUPPORTED): TF X.Y plus, for the stock server, the op
    libraries its release links. Parsed once per process."""
    data = json.loads(gzip.decompress(_read(f"tf-{version}.json.gz", f"tools/build_registries.py {version}")))
    if server == "tf-only":
        return Registry(version, data["tf"], data["ops"])
    raw, owners, linked = dict(data["ops"]), {}, []
    for name in servers().get(version, {}).get("libraries", []):
        lib = library(name)
        label = f"{lib['library']} {lib['release']}"
        linked.append(label)
        for op, entry in lib["ops"].items():
            if op not in raw:
                raw[op] = entry
                owners[op] = label
    return Registry(version, data["tf"], raw, owners, tuple(linked))


def available() -> list[str]:
    """Supported versions whose registry ships with this package."""
    folder = resources.files("exportkit.tfversions").joinpath("registries")
    return [v for v in SUPPORTED if folder.joinpath(f"tf-{v}.json.gz").is_file()]


def provider(op: str) -> str | None:
    """Which op library registers `op`, when that can be known: the TF Text / TF-DF releases some stock server
    links ("tensorflow-text 2.20.0"), else the op's namespace ("tensorflow-addons"); None when unknown."""
    for name in sorted({n for s in servers().values() for n in s["libraries"]}, reverse=True):
        lib = library(name)
        if op in lib["ops"]:
            return f"{lib['library']} {lib['release']}"
    return op_namespace_package(op)


def first_server_with(op: str, server: str = "stock") -> str | None:
    """The oldest supported TF Serving X.Y whose (stock) registry has `op`, None when none has it."""
    return next((v for v in available() if op in load(v, server).names()), None)


def installed(tf_release: str | None, server: str = "stock") -> Registry | None:
    """The registry of the TF Serving matching the installed TensorFlow ("2.21.0" -> 2.21), None if none ships."""
    version = ".".join((tf_release or "").split(".")[:2])
    return load(version, server) if version in available() else None
