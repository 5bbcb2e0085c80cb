"""Custom-object contracts: a custom class must be rebuildable from its own get_config().

A .keras/.h5 file stores each custom object as its config; loading calls `cls.from_config(config)`. When
get_config() forgets a constructor argument, the reloaded model silently uses that argument's default and
the export computes something else than the trained model. The reloaded instance cannot tell (its attribute
*is* the default by then), so the check compares the config with the `__init__` signature, then rebuilds the
object from its config and runs both on the golden inputs.

Findings (errors, or warnings with --allow-incomplete-config): `custom-config-unserializable`,
`custom-config-incomplete`, `custom-config-roundtrip`; `custom-config-unchecked` (info) where a layer's input
cannot be captured.
"""
from __future__ import annotations

import copy
import inspect as pyinspect
import json
import types

import numpy as np

from exportkit.findings import Finding

# Arguments every Keras layer takes through **kwargs and serializes in its base config (or on purpose not).
_BASE_ARGS = {"name", "dtype", "trainable", "autocast", "activity_regularizer", "input_shape", "input_dim",
              "batch_size", "batch_input_shape", "inputs", "outputs"}
_FRAMEWORK_MODULES = ("keras", "tensorflow", "tf_keras", "builtins", "numpy")


def is_custom(obj) -> bool:
    """Defined outside Keras/TensorFlow: a user's layer, model, initializer, ... or function."""
    module = obj.__module__ if isinstance(obj, types.FunctionType) else type(obj).__module__
    return not (module or "").split(".")[0] in _FRAMEWORK_MODULES


def _plain(value):
    """(True, JSON-normalized value) for plain data (numbers, strings, lists, dicts of them), else (False, None)."""
    if isinstance(value, np.generic):
        value = value.item()
    try:
        return True, json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return False, None


def _where(obj) -> str:
    name = getattr(obj, "name", None) or getattr(obj, "__name__", "")
    return f"{type(obj).__name__} '{name}'" if name else type(obj).__name__


def custom_objects_of(model) -> list:
    """Custom layers and nested models (the model itself included), then the custom initializers, regularizers,
    constraints and functions (activations) they hold as attributes, each once."""
    found, seen = [], set()

    def add(obj):
        if id(obj) not in seen and is_custom(obj):
            seen.add(id(obj))
            found.append(obj)

    layers = list(model._flatten_layers(include_self=True, recursive=True))
    for layer in layers:
        add(layer)
    for layer in layers:
        for value in vars(layer).values():
            for item in (value if isinstance(value, (list, tuple)) else [value]):
                if isinstance(item, types.FunctionType):
                    if item.__name__ in {n.split(">")[-1] for n in _serialized_function_names(layer)}:
                        add(item)
                elif hasattr(item, "get_config") and hasattr(type(item), "from_config") and not _is_layer(item):
                    add(item)
    return found


