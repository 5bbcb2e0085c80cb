"""Every user path, local or in a bucket (gs://, s3://, other fsspec protocols): the one place exportkit opens,
lists, reads and writes them. A local path goes straight to the OS; a URL goes through its client (the [gcs] and
[s3] extras), configured by the clients' own environment (STORAGE_EMULATOR_HOST, AWS_ENDPOINT_URL, credentials).

urls (names) -> remote (clients, errors) -> access (read, list, write) -> cache (local mirrors), publish (versions).
"""
from exportkit.storage.access import (exists, glob, isdir, listdir, open_read, open_write, read_bytes, remove_tree,
                                      size, staged_dir, upload_tree)
from exportkit.storage.cache import cached_url_of, display, local_copy
from exportkit.storage.publish import publish_dir
from exportkit.storage.remote import not_found, require_bucket
from exportkit.storage.urls import bucket, is_url, join, local_path, name, parent, protocol

__all__ = ["bucket", "cached_url_of", "display", "exists", "glob", "is_url", "isdir", "join", "listdir", "local_copy", "local_path",
           "name", "not_found", "open_read", "open_write", "parent", "protocol", "publish_dir", "read_bytes", "remove_tree",
           "require_bucket", "size", "staged_dir", "upload_tree"]
