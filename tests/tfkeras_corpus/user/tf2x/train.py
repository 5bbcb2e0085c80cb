"""Train and save every model, the way a TF 2.x-era team does: `python train.py OUT` with TF_USE_LEGACY_KERAS=1."""
import os
import sys

import numpy as np
import tensorflow as tf
import tensorflow_hub as hub
from exportkit import record_reference

import custom_fns
import ranker_layers
import ranker_models

assert tf.keras.__name__.startswith("tf_keras"), "run with TF_USE_LEGACY_KERAS=1"
out = sys.argv[1]
rng = np.random.default_rng(0)
x = rng.normal(size=(64, ranker_models.FEATURES)).astype("float32")
y = (x[:, :1] > 0).astype("float32")

# The model: functional, registered custom layer, mixed_float16 with a float32 head, one epoch.
tf.keras.mixed_precision.set_global_policy("mixed_float16")
mixed = ranker_models.build_ranker()
mixed.fit(x, y, epochs=1, batch_size=16, verbose=0)
mixed.save(f"{out}/ranker_mixed.h5")
mixed.save(f"{out}/ranker_mixed.keras")
record_reference(mixed, f"{out}/ranker_mixed.keras.reference.npz")  # the trained model's own outputs
tf.train.Checkpoint(model=mixed, optimizer=mixed.optimizer).save(f"{out}/ranker_mixed_ckpt/ckpt")
tf.keras.mixed_precision.set_global_policy("float32")

ranker = ranker_models.build_ranker()
ranker.fit(x, y, epochs=1, batch_size=16, verbose=0)
ranker.save_weights(f"{out}/ranker_weights/ranker")  # TF checkpoint format (no .h5 suffix)
ranker.save_weights(f"{out}/ranker.weights.h5")
ranker.save(f"{out}/ranker_savedmodel")  # a Keras 2 SavedModel (keras_metadata.pb)

sub = ranker_layers.Ranker(units=8)
sub.compile(optimizer="adam", loss="mse")
sub.fit(x, y, epochs=1, batch_size=16, verbose=0)
sub.save(f"{out}/ranker_subclassed.keras")

seq = tf.keras.Sequential([tf.keras.Input((4,), name="x"),
                           tf.keras.layers.Dense(8, activation=custom_fns.swish_beta),
                           custom_fns.Clip(-2.0, 2.0),
                           tf.keras.layers.Dense(1)])
seq.compile(optimizer="sgd", loss=custom_fns.tight_huber)
seq.fit(x[:, :4], y, epochs=1, batch_size=16, verbose=0)
seq.save(f"{out}/swish_sequential.keras")  # (an .h5 of it does not load back in tf_keras itself: the
# activation is written as module "builtins")

towers = ranker_models.build_two_tower()
towers.compile(optimizer="adam", loss="mse")
towers.fit({"user": x[:, :4], "item": x[:, 3:]}, y, epochs=1, batch_size=16, verbose=0)
towers.save(f"{out}/two_tower.keras")

words = np.array(["red", "green", "blue", "cyan"])
colour = tf.keras.Input((1,), dtype=tf.string, name="colour")
ids = tf.keras.layers.StringLookup(vocabulary=list(words), output_mode="one_hot")(colour)
lookup = tf.keras.Model(colour, tf.keras.layers.Dense(2, name="logits")(ids))
lookup.compile(optimizer="adam", loss="mse")
lookup.fit(words[rng.integers(0, 4, 64)][:, None], rng.normal(size=(64, 2)), epochs=1, verbose=0)
lookup.save(f"{out}/colour_lookup.keras")


# A TF2 hub module built here (no download): a tf.Module with a traced __call__, saved with tf.saved_model.save.
class Embed(tf.Module):
    def __init__(self):
        super().__init__()
        self.w = tf.Variable(rng.normal(size=(4, 5)).astype("float32"), name="w")

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
    def __call__(self, x):
        return tf.nn.tanh(tf.matmul(x, self.w))


tf.saved_model.save(Embed(), f"{out}/hub_embed")
features = tf.keras.Input((4,), name="features")
embedded = hub.KerasLayer(f"{out}/hub_embed", trainable=False, name="embed")(features)
with_hub = tf.keras.Model(features, tf.keras.layers.Dense(1, name="head")(embedded))
with_hub.compile(optimizer="adam", loss="mse")
with_hub.fit(x[:, :4], y, epochs=1, verbose=0)
with_hub.save(f"{out}/hub_classifier.h5")
