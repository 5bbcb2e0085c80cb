"""Build exportkit/tfversions/registries/tf-X.Y.json.gz: the op and kernel registry of TensorFlow X.Y.

For each version, a throwaway venv gets the FULL `tensorflow==X.Y.*` wheel (the -cpu wheels lack the GPU
kernel registrations), a fresh interpreter dumps every OpDef (TF_GetAllOpList) and every kernel registration
(kernels.get_all_registered_kernels), and the venv is deleted. Run it with the project's Python (3.11):

    python tools/build_registries.py 2.12 2.13      # or: all
    python tools/build_registries.py --keep-going all

Each version takes ~1-3 minutes (download and install ~600 MB) and ~2 GB of disk while it runs.

    python tools/build_registries.py --server-libraries /path/to/tensorflow/serving/.git

builds what the stock model server links on top (TF Text, TF-DF at the releases each X.Y pins), once per
library release, and registries/servers.json (~15 min for the two venvs it needs on a busy 2-core machine).
Not part of `make test`; the results are committed as package data.
"""
from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT_DIR = REPO / "exportkit" / "tfversions" / "registries"
ATTRVALUE = REPO / "exportkit" / "tfversions" / "attrvalue.py"
VERSIONS = [f"2.{minor}" for minor in range(12, 22)]

# Shared by both dumps, runs inside a throwaway venv (that version's TensorFlow and protobuf).
# argv[1]: attrvalue.py. `opdefs()` and `kernels()` give the registry's current state in the shipped form.
PRELUDE = r"""
import gzip, importlib.util, json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
os.environ["CUDA_VISIBLE_DEVICES"] = ""
spec = importlib.util.spec_from_file_location("attrvalue", sys.argv[1])
attrvalue = importlib.util.module_from_spec(spec); spec.loader.exec_module(attrvalue)
import tensorflow as tf
from tensorflow.core.framework import op_def_pb2
from tensorflow.python.client import pywrap_tf_session as c_api
from tensorflow.python.framework import kernels as tf_kernels

def arg(a):
    out = {"n": a.name}
    if a.type: out["t"] = int(a.type)
    for key, field in (("ta", "type_attr"), ("na", "number_attr"), ("tla", "type_list_attr")):
        if getattr(a, field): out[key] = getattr(a, field)
    if a.is_ref: out["ref"] = 1
    return out

def opdefs():
    buf = c_api.TF_GetAllOpList()
    try:
        op_list = op_def_pb2.OpList()
        op_list.ParseFromString(c_api.TF_GetBuffer(buf))
    finally:
        c_api.TF_DeleteBuffer(buf)
    ops = {}
    for op in op_list.op:
        attrs = {}
        for a in op.attr:
            entry = {"t": a.type}
            if a.HasField("default_value"): entry["d"] = attrvalue.attr_json(a.default_value)
            if a.HasField("allowed_values"): entry["av"] = attrvalue.attr_json(a.allowed_values)
            if a.has_minimum: entry["min"] = int(a.minimum)
            attrs[a.name] = entry
        ops[op.name] = {"a": attrs, "i": [arg(x) for x in op.input_arg], "o": [arg(x) for x in op.output_arg]}
        if op.is_stateful: ops[op.name]["s"] = 1
    return ops

def kernels():
    kern, counts = {}, {}
    for k in tf_kernels.get_all_registered_kernels().kernel:
        counts[k.device_type] = counts.get(k.device_type, 0) + 1
        if k.device_type not in ("CPU", "GPU", "DEFAULT") or k.label:
            continue  # XLA/TPU/pluggable devices; labelled kernels are only picked with a _kernel attr
        constraint = {c.name: sorted(set(attrvalue.attr_json(c.allowed_values))) for c in k.constraint}
        kern.setdefault(k.op, {}).setdefault(k.device_type, []).append(constraint)
    for devices in kern.values():
        for dev, cs in devices.items():
            unique = {json.dumps(c, sort_keys=True): c for c in cs}
            devices[dev] = [unique[key] for key in sorted(unique)]
    return kern, counts
"""

