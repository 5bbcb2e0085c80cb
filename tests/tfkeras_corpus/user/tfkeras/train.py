"""Train and save every model the way a tf_keras user does: `import tf_keras as keras`, no TF_USE_LEGACY_KERAS."""
import sys

import numpy as np
import tensorflow as tf
import tensorflow_hub as hub
import tf_keras as keras
from exportkit import record_reference

import blocks
import zoo

out = sys.argv[1]
rng = np.random.default_rng(1)
x8 = rng.normal(size=(64, 8)).astype("float32")
x5 = rng.normal(size=(64, 5)).astype("float32")
labels = rng.integers(0, 3, 64)

model = zoo.residual()
model.compile(optimizer="adam", loss="mse")
model.fit(x8, x8[:, :2], epochs=1, batch_size=16, verbose=0)
model.save(f"{out}/residual.h5")
record_reference(model, f"{out}/residual.h5.reference.npz")  # the trained model's own outputs
model.save_weights(f"{out}/residual.weights.h5")

# A custom training loop, checkpointed with a CheckpointManager.
model = zoo.residual()
optimizer = keras.optimizers.Adam(1e-3)
manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model, optimizer=optimizer), f"{out}/residual_ckpt",
                                     max_to_keep=2)
for step in range(4):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x8[step * 16:(step + 1) * 16]) - 1.0))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    manager.save()

seq = keras.Sequential([keras.layers.Dense(5, activation="tanh", input_shape=(5,)), blocks.Gate(),
                        keras.layers.Dense(1)])
seq.compile(optimizer="adam", loss="mse")
seq.fit(x5, x5[:, :1], epochs=1, verbose=0)
seq.save(f"{out}/gated_sequential.keras")

towers = blocks.TowerModel(width=8, depth=2)
towers.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
towers.fit(x8, labels, epochs=1, verbose=0)
towers.save(f"{out}/towers_subclassed.keras")

keras.mixed_precision.set_global_policy("mixed_float16")
mixed = zoo.gated()
mixed.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
mixed.fit(x5, labels, epochs=1, batch_size=16, verbose=0)
mixed.save(f"{out}/gated_mixed.keras")
mixed.save_weights(f"{out}/gated_mixed.weights.h5")
keras.mixed_precision.set_global_policy("float32")

# A string input: TextVectorization adapted on the training text, saved as a Keras 2 SavedModel.
texts = np.array(["good movie", "bad movie", "great plot", "bad acting", "good acting", "dull plot"] * 4)
vectorize = keras.layers.TextVectorization(max_tokens=20, output_sequence_length=4)
vectorize.adapt(texts)
review = keras.Input((1,), dtype=tf.string, name="review")
pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(20, 4)(vectorize(review)))
sentiment = keras.Model(review, keras.layers.Dense(1, activation="sigmoid", name="positive")(pooled))
sentiment.compile(optimizer="adam", loss="binary_crossentropy")
sentiment.fit(texts[:, None], rng.integers(0, 2, len(texts)), epochs=1, verbose=0)
sentiment.save(f"{out}/sentiment_savedmodel")

# A hub module built here from a tf_keras model (tf.saved_model.save), reused through hub.KerasLayer.
encoder = keras.Sequential([keras.layers.Dense(6, activation="relu", input_shape=(8,))])
tf.saved_model.save(encoder, f"{out}/hub_encoder")
features = keras.Input((8,), name="features")
encoded = hub.KerasLayer(f"{out}/hub_encoder", name="encoder")(features)
with_hub = keras.Model(features, keras.layers.Dense(2, name="y")(encoded))
with_hub.compile(optimizer="adam", loss="mse")
with_hub.fit(x8, x8[:, :2], epochs=1, verbose=0)
with_hub.save(f"{out}/hub_regressor.keras")
