"""exportkit benchmark: every exportkit command next to what a user would run instead, same model, same run.

    python benchmarks/bench.py [--samples-dir build/samples] [--out build/bench]
                               [--profile default|quick|full|scale | --quick | --full | --scale]
                               [--runs N] [--app-runs N] [--scale-runs N] [--models a,b,...] [--scaling-model NAME]
                               [--scaling-runs N] [--predict-models a,b] [--predict-calls N]

A benchmark, not a test: it exits 0 once the table is written (a failed command is marked FAIL in the table
and kept in results.json); only its own set-up failing is an error.

Every figure is the median over the runs; every run is a fresh subprocess, timed wall-clock with
`time.perf_counter` around spawn + `os.wait4` (what `subprocess.run` does). Two memory figures per command:
  * peak RSS, tree: the highest *sum* of RSS over the command's whole process tree (the command, the session
    worker, the embedded server, ...), sampled every 100 ms with psutil (one sample costs ~2 ms of CPU; at
    20 ms the sampler itself took ~10% of a core): the memory a CI machine must have;
  * peak RSS, largest process: `ru_maxrss` from `os.wait4` (the kernel's exact peak of the largest single
    process among the command and every descendant it waited for).
exportkit and its baseline run back to back (A, B, A, B, ...) so machine drift hits both alike.

Rows (ratio = exportkit / baseline; a row meets its goal only if its commands succeed and every ratio that has
a target does):                                                                          time      RSS (tree)
  inspect   `exportkit inspect DIR`                vs `saved_model_cli show --all --dir DIR`          <= 0.25x
  export    `exportkit export SRC -o BASE`         vs benchmarks/export_baseline.py (load_model + model.export,
            (with its self-check)                     custom objects passed the same way)             <= 1.2x   <= 1.2x
  verify    `exportkit verify DIR --serving embedded` (every local runtime and the embedded gRPC server)
                                                   vs `saved_model_cli run ... --input_exprs` on one batch of 8
                                                      (`--inputs KEY=x.npy` where the literal would exceed the
                                                      128 KiB argv-string limit, e.g. images)          <= 1.2x   <= 2.0x
                                                                              (1 GB model: <= 1.5x RSS)
  predict   ServingClient.predict per call         vs a bare PredictionServiceStub.Predict loop on a pre-built
            request, against the same running `exportkit serve` (median per call)                     <= 1.1x
plus `exportkit verify --samples 1, 100, 1000` on one model (wall time, peak RSS, per-runtime seconds; REST's
seconds over the gRPC server's <= 2x at 1000), the error summaries' cost (benchmarks/summaries_bench.py), and
compat: the static analysis of all ten TF versions on a 1,000-node graph (benchmarks/compat_static.py, registries
read cold; < 1 s) and, with a warm environment (`--compat-tf`, default 2.12; installed first if missing, not
timed), `exportkit verify DIR --runtimes golden --tf X.Y` vs `... --runtimes golden,session` (wall; <= 1.3x),
plus the wall time of `exportkit compat DIR --tf X.Y --run`; and `verify --data` (benchmarks/data_bench.py;
<= 1.1x a hand-written loop; the same records in gs:// on a local GCS emulator <= 1.3x local disk); and
`exportkit diff --data` on 1M logged Predict requests (benchmarks/diff_bench.py: alternating pairs with a
hand-written loop over the two loaded models, <= 1.5x; peak RSS at N/10 and N records).

Models: samples from `make samples` (samples.json), keras.applications models (seeded random weights,
`weights=None`) and scale_1gb: the model of issue 12, `Input((16,), int32)` -> `Embedding(2_000_000, 128)` (1 GB of
float32) -> GlobalAveragePooling1D -> Dense(64, relu) -> Dense(1), seeded, built by benchmarks/build_scale.py
(~11 s, ~1 GB on disk). All are built into OUT/models/ on first use and reused after.

Profiles (`make bench` runs the default one; times measured on 2 cores):
  default   mixed_functional.keras (custom objects): 3 runs; mobilenet_v2 (keras.applications MobileNetV2,
            96x96x3, ~3.5M params), resnet50 (ResNet50, 64x64x3, ~25.6M params): 1 run each; scale_1gb: 3 runs
            (one run of its export and baseline spans 16-24 s from one minute to the next here: Keras' load_model);
            verify --samples 1/100/1000 on mobilenet_v2, 1 run each; predict on mixed_functional.keras, 200 calls
            per client; verify --data on 100k records. ~12 minutes (scale_1gb alone ~1 min a run: export ~20 s,
            its baseline ~18 s, verify ~7 s, saved_model_cli run ~6 s, inspect and show ~6 s; tree RSS up to ~6 GB).
  --quick   1 run of mixed_functional.keras and mobilenet_v2; verify --samples 1/100 only; no scale_1gb, no
            verify --data. ~3 minutes.
  --full    3 runs of everything; also multi_io.keras; predict also on mobilenet_v2. ~25 minutes.
  --scale   only the scale_1gb rows (inspect, export, verify), 2 runs: no predict, --samples, compat or --data
            rows. ~2 minutes plus ~11 s to build the model the first time.
The options after --scale override a profile's values.

Output: the Markdown table on stdout, also in OUT/results.md; raw numbers (every run) in OUT/results.json.
Each run's export output is deleted after the run; the first run's SavedModel per model stays in OUT/work/.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness import (APP_MODELS, BIN, HERE, REPO, SCALE_MODELS, child_env, fmt_mb, fmt_s, killpg, logger, machine,
                     mark, measure, median, meets, resolve_models, run_section, tails, warm)

# issue 34: verify <= 1.2x saved_model_cli run in time everywhere and <= 1.5x in peak RSS on the 1 GB model
# (2.0x on the small ones, where one TensorFlow import is most of either command's memory); REST within 2x of
# gRPC on --samples 1000; the error summaries <= 1.1x the bare comparison (benchmarks/summaries_bench.py).
TARGETS = {"inspect": 0.25, "export": 1.2, "verify": 1.2, "predict": 1.1, "rest": 2.0,
           "compat_static_s": 1.0, "compat_observed": 1.3}
RSS_TARGETS = {"export": 1.2, "verify": 2.0}  # peak RSS of the whole process tree, exportkit / baseline
SCALE_RSS_TARGETS = {"verify": 1.5}  # the same on the 1 GB model
DIFF_RECORDS = 1_000_000  # issue 49's scale for the diff --data section (where a profile measures --data at all)
PROFILES = {
    "quick": dict(runs=1, app_runs=1, scale_runs=1, models=["mixed_functional.keras", "mobilenet_v2"],
                  scaling_model="mobilenet_v2", scaling_runs=1, scaling_samples=[1, 100], predict_calls=100,
                  predict_models=["mixed_functional.keras"], data_records=0, compat_tf="2.12"),
    "default": dict(runs=3, app_runs=1, scale_runs=3,
                    models=["mixed_functional.keras", "tfk2_mixed.h5", "mobilenet_v2", "resnet50", "scale_1gb"],
                    scaling_model="mobilenet_v2", scaling_runs=1, scaling_samples=[1, 100, 1000], predict_calls=200,
                    predict_models=["mixed_functional.keras"], data_records=100_000, compat_tf="2.12"),
    "full": dict(runs=3, app_runs=3, scale_runs=3,
                 models=["mixed_functional.keras", "tfk2_mixed.h5", "multi_io.keras", "mobilenet_v2", "resnet50",
                         "scale_1gb"],
                 scaling_model="mobilenet_v2", scaling_runs=3, scaling_samples=[1, 100, 1000], predict_calls=300,
                 predict_models=["mixed_functional.keras", "mobilenet_v2"], data_records=100_000, compat_tf="2.12"),
    "scale": dict(runs=2, app_runs=2, scale_runs=2, models=["scale_1gb"], scaling_model="", scaling_runs=1,
                  scaling_samples=[], predict_calls=0, predict_models=[], data_records=0, compat_tf=""),
}
SMCLI_BATCH = 8          # = exportkit verify's default --samples
INPUT_EXPRS_LIMIT = 20_000  # elements; above it the batch goes through --inputs KEY=file.npy (argv size limit)


# --------------------------------------------------------------------------------------------- baselines
def smcli_inputs(version_dir: Path, scratch: Path) -> tuple[list[str], str]:
    """saved_model_cli input flags for one batch of SMCLI_BATCH rows, from the export's manifest signature.

    Small inputs as `--input_exprs` Python literals (saved_model_cli evaluates them with ast.literal_eval);
    inputs too large for one argv string as `--inputs KEY=file.npy`, which is what a user does for images."""
    import numpy as np

    from exportkit.savedmodel.manifest import read_manifest

    manifest, _ = read_manifest(version_dir)
    rng = np.random.default_rng(0)
    exprs, files, how = [], [], []
    for key, spec in manifest.signature["inputs"].items():
        shape = [SMCLI_BATCH] + [d if d and d > 0 else 1 for d in (spec["shape"] or [-1, 1])[1:]]
        dtype = spec["dtype"]
        if dtype.startswith("int"):
            value = rng.integers(0, 10, size=shape).astype(dtype)
        elif dtype.startswith("float"):
            value = rng.standard_normal(shape).astype(dtype)
        else:
            raise SystemExit(f"bench: input {key} has dtype {dtype}; only numeric inputs are supported")
        if value.size <= INPUT_EXPRS_LIMIT:
            exprs.append(f"{key}={np.round(value, 4).tolist() if value.dtype.kind == 'f' else value.tolist()}")
            how.append("input_exprs")
        else:
            scratch.mkdir(parents=True, exist_ok=True)
            path = scratch / f"{key}.npy"
            np.save(path, value)
            files.append(f"{key}={path}")
            how.append("inputs .npy")
    flags = []
    if exprs:
        flags += ["--input_exprs", ";".join(exprs).replace(" ", "")]
    if files:
        flags += ["--inputs", ";".join(files)]
    return flags, "+".join(sorted(set(how)))


# --------------------------------------------------------------------------------------------- predict


def bench_predict(model: dict, version_dir: Path, calls: int) -> dict:
    """Start `exportkit serve`, run the worker (fresh process) that times both clients against it, stop it."""
    import re

    proc = subprocess.Popen([BIN / "exportkit", "serve", str(version_dir), "--port", "0", "--model-name", "bench"],
                            cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, start_new_session=True, text=True)
    try:
        address = None
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            match = re.search(r"AVAILABLE at (\S+)", line)
            if match:
                address = match.group(1)
                break
        if address is None:
            return {"error": "exportkit serve did not report AVAILABLE"}
        result = subprocess.run([sys.executable, str(HERE / "predict_worker.py"), address, "bench", str(version_dir), str(calls)],
                                cwd=REPO, env=child_env(), capture_output=True, text=True)
        if result.returncode != 0:
            return {"error": result.stderr[-2000:]}
        data = json.loads(result.stdout.strip().splitlines()[-1])
        data.update(ours_median_ms=statistics.median(data["ours"]) * 1e3,
                    bare_median_ms=statistics.median(data["bare"]) * 1e3)
        data["ratio"] = data["ours_median_ms"] / data["bare_median_ms"]
        return data
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            killpg(proc.pid)
            proc.wait()
        proc.stdout.close()


# --------------------------------------------------------------------------------------------- the runs
def export_stages(stderr: str) -> dict:
    stages = {}
    for line in stderr.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[2] == "s" and parts[0] in ("load", "build", "trace", "write", "check"):
            try:
                stages[parts[0]] = float(parts[1])
            except ValueError:
                pass
    return stages


def run_pairs(models: dict, runs_of: dict, work: Path, log) -> tuple[dict, dict]:
    """{model: {row: {"ours": [...], "base": [...]}}} and {model: version_dir}; runs_of: {model: runs}."""
    raw = {name: {row: {"ours": [], "base": []} for row in ("export", "inspect", "verify")} for name in models}
    dirs: dict[str, Path] = {}
    flags: dict[str, tuple] = {}
    for run in range(max(runs_of.values(), default=0)):
        for name, model in models.items():
            runs = runs_of[name]
            if run >= runs:
                continue
            folder = work / name.replace(".", "_")
            ek_base, hand_dir = folder / f"exportkit_{run}", folder / f"baseline_{run}"
            for path in (ek_base, hand_dir):
                shutil.rmtree(path, ignore_errors=True)
            folder.mkdir(parents=True, exist_ok=True)

            def record(row, side, result):
                raw[name][row][side].append(result)
                status = "ok" if result["rc"] == 0 else f"FAIL rc={result['rc']}"
                log(f"  run {run + 1}/{runs} {name:<24} {row:<8} {side:<5} {result['seconds']:7.2f} s  "
                    f"tree {result['tree_rss_mb'] or 0:6.0f} MB  {status}")

            # export: exportkit (with its self-check) vs load_model + model.export
            result = measure([BIN / "exportkit", "export", model["src"], "-o", ek_base, *model["args"]],
                             warmed=model["src"])
            result["stages"] = export_stages(result["stderr_tail"])
            record("export", "ours", result)
            record("export", "base", measure([sys.executable, HERE / "export_baseline.py", model["src"], hand_dir,
                                              *model["args"]], warmed=model["src"]))
            shutil.rmtree(hand_dir, ignore_errors=True)
            if name not in dirs:
                if result["rc"] != 0:
                    log(f"  {name}: exportkit export failed, no SavedModel for the other rows:\n{result['stderr_tail']}")
                    continue
                dirs[name] = folder / "model" / "1"
                shutil.rmtree(folder / "model", ignore_errors=True)
                (folder / "model").mkdir()
                shutil.move(str(ek_base / "1"), str(dirs[name]))
                flags[name] = smcli_inputs(dirs[name], folder / "smcli_inputs")
            shutil.rmtree(ek_base, ignore_errors=True)
            version_dir = dirs[name]

            record("inspect", "ours", measure([BIN / "exportkit", "inspect", version_dir], warmed=version_dir))
            record("inspect", "base", measure([BIN / "saved_model_cli", "show", "--all", "--dir", version_dir],
                                              warmed=version_dir))

            result = measure([BIN / "exportkit", "verify", version_dir, "--serving", "embedded"], warmed=version_dir)
            record("verify", "ours", result)
            smcli_flags, how = flags[name]
            result = measure([BIN / "saved_model_cli", "run", "--dir", version_dir, "--tag_set", "serve",
                              "--signature_def", "serving_default", *smcli_flags], warmed=version_dir)
            result["inputs_via"] = how
            result["argv"] = result["argv"][:9] + ["..."]  # the literal batch is long
            record("verify", "base", result)
    return raw, dirs


def run_compat(version_dir: Path, tf_version: str, runs: int, scratch: Path, log) -> dict:
    """Static analysis time on 1,000 nodes x ten versions; verify through session@X.Y vs through session."""
    static = measure([sys.executable, HERE / "compat_static.py", version_dir, "--nodes", 1000])
    out = {"static": json.loads(static["stdout"]) if static["rc"] == 0 else {"error": static["stderr_tail"]},
           "tf": tf_version, "observed": [], "compat_run": []}
    log(f"  compat static: {out['static']}")
    if not tf_version:
        return out
    subprocess.run([BIN / "exportkit", "runtimes", "install", tf_version], env=child_env(), capture_output=True)
    base = [BIN / "exportkit", "verify", version_dir, "--serving", "none", "--samples", 8]
    for run in range(runs):  # back to back, so machine drift hits both alike
        ours = measure(base + ["--runtimes", "golden", "--tf", tf_version])
        theirs = measure(base + ["--runtimes", "golden,session"])
        compat_run = measure([BIN / "exportkit", "compat", version_dir, "--tf", tf_version, "--run"])
        out["observed"].append({"ours": ours["seconds"], "base": theirs["seconds"], "rc": ours["rc"] or theirs["rc"]})
        out["compat_run"].append(compat_run)
        log(f"  compat observed run {run + 1}/{runs}: session@{tf_version} {ours['seconds']:.2f} s, session "
            f"{theirs['seconds']:.2f} s; compat --run {compat_run['seconds']:.2f} s")
    return out


def run_scaling(version_dir: Path, sizes: list[int], runs: int, scratch: Path, log) -> dict:
    out = {}
    for samples in sizes:
        out[samples] = []
        for run in range(runs):
            report = scratch / f"verify_{samples}_{run}.json"
            result = measure([BIN / "exportkit", "verify", version_dir, "--serving", "embedded",
                              "--samples", samples, "--json", report])
            try:
                data = json.loads(report.read_text())
                result["runtime_seconds"] = {r["name"]: r.get("seconds") for r in data.get("runtimes", [])}
                result["passed"] = data.get("passed")
            except (OSError, ValueError):
                result["runtime_seconds"] = {}
            out[samples].append(result)
            log(f"  scaling --samples {samples:<5} run {run + 1}/{runs} {result['seconds']:7.2f} s  "
                f"tree {result['tree_rss_mb'] or 0:6.0f} MB  max {result['maxrss_mb']:6.0f} MB  rc={result['rc']}")
    return out


# --------------------------------------------------------------------------------------------- report
ROW_TEXT = {
    "inspect": ("`exportkit inspect DIR`", "`saved_model_cli show --all --dir DIR`"),
    "export": ("`exportkit export SRC -o BASE` (+ self-check)", "`load_model(SRC)` + `model.export(DIR)` "
                                                                 "(benchmarks/export_baseline.py)"),
    "verify": ("`exportkit verify DIR --serving embedded`", "`saved_model_cli run ... --input_exprs` (1 batch of 8)"),
}


def summarize(raw: dict) -> list[dict]:
    rows = []
    for row in ("inspect", "export", "verify"):
        for name, per_row in raw.items():
            ours, base = per_row[row]["ours"], per_row[row]["base"]
            if not ours:
                continue
            ok = all(r["rc"] == 0 for r in ours) and all(r["rc"] == 0 for r in base)
            o_t, b_t = median(r["seconds"] for r in ours), median(r["seconds"] for r in base)
            o_m, b_m = median(r["tree_rss_mb"] for r in ours), median(r["tree_rss_mb"] for r in base)
            ratio = o_t / b_t if o_t and b_t else None
            rss_ratio = o_m / b_m if o_m and b_m else None
            entry = {"row": row, "model": name, "runs": len(ours), "ok": ok,
                     "ours_s": o_t, "base_s": b_t, "ratio": ratio, "target": TARGETS[row],
                     "ours_tree_mb": o_m, "base_tree_mb": b_m,
                     "rss_ratio": rss_ratio,
                     "rss_target": (SCALE_RSS_TARGETS if name in SCALE_MODELS else {}).get(row, RSS_TARGETS.get(row)),
                     "ours_max_mb": median(r["maxrss_mb"] for r in ours),
                     "base_max_mb": median(r["maxrss_mb"] for r in base)}
            entry["met"] = ok and meets(ratio, entry["target"]) and meets(rss_ratio, entry["rss_target"])
            if row == "export":
                stages = [r.get("stages", {}) for r in ours]
                entry["stages_s"] = {k: median(s.get(k) for s in stages) for k in ("load", "build", "trace", "write", "check")}
            if row == "verify" and base:
                entry["base_inputs_via"] = base[0].get("inputs_via")
            rows.append(entry)
    return rows


def render_compat(compat: dict, model: str) -> list[str]:
    if not compat:
        return []
    static = compat.get("static", {})
    lines = ["", f"`exportkit compat` on {model}:", "",
             "| what | exportkit | side by side with | ratio | target |", "|---|---:|---:|---:|---:|"]
    if "median_s" in static:
        met = " ✅" if static["median_s"] <= TARGETS["compat_static_s"] else " ❌"
        lines.append(f"| static analysis, {static['versions']} versions, {static['nodes']} nodes, registries cold | "
                     f"{static['median_s']:.3f} s | | {met.strip()} | <= {TARGETS['compat_static_s']} s |")
    observed = [o for o in compat.get("observed", []) if o["rc"] == 0]
    if observed:
        tf = compat["tf"]
        ours = median(o["ours"] for o in observed)
        base = median(o["base"] for o in observed)
        ratio = ours / base if ours and base else None
        met = "" if ratio is None else (" ✅" if ratio <= TARGETS["compat_observed"] else " ❌")
        lines.append(f"| `verify DIR --runtimes golden --tf {tf}` (session@{tf}, warm environment) | {fmt_s(ours)} | "
                     f"`verify DIR --runtimes golden,session`: {fmt_s(base)} | "
                     f"{'-' if ratio is None else f'{ratio:.2f}x'}{met} | <= {TARGETS['compat_observed']}x |")
        wall = median(r["seconds"] for r in compat["compat_run"])
        lines.append(f"| `exportkit compat DIR --tf {tf} --run` (wall) | {fmt_s(wall)} | | | |")
    return lines


def run_summaries(log) -> list[str]:
    """benchmarks/summaries_bench.py's table (1M elements; 100M too where ~7 GB are available)."""
    result = subprocess.run([sys.executable, HERE / "summaries_bench.py"], env=child_env(),
                            capture_output=True, text=True)
    table = [line for line in result.stdout.splitlines() if line.startswith("|")]
    log("  summaries: " + (" ".join(table[2:]) if result.returncode == 0 else result.stderr[-500:]))
    return table if result.returncode == 0 else []