# The whole registry of TF X.Y. argv: attrvalue.py, output path.
DUMP = PRELUDE + r"""
ops = opdefs()
kern, counts = kernels()
doc = {"tf": tf.__version__, "ops": ops, "kernels": kern, "kernel_counts": counts}
with gzip.open(sys.argv[2], "wt", encoding="utf-8", compresslevel=9) as fh:
    json.dump(doc, fh, separators=(",", ":"), sort_keys=True)
print(f"TF {tf.__version__}: {len(ops)} ops, kernels by device {counts}")
"""

# What op libraries add to TF X.Y. argv: attrvalue.py, output path, then LIBRARY=GLOB ... (shared objects
# relative to site-packages). Each library's .so files are loaded with tf.load_op_library, which is what
# linking them into the server amounts to: the ops and kernels they register, and nothing of their Python.
OVERLAY = PRELUDE + r"""
import glob, site
base_ops = opdefs(); base_kern, _ = kernels()
root = site.getsitepackages()[0]
out = {"tf": tf.__version__, "libraries": {}}
for spec in sys.argv[3:]:
    library, pattern = spec.split("=", 1)
    files = sorted(glob.glob(os.path.join(root, pattern)))
    if not files:
        raise SystemExit(f"{library}: no shared object matches {pattern}")
    for path in files:
        tf.load_op_library(path)
    ops, (kern, _) = opdefs(), kernels()
    new = {name: dict(op, k=kern.get(name, {})) for name, op in ops.items() if name not in base_ops}
    for name, entry in new.items():
        if not entry["k"]:
            del entry["k"]
    out["libraries"][library] = {"files": [os.path.relpath(f, root) for f in files], "ops": new}
    base_ops = ops
    print(f"{library}: {len(new)} ops from {len(files)} shared objects", flush=True)
with open(sys.argv[2], "w", encoding="utf-8") as fh:
    json.dump(out, fh, sort_keys=True)
"""


def repack(source: Path, target: Path) -> None:
    """The dump {"ops", "kernels"} -> the shipped form {"tf", "kernel_counts", "ops": {OP: "<json>"}}, where
    each op's entry (its OpDef fields plus "k": its kernels) stays a JSON string until the analysis needs
    that op: parsing the whole registry eagerly costs ~0.15 s per version, the strings ~10 ms."""
    with gzip.open(source, "rt", encoding="utf-8") as fh:
        doc = json.load(fh)
    if "kernels" not in doc:
        raise ValueError(f"{source} is already repacked")
    ops = {}
    for name, op_def in doc["ops"].items():
        entry = dict(op_def)
        if name in doc["kernels"]:
            entry["k"] = doc["kernels"][name]
        ops[name] = json.dumps(entry, separators=(",", ":"), sort_keys=True)
    write_gzip_json(target, {"tf": doc["tf"], "kernel_counts": doc["kernel_counts"], "ops": ops})


@contextlib.contextmanager
def throwaway_venv(prefix: str, python: str):
    """A venv in a temporary directory, deleted afterwards: (its python, its pip install command, the directory)."""
    work = Path(tempfile.mkdtemp(prefix=f"exportkit-{prefix}-"))
    try:
        venv = work / "venv"
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        venv_python = str(venv / "bin" / "python")
        yield venv_python, [venv_python, "-m", "pip", "install", "--quiet", "--progress-bar", "off"], work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def build(version: str, python: str) -> None:
    began = time.monotonic()
    with throwaway_venv(f"registry-{version}", python) as (venv_python, pip, work):
        print(f"[{version}] installing tensorflow=={version}.* ...", flush=True)
        subprocess.run(pip + [f"tensorflow=={version}.*"], check=True)
        out = OUT_DIR / f"tf-{version}.json.gz"
        tmp = out.with_name(f"tf-{version}.dump.json.gz")
        subprocess.run([venv_python, "-I", "-c", DUMP, str(ATTRVALUE), str(tmp)], check=True, cwd=work)
        repack(tmp, out)
        tmp.unlink()
        print(f"[{version}] wrote {out.relative_to(REPO)} ({out.stat().st_size // 1024} KB) in "
              f"{time.monotonic() - began:.0f} s", flush=True)


