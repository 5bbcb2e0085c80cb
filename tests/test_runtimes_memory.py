"""What a version costs the server (issue 51): the memory the session worker measures around the TF1 load, beside
TF Serving's estimate (files x 1.2), the swap's peak, and the gates. Each figure is checked against an independent
measurement: a fresh process that loads the version with the TF1 loader and answers one request, reading its own
/proc RSS before and after (no exportkit in it)."""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import invoke
from exportkit.options.verify import verify_options
from exportkit.report.format import parse_size, size_text
from exportkit.savedmodel.resources import disk_bytes, ram_estimate

CLOSE = 0.20  # each figure within 20% of the independent measurement

# The independent measurement, on the same terms as the worker's (docs/verify.md "Memory"): the memory the process
# holds (RssAnon + RssShmem: not the pages of TensorFlow's shared library it maps), read after glibc's malloc_trim
# (not the heap the load freed, e.g. the Python loader's graph-building garbage that TF Serving's C++ loader never
# makes). `rss` is the plain VmRSS difference without malloc_trim, which reads higher by both.
MEASURE = r"""
import ctypes, json, sys
import numpy as np
import tensorflow as tf
libc = ctypes.CDLL("libc.so.6")
def status():
    with open("/proc/self/status") as f:
        return {k: int(v.split()[0]) * 1024 for k, _, v in (line.partition(":") for line in f)
                if k in ("VmRSS", "RssAnon", "RssShmem")}
def held():
    libc.malloc_trim(0)
    s = status()
    return s["RssAnon"] + s["RssShmem"]
path, feed = sys.argv[1], json.load(sys.stdin)
rss_before = status()["VmRSS"]
before = held()
graph = tf.Graph()
session = tf.compat.v1.Session(graph=graph)
with graph.as_default():
    meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"], path)
signature = meta_graph.signature_def["serving_default"]
feeds = {signature.inputs[k].name: np.asarray(v, dtype=object if signature.inputs[k].dtype == 7 else
         tf.as_dtype(signature.inputs[k].dtype).as_numpy_dtype) for k, v in feed.items()}
session.run([t.name for t in signature.outputs.values()], feeds)
rss = status()["VmRSS"] - rss_before
print(json.dumps({"loaded": held() - before, "rss": rss}))
"""


def independent(path: Path, feed: dict, python: str = sys.executable) -> dict:
    return _independent(str(path), json.dumps(feed), python)


