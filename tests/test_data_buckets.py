"""--data in a bucket (the GCS emulator and the S3 server on loopback, tests/storage_servers.py): globs, streamed
TFRecord files and --save-failures through exportkit.storage; on GCS, the Beam pipeline with its SDK harness in
other processes (FnApiRunner's multi_processing, a PortableRunner with an external worker pool) reading records
and model from the bucket; and `serve --model_base_path=gs://...` polling the bucket for a new version."""
from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from exportkit import storage
from exportkit.errors import UsageError
from exportkit.inputs.tfrecord import tfrecord_frame
from tests.storage_servers import _wait_listening, free_port, use_server

STATS = ("max_abs_err", "max_rel_err", "records", "failing_records", "mismatched", "abs_err_quantiles",
         "rel_err_quantiles", "required_atol", "reason")


def _use(server, monkeypatch, tmp_path, bucket: str):
    """(server, bucket URL), this process's clients pointed at the server, a fresh cache."""
    use_server(server, monkeypatch)
    monkeypatch.setenv("EXPORTKIT_CACHE_DIR", str(tmp_path / "cache"))
    return server, server.bucket(bucket)


@pytest.fixture
def gcs(gcs_server, monkeypatch, tmp_path):
    return _use(gcs_server, monkeypatch, tmp_path, "data-tests")


@pytest.fixture(params=["gcs", "s3"])
def store(request, monkeypatch, tmp_path):
    """The GCS emulator, then the S3 server."""
    return _use(request.getfixturevalue(f"{request.param}_server"), monkeypatch, tmp_path, "data-tests")


def _records(path: Path, records: list[bytes], gzipped: bool) -> Path:
    framed = b"".join(tfrecord_frame(r) for r in records)
    path.write_bytes(gzip.compress(framed) if gzipped else framed)
    return path


def test_bucket_globs_stream_records_as_local_disk_does(store, tmp_path):
    from exportkit.data.records import DataSource

    server, bucket = store
    local = tmp_path / "logs"
    (local / "sub").mkdir(parents=True)
    _records(local / "part-0.gz", [b"a%d" % i for i in range(300)], gzipped=True)
    _records(local / "part-1", [b"b%d" % i for i in range(5)], gzipped=False)
    _records(local / "sub" / "part-9", [b"c"], gzipped=False)  # a prefix the glob matches: not a file
    server.upload(local, f"{bucket}/logs")

    theirs = DataSource(f"{bucket}/logs/part-*", [], batch_size=64)
    ours = DataSource(f"{local}/part-*", [], batch_size=64)
    assert theirs.files == [f"{bucket}/logs/part-0.gz", f"{bucket}/logs/part-1"]
    assert theirs.sizes == ours.sizes and theirs.units == ours.units
    pairs = list(zip(theirs.batches(), ours.batches(), strict=True))
    assert [b.records for b, _ in pairs] == [b.records for _, b in pairs] and len(pairs) == 5
    assert [list(b.offsets) for b, _ in pairs] == [list(b.offsets) for _, b in pairs]

    with pytest.raises(UsageError, match="matches no file"):
        DataSource(f"{bucket}/logs/none-*,{bucket}/logs/missing", [])
    with pytest.raises(UsageError, match="no-such-bucket"):
        DataSource(f"{bucket.split(':')[0]}://no-such-bucket/logs/part-*", [])


def test_save_failures_in_a_bucket_are_whole_or_absent(store, tmp_path):
    from exportkit.data.records import DataSource, FailureWriter

    server, bucket = store
    source = DataSource(str(_records(tmp_path / "part-0", [b"r%d" % i for i in range(10)], gzipped=False)), [])
    (batch,) = source.batches()
    failing = np.zeros(10, dtype=bool)
    failing[[2, 7]] = True

    writer = FailureWriter(f"{bucket}/failures/aborted", source)
    writer.write(batch, failing)
    writer.close(commit=False)  # an interrupted run: nothing reaches the bucket
    assert server.keys(f"{bucket}/failures") == []

    writer = FailureWriter(f"{bucket}/failures/run", source)
    writer.write(batch, failing)
    writer.close(commit=True)
    assert server.keys(f"{bucket}/failures/run") == ["failures.index.jsonl", "failures.tfrecord"]
    if bucket.startswith("gs://"):  # the index is uploaded after what it indexes (a GCS generation is its write time)
        generation = {b.name: b.generation for b in server.client.list_blobs(bucket[5:], prefix="failures/run/")}
        assert generation["failures/run/failures.index.jsonl"] > generation["failures/run/failures.tfrecord"]
    saved = storage.read_bytes(f"{bucket}/failures/run/failures.tfrecord")
    assert saved == tfrecord_frame(b"r2") + tfrecord_frame(b"r7")
    lines = storage.read_bytes(f"{bucket}/failures/run/failures.index.jsonl").decode().splitlines()
    index = [json.loads(line) for line in lines]
    assert [(i["file"], i["index"]) for i in index] == [(source.files[0], 2), (source.files[0], 7)]

    missing = f"{bucket.split(':')[0]}://no-such-bucket"
    with pytest.raises(UsageError, match="the bucket no-such-bucket does not exist"):
        FailureWriter(f"{missing}/failures", source)


