"""Choosing the version number and staging the version directory (what goes in it: exportkit.savedmodel.layout).

Everything is written into a hidden staging sibling inside the base directory and renamed into place at the
end, so TF Serving (which polls for integer-named directories) never sees a half-written version. The staging
directory is made before the long stages and reserves the version number (see `staged_version_dir`).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Callable

from exportkit import storage
from exportkit.errors import InfraError, UsageError
from exportkit.processes import pid_alive
from exportkit.log import log

STAGING_PREFIX = ".exportkit-"
# .exportkit-<version>-<owner pid>-<random>: the version it reserves and the process that owns it.
_STAGING = re.compile(r"\.exportkit-(?P<version>\d+)-(?P<pid>\d+)-[0-9a-f]+")


def integer_versions(base: Path | str) -> list[int]:
    """The integer-named children of `base` (a directory, or a bucket URL whose children are prefixes)."""
    if not storage.isdir(base):
        return []
    return sorted(int(n) for n in storage.listdir(base)
                  if n.isdigit() and (storage.is_url(base) or (Path(base) / n).is_dir()))


def choose_version(base: Path | str, requested: int | None, reserved: dict[int, int] | None = None) -> int:
    """`requested`, or one above the highest integer version or reservation; never an existing or reserved one.

    `reserved`: {version: owner pid} of other exports running into `base` (their staging directories). `base` may
    be a bucket URL (exportkit.storage).
    """
    reserved = reserved or {}
    if storage.exists(base) and not storage.isdir(base):
        raise UsageError(f"{base} exists and is not a directory", "pass a model base directory to -o")
    if storage.exists(storage.join(base, "saved_model.pb")):
        raise UsageError(f"{base} is itself a SavedModel, not a model base directory",
                         f"pass its parent, or a new directory, to -o (versions go to {base}/<N>/)")
    taken = sorted(set(integer_versions(base)) | set(reserved))
    if requested is None:
        return (taken[-1] + 1) if taken else 1
    if requested < 0:
        raise UsageError(f"--version {requested} is negative", "pass a positive integer")
    if storage.exists(storage.join(base, str(requested))):
        raise UsageError(f"version {requested} already exists in {base}",
                         f"pass --version {(taken[-1] + 1) if taken else requested + 1} or omit --version")
    if requested in reserved:
        raise UsageError(f"version {requested} is being exported into {base} right now (by process "
                         f"{reserved[requested]})",
                         f"wait for that export to finish, or pass --version {taken[-1] + 1} or omit --version")
    return requested


def staging_version(staging: Path) -> int:
    """The version a staging directory (from `staged_version_dir`) reserves."""
    return int(_STAGING.fullmatch(staging.name).group("version"))


def _reservations(base: Path, notice: Callable[[str], None]) -> dict[int, int]:
    """{version: pid} of live exports into `base`; staging directories whose owner process is gone are removed
    (a SIGKILLed export cannot clean up after itself)."""
    live: dict[int, int] = {}
    for entry in base.iterdir():
        match = _STAGING.fullmatch(entry.name)
        if not match or not entry.is_dir():
            continue
        pid = int(match.group("pid"))
        if pid != os.getpid() and not pid_alive(pid):
            shutil.rmtree(entry, ignore_errors=True)
            notice(f"exportkit: removed stale staging directory {entry} (its export, process {pid}, is gone)")
        else:
            live[int(match.group("version"))] = pid
    return live


@contextlib.contextmanager
def _locked(base: Path):
    """An exclusive flock on the base directory itself: reservations and renames into `base` take turns."""
    fd = os.open(base, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _disk_problem(err: BaseException, codes: dict | None = None) -> str | None:
    """'no space left on device' / 'read-only file system' when `err` is one (an OSError or a TensorFlow error
    carrying the same text), else None."""
    codes = codes or {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
                      errno.EROFS: "read-only file system"}
    if isinstance(err, OSError) and err.errno in codes:
        return codes[err.errno]
    text = str(err)
    for needle in ("No space left on device", "Disk quota exceeded", "Read-only file system"):
        if needle in text:
            return needle.lower()
    return None


def _make_base(base: Path) -> None:
    """Create `base` (mode per umask) if needed and check it is writable."""
    try:
        base.mkdir(parents=True, exist_ok=True)
        if not os.access(base, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(base))
    except OSError as err:
        reason = _disk_problem(err) or (err.strerror or str(err)).lower()
        raise UsageError(f"cannot write to {base}: {reason}",
                         "pass -o a directory you can write to (nothing was loaded or written)") from None


@contextlib.contextmanager
def staged_version_dir(base: Path, version: int | None = None, notice: Callable[[str], None] | None = None):
    """Reserve a version and yield its hidden staging directory (`staging_version(path)` is the version); on
    success rename it to base/<version>, on any failure or interrupt leave `base` as it was.

    Call it before the long stages: the reservation (a staging directory named after the version and this process,
    made under a lock on `base`) keeps concurrent exports from choosing the same number, and creating it proves
    `base` is writable. Version directories get the mode a plain mkdir gives (0755 under umask 022), so a server
    running as another user can read them. Stale staging directories of dead exports are removed here.
    """
    notice = notice or log.warning
    staging: Path | None = None
    created_base = not base.exists()  # decided before anything is created, so an interrupt cannot lose track
    try:
        _make_base(base)
        with _locked(base):
            chosen = choose_version(base, version, _reservations(base, notice))
            staging = base / f"{STAGING_PREFIX}{chosen}-{os.getpid()}-{secrets.token_hex(4)}"
            os.mkdir(staging, 0o777)  # the umask decides, as for any directory (mkdtemp would force 0700)
        yield staging
        with _locked(base):
            final = base / str(chosen)
            if final.exists():
                if version is not None:
                    raise UsageError(f"version {chosen} was written into {base} by someone else while this export ran",
                                     "pass another --version, or omit --version to take the next free number")
                raise UsageError(f"version {chosen} appeared in {base} while this export ran (written by something "
                                 f"that does not reserve versions)", "export again: the next free number is taken")
            os.rename(staging, final)
        staging = None
    except BaseException as err:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        if created_base:
            try:
                os.rmdir(base)  # only if still empty: another export may have started there meanwhile
            except OSError:
                pass
        problem = _disk_problem(err) if isinstance(err, Exception) and not isinstance(err, UsageError) else None
        if problem:
            fix = ("free space on that file system (or pass -o elsewhere)" if "space" in problem or "quota" in problem
                   else "pass -o a directory you can write to")
            raise InfraError(f"writing the version into {base} failed: {problem}",
                             f"{fix} and export again; nothing was left in the base directory") from err
        raise


def check_assets(files: list[str]) -> list[Path]:
    """The --asset files, checked before any work is done."""
    paths = [Path(name) for name in files]
    by_name: dict[str, Path] = {}
    for path in paths:
        if not path.is_file():
            raise UsageError(f"--asset {path} is not a file", "pass files (vocabularies, label maps) to --asset")
        other = by_name.setdefault(path.name, path)
        if other is not path and other.resolve() != path.resolve():
            raise UsageError(f"--asset {other} and --asset {path} have the same name {path.name!r}: both would be "
                             f"assets/{path.name}", "rename one of them (assets/ is flat)")
    return list(dict.fromkeys(path.resolve() for path in paths))



def set_method_names(version_dir: Path, methods: dict[str, str]) -> None:
    """Give signatures their SignatureDef method (classify, regress) in the written saved_model.pb.

    `tf.saved_model.save` (under ExportArchive, which tracks every variable the signatures use) writes every
    signature as predict; TF Serving's Classify and Regress refuse a signature whose method_name is not theirs.
    Only the method_name strings change: graph, functions and object graph stay as written.
    """
    from exportkit.savedmodel.protos import protos
    from exportkit.savedmodel.versions import SAVED_MODEL_PB
    from exportkit.signature_constants import PREDICT_METHOD

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
