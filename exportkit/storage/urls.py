"""Which user paths are bucket URLs, and joining and naming them the way object stores spell them ('/' only)."""
from __future__ import annotations

import os
import re

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def protocol(path) -> str | None:
    """'gs' for 'gs://b/x' (lower case); None for a local path (file:// included: it is a local path)."""
    match = _SCHEME.match(str(path))
    if not match or match.group(1).lower() == "file":
        return None
    return match.group(1).lower()


def is_url(path) -> bool:
    """True for 'gs://b/x', 's3://b/x' and other fsspec 'proto://' URLs; False for local paths and file://."""
    return protocol(path) is not None


def local_path(path) -> str:
    """A local path as the OS takes it: 'file:///x' -> '/x', '~/m' -> '/home/u/m'."""
    text = os.fspath(path)
    if text[:7].lower() == "file://":
        text = text[7:]
    return os.path.expanduser(text)


def join(base, *parts: str) -> str:
    """`base`/part/... for local paths (os.path.join) and URLs ('/', no doubled slashes)."""
    if not is_url(base):
        return os.path.join(os.fspath(base), *parts)
    out = str(base).rstrip("/")
    for part in parts:
        part = str(part).strip("/")
        if part:
            out = f"{out}/{part}"
    return out


def split(url: str) -> tuple[str, str, str]:
    """'gs://b/a/c' -> ('gs', 'b', 'a/c')."""
    proto = protocol(url)
    rest = str(url)[len(proto) + 3:]
    bucket, _, key = rest.partition("/")
    return proto, bucket, key.strip("/")


def bucket(url: str) -> str:
    """'gs://b/models/x' -> 'gs://b'."""
    proto, name_, _ = split(url)
    return f"{proto}://{name_}"


def name(path) -> str:
    """The last component: 'gs://b/models/ranker/1/' -> '1' (for a bucket root, the bucket)."""
    return str(path).rstrip("/").rsplit("/", 1)[-1] if is_url(path) else os.path.basename(os.fspath(path).rstrip("/"))


def parent(path) -> str:
    """The URL or path one level up: 'gs://b/models/ranker/1' -> 'gs://b/models/ranker'."""
    if not is_url(path):
        return os.path.dirname(os.fspath(path).rstrip("/"))
    proto, bucket, key = split(path)
    return f"{proto}://{bucket}/{key.rpartition('/')[0]}".rstrip("/")
