"""The ranker's architecture, for restoring its checkpoints (`--builder ranker_models:build_ranker`)."""
import tensorflow as tf

from ranker_layers import Scale

FEATURES = 6


def build_ranker(units=16):
    inputs = tf.keras.Input((FEATURES,), name="features")
    x = tf.keras.layers.Dense(units, activation="relu", name="hidden")(inputs)
    x = Scale(0.5, name="scale")(x)
    x = tf.keras.layers.Dense(1, name="logit")(x)
    score = tf.keras.layers.Activation("sigmoid", dtype="float32", name="score")(x)
    model = tf.keras.Model(inputs, score, name="ranker")
    model.compile(optimizer="adam", loss="binary_crossentropy")
    return model


def build_two_tower():
    """Two named inputs (a dict), concatenated."""
    user = tf.keras.Input((4,), name="user")
    item = tf.keras.Input((3,), name="item")
    joined = tf.keras.layers.Concatenate()([tf.keras.layers.Dense(8, activation="relu")(user),
                                            tf.keras.layers.Dense(8, activation="relu")(item)])
    return tf.keras.Model({"user": user, "item": item}, tf.keras.layers.Dense(1, name="match")(joined))
