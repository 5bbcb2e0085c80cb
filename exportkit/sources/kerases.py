"""The two Kerases a source can belong to, one adapter each: Keras 3 (`keras`) and tf.keras 2 (`tf_keras`).

Everything that depends on the Keras of a model goes through its `Keras` adapter: loading a file, the
custom-object registry, model introspection (inputs, structures, layers), the dtype policy, serialization and
the export archive. The rest of exportkit asks `keras_of(model)` (or `KERASES[...]`) and never tests for a
Keras itself.

Which Keras a source belongs to is read, without TensorFlow, from the source (`which_keras`): `keras_version`
in a .h5 file's attributes or a .keras archive's metadata.json, `keras_metadata.pb` beside a SavedModel's
saved_model.pb, a checkpoint's keys (tf.keras 2 names layers `layer_with_weights-N`, Keras 3 `_operations/N`),
a .weights.h5's `metrics/` group (only tf_keras stores the compiled metrics' state).
`--keras 2|3` (or `keras` in exportkit.toml) overrides it. Sources that tell nothing (a .weights.h5, a
subclassed model's checkpoint) are decided by the objects the builder returns.

User code written against `tf.keras` means tf_keras only if TF_USE_LEGACY_KERAS=1 is set before TensorFlow is
first imported. `prepare_process` therefore runs first (before any TensorFlow import): when the source is a
tf.keras 2 one and the user has not set the variable, it sets TF_USE_LEGACY_KERAS=1, so that `tf.keras` in the
custom-object and builder modules this process imports means the Keras the file was written with. A variable the
user set is never changed. exportkit itself imports `keras` and `tf_keras` by name, so both work either way.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect as pyinspect
import io
import json
import os
import re
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from exportkit.errors import UsageError

LEGACY_ENV = "TF_USE_LEGACY_KERAS"
CHOICES = ("2", "3")

# Class names a Keras config uses for Keras' own objects that no namespace below lists.
_BUILTIN_NAMES = ("Functional", "Sequential", "Policy", "TFOpLambda", "SlicingOpLambda")


@dataclass(frozen=True)
class Keras:
    """One Keras: `major` 3 (the `keras` package) or 2 (the `tf_keras` package, tf.keras 2)."""

    major: int
    package: str

    def __str__(self) -> str:
        return "Keras 3" if self.major == 3 else "tf.keras 2 (tf_keras)"

    # ---- the package -------------------------------------------------------------------------------------

    @property
    def module(self):
        try:
            return importlib.import_module(self.package)
        except ImportError as err:
            raise UsageError(f"{self} is needed for this model, but `import {self.package}` fails ({err})",
                             f"pip install {self.package.replace('_', '-')} (the version that matches your "
                             f"TensorFlow)") from err

    @property
    def version(self) -> str:
        return self.module.__version__

    def imported(self) -> bool:
        return self.package in sys.modules

    # ---- what belongs to this Keras ---------------------------------------------------------------------

    def _bases(self) -> tuple:
        k = self.module
        bases = [k.layers.Layer, k.Model, k.losses.Loss, k.metrics.Metric, k.initializers.Initializer,
                 k.regularizers.Regularizer, k.constraints.Constraint, k.optimizers.schedules.LearningRateSchedule]
        bases.append(k.DTypePolicy if self.major == 3 else k.mixed_precision.Policy)
        return tuple(bases)

    def owns_class(self, cls) -> bool:
        """A class of this Keras' kinds: layer, model, loss, metric, initializer, regularizer, constraint,
        schedule, policy (a subclass of one of them)."""
        return self.imported() and pyinspect.isclass(cls) and issubclass(cls, self._bases())

    def is_model(self, obj) -> bool:
        return self.imported() and isinstance(obj, self.module.Model)

    def is_layer(self, obj) -> bool:
        return self.imported() and isinstance(obj, self.module.layers.Layer)

    # ---- the custom-object registry ----------------------------------------------------------------------

    def registered_objects(self) -> dict:
        return self.module.saving.get_custom_objects() if self.imported() else {}

    def registered_name(self, obj) -> str:
        return self.module.saving.get_registered_name(obj)

    def registered_object(self, name: str):
        return self.module.saving.get_registered_object(name)

    def custom_object_scope(self, objects: dict):
        return self.module.saving.custom_object_scope(objects)

    def serialize(self, obj):
        return self.module.saving.serialize_keras_object(obj)

    def deserialize(self, config):
        return self.module.saving.deserialize_keras_object(config)

    def known_builtin(self, class_name: str) -> bool:
        """A class name Keras itself resolves (a layer, initializer, policy, ...)."""
        k = self.module
        namespaces = [k.layers, k.models, k, k.initializers, k.regularizers, k.constraints, k.losses, k.metrics,
                      k.optimizers, k.activations, k.dtype_policies if self.major == 3 else k.mixed_precision]
        return class_name in _BUILTIN_NAMES or any(hasattr(ns, class_name) for ns in namespaces)

    # ---- loading -----------------------------------------------------------------------------------------

    def load_file(self, path: str, fmt: str, custom_objects: dict, safe_mode: bool):
        """A full model from a .h5, .keras or (tf.keras 2) SavedModel directory, uncompiled."""
        if self.major == 3 and fmt == "h5":
            from exportkit.sources.h5compat import load_h5  # tf.keras 2 files too (policies, nested models)

            return load_h5(path, custom_objects=custom_objects, safe_mode=safe_mode)
        if self.major == 3 and fmt in ("saved_model", "keras") and which_keras(path, fmt) is TF_KERAS:
            raise UsageError(f"{path} is a tf.keras 2 {'SavedModel' if fmt == 'saved_model' else '.keras archive'}, "
                             f"which Keras 3 cannot load", "drop --keras 3 (exportkit loads it with tf_keras)")
        kwargs = {"safe_mode": safe_mode} if fmt == "keras" else {}  # tf_keras' legacy loaders take no safe_mode
        return self.module.models.load_model(path, custom_objects=custom_objects, compile=False, **kwargs)

    def model_from_json(self, text: str, custom_objects: dict):
        return self.module.models.model_from_json(text, custom_objects=custom_objects)

    @contextlib.contextmanager
    def dtype_policy(self, name: str | None):
        """Build models under a dtype policy; the previous global policy comes back afterwards."""
        from exportkit.tfenv import dtype_policy

        with dtype_policy(name, self.package):
            yield

    # ---- the model's structure ---------------------------------------------------------------------------

    def input_structure(self, model):
        """The nested structure of a functional model's Input tensors, else None (a subclassed model)."""
        struct = getattr(model, "_inputs_struct" if self.major == 3 else "_nested_inputs", None)
        return struct if struct is not None and getattr(model, "inputs", None) else None

    def input_name(self, keras_tensor) -> str:
        """The name of the Input layer that made `keras_tensor`."""
        history = getattr(keras_tensor, "_keras_history", None)
        if history is None:
            return keras_tensor.name
        return (history.operation if self.major == 3 else history.layer).name

    def flatten(self, structure) -> list:
        if self.major == 3:
            return self.module.tree.flatten(structure)
        import tensorflow as tf

        return tf.nest.flatten(structure)

    def map_structure(self, fn, structure):
        if self.major == 3:
            return self.module.tree.map_structure(fn, structure)
        import tensorflow as tf

        return tf.nest.map_structure(fn, structure)

    def layers_of(self, model, include_self: bool = False) -> list:
        """Every layer of the model, nested ones too."""
        return list(model._flatten_layers(include_self=include_self, recursive=True))

    def constructor_arguments(self, obj) -> dict | None:
        """The arguments the constructor received, defaults filled in, as both Kerases record them for their
        auto-config (when all are plain values), or None."""
        config = getattr(getattr(obj, "_auto_config", None), "config", None)
        return config if isinstance(config, dict) else None

    # ---- exporting ---------------------------------------------------------------------------------------

    def export_archive(self):
        """(archive, root): this Keras' ExportArchive (track, add_endpoint, write_out) and the trackable object
        the SavedModel's root is made from (extra objects such as assets hang off it)."""
        archive = self.module.export.ExportArchive()
        return archive, (archive._tf_trackable if self.major == 3 else archive)

    def write_archive(self, archive, path: str) -> None:
        """Write the SavedModel quietly (tf_keras' write_out prints every endpoint on stdout, which is the
        summary's)."""
        if self.major == 3:
            archive.write_out(path, verbose=False)
            return
        with contextlib.redirect_stdout(io.StringIO()):
            archive.write_out(path)

    def track_each_variable_once(self, root) -> None:
        """Keras 3's ExportArchive tracks each Keras Variable *and* the tf.Variable inside it (tf_keras: each
        mixed-precision AutoCastVariable and the variable it wraps), and the checkpoint writes both: every weight
        is stored twice, so every loader (TF Serving included) reads and holds it twice. Tracking the
        tf.Variables alone writes each once."""
        inner = "value" if self.major == 3 else "_variable"
        for name in ("variables", "trainable_variables", "non_trainable_variables"):
            setattr(root, name, [getattr(v, inner, v) for v in getattr(root, name)])


