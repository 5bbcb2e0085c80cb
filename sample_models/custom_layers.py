"""Custom Keras 3 layers used by the sample models.

- `ScaledDense` is registered (`exportkit_samples>ScaledDense`): Keras finds it once this module is imported.
- `FeatureCross` is deliberately *not* registered: loading a model that uses it needs it passed as a custom
  object (`--custom-objects sample_models.custom_layers`), which is what real projects often forget.

Both are deterministic at inference and mixed-precision safe: inputs are cast to `self.compute_dtype`,
variables are created in `self.variable_dtype` (float32 under mixed policies) and cast when used.
"""
from __future__ import annotations

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="exportkit_samples")
class ScaledDense(keras.layers.Layer):
    """Dense layer whose output is multiplied by a fixed `scale`; optional activation."""

    def __init__(self, units: int, scale: float = 1.0, activation=None, use_bias: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.units = int(units)
        self.scale = float(scale)
        self.activation = keras.activations.get(activation)
        self.use_bias = bool(use_bias)

    def build(self, input_shape):
        in_dim = int(input_shape[-1])
        self.kernel = self.add_weight(name="kernel", shape=(in_dim, self.units),
                                      initializer="glorot_uniform", trainable=True)
        self.bias = (self.add_weight(name="bias", shape=(self.units,), initializer="zeros", trainable=True)
                     if self.use_bias else None)

    def call(self, inputs):
        x = ops.cast(inputs, self.compute_dtype)
        y = ops.matmul(x, ops.cast(self.kernel, self.compute_dtype))
        if self.bias is not None:
            y = y + ops.cast(self.bias, self.compute_dtype)
        y = y * ops.cast(self.scale, self.compute_dtype)
        return self.activation(y)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.units,)

    def get_config(self):
        config = super().get_config()
        config.update({
            "units": self.units,
            "scale": self.scale,
            "activation": keras.activations.serialize(self.activation),
            "use_bias": self.use_bias,
        })
        return config


class FeatureCross(keras.layers.Layer):
    """DCN-style cross layer: x0 * (x0 @ W + b) + x0. Not registered on purpose."""

    def __init__(self, use_bias: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.use_bias = bool(use_bias)

    def build(self, input_shape):
        dim = int(input_shape[-1])
        self.kernel = self.add_weight(name="kernel", shape=(dim, dim), initializer="glorot_uniform")
        self.bias = self.add_weight(name="bias", shape=(dim,), initializer="zeros") if self.use_bias else None

    def call(self, inputs):
        x0 = ops.cast(inputs, self.compute_dtype)
        y = ops.matmul(x0, ops.cast(self.kernel, self.compute_dtype))
        if self.bias is not None:
            y = y + ops.cast(self.bias, self.compute_dtype)
        return x0 * y + x0

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config["use_bias"] = self.use_bias
        return config


# What `--custom-objects sample_models.custom_layers` should provide (and what tests pass to loaders).
CUSTOM_OBJECTS = {
    "ScaledDense": ScaledDense,
    "exportkit_samples>ScaledDense": ScaledDense,
    "FeatureCross": FeatureCross,
}


@keras.saving.register_keras_serializable(package="exportkit_samples")
class ResidualMLP(keras.Model):
    """A registered subclassed model: input projection, `blocks` residual Dense blocks, a float32 head."""

    def __init__(self, hidden: int = 16, blocks: int = 2, outputs: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.hidden = int(hidden)
        self.blocks = int(blocks)
        self.outputs_dim = int(outputs)
        self.proj = keras.layers.Dense(self.hidden, activation="relu", name="proj")
        self.block_layers = [ScaledDense(self.hidden, scale=0.5, activation="relu", name=f"block_{i}")
                             for i in range(self.blocks)]
        self.norm = keras.layers.LayerNormalization(name="norm")
        self.head = keras.layers.Dense(self.outputs_dim, dtype="float32", name="head")

    def call(self, inputs):
        x = self.proj(inputs)
        for block in self.block_layers:
            x = x + block(x)
        return self.head(self.norm(x))

    def get_config(self):
        config = super().get_config()
        config.update({"hidden": self.hidden, "blocks": self.blocks, "outputs": self.outputs_dim})
        return config


CUSTOM_OBJECTS["ResidualMLP"] = ResidualMLP
CUSTOM_OBJECTS["exportkit_samples>ResidualMLP"] = ResidualMLP
