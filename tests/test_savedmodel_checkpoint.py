"""The checkpoint index reader (exportkit/savedmodel/checkpoint.py) against checkpoints TensorFlow writes here, compared field by
field with `tf.train.load_checkpoint`; the duplicate-variables finding in inspect and verify; damaged indexes."""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from conftest import invoke

EMBEDDING = (4096, 64)  # float32: 1 MiB, the smallest tensor the duplicate-variables finding reports
EMBEDDING_BYTES = EMBEDDING[0] * EMBEDDING[1] * 4


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="session")
def tf():
    from exportkit.tfenv import import_tf

    return import_tf()


@pytest.fixture(scope="session")
def bundles(tf, tmp_path_factory) -> dict[str, Path]:
    """Checkpoint prefixes (PREFIX.index, PREFIX.data-*) of: Keras 3's `model.export` (every weight twice),
    `exportkit export` of the same model, a tf.Module saved by tf.saved_model.save, and a checkpoint written in
    two shards with a partitioned variable, and one whose index spans several data blocks."""
    import io

    import keras

    from exportkit.export.pipeline import Progress, export_model
    from exportkit.options.export import export_options

    root = tmp_path_factory.mktemp("bundles")
    keras.utils.set_random_seed(0)
    ids = keras.Input((3,), dtype="int32", name="ids")
    score = keras.layers.Dense(2, name="score")(keras.layers.Flatten()(keras.layers.Embedding(*EMBEDDING)(ids)))
    model = keras.Model(ids, {"score": score})
    model.export(str(root / "keras_export"), verbose=False)
    model.save(root / "model.keras")
    exported = export_model(export_options(str(root / "model.keras"), str(root / "exportkit"), no_verify=True),
                            Progress(io.StringIO())).path

    class Module(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(tf.random.stateless_normal([64, 32], seed=[1, 2]))
            self.steps = tf.Variable(7, dtype=tf.int64)
            self.words = tf.Variable(["a", "bb"])

        @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32, name="x")])
        def serve(self, x):
            return {"y": tf.matmul(x, self.w)}

    module = Module()
    tf.saved_model.save(module, str(root / "module"), signatures={"serving_default": module.serve})
    twins = tf.Module()  # two variables that happen to hold the same 1 MiB: not Keras' doing
    twins.a, twins.b = tf.Variable(tf.zeros([512, 512])), tf.Variable(tf.zeros([512, 512]))
    tf.saved_model.save(twins, str(root / "twins"))

    checkpoint = tf.train.Checkpoint(a=tf.Variable(tf.reshape(tf.range(30000, dtype=tf.float32), [300, 100])),
                                     b=tf.Variable(tf.range(5000)), c=tf.Variable(["x", "yy"]))
    policy = tf.train.experimental.MaxShardSizePolicy(max_shard_size=100_000)
    sharded = checkpoint.write(str(root / "sharded" / "ckpt"),
                               options=tf.train.CheckpointOptions(experimental_sharding_callback=policy))
    # Long distinct keys: an index of ~380 KB, more than one 256 KiB data block.
    many = tf.train.Checkpoint(**{f"v{i:03d}_" + "x" * 500: tf.Variable(float(i)) for i in range(700)})
    return {"keras_export": root / "keras_export" / "variables" / "variables",
            "many": Path(many.write(str(root / "many" / "ckpt"))),
            "exportkit": Path(exported) / "variables" / "variables",
            "module": root / "module" / "variables" / "variables",
            "twins": root / "twins" / "variables" / "variables",
            "sharded": Path(sharded)}


def _saved_model(prefix: Path) -> Path:
    return prefix.parent.parent


def _read(prefix: Path):
    from exportkit.savedmodel.checkpoint import read_checkpoint

    return read_checkpoint(f"{prefix}.index")


# ------------------------------------------------------------------------------------------- the reader
def test_crc32c_matches_the_standard_check_value():
    from exportkit.inputs.tfrecord import _crc32c_python, crc32c, masked_crc32c

    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C (Castagnoli) check value
    assert _crc32c_python(b"123456789") == 0xE3069283  # the fallback where google-crc32c is missing
    masked = ((0xE3069283 >> 15 | 0xE3069283 << 17) + 0xA282EAD8) & 0xFFFFFFFF  # crc32c.h: Mask
    assert masked_crc32c(b"123456789") == masked


