"""exportkit.storage against a GCS emulator and an S3 server on loopback (tests/storage_servers.py), with the real
clients on both sides: paths and URLs, streaming reads, whole-or-nothing writes, the cache's revalidation, the
publish protocol, and the errors (exit 2 naming the URL, exit 3 in seconds, the missing extra's pip line)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from exportkit import storage
from exportkit.errors import InfraError, UsageError
from tests.storage_servers import free_port, use_server

pytestmark = pytest.mark.slow  # emulator processes and subprocesses (make test-fast runs none)


@pytest.fixture(params=["gcs", "s3"])
def store(request, monkeypatch, tmp_path):
    """(server, bucket URL) with this process's clients pointed at the server and a fresh cache directory."""
    server = request.getfixturevalue(f"{request.param}_server")
    use_server(server, monkeypatch)
    monkeypatch.setenv("EXPORTKIT_CACHE_DIR", str(tmp_path / "cache"))
    return server, server.bucket("storage-tests")


@pytest.fixture
def tree(tmp_path):
    """A small version-like tree: saved_model.pb, variables/, an empty assets/ (it cannot survive an upload)."""
    root = tmp_path / "tree"
    (root / "variables").mkdir(parents=True)
    (root / "assets").mkdir()
    (root / "saved_model.pb").write_bytes(b"pb" * 1000)
    (root / "variables" / "variables.index").write_bytes(b"index")
    (root / "variables" / "variables.data-00000-of-00001").write_bytes(os.urandom(3 * 1024 * 1024 + 7))
    return root


def test_urls_and_local_paths_need_no_client(tmp_path):
    assert storage.is_url("gs://b/x") and storage.is_url("S3://b/x") and storage.is_url("memory://x")
    assert not storage.is_url("file:///tmp/x") and not storage.is_url("models/gs:/x") and not storage.is_url("/a")
    assert storage.join("gs://b/", "/models/", "ranker/") == "gs://b/models/ranker"
    assert storage.join(str(tmp_path), "a", "b") == os.path.join(str(tmp_path), "a", "b")
    assert storage.name("gs://b/models/ranker/1/") == "1" and storage.parent("gs://b/models/ranker/1") == \
        "gs://b/models/ranker"
    with storage.open_write(tmp_path / "f.bin") as fh:
        fh.write(b"abc")
    assert storage.read_bytes(f"file://{tmp_path}/f.bin") == b"abc" and storage.size(tmp_path / "f.bin") == 3
    assert storage.listdir(tmp_path) == ["f.bin"] and storage.glob(f"{tmp_path}/*.bin") == [str(tmp_path / "f.bin")]
    assert storage.local_copy(tmp_path / "f.bin") == tmp_path / "f.bin"
    probe = "import sys; from exportkit import storage; storage.exists('/tmp'); storage.glob('/tmp/*'); " \
            "print(sorted(m for m in ('fsspec', 'gcsfs', 's3fs', 'boto3') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"  # local paths cost no client import


def test_read_list_and_write_in_a_bucket(store, tree):
    server, bucket = store
    base = storage.join(bucket, "rw")
    server.upload(tree, storage.join(base, "1"))
    version = storage.join(base, "1")
    assert storage.exists(version) and storage.isdir(version) and not storage.isdir(f"{version}/saved_model.pb")
    assert not storage.exists(f"{base}/2") and not storage.isdir(f"{base}/2")
    assert storage.listdir(version) == ["saved_model.pb", "variables"]  # the prefix is a child; empty assets/ is gone
    assert storage.listdir(base) == ["1"]
    assert storage.glob(f"{base}/*/variables/*.index") == [f"{version}/variables/variables.index"]
    data = (tree / "variables" / "variables.data-00000-of-00001").read_bytes()
    assert storage.size(f"{version}/variables/variables.data-00000-of-00001") == len(data)
    with storage.open_read(f"{version}/variables/variables.data-00000-of-00001") as fh:
        chunks = iter(lambda: fh.read(1 << 20), b"")
        assert b"".join(chunks) == data
    with storage.open_write(f"{base}/report.json") as fh:
        fh.write(b'{"passed": true}')
    assert storage.read_bytes(f"{base}/report.json") == b'{"passed": true}'
    with pytest.raises(RuntimeError), storage.open_write(f"{base}/never.json") as fh:
        fh.write(b"half")
        raise RuntimeError("the writer failed")
    assert "never.json" not in server.keys(base)  # an error uploads nothing