# ------------------------------------------------------------------------------- a model and its records in a bucket
@pytest.fixture(scope="module")
def ranker(gcs_server, tmp_path_factory):
    """A one-input model, its export (version 1), a drifted copy (last kernel x1.001) exported as version 2,
    and 400 tf.Example records in two GZIP files: on disk and uploaded to gs://data-models/."""
    import keras
    import tensorflow as tf

    from exportkit.export.pipeline import Progress, export_model
    from exportkit.options.export import export_options

    base = tmp_path_factory.mktemp("ranker")
    keras.utils.set_random_seed(5)
    x = keras.Input((4,), name="x")
    model = keras.Model({"x": x}, {"score": keras.layers.Dense(2, name="score")(keras.layers.Dense(8, "tanh")(x))})
    model.save(base / "model.keras")
    weights = model.get_weights()
    weights[-2] = weights[-2] * 1.001
    model.set_weights(weights)
    model.save(base / "drift.keras")
    for name, out in (("model", "export"), ("drift", "export2")):
        export_model(export_options(str(base / f"{name}.keras"), str(base / out), no_verify=True),
                     Progress(io.StringIO()))
    xs = np.random.default_rng(0).standard_normal((400, 4)).astype(np.float32)
    examples = [tf.train.Example(features=tf.train.Features(feature={
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=list(row)))})).SerializeToString() for row in xs]
    (base / "data").mkdir()
    for i in range(2):
        _records(base / "data" / f"part-{i}.tfrecord.gz", examples[200 * i:200 * (i + 1)], gzipped=True)
    bucket = gcs_server.bucket("data-models")
    gcs_server.upload(base / "export" / "1", f"{bucket}/ranker/1")
    gcs_server.upload(base / "data", f"{bucket}/data")
    return dict(base=base, bucket=bucket, version=f"{bucket}/ranker/1", data=f"{bucket}/data/part-*",
                drift=base / "drift.keras", drift_version=base / "export2" / "1")


def _verify(path, report: Path, **flags) -> tuple[int, dict]:
    """verify --data in this process: (exit code, the JSON report)."""
    from exportkit.options.source import source_options
    from exportkit.options.verify import VerifyOptions
    from exportkit.verify.command import verify_command

    code = verify_command(VerifyOptions(path=str(path), json_out=str(report), serving="none",
                                        runtimes="keras,saved_model", against=source_options(str(flags.pop("against"))),
                                        batch_size=50, **flags))
    return code, json.loads(report.read_text())


def _score(report) -> dict:
    (score,) = [o for r in report["runtimes"] if r["name"] == "saved_model" for o in r["outputs"]]
    return score


