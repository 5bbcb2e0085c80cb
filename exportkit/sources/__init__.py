"""SRC -> Keras model: the formats (load, h5compat), one adapter per Keras (kerases), the model's inputs and
outputs (model_io), integer ranges, custom-object contracts, and the training-time reference."""
