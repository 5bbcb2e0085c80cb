import sys, time, keras, numpy as np
keras.utils.set_random_seed(0)
rows, dim = int(sys.argv[2]), 128
ids = keras.Input((16,), dtype="int32", name="ids")
x = keras.layers.Embedding(rows, dim, name="embedding")(ids)
x = keras.layers.GlobalAveragePooling1D()(x)
x = keras.layers.Dense(64, activation="relu")(x)
out = keras.layers.Dense(1, name="score")(x)
model = keras.Model(ids, out)
t=time.time(); model.save(sys.argv[1]); print("saved", time.time()-t, model.count_params())
