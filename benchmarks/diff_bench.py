"""`exportkit diff --data` benchmark (a section of bench.py's profiles, or alone): issue 49's case, a day of logged
Predict requests. `exportkit diff OLD NEW --data LOGS` against a hand-written loop over the two loaded models
(benchmarks/diff_loop.py), side by side in PAIRS alternating pairs (the median ratio and its range: the machine is
shared), and the peak RSS of the whole process tree at N/10 and N records (memory must not grow with the records).

    python benchmarks/diff_bench.py [--records N] [--out build/bench] [--json FILE]   # default N=1,000,000

The case: a classifier over serialized tf.Example (a tf.Module whose predict signature takes a batch of serialized
Examples `examples`, 16 float features, and answers [batch, 10] `scores`; version 2 moves the weights a little),
N PredictLog records (one Example per request, as a client sends them) in FILES GZIP-compressed TFRecord shards.
The model is small so that reading, replaying, the two session workers and the statistics are measured.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from harness import mark, measure, median, section_main

FILES = 4  # GZIP shards
BATCH = 1024  # both sides batch the same
PAIRS = 3
TARGET = 1.5  # issue 49: diff --data <= 1.5x the hand-written loop
RSS_TARGET = 1.15  # peak RSS at N / at N/10

BUILD = """
import sys, numpy as np, tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_log_pb2
out, records, files = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
FEATURES, CLASSES = 16, 10
rng = np.random.default_rng(0)

class Classifier(tf.Module):
    def __init__(self, w, b):
        super().__init__()
        self.w, self.b = tf.Variable(w), tf.Variable(b)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def predict(self, examples):
        x = tf.io.parse_example(examples, {"x": tf.io.FixedLenFeature([FEATURES], tf.float32)})["x"]
        return {"scores": tf.nn.softmax(tf.matmul(x, self.w) + self.b)}

w, b = rng.standard_normal((FEATURES, CLASSES)).astype("float32"), np.zeros(CLASSES, "float32")
for version, (wv, bv) in (("1", (w, b)), ("2", (w + rng.normal(0, 0.05, w.shape).astype("float32"), b + 0.01))):
    module = Classifier(wv, bv)
    tf.saved_model.save(module, f"{out}/model/{version}", signatures={"serving_default": module.predict})
per_file = records // files
for f in range(files):
    with tf.io.TFRecordWriter(f"{out}/requests-{f:05d}-of-{files:05d}.gz", "GZIP") as writer:
        for row in rng.standard_normal((per_file, FEATURES)).astype("float32"):
            example = tf.train.Example()
            example.features.feature["x"].float_list.value.extend(row)
            request = predict_pb2.PredictRequest()
            request.model_spec.name = "classifier"
            request.model_spec.signature_name = "serving_default"
            tensor = request.inputs["examples"]
            tensor.dtype = tf.string.as_datatype_enum
            tensor.tensor_shape.dim.add().size = 1
            tensor.string_val.append(example.SerializeToString())
            writer.write(prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request)).SerializeToString())
"""


def build(out: Path, records: int, log) -> dict:
    """Two versions and `records` PredictLog records (built once, reused when present)."""
    out = out / f"predict-n{records}"
    out.mkdir(parents=True, exist_ok=True)
    marker = out / "built"
    if not marker.exists():
        log(f"  diff: building two versions and {records} PredictionLog records in {out}")
        subprocess.run([sys.executable, "-c", BUILD, str(out), str(records), str(FILES)], check=True,
                       capture_output=True)
        marker.touch()
    files = sorted(str(p) for p in out.glob("requests-*.gz"))
    return {"dir": out, "old": out / "model" / "1", "new": out / "model" / "2", "files": files}


def _records(name: str, r: dict, report: Path) -> int | None:
    """The records the run compared: the loop prints them, diff's --json report counts them."""
    try:
        if name.endswith("loop"):
            return int(r["stdout"].split()[0])
        return json.loads(report.read_text())["inputs"]["records"]
    except (IndexError, ValueError, OSError, KeyError):
        return None