# ------------------------------------------------------------------- what the stock model server links
# model_servers/BUILD: SUPPORTED_TENSORFLOW_OPS = TF Text's `ops_lib` + TF-DF's inference `kernel_and_op`;
# tensorflow_serving/workspace.bzl pins their releases (archive strip_prefix "text-2.12.1", ...).
PINNED = {"tensorflow-text": re.compile(r'strip_prefix = "text-([0-9.]+)"'),
          "tensorflow-decision-forests": re.compile(r'strip_prefix = "decision-forests-([0-9.]+)"')}
# The wheel of each library and the shared objects in it that hold its ops (relative to site-packages).
SHARED_OBJECTS = {"tensorflow-text": "tensorflow_text/python/ops/*.so",
                  "tensorflow-decision-forests": "tensorflow_decision_forests/tensorflow/ops/inference/inference.so"}
# The TensorFlow each pinned release is built for (its wheel's `tensorflow~=X.Y` requirement).
BUILT_FOR = {("tensorflow-text", "2.12.1"): "2.12", ("tensorflow-text", "2.20.0"): "2.20",
             ("tensorflow-decision-forests", "1.3.0"): "2.12"}


def serving_pins(repo: str) -> dict:
    """{X.Y: {"serving": tag, "libraries": {library: release}}} from the TF Serving git dir `repo`: the newest
    X.Y.* tag of each supported version (HEAD for a version without a tag yet)."""
    git = ["git", f"--git-dir={repo}"]
    tags = subprocess.run(git + ["tag"], capture_output=True, text=True, check=True).stdout.split()
    out = {}
    for version in VERSIONS:
        mine = sorted((t for t in tags if re.fullmatch(re.escape(version) + r"\.\d+", t)),
                      key=lambda t: int(t.rsplit(".", 1)[1]))
        if mine:
            ref, label = mine[-1], mine[-1]
        else:
            head = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout
            ref, label = "HEAD", f"master {head[:10]} (no {version} tag yet)"
        text = subprocess.run(git + ["show", f"{ref}:tensorflow_serving/workspace.bzl"], capture_output=True,
                              text=True, check=True).stdout
        libraries = {}
        for library, pattern in PINNED.items():
            match = pattern.search(text)
            if match:
                libraries[library] = match.group(1)
        out[version] = {"serving": label, "libraries": libraries}
    return out


def overlay_name(library: str, release: str) -> str:
    return f"{library}-{release}.json.gz"


