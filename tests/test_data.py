"""verify --data: records from TFRecord (plain, GZIP) and npz shards through the runtimes, streamed statistics,
errors that name the record, and the Beam runner agreeing with the in-process one."""
from __future__ import annotations

import json
import math
import tempfile
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from conftest import invoke

RECORDS = 300  # per file


def _example(x, k) -> bytes:
    import tensorflow as tf

    feature = {}
    if x is not None:
        feature["x"] = tf.train.Feature(float_list=tf.train.FloatList(value=list(x)))
    if k is not None:
        feature["k"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(k)]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _write(path, records, gzip=False) -> str:
    import tensorflow as tf

    with tf.io.TFRecordWriter(str(path), "GZIP" if gzip else None) as w:
        for r in records:
            w.write(r)
    return str(path)


@pytest.fixture(scope="session")
def data(tmp_path_factory):
    """A two-input model (float x[4], int32 k), a drifted copy (last kernel x1.001), its export, a plain and a
    GZIP TFRecord file and an npz shard of the same inputs."""
    import keras

    from exportkit.export.pipeline import Progress, export_model
    from exportkit.options.export import export_options

    import io

    base = tmp_path_factory.mktemp("data")
    keras.utils.set_random_seed(3)
    x = keras.Input((4,), name="x")
    k = keras.Input((), name="k", dtype="int32")
    h = keras.layers.Dense(8, activation="tanh")(x)
    e = keras.layers.Flatten()(keras.layers.Embedding(10, 4)(keras.layers.Reshape((1,))(k)))
    y = keras.layers.Dense(2, name="score")(keras.layers.Concatenate()([h, e]))
    model = keras.Model({"x": x, "k": k}, {"score": y})
    model.save(base / "model.keras")
    weights = model.get_weights()
    weights[-2] = weights[-2] * 1.001
    model.set_weights(weights)
    model.save(base / "drift.keras")
    version = export_model(export_options(str(base / "model.keras"), str(base / "export"), no_verify=True),
                           Progress(io.StringIO())).path

    rng = np.random.default_rng(0)
    xs = rng.standard_normal((2 * RECORDS, 4)).astype(np.float32)
    ks = rng.integers(0, 10, 2 * RECORDS)
    plain = _write(base / "part-0.tfrecord", [_example(a, b) for a, b in zip(xs[:RECORDS], ks[:RECORDS])])
    gz = _write(base / "part-1.tfrecord.gz", [_example(a, b) for a, b in zip(xs[RECORDS:], ks[RECORDS:])], gzip=True)
    np.savez(base / "shard-0.npz", x=xs[:RECORDS], k=ks[:RECORDS].astype(np.int32))
    return dict(base=base, version=version, keras=base / "model.keras", drift=base / "drift.keras", plain=plain,
                gz=gz, npz=str(base / "shard-0.npz"), xs=xs, ks=ks)


def _verify(capsys, path, **flags):
    from exportkit.options.source import source_options
    from exportkit.options.verify import VerifyOptions
    from exportkit.verify.command import verify_command

    flags.setdefault("serving", "none")
    if "against" in flags:
        flags["against"] = source_options(str(flags["against"]))
    code = verify_command(VerifyOptions(path=str(path), json_out="-", **flags))
    return code, json.loads(capsys.readouterr().out)


def _outputs(report, runtime):
    return {o["key"]: o for r in report["runtimes"] if r["name"] == runtime for o in r["outputs"]}


