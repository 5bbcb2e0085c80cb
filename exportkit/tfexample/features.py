"""tf.Example features for a model's inputs: derive them, override them (--feature-spec), encode values as Examples.

A signature with `input=examples` takes serialized tf.Example and parses it in the graph. The features come from
the model's inputs: one fixed-length feature per input, named after it, holding the input's non-batch dimensions
flattened (the graph reshapes them back) in the storage type tf.Example allows for its dtype (float_list for
floats, int64_list for integers and bools, bytes_list for strings); the graph casts the parsed values to the input
dtype. The same description builds Examples from tensor values (warm-up, golden record, verify), so an Example
signature is fed exactly the values its tensor twin is fed.

No TensorFlow here: Examples are built with the generated protobuf module (exportkit.savedmodel.protos).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from exportkit.inputs.spec import InputSpec
from exportkit.dtypes import canonical, is_float, is_string
from exportkit.errors import UsageError

STORAGE = ("float32", "int64", "string")  # the three value lists a tf.Example feature can hold
FEATURE_LISTS = {"float32": "float_list", "int64": "int64_list", "string": "bytes_list"}


@dataclass
class ExampleFeature:
    """One feature of a tf.Example: one export derives for a model input (fixed length, feeding `input`), or one a
    graph's parse op declares (exportkit.tfexample.signatures: dense, sparse or ragged, maybe with a vocabulary)."""

    feature: str  # key in Example.features
    storage: str  # float32 | int64 | string: the Example's value list (a parse op's declared dtype)
    shape: list[int] = field(default_factory=list)  # non-batch dims; [] = one value per example; -1 = any length
    default: list | None = None  # used when an Example lacks the feature; None = required
    input: str | None = None  # the model input it feeds (features export derives)
    dtype: str | None = None  # that input's dtype (parsed values are cast to it)
    kind: str = "dense"  # dense | sparse | ragged
    vocabulary: list[bytes] | None = None  # categorical strings found in the graph or its assets

    @property
    def length(self) -> int:
        return math.prod(self.shape)


def storage_of(dtype: str) -> str:
    dtype = canonical(dtype)
    if is_string(dtype):
        return "string"
    return "float32" if is_float(dtype) else "int64"


def derive_features(specs: list[InputSpec], signature: str) -> list[ExampleFeature]:
    """One feature per model input; a free non-batch dimension cannot be a fixed-length feature (UsageError)."""
    features = []
    for spec in specs:
        dims = list(spec.shape or [])[1:]
        if spec.shape is None or any(d is None or d < 0 for d in dims):
            raise UsageError(f"signature '{signature}' takes tf.Example, but input '{spec.key}' has a free non-batch "
                             f"dimension (shape {spec.shape}); tf.Example features here have a fixed length",
                             f"fix the dimension with --input-spec {spec.key}:-1,N:{spec.dtype}, or keep input=tensors")
        features.append(ExampleFeature(feature=spec.key, input=spec.key, storage=storage_of(spec.dtype),
                                       dtype=canonical(spec.dtype), shape=[int(d) for d in dims]))
    return features


