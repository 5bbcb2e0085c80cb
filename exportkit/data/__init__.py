"""Verify and diff on real data: record sources (TFRecord tf.Example, uncompressed or GZIP; PredictionLogs; .npz
shards) read a batch at a time, PredictionLog replay (predictionlog), the streamed changes between two versions
(changes), and the same comparison as an Apache Beam pipeline (`beam`, needs the `exportkit[beam]` extra). The
statistics that merge live in compare/stats.py, so a run over millions of records holds one batch at a time."""
