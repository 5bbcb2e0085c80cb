"""The serving signatures: fixed input signatures named after the model's inputs, outputs keyed for serving.

An export has one or more signatures (exportkit.options.signatures.SignatureSpec), each resolved here against the model into a
SignaturePlan: which inputs it takes (the model's tensors, or serialized tf.Example parsed in the graph), which
outputs it returns under which keys, and its SignatureDef method (predict, classify, regress). One function
(`signature_outputs`) maps the model's outputs to a signature's outputs, both in the traced graph and eagerly for
the golden record, so the two cannot drift apart.

Half-precision outputs are cast to float32 unless kept; classify scores and regress outputs are always float32
(TF Serving's Classify and Regress read DT_FLOAT).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from exportkit.inputs.spec import InputSpec
from exportkit.dtypes import HALF_DTYPES
from exportkit.errors import UsageError
from exportkit.signature_constants import (CLASSIFY_CLASSES, CLASSIFY_INPUTS, CLASSIFY_METHOD, CLASSIFY_SCORES,
                                           DEFAULT_SIGNATURE, PREDICT_METHOD, REGRESS_INPUTS, REGRESS_METHOD,
                                           REGRESS_OUTPUTS)
from exportkit.sources.model_io import feed_model, flat_outputs
from exportkit.options.signatures import SignatureSpec
from exportkit.tfexample.features import ExampleFeature

METHOD_NAMES = {"predict": PREDICT_METHOD, "classify": CLASSIFY_METHOD, "regress": REGRESS_METHOD}
EXAMPLES_KEY = "examples"  # the input of a predict signature over tf.Example (TFX's serve_tf_examples_fn)


@dataclass
class SignaturePlan:
    """A signature resolved against the model."""

    name: str
    method: str  # predict | classify | regress
    input: str  # tensors | examples
    outputs: dict[str, str]  # signature output key -> model output key (classes: "")
    classes_file: Path | None = None
    classes: list[str] = field(default_factory=list)

    @property
    def method_name(self) -> str:
        return METHOD_NAMES[self.method]

    @property
    def examples_key(self) -> str | None:
        """The one string input of an Example signature (`inputs` for Classify/Regress, as TF Serving requires)."""
        if self.input != "examples":
            return None
        return EXAMPLES_KEY if self.method == "predict" else {"classify": CLASSIFY_INPUTS, "regress": REGRESS_INPUTS}[self.method]

    def input_keys(self, specs: list[InputSpec]) -> list[str]:
        return [self.examples_key] if self.examples_key else [s.key for s in specs]


def default_signatures(name: str = DEFAULT_SIGNATURE) -> list[SignatureSpec]:
    return [SignatureSpec(name=name)]


def _read_classes(path: str, signature: str) -> list[str]:
    """The labels exactly as the graph's table reads them (whole lines split at \\n), so they must be clean."""
    lines = Path(path).read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines or any(not line or line != line.strip() for line in lines):
        raise UsageError(f"signature '{signature}': classes file {path} has no labels, an empty line, or a label "
                         f"with surrounding spaces or a \\r", "write one class label per line, nothing else")
    return lines


def resolve(spec: SignatureSpec, keys: list[str], shapes: dict[str, tuple]) -> SignaturePlan:
    """Check `spec` against the model's output keys and (eager) output shapes; UsageError names the problem."""
    where = f"signature '{spec.name}'"

    def known(key: str, what: str) -> str:
        if key not in keys:
            raise UsageError(f"{where}: {what} '{key}' is not a model output (outputs: {', '.join(keys)})",
                             f"use one of the model's outputs: {', '.join(keys)}")
        return key

    if spec.method == "predict":
        chosen = [known(k, "output") for k in (spec.outputs or keys)]
        return SignaturePlan(spec.name, "predict", spec.input, {k: k for k in chosen})
    if spec.method == "regress":
        chosen = [known(k, "output") for k in (spec.outputs or keys)]
        if len(chosen) != 1:
            raise UsageError(f"{where}: a regress signature has one output, the model has {len(chosen)} "
                             f"({', '.join(chosen)})", f"pick one: --signature {spec.name}:...,outputs=OUTPUT")
        shape = shapes[chosen[0]]
        if len(shape) > 2 or (len(shape) == 2 and shape[1] != 1):
            raise UsageError(f"{where}: regress output '{chosen[0]}' has shape {list(shape)}; TF Serving's Regress "
                             f"returns one value per example", "pick an output of shape [batch] or [batch, 1]")
        return SignaturePlan(spec.name, "regress", spec.input, {REGRESS_OUTPUTS: chosen[0]})
    # classify
    if spec.scores is None and len(keys) != 1:
        raise UsageError(f"{where}: the model has {len(keys)} outputs ({', '.join(keys)}); which holds the scores?",
                         f"add scores=OUTPUT to signature '{spec.name}'")
    scores = known(spec.scores or keys[0], "scores output")
    shape = shapes[scores]
    if len(shape) != 2:
        raise UsageError(f"{where}: scores output '{scores}' has shape {list(shape)}; Classify wants [batch, classes]",
                         "pick an output of shape [batch, num_classes]")
    outputs = {CLASSIFY_SCORES: scores}
    plan = SignaturePlan(spec.name, "classify", spec.input, outputs)
    if spec.classes:
        plan.classes_file = Path(spec.classes).resolve()
        plan.classes = _read_classes(spec.classes, spec.name)
        if len(plan.classes) != shape[1]:
            raise UsageError(f"{where}: {spec.classes} has {len(plan.classes)} labels, scores '{scores}' has "
                             f"{shape[1]} classes", "give one label per class, in score order")
        outputs[CLASSIFY_CLASSES] = ""
    return plan


