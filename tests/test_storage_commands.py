"""The commands on models in buckets (issue 49): a ranker exported twice by keras' own `model.export`, uploaded with
google-cloud-storage / boto3 to the loopback servers (tests/storage_servers.py), and the CLI run on its URLs as a
user runs it: the same verdicts as on disk, reports naming the URL, no weights downloaded by inspect, export -o
publishing into the bucket, and the error cases' exit codes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import invoke, run_cli
from tests.storage_servers import free_port, use_server

pytestmark = pytest.mark.slow

_BUILD = """
import sys
import keras
inp = keras.Input((4,), name="x")
model = keras.Model(inp, keras.layers.Dense(3, name="score")(keras.layers.Dense(8, activation="relu")(inp)))
model.save(sys.argv[1] + "/model.keras")
model.export(sys.argv[1] + "/ranker/1")
model.layers[-1].kernel.assign(model.layers[-1].kernel * 1.01)
model.export(sys.argv[1] + "/ranker/2")
"""


@pytest.fixture(scope="module")
def ranker(tmp_path_factory):
    """model.keras and ranker/1, ranker/2 written by keras' model.export (empty assets/ dirs included)."""
    root = tmp_path_factory.mktemp("ranker")
    subprocess.run([sys.executable, "-c", _BUILD, str(root)], check=True, capture_output=True, timeout=300,
                   env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    return root


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """The module's own cache directory (bucket mirrors under storage/), seeded with the installed TensorFlow's op
    registry when the user's cache has it, so that inspect and verify do not list TensorFlow's ops again."""
    import shutil

    from exportkit.files import cache_dir

    root = tmp_path_factory.mktemp("cache")
    for registry in cache_dir().glob("ops-*.json"):
        shutil.copy(registry, root / registry.name)
    return root


def _env(server, cache) -> dict:
    return {**server.env, "EXPORTKIT_CACHE_DIR": str(cache)}


@pytest.fixture
def cli(monkeypatch, tmp_path, cache):
    """cli(server, *args): the CLI in this process (TensorFlow imported once), its clients and any worker process
    pointed at `server`, with the module's cache; the working directory is tmp_path."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EXPORTKIT_CACHE_DIR", str(cache))

    def run(server, *args):
        use_server(server, monkeypatch)
        monkeypatch.setenv("EXPORTKIT_CACHE_DIR", str(cache))  # not the server's own (use_server sets it)
        return invoke(*args)

    return run


def test_inspect_and_verify_a_base_dir_in_a_bucket(gcs_server, ranker, tmp_path, cli, cache):
    bucket = gcs_server.bucket("cmd-inspect")
    gcs_server.upload(ranker / "ranker", f"{bucket}/ranker")
    local = cli(gcs_server, "inspect", ranker / "ranker", "--json")
    remote = cli(gcs_server, "inspect", f"{bucket}/ranker", "--json")
    assert remote.returncode == 0, remote.stderr
    doc, expected = json.loads(remote.stdout), json.loads(local.stdout)
    assert doc["path"] == f"{bucket}/ranker/2"  # the URL, not the cache
    assert doc["variables_bytes"] == expected["variables_bytes"] > 0 and doc["signatures"] == expected["signatures"]
    import exportkit

    assert exportkit.inspect(f"{bucket}/ranker").path == f"{bucket}/ranker/2"  # the Python API reads URLs too
    shards = list((cache / "storage" / "sizes-only").glob("gs@*/cmd-inspect/ranker/2/variables/variables.data-*"))
    assert shards and all(p.stat().st_blocks == 0 for p in shards)  # sizes listed, weights not downloaded

    import numpy as np

    np.savez(tmp_path / "rows.npz", x=np.ones((2, 4), np.float32))
    gcs_server.upload(tmp_path / "rows.npz", f"{bucket}/inputs/rows.npz")
    verified = cli(gcs_server, "verify", f"{bucket}/ranker", "--inputs", f"{bucket}/inputs/rows.npz",
                   "--json", tmp_path / "v.json")
    assert verified.returncode == 0, verified.stderr[-2000:]
    report = json.loads((tmp_path / "v.json").read_text())
    assert "file" in report["inputs"]["source"]  # --inputs read from the bucket
    assert report["path"] == f"{bucket}/ranker/2" and report["baseline"]["old"] == f"{bucket}/ranker/1"
    assert str(cache) not in verified.stdout
    assert verified.stdout.splitlines()[-1].startswith("PASSED")


def test_diff_and_compat_on_s3(s3_server, ranker, tmp_path, cli):
    bucket = s3_server.bucket("cmd-diff")
    s3_server.upload(ranker / "ranker", f"{bucket}/ranker")
    diff = cli(s3_server, "diff", f"{bucket}/ranker")
    assert diff.returncode == 0, diff.stderr[-2000:]
    assert f"old: {bucket}/ranker/1" in diff.stdout and f"new: {bucket}/ranker/2" in diff.stdout
    compat = cli(s3_server, "compat", f"{bucket}/ranker/1", "--json", tmp_path / "c.json")
    assert compat.returncode == 0, compat.stderr[-2000:]
    assert json.loads((tmp_path / "c.json").read_text())["path"] == f"{bucket}/ranker/1"


def test_export_publishes_into_the_bucket(gcs_server, ranker, tmp_path, cli):
    """(S3's publish is storage-level: test_storage.py; the export's path to it is the same for every protocol.)"""
    server, scheme = gcs_server, "gs"
    bucket = server.bucket("cmd-export")
    done = cli(server, "export", ranker / "model.keras", "-o", f"{bucket}/fresh")
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"PASSED: exported {bucket}/fresh/1" in done.stdout
    assert not (tmp_path / f"{scheme}:").exists()  # nothing written locally under a mangled URL
    keys = server.keys(f"{bucket}/fresh")
    assert {"1/saved_model.pb", "1/variables/variables.index", "1/assets.extra/exportkit/manifest.json"} <= set(keys)
    assert all(k.startswith("1/") for k in keys)  # no staging prefix left
    # the published version (keras' empty assets/ did not survive the upload) verifies from the bucket
    verified = cli(server, "verify", f"{bucket}/fresh", "--runtimes", "golden,session", "--json", f"{bucket}/v.json")
    assert verified.returncode == 0, verified.stderr[-2000:]
    assert "v.json" in server.keys(bucket)  # the report file went to the bucket too
    again = cli(server, "export", ranker / "model.keras", "-o", f"{bucket}/fresh", "--version", "1")
    assert again.returncode == 2 and "already exists" in again.stderr and "Traceback" not in again.stderr


def test_errors_name_the_url_and_take_their_exit_codes(gcs_server, ranker, cache):
    env = _env(gcs_server, cache)
    nowhere = run_cli("export", ranker / "model.keras", "-o", "gs://no-such-bucket/ranker", env=env)
    assert nowhere.returncode == 2 and "-o gs://no-such-bucket/ranker: the bucket no-such-bucket does not exist" \
        in nowhere.stderr  # refused before the model is loaded
    missing = run_cli("verify", "gs://no-such-bucket/models/ranker", env=env)
    assert missing.returncode == 2 and "the bucket no-such-bucket does not exist" in missing.stderr
    nothing = run_cli("inspect", f"{gcs_server.bucket('cmd-errors')}/models/none", env=env)
    assert nothing.returncode == 2 and "gs://cmd-errors/models/none" in nothing.stderr
    started = time.monotonic()
    down = run_cli("verify", "gs://models/ranker", env={**env, "STORAGE_EMULATOR_HOST": f"127.0.0.1:{free_port()}"})
    assert down.returncode == 3 and "cannot reach the storage endpoint" in down.stderr
    assert time.monotonic() - started < 20
    for proc in (nowhere, missing, nothing, down):
        assert "Traceback" not in proc.stderr and "fix:" in proc.stderr
