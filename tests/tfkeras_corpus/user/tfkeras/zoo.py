"""Architectures for restoring checkpoints and weights files (`--builder zoo:residual`)."""
import tf_keras as keras

from blocks import Gate, ResidualBlock


def residual(width=8):
    inputs = keras.Input((width,), name="x")
    x = ResidualBlock(width, name="block1")(inputs)
    x = ResidualBlock(width, name="block2")(x)
    return keras.Model(inputs, keras.layers.Dense(2, name="y")(x), name="residual")


def gated(width=5):
    """Under a mixed policy the head stays float32."""
    inputs = keras.Input((width,), name="signal")
    x = Gate(name="gate")(keras.layers.Dense(width, activation="relu")(inputs))
    logits = keras.layers.Dense(3, name="logits")(x)
    return keras.Model(inputs, keras.layers.Activation("softmax", dtype="float32", name="probs")(logits))
