"""The baseline for `exportkit diff --data`: what a user would write by hand. tf.data reads the GZIP PredictionLog
TFRecords, Python takes each logged Predict request's serialized tf.Examples out of the log, and both versions'
predict signature (tf.saved_model.load) answer batches of them; counts the records and those whose top-1 changed.

    python benchmarks/diff_loop.py OLD_DIR NEW_DIR BATCH FILE...
"""
from __future__ import annotations

import sys


def main(argv) -> int:
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    old_dir, new_dir, batch, *files = argv
    old = tf.saved_model.load(old_dir).signatures["serving_default"]
    new = tf.saved_model.load(new_dir).signatures["serving_default"]
    parse = prediction_log_pb2.PredictionLog.FromString
    n = changed = 0
    for chunk in tf.data.TFRecordDataset(files, compression_type="GZIP").batch(int(batch)).as_numpy_iterator():
        examples = []
        for raw in chunk:
            examples += parse(raw).predict_log.request.inputs["examples"].string_val
        inputs = tf.constant(examples)
        a, b = old(examples=inputs)["scores"].numpy(), new(examples=inputs)["scores"].numpy()
        changed += int((a.argmax(axis=1) != b.argmax(axis=1)).sum())
        n += len(examples)
    print(n, changed)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