@functools.lru_cache(maxsize=None)  # one measurement per version (and Python) for the whole module
def _independent(path: str, feed: str, python: str) -> dict:
    out = subprocess.run([python, "-c", MEASURE, path], input=feed, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def close(figure: int, expected: int, within: float = CLOSE) -> bool:
    return abs(figure - expected) <= within * expected


# ------------------------------------------------------------------------------------------------ quick checks


def test_sizes_read_and_print_in_honest_units():
    assert parse_size("512MB") == 512 * 10**6
    assert parse_size("512MiB") == 512 * 2**20
    assert parse_size("1.5 GiB") == 3 * 2**29
    assert parse_size("2gb") == 2 * 10**9
    assert parse_size("800000") == 800000
    assert parse_size("1G") is None and parse_size("12 M") is None  # ambiguous: refused
    assert size_text(520_300_000) == "520 MB" and size_text(1_234_000_000) == "1.23 GB" and size_text(999) == "999 B"


def test_estimate_sums_every_file_under_the_version_as_tf_serving_does(tmp_path):
    """GetModelDiskSize (servables/tensorflow/util.cc) walks every directory, assets.extra and hidden files too."""
    files = {"saved_model.pb": 1234, "variables/variables.data-00000-of-00001": 10**6, "variables/variables.index": 77,
             "assets/vocab.txt": 5000, "assets.extra/tf_serving_warmup_requests": 300, "assets.extra/deep/.hidden": 9}
    for name, size in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x" * size)
    assert disk_bytes(tmp_path) == sum(files.values())
    assert ram_estimate(disk_bytes(tmp_path)) == int(sum(files.values()) * 1.2)


def test_a_size_that_is_not_one_is_a_usage_error(tmp_path):
    result = invoke("verify", tmp_path, "--max-memory", "2G")
    assert result.returncode == 2
    assert "--max-memory '2G' is not a size" in result.stderr + result.stdout
    assert "fix: pass --max-memory 512MB" in result.stderr + result.stdout


def test_a_memory_gate_that_measures_nothing_is_a_usage_error(tmp_path):
    result = invoke("verify", tmp_path, "--data", "warmup", "--max-memory", "1GB")
    assert result.returncode == 2 and "--max-memory is measured on verify's own batches" in result.stdout + result.stderr


def test_limits_come_from_the_base_directorys_exportkit_toml_and_flags_win(tmp_path):
    (tmp_path / "3").mkdir()
    (tmp_path / "3" / "saved_model.pb").write_bytes(b"")
    (tmp_path / "exportkit.toml").write_text('max_memory = "300MiB"\nmax_swap_memory = 500000000\n')
    o = verify_options(tmp_path / "3")
    assert (o.max_memory, o.max_swap_memory) == (300 * 2**20, 500_000_000)
    assert verify_options(tmp_path, max_memory="1GB").max_memory == 10**9


# ------------------------------------------------------------------------------------------------ measured


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Three kinds of memory: big variables (a base directory of two versions, for the swap), a lookup table
    initialised from a 500,000-line vocabulary asset, and many small functions."""
    import tensorflow as tf

    root = tmp_path_factory.mktemp("memory")

    def dense(rows: int, cols: int):
        class Dense(tf.Module):
            def __init__(self):
                self.w = tf.Variable(np.random.default_rng(rows).random((rows, cols), np.float32))

            @tf.function(input_signature=[tf.TensorSpec([None, cols], tf.float32)])
            def serve(self, x):
                return {"y": tf.matmul(x, self.w, transpose_b=True)}

        return Dense()

    for version, rows in ((1, 2000), (2, 3000)):  # 40 MB and 60 MB of float32
        m = dense(rows, 5000)
        tf.saved_model.save(m, str(root / "big" / str(version)), signatures={"serving_default": m.serve})

    vocab = root / "vocab.txt"
    vocab.write_text("".join(f"token_{i:07d}\n" for i in range(500_000)))

    class Table(tf.Module):
        def __init__(self):
            init = tf.lookup.TextFileInitializer(str(vocab), tf.string, tf.lookup.TextFileIndex.WHOLE_LINE,
                                                 tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER)
            self.table = tf.lookup.StaticHashTable(init, -1)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def serve(self, tokens):
            return {"ids": self.table.lookup(tokens)}

    table = Table()
    tf.saved_model.save(table, str(root / "table" / "1"), signatures={"serving_default": table.serve})

    class Functions(tf.Module):
        def __init__(self):
            self.parts = [tf.function(lambda x, i=i: tf.nn.relu(x * float(i + 1) + 1.0)) for i in range(120)]

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
        def serve(self, x):
            return {"y": tf.add_n([part(x) for part in self.parts])}

    functions = Functions()
    tf.saved_model.save(functions, str(root / "functions" / "1"), signatures={"serving_default": functions.serve})
    return {"big": (root / "big" / "2", {"x": np.zeros((8, 5000)).tolist()}),
            "old": (root / "big" / "1", {"x": np.zeros((8, 5000)).tolist()}),
            "table": (root / "table" / "1", {"tokens": ["token_0000007", "nope"]}),
            "functions": (root / "functions" / "1", {"x": [[1.0, 2.0, 3.0, 4.0]]}),
            "root": root}


def _verify(path: Path, *args) -> tuple[int, dict, str]:
    out = path.parent.parent / f"{path.parent.name}.json"
    result = invoke("verify", path, "--json", out, *args)
    return result.returncode, json.loads(out.read_text()), result.stdout


@pytest.mark.slow
@pytest.mark.serving
def test_big_variables_and_the_swap_with_the_version_served_before(models, tmp_path):
    path, feed = models["big"]
    code, report, text = _verify(path, "--max-memory", "1GB", "--max-swap-memory", "50MB",
                                 "--html", tmp_path / "r.html", "--summary", tmp_path / "s.md")
    memory = report["memory"]
    files = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    assert (memory["files_bytes"], memory["estimate_bytes"]) == (files, int(files * 1.2))
    [row] = memory["measured"]
    new, old = independent(path, feed), independent(*models["old"])
    assert close(row["loaded_bytes"], new["loaded"]), (row, new)
    assert close(row["loaded_bytes"], new["rss"], 0.30), (row, new)
    assert row["peak_bytes"] >= row["loaded_bytes"]
    swap = memory["swap"]
    assert swap["old"] == str(models["old"][0].resolve())
    assert close(swap["old_loaded_bytes"], old["loaded"]), (swap, old)
    assert close(swap["peak_bytes"], new["loaded"] + old["loaded"]), (swap, new, old)
    codes = {f["code"]: f for f in report["findings"]}
    assert code == 1 and "swap-memory-limit" in codes and "memory-limit" not in codes  # 1 GB is enough
    assert f"over --max-swap-memory 50 MB" in codes["swap-memory-limit"]["message"]
    assert size_text(swap["peak_bytes"]) in codes["swap-memory-limit"]["message"]
    assert "memory-over-estimate" not in codes  # variables are what the estimate counts well
    assert "TF Serving estimate" in text and "swap" in text
    for rendering in (tmp_path / "r.html", tmp_path / "s.md"):
        assert size_text(swap["peak_bytes"]) in rendering.read_text()


@pytest.mark.slow
@pytest.mark.serving
def test_one_load_at_a_time_counts_the_memory_the_session_reuses(models, monkeypatch):
    """Over ONE_LOAD_AT_A_TIME_BYTES the TF2 load is dropped before the TF1 load; with oneDNN, TensorFlow's CPU
    allocator keeps the dropped tensors' memory and the TF1 load reuses it, so the process does not grow."""
    from exportkit.verify import execute

    monkeypatch.setattr(execute, "ONE_LOAD_AT_A_TIME_BYTES", 10**6)
    path, feed = models["big"]
    code, report, _ = _verify(path, "--no-baseline")
    [row] = report["memory"]["measured"]
    assert close(row["loaded_bytes"], independent(path, feed)["loaded"]), row


@pytest.mark.slow
@pytest.mark.serving
def test_a_lookup_table_from_a_vocabulary_takes_more_than_the_estimate(models):
    path, feed = models["table"]
    code, report, _ = _verify(path, "--max-memory", "10MB")
    [row] = report["memory"]["measured"]
    expected = independent(path, feed)
    assert close(row["loaded_bytes"], expected["loaded"]), (row, expected)
    assert close(row["loaded_bytes"], expected["rss"], 0.30), (row, expected)
    codes = {f["code"]: f["message"] for f in report["findings"]}
    assert row["loaded_bytes"] > 2 * report["memory"]["estimate_bytes"]  # the estimate counts the 7 MB file only
    assert "memory-over-estimate" in codes and "resource tracker would admit" in codes["memory-over-estimate"]
    assert code == 1 and "over --max-memory 10 MB" in codes["memory-limit"]
    assert report["memory"]["swap"] == {"old": None, "why": "no lower version in the base directory"}
    # a gate with nothing it can read is exit 2, never a pass
    result = invoke("verify", path, "--runtimes", "golden,saved_model", "--max-memory", "1GB")
    assert result.returncode == 2 and "--max-memory measured nothing" in result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.serving
def test_many_small_functions_through_the_python_api(models):
    import exportkit

    path, feed = models["functions"]
    report = exportkit.verify(path)
    [row] = report.memory["measured"]
    expected = independent(path, feed)
    assert close(row["loaded_bytes"], expected["loaded"]), (row, expected)
    # the Python loader's garbage from building 120 functions' graphs: a plain RSS difference reads more
    assert row["loaded_bytes"] < expected["rss"], (row, expected)
    assert report.passed and [f.code for f in report.findings if f.code.startswith("memory")] == \
        ["memory-over-estimate"], report.verdict  # 120 functions' graphs and executors in 0.3 MB of files


@pytest.mark.slow
@pytest.mark.gpu
def test_on_a_gpu_the_row_carries_tensorflows_gpu_statistics(request):
    from conftest import has_gpu

    if not has_gpu():
        pytest.skip("no GPU: TensorFlow's GPU:0 statistics need one")
    path, _ = request.getfixturevalue("models")["big"]
    code, report, _ = _verify(path, "--device", "gpu", "--runtimes", "session", "--no-baseline")
    [row] = report["memory"]["measured"]
    assert row["gpu"]["peak_bytes"] >= 60 * 10**6  # the variables live on the GPU


@pytest.mark.slow
def test_diff_measures_the_swap_in_the_new_versions_worker_and_gates_it(models):
    new, old = models["big"], models["old"]
    out = models["root"] / "diff.json"
    result = invoke("diff", old[0], new[0], "--max-swap-memory", "50MB", "--max-memory", "1GB", "--json", out)
    report = json.loads(out.read_text())
    swap, [row] = report["memory"]["swap"], report["memory"]["measured"]
    assert close(row["loaded_bytes"], independent(*new)["loaded"]), row
    assert close(swap["peak_bytes"], independent(*new)["loaded"] + independent(*old)["loaded"]), swap
    gates = {g["name"]: g for g in report["gates"]}
    assert gates["max-memory"]["passed"] and not gates["max-swap-memory"]["passed"]
    assert gates["max-swap-memory"]["value"] == swap["peak_bytes"] and gates["max-swap-memory"]["limit"] == 50 * 10**6
    assert result.returncode == 1 and "max-swap-memory" in result.stdout


@pytest.mark.slow
def test_inspect_gives_the_estimate_without_loading(models):
    path, _ = models["table"]
    result = invoke("inspect", path, "--json")
    files = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    assert json.loads(result.stdout)["memory_estimate"] == {"files_bytes": files, "estimate_bytes": int(files * 1.2)}


@pytest.mark.slow
@pytest.mark.compat
def test_compat_run_gives_the_figure_in_each_tensorflow(models):
    """The standalone worker of a managed TF 2.12 environment measures the same way (tfversions/worker.py)."""
    from exportkit.tfversions.envs import python_for

    path, feed = models["table"]
    out = models["root"] / "compat.json"
    result = invoke("compat", path, "--tf", "2.12,2.21", "--run", "--json", out)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {v["tf"]: v for v in json.loads(out.read_text())["versions"]}
    assert close(rows["2.12"]["memory"]["loaded_bytes"], independent(path, feed, python_for("2.12"))["loaded"])
    assert close(rows["2.21"]["memory"]["loaded_bytes"], independent(path, feed)["loaded"])
    assert "MEMORY" in result.stdout