def test_staged_dir_lands_whole_or_not_at_all(store):
    """--save-inputs/--save-outputs DIR as a URL (inputs/npz.save_batch_sets): every file uploaded, or none."""
    import numpy as np

    from exportkit.inputs.npz import save_batch_sets

    server, bucket = store
    written = save_batch_sets(f"{bucket}/saved", {"session": [{"x": np.arange(3.0)}, {"x": np.ones(2)}]})
    assert written == [f"{bucket}/saved/session_batch_0.npz", f"{bucket}/saved/session_batch_1.npz"]
    with storage.open_read(written[1]) as fh:
        assert np.load(fh)["x"].tolist() == [1.0, 1.0]
    with pytest.raises(RuntimeError), storage.staged_dir(f"{bucket}/half", "--save-outputs") as stage:
        (stage / "a.npz").write_bytes(b"a")
        raise RuntimeError("the run failed")
    assert not storage.exists(f"{bucket}/half")


def test_local_copy_downloads_only_what_changed(store, tree):
    server, bucket = store
    url = storage.join(bucket, "cached", "1")
    server.upload(tree, url)
    first = storage.local_copy(url)
    assert sorted(p.relative_to(first).as_posix() for p in first.rglob("*") if p.is_file()) == \
        ["saved_model.pb", "variables/variables.data-00000-of-00001", "variables/variables.index"]
    assert (first / "saved_model.pb").read_bytes() == (tree / "saved_model.pb").read_bytes()
    stamps = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in first.rglob("*") if p.is_file()}
    assert storage.local_copy(url) == first
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in stamps} == stamps  # a second run downloads nothing
    (tree / "variables" / "variables.index").write_bytes(b"index, version two")
    server.upload(tree / "variables" / "variables.index", f"{url}/variables/variables.index")
    storage.local_copy(url)
    assert (first / "variables" / "variables.index").read_bytes() == b"index, version two"
    changed = [p.name for p, stamp in stamps.items() if (p.stat().st_ino, p.stat().st_mtime_ns) != stamp]
    assert changed == ["variables.index"]  # only the object whose generation/ETag changed
    single = storage.local_copy(f"{url}/saved_model.pb")
    assert single.is_file() and single.read_bytes() == (tree / "saved_model.pb").read_bytes()
    assert storage.cached_url_of(first) == url


def test_publish_dir_writes_saved_model_pb_last_and_leaves_no_staging(store, tree):
    server, bucket = store
    base = storage.join(bucket, "published")
    stale, young = f"{base}/.exportkit-staging-2-{int(time.time()) - 2 * 86400}-0f", \
        f"{base}/.exportkit-staging-2-{int(time.time()) - 1}-1e"  # a killed export's; one uploading now (a second
    # older than this test's publish: in the same second the random ids would decide which is older)
    for leftover in (stale, young):
        server.upload(tree / "saved_model.pb", f"{leftover}/saved_model.pb")
    storage.publish_dir(tree, f"{base}/3")
    assert not storage.exists(stale) and storage.exists(young)  # only the day-old staging is removed
    with pytest.raises(UsageError, match="being published .* by another export"):
        storage.publish_dir(tree, f"{base}/2")  # `young` (version 2) began before this one: it wins
    assert storage.exists(young) and not storage.exists(f"{base}/2")  # its files are left alone
    storage.remove_tree(young)
    assert server.keys(base) == ["3/saved_model.pb", "3/variables/variables.data-00000-of-00001",
                                 "3/variables/variables.index"]
    if server.__class__.__name__ == "GcsServer":  # generations order the writes
        blobs = {b.name: b.generation for b in server.client.list_blobs("storage-tests", prefix="published/3/")}
        assert max(blobs, key=blobs.get) == "published/3/saved_model.pb"
    with pytest.raises(UsageError, match="already exists"):
        storage.publish_dir(tree, f"{base}/3")
    with socket.socket(socket.AF_UNIX) as sock:  # a file no upload can read: the publish fails half-way
        sock.bind(str(tree / "variables" / "zz.sock"))
        with pytest.raises(Exception):
            storage.publish_dir(tree, f"{base}/4")
    assert [k for k in server.keys(base) if not k.startswith("3/")] == []  # no half version, no staging


def test_missing_bucket_and_object_are_usage_errors_naming_the_url(store):
    server, bucket = store
    with pytest.raises(UsageError, match=r"no such object or directory") as err:
        storage.read_bytes(f"{bucket}/nothing/here")
    assert f"{bucket}/nothing/here" in err.value.message
    with pytest.raises(UsageError, match="does not exist") as err:
        storage.local_copy(f"{bucket}-missing/models/ranker")
    assert "storage-tests-missing" in err.value.message
    assert not storage.exists(f"{bucket}-missing/x")
    with pytest.raises(UsageError):
        storage.listdir(f"{bucket}/nothing")


