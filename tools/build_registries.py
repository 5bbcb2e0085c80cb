"""Build exportkit/compat/registries/tf-X.Y.json.gz: the op and kernel registry of TensorFlow X.Y.

For each version, a throwaway venv gets the FULL `tensorflow==X.Y.*` wheel (the -cpu wheels lack the GPU
kernel registrations), a fresh interpreter dumps every OpDef (TF_GetAllOpList) and every kernel registration
(kernels.get_all_registered_kernels), and the venv is deleted. Run it with the project's Python (3.11):

    python tools/build_registries.py 2.12 2.13      # or: all
    python tools/build_registries.py --keep-going all

Each version takes ~1-3 minutes (download and install ~600 MB) and ~2 GB of disk while it runs.
Not part of `make test`; the results are committed as package data.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT_DIR = REPO / "exportkit" / "compat" / "registries"
ATTRVALUE = REPO / "exportkit" / "compat" / "attrvalue.py"
VERSIONS = [f"2.{minor}" for minor in range(12, 22)]

# Runs inside the throwaway venv (that version's TensorFlow and protobuf). argv: attrvalue.py, output path.
DUMP = r'''
import gzip, importlib.util, json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
os.environ["CUDA_VISIBLE_DEVICES"] = ""
spec = importlib.util.spec_from_file_location("attrvalue", sys.argv[1])
attrvalue = importlib.util.module_from_spec(spec); spec.loader.exec_module(attrvalue)
import tensorflow as tf
from tensorflow.core.framework import op_def_pb2
from tensorflow.python.client import pywrap_tf_session as c_api
from tensorflow.python.framework import kernels

buf = c_api.TF_GetAllOpList()
try:
    op_list = op_def_pb2.OpList()
    op_list.ParseFromString(c_api.TF_GetBuffer(buf))
finally:
    c_api.TF_DeleteBuffer(buf)

def arg(a):
    out = {"n": a.name}
    if a.type: out["t"] = int(a.type)
    for key, field in (("ta", "type_attr"), ("na", "number_attr"), ("tla", "type_list_attr")):
        if getattr(a, field): out[key] = getattr(a, field)
    if a.is_ref: out["ref"] = 1
    return out

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

kern = {}
counts = {}
for k in kernels.get_all_registered_kernels().kernel:
    counts[k.device_type] = counts.get(k.device_type, 0) + 1
    if k.device_type not in ("CPU", "GPU", "DEFAULT") or k.label:
        continue  # XLA/TPU/pluggable devices; labelled kernels are only picked with a _kernel attr
    constraint = {c.name: sorted(set(attrvalue.attr_json(c.allowed_values))) for c in k.constraint}
    kern.setdefault(k.op, {}).setdefault(k.device_type, []).append(constraint)
for devices in kern.values():
    for dev, cs in devices.items():
        unique = {json.dumps(c, sort_keys=True): c for c in cs}
        devices[dev] = [unique[key] for key in sorted(unique)]

doc = {"tf": tf.__version__, "ops": ops, "kernels": kern, "kernel_counts": counts}
with gzip.open(sys.argv[2], "wt", encoding="utf-8", compresslevel=9) as fh:
    json.dump(doc, fh, separators=(",", ":"), sort_keys=True)
print(f"TF {tf.__version__}: {len(ops)} ops, kernels by device {counts}")
'''


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
    packed = {"tf": doc["tf"], "kernel_counts": doc["kernel_counts"], "ops": ops}
    tmp = target.with_name(target.name + ".part")
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=9) as fh:
        json.dump(packed, fh, separators=(",", ":"), sort_keys=True)
    os.replace(tmp, target)


def build(version: str, python: str) -> None:
    began = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f"exportkit-registry-{version}-"))
    try:
        venv = work / "venv"
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--progress-bar", "off"]
        print(f"[{version}] installing tensorflow=={version}.* ...", flush=True)
        subprocess.run(pip + [f"tensorflow=={version}.*"], check=True)
        out = OUT_DIR / f"tf-{version}.json.gz"
        tmp = out.with_name(f"tf-{version}.dump.json.gz")
        subprocess.run([str(venv / "bin" / "python"), "-I", "-c", DUMP, str(ATTRVALUE), str(tmp)], check=True,
                       cwd=work)
        repack(tmp, out)
        tmp.unlink()
        print(f"[{version}] wrote {out.relative_to(REPO)} ({out.stat().st_size // 1024} KB) in "
              f"{time.monotonic() - began:.0f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("versions", nargs="+", help="X.Y ... or all")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the venvs (default: this one)")
    parser.add_argument("--repack", action="store_true",
                        help="only convert raw dumps (tf-X.Y.dump.json.gz, or old-format files) to the shipped form")
    parser.add_argument("--keep-going", action="store_true", help="go on with the next version after a failure")
    args = parser.parse_args()
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
