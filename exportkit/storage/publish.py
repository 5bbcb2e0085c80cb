"""Publishing a SavedModel version directory into a bucket so TF Serving's poller never loads it half-written.

TF Serving polls the model base path and aspires version N as soon as a child named N appears
(tensorflow_serving/sources/storage_path/file_system_storage_path_source.cc: on GCS, GetChildren returns every
descendant and the poller keeps each one's first path component, then parses it as an integer). An object store
has no atomic rename, so the version's files are uploaded (the slow part) under a staging prefix whose first
component is not a number, which the poller ignores; they are then copied server-side into base/N/ with
saved_model.pb last, and the staging prefix is deleted. Of two exports racing for N, the older staging copies and
the other stops. On any failure the staging is deleted, and base/N too once this export began copying into it.
docs/export.md says what window remains.
"""
from __future__ import annotations

import os
import re
import time
import uuid

from exportkit.errors import InfraError, UsageError
from exportkit.log import log
from exportkit.storage.access import exists, isdir, listdir, open_write, remove_tree, upload_tree
from exportkit.storage.remote import bounded, filesystem, strip, translated
from exportkit.storage.urls import join, local_path, name, parent

STAGING_PREFIX = ".exportkit-staging-"
# .exportkit-staging-<version>-<unix time>-<random>: a killed export's is removed by the next publish after a day
_STAGING = re.compile(re.escape(STAGING_PREFIX) + r"(?P<version>\d+)-(?P<time>\d+)-(?P<id>[0-9a-f]+)")
RESERVATION = ".exportkit-reservation"  # written first: the staging is visible to a rival before the long upload
STALE_AFTER_S = 24 * 3600
# Written last: the loader looks for these (tensorflow/cc/saved_model/loader.cc via reader.cc ReadSavedModel).
_LAST = ("saved_model.pb", "saved_model.pbtxt")


def publish_dir(local_dir, url: str) -> None:
    """Upload the version directory `local_dir` to `url` (base/N); refuses an existing `url`."""
    url = str(url).rstrip("/")
    if exists(url):
        raise UsageError(f"{url} already exists", "export to a new version number (or delete that version first)")
    _remove_stale_staging(parent(url))
    staging = join(parent(url), f"{STAGING_PREFIX}{name(url)}-{int(time.time())}-{uuid.uuid4().hex[:12]}")
    fs = filesystem(url)
    copying = False  # base/N is ours to delete only once we copy into it
    try:
        with open_write(join(staging, RESERVATION)):
            pass
        uploaded = upload_tree(local_dir, staging)
        _check_no_rival(url, staging)
        copying = True
        relatives = sorted(u[len(staging) + 1:] for u in uploaded)
        first = [rel for rel in relatives if rel not in _LAST]
        last = [rel for rel in relatives if rel in _LAST]
        with translated(url):
            for group in (first, last):  # saved_model.pb only once everything it needs is in place
                if group:
                    fs.copy([strip(join(staging, rel)) for rel in group], [strip(join(url, rel)) for rel in group])
        _check_complete(local_dir, url)
    except BaseException:
        if copying:
            _clean(url)
        _clean(staging)
        raise
    _clean(staging)
    log.debug("storage: published %s (%d files)", url, len(relatives))


def _check_no_rival(url: str, staging: str) -> None:
    """Two exports publishing the same version at once (each chose it before the other's upload showed): the one
    whose staging is older copies, the other stops. Every staging is listed before its upload and deleted only after
    its copy, so a rival sees either it or the finished base/N."""
    mine = _STAGING.fullmatch(name(staging))
    key = (int(mine.group("time")), mine.group("id"))
    for child in listdir(parent(url)):
        other = _STAGING.fullmatch(child)
        if (other and other.group("version") == mine.group("version") and child != name(staging)
                and (int(other.group("time")), other.group("id")) < key
                and time.time() - int(other.group("time")) <= STALE_AFTER_S):
            raise UsageError(f"version {name(url)} is being published into {parent(url)} by another export right now",
                             "export again when it is done (the next free version number is taken then)")
    if exists(url):
        raise UsageError(f"{url} was written by someone else while this export ran",
                         "export again (the next free version number is taken then)")


def _remove_stale_staging(base: str) -> None:
    """Staging prefixes a killed export left (SIGKILL, a lost machine: nothing could clean up) more than a day ago;
    a younger one may be an export still uploading."""
    if not isdir(base):
        return
    for child in listdir(base):
        match = _STAGING.fullmatch(child)
        if match and time.time() - int(match.group("time")) > STALE_AFTER_S:
            log.warning("storage: removing %s, left by an export that did not finish", join(base, child))
            _clean(join(base, child))


def _check_complete(local_dir, url: str) -> None:
    """Every local file is at `url` with its size: a copy the service silently dropped is caught here."""
    root = local_path(local_dir)
    expected = {}
    for folder, _, files in os.walk(root):
        for file in files:
            path = os.path.join(folder, file)
            expected[os.path.relpath(path, root).replace(os.sep, "/")] = os.path.getsize(path)
    fs = filesystem(url)
    with translated(url):
        found = fs.find(strip(url), detail=True, **bounded(fs))
    prefix = strip(url) + "/"
    got = {key[len(prefix):]: int(info.get("size") or 0) for key, info in found.items() if key.startswith(prefix)}
    if got != expected:
        missing = sorted(set(expected) - set(got)) or sorted(k for k in expected if got.get(k) != expected[k])
        raise InfraError(f"{url}: the upload is incomplete ({', '.join(missing[:3])} missing or of another size)",
                         "run the export again; nothing was left in the bucket")


def _clean(url: str) -> None:
    try:
        remove_tree(url)
    except Exception as err:  # noqa: BLE001 - cleaning up after a failure must not hide that failure
        log.warning("storage: could not delete %s: %s; delete it by hand", url, err)
