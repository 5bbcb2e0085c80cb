"""The inputs every runtime is fed, with no TensorFlow: a batch is `dict[input_key, np.ndarray]`.

spec (InputSpec) -> ranges (integer ranges, --int-range) -> generate (seeded batches) | load (--inputs files,
cast to the spec) | npz (the .npz batch format on disk) | tfrecord (TFRecord framing and its masked CRC-32C) ->
loader (a signature's batches)."""
