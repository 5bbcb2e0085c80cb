"""Serialized tf.Example -> a signature's input arrays, with TensorFlow's own parse op (verify --data's records, and
the keras runtime that parses them itself: runtimes.wrappers.ExampleParsing)."""
from __future__ import annotations

import math

import numpy as np

from exportkit.dtypes import is_string
from exportkit.errors import UsageError
from exportkit.inputs.load import cast_input
from exportkit.inputs.spec import InputSpec
from exportkit.tfexample.features import FEATURE_LISTS, storage_of


class ExampleParser:
    """Serialized tf.Example -> the signature's input arrays: the feature named like each input, with the
    input's dtype and its shape without the batch dimension (which must be known)."""

    def __init__(self, specs: list[InputSpec]):
        import tensorflow as tf

        self.specs, self._tf = specs, tf
        for s in specs:
            if not s.shape or any(d is None or d < 0 for d in s.shape[1:]):
                raise UsageError(f"input {s.key!r} has shape {s.shape}: tf.Example features need a batch dimension "
                                 "and known other dimensions",
                                 "pass .npz shards keyed by input name, or export with a fixed shape")
        # tf.io.parse_example's op, called directly with what it would build from FixedLenFeatures without defaults
        # (every record must hold every feature): a third faster than through tf.function, per batch.
        self._keys = [s.key for s in specs]
        self._kinds = [tf.constant([], tf.as_dtype(storage_of(s.dtype))) for s in specs]  # the dtype stored
        self._shapes = [list(s.shape[1:]) for s in specs]

    def _parse(self, records: list[bytes]) -> dict:
        dense = self._tf.raw_ops.ParseExampleV2(
            serialized=self._tf.constant(records), names=[], sparse_keys=[], dense_keys=self._keys, ragged_keys=[],
            dense_defaults=self._kinds, num_sparse=0, sparse_types=[], ragged_value_types=[], ragged_split_types=[],
            dense_shapes=self._shapes)[3]
        return dict(zip(self._keys, dense))

    def __call__(self, records: list[bytes], name_record) -> dict[str, np.ndarray]:
        """`name_record(row)` names the row-th record in error messages (e.g. FILE:INDEX)."""
        try:
            parsed = self._parse(records)
            return {s.key: cast_input(s.key, parsed[s.key].numpy(), s) for s in self.specs}
        except Exception:
            for row, record in enumerate(records):  # which record, and what is wrong with it
                problem = self.problem(record)
                if problem:
                    raise UsageError(f"record {name_record(row)}: {problem}",
                                     "every record needs a feature per input, of its type and size: "
                                     + ", ".join(f"{s.key} ({FEATURE_LISTS[storage_of(s.dtype)]}, "
                                                 f"{math.prod(s.shape[1:])} value(s))" for s in self.specs)) from None
            raise

    def problem(self, record: bytes) -> str | None:
        """What keeps this one record from being parsed into the inputs (None if it parses)."""
        from google.protobuf.message import DecodeError
        from tensorflow.core.example import example_pb2

        try:
            features = example_pb2.Example.FromString(record).features.feature
        except DecodeError:
            return "not a serialized tf.Example"
        for s in self.specs:
            want = FEATURE_LISTS[storage_of(s.dtype)]
            if s.key not in features:
                return f"feature {s.key!r} is missing"
            kind = features[s.key].WhichOneof("kind")
            if kind != want:
                return f"feature {s.key!r} holds {kind or 'no values'}, input {s.key!r} ({s.dtype}) needs {want}"
            count, need = len(getattr(features[s.key], kind).value), math.prod(s.shape[1:])
            if count != need:
                return f"feature {s.key!r} has {count} value(s), input {s.key!r} of shape {s.shape} needs {need}"
            values = np.asarray(getattr(features[s.key], kind).value)
            try:
                cast_input(s.key, values.reshape([1, *s.shape[1:]]) if not is_string(s.dtype) else
                           np.asarray(list(values), dtype=object).reshape([1, *s.shape[1:]]), s)
            except UsageError as err:
                return err.message
        return None
