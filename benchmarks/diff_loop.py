"""The baseline for `exportkit diff --data`: what a user would write by hand. Reads the PredictionLog TFRecords
with tf.data, takes each ClassifyLog's tf.Examples out of the request, and calls both versions' classify signature
(tf.saved_model.load) on every batch; counts the records whose top-1 changed and keeps the largest score change.

    python benchmarks/diff_loop.py OLD_DIR NEW_DIR BATCH FILE...
"""
from __future__ import annotations

import sys


def main(argv) -> int:
    import numpy as np
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    old_dir, new_dir, batch, *files = argv
    old = tf.saved_model.load(old_dir).signatures["serving_default"]
    new = tf.saved_model.load(new_dir).signatures["serving_default"]

    def dataset(path):
        with open(path, "rb") as fh:
            gzipped = fh.read(2) == b"\x1f\x8b"
        return tf.data.TFRecordDataset(path, compression_type="GZIP" if gzipped else "")

    records = dataset(files[0])
    for path in files[1:]:
        records = records.concatenate(dataset(path))
    n = changed = 0
    largest = 0.0
    for chunk in records.batch(int(batch)).as_numpy_iterator():
        examples = []
        for raw in chunk:
            log = prediction_log_pb2.PredictionLog.FromString(raw)
            examples += [e.SerializeToString() for e in log.classify_log.request.input.example_list.examples]
        inputs = tf.constant(examples)
        a, b = old(inputs=inputs)["scores"].numpy(), new(inputs=inputs)["scores"].numpy()
        changed += int((a.argmax(axis=1) != b.argmax(axis=1)).sum())
        largest = max(largest, float(np.abs(a - b).max()))
        n += len(examples)
    print(n, changed, largest)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
