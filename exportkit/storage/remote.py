"""The object-store clients behind bucket URLs (fsspec's gcsfs and s3fs, or any installed fsspec protocol): made
once per protocol with bounded timeouts, and their failures said as exportkit's errors (a missing bucket or
object: exit 2 naming the URL; no credentials, a refused or unreachable endpoint: exit 3, in seconds)."""
from __future__ import annotations

import logging
import os
import sys
import socket
import threading
from contextlib import contextmanager
from urllib.parse import urlsplit

from exportkit.errors import ExportkitError, InfraError, UsageError
from exportkit.storage.urls import protocol, split

# The extra that installs each protocol's client (pyproject.toml), and the module fsspec needs for it.
EXTRAS = {"gs": ("gcs", "gcsfs"), "gcs": ("gcs", "gcsfs"), "s3": ("s3", "s3fs"), "s3a": ("s3", "s3fs")}
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 20.0  # without a byte from the server (per request; the clients retry)
# A whole listing or metadata call, retries included (gcsfs alone retries a hung server for minutes): passed as
# fsspec's `timeout=`. Transfers (get, put, cat) are bounded per request by READ_TIMEOUT_S only.
CALL_TIMEOUT_S = 20.0

_lock = threading.Lock()
# gcsfs logs each request it gives up on with logger.exception; with no handler anywhere, Python's last-resort handler
# printed that traceback on stderr above exportkit's own one-line message (a hung server mid-read). A caller who
# configures logging still gets them.
logging.getLogger("gcsfs").addHandler(logging.NullHandler())
_filesystems: dict[tuple[str, int], object] = {}  # by protocol and process: the clients are not fork-safe
_reachable: set[str] = set()


def bounded(fs) -> dict:
    """The keyword that bounds a whole call of `fs` (fsspec's async filesystems take `timeout=`)."""
    return {"timeout": CALL_TIMEOUT_S} if getattr(fs, "async_impl", False) else {}


def endpoint(proto: str) -> str | None:
    """The endpoint the client will call, from the clients' standard environment, else the cloud's (None: another
    protocol, whose client knows its own)."""
    if proto in ("gs", "gcs"):
        host = os.environ.get("STORAGE_EMULATOR_HOST")
        if host and "://" not in host:
            host = f"http://{host}"
        return host or "https://storage.googleapis.com"
    if proto in ("s3", "s3a"):
        return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "https://s3.amazonaws.com"
    return None


def _check_reachable(url: str, proto: str) -> None:
    """One TCP connect to the endpoint per process, so a stopped emulator or no network is exit 3 in seconds
    (gcsfs alone retries a refused connection for ~30 s, botocore for ~13 s)."""
    address = endpoint(proto)
    if not address or address in _reachable:
        return
    parts = urlsplit(address)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as err:
        variable = "STORAGE_EMULATOR_HOST" if proto in ("gs", "gcs") else "AWS_ENDPOINT_URL"
        raise InfraError(f"cannot reach the storage endpoint {address} for {url}: {err.strerror or err}",
                         f"start the storage service (or fix {variable} / the network) and run it again") from None
    _reachable.add(address)


def _import_gcsfs() -> None:
    """gcsfs asks an emulator a gRPC question it cannot answer and waits 60 s per bucket (DESIGN.md) unless
    GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false when it is imported; set only for that import, so the environment the
    user gave is the one every process exportkit starts gets (a forked worker's must equal a fresh one's)."""
    variable = "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"
    if "gcsfs" in sys.modules or not os.environ.get("STORAGE_EMULATOR_HOST") or variable in os.environ:
        return
    os.environ[variable] = "false"
    try:
        import gcsfs  # noqa: F401
    finally:
        del os.environ[variable]


def _make(proto: str):
    if proto in ("gs", "gcs"):
        import aiohttp

        _import_gcsfs()
        import gcsfs

        timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=READ_TIMEOUT_S)
        return gcsfs.GCSFileSystem(requests_timeout=timeout, use_listings_cache=False, skip_instance_cache=True)
    if proto in ("s3", "s3a"):
        import s3fs

        config = {"connect_timeout": CONNECT_TIMEOUT_S, "read_timeout": READ_TIMEOUT_S,
                  "retries": {"max_attempts": 2, "mode": "standard"}}
        return s3fs.S3FileSystem(config_kwargs=config, use_listings_cache=False, skip_instance_cache=True)
    import fsspec

    return fsspec.filesystem(proto, use_listings_cache=False)


def require_bucket(url: str, what: str = "") -> None:
    """A URL without a bucket name ('gs://', 'gs:///x') is a usage error, before any client is asked (stripping
    its slashes would make 'gs://' the local path 'gs:'); `what`: the flag, as in translate_error."""
    if not split(url)[1]:
        raise UsageError(f"{what + ' ' if what else ''}{url}: the URL names no bucket",
                         "spell it PROTOCOL://BUCKET/PATH (e.g. gs://my-bucket/models/ranker)")


