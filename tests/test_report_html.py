"""Reports a person looks at: the short verdict line, the HTML reports of verify / verify --data / compat / export
(rendered in headless Chromium, asserted on the page's DOM) and the Markdown summary.

The models are built here the way others write them: a tf.Module saved with tf.saved_model.save whose function
library names an op only TensorFlow Text registers, a Keras model exported by exportkit whose variables were
then changed (a few outliers in one output column), and one of the compat corpus' version-skew models.
One screenshot per report kind is kept in build/reports/ for a person. Tests that start a TensorFlow worker or
export are marked slow; the rest take a second or two.
"""
from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, invoke
from exportkit.verify.latency import latency_text
from exportkit.verify.report import baseline_text

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SHOTS = REPO / "build" / "reports"
UNKNOWN_OP = "Addons>ParseTime"  # tensorflow-addons: no stock TF Serving links it (TF Text ops it does link)
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium: `apt-get install -y chromium` (Debian)")


# ------------------------------------------------------------------------------------------------ browser


def _chromium(*args, timeout=90) -> str:
    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           "--disable-extensions", *args], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


class Dom(HTMLParser):
    """The elements of the page Chromium rendered, each with its attributes and its whole text."""

    VOID = {"meta", "br", "img", "input", "link", "hr", "wbr", "col", "area", "base", "source"}

    def __init__(self, text: str):
        super().__init__()
        self.elements: list[dict] = []
        self._open: list[dict] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        el = {"tag": tag, "attrs": dict(attrs), "text": ""}
        self.elements.append(el)
        if tag not in self.VOID:
            self._open.append(el)

    def handle_startendtag(self, tag, attrs):  # <path ... /> inside SVG: opens and closes at once
        self.elements.append({"tag": tag, "attrs": dict(attrs), "text": ""})

    def handle_endtag(self, tag):
        if any(el["tag"] == tag for el in self._open):
            while self._open.pop()["tag"] != tag:
                pass

    def handle_data(self, data):
        for el in self._open:
            el["text"] += data

    def find(self, tag=None, **attrs) -> list[dict]:
        return [el for el in self.elements if (tag is None or el["tag"] == tag)
                and all(el["attrs"].get(k.replace("_", "-")) == v for k, v in attrs.items())]

    def one(self, tag=None, **attrs) -> dict:
        found = self.find(tag, **attrs)
        assert len(found) == 1, (tag, attrs, len(found))
        return found[0]


