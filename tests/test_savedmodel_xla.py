"""Everything XLA must compile, wherever it sits, judged as the stock tensorflow_model_server judges it (XLA off
unless --xla_cpu_compilation_enabled): JAX programs (jax2tf with native serialization, Keras 3's export on the JAX
backend: one XlaCallModule), tf2xla ops (XlaPad; XlaDynamicUpdateSlice, which keras.ops.slice_update writes on the
TensorFlow backend), a TF1 jit_scope (_XlaCompile), and a .keras file saved under JAX, which exportkit exports on
the TensorFlow backend. The JAX models are built in a subprocess with KERAS_BACKEND=jax (one process holds one
Keras backend)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from conftest import invoke, run_cli
from exportkit.inspection.command import read_info
from exportkit.options.server_flags import parse_server_flags
from exportkit.savedmodel.reader import read_saved_model_proto, select_meta_graph
from exportkit.tfversions import analysis
from exportkit.tfversions.registry import available

pytestmark = pytest.mark.slow

BUILD = textwrap.dedent("""
    import sys
    import numpy as np
    import jax, jax.numpy as jnp, keras, tensorflow as tf
    from jax.experimental import jax2tf
    from tensorflow.compiler.tf2xla.python import xla

    out = sys.argv[1]
    sys.path.insert(0, out)
    from slice_layers import Put
    assert keras.backend.backend() == "jax"
    w = np.random.RandomState(0).randn(4, 3).astype("float32")

    def f(x):
        return jax.nn.softmax(jnp.tanh(x @ w))

    # jax2tf as its serving guide writes it: a tf.Module whose tf.function wraps the converted function
    module = tf.Module()
    module.f = tf.function(jax2tf.convert(f, polymorphic_shapes=["(b, 4)"]), autograph=False,
                           input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    tf.saved_model.save(module, out + "/jax2tf/1", signatures={"serving_default": module.f})
    jax.config.update("jax_export_calling_convention_version", 9)  # the oldest JAX 0.10 writes
    module.f9 = tf.function(jax2tf.convert(f, polymorphic_shapes=["(b, 4)"]), autograph=False,
                            input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    tf.saved_model.save(module, out + "/jax2tf_v9/1", signatures={"serving_default": module.f9})
    jax.config.update("jax_export_calling_convention_version", 10)

    inp = keras.Input((4,), name="x")
    model = keras.Model(inp, keras.layers.Dense(3, activation="softmax", name="probs")(inp))
    model.save(out + "/jax.keras")
    model.export(out + "/keras_jax/1", format="tf_saved_model")
    keras.Model(inp, Put(name="put")(inp)).save(out + "/slice_update.keras")  # backend-independent

    pad = tf.Module()  # a tf2xla op outside any jit_compile function
    pad.f = tf.function(lambda x: {"y": xla.pad(x, 0.0, [0, 0], [0, 1], [0, 0])},
                        input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    tf.saved_model.save(pad, out + "/xla_pad/1", signatures={"serving_default": pad.f})

    v1 = tf.compat.v1
    with tf.Graph().as_default(), v1.Session() as sess:  # TF1's jit_scope marks each op _XlaCompile
        x = v1.placeholder(tf.float32, [None, 4], name="x")
        with tf.xla.experimental.jit_scope():
            y = tf.tanh(tf.matmul(x, tf.constant(w)))
        builder = v1.saved_model.Builder(out + "/jit_scope/1")
        builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={
            "serving_default": v1.saved_model.predict_signature_def({"x": x}, {"y": y})})
        builder.save()
""")

SLICE_LAYERS = textwrap.dedent("""
    import keras


    @keras.saving.register_keras_serializable(package="xla")
    class Put(keras.layers.Layer):  # on the TensorFlow backend, slice_update is tf2xla's XlaDynamicUpdateSlice
        def call(self, x):
            return keras.ops.slice_update(x, (0, 1), keras.ops.ones((keras.ops.shape(x)[0], 2)))
""")

# DisableXlaCompilation is process-wide and for good, as in tensorflow_model_server: its own process.
RUN_DISABLED = textwrap.dedent("""
    import sys
    import numpy as np
    from exportkit.tfenv import disable_xla_compilation, import_tf

    tf = import_tf()
    assert disable_xla_compilation()
    for path in sys.argv[1:]:
        with tf.compat.v1.Session(graph=tf.Graph()) as sess:
            sig = tf.compat.v1.saved_model.loader.load(sess, ["serve"], path).signature_def["serving_default"]
            (x,), (y,) = sig.inputs.values(), sig.outputs.values()
            try:
                sess.run(y.name, {x.name: np.ones((2, 4), np.float32)})
                print(path, "ran")
            except tf.errors.InternalError as err:
                print(path, " ".join(err.message.split()))
""")

KINDS = ("jax2tf", "keras_jax", "xla_pad", "jit_scope")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = tmp_path_factory.mktemp("xla")
    (out / "slice_layers.py").write_text(SLICE_LAYERS)
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", BUILD, str(out)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _meta_graph(path):
    return select_meta_graph(read_saved_model_proto(path))


def test_the_stock_server_refuses_each_kind_and_the_check_names_the_op_where_it_sits(models):
    proc = subprocess.run([sys.executable, "-c", RUN_DISABLED, *(str(models / k / "1") for k in KINDS)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("XLA compilation disabled") == len(KINDS), proc.stdout  # measured, not assumed
    expected = {"jax2tf": "XlaCallModule", "keras_jax": "XlaCallModule", "xla_pad": "XlaPad",
                "jit_scope": "_XlaCompile"}
    for kind, op in expected.items():
        info = read_info(models / kind / "1", check_registry=False)
        (xla,) = [f for f in info.findings if f.code == "xla-jit"]
        assert xla.severity == "error" and xla.op == op, (kind, xla)
        assert "--server-flag xla_cpu_compilation_enabled=true" in xla.message
        assert ("in function '" if kind != "jit_scope" else "in the top-level graph") in xla.node
        assert info.oldest_tf_serving is None
    # Keras' JAX export writes each variable once (the TF backend's export writes some twice)
    assert not read_info(models / "keras_jax" / "1", check_registry=False).variables["duplicate_bytes"]


def test_compat_predicts_fails_under_stock_flags_and_the_module_version_window_with_xla(models):
    meta_graph = _meta_graph(models / "jax2tf" / "1")
    assert {r.predicted for r in analysis.analyze(meta_graph, available())} == {"fails"}
    enabled = parse_server_flags(["xla_cpu_compilation_enabled=true"])
    results = {r.tf: r for r in analysis.analyze(meta_graph, available(), server_flags=enabled)}
    # JAX writes StableHLO serialization version 10, which XlaCallModule knows from TF 2.20 on
    assert [v for v, r in results.items() if r.predicted == "ok"] == ["2.20", "2.21"]
    (old,) = [f for f in results["2.19"].findings if f.code == "xla-module-version"]
    assert "version 10" in old.message and "TF Serving 2.20 or later" in old.message
    assert read_info(models / "jax2tf" / "1", check_registry=False).oldest_tf_serving_with_xla == "2.20"
    v9 = analysis.analyze(_meta_graph(models / "jax2tf_v9" / "1"), available(), server_flags=enabled)
    assert [r.tf for r in v9 if r.predicted == "ok"] == ["2.16", "2.17", "2.18", "2.19", "2.20", "2.21"]
    # serialized for the exporting machine's platform (CPU): a GPU server's loader refuses the module
    (gpu,) = analysis.analyze(meta_graph, ["2.21"], device="gpu", server_flags=enabled)
    assert gpu.predicted == "fails" and any(f.code == "xla-module-platform" for f in gpu.findings)


@pytest.mark.serving
def test_verify_fails_a_jax2tf_model_under_stock_flags_and_passes_with_the_server_flag(models):
    path = models / "jax2tf" / "1"
    stock = invoke("verify", path, "--runtimes", "session,serving")
    assert stock.returncode == 1, stock.stdout
    assert "INTERNAL: XLA compilation disabled" in stock.stdout and "xla-jit" in stock.stdout
    assert "fix: start tensorflow_model_server with --xla_cpu_compilation_enabled=true" in stock.stdout
    enabled = invoke("verify", path, "--runtimes", "session,serving", "--server-flag",
                     "xla_cpu_compilation_enabled=true")
    assert enabled.returncode == 0, enabled.stdout + enabled.stderr


def test_a_keras_file_saved_under_jax_exports_on_the_tensorflow_backend_as_the_user_runs_it(models, tmp_path):
    proc = run_cli("export", models / "jax.keras", "-o", tmp_path / "out", env={"KERAS_BACKEND": "jax"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "KERAS_BACKEND=jax: exportkit loads Keras 3 models on the TensorFlow backend" in proc.stderr
    info = read_info(tmp_path / "out" / "1", check_registry=False)
    assert not [op for op in info.ops if op.startswith("Xla")]
    assert not [f for f in info.findings if f.code == "xla-jit"]
    assert info.oldest_tf_serving is not None


def test_export_refuses_a_version_the_stock_server_refuses_and_writes_it_when_told_the_server_compiles(models, tmp_path):
    base = tmp_path / "models"
    args = ("export", models / "slice_update.keras", "-o", base, "--custom-objects", "slice_layers",
            "--python-path", models, "--no-verify")
    stock = invoke(*args)
    assert stock.returncode == 1, stock.stdout + stock.stderr
    assert "XlaDynamicUpdateSlice" in stock.stderr and "keras.ops.slice_update" in stock.stderr
    assert "the version was not written" in stock.stderr and not list(base.glob("*/saved_model.pb"))
    told = invoke(*args, "--server-flag", "xla_cpu_compilation_enabled=true")
    assert told.returncode == 0, told.stdout + told.stderr
    assert (base / "1" / "saved_model.pb").is_file()