@pytest.mark.parametrize("scheme,variable", [("gs", "STORAGE_EMULATOR_HOST"), ("s3", "AWS_ENDPOINT_URL")])
def test_refused_endpoint_is_an_infra_error_in_seconds(scheme, variable, monkeypatch):
    monkeypatch.setenv(variable, f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    from exportkit.storage import remote

    remote.forget_clients()
    started = time.monotonic()
    with pytest.raises(InfraError, match="cannot reach the storage endpoint") as err:
        storage.exists(f"{scheme}://bucket/models/ranker")
    assert time.monotonic() - started < 10
    assert err.value.remedy and variable in err.value.remedy
    remote.forget_clients()


@pytest.mark.parametrize("scheme,variable", [("gs", "STORAGE_EMULATOR_HOST"), ("s3", "AWS_ENDPOINT_URL")])
def test_a_server_that_never_answers_is_an_infra_error_in_bounded_time(scheme, variable, monkeypatch):
    """It accepts connections and says nothing (the clients alone retried a GCS call for 219 s): the whole call
    is bounded (remote.CALL_TIMEOUT_S, 20 s; shortened here to keep the test short)."""
    from exportkit.storage import remote

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        monkeypatch.setenv(variable, f"http://127.0.0.1:{silent.getsockname()[1]}")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        monkeypatch.setattr(remote, "CALL_TIMEOUT_S", 2.0)
        monkeypatch.setattr(remote, "READ_TIMEOUT_S", 1.0)
        remote.forget_clients()
        started = time.monotonic()
        with pytest.raises(InfraError, match="did not answer in time"):
            storage.exists(f"{scheme}://bucket/models/ranker")
        assert time.monotonic() - started < 8
    remote.forget_clients()


def test_no_credentials_is_an_infra_error(s3_server, monkeypatch):
    use_server(s3_server, monkeypatch)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    bucket = s3_server.bucket("storage-tests")
    with pytest.raises(InfraError, match="no credentials") as err:
        storage.read_bytes(f"{bucket}/anything")
    assert "AWS_ACCESS_KEY_ID" in err.value.remedy
    from exportkit.storage import remote

    remote.forget_clients()


def test_a_url_without_a_bucket_is_a_usage_error():
    """'gs://' was stripped to the local path 'gs:' (verify: exit 3, FileNotFoundError); 'gs:///x' was 'no such
    object'; export -o gs:// a TypeError."""
    from exportkit.export.pipeline import export_model
    from exportkit.options.export import ExportOptions
    from exportkit.savedmodel.versions import resolve_savedmodel_dir

    for call in (lambda: resolve_savedmodel_dir("gs://"), lambda: resolve_savedmodel_dir("s3:///models/m"),
                 lambda: storage.listdir("gs:///x"), lambda: storage.glob("s3:///logs/*.gz")):
        with pytest.raises(UsageError, match="names no bucket"):
            call()
    with pytest.raises(UsageError, match=r"^-o gs://: the URL names no bucket"):
        export_model(ExportOptions(source=None, output="gs://"))  # before the source is looked at


def test_a_request_gcsfs_gives_up_on_prints_no_traceback():
    """gcsfs logs what it gives up on with logger.exception; without a handler Python printed that traceback above
    exportkit's message (seen with a server hung mid-read). Here a loopback server answers 400 (not retried)."""
    import http.server
    import json
    import threading

    class Refuse(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"error": {"code": 400, "message": "refused here"}}).encode()
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    probe = ("from exportkit import storage\n"
             "try:\n    storage.exists('gs://bk/x')\nexcept Exception as err:\n    print(type(err).__name__, err)\n")
    env = {**os.environ, "STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{server.server_address[1]}"}
    try:
        proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env)
    finally:
        server.shutdown()
    assert proc.stdout.startswith("InfraError gs://bk/x: the storage service failed") and "refused here" in proc.stdout
    assert "Traceback" not in proc.stderr and "refused here" not in proc.stderr, proc.stderr


def test_a_missing_extra_names_the_pip_line():
    blocker = ("import sys\n"
               "class Block:\n"
               "    def find_spec(self, name, path=None, target=None):\n"
               "        if name.split('.')[0] in ('gcsfs', 's3fs'):\n"
               "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
               "sys.meta_path.insert(0, Block())\n"
               "from exportkit import storage\n"
               "from exportkit.errors import UsageError\n"
               "for url in ('gs://b/x', 's3://b/x'):\n"
               "    try:\n"
               "        storage.exists(url)\n"
               "    except UsageError as err:\n"
               "        print(err)\n")
    out = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True, timeout=60).stdout
    assert "pip install 'exportkit[gcs]'" in out and "pip install 'exportkit[s3]'" in out, out
