"""`exportkit diff --data` benchmark (a section of bench.py's profiles, or alone): time per 1,000 PredictionLog
records of the in-process diff next to a hand-written loop over the two loaded models (benchmarks/diff_loop.py),
and the peak RSS of the whole process tree at N/10 and N records (memory must not grow with the record count).

    python benchmarks/diff_bench.py [--records N] [--out build/bench] [--json FILE]   # alone: N=1,000,000 gives 100k vs 1M

The model is tiny (a classify signature over tf.Examples of 16 floats, 4 classes; version 2 perturbs the weights)
so that reading, replaying, running the two session workers and the statistics are measured, not the model.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from harness import measure, section_main

FILES = 8  # the records are spread over FILES files, half of them GZIP
BATCH = 1024  # diff's default --batch-size; the loop batches the same

BUILD = """
import sys, numpy as np, tensorflow as tf
from tensorflow_serving.apis import classification_pb2, prediction_log_pb2
out, records, files = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
v1 = tf.compat.v1
rng = np.random.default_rng(0)
w = rng.standard_normal((16, 4)).astype("float32")
for version, weights in (("1", w), ("2", w + rng.normal(0, 0.05, w.shape).astype("float32"))):
    with tf.Graph().as_default() as g, v1.Session(graph=g) as sess:
        serialized = v1.placeholder(tf.string, shape=[None], name="tf_example")
        x = v1.parse_example(serialized, {"x": v1.FixedLenFeature([16], tf.float32)})["x"]
        scores = tf.nn.softmax(tf.matmul(x, v1.Variable(weights)))
        classes = tf.tile(tf.constant([[b"a", b"b", b"c", b"d"]]), [tf.shape(scores)[0], 1])
        sess.run(v1.global_variables_initializer())
        info = v1.saved_model.utils.build_tensor_info
        sig = v1.saved_model.signature_def_utils.build_signature_def(
            {"inputs": info(serialized)}, {"scores": info(scores), "classes": info(classes)}, "tensorflow/serving/classify")
        builder = v1.saved_model.builder.SavedModelBuilder(f"{out}/model/{version}")
        builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={"serving_default": sig})
        builder.save()
per_file = records // files
for f in range(files):
    xs = rng.standard_normal((per_file, 16)).astype("float32")
    with tf.io.TFRecordWriter(f"{out}/logs-{f}.tfrecord", "GZIP" if f % 2 else None) as writer:
        for row in xs:
            request = classification_pb2.ClassificationRequest()
            request.model_spec.signature_name = "serving_default"
            request.input.example_list.examples.add().features.feature["x"].float_list.value.extend(row)
            writer.write(prediction_log_pb2.PredictionLog(
                classify_log=prediction_log_pb2.ClassifyLog(request=request)).SerializeToString())
"""


def build(out: Path, records: int, log) -> dict:
    """Two versions and `records` ClassifyLog records (built once, reused when present)."""
    out = out / f"n{records}"
    out.mkdir(parents=True, exist_ok=True)
    marker = out / "built"
    if not marker.exists():
        log(f"  diff: building two versions and {records} PredictionLog records in {out}")
        subprocess.run([sys.executable, "-c", BUILD, str(out), str(records), str(FILES)], check=True,
                       capture_output=True)
        marker.touch()
    files = sorted(str(p) for p in out.glob("logs-*.tfrecord"))
    return {"old": out / "model" / "1", "new": out / "model" / "2", "files": files}


def run_diff(out: Path, records: int, log, exportkit: str) -> dict:
    """Rows {name: measure() result + records and ms per 1,000 records}."""
    d = build(out, records, log)
    data = ",".join(d["files"])
    diff = [exportkit, "diff", str(d["old"]), str(d["new"]), "--data", data, "--batch-size", str(BATCH)]
    rows = {
        "loop": ([sys.executable, str(Path(__file__).with_name("diff_loop.py")), str(d["old"]), str(d["new"]),
                  str(BATCH), *d["files"]], records),
        "diff (in-process)": (diff, records),
        f"memory: diff, {records // 10} records": (diff + ["--limit", str(records // 10)], records // 10),
    }
    results = {}
    for name, (argv, n) in rows.items():
        log(f"  diff: {name}")
        r = measure(argv, timeout=7200)
        r["records"] = n
        r["ms_per_1000"] = 1000 * r["seconds"] / n * 1000 if r["rc"] in (0, 1) else None
        results[name] = r
        log(f"  diff: {name}: rc {r['rc']}, {r['seconds']:.1f} s, {r['ms_per_1000'] or 0:.0f} ms per 1,000 records, "
            f"tree RSS {r['tree_rss_mb'] or 0:.0f} MB")
    return results


def render_diff(results: dict) -> list[str]:
    if not results:
        return []
    loop = results.get("loop", {}).get("seconds")
    lines = ["", "### exportkit diff --data (two versions over the same PredictionLog records)", "",
             "| run | exit | records | wall s | ms / 1,000 records | x loop | peak RSS tree MB |",
             "|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        ratio = f"{r['seconds'] / loop:.2f}x" if loop and not name.startswith("memory") else "-"
        lines.append(f"| {name} | {r['rc']} | {r['records']} | {r['seconds']:.1f} | {r['ms_per_1000'] or 0:.0f} | "
                     f"{ratio} | {r['tree_rss_mb'] or 0:.0f} |")
    full, small = results.get("diff (in-process)"), next((r for n, r in results.items() if n.startswith("memory")), None)
    if full and small and small["tree_rss_mb"] and full["tree_rss_mb"]:
        lines.append(f"\nPeak RSS at {full['records']} records / at {small['records']}: "
                     f"{full['tree_rss_mb'] / small['tree_rss_mb']:.3f}x (goal <= 1.15x)")
    return lines


def main(argv=None) -> int:
    return section_main(argv, __doc__.splitlines()[0], "diff", 1_000_000, run_diff, render_diff)

if __name__ == "__main__":
    sys.exit(main())