@pytest.mark.slow
@pytest.mark.parametrize("name", ["keras_export", "exportkit", "module", "sharded", "many"])
def test_reader_agrees_with_tensorflow(bundles, tf, name):
    from exportkit.inputs.tfrecord import masked_crc32c
    from exportkit.savedmodel.checkpoint import data_shard_path

    prefix = bundles[name]
    checkpoint = _read(prefix)
    reader = tf.train.load_checkpoint(str(prefix))
    shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    assert [t.name for t in checkpoint.tensors] == sorted(shapes)
    for t in checkpoint.tensors:
        assert list(t.shape) == shapes[t.name], t.name
        assert t.dtype == dtypes[t.name].name, t.name
        if t.dtype == "string" or t.slices:
            continue
        with open(data_shard_path(f"{prefix}.index", t.shard, checkpoint.num_shards), "rb") as f:
            f.seek(t.offset)
            stored = f.read(t.size)
        assert stored == reader.get_tensor(t.name).tobytes(), t.name  # offset, size and shard point at the value
        if t.size <= 64 * 1024:
            assert masked_crc32c(stored) == t.crc32c, t.name
    total = sum(reader.get_tensor(n).nbytes for n in shapes if n != "_CHECKPOINTABLE_OBJECT_GRAPH"
                and dtypes[n] != tf.string)
    strings = sum(t.size for t in checkpoint.variables if t.dtype == "string")
    assert checkpoint.total_bytes == total + strings


@pytest.mark.slow
def test_sharded_checkpoint_and_partitioned_variable(bundles):
    checkpoint = _read(bundles["sharded"])
    assert checkpoint.num_shards == 2
    a = next(t for t in checkpoint.tensors if t.name.startswith("a/"))
    assert a.slices > 1 and a.size == 300 * 100 * 4  # the slices' bytes add up to the whole variable
    assert {t.shard for t in checkpoint.tensors} == {0, 1}


@pytest.mark.slow
def test_duplicates_are_found_only_in_keras_exports(bundles):
    keras_export = _read(bundles["keras_export"])
    [group] = keras_export.duplicates()
    assert sorted(t.name.split("/")[0] for t in group) == ["_all_variables", "variables"]
    assert group[0].shape == EMBEDDING and group[0].size == EMBEDDING_BYTES
    # The small Dense weights are stored twice as well: below the 1 MiB threshold of equal tensors in general, but
    # Keras' `_all_variables/` copies are counted whatever their size.
    assert len(keras_export.duplicates(min_bytes=1)) == 3
    copies = keras_export.keras_copies()
    assert len(copies) == 3 and all(c.name.startswith("_all_variables/") and not o.name.startswith("_all_variables/")
                                    and (c.shape, c.crc32c) == (o.shape, o.crc32c) for c, o in copies)
    mine = _read(bundles["exportkit"])
    assert mine.duplicates(min_bytes=1) == [] and mine.keras_copies() == [] and len(mine.variables) == 3
    assert keras_export.total_bytes == 2 * mine.total_bytes
    assert keras_export.duplicate_bytes() == mine.total_bytes  # every variable once too many
    assert _read(bundles["module"]).duplicates(min_bytes=1) == []


