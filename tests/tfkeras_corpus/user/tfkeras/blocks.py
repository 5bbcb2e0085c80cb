"""Model blocks written against `import tf_keras as keras` (no TF_USE_LEGACY_KERAS)."""
import tensorflow as tf
import tf_keras as keras


class ResidualBlock(keras.layers.Layer):
    """Dense + skip connection; not registered (pass this module with --custom-objects)."""

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.inner = keras.layers.Dense(units, activation="relu")
        self.outer = keras.layers.Dense(units)

    def call(self, x):
        return tf.nn.relu(x + self.outer(self.inner(x)))

    def get_config(self):
        return {**super().get_config(), "units": self.units}


@keras.saving.register_keras_serializable()
class Gate(keras.layers.Layer):
    """x * sigmoid(w): registered without a package ("Custom>Gate")."""

    def build(self, input_shape):
        self.w = self.add_weight(name="w", shape=(input_shape[-1],), initializer="zeros")

    def call(self, x):
        return x * tf.sigmoid(self.w)


@keras.saving.register_keras_serializable(package="towers")
class TowerModel(keras.Model):
    """A subclassed model with get_config, registered in package "towers"."""

    def __init__(self, width=8, depth=2, **kwargs):
        super().__init__(**kwargs)
        self.width, self.depth = width, depth
        self.tower = [keras.layers.Dense(width, activation="relu") for _ in range(depth)]
        self.out_layer = keras.layers.Dense(3, activation="softmax")

    def call(self, x, training=False):
        for layer in self.tower:
            x = layer(x)
        return self.out_layer(x)

    def get_config(self):
        return {"width": self.width, "depth": self.depth}
