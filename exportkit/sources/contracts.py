"""Custom-object contracts: a custom class must be rebuildable from its own get_config().

A .keras/.h5 file stores each custom object as its config; loading calls `cls.from_config(config)`. When
get_config() forgets a constructor argument, the reloaded model silently uses that argument's default and
the export computes something else than the trained model. The reloaded instance cannot tell (its attribute
*is* the default by then), so the check compares the config with the `__init__` signature and with the
arguments the constructor received, then rebuilds the object from its config and replays both with the very
arguments the model's call gave the original (positional and keyword tensors, masks, `training`), recorded by
running the model once on the golden inputs.

Only objects a reloaded model rebuilds from a stored config are checked: the model itself and what its saved
config names (the layers of a functional graph, objects a layer serializes). Layers a custom layer creates in
its own code are rebuilt by that code, so their parent's replay covers them (keras-hub's backbones store only
their constructor arguments and build every layer themselves).

Findings (errors, or warnings with --allow-incomplete-config): `custom-config-unserializable`,
`custom-config-incomplete`, `custom-config-roundtrip`; `custom-config-unchecked` (info) where the check cannot
decide (a layer the model never called, or one whose replay fails on the original too).
"""
from __future__ import annotations

import contextlib
import copy
import inspect as pyinspect
import json
import types

import numpy as np

from exportkit.findings import Finding
from exportkit.sources.kerases import keras_of

# Arguments every Keras layer takes through **kwargs and serializes in its base config (or on purpose not).
_BASE_ARGS = {"name", "dtype", "trainable", "autocast", "activity_regularizer", "input_shape", "input_dim",
              "batch_size", "batch_input_shape", "inputs", "outputs"}
_FRAMEWORK_MODULES = ("keras", "tensorflow", "tf_keras", "builtins", "numpy")
_CALLS_PER_LAYER = 4  # recorded calls replayed per layer (a shared layer or a loop calls it more often)


def _is_framework(module: str | None) -> bool:
    return (module or "").split(".")[0] in _FRAMEWORK_MODULES


def is_custom(obj) -> bool:
    """Defined outside Keras/TensorFlow: a user's layer, model, initializer, ... or function."""
    return not _is_framework(obj.__module__ if isinstance(obj, types.FunctionType) else type(obj).__module__)


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


def _class_key(obj) -> str:
    return keras_of(obj).registered_name(type(obj))


