"""SavedModel directories: a model base directory's integer-named versions, which directory a path means (as TF
Serving resolves it), and why a path cannot be used (a dangling link, a FIFO, another model format). A bucket URL
(gs://, s3://) is resolved by listing the bucket, and its version is read from a local mirror (exportkit.storage)."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from exportkit import storage
from exportkit.errors import UsageError

SAVED_MODEL_PB = "saved_model.pb"
SAVED_MODEL_PBTXT = "saved_model.pbtxt"


def path_problem(path: str | Path) -> str | None:
    """Why `path` exists as a name but cannot be used as a file or directory (a symlink loop or dangling link, a
    FIFO, a socket, a device, no permission); None when it is usable or simply absent."""
    import errno
    import stat

    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            return f"{path} is a dangling symlink (to {os.readlink(path)})"
        return None
    except OSError as err:
        if err.errno == errno.ELOOP:
            return f"{path} is a symlink loop (it points back to itself)"
        return f"{path} cannot be read: {err.strerror or err}"
    for test, what in ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(st.st_mode):
            return f"{path} is {what}, not a regular file or directory"
    return None


def check_path(path: str | Path, fix: str) -> None:
    """UsageError naming what is wrong with a path that exists but cannot be used (see `path_problem`)."""
    problem = path_problem(path)
    if problem:
        raise UsageError(problem, fix)


def _has_saved_model(directory: Path) -> bool:
    return (directory / SAVED_MODEL_PB).is_file() or (directory / SAVED_MODEL_PBTXT).is_file()


def list_versions(base: str | Path) -> list[int]:
    """Integer-named subdirectories of a model base directory that hold a SavedModel, ascending."""
    if storage.is_url(base):
        return sorted(int(v) for v in _url_versions(str(base)))
    base = Path(base)
    versions = []
    try:
        children = list(base.iterdir())
    except OSError:
        return []
    for child in children:
        if child.is_dir() and re.fullmatch(r"\d+", child.name) and _has_saved_model(child):
            versions.append(int(child.name))
    return sorted(versions)


def _url_versions(base: str) -> dict[int, str]:
    """{version: its child's name} of a bucket base directory: one listing (a glob), not a request per child."""
    found = {}
    for match in storage.glob(storage.join(base, "*", "saved_model.pb*")):
        child, name = storage.name(storage.parent(match)), storage.name(match)
        if re.fullmatch(r"\d+", child) and name in (SAVED_MODEL_PB, SAVED_MODEL_PBTXT):
            found[int(child)] = child
    return found


def version_path(base: str | Path, version: int) -> str | Path:
    """The directory (or URL) of version `version` under `base`, by its real name (`007` stays `007`)."""
    if storage.is_url(base):
        return storage.join(str(base), _url_versions(str(base)).get(version, str(version)))
    return Path(base) / _version_name(Path(base), version)


def resolve_version_url(url: str) -> str:
    """The SavedModel version URL meant by a bucket `url`, resolved as resolve_savedmodel_dir resolves a path."""
    storage.require_bucket(url)
    url = url.rstrip("/")
    if storage.name(url) in (SAVED_MODEL_PB, SAVED_MODEL_PBTXT) and not storage.isdir(url) and storage.exists(url):
        return storage.parent(url)
    try:
        children = storage.listdir(url)  # one listing answers most questions
    except UsageError:
        if storage.exists(url):
            raise UsageError(f"{url} is a file, not a SavedModel directory",
                             "pass the directory that contains saved_model.pb, or its model base directory") from None
        raise
    if SAVED_MODEL_PB in children or SAVED_MODEL_PBTXT in children:
        return url
    versions = _url_versions(url)
    if versions:
        return storage.join(url, versions[max(versions)])
    numeric = sorted((n for n in children if re.fullmatch(r"\d+", n)), key=int)
    if numeric:
        raise UsageError(f"{url} has version directories ({', '.join(numeric[:5])}) but none contains saved_model.pb",
                         "the export did not finish or wrote elsewhere; export the model again")
    raise UsageError(f"{url} contains no saved_model.pb and no integer-named version directory with one",
                     "pass a SavedModel version directory (with saved_model.pb) or its base directory "
                     "(gs://bucket/models/NAME holding 1/, 2/, ...)")


# What reading a SavedModel's description needs not download: the variables' bytes (their sizes are kept).
VARIABLE_DATA = ("variables/*.data-*",)


def resolve_savedmodel_dir(path: str | Path, *, variables: bool = True) -> Path:
    """The SavedModel directory meant by `path`.

    A version directory (holds saved_model.pb) is returned as is; a model base directory resolves, like TF
    Serving, to its highest integer-named subdirectory that holds saved_model.pb. Anything else is a UsageError.
    A bucket URL resolves the same way in the bucket, and its version's local mirror is returned (with
    `variables=False` the variables' data files are placeholders of their size: nothing big is downloaded).
    """
    if storage.is_url(path):
        return storage.local_copy(resolve_version_url(str(path)), sizes_only=() if variables else VARIABLE_DATA)
    p = Path(storage.local_path(path))
    check_path(p, "pass a SavedModel version or base directory")
    if not p.exists():
        raise UsageError(f"no such file or directory: {p}", "check the path (a SavedModel version or base directory)")
    if p.is_file():
        if p.name in (SAVED_MODEL_PB, SAVED_MODEL_PBTXT):
            return p.parent
        raise UsageError(f"{p} is a file, not a SavedModel directory",
                         "pass the directory that contains saved_model.pb, or its model base directory")
    if _has_saved_model(p):
        return p
    versions = list_versions(p)
    if versions:
        return p / _version_name(p, versions[-1])
    numeric = sorted(c.name for c in p.iterdir() if c.is_dir() and re.fullmatch(r"\d+", c.name))
    for directory in [p] + [p / n for n in sorted(numeric, key=int, reverse=True)]:
        other = other_format(directory)
        if other:
            raise UsageError(*other)
    if numeric:
        raise UsageError(f"{p} has version directories ({', '.join(numeric[:5])}) but none contains saved_model.pb",
                         "the export did not finish or wrote elsewhere; export the model again")
    raise UsageError(f"{p} contains no saved_model.pb and no integer-named version directory with one",
                     "pass a SavedModel version directory (with saved_model.pb) or its base directory "
                     "(models/NAME holding 1/, 2/, ...)")


SESSION_BUNDLE_META = "export.meta"
TFLITE_MODEL = "model.tflite"


def other_format(directory: Path) -> tuple[str, str] | None:
    """(message, fix) when a directory without saved_model.pb holds a model of a format TF Serving does not load
    as a SavedModel: a SessionBundle (`export.meta`; session_bundle/oss/session_bundle_util.cc: "Session Bundle is
    deprecated and removed.") or a TFLite model (`model.tflite`: served only with --prefer_tflite_model)."""
    if (directory / SESSION_BUNDLE_META).is_file():
        return (f"{directory} holds a SessionBundle ({SESSION_BUNDLE_META}), the export format before SavedModel: "
                f"TF Serving refuses it (\"Session Bundle is deprecated and removed.\")",
                "export the model again as a SavedModel (tf.compat.v1.saved_model.Builder, or exportkit export)")
    if (directory / TFLITE_MODEL).is_file():
        return (f"{directory} holds a TFLite model ({TFLITE_MODEL}) and no saved_model.pb: TF Serving serves it only "
                f"with --prefer_tflite_model, and exportkit checks SavedModels only",
                "point exportkit at the SavedModel the TFLite model was converted from")
    return None


@dataclass(frozen=True)
class ModelLocation:
    """Where a served version lives: `base_dir` is None when a non-integer version dir was given directly."""

    base_dir: str | None
    version_dir: str
    version: int
    default_name: str


def resolve_model_path(path: str) -> ModelLocation:
    """A base dir (serve its highest integer version) or a version dir (version = its name if integer, else 1)."""
    version_dir = resolve_savedmodel_dir(path).resolve()
    if version_dir.name.isdigit():
        base = version_dir.parent
        return ModelLocation(str(base), str(version_dir), int(version_dir.name), base.name or "model")
    return ModelLocation(None, str(version_dir), 1, version_dir.name or "model")


def _version_name(base: Path, version: int) -> str:
    """The real name of version `version` (`007` stays `007`)."""
    for child in base.iterdir():
        if child.is_dir() and re.fullmatch(r"\d+", child.name) and int(child.name) == version and _has_saved_model(child):
            return child.name
    return str(version)
