"""The export a user would write by hand: load the model, `model.export(dir)`. Nothing else.

    python benchmarks/export_baseline.py SRC OUT_DIR [--custom-objects MODULE ...] [--python-path DIR ...]

This is the baseline `exportkit export` is compared with in benchmarks/bench.py. Custom objects are given the
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
import keras  # noqa: E402

custom_objects = {}
for name in args.custom_objects:
    module = importlib.import_module(name)
    custom_objects.update({k: v for k, v in vars(module).items()
                           if inspect.isclass(v) and issubclass(v, keras.layers.Layer)})

model = keras.models.load_model(args.src, custom_objects=custom_objects)
model.export(args.out)