@pytest.fixture(scope="module")
def in_process(ranker, gcs_server, tmp_path_factory):
    """The in-process verify of the bucket's version on the bucket's records (what every runner must give)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        use_server(gcs_server, monkeypatch)
        monkeypatch.setenv("EXPORTKIT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        return _verify(ranker["version"], tmp_path_factory.mktemp("report") / "r.json", data=ranker["data"],
                       against=ranker["drift"])


@pytest.mark.slow
def test_verify_data_in_a_bucket_equals_local_disk(ranker, in_process, tmp_path):
    code, local = _verify(ranker["base"] / "export" / "1", tmp_path / "r.json",
                          data=str(ranker["base"] / "data" / "part-*"), against=ranker["drift"])
    bucket_code, remote = in_process
    assert code == bucket_code == 1  # the drift is caught, from the bucket as from disk
    assert remote["path"] == ranker["version"] and remote["inputs"]["files"] == 2
    ours, theirs = _score(local), _score(remote)
    assert theirs["records"] == 400 and theirs["max_abs_err"] > 1e-4
    assert {f: ours[f] for f in STATS} == {f: theirs[f] for f in STATS}
    def worst(score):
        return [(w["file"].rsplit("/", 1)[1], w["index"], w["abs_err"]) for w in score["worst_records"]]

    assert worst(ours) == worst(theirs)  # the same records, named by their URL
    assert all(w["file"].startswith(f"{ranker['bucket']}/data/part-") for w in theirs["worst_records"])


@contextlib.contextmanager
def _worker_pool(server, cache: Path):
    """Beam's external worker pool as its own process (how Flink and Dataflow run Python workers): it starts each
    worker as `python` from PATH (this environment's first) with its own environment: the emulator's variables and
    a cache of its own, so what the workers read they fetched themselves."""
    port = free_port()
    env = {**os.environ, **server.env, "EXPORTKIT_CACHE_DIR": str(cache),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    pool = subprocess.Popen([sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main",
                             f"--service_port={port}"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_listening(port, pool, "Beam's worker pool")
        yield port
    finally:
        family = [pool, *psutil.Process(pool.pid).children(recursive=True)]
        for process in family:
            process.terminate()
        psutil.wait_procs([psutil.Process(p.pid) for p in family if psutil.pid_exists(p.pid)], timeout=15)
        pool.wait()


@pytest.mark.slow
def _verify_cli(path, report: Path, data: str, against: Path, beam_options: list[str]) -> tuple[int, dict, str]:
    """verify --data --runner beam as the user runs it, in a process of its own (a Beam run leaves its runner's
    threads in the process that drove it): (exit code, the JSON report, stderr)."""
    options = [f"--beam-option={o}" for o in beam_options]
    proc = subprocess.run([sys.executable, "-m", "exportkit", "verify", str(path), "--json", str(report),
                           "--serving", "none", "--runtimes", "keras,saved_model", "--against", str(against),
                           "--batch-size", "50", "--data", data, "--runner", "beam", *options],
                          env=dict(os.environ), capture_output=True, text=True, timeout=600)
    return proc.returncode, json.loads(report.read_text()), proc.stderr


def test_beam_workers_in_other_processes_read_records_and_model_from_the_bucket(gcs, ranker, in_process, tmp_path):
    server, _ = gcs
    flags = dict(data=ranker["data"], against=ranker["drift"])
    in_code, in_process = in_process
    code, report, err = _verify_cli(ranker["version"], tmp_path / "m.json", **flags, beam_options=[
        "direct_running_mode=multi_processing", "direct_num_workers=2"])
    # the worker processes write on the driver's stderr: nothing (Beam's sdk_worker.py prints a failing bundle's
    # traceback there whatever the log level; exportkit closes it, the failure comes back as one message)
    assert "INFO:" not in err and "WARNING:root" not in err, err[-2000:]
    runs, stderrs = {"multi_processing": (code, report)}, [err]
    with _worker_pool(server, tmp_path / "pool-cache") as port:
        code, report, err = _verify_cli(ranker["version"], tmp_path / "p.json", **flags, beam_options=[
            "runner=PortableRunner", "job_endpoint=embed", "environment_type=EXTERNAL",
            f"environment_config=localhost:{port}", f"temp_location={ranker['bucket']}/tmp"])
        runs["portable"] = (code, report)
        stderrs.append(err)
    ours = _score(in_process)
    assert in_code == 1 and ours["records"] == 400
    for name, (beam_code, report) in runs.items():
        theirs = _score(report)
        assert beam_code == in_code and report["verdict"] == in_process["verdict"], name
        assert {f: ours[f] for f in STATS + ("worst_records",)} == {f: theirs[f] for f in STATS + ("worst_records",)}
    # the one local path is named to the user (workers elsewhere would not find it)
    warned = [line for err in stderrs for line in err.splitlines() if "on their own machines" in line]
    assert len(warned) == 1 and str(ranker["drift"]) in warned[0] and "gs://" not in warned[0], stderrs
    # the pool's workers mirrored the version from the bucket into their own cache; the results file is gone
    assert list((tmp_path / "pool-cache" / "storage").rglob("saved_model.pb"))
    assert server.keys(f"{ranker['bucket']}/tmp") == []


def _predict(address: str, version: int | None = None) -> tuple[int, np.ndarray]:
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "ranker"
    if version is not None:
        request.model_spec.version.value = version
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.ones((1, 4), np.float32)))
    with grpc.insecure_channel(address) as channel:
        answer = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=10)
    return answer.model_spec.version.value, tf.make_ndarray(answer.outputs["score"])


@pytest.mark.slow
@pytest.mark.serving
def test_serve_polls_the_bucket_and_serves_a_version_published_later(gcs, ranker, tmp_path):
    import grpc

    server, _ = gcs
    base = f"{ranker['bucket']}/served"
    server.upload(ranker["base"] / "export" / "1", f"{base}/1")
    env = {**os.environ, "EXPORTKIT_CACHE_DIR": str(tmp_path / "serve-cache")}
    serve = subprocess.Popen([sys.executable, "-m", "exportkit", "serve", f"--model_base_path={base}",
                              "--model_name=ranker", "--port=0", "--file_system_poll_wait_seconds=1",
                              # a poll may see version 2 before its saved_model.pb (docs/export.md): retried soon
                              "--load_retry_interval_micros=200000"],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        address = re.search(r"127\.0\.0\.1:\d+", serve.stdout.readline()).group(0)
        first, v1 = _predict(address)
        storage.publish_dir(ranker["drift_version"], f"{base}/2")  # as `export -o gs://...` publishes
        deadline = time.monotonic() + 60
        while True:
            try:
                second, v2 = _predict(address, 2)
                break
            except grpc.RpcError as err:  # NOT_FOUND until the poll has seen version 2 and loaded it
                assert err.code() == grpc.StatusCode.NOT_FOUND and time.monotonic() < deadline, err
                time.sleep(0.2)
        latest, _ = _predict(address)
    finally:
        serve.terminate()
        serve.wait(timeout=30)
    assert (first, second, latest) == (1, 2, 2)
    assert not np.array_equal(v1, v2)