def resolve_all(specs: list[SignatureSpec], keys: list[str], shapes: dict[str, tuple]) -> list[SignaturePlan]:
    plans = [resolve(spec, keys, shapes) for spec in specs]
    files = {}
    for plan in plans:  # two label files with one name would overwrite each other in assets/
        if plan.classes_file is not None:
            other = files.setdefault(plan.classes_file.name, plan.classes_file)
            if other != plan.classes_file:
                raise UsageError(f"two classes files are both named {plan.classes_file.name}",
                                 "rename one: assets/ holds files by name")
    return plans


def signature_outputs(plan: SignaturePlan, keyed: dict, keep_output_dtype: bool, labels=None) -> dict:
    """The signature's outputs from the model's keyed outputs (graph or eager tensors). `labels`: a string
    tensor of the class labels, for classify signatures with classes."""
    import tensorflow as tf

    result = {}
    for key, source in plan.outputs.items():
        if plan.method != "predict" and key == CLASSIFY_CLASSES:
            rows = tf.shape(keyed[plan.outputs[CLASSIFY_SCORES]])[0]
            result[key] = tf.tile(tf.expand_dims(labels, 0), tf.stack([rows, 1]))
            continue
        tensor = keyed[source]
        if (plan.method != "predict" or not keep_output_dtype) and tensor.dtype.name in HALF_DTYPES:
            tensor = tf.cast(tensor, tf.float32)
        if plan.method != "predict" and tensor.dtype != tf.float32:
            tensor = tf.cast(tensor, tf.float32)
        result[key] = tensor
    return result


def serving_outputs(raw, keys: list[str], keep_output_dtype: bool) -> dict:
    """All the model's outputs keyed for a signature; float16/bfloat16 cast to float32 unless kept."""
    plan = SignaturePlan(DEFAULT_SIGNATURE, "predict", "tensors", {k: k for k in keys})
    return signature_outputs(plan, dict(zip(keys, flat_outputs(raw, keys))), keep_output_dtype)


def parse_examples(serialized, features: list[ExampleFeature]) -> dict:
    """Serialized tf.Example -> {model input key: tensor}: parsed, reshaped and cast to the input dtypes."""
    import tensorflow as tf

    spec = {}
    for f in features:
        default = None if f.default is None else f.default
        spec[f.feature] = tf.io.FixedLenFeature([f.length] if f.shape else [], tf.as_dtype(f.storage),
                                                default_value=default)
    parsed = tf.io.parse_example(serialized, spec)
    tensors = {}
    for f in features:
        value = parsed[f.feature]
        if len(f.shape) > 1:
            value = tf.reshape(value, [-1, *f.shape])
        if value.dtype != tf.as_dtype(f.dtype):
            value = tf.cast(value, tf.as_dtype(f.dtype))
        tensors[f.input] = value
    return tensors


def make_signature_fn(model, plan: SignaturePlan, specs: list[InputSpec], keys: list[str], keep_output_dtype: bool,
                      features: list[ExampleFeature] | None = None, labels=None):
    """(function, input_signature) for ExportArchive.add_endpoint. `labels`: a callable giving the class labels
    tensor inside the traced function (read from the asset), for classify signatures with classes."""
    import tensorflow as tf

    def outputs(tensors: dict) -> dict:
        raw = feed_model(model, tensors)
        keyed = dict(zip(keys, flat_outputs(raw, keys)))
        return signature_outputs(plan, keyed, keep_output_dtype, labels() if labels and plan.classes else None)

    if plan.input == "examples":
        def serve_examples(serialized):
            return outputs(parse_examples(serialized, features))

        return serve_examples, [tf.TensorSpec([None], tf.string, name=plan.examples_key)]

    def serve(*args):
        return outputs({spec.key: arg for spec, arg in zip(specs, args)})

    return serve, tensor_specs(specs)


def tensor_specs(specs: list[InputSpec]):
    import tensorflow as tf

    return [tf.TensorSpec([None if d == -1 else d for d in spec.shape], tf.as_dtype(spec.dtype), name=spec.key)
            for spec in specs]
