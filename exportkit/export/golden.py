"""The golden record: reference inputs and what eager Keras computes for them, for the model and for each signature,
with the tolerances its outputs are held to. Export writes it into the version (assets.extra/) and its self-check,
verify and compat compare every runtime with it."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from exportkit.compare.tolerances import default_tolerance
from exportkit.dtypes import HALF_DTYPES, name_of, name_of_array
from exportkit.export import signature as sig
from exportkit.inputs.generate import generate_batches
from exportkit.inputs.ranges import IntRanges
from exportkit.inputs.spec import InputSpec
from exportkit.options.export import ExportOptions
from exportkit.sources.int_ranges import generated_inputs_failure
from exportkit.sources.model_io import feed_model, keyed_outputs
from exportkit.tfexample.features import ExampleFeature, apply_feature_spec, derive_features, encode_examples

GOLDEN_SAMPLES = 8
GOLDEN_SEED = 0


def tolerance_dtype(policy: str, raw_dtype: str) -> str:
    """Outputs computed in half precision are compared with half-precision tolerances, even when cast."""
    if raw_dtype in HALF_DTYPES:
        return raw_dtype
    if policy.startswith("mixed_") and raw_dtype.startswith("float"):
        return policy.removeprefix("mixed_")
    return raw_dtype


@dataclass
class SignatureRecord:
    """One signature's golden record: its inputs (tensors, or serialized Examples of the same values) and the
    eager Keras outputs mapped to its keys."""

    plan: sig.SignaturePlan
    specs: list[InputSpec]  # the model's inputs, as the tensor signatures declare them
    inputs: list[dict]
    outputs: list[dict]
    out_dtypes: dict[str, str]  # output key -> dtype in the signature
    compute_dtypes: dict[str, str]  # output key -> dtype the model computed it in
    features: list[ExampleFeature] | None = None

    @property
    def input_specs(self) -> dict:
        """The inputs as the written signature declares them (-1 for every free dimension)."""
        if self.plan.input == "examples":
            return {self.plan.examples_key: {"dtype": "string", "shape": [-1]}}
        return {s.key: {"dtype": s.dtype, "shape": None if s.shape is None else list(s.shape)} for s in self.specs}


@dataclass
class GoldenRecord:
    """Reference inputs and the eager Keras outputs for them, keyed like the model (all outputs, as the first
    signature without --signature has them); `signatures` holds each signature's own record."""

    specs: list[InputSpec]
    int_ranges: IntRanges  # what the generated integer inputs were drawn from
    keys: list[str]
    inputs: list[dict]
    outputs: list[dict]
    raw_dtypes: dict[str, str]  # output key -> dtype the model computed it in
    out_dtypes: dict[str, str]  # output key -> dtype in the signature
    generated: int = 0  # the first `generated` batches are generated; the rest are the reference's inputs
    reference_batches: list[int] = field(default_factory=list)  # golden batch of each reference batch
    signatures: list[SignatureRecord] = field(default_factory=list)


def golden_record(model, specs: list[InputSpec], options: ExportOptions, int_ranges: IntRanges,
                  extra_inputs: list[dict] = ()) -> GoldenRecord:
    """Generated inputs (and the training-time reference's, once each) through the eager model: what every later
    check of the SavedModel must reproduce."""
    import tensorflow as tf

    inputs = generate_batches(specs, samples=GOLDEN_SAMPLES, seed=GOLDEN_SEED, int_range=int_ranges)
    generated = len(inputs)
    reference_batches = []
    for batch in extra_inputs:  # a reference generated like the golden record has the very same inputs
        same = [i for i, b in enumerate(inputs) if b.keys() == batch.keys()
                and all(b[k].shape == batch[k].shape and np.array_equal(b[k], batch[k]) for k in b)]
        if not same:
            inputs.append(batch)
        reference_batches.append(same[0] if same else len(inputs) - 1)
    try:
        raws = [feed_model(model, {s.key: tf.constant(b[s.key]) for s in specs}) for b in inputs]
    except (tf.errors.OpError, ValueError, TypeError) as err:
        raise generated_inputs_failure(err, specs, int_ranges) from err
    keyed = [keyed_outputs(model, raw, options.output_names) for raw in raws]
    keys = list(keyed[0])
    raw_dtypes = {k: name_of(v.dtype) for k, v in keyed[0].items()}
    outputs = [{k: v.numpy() for k, v in sig.serving_outputs(raw, keys, options.keep_output_dtype).items()}
               for raw in raws]
    out_dtypes = {k: name_of(v.dtype) for k, v in outputs[0].items()}
    golden = GoldenRecord(specs, int_ranges, keys, inputs, outputs, raw_dtypes, out_dtypes, generated,
                          reference_batches)
    golden.signatures = _signature_records(specs, keyed, inputs, raw_dtypes, options)
    return golden


def _signature_records(specs, keyed: list[dict], inputs: list[dict], raw_dtypes: dict,
                       options: ExportOptions) -> list[SignatureRecord]:
    """Each signature's golden record: its inputs (the golden tensors, or Examples of them) and the eager outputs
    mapped to its keys by the very function the traced signature uses."""
    import tensorflow as tf

    shapes = {k: tuple(v.shape) for k, v in keyed[0].items()}
    plans = sig.resolve_all(options.signatures or sig.default_signatures(options.signature_name), list(keyed[0]),
                            shapes)
    features = None
    if any(plan.input == "examples" for plan in plans):
        features = derive_features(specs, next(p.name for p in plans if p.input == "examples"))
        if options.feature_spec:
            features = apply_feature_spec(features, options.feature_spec)
    records = []
    for plan in plans:
        labels = tf.constant(plan.classes) if plan.classes else None
        outputs = [{k: v.numpy() for k, v in sig.signature_outputs(plan, kv, options.keep_output_dtype, labels).items()}
                   for kv in keyed]
        if plan.input == "examples":
            sig_inputs = [{plan.examples_key: encode_examples(batch, features)} for batch in inputs]
        else:
            sig_inputs = inputs
        compute = {k: (raw_dtypes[src] if src else "string") for k, src in plan.outputs.items()}
        records.append(SignatureRecord(plan, specs, sig_inputs, outputs, {k: name_of_array(v) for k, v in outputs[0].items()},
                                       compute, features if plan.input == "examples" else None))
    return records


def tolerances_for(policy: str, compute_dtypes: dict[str, str], keys) -> dict[str, dict]:
    """{output key: {"atol", "rtol"}}: the default tolerance of the dtype each output was computed in."""
    return {k: vars(default_tolerance(tolerance_dtype(policy, compute_dtypes[k]))) for k in keys}
