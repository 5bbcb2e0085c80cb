"""The export a user would write by hand: load the model, `model.export(dir)`. Nothing else.

    python benchmarks/export_baseline.py SRC OUT_DIR [--custom-objects MODULE ...] [--python-path DIR ...]

This is the baseline `exportkit export` is compared with in benchmarks/bench.py (a tf.keras 2 .h5: with tf_keras). Custom objects are given the
same way as to exportkit (a module on a path), and passed to Keras the usual way: a `custom_objects` dict.
"""
import argparse
import importlib
import inspect
import sys

parser = argparse.ArgumentParser()
parser.add_argument("src")
parser.add_argument("out")
parser.add_argument("--custom-objects", action="append", default=[])
parser.add_argument("--python-path", action="append", default=[])
args = parser.parse_args()

sys.path[:0] = args.python_path
import h5py  # noqa: E402

# A file tf.keras 2 wrote is loaded and exported with tf_keras, as its users do (Keras 3 cannot load all of them).
written_by = h5py.File(args.src, "r").attrs.get("keras_version", b"3") if args.src.endswith((".h5", ".hdf5")) else b"3"
if str(written_by.decode() if isinstance(written_by, bytes) else written_by).startswith("2"):
    import tf_keras as keras  # noqa: E402
else:
    import keras  # noqa: E402

custom_objects = {}
for name in args.custom_objects:
    module = importlib.import_module(name)
    custom_objects.update({k: v for k, v in vars(module).items()
                           if inspect.isclass(v) and issubclass(v, keras.layers.Layer)})

model = keras.models.load_model(args.src, custom_objects=custom_objects)
model.export(args.out)
