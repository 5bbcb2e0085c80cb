"""Object stores on loopback for the tests: the `gcp-storage-emulator` GCS emulator and moto's S3 server, each a
subprocess on a free port, filled and inspected with the real client libraries (google-cloud-storage, boto3).

    server.endpoint          'http://127.0.0.1:PORT'
    server.env               the clients' standard variables (STORAGE_EMULATOR_HOST / AWS_ENDPOINT_URL, ...), and
                             EXPORTKIT_CACHE_DIR, a cache of the server's own (tests/conftest.py)
    server.bucket(name)      create a bucket (if new): 'gs://name' / 's3://name'
    server.upload(src, url)  a file or a directory tree, with the real client
    server.keys(url)         the object names under a URL, with the real client
"""
from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_listening(port: int, proc: subprocess.Popen, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before listening on {port}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"{what} did not listen on {port} within {timeout:.0f} s")


def _files(src: Path):
    """(path, relative name) of a file, or of every file under a directory."""
    src = Path(src)
    if src.is_file():
        yield src, ""
        return
    for path in sorted(src.rglob("*")):
        if path.is_file():
            yield path, path.relative_to(src).as_posix()


def _die_with_parent() -> None:
    """A killed test session takes its servers with it (Linux PR_SET_PDEATHSIG), instead of leaving them bound."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


def _split(url: str) -> tuple[str, str]:
    bucket, _, key = url.split("://", 1)[1].partition("/")
    return bucket, key.strip("/")


class _Server:
    def __init__(self, argv: list[str], what: str):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([a.format(port=self.port) for a in argv], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        _wait_listening(self.port, self.proc, what)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class GcsServer(_Server):
    """gcp-storage-emulator in memory; google-cloud-storage as the client."""

    def __init__(self):
        super().__init__([sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1",
                          "--port", "{port}", "--in-memory", "-q"], "gcp-storage-emulator")
        self.env = {"STORAGE_EMULATOR_HOST": self.endpoint, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        self.client = storage.Client(project="exportkit-tests", credentials=AnonymousCredentials(),
                                     client_options={"api_endpoint": self.endpoint})

    def bucket(self, name: str) -> str:
        if self.client.lookup_bucket(name) is None:
            self.client.create_bucket(name)
        return f"gs://{name}"

    def upload(self, src, url: str) -> None:
        bucket_name, key = _split(url)
        bucket = self.client.bucket(bucket_name)
        for path, rel in _files(src):
            bucket.blob("/".join(p for p in (key, rel) if p)).upload_from_filename(str(path))

    def keys(self, url: str) -> list[str]:
        bucket_name, key = _split(url)
        prefix = f"{key}/" if key else ""
        return sorted(b.name[len(prefix):] for b in self.client.list_blobs(bucket_name, prefix=prefix))


class S3Server(_Server):
    """moto's server; boto3 as the client."""

    def __init__(self):
        moto = str(Path(sys.executable).with_name("moto_server"))
        super().__init__([moto, "-H", "127.0.0.1", "-p", "{port}"], "moto_server")
        self.env = {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                    "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
        import boto3

        self.client = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="testing",
                                   aws_secret_access_key="testing", region_name="us-east-1")

    def bucket(self, name: str) -> str:
        if name not in {b["Name"] for b in self.client.list_buckets().get("Buckets", [])}:
            self.client.create_bucket(Bucket=name)
        return f"s3://{name}"

    def upload(self, src, url: str) -> None:
        bucket, key = _split(url)
        for path, rel in _files(src):
            self.client.upload_file(str(path), bucket, "/".join(p for p in (key, rel) if p))

    def keys(self, url: str) -> list[str]:
        bucket, key = _split(url)
        prefix = f"{key}/" if key else ""
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(o["Key"][len(prefix):] for page in pages for o in page.get("Contents", []))


def use_server(server, monkeypatch) -> None:
    """Point this process's storage clients at `server` (monkeypatch undoes it after the test)."""
    from exportkit.storage import remote

    for name, value in server.env.items():
        monkeypatch.setenv(name, value)
    remote.forget_clients()
