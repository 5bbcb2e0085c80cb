"""Reading, listing and writing one user path, local or in a bucket. A local path goes straight to the OS (no
fsspec import); a URL goes through its protocol's client (remote.py), its failures said as exportkit's errors."""
from __future__ import annotations

import glob as _glob
import io
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from exportkit import files
from exportkit.storage.remote import bounded, filesystem, not_found, strip, translate_error, translated
from exportkit.storage.urls import bucket, is_url, local_path, protocol

_BLOCK = 4 * 1024 * 1024  # read-ahead block of a remote reader: memory stays bounded whatever the object's size
# Uploads: gcsfs and s3fs send a file in chunks of 50 MiB held in memory, many files at once (s3fs: 10 chunks of a
# file at once too); 4 x 50 MB shards peaked at 509 MB (GCS) and 466 MB (S3). 8 MiB chunks (a multiple of GCS's
# 256 KiB, above S3's 5 MiB part minimum), 8 files and 2 parts at once bound it.
_UPLOAD = {"gs": {"chunksize": 8 << 20, "batch_size": 8}, "s3": {"chunksize": 8 << 20, "batch_size": 8,
                                                                  "max_concurrency": 2}}
_UPLOAD.update(gcs=_UPLOAD["gs"], s3a=_UPLOAD["s3"])


def _info(url: str) -> dict | None:
    """The client's info on `url` (an object, or a 'directory' for a prefix or bucket); None when absent."""
    fs = filesystem(url)
    try:
        return fs.info(strip(url), **bounded(fs))
    except FileNotFoundError:
        return None
    except Exception as err:  # noqa: BLE001 - fsspec's own exists() would call an unreachable server "absent"
        raise translate_error(err, url) from None


def exists(path) -> bool:
    if not is_url(path):
        return os.path.exists(local_path(path))
    return _info(path) is not None


def isdir(path) -> bool:
    if not is_url(path):
        return os.path.isdir(local_path(path))
    info = _info(path)
    return info is not None and info.get("type") == "directory"


def listdir(path) -> list[str]:
    """The names of `path`'s children, one level, sorted (in a bucket: objects and prefixes alike)."""
    if not is_url(path):
        return sorted(os.listdir(local_path(path)))
    fs = filesystem(path)
    base = strip(path).rstrip("/")
    with translated(path):
        entries = fs.ls(base, detail=True, **bounded(fs))  # one listing; a missing prefix raises FileNotFoundError
    names = {e["name"].rstrip("/"): e for e in entries}
    if not names:
        raise translate_error(FileNotFoundError(path), path)
    if base in names and names[base].get("type") != "directory":
        raise translate_error(NotADirectoryError("an object, not a directory"), path)
    return sorted({name.rsplit("/", 1)[-1] for name in names if name != base})


def glob(pattern) -> list[str]:
    """Sorted matches of `pattern`; bucket matches stay full URLs ('gs://b/logs/part-*.gz')."""
    if not is_url(pattern):
        return sorted(_glob.glob(local_path(pattern)))
    proto = str(pattern).split("://", 1)[0]
    with translated(pattern):
        fs = filesystem(pattern)
        found = fs.glob(strip(pattern), **bounded(fs))
    return sorted(f"{proto}://{match.lstrip('/')}" for match in found)


def size(path) -> int:
    if not is_url(path):
        return os.path.getsize(local_path(path))
    info = _info(path)
    if info is None:
        raise translate_error(FileNotFoundError(path), path)
    return int(info.get("size") or 0)


class _RemoteReader(io.RawIOBase):
    """A remote object as a binary file whose failures (mid-read too) are exportkit's errors naming the URL."""

    def __init__(self, url: str):
        super().__init__()
        self.url = url
        with translated(url):
            # "readahead": one request per block. gcsfs's default (AdaptiveReadaheadCache) sent 215 requests for a
            # 1.7 MB GZIP TFRecord file read by gzip's small reads, making --data from a bucket ~2x slower than disk.
            self._fh = filesystem(url).open(strip(url), "rb", block_size=_BLOCK, cache_type="readahead")

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        with translated(self.url):
            data = self._fh.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def read(self, n: int = -1) -> bytes:
        with translated(self.url):
            return self._fh.read(n)

    def seek(self, offset: int, whence: int = 0) -> int:
        with translated(self.url):
            return self._fh.seek(offset, whence)

    def tell(self) -> int:
        return self._fh.tell()

    def close(self) -> None:
        if not self.closed:
            self._fh.close()
        super().close()


