"""Hostile files and names (issue 27): generated request scripts that must not run a model's data as shell, FIFOs
that must not hang inspect, damaged TFRecord/npz data that must be exit 2 naming the record (never PASSED, never a
MemoryError), and flag values that must be refused before anything runs."""
from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from conftest import invoke, run_cli

HOSTILE_KEY = 'x\ntouch "$MARKER" #'
HOSTILE_DIR = "evil$(touch marker2)"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


def _rename_signature(version_dir: Path, old: str, new: str) -> None:
    from exportkit.savedmodel.protos import protos
    from exportkit.savedmodel.versions import SAVED_MODEL_PB

    proto = protos()["saved_model"].SavedModel()
    proto.ParseFromString((version_dir / SAVED_MODEL_PB).read_bytes())
    for meta_graph in proto.meta_graphs:
        meta_graph.signature_def[new].CopyFrom(meta_graph.signature_def[old])
        del meta_graph.signature_def[old]
    (version_dir / SAVED_MODEL_PB).write_bytes(proto.SerializeToString())


def test_request_scripts_never_run_a_signature_key_or_a_directory_name(third_party, tmp_path):
    base = tmp_path / HOSTILE_DIR
    shutil.copytree(third_party["plain"], base)
    _rename_signature(base / "1", "serving_default", HOSTILE_KEY)
    out = tmp_path / "requests"
    result = invoke("inspect", base, "--requests", out)
    assert result.returncode == 0, result.stdout + result.stderr
    scripts = sorted(out.glob("*.sh"))
    assert len(scripts) == 2 and all("\n" not in p.name and "$" not in p.name for p in out.iterdir())
    port = _closed_port()
    env = {**os.environ, "MARKER": str(tmp_path / "marker"), "REST_ADDRESS": f"127.0.0.1:{port}",
           "GRPC_ADDRESS": f"127.0.0.1:{port}", "PATH": f"{tmp_path / 'no-tools'}:{os.environ['PATH']}"}
    (tmp_path / "no-tools").mkdir()
    for tool in ("grpcurl",):  # absent here: a stand-in that only says it ran (curl is real, to a closed port)
        (tmp_path / "no-tools" / tool).write_text("#!/bin/sh\nexit 7\n")
        (tmp_path / "no-tools" / tool).chmod(0o755)
    for script in scripts:
        assert subprocess.run(["sh", "-n", str(script)]).returncode == 0, script.read_text()
        proc = subprocess.run(["sh", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
        assert proc.returncode != 0  # curl could not connect / grpcurl stand-in: the command itself ran
    assert not (tmp_path / "marker").exists() and not list(tmp_path.rglob("marker2")), "a script ran model data"
    curl = next(p for p in scripts if p.name.endswith(".curl.sh")).read_text()
    assert "'/v1/models/evil$(touch marker2):predict'" in curl  # single-quoted: no substitution


def test_a_fifo_where_a_golden_file_is_does_not_hang_inspect(third_party, tmp_path):
    base = tmp_path / "fifo"
    shutil.copytree(third_party["plain"], base)
    extra = base / "1" / "assets.extra" / "exportkit"
    extra.mkdir(parents=True)
    (extra / "manifest.json").write_text(json.dumps({"signature": {"name": "serving_default"},
                                                     "signature_name": "serving_default"}))
    for name in ("golden_inputs_batch_0.npz", "golden_outputs_batch_0.npz"):
        os.mkfifo(extra / name)
    os.mkfifo(base / "1" / "assets.extra" / "tf_serving_warmup_requests")
    began = time.monotonic()
    proc = run_cli("inspect", base, "--requests", tmp_path / "req", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "req" / "serving_default.rest.json").is_file()
    assert time.monotonic() - began < 60


# ------------------------------------------------------------------------------------------------ TFRecord


def _frame(data: bytes, length: int | None = None) -> bytes:
    from exportkit.inputs.tfrecord import masked_crc32c

    header = struct.pack("<Q", len(data) if length is None else length)
    return header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))


def _example(values) -> bytes:
    from exportkit.savedmodel.protos import protos

    example = protos()["example"].Example()
    example.features.feature["x"].float_list.value.extend(values)
    return example.SerializeToString()


def _records(n: int) -> list[bytes]:
    return [_frame(_example([float(i), 1.0, 2.0])) for i in range(n)]


def _read_all(path):
    from exportkit.inputs.tfrecord import tfrecord_records

    return list(tfrecord_records(str(path)))


