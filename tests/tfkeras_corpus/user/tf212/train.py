"""Written by TF 2.12's own tf.keras (Keras 2.12): `python train.py OUT` in a TF 2.12 environment."""
import sys

import numpy as np
import tensorflow as tf

from norm_layers import RMSNorm

out = sys.argv[1]
rng = np.random.default_rng(2)
x = rng.normal(size=(64, 6)).astype("float32")
inputs = tf.keras.Input((6,), name="features")
hidden = RMSNorm(name="norm")(tf.keras.layers.Dense(8, activation="relu")(inputs))
model = tf.keras.Model(inputs, tf.keras.layers.Dense(1, name="score")(hidden))
model.compile(optimizer="adam", loss="mse")
model.fit(x, x[:, :1], epochs=1, batch_size=16, verbose=0)
model.save(f"{out}/norm_212.h5")
model.save(f"{out}/norm_212.keras")  # HDF5 content: Keras 2.12 writes its zip format only with save_format="keras_v3"
model.save(f"{out}/norm_212_savedmodel")
