"""SavedModels that each hit one class of version skew between TF 2.12 and 2.21 (found by
tools/diff_registries.py 2.12 2.21), written by this process's TensorFlow with tf.saved_model.save.

Each builder returns (directory, expected) where expected maps a version to what its TF1 loader does:
"ok" or "fails".
"""
from __future__ import annotations

from pathlib import Path


def _save(module, directory: Path, fn) -> Path:
    import tensorflow as tf

    tf.saved_model.save(module, str(directory), signatures={"serving_default": fn})
    return directory


def _module(fn, *specs, variables=()):
    import tensorflow as tf

    module = tf.Module()
    module.vars = list(variables)
    module.serve = tf.function(fn, input_signature=list(specs))
    return module, module.serve.get_concrete_function()


def new_op_cpu(directory: Path) -> Path:
    """`Conv` (the generic N-d convolution) is new since 2.12; it has a CPU kernel in 2.21."""
    import tensorflow as tf

    w = tf.Variable(tf.random.stateless_normal([3, 3, 2, 4], seed=[1, 2]), name="w")

    def serve(x):
        return {"y": tf.raw_ops.Conv(input=x, filter=w, strides=[1, 1, 1, 1], padding="VALID")}

    module, fn = _module(serve, tf.TensorSpec([None, 6, 6, 2], tf.float32, name="x"), variables=[w])
    return _save(module, directory, fn)


def new_op_gpu_only(directory: Path) -> Path:
    """`IRFFTND` is new since 2.12 and has only a GPU kernel: no version runs it on a CPU."""
    import tensorflow as tf

    def serve(x):
        spectrum = tf.complex(x, tf.zeros_like(x))
        return {"y": tf.raw_ops.IRFFTND(input=spectrum, fft_length=[8], axes=[-1])}

    module, fn = _module(serve, tf.TensorSpec([None, 5], tf.float32, name="x"))
    return _save(module, directory, fn)


def kernel_dtype_added(directory: Path) -> Path:
    """GatherV2 with int16 indices: the OpDef allowed it in 2.12, its CPU kernel came later."""
    import tensorflow as tf

    def serve(ids):
        table = tf.reshape(tf.range(40, dtype=tf.float32), [10, 4])
        return {"y": tf.raw_ops.GatherV2(params=table, indices=ids, axis=0)}

    module, fn = _module(serve, tf.TensorSpec([None], tf.int16, name="ids"))
    return _save(module, directory, fn)


def new_attr_non_default(directory: Path) -> Path:
    """MatMul's `grad_a` attr is new since 2.12; True is not its default, so TF 2.21 keeps it in the graph."""
    import tensorflow as tf

    w = tf.Variable(tf.random.stateless_normal([4, 3], seed=[3, 4]), name="w")

    def serve(x):
        return {"y": tf.raw_ops.MatMul(a=x, b=w, grad_a=True)}

    module, fn = _module(serve, tf.TensorSpec([None, 4], tf.float32, name="x"), variables=[w])
    return _save(module, directory, fn)


def new_type_attr(directory: Path) -> Path:
    """TopKV2's `index_type` attr is new since 2.12; int64 changes the type of its `indices` output."""
    import tensorflow as tf

    def serve(x):
        values, indices = tf.math.top_k(x, k=2, index_type=tf.int64)
        return {"values": values, "indices": indices}

    module, fn = _module(serve, tf.TensorSpec([None, 5], tf.float32, name="x"))
    return _save(module, directory, fn)


def disallowed_dtype(directory: Path) -> Path:
    """StringToNumber with out_type=uint32: allowed (and with a kernel) in 2.21, not in 2.12's OpDef."""
    import tensorflow as tf

    def serve(text):  # any string in, a number string to convert (generated inputs are random letters)
        digits = tf.strings.as_string(tf.strings.length(text))
        return {"y": tf.strings.to_number(digits, out_type=tf.uint32)}

    module, fn = _module(serve, tf.TensorSpec([None], tf.string, name="text"))
    return _save(module, directory, fn)


def plain_module(directory: Path) -> Path:
    """A plain tf.Module (no Keras): a dense layer with a variable, as third-party code writes it."""
    import tensorflow as tf

    w = tf.Variable(tf.random.stateless_normal([4, 2], seed=[5, 6]), name="w")
    b = tf.Variable(tf.zeros([2]), name="b")

    def serve(x):
        return {"y": tf.nn.softmax(tf.matmul(x, w) + b)}

    module, fn = _module(serve, tf.TensorSpec([None, 4], tf.float32, name="x"), variables=[w, b])
    return _save(module, directory, fn)


CORPUS = {
    "new_op_cpu": new_op_cpu,
    "new_op_gpu_only": new_op_gpu_only,
    "kernel_dtype_added": kernel_dtype_added,
    "new_attr_non_default": new_attr_non_default,
    "new_type_attr": new_type_attr,
    "disallowed_dtype": disallowed_dtype,
    "plain_module": plain_module,
}


def build_all(directory: Path) -> dict[str, Path]:
    from exportkit.tfenv import import_tf

    import_tf()
    return {name: build(Path(directory) / name) for name, build in CORPUS.items()}
