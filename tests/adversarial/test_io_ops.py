"""verify refuses to execute graphs whose signatures reach file-system, network or printing ops."""
from __future__ import annotations

import json
import os
import stat
import time

import pytest

from conftest import invoke

IO_CASES = ["write_file", "write_in_cond", "read_file", "print", "matching_files", "tfrecord_dataset", "save_v2"]


@pytest.mark.parametrize("name", IO_CASES)
def test_lint_names_the_reachable_io_op_and_its_node(io_models, name):
    from exportkit.savedmodel.lint import lint_saved_model
    from exportkit.savedmodel.reader import read_saved_model_proto

    base, op, _ = io_models[name]
    found = [f for f in lint_saved_model(read_saved_model_proto(base), check_registry=False) if f.code == "io-op"]
    assert len(found) == 1 and found[0].severity == "error"
    assert f"{op} (" in found[0].message and "in function '" in found[0].message and "--allow-io-ops" in found[0].message


def test_save_and_restore_functions_of_every_savedmodel_are_not_io_findings(third_party):
    """SaveV2/RestoreV2/MergeV2Checkpoints sit in every SavedModel's save path: unreachable from a signature."""
    from exportkit.savedmodel.graph import graph_of
    from exportkit.savedmodel.lint import IO_OP_CATEGORY, io_op_nodes
    from exportkit.savedmodel.reader import read_saved_model_proto, select_meta_graph

    meta_graph = select_meta_graph(read_saved_model_proto(third_party["plain"]))
    present = {op for op in graph_of(meta_graph).op_counts() if op in IO_OP_CATEGORY}
    assert {"SaveV2", "RestoreV2", "MergeV2Checkpoints"} <= present
    assert io_op_nodes(meta_graph) == {}


def test_every_denylisted_op_exists_in_tensorflow():
    """A misspelt name in the denylist would silently protect nothing."""
    from exportkit.savedmodel.lint import IO_OP_CATEGORY
    from exportkit.tfversions.installed import registered_ops

    registry = registered_ops()
    if registry is None:
        pytest.skip("TensorFlow's op registry is unavailable")
    assert sorted(op for op in IO_OP_CATEGORY if op not in registry) == []


def _standin_that_records_its_start(tmp_path):
    marker = tmp_path / "server-started"
    exe = tmp_path / "tensorflow_model_server"
    exe.write_text(f"#!/bin/sh\ntouch {marker}\nsleep 30\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe, marker


@pytest.mark.parametrize("name", ["write_file", "read_file"])
def test_verify_refuses_before_anything_runs(io_models, tmp_path, name):
    base, op, touched = io_models[name]
    exe, marker = _standin_that_records_its_start(tmp_path)
    assert name != "write_file" or not touched.exists()
    if touched.exists():  # a read would move the access time back to now
        past = time.time() - 3600
        os.utime(touched, (past - 3600, past))
    before = touched.stat().st_atime if touched.exists() else None
    proc = invoke("verify", base, "--serving", "binary", "--model-server-bin", exe, "--json", tmp_path / "r.json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "--allow-io-ops" in proc.stderr and "fix:" in proc.stderr and "Traceback" not in proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    io = [f for f in report["findings"] if f["code"] == "io-op"]
    assert io and io[0]["severity"] == "error" and op in io[0]["message"]
    assert {r["name"]: r["status"] for r in report["runtimes"]} == {
        "saved_model": "skipped", "session": "skipped", "serving": "skipped", "rest": "skipped"}
    assert not marker.exists(), "a server was started before the static verdict"
    if name == "write_file":
        assert not touched.exists(), "verify executed the graph: the file was written"
    else:
        assert touched.stat().st_atime == before, "verify executed the graph: the file was read"


@pytest.mark.slow
def test_allow_io_ops_runs_it_and_keeps_a_warning(io_models, tmp_path):
    base, _, written = io_models["write_file"]
    try:
        proc = invoke("verify", base, "--allow-io-ops", "--serving", "none", "--runtimes", "saved_model",
                       "--json", tmp_path / "r.json")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        finding = next(f for f in json.loads((tmp_path / "r.json").read_text())["findings"] if f["code"] == "io-op")
        assert finding["severity"] == "warning"
        assert written.exists()  # it really ran: the refusal is what keeps the file away
    finally:
        written.unlink(missing_ok=True)


def test_inspect_reports_the_same_finding(io_models):
    base, op, _ = io_models["tfrecord_dataset"]
    proc = invoke("inspect", base, "--json", "--strict")
    assert proc.returncode == 1
    io = [f for f in json.loads(proc.stdout)["findings"] if f["code"] == "io-op"]
    assert io and io[0]["severity"] == "error" and op in io[0]["message"]