def _serialized_objects(obj, keras) -> list[dict] | None:
    """Every `{"class_name": ..., "config": ...}` node of `obj` serialized as a .keras file stores it (JSON), or
    None when it cannot be serialized. `keras`: the adapter of the model `obj` belongs to."""
    nodes: list[dict] = []

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("class_name"), str) and "config" in node:
                nodes.append(node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    try:
        walk(json.loads(json.dumps(keras.serialize(obj))))
    except Exception:  # a get_config() somewhere returns what JSON cannot hold
        return None
    return nodes


def _stored_objects(model) -> set[tuple[str, str | None]] | None:
    """(registered class name, object name) of every object the model's saved config stores, or None when the
    config cannot be serialized (then every custom object counts; the unserializable one is reported)."""
    nodes = _serialized_objects(model, keras_of(model))
    if nodes is None:
        return None
    stored = set()
    for node in nodes:
        name = node["config"].get("name") if isinstance(node["config"], dict) else None
        stored.add((node.get("registered_name") or node["class_name"], name if isinstance(name, str) else None))
    return stored


def custom_objects_of(model) -> list:
    """The custom objects a reloaded model rebuilds from a stored config, each once: the model itself (when its
    class is custom), the custom layers and nested models its config stores, then the custom initializers,
    regularizers, constraints and functions (activations) those layers serialize."""
    found, seen = [], set()
    stored = _stored_objects(model)
    stored_classes = {key for key, _ in stored} if stored is not None else None

    def add(obj):
        if id(obj) not in seen and is_custom(obj):
            seen.add(id(obj))
            found.append(obj)

    layers = [layer for layer in keras_of(model).layers_of(model, include_self=True)
              if layer is model or stored is None or (_class_key(layer), layer.name) in stored]
    for layer in layers:
        add(layer)
    for layer in layers:
        for value in vars(layer).values():
            for item in (value if isinstance(value, (list, tuple)) else [value]):
                if isinstance(item, types.FunctionType):
                    if item.__name__ in {n.split(">")[-1] for n in _serialized_function_names(layer)}:
                        add(item)
                elif (hasattr(item, "get_config") and hasattr(type(item), "from_config") and not is_layer(item)
                      and (stored_classes is None or _class_key(item) in stored_classes)):
                    add(item)
    return found


def _serialized_function_names(layer) -> set[str]:
    """Names of the functions the layer's config stores by name (activations and the like)."""
    try:
        config = layer.get_config()
    except Exception:  # an unserializable config is reported by the layer's own check
        return set()
    return {node["config"] for node in _serialized_objects(config, keras_of(layer)) or []
            if node["class_name"] == "function" and isinstance(node["config"], str)}


def is_layer(obj) -> bool:
    return keras_of(obj).is_layer(obj)


@contextlib.contextmanager
def _recording_calls(layers: list):
    """{id(layer): [(args, kwargs), ...]}: what each layer's call() receives inside the block (after Keras
    filled in masks and `training`). The instance's own `call` attribute shadows the method for the block."""
    calls: dict[int, list] = {id(layer): [] for layer in layers}
    missing = object()
    saved = {id(layer): layer.__dict__.get("call", missing) for layer in layers}

    def recorder(layer, original):
        def call(*args, **kwargs):
            if len(calls[id(layer)]) < _CALLS_PER_LAYER:
                calls[id(layer)].append((args, kwargs))
            return original(*args, **kwargs)

        return call

    try:
        for layer in layers:
            object.__setattr__(layer, "call", recorder(layer, layer.call))
        yield calls
    finally:
        for layer in layers:
            if saved[id(layer)] is missing:
                object.__delattr__(layer, "call")
            else:
                object.__setattr__(layer, "call", saved[id(layer)])


def _recorded_calls(model, layers: list, batches: list[dict]) -> dict[int, list]:
    """The arguments each of `layers` was really called with when the model ran on the golden batches."""
    import tensorflow as tf

    from exportkit.sources.model_io import feed_model

    with _recording_calls(layers) as calls:
        for batch in batches:
            try:
                feed_model(model, {k: tf.constant(v) for k, v in batch.items()})
            except Exception:  # the golden record ran; what was recorded until here is still a real call
                break
    return calls


def check_contracts(model, batches: list[dict], custom_objects: dict, allow_incomplete: bool = False,
                    compare=None) -> list[Finding]:
    """Findings for every custom object of `model`; `batches` are golden inputs keyed by input name.

    `compare(expected_batches, actual_batches) -> [OutputComparison]` judges the rebuilt layers' outputs (the
    caller passes exportkit.compare.outputs.compare_with_default_tolerances); without it only configs and weight
    shapes are checked.
    """
    severity = "warning" if allow_incomplete else "error"
    objects = custom_objects_of(model)
    keras = keras_of(model)
    layers = [obj for obj in objects if is_layer(obj)]
    calls = _recorded_calls(model, layers, batches) if batches and layers else {}
    findings: list[Finding] = []
    for obj in objects:
        if isinstance(obj, types.FunctionType):
            findings += _check_function(obj, custom_objects, severity, keras)
        else:
            findings += _check_object(obj, calls.get(id(obj)), custom_objects, severity, compare)
    return findings


def _check_function(fn, custom_objects: dict, severity: str, keras) -> list[Finding]:
    try:
        with keras.custom_object_scope(custom_objects):
            back = keras.deserialize(keras.serialize(fn))
    except Exception:  # Keras raises TypeError/ValueError for unknown names
        back = None
    if back is fn or (getattr(back, "__module__", None), getattr(back, "__qualname__", None)) == (
            fn.__module__, fn.__qualname__):
        return []
    return [Finding(severity, "custom-config-roundtrip",
                    f"function {fn.__module__}.{fn.__qualname__} is saved by name but does not deserialize back "
                    f"(a reloaded model cannot find it); fix: decorate it with "
                    f"@{keras.package}.saving.register_keras_serializable() or pass --custom-objects {fn.__module__}")]


def _check_object(obj, calls, custom_objects, severity, compare) -> list[Finding]:
    keras = keras_of(obj)
    where = _where(obj)
    try:
        config = obj.get_config()
        serialized = json.loads(json.dumps(keras.serialize(config)))
    except Exception as err:  # NotImplementedError (Keras' auto-config), TypeError (json), ...
        detail = " ".join(str(err).split())[:200]
        return [Finding(severity, "custom-config-unserializable",
                        f"{where}: get_config() is not JSON-serializable ({type(err).__name__}: {detail}), so the "
                        f"model cannot be saved and rebuilt; fix: return only plain values (numbers, strings, lists, "
                        f"serialized Keras objects) from get_config()")]
    findings = _check_coverage(obj, config, where, severity)
    findings += _check_roundtrip(obj, serialized, calls, custom_objects, where, severity, compare)
    return findings


def _own_init(cls) -> bool:
    """The class (or a custom base) defines the constructor: a custom subclass that inherits a Keras class's
    __init__ adds no argument of its own, and Keras' own config contract is not this check's business."""
    owner = next((klass for klass in cls.__mro__ if "__init__" in vars(klass)), object)
    return not _is_framework(owner.__module__)


def _own_from_config(cls) -> bool:
    """The class maps its config to its constructor itself (Hugging Face's models take one `config` object and
    store its fields): argument names say nothing then; the round trip (rebuilt config, replayed calls) decides."""
    owner = next((klass for klass in cls.__mro__ if "from_config" in vars(klass)), object)
    return not _is_framework(owner.__module__)


def _scalar(value) -> bool:
    return isinstance(value, (bool, int, float, str))


def _check_coverage(obj, config: dict, where: str, severity: str) -> list[Finding]:
    """Every __init__ argument is in the config, with the value the constructor received (where it is known:
    an attribute of the same name may hold a derived value, and None defaults are resolved later on purpose).
    A missing argument whose default and value are None is info: the check cannot decide."""
    findings = []
    if not _own_init(type(obj)) or _own_from_config(type(obj)):
        return []
    try:
        params = pyinspect.signature(type(obj).__init__).parameters
    except (TypeError, ValueError):
        return []
    received = keras_of(obj).constructor_arguments(obj) or {}
    for name, param in list(params.items())[1:]:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or name in _BASE_ARGS:
            continue
        ok, value = _plain(received.get(name))
        if name not in config and param.default is None and received.get(name) is None:
            # A None default is resolved later (keras.config.image_data_format(), other arguments): this instance
            # got None, as a rebuilt one does; whether a trained one got another value cannot be told here.
            findings.append(Finding("info", "custom-config-unchecked",
                                    f"{where}: get_config() does not return __init__ argument '{name}' (default "
                                    f"None, and None here): a model built with another {name} would lose it on "
                                    f"reload"))
            continue
        if name not in config:
            if param.default is param.empty:
                uses = "nothing: from_config() fails without it"
            else:
                uses = f"{name}={param.default!r} (the default)"
            trained = (f", although this instance has {name}={value!r} (its constructor received it)"
                       if name in received and ok and value != _plain(param.default)[1] else "")
            findings.append(Finding(severity, "custom-config-incomplete",
                                    f"{where}: get_config() does not return __init__ argument '{name}'; a model "
                                    f"rebuilt from the config (a reloaded .keras/.h5) uses {uses}{trained}; fix: add "
                                    f"'{name}' to get_config() (or --allow-incomplete-config if it is derived)"))
            continue
        ok_cfg, cfg_value = _plain(config[name])
        if name in received and ok and ok_cfg and _scalar(value) and _scalar(cfg_value) and value != cfg_value:
            findings.append(Finding(severity, "custom-config-incomplete",
                                    f"{where}: get_config() returns {name}={cfg_value!r}, but the constructor "
                                    f"received {name}={value!r}; a model rebuilt from the config is built with "
                                    f"{cfg_value!r}; fix: return the constructor's argument from get_config() "
                                    f"(keep it as received, e.g. self._{name} = {name})"))
    return findings


def _without_names(config):
    if isinstance(config, dict):
        return {k: _without_names(v) for k, v in config.items() if k != "name"}
    if isinstance(config, list):
        return [_without_names(v) for v in config]
    return config


def _one_line(err: Exception) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())[:200]}"


