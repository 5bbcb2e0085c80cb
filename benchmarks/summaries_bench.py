"""The error summaries' cost: `compare_arrays` with its summaries (histograms, worst elements, sampled pairs)
against the same comparison with them switched off, on float32 outputs of 1M and 100M elements.

    python benchmarks/summaries_bench.py [--sizes 1000000,100000000] [--runs 21]

Prints the fastest run of each and the median ratio of alternating pairs (target <= 1.1x, docs/performance.md).
The arrays hold typical errors (a few ulps), a sprinkle of failures, exact matches and zeros, so every branch of
the summaries works.
100M elements need ~7 GB (the float64 element errors): that size runs only with that much memory available.
"""
from __future__ import annotations

import argparse
import contextlib
import time

import numpy as np

from exportkit.compare import outputs as compare
from exportkit.compare.tolerances import Tolerance
from harness import mark


@contextlib.contextmanager
def summaries_off():
    """compare_arrays without its summaries: the bare comparison the ratio is taken against."""
    saved = compare.error_histograms, compare.worst_elements, compare.sample_pairs
    compare.error_histograms = lambda *args, **kwargs: (None, None)
    compare.worst_elements = lambda *args, **kwargs: []
    compare.sample_pairs = lambda *args, **kwargs: None
    try:
        yield
    finally:
        compare.error_histograms, compare.worst_elements, compare.sample_pairs = saved


def arrays(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    expected = rng.normal(size=n).astype(np.float32)
    actual = expected + (rng.normal(size=n) * 1e-6).astype(np.float32)
    actual[:: 997] = expected[:: 997]  # exact matches
    expected[:: 1009] = 0.0
    actual[:: 100_003] += 1e-2  # failures
    return expected, actual


def seconds(expected, actual) -> float:
    started = time.perf_counter()
    compare.compare_arrays("y", expected, actual, Tolerance(1e-5, 1e-5))
    return time.perf_counter() - started


def timed_side_by_side(expected, actual, runs: int) -> tuple[float, float, float]:
    """Fastest of `runs` of each, and the median ratio of the pairs, the two alternating. The ratio is taken per
    pair: both sides of a pair see the same load, while the fastest runs of each can fall in different phases of a
    VM's speed (on this host a 1M comparison takes 22-45 ms from one run to the next)."""
    full, bare = [], []
    seconds(expected, actual)  # warm-up: page faults of the first temporaries
    for _ in range(runs):
        full.append(seconds(expected, actual))
        with summaries_off():
            bare.append(seconds(expected, actual))
    return min(full), min(bare), float(np.median(np.divide(full, bare)))


def available_bytes() -> int:
    with open("/proc/meminfo") as f:
        info = dict(line.split(":", 1) for line in f)
    return int(info["MemAvailable"].split()[0]) * 1024


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000000,100000000")
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args(argv)
    print("| elements | with summaries (fastest) | bare comparison (fastest) | ratio (median pair) | target |\n"
          "|---:|---:|---:|---:|---:|")
    for n in (int(s) for s in args.sizes.split(",")):
        if n * 70 > available_bytes():
            print(f"| {n:,} | skipped: needs ~{n * 70 / 2**30:.1f} GB available | | | |")
            continue
        expected, actual = arrays(n)
        runs = args.runs if n <= 10_000_000 else min(args.runs, 5)  # ~15 s a pair at 100M
        full, bare, ratio = timed_side_by_side(expected, actual, runs)
        print(f"| {n:,} | {full * 1e3:.1f} ms | {bare * 1e3:.1f} ms | {mark(ratio, 1.1)} | <= 1.1x |", flush=True)
        del expected, actual
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