KERAS3 = Keras(3, "keras")
TF_KERAS = Keras(2, "tf_keras")
KERASES = {"3": KERAS3, "2": TF_KERAS}


def keras_of(obj) -> Keras:
    """The Keras a model, layer, class or function belongs to (Keras 3 unless it is tf_keras')."""
    return TF_KERAS if TF_KERAS.owns_class(obj if pyinspect.isclass(obj) else type(obj)) else KERAS3


def parse_choice(value) -> Keras | None:
    """`--keras 2|3` (or exportkit.toml's `keras`) -> its adapter; None when not given."""
    if value is None or value == "":
        return None
    text = str(value).strip().lower().removeprefix("keras").strip()
    if text not in CHOICES:
        raise UsageError(f"--keras {value!r} is not 2 or 3",
                         "pass --keras 3 (Keras 3, `keras`) or --keras 2 (tf.keras 2, `tf_keras`)")
    return KERASES[text]


# ---- which Keras wrote a source (no TensorFlow) -------------------------------------------------------------

def _major(version) -> Keras | None:
    head = str(version or "").split(".")[0]
    return KERASES.get(head)


def _h5_keras(path: Path) -> Keras | None:
    import h5py

    with h5py.File(path, "r") as f:
        version = f.attrs.get("keras_version")
    return _major(version.decode() if isinstance(version, bytes) else version)