def run_diff(out: Path, records: int, log, exportkit: str) -> dict:
    """Rows {name: measure() result + the records compared}: PAIRS (loop, diff) pairs at `records`, alternating
    which goes first, then diff at records/10 for the memory ratio."""
    d = build(out, records, log)
    report = d["dir"] / "report.json"
    diff = [exportkit, "diff", str(d["old"]), str(d["new"]), "--data", ",".join(d["files"]),
            "--batch-size", str(BATCH), "--json", str(report)]
    loop = [sys.executable, str(Path(__file__).with_name("diff_loop.py")), str(d["old"]), str(d["new"]), str(BATCH),
            *d["files"]]
    runs = []
    for pair in range(1, PAIRS + 1):
        sides = [(f"pair {pair}: loop", loop), (f"pair {pair}: diff", diff)]
        runs += sides if pair % 2 else sides[::-1]
    runs.append((f"memory: diff, {records // 10} records", diff + ["--limit", str(records // 10)]))
    results = {}
    for name, argv in runs:
        log(f"  diff: {name}")
        report.unlink(missing_ok=True)
        r = measure(argv, timeout=7200, warmed=d["dir"])  # the records and models read once first, untimed
        r["records"] = _records(name, r, report)
        results[name] = r
        log(f"  diff: {name}: rc {r['rc']}, {r['seconds']:.1f} s, {r['records']} records, "
            f"tree RSS {r['tree_rss_mb'] or 0:.0f} MB")
    return results


def summary(results: dict) -> dict:
    """The pairs' ratios (diff / loop), their median and range, and the peak RSS ratio N / N/10."""
    ratios = []
    for pair in range(1, PAIRS + 1):
        loop, diff = results.get(f"pair {pair}: loop"), results.get(f"pair {pair}: diff")
        if loop and diff and loop["rc"] == 0 and diff["rc"] in (0, 1) and loop["records"] == diff["records"]:
            ratios.append(diff["seconds"] / loop["seconds"])
    full = [r["tree_rss_mb"] for n, r in results.items() if n.endswith(": diff") and r["tree_rss_mb"]]
    small = next((r["tree_rss_mb"] for n, r in results.items() if n.startswith("memory")), None)
    return {"ratios": ratios, "ratio": median(ratios),
            "rss_ratio": max(full) / small if full and small else None}


def render_diff(results: dict) -> list[str]:
    if not results:
        return []
    s = summary(results)
    lines = ["", "### exportkit diff --data (issue 49: a tf.Example classifier, logged Predict requests, GZIP)", "",
             "| run | exit | records | wall s | ms / 1,000 records | peak RSS tree MB |", "|---|---|---|---|---|---|"]
    for name, r in results.items():
        per = f"{1e6 * r['seconds'] / r['records']:.1f}" if r["records"] else "-"
        lines.append(f"| {name} | {r['rc']} | {r['records'] or '-'} | {r['seconds']:.1f} | {per} | "
                     f"{r['tree_rss_mb'] or 0:.0f} |")
    spread = f", range {min(s['ratios']):.2f}-{max(s['ratios']):.2f}" if s["ratios"] else ""
    lines.append(f"\ndiff / loop, median of {len(s['ratios'])} pairs: {mark(s['ratio'], TARGET)}{spread} "
                 f"(goal <= {TARGET}x; a pair whose sides compared different record counts is left out)")
    lines.append(f"Peak RSS of the tree at N / at N/10 records: {mark(s['rss_ratio'], RSS_TARGET)} "
                 f"(goal <= {RSS_TARGET}x)")
    return lines


def main(argv=None) -> int:
    return section_main(argv, __doc__.splitlines()[0], "diff", 1_000_000, run_diff, render_diff)


if __name__ == "__main__":
    sys.exit(main())
