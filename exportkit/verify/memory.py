"""What the version costs the server: the memory its load takes, measured in the process that loads it as TF Serving
does, beside TF Serving's own estimate (exportkit.savedmodel.resources), the swap's peak, and the gates.

Measured in the session workers verify already runs (this Python's and each `--tf X.Y` one): the worker reads its
own /proc/self/status around the TF1 load (exportkit.tfversions.worker.MemoryMeter), so measuring adds no load and
no run. The embedded server answers from that same load in that same process, so its figure is the session's. The
swap (TF Serving's availability-preserving policy loads the new version before it unloads the old one,
core/availability_preserving_policy.cc) needs the version served before loaded beside the new one: done only when
the base directory (or --baseline) has it, in the same worker, after the runs.

Findings (severity, code):
error   memory-limit          the peak exceeds --max-memory (each TensorFlow measured)
error   swap-memory-limit     the swap's peak exceeds --max-swap-memory
warning memory-over-estimate  the loaded figure exceeds TF Serving's estimate by more than the measurement's error
"""
from __future__ import annotations

from pathlib import Path

from exportkit import storage
from exportkit.errors import UsageError
from exportkit.findings import Finding
from exportkit.report.format import size_text
from exportkit.savedmodel.resources import ESTIMATE_MARGIN, over_estimate, serving_estimate


def session_workers(runtimes_) -> list[tuple[str, object]]:
    """(label, TfWorker) of every session runtime that loaded its model: `session` (this TensorFlow) and
    `session@X.Y` (managed environments), each its own worker process."""
    found = []
    for item in runtimes_:
        runtime = item.runtime
        worker = getattr(runtime, "worker", None)
        if runtime.name == "session" and worker is not None and getattr(runtime, "loaded", False):
            found.append((item.label, worker))
    return found


def figures_by_label(runtimes_) -> dict[str, dict]:
    """{label: its worker's figures} of every session runtime that loaded its model (compat --run's rows)."""
    return {label: figures for label, worker in session_workers(runtimes_) if (figures := worker.memory())}


def measure(runtimes_, version_dir, baseline: dict | None, limits: dict) -> tuple[dict, list[Finding]]:
    """The report's `memory` and its findings. `baseline`: verify's (verify/checks.py baseline_findings): a version
    directory it names is loaded beside the new one for the swap. `limits`: {"max_memory", "max_swap_memory"}, bytes
    or None."""
    memory = dict(serving_estimate(version_dir), measured=[], swap=None,
                  limits={f"{k}_bytes": v for k, v in limits.items()})
    old = _previous_dir(baseline)
    for label, worker in session_workers(runtimes_):
        swap_here = old is not None and memory["swap"] is None and not worker.managed  # once, in this TensorFlow
        figures = worker.memory(previous=old if swap_here else None)
        if not figures.get("loaded_bytes") and figures.get("loaded_bytes") != 0:
            continue
        row = {"runtime": label, "tf": worker.tf_version, "pid": worker.process.pid if worker.process else None,
               **{k: figures[k] for k in ("baseline_bytes", "loaded_bytes", "peak_bytes", "method")}}
        row["ratio"] = round(row["loaded_bytes"] / memory["estimate_bytes"], 3) if memory["estimate_bytes"] else None
        if "gpu" in figures:
            row["gpu"] = figures["gpu"]
        memory["measured"].append(row)
        if swap_here:
            memory["swap"] = _swap(old, figures, row)
    memory["servers"] = server_figures(runtimes_)
    if memory["swap"] is None:
        memory["swap"] = {"old": None, "why": _no_swap(baseline)}
    return memory, findings(memory)


def unmeasured(memory: dict, names: list[str]) -> None:
    """A gate that measured nothing is exit 2, never a pass: --max-memory without a session runtime or a launched
    server, --max-swap-memory against a deployed version (its memory is not ours to read). A first version has no
    swap to gate: TF Serving loads it alone (the report says so)."""
    limits, swap = memory["limits"], memory.get("swap") or {}
    if limits.get("max_memory_bytes") is not None and not memory["measured"] and not memory.get("servers"):
        raise UsageError(f"--max-memory measured nothing: runtimes {', '.join(names)} hold no load of the model "
                         f"exportkit can read", "add the session runtime (--runtimes ...,session), or leave "
                                                "--max-memory out")
    if limits.get("max_swap_memory_bytes") is not None and (swap.get("why") or "").startswith("not available"):
        raise UsageError(f"--max-swap-memory measured nothing: {swap.get('why') or 'no swap'}",
                         "verify the base directory that holds both versions (or pass --baseline DIR), or leave "
                         "--max-swap-memory out")