def _weights_keras(path: Path) -> Keras | None:
    """A .weights.h5 records no version; tf_keras alone writes the compiled metrics' state (`metrics/`)."""
    import h5py

    with h5py.File(path, "r") as f:
        return TF_KERAS if "metrics" in f else None


def _archive_keras(path: Path) -> Keras | None:
    with zipfile.ZipFile(path) as archive:
        return _major(json.loads(archive.read("metadata.json")).get("keras_version"))


# Checkpoint keys: tf.keras 2 tracks a functional model's layers as `layer_with_weights-N`/`layer-N`; Keras 3 as
# `_operations/N`, `_layers/N`, `_functional`, and names its Dense/Conv kernels `_kernel`.
_KERAS3_KEY = re.compile(r"(^|/)(_operations|_layers|_functional|_kernel)(/|$)")
_KERAS2_KEY = re.compile(r"(^|/)layer(_with_weights)?-\d+(/|$)")


def _checkpoint_keras(src: Path) -> Keras | None:
    from exportkit.savedmodel.checkpoint import read_checkpoint

    if src.is_dir():
        indexes = sorted(src.glob("*.index"))
        named = re.search(r'model_checkpoint_path:\s*"([^"]+)"', (src / "checkpoint").read_text()) \
            if (src / "checkpoint").is_file() else None
        index = src / (named.group(1) + ".index") if named else (indexes[-1] if indexes else None)
    else:
        index = Path(str(src) + ".index")
    if index is None or not index.is_file():
        return None
    names = [t.name for t in read_checkpoint(index).variables]
    if any(_KERAS3_KEY.search(n) for n in names):
        return KERAS3
    if any(_KERAS2_KEY.search(n) for n in names):
        return TF_KERAS
    return None


def which_keras(src: str, fmt: str) -> Keras | None:
    """The Keras that wrote `src` as the source itself records it, or None when it does not say (read without
    TensorFlow; an unreadable file says nothing here: loading it reports why)."""
    path = Path(src)
    try:
        if fmt == "h5":
            return _h5_keras(path)
        if fmt == "keras":
            return _archive_keras(path)
        if fmt == "saved_model":
            return TF_KERAS  # keras_metadata.pb: only tf.keras 2 writes it
        if fmt == "checkpoint":
            return _checkpoint_keras(path)
        if fmt == "weights":
            return _weights_keras(path)
    except (OSError, KeyError, ValueError, UsageError, zipfile.BadZipFile):
        return None
    return None


