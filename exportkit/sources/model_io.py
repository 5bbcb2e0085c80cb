"""The Keras model's inputs and outputs: specs named after its Inputs, keys for its outputs, and feeding it.

Shared by every place that runs a Keras model (export, the keras runtime, describe), so inputs are always fed
and outputs always keyed the same way. Never `keras_tensor_N`: input keys are the Input layers' names, output
keys the dict keys of dict outputs or the output layers' names. The batch dimension is always free (-1).
"""
from __future__ import annotations

import inspect as pyinspect
import re

from exportkit.inputs.spec import InputSpec
from exportkit.dtypes import INPUT_DTYPES, canonical, name_of
from exportkit.errors import UsageError
from exportkit.sources.kerases import keras_of


def parse_input_spec(text: str) -> InputSpec:
    """`name:shape:dtype`, e.g. `tokens:-1,16:int32` (`?` or -1 for a free dimension, `` for a scalar)."""
    parts = text.split(":")
    if len(parts) != 3 or not parts[0]:
        raise UsageError(f"--input-spec {text!r} is not name:shape:dtype", "write it as --input-spec tokens:-1,16:int32")
    name, shape_text, dtype = parts
    dtype = canonical(dtype)
    if dtype not in INPUT_DTYPES:
        raise UsageError(f"--input-spec {text!r}: unknown dtype {dtype!r}", f"use one of {', '.join(sorted(INPUT_DTYPES))}")
    try:
        shape = [-1 if d.strip() in ("?", "-1", "None") else int(d) for d in shape_text.split(",") if d.strip()]
    except ValueError:
        raise UsageError(f"--input-spec {text!r}: bad shape {shape_text!r}", "use comma-separated sizes, -1 for free")
    return InputSpec(key=name, dtype=dtype, shape=shape)


def is_functional(model) -> bool:
    return keras_of(model).input_structure(model) is not None


def model_input_specs(model, overrides: list[InputSpec]) -> list[InputSpec]:
    """Input specs from the model's Inputs (functional) or its build config (subclassed), then --input-spec."""
    keras = keras_of(model)
    by_key = {spec.key: spec for spec in overrides}
    if is_functional(model):
        specs = []
        for kt in keras.flatten(keras.input_structure(model)):
            shape = [-1] + [-1 if d is None else int(d) for d in kt.shape[1:]]
            specs.append(InputSpec(key=keras.input_name(kt), dtype=name_of(kt.dtype), shape=shape))
    else:
        specs = _subclassed_input_specs(model)
    known = {spec.key for spec in specs}
    unknown = sorted(set(by_key) - known)
    if unknown and specs:
        raise UsageError(f"--input-spec names {', '.join(unknown)}, but the model's inputs are {', '.join(sorted(known))}",
                         "use the model's input names")
    if not specs:
        if not overrides:
            raise UsageError("cannot tell the inputs of this subclassed model (it saved no build config)",
                             "pass --input-spec name:shape:dtype for each input, e.g. --input-spec x:-1,8:float32")
        return list(overrides)
    return [by_key.get(spec.key, spec) for spec in specs]


def _declared_input_specs(model) -> list[InputSpec]:
    """The inputs a subclassed model declares in an `input_signature` dict of TensorSpecs (Hugging Face's TF models
    do: input_ids, attention_mask, ... as int32), which its build config (float32 shapes) would not tell."""
    declared = getattr(model, "input_signature", None)
    if not isinstance(declared, dict) or not all(hasattr(s, "shape") and hasattr(s, "dtype") for s in declared.values()):
        return []
    return [InputSpec(key=key, dtype=name_of(spec.dtype),
                      shape=[-1] + [-1 if d is None else int(d) for d in list(spec.shape)[1:]])
            for key, spec in declared.items()]


def _subclassed_input_specs(model) -> list[InputSpec]:
    declared = _declared_input_specs(model)
    if declared:
        return declared
    config = model.get_build_config() or {}
    shape = config.get("input_shape")
    if shape is None:
        return []
    try:
        arg = next(iter(pyinspect.signature(model.call).parameters))
    except StopIteration:
        arg = "inputs"
    if isinstance(shape, dict):
        return [InputSpec(key=k, dtype="float32", shape=[-1] + [-1 if d is None else int(d) for d in s[1:]])
                for k, s in sorted(shape.items())]
    return [InputSpec(key=arg, dtype="float32", shape=[-1] + [-1 if d is None else int(d) for d in list(shape)[1:]])]


_AUTO_NAME = re.compile(r"^(keras_tensor|args)_\d+$")


def output_keys(model, outputs, names: list[str] | None = None) -> list[str]:
    """Output keys for the structure `outputs` that the model returned; `names` (--output-names) name the
    outputs of a model that returns a tensor, list or tuple, in order."""
    import keras

    if isinstance(outputs, dict):
        if names:
            raise UsageError(f"--output-names: the model returns a dict, whose keys already name its outputs "
                             f"({', '.join(sorted(outputs))})",
                             "drop --output-names (or output_names in exportkit.toml)")
        return list(_dict_entries(outputs))
    flat = keras.tree.flatten(outputs)
    if names:
        if len(names) != len(flat):
            raise UsageError(f"--output-names gives {len(names)} name(s) ({', '.join(names)}) but the model returns "
                             f"{len(flat)} output(s)", f"pass exactly {len(flat)} comma-separated names, in the order "
                                                       f"the model returns them")
        return list(names)
    names = list(getattr(model, "output_names", None) or []) if is_functional(model) else []
    if len(names) == len(flat) and len(set(names)) == len(names) and not any(_AUTO_NAME.match(n) for n in names):
        return names
    return ["output"] if len(flat) == 1 else [f"output_{i}" for i in range(len(flat))]


def feed_model(model, tensors: dict):
    """Call `model` on tensors keyed by input name, in the structure its call expects."""
    keras = keras_of(model)
    if is_functional(model):
        x = keras.map_structure(lambda kt: tensors[keras.input_name(kt)], keras.input_structure(model))
    else:
        x = next(iter(tensors.values())) if len(tensors) == 1 else tensors
    return model(x, training=False)


def _dict_entries(outputs: dict) -> dict:
    """{key: tensor} of a dict output by sorted key; a value that is itself a list, tuple or dict of tensors (a
    Hugging Face causal LM's `past_key_values`, one tensor per block) becomes `key_0`, `key_1`, ...: a signature
    output is one tensor."""
    import keras

    entries = {}
    for key in sorted(outputs):
        value = outputs[key]
        if isinstance(value, (list, tuple, dict)):
            entries.update({f"{key}_{i}": t for i, t in enumerate(keras.tree.flatten(value))})
        else:
            entries[key] = value
    return entries


def flat_outputs(outputs, keys: list[str]) -> list:
    import keras

    if isinstance(outputs, dict):
        entries = _dict_entries(outputs)
        return [entries[k] for k in keys]
    return keras.tree.flatten(outputs)


def keyed_outputs(model, raw, names: list[str] | None = None) -> dict:
    """{output key: tensor} for what `model` returned (`names`: see output_keys)."""
    keys = output_keys(model, raw, names)
    return dict(zip(keys, flat_outputs(raw, keys)))