def test_plain_and_gzip_records_agree_with_quantiles_in_every_report(capsys, data, tmp_path):
    junit = tmp_path / "junit.xml"
    code, report = _verify(capsys, data["version"], data=str(data["base"] / "part-*"), against=data["keras"],
                           runtimes="keras,saved_model", junit=str(junit), batch_size=64)
    assert code == 0, report["verdict"]
    assert report["inputs"]["records"] == 2 * RECORDS and report["inputs"]["files"] == 2
    assert report["reference"] == "keras"
    score = _outputs(report, "saved_model")["score"]
    assert score["records"] == 2 * RECORDS and score["elements"] == 2 * RECORDS * 2
    assert score["failing_records"] == 0 and score["passed"]
    assert set(score["abs_err_quantiles"]) == {"p50", "p99", "p99.9"}
    assert score["abs_err_quantiles"]["p99.9"] <= score["max_abs_err"] + 1e-30
    assert len(score["worst_records"]) == 10
    suite = ET.parse(junit).getroot().find("testsuite")
    case = next(tc for tc in suite.iter("testcase") if tc.get("name") == "score")
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert props["records"] == str(2 * RECORDS) and "abs_err_p99.9" in props

    result = invoke("verify", data["version"], "--data", data["plain"], "--against", data["keras"],
                    "--runtimes", "keras,saved_model", "--serving", "none", "--limit", "100")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "100 records in 1 file(s)" in result.stdout and "ABS P99.9" in result.stdout


def test_drift_is_caught_with_its_worst_records_and_saved_failures(capsys, data, tmp_path):
    import keras
    import tensorflow as tf

    failures = tmp_path / "failures"
    code, report = _verify(capsys, data["version"], data=f"{data['plain']},{data['gz']}", against=data["drift"],
                           runtimes="keras,saved_model", save_failures=str(failures))
    assert code == 1
    score = _outputs(report, "saved_model")["score"]
    assert not score["passed"] and score["failing_records"] > 0
    assert score["max_abs_err"] > 1e-4
    worst = score["worst_records"][0]
    assert worst["abs_err"] == score["max_abs_err"]
    # The position given is the record: recompute it from the source data with both models.
    row = worst["index"] + (RECORDS if worst["file"] == data["gz"] else 0)
    feed = {"x": data["xs"][row:row + 1], "k": data["ks"][row:row + 1].astype(np.int32)}
    expected = np.asarray(keras.saving.load_model(data["drift"])(feed)["score"])[0][tuple(worst["element"])]
    actual = np.asarray(keras.saving.load_model(data["keras"])(feed)["score"])[0][tuple(worst["element"])]
    assert worst["expected"] == pytest.approx(float(expected), rel=1e-6)
    assert abs(float(expected) - float(actual)) == pytest.approx(worst["abs_err"], rel=1e-3)
    # the failing records, as they were read, in a TFRecord file TensorFlow reads back (CRCs right)
    saved = [r.numpy() for r in tf.data.TFRecordDataset(str(failures / "failures.tfrecord"))]
    index = [json.loads(line) for line in (failures / "failures.index.jsonl").read_text().splitlines()]
    assert len(saved) == len(index) == score["failing_records"] == report["inputs"]["failures_saved"]
    first = index[0]
    assert saved[0] == _example(data["xs"][first["index"]], data["ks"][first["index"]])
    assert not list(failures.glob(".*"))  # no temporary files left


@pytest.mark.slow
@pytest.mark.parametrize("bad, problem", [
    (dict(x=None), "feature 'x' is missing"),
    (dict(k="float"), "feature 'k' holds float_list, input 'k' (int32) needs int64_list"),
    (dict(x=[1.0, 2.0]), "feature 'x' has 2 value(s)"),
])
def test_a_bad_record_is_an_input_error_naming_it(data, tmp_path, bad, problem):
    import tensorflow as tf

    records = [_example(data["xs"][i], data["ks"][i]) for i in range(20)]
    if bad.get("k") == "float":
        records[13] = tf.train.Example(features=tf.train.Features(feature={
            "x": tf.train.Feature(float_list=tf.train.FloatList(value=[0.0] * 4)),
            "k": tf.train.Feature(float_list=tf.train.FloatList(value=[1.5]))})).SerializeToString()
    else:
        records[13] = _example(bad.get("x", data["xs"][13]), data["ks"][13])
    path = _write(tmp_path / "bad.tfrecord", records)
    result = invoke("verify", data["version"], "--data", path, "--runtimes", "saved_model", "--serving", "none",
                    "--batch-size", "8", "--save-failures", tmp_path / "failures")
    assert result.returncode == 2
    assert not (tmp_path / "failures").exists()  # nothing half-written
    assert f"record {path}:13: {problem}" in result.stderr
    assert "fix:" in result.stderr and "Traceback" not in result.stderr