def chosen_keras(opts, fmt: str) -> Keras | None:
    """`--keras`/exportkit.toml's keras, else what the source (of format `fmt`) records, else None (the objects
    decide)."""
    explicit = parse_choice(opts.keras)
    return explicit if explicit is not None else which_keras(opts.src, fmt)


def tf_keras_means() -> Keras:
    """What `tf.keras` is (or will be) in this process: tf_keras when TF_USE_LEGACY_KERAS was on when TensorFlow
    was imported."""
    tf = sys.modules.get("tensorflow")
    if tf is not None and hasattr(tf, "function"):
        # tf_keras' is `tf_keras.api._v2.keras`, Keras 3's `keras._tf_keras.keras`
        return TF_KERAS if getattr(tf.keras, "__name__", "").startswith("tf_keras") else KERAS3
    return TF_KERAS if os.environ.get(LEGACY_ENV, "").strip().lower() in ("1", "true", "yes") else KERAS3


def prepare_process(opts, fmt: str) -> Keras | None:
    """Before TensorFlow is imported: make `tf.keras` in the user's modules mean the source's Keras (sets
    TF_USE_LEGACY_KERAS=1 for a tf.keras 2 source unless the user set the variable). Returns the chosen Keras."""
    keras = chosen_keras(opts, fmt)
    tf_imported = "tensorflow" in sys.modules
    if keras is TF_KERAS and not tf_imported and LEGACY_ENV not in os.environ:
        os.environ[LEGACY_ENV] = "1"
    tensorflow_backend()
    return keras


BACKEND_ENV = "KERAS_BACKEND"


def tensorflow_backend() -> None:
    """Before Keras is imported: Keras 3 on the TensorFlow backend in this process, whatever KERAS_BACKEND (or
    ~/.keras/keras.json) says. exportkit traces the model with tf.function, which needs TensorFlow tensors; a .keras
    file is backend-independent (config and weights name no backend), so a model saved under JAX loads here as it
    is. Its SavedModel then holds TensorFlow ops, not the XlaCallModule that Keras' own export on the JAX backend
    writes and the stock tensorflow_model_server refuses (exportkit.savedmodel.deployment). The CLI and the API (a
    fresh CLI process) always get here before Keras is imported."""
    if "keras" in sys.modules:
        return
    wanted = os.environ.get(BACKEND_ENV, "tensorflow")
    if wanted != "tensorflow":
        from exportkit.log import log

        log.info("KERAS_BACKEND=%s: exportkit loads Keras 3 models on the TensorFlow backend (a .keras file is "
                 "backend-independent), so the SavedModel needs no XLA on the server", wanted)
    os.environ[BACKEND_ENV] = "tensorflow"


def mismatch_remedy(wanted: Keras, fmt: str | None = None) -> str:
    """How to make `tf.keras` in user modules mean `wanted` (used when a module gives the other Keras' objects).
    Keras 3 loads tf.keras 2 .h5 files too (exportkit.sources.h5compat), so for those --keras 3 is offered."""
    also = "; or load the file with Keras 3: --keras 3" if fmt == "h5" else ""
    if wanted is TF_KERAS:
        if LEGACY_ENV in os.environ and tf_keras_means() is KERAS3:
            return (f"your environment sets {LEGACY_ENV}={os.environ[LEGACY_ENV]}, so `tf.keras` is Keras 3: set "
                    f"{LEGACY_ENV}=1 (then tf.keras is tf_keras), or write the module with `import tf_keras`{also}")
        return (f"set {LEGACY_ENV}=1 before TensorFlow is imported (then tf.keras is tf_keras), or write the module "
                f"with `import tf_keras`{also}")
    if LEGACY_ENV in os.environ and tf_keras_means() is TF_KERAS:
        return (f"your environment sets {LEGACY_ENV}={os.environ[LEGACY_ENV]}, so `tf.keras` is tf_keras: unset it, "
                f"or write the module with `import keras` (Keras 3)")
    return "write the module with `import keras` (Keras 3), or pass --keras 2 if the source was written by tf_keras"
