"""Verify on real data: record sources (TFRecord tf.Example, uncompressed or GZIP; .npz shards), streaming
statistics that merge (so a run over millions of records holds one batch at a time), and the same comparison as
an Apache Beam pipeline (`beam`, needs the `exportkit[beam]` extra)."""