def server_figures(runtimes_) -> list[dict]:
    """The servers verify launched (`--serving binary`, `docker`, an `exportkit serve` of its own): what each holds
    once it answered every batch, TF Serving's own memory included, by its process's /proc or its container's
    accounting. No baseline: the server loads the model as it starts."""
    found = []
    for item in runtimes_:
        runtime = item.runtime
        if runtime.name != "serving" or not getattr(runtime, "loaded", False):
            continue
        figures = runtime.memory()
        if figures.get("total_bytes"):
            found.append({"runtime": item.label, "server": (runtime.server or {}).get("kind"),
                          "tf": (runtime.server or {}).get("version"), **figures})
    return found


def measure_diff(old_runtime, new_runtime, new_dir, limits: dict) -> dict:
    """diff OLD NEW: NEW's figures in its session worker, and the swap: OLD loaded beside NEW in that worker, as TF
    Serving holds OLD while NEW loads. OLD deployed (--serving HOST:PORT): no swap, its memory is not ours to read.
    The limits are diff's gates (diff/command.py memory_gates)."""
    memory = dict(serving_estimate(new_dir), measured=[], swap=None,
                  limits={f"{k}_bytes": v for k, v in limits.items()})
    worker = getattr(getattr(new_runtime, "inner", new_runtime), "worker", None)
    old_worker = getattr(getattr(old_runtime, "inner", old_runtime), "worker", None)
    old_path = old_worker.path if old_worker is not None else None  # (resolved)
    figures = worker.memory(previous=old_path) if worker is not None else {}
    if "loaded_bytes" in figures:
        row = {"runtime": "new (session)", "tf": worker.tf_version, "pid": worker.process.pid,
               **{k: figures[k] for k in ("baseline_bytes", "loaded_bytes", "peak_bytes", "method")}}
        row["ratio"] = round(row["loaded_bytes"] / memory["estimate_bytes"], 3) if memory["estimate_bytes"] else None
        memory["measured"].append(row)
        memory["swap"] = _swap(old_path, figures, row) if old_path else None
    if memory["swap"] is None:
        memory["swap"] = {"old": None, "why": _no_swap({"source": "serving"} if old_path is None else None)}
    return memory


def _previous_dir(baseline: dict | None) -> str | None:
    """The version directory TF Serving served before this one (verify's baseline), when it is one on disk."""
    if not baseline or baseline.get("source") not in ("previous-version", "--baseline") or not baseline.get("old"):
        return None
    if storage.is_url(baseline["old"]):  # a bucket's previous version: loaded from its full local mirror
        from exportkit.savedmodel.versions import resolve_savedmodel_dir

        return str(resolve_savedmodel_dir(baseline["old"]))
    old = Path(baseline["old"])
    return str(old.resolve()) if (old / "saved_model.pb").is_file() or (old / "saved_model.pbtxt").is_file() else None


def _no_swap(baseline: dict | None) -> str:
    if baseline and baseline.get("source") == "serving":
        return ("not available: the deployed version runs in a server exportkit did not start, whose memory it "
                "cannot read; verify the base directory that holds both versions for the swap")
    return (baseline or {}).get("why") or "no version served before this one"


def _swap(old: str, figures: dict, row: dict) -> dict:
    """The availability-preserving swap: the old version held while the new one loads and answers."""
    old = storage.display(old)  # a bucket version by its URL, not its mirror
    if "previous_loaded_bytes" not in figures:
        return {"old": old, "why": f"the old version did not load: {figures.get('previous_error', 'unknown')}"}
    old_bytes = figures["previous_loaded_bytes"]
    return {"old": old, "old_loaded_bytes": old_bytes, "peak_bytes": old_bytes + row["peak_bytes"],
            "runtime": row["runtime"]}


