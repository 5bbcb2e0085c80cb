"""Choosing the version number and staging the version directory (what goes in it: exportkit.layout).

Everything is written into a hidden temporary sibling inside the base directory and renamed into place at the
end, so TF Serving (which polls for integer-named directories) never sees a half-written version.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from exportkit.errors import UsageError


def integer_versions(base: Path) -> list[int]:
    if not base.is_dir():
        return []
    return sorted(int(p.name) for p in base.iterdir() if p.is_dir() and p.name.isdigit())


def choose_version(base: Path, requested: int | None) -> int:
    """`requested`, or one above the highest integer version; never an existing one."""
    if base.exists() and not base.is_dir():
        raise UsageError(f"{base} exists and is not a directory", "pass a model base directory to -o")
    if (base / "saved_model.pb").exists():
        raise UsageError(f"{base} is itself a SavedModel, not a model base directory",
                         f"pass its parent, or a new directory, to -o (versions go to {base}/<N>/)")
    versions = integer_versions(base)
    if requested is None:
        return (versions[-1] + 1) if versions else 1
    if requested < 0:
        raise UsageError(f"--version {requested} is negative", "pass a positive integer")
    if (base / str(requested)).exists():
        raise UsageError(f"version {requested} already exists in {base}",
                         f"pass --version {(versions[-1] + 1) if versions else requested + 1} or omit --version")
    return requested


@contextlib.contextmanager
def staged_version_dir(base: Path, version: int):
    """Yield a temporary directory; on success rename it to base/version, on any failure leave base as it was."""
    created_base = not base.exists()
    base.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".exportkit-{version}-", dir=base))
    final = base / str(version)
    try:
        yield staging
        if final.exists():
            raise UsageError(f"version {version} appeared in {base} while exporting", "export again with another --version")
        os.rename(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if created_base:
            shutil.rmtree(base, ignore_errors=True)
        raise


def check_assets(files: list[str]) -> list[Path]:
    """The --asset files, checked before any work is done."""
    paths = [Path(name) for name in files]
    for path in paths:
        if not path.is_file():
            raise UsageError(f"--asset {path} is not a file", "pass files (vocabularies, label maps) to --asset")
    return [path.resolve() for path in paths]



def set_method_names(version_dir: Path, methods: dict[str, str]) -> None:
    """Give signatures their SignatureDef method (classify, regress) in the written saved_model.pb.

    `tf.saved_model.save` (under ExportArchive, which tracks every variable the signatures use) writes every
    signature as predict; TF Serving's Classify and Regress refuse a signature whose method_name is not theirs.
    Only the method_name strings change: graph, functions and object graph stay as written.
    """
    from exportkit.savedmodel import PREDICT_METHOD, SAVED_MODEL_PB, protos

    if all(method == PREDICT_METHOD for method in methods.values()):
        return
    path = Path(version_dir) / SAVED_MODEL_PB
    proto = protos()["saved_model"].SavedModel()
    proto.ParseFromString(path.read_bytes())
    for meta_graph in proto.meta_graphs:
        for name, method in methods.items():
            if name in meta_graph.signature_def:
                meta_graph.signature_def[name].method_name = method
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(proto.SerializeToString())
    os.replace(tmp, path)
