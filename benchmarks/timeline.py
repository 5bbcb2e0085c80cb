"""Where does a command's wall time go, process by process? (strace timeline; a profiling aid for bench.py)

    python benchmarks/timeline.py -- exportkit verify DIR --serving embedded

Runs the command under `strace -f --seccomp-bpf -tt -e trace=execve,openat,clone,clone3,exit_group` (only
those syscalls stop, so the slow-down is small) and prints, for every Python process in the tree, seconds since
the command started:
  spawn     its execve
  tf>       first file opened under site-packages/tensorflow/ (TensorFlow import starts)
  model     first open of a saved_model.pb / .keras / .h5 / variables file (TF import is over by then)
  exit      its exit_group
plus every open of a model file, to see who loads the model when. Threads are folded into their process.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from datetime import datetime

LINE = re.compile(r"^(\d+)\s+(\d\d:\d\d:\d\d\.\d+) (.*)$")
MODEL_FILE = re.compile(r'"([^"]*(saved_model\.pb|variables\.index|\.keras|\.h5|tf_serving_warmup_requests|'
                        r'golden_inputs_batch_0\.npz))"')


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--":
        argv = argv[1:]
    with tempfile.NamedTemporaryFile(suffix=".strace", delete=False) as tmp:
        trace = tmp.name
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "3"))
    subprocess.run(["strace", "-f", "--seccomp-bpf", "-tt", "-e", "trace=execve,openat,clone,clone3,exit_group",
                    "-e", "signal=none", "-o", trace, *argv], env=env, stdout=subprocess.DEVNULL)
    owner: dict[int, int] = {}  # tid -> process id
    procs: dict[int, dict] = {}
    t0 = None
    for raw in open(trace, errors="replace"):
        m = LINE.match(raw)
        if not m:
            continue
        tid, stamp, rest = int(m.group(1)), m.group(2), m.group(3)
        t = datetime.strptime(stamp, "%H:%M:%S.%f")
        t0 = t0 or t
        sec = (t - t0).total_seconds()
        pid = owner.setdefault(tid, tid)
        if rest.startswith(("clone(", "clone3(")) and "= " in rest and "CLONE_THREAD" in rest:
            child = rest.rsplit("= ", 1)[1].split()[0]
            if child.isdigit():
                owner[int(child)] = pid
        elif rest.startswith("<... clone") and "= " in rest:
            pass
        if rest.startswith("execve(") and "ENOENT" not in rest:
            args = re.findall(r'"([^"]*)"', rest)[1:8]
            procs[pid] = {"spawn": sec, "argv": " ".join(a.split("/")[-1] if i == 0 else a for i, a in enumerate(args)),
                          "tf": None, "model": None, "exit": None, "opens": []}
        info = procs.get(pid)
        if info is None:
            continue
        if rest.startswith("openat(") and "ENOENT" not in rest:
            if info["tf"] is None and "site-packages/tensorflow/" in rest:
                info["tf"] = sec
            mf = MODEL_FILE.search(rest)
            if mf:
                info["model"] = info["model"] if info["model"] is not None else sec
                info["opens"].append((sec, os.path.basename(mf.group(1))))
        if rest.startswith("exit_group("):
            info["exit"] = sec
    os.unlink(trace)
    fmt = lambda v: "   -  " if v is None else f"{v:6.2f}"  # noqa: E731
    print(f"{'pid':>7} {'spawn':>6} {'tf>':>6} {'model':>6} {'exit':>6}  command")
    for pid, info in procs.items():
        if "python" not in info["argv"] and "exportkit" not in info["argv"] and "saved_model_cli" not in info["argv"]:
            continue
        print(f"{pid:>7} {fmt(info['spawn'])} {fmt(info['tf'])} {fmt(info['model'])} {fmt(info['exit'])}  {info['argv'][:110]}")
        seen = set()
        for sec, name in info["opens"]:
            if name not in seen:
                seen.add(name)
                print(f"{'':>28}{sec:6.2f}  opens {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