def render(info: dict, profile: str, rows: list[dict], predict: dict, scaling: dict, scaling_model: str,
           elapsed: float, compat: dict | None = None, compat_model: str = "", summaries: list[str] | None = None) -> str:
    lines = [f"### exportkit benchmark ({info['date']})", "",
             f"`{info['arch']}`, {info['cpu']}, {info['cores']} cores; TensorFlow {info['tensorflow']}, "
             f"Keras {info['keras']}, Python {info['python']}, exportkit {info['exportkit']}. "
             f"Profile `{profile}`; medians of the runs shown (each run a fresh process); "
             f"RSS = peak summed over the whole process tree (sampled every 100 ms). Bench took {elapsed / 60:.1f} min; "
             f"1-min load average {info['loadavg_start']} at start, {info.get('loadavg_end', '?')} at end "
             f"(other work on the machine inflates and spreads the figures).",
             "",
             "| model | exportkit | time | RSS | side by side with | time | RSS | time ratio | target | RSS ratio | "
             "target | goal | runs |",
             "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|:---:|---:|"]
    for r in rows:
        ours, base = ROW_TEXT[r["row"]]
        if r["row"] == "verify" and r.get("base_inputs_via") == "inputs .npy":
            base = base.replace("--input_exprs", "--inputs x.npy")
        fail = "" if r["ok"] else " (FAIL)"
        rss_target = "" if r["rss_target"] is None else f"<= {r['rss_target']}x"
        lines.append(f"| {r['model']} | {ours}{fail} | {fmt_s(r['ours_s'])} | {fmt_mb(r['ours_tree_mb'])} | {base} | "
                     f"{fmt_s(r['base_s'])} | {fmt_mb(r['base_tree_mb'])} | "
                     f"{mark(r['ratio'], r['target'])} | <= {r['target']}x | "
                     f"{mark(r['rss_ratio'], r['rss_target'])} | {rss_target} | "
                     f"{'✅' if r['met'] else '❌'} | {r['runs']} |")
    for name, p in predict.items():
        if "error" in p:
            lines.append(f"| {name} | `ServingClient.predict` (FAIL) | error | | bare `PredictionServiceStub.Predict` | | | "
                         f"- | <= {TARGETS['predict']}x | | | ❌ | |")
            continue
        lines.append(f"| {name} | `ServingClient.predict` (batch {p['batch']}, per call) | {p['ours_median_ms']:.2f} ms | | "
                     f"bare `PredictionServiceStub.Predict`, pre-built request | {p['bare_median_ms']:.2f} ms | | "
                     f"{mark(p['ratio'], TARGETS['predict'])} | <= {TARGETS['predict']}x | | | "
                     f"{'✅' if meets(p['ratio'], TARGETS['predict']) else '❌'} | {len(p['ours'])} calls |")
    export_rows = [r for r in rows if r["row"] == "export" and r.get("stages_s")]
    if export_rows:
        lines += ["", "`exportkit export` stages (median s, from its stderr): " + "; ".join(
            f"{r['model']}: " + ", ".join(f"{k} {v:.2f}" for k, v in r["stages_s"].items() if v is not None)
            for r in export_rows)]
    if scaling:
        names = sorted({k for runs in scaling.values() for r in runs for k in r.get("runtime_seconds", {})})
        lines += ["", f"`exportkit verify DIR --serving embedded --samples N` on {scaling_model} "
                      f"(generated batches of 1 and N, plus the 2 golden batches):", "",
                  "| --samples | wall | peak RSS, tree | peak RSS, largest process | " +
                  " | ".join(f"{n} (in-report s)" for n in names) + f" | rest / serving | target | runs |",
                  "|---:|---:|---:|---:|" + "---:|" * len(names) + "---:|---:|---:|"]
        for samples, runs in scaling.items():
            per_rt = [fmt_s(median(r.get("runtime_seconds", {}).get(n) for r in runs)) for n in names]
            fail = "" if all(r["rc"] == 0 for r in runs) else " (FAIL)"
            rest, grpc = (median(r.get("runtime_seconds", {}).get(n) for r in runs) for n in ("rest", "serving"))
            ratio = rest / grpc if rest and grpc else None
            target = f"<= {TARGETS['rest']}x" if samples >= 1000 else ""
            lines.append(f"| {samples}{fail} | {fmt_s(median(r['seconds'] for r in runs))} | "
                         f"{fmt_mb(median(r['tree_rss_mb'] for r in runs))} | {fmt_mb(median(r['maxrss_mb'] for r in runs))} | "
                         + " | ".join(per_rt) + f" | {mark(ratio, TARGETS['rest']) if target else mark(ratio, None)} | "
                         f"{target} | {len(runs)} |")
    if summaries:
        lines += ["", "Error summaries (`python benchmarks/summaries_bench.py`): `compare_arrays` on float32 with its "
                      "histograms, worst elements and sampled pairs, against the same comparison without them "
                      "(the median ratio of alternating pairs):", "", *summaries]
    lines += render_compat(compat or {}, compat_model)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--samples-dir", default=str(REPO / "build" / "samples"), help="where `make samples` wrote")
    parser.add_argument("--out", default=str(REPO / "build" / "bench"), help="results.md, results.json, models/, work/")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--profile", choices=sorted(PROFILES), help="default: `default` (see below)")
    group.add_argument("--quick", action="store_true", help="= --profile quick: 1 run, 2 small models (~3 min)")
    group.add_argument("--full", action="store_true", help="= --profile full: 3 runs of every model (~25 min)")
    group.add_argument("--scale", action="store_true", help="= --profile scale: the 1 GB model only, 2 runs (~2 min)")
    parser.add_argument("--runs", type=int, help="runs per command on the small samples (median reported)")
    parser.add_argument("--app-runs", type=int, help="runs per command on the keras.applications models")
    parser.add_argument("--scale-runs", type=int, help="runs per command on the 1 GB model (" + ", ".join(SCALE_MODELS) + ")")
    parser.add_argument("--models", help="comma-separated: sample names from samples.json and/or "
                                         + ", ".join([*APP_MODELS, *SCALE_MODELS]))
    parser.add_argument("--scaling-model", help="model for the verify --samples rows ('' skips)")
    parser.add_argument("--scaling-runs", type=int)
    parser.add_argument("--predict-models", help="comma-separated models for the predict row ('' skips)")
    parser.add_argument("--predict-calls", type=int, help="Predict calls per client")
    parser.add_argument("--data-records", type=int, help="records for the verify --data rows (0 skips)")
    parser.add_argument("--data-only", action="store_true", help="only the verify --data rows (see data_bench.py)")
    parser.add_argument("--compat-tf", help="TF X.Y for the observed compat row ('' skips it; default 2.12)")
    args = parser.parse_args(argv)

    profile = args.profile or ("quick" if args.quick else "full" if args.full else "scale" if args.scale else "default")
    cfg = dict(PROFILES[profile])
    for key in ("runs", "app_runs", "scale_runs", "scaling_model", "scaling_runs", "predict_calls", "data_records",
                "compat_tf"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    if args.models is not None:
        cfg["models"] = [m for m in args.models.split(",") if m]
    if args.predict_models is not None:
        cfg["predict_models"] = [m for m in args.predict_models.split(",") if m]
    scaling_model = cfg["scaling_model"]
    out = Path(args.out).resolve()
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)

    began, log_start = time.perf_counter(), time.time()
    log = logger(log_start)

    if args.data_only:
        return _data_only(cfg["data_records"] or 100_000, out, log_start)
    wanted = list(dict.fromkeys(cfg["models"] + cfg["predict_models"] + ([scaling_model] if scaling_model else [])))
    models = resolve_models(wanted, Path(args.samples_dir).resolve(), out)
    info = machine()
    runs_of = {n: cfg["app_runs"] if n in APP_MODELS else cfg["scale_runs"] if n in SCALE_MODELS else cfg["runs"]
               for n in cfg["models"]}
    log(f"profile {profile}: runs {runs_of}; verify scaling {cfg['scaling_samples']} on {scaling_model or '-'} "
        f"x{cfg['scaling_runs']}; predict on {', '.join(cfg['predict_models']) or '-'}")
    # One untimed TensorFlow import and one read of each source file, so the first timed command does not pay
    # for a cold page cache alone (1 GB for scale_1gb).
    subprocess.run([sys.executable, "-c", "import tensorflow"], env=child_env(), capture_output=True)
    table_models = {n: models[n] for n in cfg["models"]}
    for model in table_models.values():
        warm(Path(model["src"]))
    raw, dirs = run_pairs(table_models, runs_of, work, log)
    extra = [n for n in wanted if n not in dirs]
    if extra:  # models used only by the predict/scaling rows still need an exported SavedModel
        extra_raw, extra_dirs = run_pairs({n: models[n] for n in extra}, {n: 1 for n in extra}, work / "extra",
                                          lambda m: None)
        dirs.update(extra_dirs)

    predict = {}
    for name in cfg["predict_models"]:
        if name in dirs:
            log(f"  predict {name}: {cfg['predict_calls']} calls per client")
            predict[name] = bench_predict(models[name], dirs[name], cfg["predict_calls"])
            if "error" not in predict[name]:
                log(f"  predict {name}: ours {predict[name]['ours_median_ms']:.2f} ms, bare "
                    f"{predict[name]['bare_median_ms']:.2f} ms")
            else:
                log(f"  predict {name}: {predict[name]['error'][-500:]}")

    scaling = {}
    if scaling_model and scaling_model in dirs:
        scaling = run_scaling(dirs[scaling_model], cfg["scaling_samples"], cfg["scaling_runs"], work, log)

    # The verify --data and diff --data sections are benches of their own, run as such (no bench imports another).
    data = run_section("data_bench.py", out, cfg["data_records"], log_start) if cfg["data_records"] else {}
    diff = run_section("diff_bench.py", out, DIFF_RECORDS, log_start) if cfg["data_records"] else {}
    # The compat rows measure analysis and environment overhead, not model size: never on the 1 GB model.
    compat_model = next((n for n in cfg["models"] if n not in SCALE_MODELS), "")
    compat = run_compat(dirs[compat_model], cfg["compat_tf"], min(cfg["runs"], 3), work, log) if compat_model in dirs else {}
    rows = summarize(raw)
    elapsed = time.perf_counter() - began
    info["loadavg_end"] = round(os.getloadavg()[0], 2)
    summaries = run_summaries(log) if profile != "scale" else []
    markdown = render(info, profile, rows, predict, scaling, scaling_model, elapsed, compat, compat_model, summaries)
    if data.get("rows"):
        markdown += "\n".join(data["lines"]) + "\n"
    if diff.get("rows"):
        markdown += "\n".join(diff["lines"]) + "\n"
    print(markdown)
    (out / "results.md").write_text(markdown)
    for per_model in raw.values():  # keep results.json readable: stdout of verify/inspect only as a tail
        for per_row in per_model.values():
            for side in per_row.values():
                for r in side:
                    r["stdout"] = r["stdout"][-1500:]
    for runs in scaling.values():
        for r in runs:
            r["stdout"] = r["stdout"][-1500:]
    (out / "results.json").write_text(json.dumps({
        "machine": info, "profile": profile, "config": cfg, "elapsed_seconds": elapsed, "targets": TARGETS,
        "rss_targets": RSS_TARGETS,
        "summary": rows, "predict": predict, "scaling_model": scaling_model,
        "scaling": {str(k): v for k, v in scaling.items()}, "compat": compat, "runs": raw,
        "data": tails(data.get("rows", {})), "diff": tails(diff.get("rows", {}))},
        indent=1,
        default=str) + "\n")
    log(f"wrote {out / 'results.md'} and {out / 'results.json'}")
    return 0



def _data_only(records: int, out: Path, log_start: float) -> int:
    """`--data-only`: the verify --data rows alone, into OUT/data-results.md and .json."""
    section = run_section("data_bench.py", out, records, log_start)
    data = section.get("rows", {})
    info = machine()
    markdown = "\n".join([f"Machine: {info}"] + section.get("lines", [])) + "\n"
    print(markdown)
    (out / "data-results.md").write_text(markdown)
    (out / "data-results.json").write_text(json.dumps({"machine": info, "data": tails(data)}, indent=1,
                                                      default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
