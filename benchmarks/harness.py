"""What every bench shares: running a command as a fresh process and timing it, its peak RSS, medians and ratios,
the table cells, the machine's description and the models the benches build. Benches import this module and
never each other (tests/test_architecture.py); a bench that needs another's rows runs it as a subprocess.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent  # benchmarks/
REPO = HERE.parent
BIN = Path(sys.executable).parent  # the venv's bin/: exportkit, saved_model_cli

APP_MODELS = {
    "mobilenet_v2": ("MobileNetV2", (96, 96, 3)),
    "resnet50": ("ResNet50", (64, 64, 3)),
}
SCALE_MODELS = {"scale_1gb": 2_000_000}  # Embedding rows for benchmarks/build_scale.py (x 128 float32 = 1 GB)


# --------------------------------------------------------------------------------------------- running
def child_env() -> dict:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env.setdefault("PYTHONWARNINGS", "ignore")
    return env


class TreeRss:
    """Samples the summed RSS of a process and all its descendants until stopped; keeps the peak."""

    def __init__(self, pid: int, interval: float = 0.1):
        self.pid, self.interval, self.peak = pid, interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _loop(self):
        try:
            import psutil
        except ImportError:  # without psutil only ru_maxrss is reported
            return
        try:
            root = psutil.Process(self.pid)
        except psutil.Error:
            return
        while not self._stop.is_set():
            total = 0
            try:
                procs = [root] + root.children(recursive=True)
            except psutil.Error:
                procs = []
            for proc in procs:
                try:
                    total += proc.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            self._stop.wait(self.interval)


def warm(path) -> None:
    """Read a model's files once, untimed, so each side of a pair starts with them in the page cache. This machine's
    host pages out what has been idle for a minute (DAMON's pageout scheme, /sys/kernel/mm/damon), so the first
    command of a pair read a large model from disk and the second from memory: the 1 GB model's export measured
    1.23-1.55x that way."""
    path = Path(path)
    for file in [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()):
        with open(file, "rb") as f:
            while f.read(1 << 24):
                pass


def measure(argv: list, *, cwd=REPO, timeout: float = 900.0, warmed=None) -> dict:
    """Run argv once; wall seconds, exit code, ru_maxrss (KB -> MB) and sampled tree RSS, output tails. `warmed`:
    a model file or directory read first (see `warm`), outside the timing."""
    if warmed is not None:
        warm(warmed)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen([str(a) for a in argv], cwd=cwd, env=child_env(), stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        killer = threading.Timer(timeout, lambda: killpg(proc.pid))
        killer.start()
        with TreeRss(proc.pid) as tree:
            _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        killer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        killpg(proc.pid)  # anything left in the command's own process group (nothing, normally)
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode("utf-8", "replace")
        stderr = err.read().decode("utf-8", "replace")
    return {"argv": [str(a) for a in argv], "seconds": wall, "rc": proc.returncode,
            "maxrss_mb": usage.ru_maxrss / 1024, "tree_rss_mb": tree.peak / 2**20 if tree.peak else None,
            "stdout": stdout, "stderr_tail": stderr[-3000:]}


def killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def median_seconds(fn, runs: int) -> float:
    """The median wall time of `runs` calls of fn, in this process."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def logger(started: float | None = None):
    """log(message) to stderr as `[  12s] message`, seconds since `started` (time.time(); now if None). A bench run
    by another passes the caller's start on, so both count from the same moment."""
    started = time.time() if started is None else started

    def log(message):
        print(f"[{time.time() - started:6.0f}s] {message}", file=sys.stderr, flush=True)

    return log


def run_section(script: str, out: Path, records: int, log_start: float) -> dict:
    """Run another bench (`script` under benchmarks/: --records, --out, --json, --log-start) as a subprocess, its log
    on this stderr; its {"rows": ..., "lines": ...} document, or {} when it failed (the failure is logged)."""
    with tempfile.TemporaryDirectory() as scratch:
        document = Path(scratch) / "section.json"
        result = subprocess.run([sys.executable, HERE / script, "--records", str(records), "--out", str(out),
                                 "--json", str(document), "--log-start", repr(log_start)],
                                env=child_env(), stdout=subprocess.DEVNULL)
        if result.returncode != 0 or not document.is_file():
            print(f"bench: {script} failed (exit {result.returncode})", file=sys.stderr, flush=True)
            return {}
        return json.loads(document.read_text())


def write_section(path: str, rows: dict, lines: list[str]) -> None:
    """The document run_section reads."""
    Path(path).write_text(json.dumps({"rows": rows, "lines": lines}, default=str))



def tails(rows: dict) -> dict:
    """Rows with each command's stdout cut to its tail, so the JSON results stay readable."""
    for r in rows.values():
        r["stdout"] = r.get("stdout", "")[-1500:]
    return rows


def section_main(argv, description: str, name: str, default_records: int, run, render) -> int:
    """The command line of a bench that is also a section of bench.py (data_bench, diff_bench): `run(work dir,
    records, log, exportkit)` -> rows, `render(rows)` -> Markdown lines. With --json (run_section) the {rows, lines}
    document goes there; alone, the table is printed and kept as OUT/NAME-results.md and .json."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--records", type=int, default=default_records)
    parser.add_argument("--out", default=str(REPO / "build" / "bench"), help=f"the records and models go to OUT/work/{name}")
    parser.add_argument("--json", help=f"write {{rows, lines}} here for bench.py instead of OUT/{name}-results.*")
    parser.add_argument("--log-start", type=float, help="the log's time zero (time.time() of the calling bench)")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    rows = run(out / "work" / name, args.records, logger(args.log_start), str(BIN / "exportkit"))
    lines = render(rows)
    if args.json:
        write_section(args.json, rows, lines)
        return 0
    markdown = "\n".join(lines) + "\n"
    print(markdown)
    (out / f"{name}-results.md").write_text(markdown)
    (out / f"{name}-results.json").write_text(json.dumps({"machine": machine(), name: tails(rows)}, indent=1,
                                                         default=str) + "\n")
    return 0

# --------------------------------------------------------------------------------------------- numbers
def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def meets(ratio, target) -> bool:
    """A ratio without a target always meets it; a targeted one that could not be measured never does."""
    return target is None or (ratio is not None and ratio <= target)


def mark(ratio, target) -> str:
    """`1.23x ✅`: the ratio, with a check mark only where there is a target."""
    if ratio is None:
        return "-"
    return f"{ratio:.2f}x" + ("" if target is None else " ✅" if ratio <= target else " ❌")


def fmt_s(v):
    return "-" if v is None else (f"{v:.2f} s" if v < 100 else f"{v:.0f} s")


def fmt_mb(v):
    return "-" if v is None else (f"{v / 1024:.2f} GB" if v >= 1024 else f"{v:.0f} MB")


def machine() -> dict:
    from importlib import metadata

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass

    def version(dist):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "?"

    return {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "arch": platform.machine(),
            "cpu": cpu, "cores": os.cpu_count(), "tensorflow": version("tensorflow"), "keras": version("keras"),
            "python": platform.python_version(), "exportkit": version("exportkit"),
            "loadavg_start": round(os.getloadavg()[0], 2)}


# --------------------------------------------------------------------------------------------- models
def build_app_models(out: Path, names: list[str]) -> dict[str, Path]:
    """keras.applications models with seeded random weights, saved as .keras (built once, reused)."""
    folder = out / "models"
    folder.mkdir(parents=True, exist_ok=True)
    paths = {n: folder / f"{n}.keras" for n in names}
    missing = [n for n, p in paths.items() if not p.is_file()]
    if missing:
        script = (
            "import sys, keras\n"
            "keras.utils.set_random_seed(0)\n"
            f"specs = {dict((n, APP_MODELS[n]) for n in missing)!r}\n"
            "for name, (arch, shape) in specs.items():\n"
            "    model = getattr(keras.applications, arch)(weights=None, input_shape=shape)\n"
            f"    model.save({str(folder)!r} + '/' + name + '.keras')\n"
            "    print(name, model.count_params(), flush=True)\n")
        print(f"building {', '.join(missing)} into {folder} ...", file=sys.stderr, flush=True)
        result = subprocess.run([sys.executable, "-c", script], env=child_env(), capture_output=True, text=True)
        if result.returncode != 0:
            sys.exit(f"bench: building {missing} failed:\n{result.stderr[-3000:]}")
    return paths


def build_scale_model(out: Path, name: str) -> Path:
    """The 1 GB recommendation-style model (benchmarks/build_scale.py), built once and reused.

    Written under a temporary name and renamed, so an interrupted build is never mistaken for a model."""
    path = out / "models" / f"{name}.keras"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{name}.partial.keras")  # Keras insists on the .keras suffix
    print(f"building {name} into {path} (~11 s, ~1 GB) ...", file=sys.stderr, flush=True)
    result = subprocess.run([sys.executable, HERE / "build_scale.py", partial, str(SCALE_MODELS[name])],
                            env=child_env(), capture_output=True, text=True)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        sys.exit(f"bench: building {name} failed:\n{result.stderr[-3000:]}")
    os.replace(partial, path)
    return path


def resolve_models(names: list[str], samples_dir: Path, out: Path) -> dict[str, dict]:
    """{name: {"name", "src", "args", "kind"}}: `make samples`' samples (samples.json), keras.applications models
    and the 1 GB model, the last two built into OUT/models/ on first use."""
    listing = samples_dir / "samples.json"
    samples = json.loads(listing.read_text()) if listing.is_file() else {}
    apps = build_app_models(out, [n for n in names if n in APP_MODELS])
    models = {}
    for name in names:
        if name in APP_MODELS:
            models[name] = {"name": name, "src": str(apps[name]), "args": [], "kind": "keras.applications"}
        elif name in SCALE_MODELS:
            models[name] = {"name": name, "src": str(build_scale_model(out, name)), "args": [], "kind": "scale"}
        elif name in samples:
            models[name] = {"name": name, "src": samples[name]["path"], "args": samples[name]["export_args"],
                            "kind": "sample"}
        else:
            sys.exit(f"bench: unknown model {name!r}: not in {listing} (run `make samples`) nor one of "
                     f"{sorted([*APP_MODELS, *SCALE_MODELS])}")
    return models
