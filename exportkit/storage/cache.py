"""Local mirrors of bucket files and trees for what needs a local path (TensorFlow's loaders, the readers of
saved_model.pb): kept under <cache dir>/storage/ and revalidated by each object's generation (GCS) or ETag (S3), so
a second run on an unchanged version downloads nothing and a changed object is fetched again. A mirror may hold
some files as sparse placeholders of their size (`sizes_only`: inspect needs the variables' sizes, not their
bytes); such mirrors live in a tree of their own (storage/sizes-only/), so a full mirror is never a placeholder."""
from __future__ import annotations

import fcntl
import fnmatch
import hashlib
import json
import os
import shutil
from pathlib import Path
from urllib.parse import urlsplit

from exportkit.files import cache_dir, os_error, write_atomic
from exportkit.log import log
from exportkit.storage.remote import bounded, endpoint, filesystem, strip, translate_error, translated
from exportkit.storage.urls import is_url, local_path, split

_INDEX = ".index"
_SIZES_ONLY = "sizes-only"


def _root() -> Path:
    return cache_dir() / "storage"


def _endpoint_dir(proto: str) -> str:
    """'gs' for the cloud, 'gs@127.0.0.1_4443' for an emulator: the same bucket name elsewhere is another bucket."""
    address = endpoint(proto)
    default = {"gs": "https://storage.googleapis.com", "gcs": "https://storage.googleapis.com",
               "s3": "https://s3.amazonaws.com", "s3a": "https://s3.amazonaws.com"}.get(proto)
    if not address or address == default:
        return proto
    parts = urlsplit(address)
    return f"{proto}@{parts.hostname}_{parts.port or ''}"


def mirror_path(url: str, sizes_only: tuple[str, ...] = ()) -> Path:
    """Where `url`'s mirror lives: <cache>/storage/[sizes-only/]<proto[@endpoint]>/<bucket>/<key>."""
    proto, bucket, key = split(url)
    root = _root() / _SIZES_ONLY if sizes_only else _root()
    return root.joinpath(_endpoint_dir(proto), bucket, *[p for p in key.split("/") if p])


def _token(info: dict) -> str:
    """What changes when the object changes: GCS's generation, S3's ETag (else size and mtime)."""
    for field in ("generation", "ETag", "etag"):
        if info.get(field):
            return str(info[field])
    return f"{info.get('size')}:{info.get('mtime') or info.get('LastModified') or info.get('updated')}"


def _objects(url: str) -> dict[str, dict]:
    """The objects at or under `url` by their path relative to it ('' for a single object)."""
    fs = filesystem(url)
    with translated(url):
        found = fs.find(strip(url), detail=True, **bounded(fs))  # one listing; an object finds itself
    if not found:
        raise translate_error(FileNotFoundError(url), url)
    if list(found) == [strip(url)] and found[strip(url)].get("type") != "directory":
        return {"": found[strip(url)]}
    prefix = strip(url).rstrip("/") + "/"
    return {name[len(prefix):]: info for name, info in found.items()
            if name.startswith(prefix) and not name.endswith("/") and info.get("type") != "directory"}


def local_copy(path, sizes_only: tuple[str, ...] = ()) -> Path:
    """A local path for `path`: a local path as is; a bucket file or tree mirrored into the cache, downloading
    only objects whose generation/ETag changed since the last copy (and removing files deleted upstream).
    Files whose relative path matches a pattern of `sizes_only` ('variables/*.data-*') are not downloaded: they
    are sparse files of their size (zeros if read)."""
    if not is_url(path):
        return Path(local_path(path))
    url = str(path).rstrip("/")
    target = mirror_path(url, sizes_only)
    identity = f"{_endpoint_dir(split(url)[0])} {url} {' '.join(sizes_only)}"
    index_name = hashlib.sha256(identity.encode()).hexdigest()[:32]
    index_path = _root() / _INDEX / f"{index_name}.json"
    try:
        index_path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(index_path.with_suffix(".lock"), "w")
    except OSError as err:
        raise os_error(err, f"the storage cache {_root()} (EXPORTKIT_CACHE_DIR)") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two processes mirroring one URL take turns
        objects = _objects(url)
        try:
            known = json.loads(index_path.read_text()) if index_path.exists() else {}
        except (OSError, ValueError):
            known = {}
        single = list(objects) == [""]
        try:
            _reshape(target, single)
            stale = [rel for rel, info in objects.items()
                     if known.get(rel) != _token(info) or not _same_size(target / rel if rel else target, info)]
            sized = [rel for rel in stale if any(fnmatch.fnmatchcase(rel, p) for p in sizes_only)]
            fetch = [rel for rel in stale if rel not in sized]
            _download(url, target, fetch)
            _placeholders(target, {rel: int(objects[rel].get("size") or 0) for rel in sized})
            if not single:
                _remove_stale(target, set(objects))
            write_atomic(index_path, json.dumps({rel: _token(info) for rel, info in objects.items()}),
                         "the storage cache's index")
        except OSError as err:
            raise os_error(err, f"the storage cache {_root()} (EXPORTKIT_CACHE_DIR)") from None
    log.debug("storage: %s -> %s (%d of %d objects downloaded)", url, target, len(fetch), len(objects))
    return target


def _same_size(local: Path, info: dict) -> bool:
    try:
        return local.stat().st_size == int(info.get("size") or 0)
    except OSError:
        return False


def _reshape(target: Path, single: bool) -> None:
    """A mirror that was a file and is now a tree (or the other way) starts again."""
    if single and target.is_dir():
        shutil.rmtree(target)
    elif not single and (target.is_file() or target.is_symlink()):
        target.unlink()


def _download(url: str, target: Path, relatives: list[str]) -> None:
    """Fetch objects into temporary names beside their places, then rename them in (a crash leaves no torn file
    under a real name); the client fetches them concurrently."""
    if not relatives:
        return
    remote, staged, final = [], [], []
    for rel in relatives:
        place = target / rel if rel else target
        place.parent.mkdir(parents=True, exist_ok=True)
        remote.append(f"{strip(url)}/{rel}" if rel else strip(url))
        staged.append(str(place.with_name(f".{place.name}.{os.getpid()}.part")))
        final.append(place)
    try:
        with translated(url):
            filesystem(url).get(remote, staged)
        for part, place in zip(staged, final):
            os.replace(part, place)
    finally:
        for part in staged:
            try:
                os.unlink(part)
            except FileNotFoundError:
                pass


def _placeholders(target: Path, sizes: dict[str, int]) -> None:
    for rel, size in sizes.items():
        place = target / rel
        place.parent.mkdir(parents=True, exist_ok=True)
        with open(place, "wb") as fh:
            fh.truncate(size)


def _remove_stale(target: Path, keep: set[str]) -> None:
    for folder, _, files in os.walk(target):
        for file in files:
            local = os.path.join(folder, file)
            if os.path.relpath(local, target).replace(os.sep, "/") not in keep:
                os.unlink(local)


def display(path) -> str:
    """How a report names `path`: a bucket mirror by its URL, anything else as given."""
    return cached_url_of(path) or str(path)


def cached_url_of(local) -> str | None:
    """The bucket URL whose mirror holds `local`, if any (reports name the URL, never the cache path)."""
    try:
        relative = Path(local).resolve().relative_to(_root().resolve())
    except ValueError:
        return None
    parts = relative.parts[1:] if relative.parts[:1] == (_SIZES_ONLY,) else relative.parts
    if len(parts) < 2 or parts[0] == _INDEX:
        return None
    proto = parts[0].split("@", 1)[0]
    return f"{proto}://" + "/".join(parts[1:])
