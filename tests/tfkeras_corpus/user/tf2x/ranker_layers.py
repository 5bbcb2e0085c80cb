"""A ranker's layers, written the TF 2.x way (`tf.keras` under TF_USE_LEGACY_KERAS=1) and registered."""
import tensorflow as tf


@tf.keras.utils.register_keras_serializable(package="ranker")
class Scale(tf.keras.layers.Layer):
    """Per-feature learned scale."""

    def __init__(self, init=1.0, **kwargs):
        super().__init__(**kwargs)
        self.init = init

    def build(self, input_shape):
        self.scale = self.add_weight("scale", shape=(input_shape[-1],),
                                     initializer=tf.keras.initializers.Constant(self.init))

    def call(self, x):
        return x * self.scale

    def get_config(self):
        return {**super().get_config(), "init": self.init}


@tf.keras.utils.register_keras_serializable()
class Ranker(tf.keras.Model):
    """The same ranker as a subclassed model."""

    def __init__(self, units=8, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.hidden = tf.keras.layers.Dense(units, activation="relu")
        self.scale = Scale(0.5)
        self.head = tf.keras.layers.Dense(1)

    def call(self, x):
        return self.head(self.scale(self.hidden(x)))

    def get_config(self):
        return {"units": self.units}