def open_read(path):
    """A binary file to stream `path` from (a context manager); a URL is read in blocks, never whole."""
    if not is_url(path):
        return open(local_path(path), "rb")
    return _RemoteReader(str(path))


def read_bytes(path) -> bytes:
    if not is_url(path):
        with open(local_path(path), "rb") as fh:
            return fh.read()
    with translated(path):
        return filesystem(path).cat_file(strip(path))


@contextmanager
def open_write(path, what: str | None = None):
    """A binary writer for `path`, whole or not at all: a local file is renamed into place, a URL is one object
    uploaded when the block succeeds (never a partial object); on an error nothing is written."""
    if not is_url(path):
        with files.atomic_path(local_path(path), what or str(path)) as tmp:
            with open(tmp, "wb") as fh:
                yield fh
        return
    fs = filesystem(path)
    with tempfile.NamedTemporaryFile(prefix="exportkit-upload-", suffix=".tmp") as tmp:
        try:
            yield tmp
            tmp.flush()
        except OSError as err:
            raise files.os_error(err, f"{what or path} (a local temporary file before the upload)") from None
        with translated(path, what or ""):
            fs.put_file(tmp.name, strip(path))


def upload_tree(local_dir, url: str, last: str | None = None) -> list[str]:
    """Every file under `local_dir` to the same relative names under `url` (parallel; the file named `last`, an
    index of the others, after them); the uploaded URLs."""
    fs = filesystem(url)
    sources, targets = [], []
    root = local_path(local_dir)
    for folder, _, names in os.walk(root):
        for file in names:
            source = os.path.join(folder, file)
            relative = os.path.relpath(source, root).replace(os.sep, "/")
            sources.append(source)
            targets.append(f"{strip(url)}/{relative}")
    index = f"{strip(url)}/{last}"
    with translated(url):
        for later in (False, True):
            group = [(s, t) for s, t in zip(sources, targets) if (t == index) == later]
            if group:
                fs.put([s for s, _ in group], [t for _, t in group], **_UPLOAD.get(protocol(url), {}))
    proto = protocol(url)
    return [f"{proto}://{target}" for target in targets]


@contextmanager
def staged_dir(path, what: str, last: str | None = None):
    """Yield a local directory whose files all land in `path` when the block succeeds, and none otherwise: a local
    path as files.staged_dir does it (renames); a URL uploaded at the end (`last`, an index of the others, after
    them), what was uploaded of a failed upload deleted (an object store has no rename: a reader may see some files a
    moment before the others). A URL in a bucket that does not exist is refused before the block runs."""
    if not is_url(path):
        with files.staged_dir(local_path(path), what) as stage:
            yield stage
        return
    if not exists(bucket(path)):
        raise not_found(str(path), what)
    stage = tempfile.mkdtemp(prefix="exportkit-stage-")
    try:
        yield Path(stage)
        names = [os.path.relpath(os.path.join(d, f), stage) for d, _, fs in os.walk(stage) for f in fs]
        try:
            upload_tree(stage, str(path), last)
        except BaseException:
            for name in names:
                try:
                    remove_tree(f"{str(path).rstrip('/')}/{name}")
                except Exception:  # noqa: BLE001 - the upload's own error is the one to say
                    pass
            raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def remove_tree(url: str) -> None:
    """Delete every object under `url` (a prefix); nothing there is not an error."""
    fs = filesystem(url)
    with translated(url):
        try:
            fs.rm(strip(url), recursive=True, **bounded(fs))
        except FileNotFoundError:
            pass