def filesystem(url: str):
    """The fsspec filesystem for `url`'s protocol (made on first use; the endpoint checked once)."""
    require_bucket(url)
    proto = protocol(url)
    key = (proto, os.getpid())
    with _lock:
        if key not in _filesystems:
            try:
                _filesystems[key] = _make(proto)
            except ImportError as err:
                extra, module = EXTRAS.get(proto, (None, err.name or "its fsspec implementation"))
                install = f"pip install 'exportkit[{extra}]'" if extra else f"pip install {module}"
                raise UsageError(f"{url}: {proto}:// URLs need the {module} package, which is not installed",
                                 f"install it: `{install}`") from None
            except ValueError as err:  # fsspec: "Protocol not known"
                raise UsageError(f"{url}: {err}", "use a local path or a gs:// or s3:// URL") from None
        _check_reachable(url, proto)
        return _filesystems[key]


def strip(url: str) -> str:
    """The path fsspec's calls take: 'gs://b/x/' -> 'b/x'."""
    _, bucket, key = split(url)
    return f"{bucket}/{key}" if key else bucket


def _bucket_missing(url: str) -> bool:
    fs = _filesystems.get((protocol(url), os.getpid()))
    try:
        return fs is not None and not fs.exists(split(url)[1], **bounded(fs))
    except Exception:  # noqa: BLE001 - only chooses the message's words
        return False


def _credentials_error(err: BaseException) -> bool:
    names = {cls.__name__ for cls in type(err).__mro__}
    code = getattr(err, "code", None) or getattr(err, "status", None)
    return bool(names & {"NoCredentialsError", "PartialCredentialsError", "DefaultCredentialsError",
                         "RefreshError", "GoogleAuthError"}) or code in (401, 403) or isinstance(err, PermissionError)


def translate_error(err: BaseException, url: str, what: str = "") -> ExportkitError:
    """An object-store client's exception as exportkit's error about `url` (`what`: the flag or argument)."""
    about = what if url in what else f"{what} {url}" if what else url  # `what`: "-o" or "--json gs://b/r.json"
    if isinstance(err, ExportkitError):
        return err
    if isinstance(err, FileNotFoundError):
        _, bucket, _ = split(url)
        if _bucket_missing(url):
            return UsageError(f"{about}: the bucket {bucket} does not exist",
                              "check the URL's bucket name (and that you point at the right project/endpoint)")
        return UsageError(f"{about}: no such object or directory", "check the URL (list it with gsutil ls / aws s3 ls)")
    if type(err).__name__ in ("FSTimeoutError", "TimeoutError", "ReadTimeoutError", "ConnectTimeoutError"):
        return InfraError(f"{about}: the storage service did not answer in time (connect {CONNECT_TIMEOUT_S:.0f} s, "
                          f"read {READ_TIMEOUT_S:.0f} s, a listing {CALL_TIMEOUT_S:.0f} s)",
                          "check the storage endpoint and network, then run it again")
    if isinstance(err, (IsADirectoryError, NotADirectoryError)):
        return UsageError(f"{about}: {err}", "check the URL: a directory where a file is expected, or the other way")
    reason = " ".join(str(err).split()) or type(err).__name__
    if len(reason) > 300:
        reason = reason[:300] + "..."
    if _credentials_error(err):
        how = {"gs": "`gcloud auth application-default login` or GOOGLE_APPLICATION_CREDENTIALS",
               "s3": "AWS_PROFILE, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or an instance role"}
        return InfraError(f"{about}: access denied or no credentials ({reason})",
                          f"give this process credentials that may read the bucket "
                          f"({how.get(protocol(url), 'the client library documents how')}) and run it again")
    return InfraError(f"{about}: the storage service failed ({type(err).__name__}: {reason})",
                      "check the storage endpoint and network, then run it again")


def not_found(url: str, what: str = "") -> ExportkitError:
    """The UsageError for a URL that names nothing (saying so when its bucket does not exist)."""
    return translate_error(FileNotFoundError(url), url, what)


@contextmanager
def translated(url: str, what: str = ""):
    """Run a client call; its failure leaves as exportkit's error about `url`."""
    try:
        yield
    except ExportkitError:
        raise
    except Exception as err:  # noqa: BLE001 - every client failure gets one message and an exit code
        raise translate_error(err, url, what) from None


def forget_clients() -> None:
    """Drop the clients made so far (the next call reads the environment again: another endpoint, new keys)."""
    with _lock:
        _filesystems.clear()
        _reachable.clear()
