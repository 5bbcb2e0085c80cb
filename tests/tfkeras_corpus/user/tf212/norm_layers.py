"""A layer written for TF 2.12's tf.keras (Keras 2.12), registered in package "legacy"."""
import tensorflow as tf


@tf.keras.utils.register_keras_serializable(package="legacy")
class RMSNorm(tf.keras.layers.Layer):
    def __init__(self, epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = epsilon

    def build(self, input_shape):
        self.gamma = self.add_weight("gamma", shape=(input_shape[-1],), initializer="ones")

    def call(self, x):
        return x * tf.math.rsqrt(tf.reduce_mean(tf.square(x), axis=-1, keepdims=True) + self.epsilon) * self.gamma

    def get_config(self):
        return {**super().get_config(), "epsilon": self.epsilon}