def apply_feature_spec(features: list[ExampleFeature], path: str) -> list[ExampleFeature]:
    """--feature-spec FILE: `{"INPUT": {"feature": NAME, "storage": float32|int64|string, "default": [...]}}`.

    Shapes and input dtypes stay the model's; the file is checked against that schema (an unknown input, key or
    storage, a feature name that is not a string, a default that its value list cannot hold) as a UsageError.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:  # RecursionError: nesting deeper than the parser goes
        reason = "nested too deeply" if isinstance(err, RecursionError) else err
        raise UsageError(f"--feature-spec {path} is not readable JSON ({reason})", "fix the file") from None
    by_input = {f.input: f for f in features}
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise UsageError(f"--feature-spec {path}: expected an object of objects keyed by model input",
                         '{"features": {"feature": "f", "storage": "float32", "default": [0, 0]}}')
    unknown = sorted(set(data) - set(by_input))
    if unknown:
        raise UsageError(f"--feature-spec {path} names {', '.join(unknown)}, but the model's inputs are "
                         f"{', '.join(by_input)}", "key the file by model input names")
    out = []
    for f in features:
        override = data.get(f.input, {})
        bad = sorted(set(override) - {"feature", "storage", "default"})
        if bad:
            raise UsageError(f"--feature-spec {path}: input '{f.input}': unknown key(s) {', '.join(bad)}",
                             "use feature, storage and default")
        where = f"--feature-spec {path}: input '{f.input}'"
        if "feature" in override and not (isinstance(override["feature"], str) and override["feature"]):
            raise UsageError(f"{where}: feature {json.dumps(override['feature'])[:40]} is not a name",
                             'write the feature name as a JSON string: "feature": "age"')
        if "storage" in override and override["storage"] not in STORAGE:
            raise UsageError(f"{where}: storage {json.dumps(override['storage'])} is not one of {', '.join(STORAGE)}",
                             "use float32 or int64 for numbers, string for strings")
        new = ExampleFeature(**{**asdict(f), **override})
        if (new.storage == "string") != is_string(new.dtype):
            raise UsageError(f"{where} ({f.dtype}) cannot be stored as {new.storage}",
                             "use float32 or int64 for numbers, string for strings")
        if new.default is not None:
            new.default = list(new.default) if isinstance(new.default, list) else [new.default]
            _check_default(where, new)
        out.append(new)
    names = [f.feature for f in out]
    if len(set(names)) != len(names):
        raise UsageError(f"--feature-spec {path}: two inputs read the same feature", "give each input its own feature")
    return out


def _check_default(where: str, feature: ExampleFeature) -> None:
    """A default is `length` values its value list holds: finite numbers for float32, integers for int64 (in
    range), strings for string."""
    if len(feature.default) != feature.length:
        raise UsageError(f"{where}: default has {len(feature.default)} values, the feature {feature.length}",
                         f"give {feature.length} default values")
    for value in feature.default:
        if feature.storage == "string":
            ok = isinstance(value, str)
        elif feature.storage == "int64":
            ok = isinstance(value, int) and not isinstance(value, bool) and -2 ** 63 <= value < 2 ** 63
        else:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok:
            kind = {"string": "strings", "int64": "64-bit integers", "float32": "finite numbers"}[feature.storage]
            raise UsageError(f"{where}: default value {json.dumps(value)[:40]} is not one of the {kind} a "
                             f"{FEATURE_LISTS[feature.storage]} holds",
                             f"give {feature.length} default value(s) of that kind, e.g. \"default\": "
                             + json.dumps([{"string": "", "int64": 0, "float32": 0.0}[feature.storage]] * feature.length))


MANIFEST_KEYS = ("feature", "input", "storage", "dtype", "shape", "default")  # what export derives and records


def to_manifest(features: list[ExampleFeature]) -> list[dict]:
    return [{key: getattr(f, key) for key in MANIFEST_KEYS} for f in features]


def from_manifest(items: list[dict]) -> list[ExampleFeature]:
    return [ExampleFeature(**item) for item in items]


def encode_examples(batch: dict[str, np.ndarray], features: list[ExampleFeature]) -> np.ndarray:
    """Serialized tf.Example, one per row of `batch` (keyed by model input): a [rows] object array of bytes."""
    from exportkit.savedmodel.protos import protos

    example_cls = protos()["example"].Example
    rows = {f.input: np.asarray(batch[f.input]).reshape(len(batch[f.input]), -1) for f in features}
    n = len(next(iter(rows.values()))) if rows else 0
    out = np.empty([n], dtype=object)
    for i in range(n):
        example = example_cls()
        for f in features:
            values = rows[f.input][i]
            target = getattr(example.features.feature[f.feature], FEATURE_LISTS[f.storage]).value
            if f.storage == "string":
                target.extend(v if isinstance(v, bytes) else str(v).encode("utf-8") for v in values)
            elif f.storage == "float32":
                target.extend(values.astype(np.float32).tolist())
            else:
                target.extend(values.astype(np.int64).tolist())
        out[i] = example.SerializeToString(deterministic=True)  # map order: the same bytes in every process
    return out


def lossless(features: list[ExampleFeature]) -> bool:
    """True when every input dtype survives its Example value list exactly (float64 and 64-bit unsigned do not)."""
    return all(canonical(f.dtype) not in ("float64", "uint64") for f in features)