def test_npz_shards_sampling_is_seeded_and_limit_exact(capsys, caplog, data, monkeypatch, tmp_path):
    import logging

    import exportkit.verify.dataset

    caplog.set_level(logging.INFO, logger="exportkit")  # progress goes to the exportkit logger (the CLI: stderr)
    monkeypatch.setattr(exportkit.verify.dataset, "PROGRESS_EVERY", 0.0)  # a progress line after every batch
    runs = {}
    for seed in (1, 1, 2):
        from exportkit.options.source import source_options
        from exportkit.options.verify import VerifyOptions
        from exportkit.verify.command import verify_command

        code = verify_command(VerifyOptions(path=str(data["version"]), data=data["npz"], sample=0.5, seed=seed,
                                            against=source_options(str(data["keras"])), serving="none",
                                            runtimes="keras,saved_model", batch_size=32, json_out="-"))
        captured = capsys.readouterr()
        report = json.loads(captured.out)
        assert code == 0, report["verdict"]
        assert "records/s" in caplog.text and "ETA" in caplog.text
        caplog.clear()
        runs.setdefault(seed, []).append(_outputs(report, "saved_model")["score"])
    first, again = runs[1]
    assert first["records"] == again["records"] and first["worst_records"] == again["worst_records"]
    assert 0.35 * RECORDS < first["records"] < 0.65 * RECORDS
    assert runs[2][0]["worst_records"] != first["worst_records"]
    code, report = _verify(capsys, data["version"], data=f"{data['npz']},{data['plain']}", against=data["keras"],
                           limit=RECORDS + 7, runtimes="keras,saved_model", batch_size=50)
    assert code == 0 and report["inputs"]["records"] == RECORDS + 7

    failures = tmp_path / "npz-failures"
    code, report = _verify(capsys, data["version"], data=data["npz"], against=data["drift"], limit=40,
                           runtimes="keras,saved_model", batch_size=16, save_failures=str(failures))
    saved = sorted(failures.glob("failures-*.npz"))
    index = [json.loads(line) for line in (failures / "failures.index.jsonl").read_text().splitlines()]
    with np.load(saved[0]) as first:
        assert np.array_equal(first["x"][0], data["xs"][index[0]["index"]])
    assert code == 1 and len(index) == _outputs(report, "saved_model")["score"]["failing_records"]


@pytest.mark.slow
def test_example_signature_takes_the_records_as_they_are(capsys, data, tmp_path):
    """A hand-written SavedModel whose signature parses serialized tf.Example (as TF Serving's classic
    Example-input models do): records go through unparsed, to TF2 and to the TF1 session loader."""
    import keras
    import tensorflow as tf

    model = keras.saving.load_model(data["keras"])
    features = {"x": tf.io.FixedLenFeature([4], tf.float32), "k": tf.io.FixedLenFeature([], tf.int64)}

    def serve(examples):
        parsed = tf.io.parse_example(examples, features)
        return {"score": model({"x": parsed["x"], "k": tf.cast(parsed["k"], tf.int32)})["score"]}

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serving_default", serve, input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    path = tmp_path / "examples" / "1"
    archive.write_out(str(path), verbose=False)
    code, report = _verify(capsys, path, data=data["gz"], runtimes="keras,saved_model,session", limit=100,
                           against=data["drift"])
    assert code == 1, report["verdict"]  # the drift is seen through the keras runtime, which parses the records
    assert report["inputs"]["examples"] is True and report["inputs"]["records"] == 100
    assert report["reference"] == "keras"
    assert not _outputs(report, "saved_model")["score"]["passed"]
    session = _outputs(report, "session")["score"]
    assert session["records"] == 100 and not session["passed"]
    assert session["max_abs_err"] == pytest.approx(_outputs(report, "saved_model")["score"]["max_abs_err"], rel=1e-3)


