"""A SavedModel of `nodes` Const/AddV2/Identity nodes, all reachable from `serving_default`, written from the
protos alone (no TensorFlow): what `inspect` of a very large graph must read, walk and report once."""
from __future__ import annotations

from pathlib import Path


def write_large_savedmodel(version_dir: Path, nodes: int = 1_000_000) -> Path:
    """saved_model.pb of exactly `nodes` nodes: x, c, then AddV2(prev, c) and Identity(prev) alternating; the last is
    `serving_default`'s output y. About 39 bytes a node (38 MB for a million)."""
    from exportkit.savedmodel.protos import protos

    pb = protos()
    saved_model = pb["saved_model"].SavedModel()
    meta_graph = saved_model.meta_graphs.add()
    meta_graph.meta_info_def.tags.append("serve")
    meta_graph.meta_info_def.tensorflow_version = "2.21.0"
    graph = pb["graph"].GraphDef()
    float32 = pb["types"].DT_FLOAT

    def node(name, op, inputs=()):
        n = graph.node.add(name=name, op=op)
        n.input.extend(inputs)
        n.attr["T" if op != "Const" else "dtype"].type = float32
        return n

    x = graph.node.add(name="x", op="Placeholder")
    x.attr["dtype"].type = float32
    x.attr["shape"].shape.dim.add(size=-1)
    const = node("c", "Const")
    const.attr["value"].tensor.dtype = float32
    const.attr["value"].tensor.float_val.append(1.0)
    last = "x"
    for i in range(nodes - 2):
        kind = "AddV2" if i % 2 == 0 else "Identity"
        name = f"n{i}"
        node(name, kind, (last, "c") if kind == "AddV2" else (last,))
        last = name
    meta_graph.graph_def.CopyFrom(graph)
    signature = meta_graph.signature_def["serving_default"]
    signature.method_name = "tensorflow/serving/predict"
    for info, tensor in ((signature.inputs["x"], "x:0"), (signature.outputs["y"], f"{last}:0")):
        info.name = tensor
        info.dtype = float32
        info.tensor_shape.dim.add(size=-1)
    version_dir.mkdir(parents=True, exist_ok=True)
    (version_dir / "saved_model.pb").write_bytes(saved_model.SerializeToString())
    return version_dir


if __name__ == "__main__":
    import sys
    import time

    start = time.perf_counter()
    write_large_savedmodel(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000)
    print(f"written in {time.perf_counter() - start:.1f} s")
