"""Load full-model .h5 files written by Keras 3 *or* tf.keras 2 into Keras 3, dtype policies kept.

Keras 3 (`keras.models.load_model`) cannot read some tf.keras 2 (`tf_keras`, Keras 2.x) configs:

- Layers saved under a mixed-precision policy carry `"dtype": {"module": "keras.mixed_precision",
  "class_name": "Policy", "config": {"name": "mixed_float16"}}`. Keras 3.15 fails with
  `AttributeError: 'str' object has no attribute 'quantization_mode'` (other Keras 3 versions:
  "Could not locate class 'Policy'"). Older tf.keras wrote the same without "module", or as "PolicyV1".
- A model nested in a functional model (a Functional, or a Sequential built on an Input): tf.keras 2 gave
  it a built-in node 0 and refers to its first real call as node 1; Keras 3 models have no built-in node
  ("Invalid Functional model configuration ... nodes failed to be resolved: ... [['block', 1, 0, {}]]").
  This breaks even float32 tf.keras 2 files.

`load_h5` first tries Keras itself; only if that fails and the file's config changes under
`normalize_legacy_config`, it rebuilds the model from the normalized config with Keras' own legacy-h5
functions (the same steps as `keras.src.legacy.saving.legacy_h5_format.load_model_from_hdf5`) and loads
the weights with `load_weights_from_hdf5_group`. Errors that normalization does not cure (missing custom
objects, corrupt files) propagate unchanged.
"""
from __future__ import annotations

import copy
import json
from typing import Any

# tf.keras 2 (and TF 2.1-2.3 experimental) mixed-precision policy classes. Keras 3 names
# (DTypePolicy, FloatDTypePolicy, QuantizedDTypePolicy, DTypePolicyMap) are left alone.
LEGACY_POLICY_CLASSES = frozenset({"Policy", "PolicyV1", "PolicyV2"})
_MODEL_CLASSES = frozenset({"Functional", "Model"})


def _read_attr(path, name: str):
    import h5py

    with h5py.File(path, mode="r") as f:
        value = f.attrs.get(name)
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    return value


def read_h5_model_config(path) -> dict:
    """The `model_config` attribute of a full-model .h5 file, as a dict.

    Raises ValueError if the file has no model config (e.g. a weights-only .h5)."""
    raw = _read_attr(path, "model_config")
    if raw is None:
        raise ValueError(f"{path} has no model_config attribute (a weights-only .h5 file?)")
    config = json.loads(raw)
    if not isinstance(config, dict):
        raise ValueError(f"{path}: model_config is not a JSON object")
    return config


def keras_version_of_h5(path) -> str | None:
    """The `keras_version` attribute of an .h5 file (e.g. '2.15.0' for tf.keras 2, '3.15.1' for Keras 3)."""
    value = _read_attr(path, "keras_version")
    return None if value is None else str(value)


def is_tf_keras2_version(version: str | None) -> bool:
    """True for files written by tf.keras / Keras 2.x (and the older 2.x-reporting tf.keras)."""
    return bool(version) and str(version).split(".")[0] == "2"


def _policy_name(value: Any) -> str | None:
    """The policy name if `value` is a serialized tf.keras 2 policy, else None."""
    if not isinstance(value, dict) or value.get("class_name") not in LEGACY_POLICY_CLASSES:
        return None
    cfg = value.get("config")
    if isinstance(cfg, dict) and isinstance(cfg.get("name"), str):
        return cfg["name"]
    return None


def keras3_policy(name: str) -> dict:
    """A serialized Keras 3 DTypePolicy, as Keras 3 itself writes it into .h5 configs."""
    return {"module": "keras", "class_name": "DTypePolicy", "config": {"name": name}, "registered_name": None}


