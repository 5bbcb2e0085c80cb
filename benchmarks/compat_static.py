"""Time exportkit compat's static analysis: every supported TF version on a SavedModel whose serving function
is padded to N nodes (copies of one of its nodes), registries read cold (the per-process cache cleared).

    python benchmarks/compat_static.py VERSION_DIR [--nodes 1000] [--runs 5]   -> one JSON line
"""
from __future__ import annotations

import argparse
import json
import time

from exportkit.tfversions import SUPPORTED, analysis, registry
from exportkit.savedmodel.reader import read_saved_model_proto, select_meta_graph
from harness import median


def padded(path: str, nodes: int):
    meta_graph = select_meta_graph(read_saved_model_proto(path))
    functions = sorted(meta_graph.graph_def.library.function, key=lambda f: -len(f.node_def))
    serve = next(f for f in functions if "_traced_" not in f.signature.name)
    template = next(n for n in serve.node_def if n.op not in ("NoOp", "Identity"))
    total = len(meta_graph.graph_def.node) + sum(len(f.node_def) for f in meta_graph.graph_def.library.function)
    for i in range(max(0, nodes - total)):
        node = serve.node_def.add()
        node.CopyFrom(template)
        node.name = f"bench_pad_{i}"
    return meta_graph, max(total, nodes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    meta_graph, nodes = padded(args.path, args.nodes)
    times = []
    for _ in range(args.runs):
        registry.load.cache_clear()
        began = time.perf_counter()
        analysis.analyze(meta_graph, list(SUPPORTED))
        times.append(time.perf_counter() - began)
    print(json.dumps({"nodes": nodes, "versions": len(SUPPORTED), "median_s": median(times),
                      "runs": times}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
