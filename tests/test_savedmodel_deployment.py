"""Pitfalls every local runtime passes and the real server does not: files outside the SavedModel, XLA under TF
Serving's stock flags (exportkit/savedmodel/deployment.py, options/server_flags.py). Models built the way others write them: a
tf.compat.v1 graph saved by SavedModelBuilder without an assets collection, a tf.Module with jit_compile=True, a
Keras 3 export of a layer holding a hash table over an absolute path."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import has_gpu, invoke, run_cli
from exportkit.tfversions import analysis
from exportkit.savedmodel.deployment import file_reads
from exportkit.errors import CheckFailed, UsageError
from exportkit.export.selfcheck import external_files_check
from exportkit.inspection.command import read_info
from exportkit.savedmodel.reader import read_saved_model_proto, select_meta_graph
from exportkit.options.server_flags import STOCK, parse_server_flags
from exportkit.serving.launch.docker import moving_tag
from exportkit.tfenv import package_version


def _v1_table(path, vocab: str, assets: bool = False) -> None:
    """`assets`: hand SavedModelBuilder the ASSET_FILEPATHS collection (it copies the file into assets/)."""
    import tensorflow as tf

    v1 = tf.compat.v1
    with tf.Graph().as_default(), v1.Session() as sess:
        x = v1.placeholder(tf.string, [None], name="x")
        init = tf.lookup.TextFileInitializer(vocab, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE, tf.int64,
                                             tf.lookup.TextFileIndex.LINE_NUMBER)
        table = tf.lookup.StaticHashTable(init, -1)
        sess.run(v1.tables_initializer())
        builder = v1.saved_model.Builder(str(path))
        signature = v1.saved_model.predict_signature_def({"x": x}, {"y": table.lookup(x)})
        collection = v1.get_collection(v1.GraphKeys.ASSET_FILEPATHS) if assets else None
        builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={"serving_default": signature},
                                             main_op=v1.tables_initializer(), assets_collection=collection)
        builder.save()


def _v1_reader(path) -> None:
    """A WholeFileReader fed by a queue of file names, read on every request."""
    import tensorflow as tf

    v1 = tf.compat.v1
    with tf.Graph().as_default(), v1.Session() as sess:
        queue = v1.FIFOQueue(10, tf.string, name="files")
        queue.enqueue_many([tf.constant(["/data/a.txt", "/data/b.txt"])])
        _, contents = v1.WholeFileReader().read(queue)
        x = v1.placeholder(tf.float32, [None], name="x")
        y = x + tf.cast(tf.strings.length(contents), tf.float32)
        builder = v1.saved_model.Builder(str(path))
        builder.add_meta_graph_and_variables(
            sess, ["serve"], signature_def_map={"serving_default": v1.saved_model.predict_signature_def({"x": x}, {"y": y})})
        builder.save()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    import keras
    import tensorflow as tf

    root = tmp_path_factory.mktemp("pitfalls")
    vocab = root / "vocab.txt"
    vocab.write_text("a\nb\nc\n")
    _v1_table(root / "v1_absolute" / "1", str(vocab))
    _v1_table(root / "v1_asset" / "1", str(vocab), assets=True)
    cwd = os.getcwd()
    os.chdir(root)
    try:
        _v1_table(root / "v1_relative" / "1", "vocab.txt")
    finally:
        os.chdir(cwd)
    _v1_reader(root / "v1_reader" / "1")

    class Scaled(tf.Module):
        def __init__(self):
            self.w = tf.Variable(2.0)

        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")], jit_compile=True)
        def serve(self, x):
            return {"y": x * self.w}

    module = Scaled()
    tf.saved_model.save(module, str(root / "jit" / "1"), signatures={"serving_default": module.serve})

    class Vocabulary(keras.layers.Layer):
        def __init__(self, path, **kwargs):
            super().__init__(**kwargs)
            self.table = tf.lookup.StaticHashTable(tf.lookup.TextFileInitializer(
                path, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE, tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER), -1)

        def call(self, x):
            return self.table.lookup(x)

    inputs = keras.Input(shape=(), dtype="string", name="x")
    model = keras.Model(inputs, {"y": Vocabulary(str(vocab), name="vocab_lookup")(inputs)})
    model.export(str(root / "keras3" / "1"), format="tf_saved_model", verbose=False)
    return root


def _meta_graph(path):
    return select_meta_graph(read_saved_model_proto(path))


def test_a_v1_table_over_an_absolute_path_is_an_error_naming_it(models):
    info = read_info(models / "v1_absolute" / "1", check_registry=False)
    path = str(models / "vocab.txt")
    assert info.files_read == [{"op": "InitializeTableFromTextFileV2", "node": "text_file_init/InitializeTableFromTextFileV2",
                                "when": "load", "path": path, "owner": "text_file_init"}]
    errors = [f for f in info.findings if f.code == "external-file"]
    assert [f.severity for f in errors] == ["error"] and path in errors[0].message
    assert "absolute path" in errors[0].message and "assets_collection" in errors[0].message
    predicted = analysis.analyze(_meta_graph(models / "v1_absolute" / "1"), ["2.21"])
    assert predicted[0].predicted == "fails"
    with pytest.raises(CheckFailed, match="captured by text_file_init"):
        external_files_check(models / "v1_absolute" / "1")


def test_a_v1_table_over_an_asset_is_no_error(models):
    """SavedModelBuilder's assets_collection: the graph keeps the absolute path in a Const, the loader feeds that
    Const with assets/vocab.txt (listed in the `saved_model_assets` collection), so the server loads it anywhere."""
    info = read_info(models / "v1_asset" / "1", check_registry=False)
    assert [(r["op"], r.get("asset"), r.get("path")) for r in info.files_read] == [
        ("InitializeTableFromTextFileV2", "vocab.txt", None)]
    assert not [f for f in info.findings if f.severity == "error"], info.findings
    external_files_check(models / "v1_asset" / "1")


def test_a_load_failing_on_the_missing_file_names_it(tmp_path):
    """TF2 puts the node's Python stack before the cause ("Graph execution error: Detected at node ... File ...");
    the message keeps the cause: the file that is not there."""
    from exportkit.runtimes.local import SavedModelRuntime

    vocab = tmp_path / "gone.txt"
    vocab.write_text("a\n")
    _v1_table(tmp_path / "m" / "1", str(vocab))
    vocab.unlink()
    with pytest.raises(CheckFailed, match="tf.saved_model.load failed: NotFoundError: .*gone.txt"):
        SavedModelRuntime(str(tmp_path / "m" / "1"), "serving_default", {"x": "string"}).load_model()


def test_a_relative_path_is_an_error_too(models):
    (read,) = file_reads(_meta_graph(models / "v1_relative" / "1"))
    assert (read.path, read.outside) == ("vocab.txt", True)
    info = read_info(models / "v1_relative" / "1", check_registry=False)
    assert any(f.code == "external-file" and "relative path" in f.message for f in info.findings)


def test_a_reader_reads_the_file_names_its_queue_is_fed(models):
    reads = file_reads(_meta_graph(models / "v1_reader" / "1"))
    assert [(r.op, r.when, r.path) for r in reads] == [("ReaderReadV2", "request", "/data/a.txt"),
                                                        ("ReaderReadV2", "request", "/data/b.txt")]


def test_a_keras3_table_over_an_absolute_path_is_an_asset_and_no_error(models):
    """TF2 tracks the path as a tf.saved_model.Asset: the save copies it into assets/, the loader feeds it."""
    info = read_info(models / "keras3" / "1", check_registry=False)
    assert [(r["op"], r.get("asset"), r.get("path")) for r in info.files_read] == [
        ("InitializeTableFromTextFileV2", "vocab.txt", None)]
    assert "assets/vocab.txt" in info.assets
    assert not [f for f in info.findings if f.code == "external-file"]
    external_files_check(models / "keras3" / "1")  # export writes it


def test_an_asset_missing_from_assets_is_an_error(models, tmp_path):
    copy = tmp_path / "1"
    shutil.copytree(models / "keras3" / "1", copy)
    (copy / "assets" / "vocab.txt").unlink()
    (missing,) = [f for f in read_info(copy, check_registry=False).findings if f.code == "missing-asset"]
    assert missing.severity == "error" and "assets/vocab.txt" in missing.message


def test_older_savedmodels_list_their_assets_in_a_collection():
    from exportkit.savedmodel.deployment import asset_file_defs
    from exportkit.savedmodel.protos import protos

    meta_graph_pb2 = protos()["meta_graph"]
    meta_graph = meta_graph_pb2.MetaGraphDef()
    info = meta_graph_pb2.AssetFileDef(filename="vocab.txt")
    info.tensor_info.name = "asset_path:0"
    meta_graph.collection_def["saved_model_assets"].any_list.value.add().Pack(info)
    assert [(a.tensor_info.name, a.filename) for a in asset_file_defs(meta_graph)] == [("asset_path:0", "vocab.txt")]


def test_jit_compile_fails_under_stock_flags_and_not_when_the_server_enables_xla(models):
    meta_graph = _meta_graph(models / "jit" / "1")
    info = read_info(models / "jit" / "1", check_registry=False)
    (xla,) = [f for f in info.findings if f.code == "xla-jit"]
    assert xla.severity == "error" and "DisableXlaCompilation" in xla.message and "__inference_serve" in xla.message
    assert info.oldest_tf_serving is None  # as compat predicts: no stock server of any version serves it
    assert analysis.analyze(meta_graph, ["2.21"])[0].predicted == "fails"
    enabled = parse_server_flags(["xla_cpu_compilation_enabled=true"])
    result = analysis.analyze(meta_graph, ["2.21"], server_flags=enabled)[0]
    assert result.predicted == "ok" and [f.severity for f in result.findings if f.code == "xla-jit"] == ["info"]


def test_server_flags_parse_tensorflow_model_server_spellings():
    flags = parse_server_flags(["--xla_gpu_compilation_enabled", "enable-signature-method-name-check=1",
                                "per_process_gpu_memory_fraction=0.25"])
    assert flags.xla_enabled and flags.enable_signature_method_name_check
    assert flags.argv() == ["--xla_gpu_compilation_enabled=true", "--enable_signature_method_name_check=true",
                            "--per_process_gpu_memory_fraction=0.25"]
    assert STOCK.argv() == [] and not STOCK.xla_enabled
    for bad in ("model_base_path=/m", "xla_cpu_compilation_enabled=maybe", "per_process_gpu_memory_fraction=2"):
        with pytest.raises(UsageError):
            parse_server_flags([bad])


def test_serve_takes_tf_servings_xla_and_gpu_memory_flags():
    from exportkit.serving.server.model_server import _session_config, parse_flags

    options = parse_flags(["m", "--xla_cpu_compilation_enabled", "--per_process_gpu_memory_fraction=0.3",
                           "--device", "gpu"])
    assert options.xla_cpu_compilation_enabled and options.per_process_gpu_memory_fraction == 0.3
    assert abs(_session_config(options).gpu_options.per_process_gpu_memory_fraction - 0.3) < 1e-6
    assert not parse_flags(["m"]).xla_cpu_compilation_enabled  # TF Serving's default: XLA off
    with pytest.raises(UsageError, match="between 0.0 and 1.0"):
        parse_flags(["m", "--per_process_gpu_memory_fraction=1.5"])


def test_latest_images_move():
    assert moving_tag("tensorflow/serving:latest") and moving_tag("tensorflow/serving:latest-gpu")
    assert not moving_tag("tensorflow/serving:2.14.1") and moving_tag("localhost:5000/serving")


def test_tf_serving_test_models_get_no_new_false_error(tmp_path):
    from tfs_models import build_testdata

    for path in build_testdata(str(tmp_path)).values():
        info = read_info(path, check_registry=False)
        assert not [f for f in info.findings if f.code in ("external-file", "xla-jit")], path


@pytest.mark.slow
@pytest.mark.parametrize("name", ["text.keras", "multi_io.keras", "tfk2_functional.h5"])
def test_exportkit_exports_get_no_new_false_error_and_record_the_toolchain(exported, name):
    result = exported(name)
    assert result.proc.returncode == 0, result.proc.stdout + result.proc.stderr
    info = read_info(result.path, check_registry=False)
    assert not [f for f in info.findings if f.code in ("external-file", "xla-jit")]
    toolchain = info.manifest["toolchain"]
    assert toolchain["python"] and toolchain["tensorflow"] and "is_cuda_build" in toolchain["tensorflow_build"]
    keras = toolchain["keras"]  # the Keras that loaded the source (a tf.keras 2 .h5 loads in Keras 3 here)
    assert keras["package"] in ("keras", "tf_keras") and keras["version"] == package_version(keras["package"])


@pytest.mark.slow
def test_the_verify_report_names_the_keras_that_rebuilt_the_source(exported, sample, tmp_path):
    import json

    entry = sample("tfk2_functional.h5")
    report = tmp_path / "report.json"
    proc = invoke("verify", exported("tfk2_functional.h5").path, "--against", entry["path"], "--runtimes",
                  "golden,keras", "--json", report)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    toolchain = json.loads(report.read_text())["toolchain"]
    exported_with = read_info(exported("tfk2_functional.h5").path, check_registry=False).manifest["toolchain"]
    assert toolchain["keras"] == exported_with["keras"] and toolchain["python"] == sys.version.split()[0]
    assert f"{toolchain['keras']['package']} {toolchain['keras']['version']}" in proc.stdout


@pytest.mark.slow
def test_a_relative_path_fails_in_the_workers_as_in_a_container(models):
    """The serving-equivalent worker runs in an empty working directory: run from where vocab.txt lies, the TF1
    loader still cannot find it, as a server elsewhere cannot."""
    proc = run_cli("verify", models / "v1_relative" / "1", "--runtimes", "session", cwd=models)
    assert proc.returncode == 1
    assert "NotFoundError" in proc.stdout and "external-file" in proc.stdout


@pytest.mark.slow
@pytest.mark.serving
def test_the_embedded_server_refuses_xla_as_tf_serving_does_unless_told(models):
    path = models / "jit" / "1"
    stock = invoke("verify", path, "--runtimes", "serving")
    assert stock.returncode == 1
    assert "XLA compilation disabled" in stock.stdout and "server flags: stock" in stock.stdout
    enabled = invoke("verify", path, "--runtimes", "serving", "--server-flag",
                     "xla_cpu_compilation_enabled=true")
    assert enabled.returncode == 0, enabled.stdout + enabled.stderr
    assert "server flags: --xla_cpu_compilation_enabled=true" in enabled.stdout


@pytest.mark.slow
def test_export_refuses_a_layer_that_reads_a_file_from_the_build_machine(tmp_path):
    words = tmp_path / "words.txt"
    words.write_text("a\nb\n")
    (tmp_path / "file_layers.py").write_text(textwrap.dedent("""
        import keras
        import tensorflow as tf


        @keras.saving.register_keras_serializable(package="pitfalls")
        class FileLength(keras.layers.Layer):
            def __init__(self, file_path, **kwargs):
                super().__init__(**kwargs)
                self.file_path = file_path

            def call(self, x):
                return x + tf.cast(tf.strings.length(tf.io.read_file(self.file_path)), x.dtype)

            def get_config(self):
                return {**super().get_config(), "file_path": self.file_path}
    """))
    script = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(tmp_path)!r})
        import keras
        from file_layers import FileLength
        inp = keras.Input((3,), name="x")
        out = keras.layers.Dense(2, name="y")(FileLength({str(words)!r}, name="file_length")(inp))
        keras.Model(inp, out).save({str(tmp_path / 'reads.keras')!r})
    """)
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, timeout=120)
    base = tmp_path / "models"
    base.mkdir()
    proc = invoke("export", tmp_path / "reads.keras", "-o", base, "--custom-objects", "file_layers",
                  "--python-path", tmp_path, "--no-verify")
    assert proc.returncode == 1, proc.stderr
    assert str(words) in proc.stderr and "file_length" in proc.stderr and "the version was not written" in proc.stderr
    assert list(base.iterdir()) == []