def render(page: Path, shot: str) -> Dom:
    """The DOM of `page` as headless Chromium built it; a screenshot of it is kept as build/reports/SHOT.png."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    dom = _chromium(f"--screenshot={SHOTS / shot}.png", "--window-size=1200,1600", "--dump-dom",
                    page.resolve().as_uri())  # one launch does both
    assert (SHOTS / f"{shot}.png").stat().st_size > 10_000
    return Dom(dom)


def assert_self_contained(text: str) -> None:
    """No script, stylesheet link, font, image or anything else fetched: the file is the whole report."""
    lowered = text.lower()
    for needle in ("<script", "<link", "@import", "@font-face", " src=", "<iframe", "<img"):
        assert needle not in lowered, needle
    assert not re.search(r"url\((?!#)|href=\"(?!#)", lowered)  # only references inside the page (SVG clip paths)


# ------------------------------------------------------------------------------------------------ models


def _unknown_op_module(directory: Path) -> Path:
    """A third-party SavedModel (tf.Module + tf.saved_model.save) whose serving function runs an op of a library no
    stock server links (tensorflow-addons)."""
    import tensorflow as tf

    from exportkit.savedmodel.reader import read_saved_model_proto

    class Tokenizer(tf.Module):
        def __init__(self):
            self.w = tf.Variable(tf.random.stateless_normal([4, 3], seed=[1, 2]))

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
        def serve(self, x):
            return {"y": tf.nn.relu(tf.matmul(x, self.w))}

    module = Tokenizer()
    path = directory / "tok" / "1"
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    proto = read_saved_model_proto(path)  # as if written where tensorflow-addons was imported: its op in the library
    node = next(n for f in proto.meta_graphs[0].graph_def.library.function for n in f.node_def if n.op == "Relu")
    node.op = UNKNOWN_OP
    (path / "saved_model.pb").write_bytes(proto.SerializeToString())
    return path.parent


def _change_one_weight(version_dir: Path) -> None:
    """Retrained behind the export's back: tiny noise on the hidden kernel (within tolerance everywhere), and one
    weight of the output layer moved, so output column 2 is off wherever hidden unit 0 is active: a few outliers."""
    import tensorflow as tf

    prefix = str(version_dir / "variables" / "variables")
    reader = tf.train.load_checkpoint(prefix)
    rng = np.random.default_rng(0)
    names, tensors = [], []
    for name, dtype in sorted(reader.get_variable_to_dtype_map().items()):
        value = reader.get_tensor(name)
        if dtype.is_floating and value.shape == (6, 8):
            value = (value + rng.normal(0, 1e-6, value.shape)).astype(value.dtype)
        elif dtype.is_floating and value.shape == (8, 4):
            value = value.copy()
            value[0, 2] += 0.05
        names.append(name)
        tensors.append(tf.constant(value, dtype=dtype))
    for stale in (version_dir / "variables").iterdir():
        stale.unlink()
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors)


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """The models and an export of the Keras one (its HTML report and summary written by that export)."""
    import keras

    root = tmp_path_factory.mktemp("reports")
    inputs = keras.Input((6,), name="features")
    init = keras.initializers.GlorotUniform(seed=1)
    hidden = keras.layers.Dense(8, activation="relu", kernel_initializer=init, name="hidden")(inputs)
    model = keras.Model(inputs, {"score": keras.layers.Dense(4, kernel_initializer=init, name="score")(hidden)})
    model.save(root / "ranker.keras")
    proc = invoke("export", root / "ranker.keras", "-o", root / "ranker", "--html", root / "export.html",
                  "--summary", root / "export.md")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shutil.copytree(root / "ranker", root / "changed")
    _change_one_weight(root / "changed" / "1")
    return {"root": root, "export": proc, "tok": _unknown_op_module(root), "changed": root / "changed",
            "source": root / "ranker.keras"}


def _verify(*args) -> tuple[int, dict, str]:
    proc = invoke("verify", *args, "--serving", "none", "--json", "-")
    return proc.returncode, json.loads(proc.stdout), proc.stderr


# ------------------------------------------------------------------------------------------------ verify


@needs_chromium
@pytest.mark.slow
def test_verify_html_shows_the_outliers_in_the_tail_and_names_the_worst_element(built):
    page = built["root"] / "changed.html"
    code, report, _ = _verify(built["changed"], "--runtimes", "golden,session", "--html", page,
                              "--summary", built["root"] / "changed.md", "--junit", built["root"] / "changed.xml")
    assert code == 1, report["verdict"]
    session = next(r for r in report["runtimes"] if r["name"] == "session")
    score = session["outputs"][0]
    assert not score["passed"] and score["worst_index"][-1] == 2  # column 2 is the one moved

    # the comparison's fixed-size histogram: every element over tolerance sits in the tail, above atol
    hist = score["abs_err_histogram"]
    over_bins = [i for i, n in enumerate(hist["over"]) if n]
    assert sum(hist["over"]) == score["mismatched"] > 0
    assert 10 ** (hist["start"] + over_bins[0] / hist["bins_per_decade"]) >= score["atol"]
    assert over_bins[-1] == len(hist["counts"]) - 1  # the last bin: the tail
    assert sum(hist["counts"]) + hist["zeros"] == score["elements"]
    worst = score["worst_elements"][0]
    assert worst["index"] == score["worst_index"] and worst["excess"] > 0

    text = page.read_text()
    assert_self_contained(text)
    dom = render(page, "verify")
    verdict = dom.one(id="verdict")
    assert verdict["attrs"]["class"] == "verdict fail" and verdict["text"] == report["verdict"]
    cell = dom.one("td", data_runtime="session", data_output="score")
    assert cell["attrs"]["class"] == "fail" and "over tolerance" in cell["text"]
    assert dom.one("td", data_runtime="golden", data_output="score")["attrs"]["class"] == "ref"
    section = dom.one("section", data_output="score")
    assert "FAIL" in section["text"] and f"worst element {score['worst_index']}" in section["text"]
    rows = dom.one("table", id="worst-score")["text"].split("beyond allowance", 1)[1].strip()
    assert rows.startswith(str(worst["index"]))  # the first row: the worst element
    assert dom.find("svg") and "#d62728" in text  # the figure, with over-tolerance bars in red
    tensors = dom.one("table", id="input-tensors")["text"]
    assert "features" in tensors and "float32" in tensors

    summary = (built["root"] / "changed.md").read_text()
    assert "| session | score | ❌ FAIL |" in summary and report["verdict"] in summary

    # what the text report says besides the table: the toolchain and server flags, the baseline, the latencies
    latency = latency_text(session["latency"])
    assert session["latency"]["requests"] == len(report["inputs"]["batch_sizes"]) and latency != "-"
    toolchain, baseline = dom.one(id="toolchain")["text"], dom.one(id="baseline")["text"]
    assert f"TensorFlow {report['toolchain']['tensorflow']}" in toolchain and "server flags: stock" in toolchain
    assert baseline == baseline_text(report["baseline"]) and baseline.startswith("baseline: ")
    assert latency in dom.one("td", data_latency="session")["text"]
    assert dom.one("td", data_latency="golden")["text"] == "-"  # a recorded runtime is not timed
    assert toolchain in summary and baseline in summary and "first/p50/p99 ms" in summary and latency in summary
    props = {p.get("name"): p.get("value") for p in ET.parse(built["root"] / "changed.xml").iter("property")}
    assert props["toolchain"] in toolchain and props["server_flags"] == "stock" and props["baseline"] == baseline
    assert props["latency.session"].startswith(f"{latency} ms") and "latency.golden" not in props


@needs_chromium
@pytest.mark.slow
def test_verify_of_a_model_the_runtimes_cannot_load(built, tmp_path, monkeypatch):
    step = tmp_path / "step_summary.md"
    step.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    page = tmp_path / "tok.html"
    code, report, _ = _verify(built["tok"], "--runtimes", "saved_model,session", "--html", page)
    assert code == 1
    verdict = report["verdict"]
    assert len(verdict) < 200, verdict
    assert verdict == (f"FAILED: 1 error finding (unknown-op); saved_model, session: could not load the model "
                       f"(unknown op {UNKNOWN_OP})")
    dom = render(page, "verify-unloadable")
    assert dom.one(id="verdict")["text"] == verdict
    for name in ("saved_model", "session"):
        cell = dom.one("td", data_runtime=name, data_output="")
        assert cell["attrs"]["class"] == "error" and UNKNOWN_OP in cell["text"]
    assert "unknown-op" in dom.one("table", id="findings")["text"]
    assert step.read_text().startswith("earlier step\n") and verdict in step.read_text()  # appended


@needs_chromium
@pytest.mark.slow
def test_verify_data_html_has_quantiles_and_the_worst_records(built, tmp_path):
    rng = np.random.default_rng(0)
    for i in range(2):
        np.savez(tmp_path / f"shard-{i}.npz", features=rng.normal(size=(200, 6)).astype(np.float32))
    page = tmp_path / "data.html"
    code, report, _ = _verify(built["changed"], "--against", built["source"], "--runtimes", "keras,session",
                              "--data", tmp_path / "shard-*.npz", "--html", page)
    assert code == 1, report["verdict"]
    score = next(r for r in report["runtimes"] if r["name"] == "session")["outputs"][0]
    worst = score["worst_records"][0]
    dom = render(page, "verify-data")
    quantiles = dom.one("table", id="quantiles-score")["text"]
    assert "p99.9" in quantiles and f"{score['abs_err_quantiles']['p99']:.3g}" in quantiles
    assert f"{Path(worst['file']).name}:{worst['index']}" in dom.one("section", data_output="score")["text"]
    assert dom.find("svg")


# ------------------------------------------------------------------------------------------------ compat


@needs_chromium
def test_compat_html_matrix_of_versions_and_devices(tmp_path):
    import compat_corpus

    model = compat_corpus.new_op_cpu(tmp_path / "conv" / "1").parent
    page, md = tmp_path / "compat.html", tmp_path / "compat.md"
    proc = invoke("compat", model, "--tf", "2.12-2.21", "--html", page, "--summary", md)
    assert proc.returncode == 1
    last = proc.stdout.strip().splitlines()[-1]
    assert last == "FAILED: TF 2.12-2.13: could not load the model (unknown op Conv)", last
    dom = render(page, "compat")
    assert dom.one(id="verdict")["text"] == last
    for device in ("cpu", "gpu"):
        old = dom.one("td", data_tf="2.12", data_device=device, data_kind="predicted")
        assert old["attrs"]["class"] == "fails" and "Conv" in old["text"]
    new = dom.one("td", data_tf="2.21", data_device="cpu", data_kind="predicted")
    assert new["attrs"]["class"] == "ok"
    assert "| 2.12 | ❌ fails |" in md.read_text()


@needs_chromium
@pytest.mark.slow
def test_compat_html_predicted_against_observed(built, tmp_path):
    page = tmp_path / "compat-run.html"
    proc = invoke("compat", built["tok"], "--tf", "2.21", "--run", "--html", page)
    assert proc.returncode == 1
    dom = render(page, "compat-observed")
    observed = dom.one("td", data_tf="2.21", data_device="cpu", data_kind="observed")
    assert observed["attrs"]["class"] == "fails" and UNKNOWN_OP in observed["text"]
    assert dom.one(id="agreement")["text"] == "predicted and observed agree on 1 of 1 versions"


# ------------------------------------------------------------------------------------------------ export


@needs_chromium
@pytest.mark.slow
def test_export_html_and_summary(built):
    out = built["export"].stdout.strip().splitlines()
    assert out[-1].startswith("PASSED: exported ") and len(out[-1]) < 200
    page = built["root"] / "export.html"
    assert_self_contained(page.read_text())
    dom = render(page, "export")
    assert dom.one(id="verdict")["text"] == out[-1]
    signature = dom.one("table", id="signature-serving_default")["text"]
    assert "features" in signature and "score" in signature
    assert "| serving_default | input | features | float32 |" in (built["root"] / "export.md").read_text()


def test_export_failure_leaves_a_report_and_keeps_its_exit_code(tmp_path):
    src = tmp_path / "not_a_model.keras"
    src.write_bytes(b"not a zip")
    page = tmp_path / "export.html"
    proc = invoke("export", src, "-o", tmp_path / "out", "--html", page)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    text = page.read_text()
    assert 'class="verdict fail"' in text and "FAILED:" in text and 'id="fix"' in text


# ------------------------------------------------------------------------------------------------ pure parts


def test_comparison_summaries_are_bounded_and_merge_over_batches():
    from exportkit.compare.outputs import compare_batches
    from exportkit.compare.summaries import SAMPLE_PAIRS, WORST_ELEMENTS
    from exportkit.compare.tolerances import Tolerance

    rng = np.random.default_rng(1)
    expected = [{"y": rng.normal(size=(500, 10)).astype(np.float32)} for _ in range(3)]
    actual = [{"y": e["y"] + np.float32(1e-7)} for e in expected]
    actual[2]["y"][17, 4] += 3.0  # one outlier, in the third batch
    [c] = compare_batches(expected, actual, lambda key, dtype: Tolerance(1e-5, 1e-5))
    assert not c.passed and c.mismatched == 1
    assert c.worst_elements[0]["index"] == [2, 17, 4] == list(c.worst_index)
    assert len(c.worst_elements) == WORST_ELEMENTS and len(c.sample_pairs["expected"]) == SAMPLE_PAIRS
    hist = c.abs_err_histogram
    assert sum(hist["counts"]) + hist["zeros"] == c.elements == 15000
    assert hist["over"][-1] == 1 and sum(hist["over"]) == 1  # the outlier is the tail
    json.dumps(c.to_dict(), allow_nan=False)


def test_strings_name_their_differences_and_draw_nothing():
    from exportkit.compare.outputs import compare_arrays
    from exportkit.compare.tolerances import EXACT

    c = compare_arrays("label", np.array([b"a", b"b", b"c"]), np.array([b"a", b"x", b"c"]), EXACT)
    assert [w["index"] for w in c.worst_elements] == [[1]] and c.worst_elements[0]["excess"] == math.inf
    assert c.abs_err_histogram is None and c.sample_pairs is None


def test_verdict_line_stays_short_with_many_failures():
    from exportkit.compare.outputs import OutputComparison
    from exportkit.verify.report import RuntimeResult, VerifyReport, verdict_line

    error = ("tf.saved_model.load failed: RuntimeError: Op type not registered 'MyOp' in binary running on vm. "
             "Make sure the Op and Kernel are registered in the binary running in this process. " * 5)
    runtimes = [RuntimeResult("golden", "recorded", is_reference=True)]
    runtimes += [RuntimeResult(name, "subprocess", status="error", error=error) for name in ("saved_model", "serving")]
    runtimes.append(RuntimeResult("session", "subprocess", comparisons=[
        OutputComparison(f"output_{i}", False, f"{i + 1} of 64 elements over tolerance", mismatched=i + 1)
        for i in range(12)]))
    line = verdict_line(VerifyReport("m/1", "serving_default", "golden", runtimes))
    assert len(line) <= 200, line
    assert line.startswith("FAILED: saved_model, serving: could not load the model (unknown op MyOp); "
                           "session: output 'output_0' 1 of 64 elements over tolerance")
    assert line.endswith("more (see above)") and line.count("saved_model") == 1


def test_report_options_are_checked_before_any_work(tmp_path, monkeypatch):
    import sys

    from exportkit.errors import UsageError
    from exportkit.report.artifacts import check_report_options, write_report

    with pytest.raises(UsageError) as err:
        check_report_options(str(tmp_path / "missing" / "r.html"), None)
    assert err.value.exit_code == 2 and err.value.remedy
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the report extra were not installed
    with pytest.raises(UsageError, match="matplotlib") as err:
        check_report_options(str(tmp_path / "r.html"), None)
    assert "exportkit[report]" in err.value.remedy
    check_report_options(None, str(tmp_path / "s.md"))  # a summary needs no plots

    def broken():
        raise RuntimeError("boom")

    assert write_report(str(tmp_path / "r.html"), broken) is False  # a warning, never an exception
    assert not list(tmp_path.iterdir())  # and nothing half-written


def test_one_histogram_grid_for_compared_and_streamed_errors():
    """verify's histograms (computed in one pass) and --data's (coarsened from data.stats' bins) share the grid,
    so the two kinds of report draw the same bars for the same errors."""
    from exportkit.compare.stats import LogHistogram
    from exportkit.compare.summaries import error_histogram, histogram_summary

    values = np.concatenate([10 ** np.random.default_rng(2).uniform(-12, 3, 5000), np.zeros(7), [np.inf]])
    streamed = LogHistogram()
    streamed.add(values)
    hist = error_histogram(values)
    assert hist == histogram_summary(streamed) and hist["zeros"] == 7 and sum(hist["counts"]) == 5001