def test_string_inputs_from_bytes_features(capsys, sample, tmp_path):
    """A text model (string input (None, 1) -> StringLookup): bytes_list features with vocabulary words, empty
    strings and unknown words reach every runtime."""
    import io

    import tensorflow as tf

    from exportkit.export.pipeline import Progress, export_model
    from exportkit.options.export import export_options

    src = sample("text.keras")["path"]
    version = export_model(export_options(str(src), str(tmp_path / "text"), no_verify=True), Progress(io.StringIO())).path
    words = [b"the", b"", b"zebra-unknown", b"model", "caf\u00e9".encode()] * 9
    path = _write(tmp_path / "text.tfrecord", [tf.train.Example(features=tf.train.Features(feature={
        "text": tf.train.Feature(bytes_list=tf.train.BytesList(value=[w]))})).SerializeToString() for w in words])
    code, report = _verify(capsys, version, data=path, against=src, runtimes="keras,saved_model", batch_size=16)
    assert code == 0, report["verdict"]
    logits = _outputs(report, "saved_model")
    assert [o["records"] for o in logits.values()] == [len(words)]


def test_histogram_quantiles_are_within_their_bound_and_merge_exactly():
    from exportkit.compare.stats import BINS_PER_DECADE, LogHistogram

    values = np.random.default_rng(0).lognormal(-8, 3, 20_000)
    whole, a, b = LogHistogram(), LogHistogram(), LogHistogram()
    whole.add(values)
    a.add(values[:7000])
    b.add(values[7000:])
    a.merge(b)
    assert np.array_equal(a.counts, whole.counts)
    bound = 10 ** (1 / (2 * BINS_PER_DECADE))
    ordered = np.sort(values)
    for q in (0.5, 0.99, 0.999):
        exact = ordered[math.ceil(q * len(values)) - 1]
        assert exact / bound <= whole.quantile(q) <= exact * bound


@pytest.mark.slow
def test_beam_runner_agrees_with_in_process(capsys, data):
    flags = dict(data=f"{data['plain']},{data['gz']}", against=data["drift"], runtimes="keras,saved_model",
                 batch_size=64)
    code, in_process = _verify(capsys, data["version"], **flags)
    beam_code, beam = _verify(capsys, data["version"], runner="beam", **flags)
    assert code == beam_code == 1
    assert in_process["passed"] == beam["passed"]
    ours, theirs = _outputs(in_process, "saved_model")["score"], _outputs(beam, "saved_model")["score"]
    for field in ("max_abs_err", "max_rel_err", "records", "failing_records", "mismatched", "abs_err_quantiles",
                  "rel_err_quantiles", "worst_records", "required_atol", "reason"):
        assert ours[field] == theirs[field], field
    assert beam["inputs"]["runner"] == "beam"


def test_beam_names_a_bad_record_like_the_in_process_run(data, tmp_path, monkeypatch):
    """Exit 2 naming the record, as in-process; no results directory is left behind (the failure is the answer)."""
    records = [_example(data["xs"][i], data["ks"][i]) for i in range(10)]
    records[4] = _example(None, 1)
    path = _write(tmp_path / "bad.tfrecord", records)
    (tmp_path / "temp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "temp"))
    result = invoke("verify", data["version"], "--data", path, "--against", data["keras"], "--runtimes",
                    "keras,saved_model", "--serving", "none", "--runner", "beam")
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"record {path}:4: feature 'x' is missing" in result.stderr and "fix:" in result.stderr
    assert not list((tmp_path / "temp").glob("exportkit-beam-*"))


@pytest.mark.slow
def test_serving_deployment_in_process_and_from_beam_workers(capsys, data):
    """--serving HOST:PORT: the in-process run and the Beam workers send the records' batches to one server."""
    import re
    import subprocess
    import sys

    server = subprocess.Popen([sys.executable, "-m", "exportkit", "serve", str(data["version"].parent), "--port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        address = re.search(r"127\.0\.0\.1:\d+", server.stdout.readline()).group(0)
        flags = dict(data=data["gz"], against=data["drift"], runtimes="keras,serving", serving=address, limit=200)
        code, in_process = _verify(capsys, data["version"], **flags)
        beam_code, beam = _verify(capsys, data["version"], runner="beam", **flags)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert code == beam_code == 1
    ours, theirs = _outputs(in_process, "serving")["score"], _outputs(beam, "serving")["score"]
    assert ours["records"] == theirs["records"] == 200
    assert ours["max_abs_err"] == theirs["max_abs_err"] > 1e-4