def _rewrite_policies(node: Any) -> Any:
    """Replace every tf.keras 2 policy found as the value of a "dtype" key, at any depth."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            name = _policy_name(value) if key == "dtype" else None
            out[key] = keras3_policy(name) if name is not None else _rewrite_policies(value)
        return out
    if isinstance(node, list):
        return [_rewrite_policies(v) for v in node]
    return node


def _tf_keras2_skips_first_node(layer_config: dict) -> bool:
    """tf.keras 2 `_should_skip_first_node`: a nested Functional model, or a nested Sequential whose first
    layer is an InputLayer, owns a built-in node 0 that its config leaves out (its first call is node 1)."""
    cls = layer_config.get("class_name")
    if cls in _MODEL_CLASSES:
        return True
    if cls == "Sequential":
        layers = (layer_config.get("config") or {}).get("layers")
        return bool(layers) and isinstance(layers[0], dict) and layers[0].get("class_name") == "InputLayer"
    return False


def _is_tensor_ref(ref: Any) -> bool:
    return (isinstance(ref, list) and len(ref) in (3, 4) and isinstance(ref[0], str)
            and isinstance(ref[1], int) and isinstance(ref[2], int))


def _shift_tensor_refs(refs: Any, shifts: dict) -> Any:
    """Legacy [layer_name, node_index, tensor_index(, kwargs)] refs with node_index shifted for some layers."""
    if _is_tensor_ref(refs):
        return [refs[0], refs[1] - shifts.get(refs[0], 0)] + refs[2:]
    if isinstance(refs, list):
        return [_shift_tensor_refs(r, shifts) for r in refs]
    if isinstance(refs, dict):
        return {k: _shift_tensor_refs(v, shifts) for k, v in refs.items()}
    return refs


def _collect_node_indices(refs: Any, found: dict) -> None:
    if _is_tensor_ref(refs):
        found.setdefault(refs[0], []).append(refs[1])
    elif isinstance(refs, list):
        for r in refs:
            _collect_node_indices(r, found)
    elif isinstance(refs, dict):
        for r in refs.values():
            _collect_node_indices(r, found)


def _fix_nested_model_nodes(model_config: dict) -> None:
    """In-place, for tf.keras 2 configs: renumber references to nested models to Keras 3's numbering.

    tf.keras 2 numbers a nested model's calls from 1 (node 0 is its built-in node); Keras 3 models have no
    built-in node, so legacy `inbound_nodes` refs must go down by one. In `output_layers`, Keras 3 itself
    subtracts one for Functional models, so there only nested Sequential refs are shifted.
    """
    config = model_config.get("config")
    if not isinstance(config, dict) or not isinstance(config.get("layers"), list):
        return
    layers = [l for l in config["layers"] if isinstance(l, dict)]
    for layer in layers:  # nested models first
        if layer.get("class_name") in _MODEL_CLASSES | {"Sequential"}:
            _fix_nested_model_nodes(layer)
    if model_config.get("class_name") not in _MODEL_CLASSES:
        return  # a Sequential's config has no node references
    candidates = {l.get("name"): l.get("class_name") for l in layers if _tf_keras2_skips_first_node(l)}
    if not candidates:
        return
    referenced: dict = {}
    for layer in layers:
        _collect_node_indices(layer.get("inbound_nodes", []), referenced)
    _collect_node_indices(config.get("output_layers", []), referenced)
    # Safety net: shift only a model whose every reference is >= 1 (node 0 really was the built-in one).
    shifted = {name for name in candidates if referenced.get(name) and min(referenced[name]) >= 1}
    if not shifted:
        return
    inbound_shifts = {name: 1 for name in shifted}
    output_shifts = {name: 1 for name in shifted if candidates[name] == "Sequential"}
    for layer in layers:
        if "inbound_nodes" in layer:
            layer["inbound_nodes"] = _shift_tensor_refs(layer["inbound_nodes"], inbound_shifts)
    if "output_layers" in config and output_shifts:
        config["output_layers"] = _shift_tensor_refs(config["output_layers"], output_shifts)


def normalize_legacy_config(config: dict, keras_version: str | None = None) -> dict:
    """A deep copy of `config` that Keras 3 can deserialize, with every dtype policy kept.

    - tf.keras 2 policies (`{"class_name": "Policy"|"PolicyV1", "config": {"name": ...}}` with or without
      "module", as the value of any "dtype" key at any depth) become Keras 3
      `{"module": "keras", "class_name": "DTypePolicy", "config": {"name": ...}, "registered_name": None}`.
      String dtypes ("mixed_float16", "float32") are valid in Keras 3 and stay as they are.
    - If `keras_version` says tf.keras 2.x: references to calls of nested models (tf.keras 2 numbers them
      from 1, after the nested model's built-in node 0) are renumbered the way Keras 3 reads them.
    """
    out = _rewrite_policies(copy.deepcopy(config))
    if is_tf_keras2_version(keras_version):
        _fix_nested_model_nodes(out)
    return out


def _merged_custom_objects(custom_objects: dict | None) -> dict:
    """As load_model_from_hdf5 does: the given objects, the registered ones and any custom_object_scope."""
    from keras.src.backend.common import global_state
    from keras.src.saving import object_registration

    gco = object_registration.GLOBAL_CUSTOM_OBJECTS
    tlco = global_state.get_global_attribute("custom_objects_scope_dict", {})
    return {**(custom_objects or {}), **gco, **tlco}


def model_from_legacy_config(config: dict, custom_objects: dict | None = None, safe_mode: bool = True):
    """Instantiate a Keras 3 model from a legacy (h5 / to_json-style) model config (not modified)."""
    from keras.src.legacy.saving import saving_options, saving_utils
    from keras.src.saving import serialization_lib

    with saving_options.keras_option_scope(use_legacy_config=True), serialization_lib.SafeModeScope(safe_mode):
        return saving_utils.model_from_config(copy.deepcopy(config),
                                              custom_objects=_merged_custom_objects(custom_objects))


def load_normalized_h5(path, custom_objects: dict | None = None, safe_mode: bool = True):
    """Rebuild the model from the normalized config of `path` and load its weights (no first attempt)."""
    import h5py
    from keras.src.legacy.saving import legacy_h5_format, saving_options
    from keras.src.saving import serialization_lib
    from keras.src.saving.saving_lib import safe_get_h5_group

    config = normalize_legacy_config(read_h5_model_config(path), keras_version_of_h5(path))
    model = model_from_legacy_config(config, custom_objects, safe_mode)
    with h5py.File(path, mode="r") as f:
        with saving_options.keras_option_scope(use_legacy_config=True), serialization_lib.SafeModeScope(safe_mode):
            legacy_h5_format.load_weights_from_hdf5_group(safe_get_h5_group(f, "model_weights"), model)
    return model


def needs_normalization(path) -> bool:
    """True if the file's config differs from its normalized form (so load_h5 may need the fallback)."""
    config = read_h5_model_config(path)
    return normalize_legacy_config(config, keras_version_of_h5(path)) != config


def load_h5(path, custom_objects: dict | None = None, safe_mode: bool = True):
    """Load a Keras 3 or tf.keras 2 full-model .h5 into Keras 3 (uncompiled), dtype policies kept.

    1. `keras.models.load_model(path, custom_objects=..., compile=False, safe_mode=...)`.
    2. If that raises and the file's config is one normalization changes (tf.keras 2 policies, nested
       tf.keras 2 models), rebuild from the normalized config and load the weights. If that fails
       too, its exception is raised (chained to the first one) — e.g. `ValueError: Unknown layer: 'X'`
       for a missing custom object. Otherwise the first exception is re-raised unchanged.
    """
    import keras

    path = str(path)
    try:
        return keras.models.load_model(path, custom_objects=custom_objects, compile=False, safe_mode=safe_mode)
    except Exception as first:  # noqa: BLE001  (re-raised below unless the legacy fallback applies)
        try:
            fallback = needs_normalization(path)
        except Exception:  # not a readable full-model .h5: the first error is the informative one
            raise first from None
        if not fallback:
            raise
        try:
            return load_normalized_h5(path, custom_objects, safe_mode)
        except Exception as second:
            raise second from first