def build_overlays(pins: dict, python: str) -> None:
    """One file per pinned library release, each built once in a venv of the TensorFlow it is built for:
    tensorflow-cpu X.Y plus the library's wheel without its dependencies (only its shared objects are loaded)."""
    wanted = {(lib, rel) for pin in pins.values() for lib, rel in pin["libraries"].items()}
    by_tf: dict[str, list] = {}
    for library, release in sorted(wanted):
        if (library, release) not in BUILT_FOR:
            raise SystemExit(f"add the TensorFlow {library} {release} is built for to BUILT_FOR")
        by_tf.setdefault(BUILT_FOR[library, release], []).append((library, release))
    for tf_version, libraries in sorted(by_tf.items()):
        began = time.monotonic()
        with throwaway_venv(f"overlay-{tf_version}", python) as (venv_python, pip, work):
            print(f"[{tf_version}] installing tensorflow-cpu=={tf_version}.* and {libraries} ...", flush=True)
            subprocess.run(pip + [f"tensorflow-cpu=={tf_version}.*"], check=True)
            subprocess.run(pip + ["--no-deps"] + [f"{lib}=={rel}" for lib, rel in libraries], check=True)
            dump = work / "overlay.json"
            subprocess.run([venv_python, "-I", "-c", OVERLAY, str(ATTRVALUE), str(dump)]
                           + [f"{lib}-{rel}={SHARED_OBJECTS[lib]}" for lib, rel in libraries], check=True, cwd=work)
            doc = json.loads(dump.read_text())
            for library, release in libraries:
                part = doc["libraries"][f"{library}-{release}"]
                packed = {"library": library, "release": release, "built_with": f"tensorflow-cpu {doc['tf']}",
                          "files": part["files"],
                          "ops": {name: json.dumps(entry, separators=(",", ":"), sort_keys=True)
                                  for name, entry in sorted(part["ops"].items())}}
                write_gzip_json(OUT_DIR / overlay_name(library, release), packed)
                print(f"[{tf_version}] {library} {release}: {len(packed['ops'])} ops", flush=True)
        print(f"[{tf_version}] done in {time.monotonic() - began:.0f} s", flush=True)


def write_gzip_json(target: Path, doc: dict) -> None:
    tmp = target.with_name(target.name + ".part")
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=9) as fh:
        json.dump(doc, fh, separators=(",", ":"), sort_keys=True)
    os.replace(tmp, target)


def write_servers(pins: dict) -> None:
    """registries/servers.json: per TF Serving X.Y, the tag read and the library files its registry adds."""
    doc = {version: {"serving": pin["serving"],
                     "libraries": [overlay_name(lib, rel) for lib, rel in sorted(pin["libraries"].items())]}
           for version, pin in pins.items()}
    tmp = OUT_DIR / "servers.json.part"
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, OUT_DIR / "servers.json")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("versions", nargs="*", help="X.Y ... or all")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the venvs (default: this one)")
    parser.add_argument("--repack", action="store_true",
                        help="only convert raw dumps (tf-X.Y.dump.json.gz, or old-format files) to the shipped form")
    parser.add_argument("--keep-going", action="store_true", help="go on with the next version after a failure")
    parser.add_argument("--server-libraries", metavar="TF_SERVING_GIT_DIR",
                        help="instead: build the op libraries the stock model servers link (TF Text, TF-DF) as "
                             "pinned in this TF Serving git dir, and registries/servers.json")
    args = parser.parse_args()
    if args.server_libraries:
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        pins = serving_pins(args.server_libraries)
        build_overlays(pins, args.python)
        write_servers(pins)
        return 0
    if not args.versions:
        parser.error("name the versions (X.Y ... or all), or pass --server-libraries")
    versions = VERSIONS if args.versions == ["all"] else args.versions
    unknown = [v for v in versions if v not in VERSIONS]
    if unknown:
        parser.error(f"unsupported version(s) {', '.join(unknown)}; supported: {VERSIONS[0]}-{VERSIONS[-1]}")
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    if args.repack:
        for version in versions:
            out = OUT_DIR / f"tf-{version}.json.gz"
            dump = OUT_DIR / f"tf-{version}.dump.json.gz"
            source = dump if dump.exists() else out
            if not source.exists():
                continue
            with gzip.open(source, "rt", encoding="utf-8") as fh:
                raw = "kernels" in json.load(fh)
            if raw:
                repack(source, out)
                dump.unlink(missing_ok=True)
                print(f"[{version}] repacked {out.relative_to(REPO)} ({out.stat().st_size // 1024} KB)")
        return 0
    failed = []
    for version in versions:
        try:
            build(version, args.python)
        except subprocess.CalledProcessError as err:
            print(f"[{version}] failed: {err}", file=sys.stderr)
            failed.append(version)
            if not args.keep_going:
                return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