def test_our_framing_is_tensorflows(tf, tmp_path):
    """The CRCs checked (and written by --save-failures) are the ones TFRecordWriter writes and TF reads."""
    path = tmp_path / "tf.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in range(3):
            writer.write(_example([float(i)]))
    assert path.read_bytes() == b"".join(_frame(_example([float(i)])) for i in range(3))
    (tmp_path / "ours.tfrecord").write_bytes(b"".join(_records(4)))
    assert len(list(tf.data.TFRecordDataset(str(tmp_path / "ours.tfrecord")))) == 4


@pytest.mark.parametrize("damage, problem", [
    ("data", "record {path}:5 (byte {offset}): its data CRC does not match"),
    ("length_crc", "record {path}:5 (byte {offset}): its length CRC does not match"),
    ("length_2^36", "record {path}:5 (byte {offset}): declares 68719476736 bytes, more than the file can hold"),
    ("length_2^39", "record {path}:5 (byte {offset}): declares 549755813888 bytes, more than the file can hold"),
    ("truncated", "record {path}:5 (byte {offset}): declares 25 bytes, more than the file can hold"),
])
def test_a_damaged_record_names_file_and_index_in_bounded_memory(tmp_path, damage, problem):
    from exportkit.inputs.tfrecord import tfrecord_records
    from exportkit.errors import UsageError

    records = _records(8)
    offset = sum(len(r) for r in records[:5])
    bad = bytearray(records[5])
    if damage == "data":
        bad[14] ^= 0x01
    elif damage == "length_crc":
        bad[9] ^= 0x01
    elif damage.startswith("length_"):
        bad[:] = _frame(bytes(bad[12:-4]), length=1 << int(damage.split("^")[1]))
    records[5] = bytes(bad)
    body = b"".join(records)
    path = tmp_path / "bad.tfrecord"
    path.write_bytes(body[:offset + 20] if damage == "truncated" else body)
    tracemalloc.start()
    with pytest.raises(UsageError) as info:
        _read_all(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert problem.format(path=path, offset=offset) in info.value.message and info.value.remedy
    assert peak < 16 << 20
    given = []  # the good records before the bad one are given first, as TensorFlow's reader gives them
    with pytest.raises(UsageError):
        for data in tfrecord_records(str(path)):
            given.append(data)
    assert given == [r[12:-4] for r in records[:5]]


def test_a_gzipped_record_that_lies_about_its_length_costs_what_is_there(tmp_path):
    import gzip

    from exportkit.errors import UsageError

    path = tmp_path / "lie.tfrecord.gz"
    path.write_bytes(gzip.compress(_records(2)[0] + _frame(b"\0" * 1000, length=(1 << 39))[:1012]))
    tracemalloc.start()
    with pytest.raises(UsageError) as info:
        _read_all(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert f"record {path}:1 " in info.value.message and peak < 16 << 20


def test_an_npz_header_declaring_186_gib_is_refused_without_allocating(tmp_path):
    import io
    import zipfile

    from exportkit.inputs.load import load_inputs
    from exportkit.inputs.spec import InputSpec
    from exportkit.errors import UsageError

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": (186 << 28, 3)})
    with zipfile.ZipFile(tmp_path / "huge.npz", "w") as z:
        z.writestr("x.npy", buf.getvalue() + b"\0" * 64)
    tracemalloc.start()
    with pytest.raises(UsageError) as info:
        load_inputs(tmp_path / "huge.npz", [InputSpec("x", "float32", [-1, 3])])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert "member x.npy declares shape" in info.value.message and peak < 16 << 20


@pytest.fixture(scope="session")
def examples_model(tf, tmp_path_factory) -> Path:
    """A signature over serialized tf.Example (parsed in the graph), as Estimator-style exports have."""

    class Parsing(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable([[1.0], [0.5], [2.0]])

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
        def serve(self, serialized):
            x = tf.io.parse_example(serialized, {"x": tf.io.FixedLenFeature([3], tf.float32)})["x"]
            return {"y": tf.matmul(x, self.w)}

    module = Parsing()
    path = tmp_path_factory.mktemp("examples_model") / "parsing" / "1"
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return path.parent


def _feed_all(version_dir: Path, pattern: str) -> int:
    """Every batch of `pattern` through verify --data's Feeder for the model's signature (no runtime needed)."""
    from exportkit.data.records import DataSource, Feeder
    from exportkit.tfexample.signatures import input_specs
    from exportkit.savedmodel.reader import select_meta_graph
    from exportkit.verify.plan import read_model

    version_dir, proto, signatures = read_model(str(version_dir))
    specs = input_specs(select_meta_graph(proto), "serving_default", signatures["serving_default"], version_dir)
    source = DataSource(pattern, specs)
    feed = Feeder(source, specs, specs[0].key if len(specs) == 1 and specs[0].examples else None)
    return sum(len(next(iter(feed(batch).values()))) for batch in source.batches())


def _garbage_at_600(tmp_path) -> Path:
    records = _records(1000)
    records[600] = _frame(b"\xff\xfe\x80 not an Example \x81" * 3)
    path = tmp_path / "data.tfrecord"
    path.write_bytes(b"".join(records))
    return path


def test_garbage_at_record_600_of_an_examples_signature_is_the_datas_fault(examples_model, tmp_path):
    from exportkit.errors import UsageError

    path = _garbage_at_600(tmp_path)
    with pytest.raises(UsageError) as info:
        _feed_all(examples_model / "1", str(path))
    assert f"record {path}:600 is not a serialized tf.Example" in info.value.message
    assert _feed_all(examples_model / "1", str(tmp_path / "ok.tfrecord")
                     if (tmp_path / "ok.tfrecord").write_bytes(b"".join(_records(300))) else "") == 300


def test_a_file_that_is_not_tfrecord_names_its_first_record(third_party, tmp_path):
    from exportkit.errors import UsageError

    path = tmp_path / "data.tfrecord"
    path.write_text("id,x\n1,2\n" * 50)
    with pytest.raises(UsageError) as info:
        _feed_all(third_party["plain"] / "1", str(path))
    assert f"record {path}:0 (byte 0): its length CRC does not match" in info.value.message


@pytest.mark.slow  # each starts verify's session worker (a TensorFlow process): seconds
@pytest.mark.parametrize("kind", ["garbage_600", "flipped_crc"])
def test_verify_data_on_damaged_records_is_exit_2_never_passed(examples_model, tmp_path, kind):
    if kind == "garbage_600":
        path, where = _garbage_at_600(tmp_path), "600 is not a serialized tf.Example"
    else:
        records = _records(10)
        bad = bytearray(records[7])
        bad[-6] ^= 0x40
        records[7] = bytes(bad)
        path = tmp_path / "data.tfrecord"
        path.write_bytes(b"".join(records))
        where = "7 (byte "
    result = invoke("verify", examples_model, "--data", path, "--runtimes", "saved_model", "--serving", "none")
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"record {path}:{where}" in result.stderr and "fix:" in result.stderr and "PASSED" not in result.stdout


def test_thousands_of_tiny_files_are_batched_together_not_one_batch_each(tmp_path):
    """Every batch is a round trip through every runtime: 2,000 files of one record are 8 batches of 256 (and
    each file keeps its own position), read in well under a second each thousand files."""
    from exportkit.data.records import DataSource

    record = _records(1)[0]
    for i in range(2000):
        (tmp_path / f"part-{i:05d}.tfrecord").write_bytes(record if i % 2 else b"")
    (tmp_path / "part-00999.tfrecord").write_bytes(_frame(_example([0.0] * 300_000)))  # a large file is read alone
    began = time.monotonic()
    source = DataSource(str(tmp_path / "part-*"), [])
    batches = list(source.batches())
    assert time.monotonic() - began < 10
    assert [len(b) for b in batches] == [256, 243, 1, 256, 244] and len(source.units) == 3
    assert source.where(batches[1].file_nos[0], batches[1].indices[0]) == str(tmp_path / "part-00513.tfrecord") + ":0"


# ------------------------------------------------------------------------------------------------ writing


@pytest.fixture
def tiny_fs(tmp_path):
    """A 64 KiB tmpfs (root can mount one; else the test is skipped) and a read-only one."""
    full, ro = tmp_path / "tiny", tmp_path / "ro"
    full.mkdir()
    ro.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(full)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root): no full file system to write to")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)], check=True)
    yield full, ro
    for path in (full, ro):
        subprocess.run(["umount", str(path)], check=True)


def test_reports_on_a_full_or_read_only_disk_are_exit_3_or_2_and_leave_nothing(tiny_fs):
    from exportkit.errors import InfraError, UsageError
    from exportkit.files import write_atomic

    full, ro = tiny_fs
    with pytest.raises(InfraError) as info:
        write_atomic(full / "r.json", "x" * (1 << 20), "--json r.json")
    assert "No space left" in info.value.message and info.value.remedy
    assert list(full.iterdir()) == []
    with pytest.raises(UsageError) as info:
        write_atomic(ro / "r.json", "{}", "--json r.json")
    assert "Read-only file system" in info.value.message
    with pytest.raises(InfraError):
        write_atomic("/dev/full", "{}", "--json /dev/full")


def test_an_append_to_the_step_summary_on_a_full_disk_is_undone(tiny_fs):
    from exportkit.errors import InfraError
    from exportkit.files import append_whole

    full, _ = tiny_fs
    step = full / "step_summary.md"
    step.write_text("earlier step\n")
    with pytest.raises(InfraError) as info:
        append_whole(step, "x" * (1 << 20), "$GITHUB_STEP_SUMMARY")
    assert "No space left" in info.value.message and step.read_text() == "earlier step\n"


def test_save_outputs_on_a_full_disk_leaves_no_partial_set(tiny_fs):
    from exportkit.inputs.npz import save_batches
    from exportkit.errors import InfraError

    full, _ = tiny_fs
    with pytest.raises(InfraError):
        save_batches(full / "out", [{"y": np.zeros(1000, np.float32)} for _ in range(10)], "saved_model")
    assert not (full / "out").exists()  # made by save_batches, so removed with the staged files


def _fill_leaving(fs: Path, pages: int) -> None:
    """Fill `fs` with page-sized files, then free `pages` of them: room for that many small files."""
    filler = fs / "filler"
    filler.mkdir()
    n = 0
    try:
        while True:
            (filler / str(n)).write_bytes(b"f" * 4096)
            n += 1
    except OSError:
        (filler / str(n)).unlink(missing_ok=True)
    for i in range(pages):
        (filler / str(n - 1 - i)).unlink()


@pytest.mark.slow
def test_verify_save_outputs_on_a_full_disk_leaves_no_runtime_set(third_party, tiny_fs):
    """Room for one runtime's three batch files, not for the second's: the first set must not stay behind."""
    full, _ = tiny_fs
    _fill_leaving(full, 4)
    out = full / "out"
    result = invoke("verify", third_party["plain"], "--runtimes", "saved_model,session", "--serving", "none",
                    "--save-outputs", out)
    assert result.returncode == 3 and f"--save-outputs {out}" in result.stderr and "No space left" in result.stderr
    assert not out.exists()
    assert sorted(p.name for p in full.iterdir()) == ["filler"]


def test_save_failures_that_cannot_be_written(tiny_fs, tmp_path):
    from exportkit.data.records import DataSource, FailureWriter, RecordBatch
    from exportkit.errors import InfraError, UsageError

    full, ro = tiny_fs
    data = tmp_path / "d.tfrecord"
    data.write_bytes(b"".join(_records(2)))
    source = DataSource(str(data), [])
    (tmp_path / "a_file").write_text("")
    for directory, problem in ((tmp_path / "a_file", "File exists"), (ro / "f", "Read-only file system")):
        with pytest.raises(UsageError) as info:
            FailureWriter(str(directory), source)
        assert f"--save-failures {directory}" in info.value.message and problem in info.value.message
    writer = FailureWriter(str(full / "f"), source)
    batch = RecordBatch(0, np.arange(100), np.zeros(100, np.int64), records=[b"r" * 2000] * 100)
    with pytest.raises(InfraError) as info:
        try:
            writer.write(batch, np.ones(100, dtype=bool))
        finally:
            writer.close(commit=False)  # what verify does when the run ends in an error
    assert "No space left" in info.value.message and "--save-failures" in info.value.message
    assert not (full / "f").exists()


def test_save_failures_into_a_file_on_the_cli_is_exit_2_before_anything_runs(third_party, tmp_path):
    data = tmp_path / "d.tfrecord"
    data.write_bytes(b"".join(_records(3)))
    (tmp_path / "taken").write_text("mine\n")
    result = invoke("verify", third_party["plain"], "--data", data, "--runtimes", "saved_model", "--serving", "none",
                    "--save-failures", tmp_path / "taken")
    assert result.returncode == 2 and "--save-failures" in result.stderr and "fix:" in result.stderr
    assert (tmp_path / "taken").read_text() == "mine\n"


# ------------------------------------------------------------------------------------------------ stdout


@pytest.mark.parametrize("how", ["dev_full", "closed", "reader_gone"])
def test_stdout_faults_are_a_clear_exit_not_an_unexpected_error(third_party, how):
    command = [sys.executable, "-m", "exportkit", "inspect", str(third_party["plain"])]
    if how == "dev_full":
        with open("/dev/full", "w") as full:
            proc = subprocess.run(command, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
        assert proc.returncode == 3 and "cannot write to standard output: No space left" in proc.stderr
    elif how == "closed":  # the command runs and says what it could not print
        proc = subprocess.run(command, stderr=subprocess.PIPE, text=True, timeout=120,
                              preexec_fn=lambda: os.close(1))
        assert proc.returncode == 0 and "standard output is closed" in proc.stderr
    else:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        proc.stdout.close()  # `| head` that already left
        stderr = proc.stderr.read()
        proc.stderr.close()
        assert proc.wait(timeout=120) == 141 and stderr == ""  # quiet, and what a shell shows for SIGPIPE
        return
    assert "fix:" in proc.stderr and "unexpected" not in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("closed", [(1,), (2,), (1, 2)], ids=["stdout", "stderr", "both"])
def test_verify_with_closed_stdio_runs_and_exits_with_its_verdict(third_party, closed):
    """`exportkit verify MODEL >&-`, as some CI steps leave it: the verdict is the exit code; the report cannot be
    printed and stderr (if open) says so. Once the worker's pipe took fd 1 and the report went nowhere: exit 120
    and an "unexpected AttributeError" with a traceback."""
    command = [sys.executable, "-m", "exportkit", "verify", str(third_party["plain"]), "--serving", "none"]
    assert exportkit_entry_prestarts_a_worker(command[3:])  # the worker's pipes are what took fd 1

    def close():
        for fd in closed:
            os.close(fd)

    proc = subprocess.run(command, stdout=None if 1 in closed else subprocess.PIPE,
                          stderr=None if 2 in closed else subprocess.PIPE, text=True, timeout=300, preexec_fn=close)
    assert proc.returncode == 0, proc.stderr
    if 2 not in closed:
        assert "Traceback" not in proc.stderr and "unexpected" not in proc.stderr, proc.stderr
        assert ("standard output is closed" in proc.stderr) == (1 in closed), proc.stderr
    if 1 not in closed:
        assert "PASS" in proc.stdout or "passed" in proc.stdout.lower(), proc.stdout


def exportkit_entry_prestarts_a_worker(argv) -> bool:
    from exportkit.entry import needs_worker

    return needs_worker(["exportkit", *argv])


# ------------------------------------------------------------------------------------------------ flags


@pytest.mark.parametrize("flag, value", [("--atol", "nan"), ("--atol", "-1"), ("--atol", "-inf"), ("--rtol", "-1"),
                                         ("--rtol", "nan"), ("--rtol", "inf")])
@pytest.mark.parametrize("command", ["verify", "compat"])
def test_non_finite_or_negative_tolerances_are_refused_at_once(third_party, flag, value, command):
    began = time.monotonic()
    extra = ["--runtimes", "saved_model", "--serving", "none"] if command == "verify" else ["--run", "--tf", "2.21"]
    result = invoke(command, third_party["plain"], f"{flag}={value}", *extra)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{flag} {float(value)} must be a finite number >= 0" in result.stderr and "fix:" in result.stderr
    assert time.monotonic() - began < 30


def test_a_signature_key_given_twice_is_refused():
    from exportkit.errors import UsageError
    from exportkit.options.signatures import parse_signature_arg

    with pytest.raises(UsageError) as info:
        parse_signature_arg("x:outputs=score,outputs=embed")
    assert "outputs= is given twice" in info.value.message and "outputs=a+b" in info.value.remedy


@pytest.mark.parametrize("spec, needle", [
    ({"k": {"feature": 3}}, "input 'k': feature 3 is not a name"),
    ({"k": {"default": float("inf")}}, "input 'k': default value Infinity is not one of the 64-bit integers"),
    ({"k": {"default": "seven"}}, "input 'k': default value \"seven\" is not one of the 64-bit integers"),
    ({"k": {"default": 1.5}}, "input 'k': default value 1.5 is not one of the 64-bit integers"),
    ({"x": {"default": [0.0, float("nan")]}}, "input 'x': default value NaN is not one of the finite numbers"),
    ({"x": {"default": ["a", "b"]}}, "input 'x': default value \"a\" is not one of the finite numbers"),
    ({"x": {"storage": ["float32"]}}, "input 'x': storage [\"float32\"] is not one of"),
    ({"x": {"default": [[0.0], [0.0]]}}, "input 'x': default value [0.0] is not"),
    ("[" * 100_000 + "]" * 100_000, "is not readable JSON (nested too deeply)"),
])
def test_a_feature_spec_is_checked_against_its_schema(tmp_path, spec, needle):
    from exportkit.inputs.spec import InputSpec
    from exportkit.errors import UsageError
    from exportkit.tfexample.features import apply_feature_spec, derive_features

    features = derive_features([InputSpec("x", "float32", [-1, 2]), InputSpec("k", "int32", [-1])], "cls")
    path = tmp_path / "features.json"
    path.write_text(spec if isinstance(spec, str) else json.dumps(spec))
    with pytest.raises(UsageError) as info:
        apply_feature_spec(features, str(path))
    assert needle in info.value.message and info.value.remedy