def findings(memory: dict) -> list[Finding]:
    """The gates (errors) and the estimate that TF Serving's resource tracker would get wrong (a warning)."""
    found = []
    estimate, files = memory["estimate_bytes"], memory["files_bytes"]
    max_memory = memory["limits"].get("max_memory_bytes")
    for row in memory["measured"]:
        where = f"{row['runtime']}, TensorFlow {row['tf']}"
        if max_memory is not None and row["peak_bytes"] > max_memory:
            found.append(Finding("error", "memory-limit",
                                 f"the model's peak memory is {size_text(row['peak_bytes'])} ({where}; "
                                 f"{size_text(row['loaded_bytes'])} once loaded), over --max-memory "
                                 f"{size_text(max_memory)}: give the server more memory or shrink the model"))
        if over_estimate(row["loaded_bytes"], estimate):
            found.append(Finding("warning", "memory-over-estimate",
                                 f"the model takes {size_text(row['loaded_bytes'])} loaded ({where}), "
                                 f"{row['loaded_bytes'] / max(estimate, 1):.1f}x TF Serving's estimate of "
                                 f"{size_text(estimate)} ({size_text(files)} of files x 1.2): its resource tracker "
                                 f"would admit this version on {size_text(estimate)} and the server can run out of "
                                 f"memory; size the server on the measured figure (more than {ESTIMATE_MARGIN}x the "
                                 f"estimate is flagged)"))
    for server in memory.get("servers", []):
        if max_memory is not None and server["total_bytes"] > max_memory:
            found.append(Finding("error", "memory-limit",
                                 f"the {server['server']} server holds {size_text(server['total_bytes'])} with the "
                                 f"model loaded (its own memory included; {server['method']}), over --max-memory "
                                 f"{size_text(max_memory)}: give the server more memory or shrink the model"))
    swap, max_swap = memory.get("swap") or {}, memory["limits"].get("max_swap_memory_bytes")
    if max_swap is not None and swap.get("peak_bytes") is not None and swap["peak_bytes"] > max_swap:
        found.append(Finding("error", "swap-memory-limit",
                             f"the swap from {swap['old']} needs {size_text(swap['peak_bytes'])} while both versions "
                             f"are loaded (TF Serving loads the new one before it unloads the old one), over "
                             f"--max-swap-memory {size_text(max_swap)}: give the server more memory, or serve with "
                             f"the resource-preserving policy (unload first)"))
    return found


MEMORY_HEADERS = ("MEMORY", "TF", "LOADED", "PEAK", "VS ESTIMATE", "NOTE")


def memory_rows(memory: dict | None) -> list[tuple[str, ...]]:
    """The reports' memory table (text, HTML, Markdown): TF Serving's estimate, each measured figure, the swap."""
    if not memory:
        return []
    estimate = memory["estimate_bytes"]
    rows = [("TF Serving estimate", "-", size_text(estimate), "-", "1x",
             f"{size_text(memory['files_bytes'])} of files x 1.2")]
    for row in memory["measured"]:
        ratio = f"{row['ratio']:.2f}x" if row.get("ratio") is not None else "-"
        gpu = f"; GPU:0 peak {size_text(row['gpu']['peak_bytes'])}" if row.get("gpu") else ""
        rows.append((row["runtime"], str(row["tf"]), size_text(row["loaded_bytes"]), size_text(row["peak_bytes"]),
                     ratio, f"{row['method']}, baseline {size_text(row['baseline_bytes'])}{gpu}"))
    if not memory["measured"]:
        rows.append(("session", "-", "-", "-", "-", "not measured: no session runtime loaded the model"))
    for server in memory.get("servers", []):
        peak = server.get("peak_bytes")
        rows.append((f"{server['runtime']} ({server['server']})", str(server.get("tf") or "-"), "-",
                     size_text(peak) if peak else "-", "-",
                     f"the whole server holds {size_text(server['total_bytes'])} ({server['method']}; TF Serving's "
                     f"own memory included, no baseline)"))
    swap = memory.get("swap") or {}
    if swap.get("peak_bytes") is not None:
        rows.append(("swap", "-", "-", size_text(swap["peak_bytes"]),
                     f"{swap['peak_bytes'] / estimate:.2f}x" if estimate else "-",
                     f"both loaded: {swap['old']} ({size_text(swap['old_loaded_bytes'])}) + this version's peak"))
    elif swap:
        rows.append(("swap", "-", "-", "-", "-", swap.get("why") or ""))
    return rows