def _check_roundtrip(obj, serialized, calls, custom_objects, where, severity, compare) -> list[Finding]:
    """Rebuild `obj` from its config; for layers, replay the recorded calls on the original and on the rebuilt
    layer (same weights) and compare."""
    keras = keras_of(obj)

    def finding(what: str) -> list[Finding]:
        return [Finding(severity, "custom-config-roundtrip",
                        f"{where}: {type(obj).__name__}.from_config(get_config()) {what}; fix: make get_config() "
                        f"return every constructor argument and from_config() rebuild the same object")]

    def unchecked(why: str) -> list[Finding]:
        return [Finding("info", "custom-config-unchecked", f"{where}: the rebuilt layer was not run: {why}; its "
                                                           f"config was checked")]

    try:  # from the config as a .keras file stores it (JSON), the way a reload rebuilds the object
        with keras.custom_object_scope(custom_objects):
            clone = type(obj).from_config(copy.deepcopy(serialized))
        clone_config = json.loads(json.dumps(keras.serialize(clone.get_config())))
    except Exception as err:
        return finding(f"fails ({_one_line(err)})")
    if _without_names(clone_config) != _without_names(serialized):
        changed = sorted(k for k in set(serialized) | set(clone_config)
                         if k != "name" and serialized.get(k) != clone_config.get(k))
        return finding(f"gives an object with another config (differs in: {', '.join(changed)})")
    if not is_layer(obj) or calls is None:
        return []
    if not calls:
        built = not obj.weights or (_build_like(clone, obj) and bool(clone.weights))  # none: sublayers not built yet
        if built and [tuple(w.shape) for w in obj.weights] != [tuple(w.shape) for w in clone.weights]:
            return finding("builds weights of other shapes")
        return unchecked("the model never called it on the golden inputs"
                         + ("" if built else " (and its build config does not create its weights)"))
    try:
        expected = [obj(*args, **kwargs) for args, kwargs in calls]
    except Exception as err:  # the original itself does not replay: the check cannot decide
        return unchecked(f"replaying its recorded call fails on the original layer too ({_one_line(err)})")
    try:
        # tf_keras' build_from_config only marks a layer without build() built: sublayers it made in __init__
        # get their weights on the first call, as they did in the original
        if obj.weights and (not _build_like(clone, obj) or len(clone.weights) != len(obj.weights)):
            args, kwargs = calls[0]
            clone(*args, **kwargs)
        shapes = [tuple(w.shape) for w in obj.weights], [tuple(w.shape) for w in clone.weights]
        if shapes[0] != shapes[1]:
            return finding(f"builds weights of other shapes ({shapes[1]} instead of {shapes[0]})")
        if compare is None:
            return []
        clone.set_weights(obj.get_weights())
        actual = [clone(*args, **kwargs) for args, kwargs in calls]
    except Exception as err:
        return finding(f"gives a layer that fails on the arguments the original was called with ({_one_line(err)})")
    return _compare_outputs(list(zip(expected, actual)), finding, compare, keras)


def _build_like(clone, obj) -> bool:
    build_config = obj.get_build_config() if hasattr(obj, "get_build_config") else None
    if clone.built or not build_config:
        return clone.built
    clone.build_from_config(build_config)
    return clone.built


def _compare_outputs(pairs, finding, compare, keras) -> list[Finding]:
    def as_dict(outputs):
        tensors = [t for t in keras.flatten(outputs) if hasattr(t, "shape") and hasattr(t, "dtype")]
        return {f"output_{i}": np.asarray(t) for i, t in enumerate(tensors)}

    results = compare([as_dict(a) for a, _ in pairs], [as_dict(b) for _, b in pairs])
    failed = [r for r in results if not r.passed]
    if not failed:
        return []
    worst = max((r.max_abs_err or 0.0) for r in failed)
    return finding(f"with the same weights gives other outputs on the golden inputs ({failed[0].reason}; max abs "
                   f"err {worst:.3g}): the rebuilt object is configured differently")
