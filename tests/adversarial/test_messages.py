"""Hostile or broken input: one clear message naming the real problem, and a `fix:` line."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from conftest import invoke


def _clean_error(proc, code: int, *needles: str) -> str:
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "fix:" in proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr
    return proc.stderr


def test_empty_and_truncated_keras_files_are_not_called_missing(sources, tmp_path):
    (tmp_path / "empty.keras").write_bytes(b"")
    data = (sources / "small.keras").read_bytes()
    (tmp_path / "cut.keras").write_bytes(data[: len(data) // 2])
    for name, needle in (("empty.keras", "is empty"), ("cut.keras", "not a complete .keras archive")):
        err = _clean_error(invoke("export", tmp_path / name, "-o", tmp_path / "out", "--no-verify"), 2, needle)
        assert "File not found" not in err
    assert not (tmp_path / "out").exists()


def test_fifo_and_symlink_loop_are_named_for_what_they_are(tmp_path):
    os.mkfifo(tmp_path / "pipe.keras")
    os.symlink("loop.keras", tmp_path / "loop.keras")
    for name, needle in (("pipe.keras", "named pipe"), ("loop.keras", "symlink loop")):
        for command in ("export", "inspect", "verify"):
            args = [command, tmp_path / name] + (["-o", tmp_path / "out"] if command == "export" else [])
            err = _clean_error(invoke(*args), 2, needle)
            assert "does not exist" not in err and "no such file" not in err


def test_missing_data_shard_is_an_incomplete_checkpoint_not_a_misfit(sources, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(sources / "ckpt", ckpt)
    for shard in ckpt.glob("*.data-*"):
        shard.unlink()
    err = _clean_error(invoke("export", ckpt, "--builder", "nets:build_two_heads", "--python-path", sources,
                              "--input-spec", "x:-1,3:float32", "-o", tmp_path / "out", "--no-verify"), 2, "incomplete",
                       ".data-00000-of-00001")
    assert "architecture" not in err and "builder" not in err.split("fix:")[1]


def test_inspect_of_a_source_needing_unsafe_reports_on_stderr(sources):
    proc = invoke("inspect", sources / "lambda.keras")
    err = _clean_error(proc, 2, "Lambda", "--unsafe")
    assert err.startswith("error: ") and "error" not in proc.stdout


def test_npz_errors_end_with_a_fix(tmp_path):
    from exportkit.errors import UsageError
    from exportkit.inputs.load import load_inputs
    from exportkit.inputs.spec import InputSpec

    cases = {"dtype": ({"x": np.array([["a", "b", "c"]])}, [InputSpec("x", "float32", [-1, 3])]),
             "shape": ({"x": np.zeros([2, 4], np.float32)}, [InputSpec("x", "float32", [-1, 3])]),
             "whole": ({"k": np.array([0.5, 1.0])}, [InputSpec("k", "int32", [-1])])}
    for name, (arrays, specs) in cases.items():
        np.savez(tmp_path / f"{name}.npz", **arrays)
        with pytest.raises(UsageError) as info:
            load_inputs(tmp_path / f"{name}.npz", specs)
        assert info.value.remedy, name


def test_verify_flag_errors_come_first_with_a_fix(third_party):
    _clean_error(invoke("verify", third_party["plain"], "--serving", "nonsense"), 2, "--serving 'nonsense'")
    err = _clean_error(invoke("verify", third_party["plain"], "--tol", "yy=1e-3,0"), 2, "--tol", "yy")
    assert "output keys: y" in err


def test_interrupted_ends_with_a_fix(capsys):
    import typer

    from exportkit.cli import _run

    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(typer.Exit) as info:
        _run(interrupted, debug=False)
    assert info.value.exit_code == 130
    err = capsys.readouterr().err
    assert "error: interrupted" in err and "fix:" in err


def test_unknown_signature_does_not_offer_the_init_op(third_party):
    from tensorflow_serving.apis import predict_pb2

    from exportkit.savedmodel.versions import resolve_model_path
    from exportkit.serving.server.predict import run_predict
    from exportkit.serving.server.servable import ServedModel
    from exportkit.serving.server.status import RpcError

    served = ServedModel(resolve_model_path(str(third_party["plain"])), "plain", "cpu")
    served.load()
    try:
        assert "__saved_model_init_op" in served.model.signatures  # the TF1 loader has it...
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "plain"
        request.model_spec.signature_name = "nope"
        with pytest.raises(RpcError) as info:
            run_predict(served, request)
        assert "serving_default" in info.value.message and "__saved_model_init_op" not in info.value.message
    finally:
        served.close()


def test_many_batch_sizes_are_summarised():
    from exportkit.verify.render_text import render_text
    from exportkit.verify.report import VerifyReport

    sizes = [1] + [256] * 390 + [160] + [8]
    text = render_text(VerifyReport(path="m/1", signature="serving_default", reference="saved_model",
                                    inputs={"source": "generated", "batch_sizes": sizes, "seed": 0}))
    line = next(ln for ln in text.splitlines() if "batch sizes" in ln)
    assert "256 x390" in line and len(line) < 200


def test_asset_symlink_outside_the_savedmodel_is_a_warning(third_party, tmp_path):
    model = tmp_path / "model" / "1"
    shutil.copytree(third_party["plain"] / "1", model)
    (model / "assets").mkdir(exist_ok=True)
    (model / "assets" / "inside.txt").write_text("ok")
    os.symlink("inside.txt", model / "assets" / "alias.txt")  # stays inside: fine
    os.symlink("/etc/hostname", model / "assets" / "vocab.txt")
    findings = json.loads(invoke("inspect", model, "--json").stdout)["findings"]
    links = [f for f in findings if f["code"] == "asset-symlink"]
    assert len(links) == 1 and links[0]["severity"] == "warning" and "assets/vocab.txt" in links[0]["message"]
