"""Source path -> LoadedModel: a Keras model with its dtype policy, custom objects and origin digest.

Formats: full-model .h5/.hdf5 and .keras archives, tf.keras 2 SavedModel directories (keras_metadata.pb), TF
checkpoints and .weights.h5 files (the last two rebuilt by a builder function or a model.json config, then
restored strictly). Each is loaded with the Keras that wrote it (exportkit.sources.kerases), Keras 3 or tf.keras 2.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import importlib
import importlib.util
import inspect as pyinspect
import json
import logging
import re
import sys
import tempfile
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from exportkit.savedmodel.checkpoint import read_checkpoint
from exportkit import storage
from exportkit.errors import UsageError
from exportkit.savedmodel.versions import check_path, path_problem
from exportkit.sources.hdf5 import (LAYER_WEIGHTS, MODEL, SAVING_LIB_WEIGHTS, h5_content, is_hdf5, keras_readable,
                                    neither_message)
from exportkit.sources.kerases import (KERAS3, KERASES, TF_KERAS, Keras, keras_of, mismatch_remedy, parse_choice,
                                      prepare_process)
from exportkit.options.source import SourceOptions
from exportkit.tfenv import import_tf

FORMATS = ("h5", "keras", "saved_model", "checkpoint", "weights")
FILE_FORMATS = ("h5", "keras", "saved_model")  # hold the architecture; the others are rebuilt by a builder
KERAS_METADATA = "keras_metadata.pb"  # beside saved_model.pb in what tf.keras 2's model.save(dir) writes


@dataclass
class LoadedModel:
    model: object  # keras.Model
    format: str
    path: str
    sha256: str
    policy: str  # the dtype policy the model computes under, e.g. "mixed_float16"
    custom_objects: dict = field(default_factory=dict)
    keras: Keras = KERAS3  # the Keras the model belongs to


def detect_format(src: str, explicit: str | None = None) -> str:
    path = Path(src)
    check_path(path, "pass a regular .h5/.keras file or a checkpoint directory")
    if explicit:
        if explicit not in FORMATS:
            raise UsageError(f"unknown --format {explicit!r}", f"use one of: {', '.join(FORMATS)}")
        # a .keras file whose bytes are HDF5: Keras 2's model.save('x.keras') (before 2.13, its zip format needed
        # save_format='keras_v3'); tf_keras loads it as the .h5 it is
        return "h5" if explicit == "keras" and is_hdf5(path) else explicit
    if path.is_dir():
        if (path / "saved_model.pb").exists():
            if (path / KERAS_METADATA).exists():
                return "saved_model"  # tf.keras 2 model.save(dir): re-exported with exportkit's signatures
            raise UsageError(f"{src} is already a SavedModel", "run `exportkit verify` or `exportkit inspect` on it")
        if (path / "checkpoint").exists() or any(path.glob("*.index")):
            return "checkpoint"
        if (path / "tf_model.h5").is_file():  # what Hugging Face's save_pretrained writes
            saved_model = path / "saved_model"  # save_pretrained(d, saved_model=True)
            also = f"; its SavedModel, {saved_model}, verifies as it is" if saved_model.is_dir() else ""
            raise UsageError(f"{src} is a Hugging Face save_pretrained directory: its weights are {path / 'tf_model.h5'}"
                             f"{also}", f"pass {path / 'tf_model.h5'} with --builder module:function (a function that "
                                        f"builds the model from its config and calls it on model.dummy_inputs)")
        raise UsageError(f"{src} is a directory without a checkpoint",
                         "pass a .h5/.keras file, or a directory with a `checkpoint` file and *.index/data shards")
    if Path(str(src) + ".index").exists():
        return "checkpoint"  # a checkpoint prefix such as ckpt/ckpt-3
    if not path.exists():
        raise UsageError(f"{src} does not exist", "check the path of the model to export")
    content = h5_content(path)  # what an HDF5 file holds, whatever it is called (tf_model.h5, x.keras from Keras 2)
    if content is not None:
        if content.kind is None:
            raise UsageError(*neither_message(src, content))
        return "h5" if content.kind == MODEL else "weights"
    name = path.name.lower()  # not HDF5 (a .keras zip; an empty or damaged file: loading it says so)
    if name.endswith(".weights.h5"):
        return "weights"
    if name.endswith((".h5", ".hdf5")):
        return "h5"
    if name.endswith(".keras"):
        return "keras"
    raise UsageError(f"cannot tell the format of {src}",
                     "pass a .h5, .hdf5, .keras, .weights.h5 file or a checkpoint directory, or set --format")




def source_format(opts: SourceOptions) -> str:
    """The format the source is loaded as. With --builder or --model-config the model is rebuilt, and a full-model
    .h5 gives its weights (Keras reads a model file's `model_weights` as weights); a source that brings its own
    architecture otherwise (a .keras archive, a SavedModel, --format h5) is refused rather than loaded with the
    builder silently ignored."""
    fmt = detect_format(opts.src, opts.format)
    rebuilt = "--builder" if opts.builder else "--model-config" if opts.model_config else None
    if rebuilt is None or fmt not in FILE_FORMATS:
        return fmt
    if fmt == "h5" and not opts.format:
        return "weights"
    if fmt == "h5":
        raise UsageError(f"{rebuilt} would be ignored: --format h5 loads the architecture stored in {opts.src}",
                         f"drop --format h5 to load the file's weights into the model {rebuilt} builds, or drop "
                         f"{rebuilt}")
    what = "a .keras archive" if fmt == "keras" else "a tf.keras 2 SavedModel"
    raise UsageError(f"{rebuilt} would be ignored: {opts.src} is {what}, which holds its own architecture",
                     f"drop {rebuilt} (exportkit loads the architecture from the file), or pass the weights "
                     f"(model.save_weights('model.weights.h5')) with {rebuilt}")


def sha256_of(src: str) -> str:
    """Digest of a file, or of every file of a directory (names and contents, sorted)."""
    path = Path(src)
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    if not path.exists():  # checkpoint prefix: its .index and shards
        files = sorted(path.parent.glob(path.name + ".*"))
    for file in files:
        if path.is_dir():
            digest.update(str(file.relative_to(path)).encode() + b"\0")
        with open(file, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def python_path(dirs: list[str]):
    """Search `dirs` first for custom objects and builders, for the duration of the block."""
    for d in dirs:
        if not Path(d).is_dir():
            raise UsageError(f"--python-path {d} is not a directory", "pass a directory that contains your modules")
    saved = list(sys.path)
    sys.path[:0] = [str(Path(d).resolve()) for d in dirs]
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.path[:] = saved


def _import_module(name: str, what: str):
    try:
        return importlib.import_module(name)
    except ImportError as err:
        missing = getattr(err, "name", None)
        if not missing or name == missing or name.startswith(missing + "."):
            raise UsageError(f"cannot import {what} module {name!r} ({err})",
                             "check the name, and pass --python-path DIR for the directory that contains it") from err
        # the module itself was found: something it imports is not installed in exportkit's environment
        where = getattr(sys.modules.get(name), "__file__", None) or _module_file(name)
        raise UsageError(f"{what} module {name!r}{f' ({where})' if where else ''} was found, but importing it "
                         f"failed: it imports {missing!r}, which is not installed here ({err})",
                         f"install the package that provides {missing!r} into exportkit's environment "
                         f"({sys.executable} -m pip install ...), or pass --python-path DIR for the directory that "
                         f"contains {missing!r}") from err


def _module_file(name: str) -> str | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec else None


def _inside(obj, module_name: str) -> bool:
    module = getattr(obj, "__module__", None) or ""
    return module == module_name or module.startswith(module_name + ".")


def _is_keras_object(obj, module_name: str) -> bool:
    """A Keras 3 or tf.keras 2 class, or a function, that `module_name` defines (or, for a package such as
    tensorflow_hub, one of its submodules defines and the package offers: hub.KerasLayer)."""
    if not _inside(obj, module_name):
        return False
    if pyinspect.isclass(obj):
        return any(k.owns_class(obj) for k in KERASES.values())
    return pyinspect.isfunction(obj) and obj.__module__ == module_name


def _registered_from(module_name: str) -> dict:
    """The objects either Keras' global registry holds that `module_name` or its submodules defined (a package
    such as keras_hub registers its classes with @register_keras_serializable as its submodules are imported)."""
    return {name: obj for k in KERASES.values() for name, obj in k.registered_objects().items()
            if _inside(obj, module_name)}


def import_custom_objects(refs: list[str]) -> dict:
    """`module` offers every Keras class (Keras 3 or tf.keras 2) or function defined in it and every object it
    registered with either Keras (its submodules' too); `module:Name` offers one object."""
    objects = {}
    for ref in refs:
        module_name, _, attr = ref.partition(":")
        module = _import_module(module_name, "custom objects")
        if attr:
            if not hasattr(module, attr):
                raise UsageError(f"{module_name} has no attribute {attr!r}", f"check --custom-objects {ref}")
            found = {attr: getattr(module, attr)}
        else:
            found = {n: o for n, o in vars(module).items() if _is_keras_object(o, module.__name__)}
            found.update({name.split(">")[-1]: obj for name, obj in _registered_from(module.__name__).items()})
            if not found:
                raise UsageError(f"module {module_name} defines or registers no Keras layers, models or functions "
                                 f"(neither Keras 3 nor tf.keras 2 ones)",
                                 "pass the module that defines the custom objects, or module:Name")
        for name, obj in found.items():
            objects[name] = obj
            for k in KERASES.values():
                registered = k.registered_name(obj) if k.imported() else None
                if registered and registered != name:
                    objects[registered] = obj
    return objects


def _objects_for(keras: Keras, objects: dict) -> tuple[dict, dict]:
    """(the objects `keras` can use: its classes and any function, the other Keras' classes)."""
    own, other = {}, {}
    for name, obj in objects.items():
        usable = not pyinspect.isclass(obj) or keras.owns_class(obj) or not any(
            k.owns_class(obj) for k in KERASES.values())
        (own if usable else other)[name] = obj
    return own, other


def _keras_for_file(opts: SourceOptions, fmt: str, wanted: Keras | None, custom: dict) -> Keras:
    """--keras, else the file's Keras, else the custom classes'. A tf.keras 2 .h5 given Keras 3 custom classes
    is loaded into Keras 3 (converted by h5compat), as exportkit did before it loaded tf_keras files natively."""
    given = _keras_of_objects(custom)
    if wanted is TF_KERAS and given is KERAS3 and fmt == "h5" and parse_choice(opts.keras) is None:
        return KERAS3
    return wanted or given or KERAS3


def _keras_of_objects(objects: dict) -> Keras | None:
    """The Keras of the custom classes given, when they all belong to one."""
    kerases = {keras_of(obj) for obj in objects.values() if pyinspect.isclass(obj)
               and any(k.owns_class(obj) for k in KERASES.values())}
    return kerases.pop() if len(kerases) == 1 else None


def _import_builder(ref: str):
    module_name, sep, func_name = ref.partition(":")
    if not sep or not func_name:
        raise UsageError(f"--builder {ref!r} is not module:function", "write it as --builder my_pkg.models:build_ranker")
    module = _import_module(module_name, "builder")
    builder = getattr(module, func_name, None)
    if not callable(builder):
        raise UsageError(f"{module_name} has no function {func_name!r}", f"check --builder {ref}")
    return builder


# ---- missing custom objects -------------------------------------------------------------------------------

def _read_config(path: Path, fmt: str) -> dict | None:
    try:
        if fmt == "keras":
            with zipfile.ZipFile(path) as archive:
                return json.loads(archive.read("config.json"))
        if fmt == "h5":
            from exportkit.sources.h5compat import read_h5_model_config

            return read_h5_model_config(path)
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None
    return None


def unresolved_classes(config, custom_objects: dict, keras: Keras = KERAS3) -> list[tuple[str, str | None]]:
    """(class name, module it came from) for every object in a Keras config that nothing here can build with
    `keras`."""
    missing: dict[str, str | None] = {}

    def walk(node):
        if isinstance(node, dict):
            class_name = node.get("class_name")
            if isinstance(class_name, str) and "config" in node and not class_name.startswith("__"):
                module = node.get("module")
                registered = node.get("registered_name") or class_name
                if class_name == "function" and isinstance(node["config"], str):  # a function stored by name
                    class_name = registered = node["config"]
                    module = None  # ("builtins": says nothing about where it is defined)
                resolvable = (
                    class_name in custom_objects or registered in custom_objects
                    or keras.registered_object(registered) is not None
                    or (module or "").startswith(("keras", "tf_keras"))
                    or (not module and keras.known_builtin(class_name))
                )
                if not resolvable:
                    missing.setdefault(class_name.split(">")[-1], module)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(config)
    return sorted(missing.items())


# Classes of the TensorFlow ecosystem that legacy .h5 configs name without their module.
_ECOSYSTEM_CLASSES = {"KerasLayer": "tensorflow_hub"}


def _missing_object_error(path: Path, missing: list[tuple[str, str | None]], keras: Keras,
                          other: dict, fmt: str | None = None) -> UsageError:
    """Classes `keras` cannot find. When a --custom-objects module gave them as the other Keras' classes, that is
    the problem to name (passing the module again would not help)."""
    names = ", ".join(f"'{name}'" for name, _ in missing)
    wrong = sorted({name for name, _ in missing for key in other if key.split(">")[-1] == name})
    if wrong:
        kind = KERASES["3" if keras is TF_KERAS else "2"]
        return UsageError(f"{path.name} is loaded with {keras}, but the custom objects {', '.join(wrong)} are "
                          f"{kind} classes, which {keras} cannot use", mismatch_remedy(keras, fmt))
    modules = sorted({module or _ECOSYSTEM_CLASSES.get(name) for name, module in missing} - {None})
    hint = (" ".join(f"--custom-objects {m}" for m in modules)
            or f"--custom-objects MODULE (the module that defines {missing[0][0]})")
    return UsageError(f"Unknown layer {names} in {path.name} (looked in {keras}'s registry and the custom objects "
                      f"given)", f"pass {hint} (and --python-path DIR if that module is not importable)")


# ---- weights that were not restored ------------------------------------------------------------------------

# Keras/TF messages that mean some weights kept their fresh initial values (a load that "worked" with random weights).
_NOT_RESTORED = re.compile(r"Skipping variable loading|expected \d+ variables?, but received \d+|could not be loaded|"
                           r"Skipping (nested container|loading|object)|freshly.initialized|Could not load weights|"
                           r"were not restored|unmatched", re.IGNORECASE)


@contextlib.contextmanager
def weights_must_restore(what: str):
    """Turn Keras' load-time warnings that weights were not restored into an error (warnings and log records)."""
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    handler = Collect(logging.WARNING)
    loggers = [logging.getLogger(name) for name in ("", "absl", "keras", "tensorflow")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for logger in loggers:
            logger.addHandler(handler)
        try:
            yield
        finally:
            for logger in loggers:
                logger.removeHandler(handler)
    bad = list(dict.fromkeys(m for m in [str(w.message) for w in caught] + messages if _NOT_RESTORED.search(m)))
    if bad:
        first = " ".join(bad[0].split())[:300]
        more = f" (and {len(bad) - 1} more such warnings)" if len(bad) > 1 else ""
        raise UsageError(f"{what}: Keras did not restore every weight, the model would run with freshly initialized "
                         f"weights: {first}{more}",
                         "load the weights into exactly the architecture they were saved from (same layers, same "
                         "custom classes, same build()); exportkit never exports a model with random weights")


def _h5_datasets(path: str) -> dict[str, tuple]:
    import h5py

    found: dict[str, tuple] = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: found.__setitem__(name, tuple(obj.shape))
                     if isinstance(obj, h5py.Dataset) and not name.startswith(("optimizer", "metrics")) else None)
    return found


def _check_weights_file_consumed(model, src: str) -> None:
    """Every entry of a .weights.h5 must belong to the model: write the model's own weights file and compare."""
    with tempfile.TemporaryDirectory() as tmp:
        own_path = str(Path(tmp) / "own.weights.h5")
        model.save_weights(own_path)
        own = _h5_datasets(own_path)
    given = _h5_datasets(src)
    unmatched = sorted(set(given) - set(own))
    missing = sorted(set(own) - set(given))
    if unmatched or missing:
        parts = []
        if unmatched:
            parts.append(f"{len(unmatched)} unmatched entries ({', '.join(unmatched[:4])}{' ...' if len(unmatched) > 4 else ''})")
        if missing:
            parts.append(f"{len(missing)} model variables it has no entry for ({', '.join(missing[:4])}"
                         f"{' ...' if len(missing) > 4 else ''})")
        raise UsageError(f"weights file {src} does not fit the model's architecture: {'; '.join(parts)}",
                         "rebuild the model exactly as it was trained (same --builder/--builder-arg or --model-config)")


# ---- loading ------------------------------------------------------------------------------------------------

def _load_file(path: Path, fmt: str, custom: dict, unsafe: bool, keras: Keras, other: dict):
    """The model in `path`, loaded with `keras` and the custom objects it can use (`other`: the other Keras')."""
    try:
        return keras.load_file(str(path), fmt, custom, safe_mode=not unsafe)
    except UsageError:
        raise
    except Exception as err:  # Keras raises TypeError/ValueError/AttributeError: find out why, then say it clearly
        config = _read_config(path, fmt)
        damaged = _damaged_file(path, fmt) if fmt != "saved_model" else None
        if damaged:  # Keras calls an empty or truncated archive "File not found"
            raise UsageError(damaged, "the copy is incomplete or damaged: copy or download the model file again, "
                                      "or save it again with model.save(...)") from err
        missing = unresolved_classes(config, custom, keras) if config is not None else _unknown_in(err)
        if missing:
            raise _missing_object_error(path, missing, keras, other, fmt) from err
        if config is None and fmt != "saved_model":
            raise UsageError(f"{path} is not a Keras {fmt} model file ({type(err).__name__}: "
                             f"{_error_text(err, path, path)})",
                             "pass a model saved with model.save(...) (.keras or .h5)") from err
        text = str(err)
        if "Lambda" in text or "safe_mode" in text or "unsafe" in text.lower():
            raise UsageError(f"{path.name} contains a Lambda layer or Python bytecode, refused in safe mode",
                             "pass --unsafe if you trust this file") from err
        raise UsageError(f"could not load {path}: {type(err).__name__}: {_error_text(err, path, path)}",
                         "check the file and its custom objects; --debug shows the traceback") from err


def _load_with(keras: Keras, path: Path, fmt: str, opts: SourceOptions, custom: dict) -> tuple[object, dict]:
    """(model, the custom objects it was loaded with). A tf.keras 2 .h5 that tf_keras itself fails on (it cannot
    read back some configs it writes, e.g. a custom activation function) is loaded into Keras 3 (converted), as
    exportkit did before it loaded tf_keras files natively, unless --keras 2 asks for tf_keras."""
    own, other = _objects_for(keras, custom)
    try:
        with weights_must_restore(f"loading {path.name}"):
            return _load_file(path, fmt, own, opts.unsafe, keras, other), own
    except UsageError as err:
        if not (keras is TF_KERAS and fmt == "h5" and parse_choice(opts.keras) is None):
            raise
        own3, other3 = _objects_for(KERAS3, custom)
        try:
            with weights_must_restore(f"loading {path.name}"):
                return _load_file(path, fmt, own3, opts.unsafe, KERAS3, other3), own3
        except UsageError:
            raise err from None


_GFILE = re.compile(r"<[\w.]*GFile object at 0x[0-9a-fA-F]+>")


def _error_text(err: Exception, shown: str, path) -> str:
    """The first line of a Keras error, naming `path` where it shows a file object (Keras opens .h5 files through
    tf.io.gfile and prints the object) or the name the file was read under."""
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    return _GFILE.sub(str(path), text).replace(str(shown), str(path))[:300]


def _unknown_in(err: Exception) -> list[tuple[str, str | None]]:
    """The class a Keras error says it could not find (a SavedModel's config is not read here)."""
    found = re.search(r"Unknown (?:layer|object|class|loss|metric|activation)[^']*'([^']+)'", str(err))
    return [(found.group(1).split(">")[-1], None)] if found else []


def _damaged_file(path: Path, fmt: str) -> str | None:
    """Why a model file is unreadable as a whole (empty, or a .keras that is not a complete zip), else None."""
    size = path.stat().st_size
    if size == 0:
        return f"{path} is empty (0 bytes)"
    if fmt == "keras" and not zipfile.is_zipfile(path):
        return f"{path} is not a complete .keras archive ({size} bytes, not a valid zip: truncated or another format)"
    return None


def _rebuild(opts: SourceOptions, custom: dict, wanted: Keras | None):
    """A fresh model from --builder or --model-config, built under --policy (set in every Keras the builder's
    module imported: the model it returns says which Keras it is)."""
    if not opts.builder and not opts.model_config:
        raise UsageError(f"{opts.src} holds weights only; exportkit needs the architecture",
                         "pass --builder module:function or --model-config model.json (or put them in exportkit.toml)")
    builder = _import_builder(opts.builder) if opts.builder else None
    keras = wanted or _keras_of_objects(custom) or KERAS3
    with contextlib.ExitStack() as policies:
        for k in KERASES.values():
            if k.imported() or k is keras:
                policies.enter_context(k.dtype_policy(opts.policy))
        if builder is not None:
            try:
                model = builder(**opts.builder_args)
            except TypeError as err:
                raise UsageError(f"builder {opts.builder} rejected its arguments ({err})",
                                 "check --builder-arg / [builder_args]") from err
        else:
            config_path = Path(opts.model_config)
            if not config_path.is_file():
                raise UsageError(f"--model-config {config_path} does not exist", "pass the model.json saved with model.to_json()")
            text = config_path.read_text()
            try:  # model.to_json() records the Keras that wrote it
                keras = wanted or KERASES.get(str(json.loads(text).get("keras_version", "")).split(".")[0]) or keras
            except (ValueError, AttributeError):
                pass  # not JSON: model_from_json says so below
            own, other = _objects_for(keras, custom)
            try:
                model = keras.model_from_json(text, own)
            except Exception as err:
                missing = unresolved_classes(json.loads(text), own, keras)
                if missing:
                    raise _missing_object_error(config_path, missing, keras, other) from err
                raise UsageError(f"could not build a model from {config_path} ({err})",
                                 "pass a config written by model.to_json()") from err
    if not keras_of(model).is_model(model):
        raise UsageError(f"{opts.builder or opts.model_config} did not give a Keras model (a Keras 3 keras.Model or "
                         f"a tf.keras 2 tf_keras.Model) but {type(model).__module__}.{type(model).__qualname__}",
                         "return the model from the builder")
    if wanted is not None and keras_of(model) is not wanted:
        raise UsageError(f"{opts.src} was written by {wanted} (or --keras says so), but {opts.builder or opts.model_config}"
                         f" gave a {keras_of(model)} model, whose weights are named differently",
                         mismatch_remedy(wanted))
    if not model.built:
        raise UsageError(f"the model from {opts.builder or opts.model_config} is not built, so it has no weights to restore",
                         "build it in the builder (call it on an input or use keras.Input)")
    return model


def _checkpoint_prefix(src: str) -> str:
    tf = import_tf()
    path = Path(src)
    if not path.is_dir():
        return src
    prefix = tf.train.latest_checkpoint(str(path))
    if prefix:
        return prefix
    indexes = sorted(path.glob("*.index"))
    if len(indexes) == 1:
        return str(indexes[0])[: -len(".index")]
    raise UsageError(f"{src} has no `checkpoint` file and {len(indexes)} *.index files",
                     "pass the checkpoint prefix itself, e.g. ckpt/ckpt-3")


def _check_shards(prefix: str) -> None:
    """A checkpoint is `<prefix>.index` plus every `<prefix>.data-NNNNN-of-MMMMM`: a missing shard is an incomplete
    copy, not a misfit between checkpoint and architecture."""
    parent, name = Path(prefix).parent, Path(prefix).name
    shards = [p.name for p in parent.glob(f"{name}.data-*-of-*")]
    totals = {int(m.group(2)) for s in shards if (m := re.fullmatch(re.escape(name) + r"\.data-(\d+)-of-(\d+)", s))}
    total = max(totals) if totals else 1
    expected = [f"{name}.data-{i:05d}-of-{total:05d}" for i in range(total)]
    missing = [s for s in expected if s not in shards]
    if missing:
        raise UsageError(f"checkpoint {prefix} is incomplete: data shard(s) {', '.join(missing[:4])}"
                         f"{' and more' if len(missing) > 4 else ''} missing in {parent}",
                         "copy the whole checkpoint: the .index file and every .data-NNNNN-of-MMMMM file")


def _restore_checkpoint(model, src: str) -> None:
    tf = import_tf()
    prefix = _checkpoint_prefix(src)
    _check_shards(prefix)
    # model.save_weights(prefix) makes the model the root object, tf.train.Checkpoint(model=m).save() does not.
    # read(), not restore(): restore() would add the Checkpoint's own save_counter, which write() and
    # save_weights do not store, to the objects that must match
    root = tf.train.Checkpoint(root=model) if read_checkpoint(prefix + ".index").model_is_root \
        else tf.train.Checkpoint(model=model)
    try:
        status = root.read(prefix)
        status.assert_existing_objects_matched()
        status.expect_partial()
    except (AssertionError, ValueError, tf.errors.OpError) as err:
        text = str(err)
        names = re.findall(r"path=([^\s,>\]]+)", text) or re.findall(r"'([\w/.:]+)'", text)
        detail = f"variables that did not match: {', '.join(names[:8])}" if names else text.splitlines()[0][:300]
        if len(names) > 8:
            detail += f" and {len(names) - 8} more"
        raise UsageError(f"checkpoint {prefix} does not fit the model's architecture ({detail})",
                         "rebuild the model exactly as it was trained (same --builder and --builder-arg values, "
                         "same --policy), or pass the matching checkpoint") from err


def _restore_weights(model, src: str) -> None:
    """Keras' own load_weights, given the file under a name that makes it read the file as what it holds: Keras
    picks its reader by the suffix. Weights by layer (and a full model's) load in layer order, as tf_keras and
    Keras 3 load any .h5 (the reader checks layer and weight counts and shapes), unless the file names them in
    another order than the model's (_reordered_by_name)."""
    content = h5_content(src)
    if content is not None and content.kind is None:
        raise UsageError(*neither_message(src, content))
    damaged = _damaged_file(Path(src), "weights") if content is None and Path(src).is_file() else None
    if damaged:
        raise UsageError(damaged, "the copy is incomplete or damaged: copy the weights file again, or save it again "
                                  "with model.save_weights(...)")
    with keras_readable(src, content.kind) if content else contextlib.nullcontext(src) as readable:
        try:
            if not (content and content.kind in (LAYER_WEIGHTS, MODEL) and _reordered_by_name(model, src)):
                model.load_weights(readable)
        except (ValueError, KeyError, OSError) as err:
            what = f", {content.describe()}," if content else ""
            raise UsageError(f"weights file {src}{what} does not fit the model's architecture "
                             f"({_error_text(err, readable, src)})",
                             "rebuild the model exactly as it was trained (same --builder/--builder-arg or "
                             "--model-config)") from err
    if content is not None and content.kind == SAVING_LIB_WEIGHTS:  # its reader skips entries the model lacks
        _check_weights_file_consumed(model, src)


def _reordered_by_name(model, src: str) -> bool:
    """Keras reads weights by layer in order: within a layer, trainable weights first (`_legacy_weights`). A model
    saved with part of a layer frozen (fine-tuning a transformer with its lower blocks frozen) stores those weights
    last, and in order they would land in their neighbours, silently when the shapes agree; Hugging Face's own
    loader matches them by name. When the file names each layer's weights as the model does (the first scope, the
    model's own name, aside) but in another order, assign them by name and return True; otherwise (the same
    order, or names that say nothing, as Keras 3's or renamed layers') return False: Keras' reader loads the file."""
    import h5py

    def text(name) -> str:
        return name.decode() if isinstance(name, bytes) else str(name)

    def scoped(name: str) -> str:
        return name.split("/", 1)[-1]

    layers = [layer for layer in model.layers if layer.weights]
    with h5py.File(src, "r") as f:
        group = f if "layer_names" in f.attrs else f["model_weights"]
        saved = [(text(n), [text(w) for w in group[text(n)].attrs.get("weight_names", [])])
                 for n in group.attrs["layer_names"]]
        saved = [(n, names) for n, names in saved if names]
        if len(saved) != len(layers):
            return False  # Keras' reader says what does not fit
        pairs, reordered = [], False
        for layer, (layer_name, names) in zip(layers, saved):
            variables = layer.trainable_weights + layer.non_trainable_weights
            own, theirs = [scoped(v.name) for v in variables], [scoped(n) for n in names]
            if sorted(own) != sorted(theirs) or len(set(own)) != len(own):
                return False
            reordered |= own != theirs
            stored = dict(zip(theirs, names))
            pairs += [(v, layer_name, stored[key]) for v, key in zip(variables, own)]
        if not reordered:
            return False  # names only (a weights file can be large): Keras' reader loads it
        for variable, layer_name, name in pairs:
            value = group[layer_name][name][()]
            if tuple(variable.shape) != value.shape:
                raise ValueError(f"layer {layer_name}: {variable.name} has shape {tuple(variable.shape)}, the "
                                 f"file's {value.shape}")
            variable.assign(value)
    return True


def model_policy(model) -> str:
    """The policy the layers compute under: a mixed policy on any layer wins over the model's own float32."""
    names = [layer.dtype_policy.name for layer in keras_of(model).layers_of(model)
             if hasattr(layer, "dtype_policy")]
    mixed = [n for n in names if n.startswith("mixed_")]
    if mixed:
        return max(set(mixed), key=mixed.count)
    return model.dtype_policy.name


def load_source(opts: SourceOptions) -> LoadedModel:
    fmt = source_format(opts)
    # The source's digest is taken beside the TensorFlow import and the load (file reads and hashlib release the
    # GIL): after them, it added 0.9 s to the export of a 1 GB .keras. Not for a FIFO or a device, whose read could
    # block or never end: the checks refuse those first.
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sha256") as pool:
        digest = None if path_problem(opts.src) else pool.submit(sha256_of, opts.src)
        # before TensorFlow: tf.keras in the user's modules means the source's Keras
        wanted = prepare_process(opts, fmt)
        import_tf()
        with python_path(opts.python_path):
            custom = import_custom_objects(opts.custom_objects)
            if fmt in FILE_FORMATS:
                path = Path(opts.src)
                check_path(path, "pass a regular .h5/.keras file")
                if not path.exists() or (fmt != "saved_model" and not path.is_file()):
                    raise UsageError(f"{opts.src} does not exist", "check the path of the model to export")
                model, custom = _load_with(_keras_for_file(opts, fmt, wanted, custom), path, fmt, opts, custom)
            else:
                model = _rebuild(opts, custom, wanted)
                with weights_must_restore(f"restoring {opts.src}"):
                    (_restore_checkpoint if fmt == "checkpoint" else _restore_weights)(model, opts.src)
        sha256 = digest.result() if digest else sha256_of(opts.src)
    return LoadedModel(model=model, format=fmt, path=storage.display(Path(opts.src).resolve()), sha256=sha256,
                       policy=model_policy(model), custom_objects=custom, keras=keras_of(model))
