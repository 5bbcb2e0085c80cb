"""exportkit compat, static side: version parsing, shipped registries, what the analysis walks, findings per
class of version skew, the CLI's matrix and JSON, managed-environment errors. Fast; no TF X.Y environment.
The observed side (TF 2.12's real loader) is in test_compat_observed.py."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from conftest import run_cli
from exportkit.tfversions import SUPPORTED, parse_versions
from exportkit.tfversions import registry as registries
from exportkit.errors import UsageError


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> dict[str, Path]:
    import compat_corpus

    return compat_corpus.build_all(tmp_path_factory.mktemp("compat-corpus"))


def _meta_graph(path):
    from exportkit.savedmodel.reader import read_saved_model_proto, select_meta_graph

    return select_meta_graph(read_saved_model_proto(path))


def _analyze(path, versions, device="cpu"):
    from exportkit.tfversions.analysis import analyze

    return {r.tf: r for r in analyze(_meta_graph(path), versions, device)}


# ------------------------------------------------------------------------------------------------ versions
def test_versions_list_range_all_and_bad_input():
    assert parse_versions("2.12,2.17") == ["2.12", "2.17"]
    assert parse_versions("2.14-2.16") == ["2.14", "2.15", "2.16"]
    assert parse_versions(None) == list(SUPPORTED) == parse_versions("all")
    assert parse_versions(["2.20", "2.13.1"]) == ["2.13", "2.20"]
    for bad in ("2.11", "3.0", "2.22", "latest", "2.16-2.12"):
        with pytest.raises(UsageError) as err:
            parse_versions(bad)
        assert "2.12" in str(err.value)


def test_every_supported_version_ships_a_registry_taken_from_the_full_wheel():
    assert registries.available() == list(SUPPORTED)
    for version in SUPPORTED:
        reg = registries.load(version)
        assert reg.release.startswith(version + ".")
        assert len(reg.names()) > 1800
        conv = reg.op("Conv2D")
        assert conv["a"]["T"]["t"] == "type" and conv["a"]["data_format"]["d"] == "NHWC"
        assert reg.kernels_for("Conv2D", "GPU"), f"{version}: no GPU kernels (a -cpu wheel?)"
        assert reg.op("NoSuchOpXyz") is None


# ------------------------------------------------------------------------------------------------ walking
def test_what_the_loader_instantiates_and_what_it_runs(corpus):
    """As measured with TF 2.12's loader (see the module doc of exportkit.tfversions.analysis): an unknown op fails
    the load in any function a top-level node calls, save path included, but not in an uncalled function;
    dtypes and kernels matter only where something runs, so a kernel-less dtype on the save path is fine."""
    from exportkit.tfversions.analysis import analyze
    from exportkit.savedmodel.reader import read_saved_model_proto, select_meta_graph

    def edited(edit):
        meta_graph = select_meta_graph(read_saved_model_proto(corpus["plain_module"]))
        functions = {f.signature.name: f for f in meta_graph.graph_def.library.function}
        edit(meta_graph, lambda part: next(f for n, f in functions.items() if part in n))
        return [(f.code, f.op, f.node.split("/")[0]) for f in analyze(meta_graph, ["2.21"])[0].findings]

    def unknown_op_in(part, op):
        def edit(meta_graph, function):
            for fdef in meta_graph.graph_def.library.function:  # __inference_serve_*: the called one and a twin
                if part in fdef.signature.name:
                    next(n for n in fdef.node_def if n.op == op).op = "NoSuchOpXyz"
        return edit

    def save_with_a_kernel_less_dtype(meta_graph, function):
        save = next(n for n in function("_traced_save").node_def if n.op == "SaveV2")
        save.attr["dtypes"].list.type[:] = [23] * len(save.attr["dtypes"].list.type)  # uint16: no kernel

    def uncalled_function(meta_graph, function):
        copy = meta_graph.graph_def.library.function.add()
        copy.CopyFrom(function("_traced_restore"))
        copy.signature.name = "__inference_never_called_1"
        for node in copy.node_def:
            node.op = "NoSuchOpXyz"

    assert edited(lambda *_: None) == []
    assert edited(save_with_a_kernel_less_dtype) == []
    assert edited(uncalled_function) == []
    for part, op in (("_traced_save", "SaveV2"), ("_traced_restore", "RestoreV2"), ("__inference_serve", "MatMul")):
        (finding,) = edited(unknown_op_in(part, op))
        assert finding[:2] == ("op-unknown", "NoSuchOpXyz") and part in finding[2]


# ------------------------------------------------------------------------------------------------ classes
def test_each_corpus_class_is_predicted_on_2_12_and_2_21(corpus):
    """The finding each model was built to trigger, and none on 2.21 except the GPU-only op on a CPU."""
    expected = {
        "new_op_cpu": ("op-unknown", "Conv"),
        "new_op_gpu_only": ("op-unknown", "IRFFTND"),
        "kernel_dtype_added": ("no-kernel", "GatherV2"),
        "new_type_attr": ("attr-unknown", "TopKV2"),
        "disallowed_dtype": ("dtype-unsupported", "StringToNumber"),
    }
    for name, (code, op) in expected.items():
        results = _analyze(corpus[name], ["2.12", "2.21"])
        assert results["2.12"].predicted == "fails", (name, results["2.12"].findings)
        assert (code, op) in {(f.code, f.op) for f in results["2.12"].findings}, (name, results["2.12"].findings)
        if name == "new_op_gpu_only":
            (finding,) = results["2.21"].findings
            assert (finding.code, finding.op) == ("no-kernel", "IRFFTND") and "only a GPU kernel" in finding.message
            assert _analyze(corpus[name], ["2.21"], "gpu")["2.21"].predicted == "ok"
        else:
            assert results["2.21"].predicted == "ok" and results["2.21"].findings == [], name


def test_unknown_attrs_that_are_not_types_are_ignored_by_the_loader_a_warning(corpus):
    results = _analyze(corpus["new_attr_non_default"], ["2.12", "2.21"])
    (finding,) = [f for f in results["2.12"].findings if f.op == "MatMul"]
    assert (finding.severity, finding.code) == ("warning", "attr-unknown") and "'grad_a'" in finding.message
    assert results["2.12"].predicted == "warn" and results["2.21"].predicted == "ok"


def test_gpu_forecast_warns_about_cpu_fallback_but_not_about_host_ops(corpus):
    """On a GPU server, GatherV2 with int16 indices has no GPU kernel: a fallback warning naming the op.
    String ops and the restore path run on the CPU on every GPU server: no warning for them."""
    results = _analyze(corpus["kernel_dtype_added"], ["2.21"], "gpu")
    (finding,) = results["2.21"].findings
    assert (finding.severity, finding.code, finding.op) == ("warning", "gpu-fallback", "GatherV2")
    assert results["2.21"].predicted == "warn"
    assert _analyze(corpus["disallowed_dtype"], ["2.21"], "gpu")["2.21"].findings == []
    assert _analyze(corpus["plain_module"], ["2.21"], "gpu")["2.21"].findings == []


def test_static_analysis_of_ten_versions_on_a_1000_node_graph_is_under_a_second(corpus):
    from exportkit.tfversions.analysis import analyze

    meta_graph = _meta_graph(corpus["plain_module"])
    serve = next(f for f in meta_graph.graph_def.library.function if "__inference_serve" in f.signature.name)
    template = next(n for n in serve.node_def if n.op == "MatMul")
    while len(serve.node_def) < 1000:
        node = serve.node_def.add()
        node.CopyFrom(template)
        node.name = f"extra_{len(serve.node_def)}"
    registries.load.cache_clear()
    began = time.process_time()  # CPU time: the shared test machine's load would only blur wall time
    results = analyze(meta_graph, list(SUPPORTED))
    elapsed = time.process_time() - began
    assert len(results) == 10 and results[-1].predicted == "ok"
    assert elapsed < 1.0, f"{elapsed:.2f} s of CPU"


# ------------------------------------------------------------------------------------------------ CLI
def test_cli_matrix_json_and_exit_codes(corpus, tmp_path):
    out = tmp_path / "compat.json"
    proc = run_cli("compat", corpus["kernel_dtype_added"], "--tf", "2.12,2.21", "--json", out)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.split()[:3] == ["2.12", "fails", "-"] and "GatherV2" in line for line in lines), proc.stdout
    assert any(line.split()[:3] == ["2.21", "ok", "-"] for line in lines), proc.stdout
    doc = json.loads(out.read_text())
    assert set(doc) == {"schema_version", "path", "device", "passed", "versions"} and doc["passed"] is False
    assert doc["device"] == "cpu"
    assert [v["tf"] for v in doc["versions"]] == ["2.12", "2.21"]
    for version in doc["versions"]:
        assert set(version) == {"tf", "predicted", "observed", "findings", "error", "served", "server", "server_error",
                                "memory"}
        assert version["observed"] is None and version["error"] is None
        for finding in version["findings"]:
            assert set(finding) == {"severity", "code", "op", "node", "message"}
    assert doc["versions"][0]["findings"][0]["code"] == "no-kernel"

    ok = run_cli("compat", corpus["disallowed_dtype"], "--tf", "2.17-2.21", "--json", "-")  # uint32 since 2.17
    assert ok.returncode == 0, ok.stderr
    assert [v["predicted"] for v in json.loads(ok.stdout)["versions"]] == ["ok"] * 5


@pytest.mark.parametrize("args, needle", [
    (["--tf", "2.11"], "2.12-2.21"),
    (["--tf", "2.21-2.14"], "backwards"),
    (["--device", "tpu"], "--device"),
    (["--device", "gpu", "--run"], "CPU only"),
])
def test_cli_bad_input_exits_2_with_a_fix(corpus, args, needle):
    proc = run_cli("compat", corpus["plain_module"], *args)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and "fix:" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_runtime_environment_that_cannot_be_built_exits_3_naming_the_install_command(corpus, tmp_path):
    wheels = tmp_path / "no-wheels"
    wheels.mkdir()
    env = {"EXPORTKIT_CACHE_DIR": str(tmp_path / "cache"), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels),
           "PIP_CONFIG_FILE": os.devnull}
    proc = run_cli("compat", corpus["plain_module"], "--tf", "2.13", "--run", env=env)
    assert proc.returncode == 3, proc.stderr
    assert "exportkit runtimes install 2.13" in proc.stderr and "Traceback" not in proc.stderr
    assert not any((tmp_path / "cache" / "tf").iterdir()), "a half-built environment was left behind"
    listing = run_cli("runtimes", "list", env=env)
    assert listing.returncode == 0 and "2.13  absent" in listing.stdout
    removed = run_cli("runtimes", "remove", "2.13", env=env)
    assert removed.returncode == 0 and "no environment" in removed.stdout


def test_inspect_shows_the_oldest_version_the_analysis_accepts(corpus):
    from exportkit.inspection.command import read_info

    assert read_info(corpus["disallowed_dtype"]).oldest_tf_serving not in (None, "2.12")
    assert read_info(corpus["new_op_gpu_only"]).oldest_tf_serving is None  # GPU-only: no CPU server runs it
