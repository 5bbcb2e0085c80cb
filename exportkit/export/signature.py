"""The serving signature: a fixed input_signature named after the model's inputs, outputs keyed for serving.

Half-precision outputs are cast to float32 unless kept; the model's inputs and output keys come from
`exportkit.sources.model_io`.
"""
from __future__ import annotations

from exportkit.batches import InputSpec
from exportkit.dtypes import HALF_DTYPES
from exportkit.sources.model_io import feed_model, flat_outputs


def serving_outputs(raw, keys: list[str], keep_output_dtype: bool) -> dict:
    """The model's outputs keyed for the signature; float16/bfloat16 cast to float32 unless kept."""
    import tensorflow as tf

    result = {}
    for key, tensor in zip(keys, flat_outputs(raw, keys)):
        if not keep_output_dtype and tensor.dtype.name in HALF_DTYPES:
            tensor = tf.cast(tensor, tf.float32)
        result[key] = tensor
    return result


def make_serving_fn(model, specs: list[InputSpec], keys: list[str], keep_output_dtype: bool):
    """A function of positional tensors (in `specs` order) returning {output key: tensor}."""

    def serve(*args):
        raw = feed_model(model, {spec.key: arg for spec, arg in zip(specs, args)})
        return serving_outputs(raw, keys, keep_output_dtype)

    return serve


def tensor_specs(specs: list[InputSpec]):
    import tensorflow as tf

    return [tf.TensorSpec([None if d == -1 else d for d in spec.shape], tf.as_dtype(spec.dtype), name=spec.key)
            for spec in specs]
