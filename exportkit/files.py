"""Files and streams the user asked for (--json, --junit, --save-outputs, --save-failures, stdout): written whole
or not at all, and an OSError said as the exception family says it (bad path: exit 2; disk full: exit 3)."""
from __future__ import annotations

import errno
import os
import shutil
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path

from exportkit.errors import ExportkitError, InfraError, UsageError

_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO)


def cache_dir() -> Path:
    """exportkit's cache (op registries, managed TF environments, bucket mirrors): `$EXPORTKIT_CACHE_DIR`, else
    `${XDG_CACHE_HOME:-~/.cache}/exportkit`."""
    override = os.environ.get("EXPORTKIT_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "exportkit"


def os_error(err: OSError, what: str) -> ExportkitError:
    """`err` met while writing `what` (e.g. "--json r.json") as one message and its fix."""
    reason = err.strerror or str(err)
    if err.errno in _FULL:
        return InfraError(f"cannot write {what}: {reason}", "free space on that file system (or write elsewhere) "
                                                            "and run the command again; nothing was left half-written")
    if err.errno == errno.ENOENT:
        return UsageError(f"cannot write {what}: {reason}", "create its directory first, or pass another path")
    if err.errno in (errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
        return UsageError(f"cannot write {what}: {reason} (a file is in the way of a directory, or the other way)",
                          "pass a path whose parent directories are directories and that names no existing directory")
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return UsageError(f"cannot write {what}: {reason}", "pass a path in a directory you can write to")
    return InfraError(f"cannot write {what}: {reason}", "check the path and the file system, then run it again")


@contextmanager
def atomic_path(path: str | os.PathLike, what: str):
    """Yield a temporary path next to `path`; renamed onto `path` when the block succeeds, removed otherwise, so
    a full disk or an interrupt never leaves a partial file. OSErrors become os_error(..., what). A path that is
    not a regular file (/dev/stdout, a FIFO) is written in place: there is nothing to rename onto."""
    target = Path(path)
    if target.exists() and not target.is_file() and not target.is_dir():
        try:
            yield target
        except OSError as err:
            raise os_error(err, what) from None
        return
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # two threads, one path
    try:
        yield tmp
        os.replace(tmp, target)
    except OSError as err:
        raise os_error(err, what) from None
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:  # a read-only file system, where the temporary file could not be made either
            pass


def write_atomic(path: str | os.PathLike, text: str, what: str) -> None:
    """`text` into `path`, whole or not at all (see atomic_path)."""
    with atomic_path(path, what) as tmp:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)


def append_whole(path: str | os.PathLike, text: str, what: str) -> None:
    """Append `text` to `path` (a file someone else owns, e.g. $GITHUB_STEP_SUMMARY), whole or not at all: a
    failed write is truncated back to the size the file had."""
    try:
        with open(path, "a", encoding="utf-8") as fh:
            size = fh.tell()
            try:
                fh.write(text)
                fh.flush()
            except OSError:
                fh.truncate(size)
                raise
    except OSError as err:
        raise os_error(err, what) from None


class StagedDir:
    """A set of files for directory `path` (--save-outputs DIR, --save-failures DIR), written into a hidden
    directory inside it and moved into `path` together by commit(); abort() removes them (and `path` too if this
    created it and it is empty), so a full disk or an interrupt never leaves half a set behind, such as one
    runtime's outputs without the next one's. OSErrors become os_error(..., what)."""

    def __init__(self, path: str | os.PathLike, what: str):
        self.path, self.what = Path(path), what
        self._created = not self.path.exists()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self.stage = Path(tempfile.mkdtemp(prefix=".exportkit-", suffix=".tmp", dir=self.path))
        except OSError as err:
            self._remove_created()
            raise os_error(err, what) from None

    def commit(self) -> list[Path]:
        """Move the staged files into `path` (renames within one file system); the paths, in name order."""
        moved: list[Path] = []
        try:
            for staged in sorted(self.stage.iterdir()):
                os.replace(staged, self.path / staged.name)
                moved.append(self.path / staged.name)
            self.stage.rmdir()
        except OSError as err:
            for path in moved:
                path.unlink(missing_ok=True)
            self.abort()
            raise os_error(err, self.what) from None
        return moved

    def abort(self) -> None:
        shutil.rmtree(self.stage, ignore_errors=True)
        self._remove_created()

    def _remove_created(self) -> None:
        if self._created:
            try:
                self.path.rmdir()
            except OSError:  # not empty (someone else wrote there meanwhile), or never made
                pass


@contextmanager
def staged_dir(path: str | os.PathLike, what: str):
    """Yield the staging directory of a StagedDir: committed when the block succeeds, aborted otherwise."""
    staged = StagedDir(path, what)
    try:
        yield staged.stage
    except OSError as err:
        staged.abort()
        raise os_error(err, what) from None
    except BaseException:
        staged.abort()
        raise
    staged.commit()


class OutputFault(Exception):
    """Standard output could not be written: its reader left (EPIPE) or its device is full."""

    def __init__(self, err: OSError):
        super().__init__(str(err))
        self.err = err


class GuardedStream:
    """sys.stdout whose write/flush failures are an OutputFault: the CLI answers a gone reader (`| head`) quietly
    and a full disk with a message, instead of an "unexpected OSError" (SIGPIPE stays ignored, so a write to a
    dead pipe or socket never kills a server)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        try:
            return self._stream.write(text)
        except OSError as err:
            raise OutputFault(err) from None

    def flush(self):
        try:
            return self._stream.flush()
        except OSError as err:
            raise OutputFault(err) from None

    def __getattr__(self, name):
        return getattr(self._stream, name)


def reopen_closed_stdio() -> list[str]:
    """Point standard streams the process was started without (`>&-`, as some CI steps leave them) at /dev/null;
    their names. Call it before anything opens a file: fd 1 would otherwise be the next pipe opened (a worker's), the
    command's output would go into it, and Python's own sys.stdout stays None. Calling it again changes nothing."""
    import sys

    closed = []
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
        except OSError:
            devnull = os.open(os.devnull, os.O_RDWR)
            if devnull != fd:
                os.dup2(devnull, fd)
                os.close(devnull)
            setattr(sys, name, open(fd, mode, closefd=False))
            closed.append(name)
        else:
            if getattr(sys, name) is None:  # closed at start, its fd since taken by a file: leave that file alone
                setattr(sys, name, open(os.devnull, mode))
                closed.append(name)
    return closed
