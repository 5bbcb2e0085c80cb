"""Source of the custom objects used by test_sources_contracts_reference.py, written to a tmp dir as `t15layers.py`
so that the "training process" (a subprocess) and `--python-path` / `--custom-objects` can import it."""

KERAS3 = '''
import keras
from keras import ops


@keras.saving.register_keras_serializable(package="t15")
class Complete(keras.layers.Layer):
    def __init__(self, scale=1.0, **kwargs):
        super().__init__(**kwargs)
        self.scale = float(scale)

    def call(self, x):
        return x * ops.cast(self.scale, x.dtype)

    def get_config(self):
        return {**super().get_config(), "scale": self.scale}


@keras.saving.register_keras_serializable(package="t15")
class Forgetful(keras.layers.Layer):
    """Written the way the seeds warn against: get_config() forgets `scale`."""

    def __init__(self, scale=1.0, **kwargs):
        super().__init__(**kwargs)
        self.scale = float(scale)

    def call(self, x):
        return x * ops.cast(self.scale, x.dtype)

    def get_config(self):
        return super().get_config()


@keras.saving.register_keras_serializable(package="t15")
class NoConfig(keras.layers.Layer):
    """No get_config at all: Keras 3 captures the constructor arguments itself."""

    def __init__(self, units=4, factor=2.0, **kwargs):
        super().__init__(**kwargs)
        self.units, self.factor = units, factor

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1], self.units), initializer="glorot_uniform")

    def call(self, x):
        return ops.matmul(x, self.w) * self.factor


@keras.saving.register_keras_serializable(package="t15")
class Unserializable(keras.layers.Layer):
    def __init__(self, table=None, **kwargs):
        super().__init__(**kwargs)
        self.table = table

    def call(self, x):
        return x

    def get_config(self):
        return {**super().get_config(), "table": self.table}


@keras.saving.register_keras_serializable(package="t15")
def doubled(x):
    return x * 2.0


def halved(x):  # not registered: a model rebuilt from its config cannot find it
    return x * 0.5


@keras.saving.register_keras_serializable(package="t15")
class Tower(keras.Model):
    """A nested custom model with a custom activation."""

    def __init__(self, units=4, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.dense = keras.layers.Dense(units, activation=doubled)

    def call(self, x):
        return self.dense(x)

    def get_config(self):
        return {**super().get_config(), "units": self.units}


def build(scale=0.5, forgetful=False, unserializable=False, activation=None):
    x = keras.Input((4,), name="x")
    h = keras.layers.Dense(4, name="pre", activation=activation)(x)
    h = (Forgetful if forgetful else Complete)(scale, name="scaled")(h)
    h = NoConfig(4, 3.0, name="noconfig")(h)
    h = Tower(4, name="tower")(h)
    if unserializable:
        h = Unserializable(table=object(), name="table")(h)
    y = keras.layers.Dense(2, name="score")(h)
    return keras.Model(x, y, name="t15")


def build_plain(layers=2):
    x = keras.Input((4,), name="x")
    h = x
    for _ in range(layers):
        h = keras.layers.Dense(4)(h)
    return keras.Model(x, h)
'''

# The training script: builds, "trains" (random weights), saves every format and records the references.
TRAIN = '''
import json, shutil, sys
sys.path.insert(0, sys.argv[1])
import keras, numpy as np, tensorflow as tf
import exportkit
import t15layers as L

out = sys.argv[1]
keras.utils.set_random_seed(1)
for name, kwargs in {"faithful": {}, "drift": {"forgetful": True}}.items():
    model = L.build(**kwargs)
    model.save(f"{out}/{name}.keras")
    model.save(f"{out}/{name}.h5")
    exportkit.record_reference(model, f"{out}/{name}.keras.reference.npz")
    shutil.copy(f"{out}/{name}.keras.reference.npz", f"{out}/{name}.h5.reference.npz")
model = L.build()
tf.train.Checkpoint(model=model).save(f"{out}/ckpt/ckpt")
exportkit.record_reference(model, f"{out}/ckpt.reference.npz", samples=4, seed=3)
L.build_plain(3).save_weights(f"{out}/three.weights.h5")

import tf_keras

class TfkScale(tf_keras.layers.Layer):
    def __init__(self, scale=1.0, **kwargs):
        super().__init__(**kwargs)
        self.scale = scale
    def call(self, x):
        return x * self.scale

for name, complete in {"tfk2_faithful": True, "tfk2_drift": False}.items():
    def get_config(self, complete=complete):
        return {**tf_keras.layers.Layer.get_config(self), **({"scale": self.scale} if complete else {})}
    cls = type("Complete", (TfkScale,), {"get_config": get_config})
    tf_keras.utils.get_custom_objects()["t15>Complete"] = cls
    x = tf_keras.Input((4,), name="x")
    h = tf_keras.layers.Dense(4, name="pre")(x)
    h = cls(0.5, name="scaled")(h)
    y = tf_keras.layers.Dense(2, name="score")(h)
    tfk = tf_keras.Model(x, y)
    tfk.save(f"{out}/{name}.h5")
    exportkit.record_reference(tfk, f"{out}/{name}.h5.reference.npz")
print("trained")
'''