# -------------------------------------------------------------------------------------- inspect / verify
@pytest.mark.slow
def test_inspect_warns_about_duplicates_and_shows_sizes(bundles):
    proc = invoke("inspect", _saved_model(bundles["keras_export"]), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["variables"]["tensors"] == 6 and doc["variables"]["duplicate_bytes"] == doc["variables"]["bytes"] // 2
    assert doc["variables"]["largest"][0] == {"name": "_all_variables/0/.ATTRIBUTES/VARIABLE_VALUE",
                                              "dtype": "float32", "shape": list(EMBEDDING), "bytes": EMBEDDING_BYTES}
    [finding] = [f for f in doc["findings"] if f["code"] == "duplicate-variables"]
    assert finding["severity"] == "warning"
    for part in ("3 variables twice", "Keras 3", "TF Serving", "fix: re-export with `exportkit export`"):
        assert part in finding["message"], part

    mine = invoke("inspect", _saved_model(bundles["exportkit"]).parent)  # the base directory, text output
    assert mine.returncode == 0, mine.stderr
    assert "duplicate-variables" not in mine.stdout
    line = next(l for l in mine.stdout.splitlines() if l.startswith("variables:"))
    assert line.startswith(f"variables: 3 tensors, 1.0 MiB ({EMBEDDING_BYTES + 192 * 2 * 4 + 2 * 4} bytes) in 1 shard")
    assert "duplicated" not in line


@pytest.mark.slow
def test_equal_variables_not_written_by_keras(bundles):
    from exportkit.savedmodel.lint import checkpoint_findings

    [finding] = checkpoint_findings(_saved_model(bundles["twins"]))
    assert finding.code == "duplicate-variables" and "a/.ATTRIBUTES/VARIABLE_VALUE = b/" in finding.message
    assert "Keras" not in finding.message and "several names" in finding.message


@pytest.mark.slow
def test_verify_reports_the_same_finding(bundles):
    proc = invoke("verify", _saved_model(bundles["keras_export"]), "--runtimes", "saved_model", "--serving", "none",
                  "--json", "-")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert "duplicate-variables" in [f["code"] for f in doc["findings"]]


# ------------------------------------------------------------------------------------------ damaged files
def _data_blocks(index: bytes) -> list[tuple[int, int]]:
    """(offset, size) of each data block: the values of the index block, found through the footer."""
    from exportkit.savedmodel.checkpoint import FOOTER_SIZE, _block_entries, _varint

    footer = index[-FOOTER_SIZE:]
    _, pos = _varint(footer, 0, 40)
    _, pos = _varint(footer, pos, 40)
    offset, pos = _varint(footer, pos, 40)
    size, _ = _varint(footer, pos, 40)
    blocks = []
    for _, handle in _block_entries(index[offset:offset + size], "index"):
        data_offset, pos = _varint(handle, 0, len(handle))
        blocks.append((data_offset, _varint(handle, pos, len(handle))[0]))
    return blocks


def _first_data_block(index: bytes) -> tuple[int, int]:
    return _data_blocks(index)[0]


@pytest.mark.slow
def test_index_of_several_blocks(bundles):
    assert len(_data_blocks(Path(f"{bundles['many']}.index").read_bytes())) >= 2
    assert len(_read(bundles["many"]).variables) == 700


def _snappy(index: bytes) -> bytes:
    """The index with its first data block marked snappy-compressed while it is not (trailer crc recomputed, so
    only the type is wrong): TF's reader says "corrupted compressed block contents"."""
    from exportkit.inputs.tfrecord import masked_crc32c

    offset, size = _first_data_block(index)
    out = bytearray(index)
    out[offset + size] = 1
    struct.pack_into("<I", out, offset + size + 1, masked_crc32c(bytes(out[offset:offset + size + 1])))
    return bytes(out)


def _flip(index: bytes) -> bytes:
    offset, size = _first_data_block(index)
    out = bytearray(index)
    out[offset + size // 2] ^= 0x40
    return bytes(out)


DAMAGE = {
    "truncated": (lambda b: b[:-7], "bad magic number"),
    "cut short": (lambda b: b[:30], "too short for a table"),
    "flipped bit": (_flip, "checksum mismatch"),
    "snappy": (_snappy, "corrupted compressed block contents"),
    "empty": (lambda b: b"", "too short for a table"),
}


@pytest.mark.slow
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_index_is_a_clear_error(bundles, tmp_path, damage):
    from exportkit.errors import UsageError

    model = tmp_path / "model"
    shutil.copytree(_saved_model(bundles["module"]), model)
    index = model / "variables" / "variables.index"
    change, expected = DAMAGE[damage]
    index.write_bytes(change(index.read_bytes()))
    with pytest.raises(UsageError) as err:
        _read(model / "variables" / "variables")
    assert expected in err.value.message and str(index) in err.value.message
    assert err.value.remedy

    proc = invoke("inspect", model, "--json")  # the rest of the model is still shown, with an error finding
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["variables"] is None and doc["signatures"]
    [finding] = [f for f in doc["findings"] if f["code"] == "checkpoint-unreadable"]
    assert finding["severity"] == "error" and expected in finding["message"] and "fix:" in finding["message"]
    assert invoke("inspect", model, "--strict").returncode == 1


@pytest.mark.slow
def test_truncated_or_missing_data_shard(bundles, tmp_path):
    from exportkit.errors import UsageError

    model = tmp_path / "model"
    shutil.copytree(_saved_model(bundles["module"]), model)
    data = model / "variables" / "variables.data-00000-of-00001"
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(UsageError, match="has 100 bytes.*truncated"):
        _read(model / "variables" / "variables")
    data.unlink()
    with pytest.raises(UsageError, match="variables.data-00000-of-00001 is missing"):
        _read(model / "variables" / "variables")


def test_model_without_variables_has_no_checkpoint(tmp_path):
    from exportkit.savedmodel.checkpoint import saved_model_checkpoint

    assert saved_model_checkpoint(tmp_path) is None


def test_model_root_layout_restores_strictly(tf, tmp_path):
    """tf_keras' model.save_weights(prefix) makes the model the checkpoint's root; tf.train.Checkpoint(model=m)
    does not. Both restore, and a model the checkpoint only partly covers is still an error."""
    import numpy as np
    import tf_keras

    from exportkit.savedmodel.checkpoint import read_checkpoint
    from exportkit.errors import UsageError
    from exportkit.sources.load import _restore_checkpoint

    def model(*widths):
        inputs = tf_keras.Input((3,))
        x = inputs
        for width in widths:
            x = tf_keras.layers.Dense(width)(x)
        return tf_keras.Model(inputs, x)

    trained = model(4, 1)
    trained.save_weights(str(tmp_path / "root"))
    tf.train.Checkpoint(model=trained).write(str(tmp_path / "attr"))
    assert read_checkpoint(tmp_path / "root.index").model_is_root
    assert not read_checkpoint(tmp_path / "attr.index").model_is_root
    for prefix in ("root", "attr"):
        rebuilt = model(4, 1)
        _restore_checkpoint(rebuilt, str(tmp_path / prefix))
        assert all(np.array_equal(a, b) for a, b in zip(trained.get_weights(), rebuilt.get_weights()))
    with pytest.raises(UsageError, match="does not fit the model's architecture"):
        _restore_checkpoint(model(4, 1, 2), str(tmp_path / "root"))
