"""The baseline for `verify --data`: what a user would write by hand. Reads the same TFRecords with tf.data,
parses them with tf.io.parse_example, and calls the Keras model and the SavedModel's signature on every batch
(no comparison, nothing kept).

    python benchmarks/data_loop.py MODEL.keras SAVEDMODEL_DIR LIMIT BATCH FILE...
"""
from __future__ import annotations

import sys


def main(argv) -> int:
    import keras
    import tensorflow as tf

    keras_path, saved_dir, limit, batch, *files = argv
    model = keras.saving.load_model(keras_path)
    fn = tf.saved_model.load(saved_dir).signatures["serving_default"]
    specs = fn.structured_input_signature[1]
    features = {k: tf.io.FixedLenFeature(s.shape[1:], tf.float32 if s.dtype.is_floating else tf.int64)
                for k, s in specs.items()}

    def parse(records):
        parsed = tf.io.parse_example(records, features)
        return {k: tf.cast(v, specs[k].dtype) for k, v in parsed.items()}

    def dataset(path):
        with open(path, "rb") as fh:
            gzipped = fh.read(2) == b"\x1f\x8b"
        return tf.data.TFRecordDataset(path, compression_type="GZIP" if gzipped else "")

    records = dataset(files[0])
    for path in files[1:]:
        records = records.concatenate(dataset(path))
    n = 0
    for inputs in records.take(int(limit)).batch(int(batch)).map(parse):
        model(inputs, training=False)
        fn(**inputs)
        n += int(next(iter(inputs.values())).shape[0])
    print(n)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