@pytest.mark.gpu
def test_memory_growth_lets_two_processes_share_a_gpu(tmp_path):
    """Two processes (as the in-process Keras run and the GPU worker are) each hold a tensor on the GPU at the same
    time: without memory growth the first would take nearly all of its memory and the second fail to allocate."""
    if not has_gpu():
        pytest.skip("no GPU")
    script = textwrap.dedent("""
        import pathlib, sys, time
        from exportkit.runtimes.local import require_gpu
        from exportkit.tfenv import import_tf

        require_gpu()
        tf = import_tf()
        assert all(tf.config.experimental.get_memory_growth(g) for g in tf.config.list_physical_devices("GPU"))
        with tf.device("/GPU:0"):
            held = tf.ones([64, 1024, 1024])  # 256 MB, held while the other process allocates its own
        me, other = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
        me.touch()
        deadline = time.monotonic() + 120
        while not other.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert other.exists(), "the other process never held its tensor"
        with tf.device("/GPU:0"):
            total = float(tf.reduce_sum(held * 2.0).numpy())
        assert total == 2.0 * 64 * 1024 * 1024, total
        time.sleep(1)  # the other process checks this one's file after its own allocation
    """)
    a, b = tmp_path / "a.holds", tmp_path / "b.holds"
    procs = [subprocess.Popen([sys.executable, "-c", script, str(me), str(other)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for me, other in ((a, b), (b, a))]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