def _serialized_function_names(layer) -> set[str]:
    """Names of the functions the layer's config stores by name (activations and the like)."""
    import keras

    names: set[str] = set()

    def walk(node):
        if isinstance(node, dict):
            if node.get("class_name") == "function" and isinstance(node.get("config"), str):
                names.add(node["config"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    try:
        walk(json.loads(json.dumps(keras.saving.serialize_keras_object(layer.get_config()))))
    except Exception:  # an unserializable config is reported by the layer's own check
        pass
    return names


def _is_layer(obj) -> bool:
    import keras

    return isinstance(obj, keras.layers.Layer)


def check_contracts(model, batches: list[dict], custom_objects: dict, allow_incomplete: bool = False,
                    compare=None) -> list[Finding]:
    """Findings for every custom object of `model`; `batches` are golden inputs keyed by input name.

    `compare(expected_batches, actual_batches) -> [OutputComparison]` judges the rebuilt layers' outputs (the
    caller passes exportkit.verify.compare.compare_with_default_tolerances); without it only configs and weight
    shapes are checked.
    """
    severity = "warning" if allow_incomplete else "error"
    findings: list[Finding] = []
    for obj in custom_objects_of(model):
        if isinstance(obj, types.FunctionType):
            findings += _check_function(obj, custom_objects, severity)
        else:
            findings += _check_object(obj, model, batches, custom_objects, severity, compare)
    return findings


def _check_function(fn, custom_objects: dict, severity: str) -> list[Finding]:
    import keras

    try:
        with keras.saving.custom_object_scope(custom_objects):
            back = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(fn))
    except Exception:  # Keras raises TypeError/ValueError for unknown names
        back = None
    if back is fn or (getattr(back, "__module__", None), getattr(back, "__qualname__", None)) == (
            fn.__module__, fn.__qualname__):
        return []
    return [Finding(severity, "custom-config-roundtrip",
                    f"function {fn.__module__}.{fn.__qualname__} is saved by name but does not deserialize back "
                    f"(a reloaded model cannot find it); fix: decorate it with "
                    f"@keras.saving.register_keras_serializable() or pass --custom-objects {fn.__module__}")]


def _check_object(obj, model, batches, custom_objects, severity, compare) -> list[Finding]:
    import keras

    where = _where(obj)
    try:
        config = obj.get_config()
        serialized = json.loads(json.dumps(keras.saving.serialize_keras_object(config)))
    except Exception as err:  # NotImplementedError (Keras' auto-config), TypeError (json), ...
        detail = " ".join(str(err).split())[:200]
        return [Finding(severity, "custom-config-unserializable",
                        f"{where}: get_config() is not JSON-serializable ({type(err).__name__}: {detail}), so the "
                        f"model cannot be saved and rebuilt; fix: return only plain values (numbers, strings, lists, "
                        f"serialized Keras objects) from get_config()")]
    findings = _check_coverage(obj, config, where, severity)
    findings += _check_roundtrip(obj, config, serialized, model, batches, custom_objects, where, severity, compare)
    return findings


def _check_coverage(obj, config: dict, where: str, severity: str) -> list[Finding]:
    """Every __init__ argument is in the config; where the instance keeps it under the same name, with its value."""
    findings = []
    try:
        params = pyinspect.signature(type(obj).__init__).parameters
    except (TypeError, ValueError):
        return []
    attrs = vars(obj)
    for name, param in list(params.items())[1:]:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if name not in config:
            if name in _BASE_ARGS:
                continue
            if param.default is param.empty:
                uses = "nothing: from_config() fails without it"
            else:
                uses = f"{name}={param.default!r} (the default)"
            ok, value = _plain(attrs.get(name))
            trained = (f", although this instance has {name}={value!r}"
                       if name in attrs and ok and value != _plain(param.default)[1] else "")
            findings.append(Finding(severity, "custom-config-incomplete",
                                    f"{where}: get_config() does not return __init__ argument '{name}'; a model "
                                    f"rebuilt from the config (a reloaded .keras/.h5) uses {uses}{trained}; fix: add "
                                    f"'{name}' to get_config() (or --allow-incomplete-config if it is derived)"))
            continue
        if name in attrs:
            ok_attr, attr_value = _plain(attrs[name])
            ok_cfg, cfg_value = _plain(config[name])
            if ok_attr and ok_cfg and attr_value != cfg_value:
                findings.append(Finding(severity, "custom-config-incomplete",
                                        f"{where}: get_config() returns {name}={cfg_value!r}, but the instance has "
                                        f"{name}={attr_value!r}; a model rebuilt from the config uses {cfg_value!r}; "
                                        f"fix: return self.{name} from get_config() (or --allow-incomplete-config "
                                        f"if the attribute is derived from the argument)"))
    return findings


def _without_names(config):
    if isinstance(config, dict):
        return {k: _without_names(v) for k, v in config.items() if k != "name"}
    if isinstance(config, list):
        return [_without_names(v) for v in config]
    return config


def _check_roundtrip(obj, config, serialized, model, batches, custom_objects, where, severity,
                     compare) -> list[Finding]:
    import keras

    def finding(what: str) -> list[Finding]:
        return [Finding(severity, "custom-config-roundtrip",
                        f"{where}: {type(obj).__name__}.from_config(get_config()) {what}; fix: make get_config() "
                        f"return every constructor argument and from_config() rebuild the same object")]

    try:
        with keras.saving.custom_object_scope(custom_objects):
            clone = type(obj).from_config(copy.deepcopy(config))
        clone_config = json.loads(json.dumps(keras.saving.serialize_keras_object(clone.get_config())))
    except Exception as err:
        return finding(f"fails ({type(err).__name__}: {' '.join(str(err).split())[:200]})")
    if _without_names(clone_config) != _without_names(serialized):
        changed = sorted(k for k in set(serialized) | set(clone_config)
                         if k != "name" and serialized.get(k) != clone_config.get(k))
        return finding(f"gives an object with another config (differs in: {', '.join(changed)})")
    if not _is_layer(obj) or not obj.weights and not batches:
        return []
    inputs = _layer_inputs(obj, model, batches) if batches else None
    if inputs is None:
        built = not obj.weights or _build_like(clone, obj)
        if built and [tuple(w.shape) for w in obj.weights] != [tuple(w.shape) for w in clone.weights]:
            return finding("builds weights of other shapes")
        return [Finding("info", "custom-config-unchecked",
                        f"{where}: the rebuilt {'layer' if built else 'layer (no build config)'} was not run: its "
                        f"inputs cannot be captured from the model's inputs; its config was checked")]
    try:
        if obj.weights:
            _build_like(clone, obj) or _call(clone, inputs[0])
        shapes = [tuple(w.shape) for w in obj.weights], [tuple(w.shape) for w in clone.weights]
        if shapes[0] != shapes[1]:
            return finding(f"builds weights of other shapes ({shapes[1]} instead of {shapes[0]})")
        if compare is None:
            return []
        clone.set_weights(obj.get_weights())
        pairs = [(_call(obj, x), _call(clone, x)) for x in inputs]
    except Exception as err:
        return finding(f"gives a layer that fails on the golden inputs ({type(err).__name__}: "
                       f"{' '.join(str(err).split())[:200]})")
    return _compare_outputs(pairs, finding, compare)


def _build_like(clone, obj) -> bool:
    build_config = obj.get_build_config() if hasattr(obj, "get_build_config") else None
    if clone.built or not build_config:
        return clone.built
    clone.build_from_config(build_config)
    return clone.built


def _call(layer, x):
    import keras

    from exportkit.sources.model_io import feed_model, is_functional

    if isinstance(layer, keras.Model) and isinstance(x, dict) and not is_functional(layer):
        return feed_model(layer, x)
    return layer(x, training=False)


def _layer_inputs(layer, model, batches) -> list | None:
    """What `layer` receives when the model runs on each golden batch, or None where that cannot be captured."""
    import keras
    import tensorflow as tf

    from exportkit.sources.model_io import feed_model, is_functional

    tensors = [{k: tf.constant(v) for k, v in batch.items()} for batch in batches]
    if layer is model:
        return tensors
    if not is_functional(model):
        return None
    try:
        probe = keras.Model(model.inputs, layer.input)
        return [feed_model(probe, t) for t in tensors]
    except Exception:  # shared layers (several inbound nodes), layers inside nested models or custom layers
        return None


def _compare_outputs(pairs, finding, compare) -> list[Finding]:
    import keras

    def as_dict(outputs):
        return {f"output_{i}": np.asarray(t) for i, t in enumerate(keras.tree.flatten(outputs))}

    results = compare([as_dict(a) for a, _ in pairs], [as_dict(b) for _, b in pairs])
    failed = [r for r in results if not r.passed]
    if not failed:
        return []
    worst = max((r.max_abs_err or 0.0) for r in failed)
    return finding(f"with the same weights gives other outputs on the golden inputs ({failed[0].reason}; max abs "
                   f"err {worst:.3g}): the rebuilt object is configured differently")
