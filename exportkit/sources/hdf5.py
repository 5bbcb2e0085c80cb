"""What an HDF5 file holds, read from its content (h5py, no TensorFlow), never from its name.

Keras writes three kinds of HDF5 file, and users call them anything (`tf_model.h5`, `weights.hdf5`, `model.weights.h5`):

- a full model, `model.save('m.h5')` in either Keras: a `model_config` attribute, the weights in `model_weights`;
- layer-by-layer weights, tf_keras `save_weights('w.h5')` (Hugging Face's `save_pretrained` writes `tf_model.h5` so;
  tf.keras before 2.13 wrote it even to `w.weights.h5`): a `layer_names` attribute and a group per layer whose
  `weight_names` attribute lists its weights, in the order the layer holds them;
- saving_lib weights, `save_weights('w.weights.h5')` in Keras 3 and tf_keras 2.13+: `layers/<name>/vars/<i>` and a
  top-level `vars` group (keras/src/saving/saving_lib.py, H5IOStore).

Both Kerases choose their weights reader by the file's suffix (`saving_api.load_weights`: `.weights.h5` means
saving_lib's layout, `.h5`/`.hdf5` the layer-by-layer one), so `keras_readable` presents a file under the suffix
that matches its content.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

MODEL = "model"
LAYER_WEIGHTS = "layer_weights"  # tf_keras save_weights('w.h5'), Hugging Face's tf_model.h5
SAVING_LIB_WEIGHTS = "saving_lib_weights"  # save_weights('w.weights.h5'), Keras 3 and tf_keras 2.13+
_SAVING_LIB_GROUPS = ("vars", "layers")


def is_hdf5(path) -> bool:
    try:
        import h5py

        return Path(path).is_file() and h5py.is_hdf5(str(path))
    except (OSError, ValueError):
        return False


@dataclass(frozen=True)
class H5Content:
    kind: str | None  # MODEL, LAYER_WEIGHTS, SAVING_LIB_WEIGHTS; None: neither a Keras model nor Keras weights
    groups: tuple[str, ...] = ()
    attrs: tuple[str, ...] = ()

    def describe(self) -> str:
        """What the file is, in the words its writer would use."""
        if self.kind == MODEL:
            return "a full Keras model (model.save(...) to .h5)"
        if self.kind == LAYER_WEIGHTS:
            return "Keras weights by layer (tf.keras save_weights(...) to .h5, or Hugging Face's tf_model.h5)"
        if self.kind == SAVING_LIB_WEIGHTS:
            return "Keras weights (save_weights(...) to .weights.h5)"

        def listed(names):
            return ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "") or "none"

        return f"an HDF5 file with groups {listed(self.groups)} and attributes {listed(self.attrs)}"


def h5_content(path) -> H5Content | None:
    """The kind of Keras file an HDF5 file is, from its top-level attributes and groups; None for a file that is
    not HDF5 or that h5py cannot read (truncated: loading it says so)."""
    import h5py

    if not is_hdf5(path):
        return None
    try:
        with h5py.File(str(path), "r") as f:
            attrs = tuple(sorted(f.attrs))
            groups = tuple(sorted(name for name, obj in f.items() if isinstance(obj, h5py.Group)))
            nested_layer_names = "model_weights" in groups and "layer_names" in f["model_weights"].attrs
    except OSError:
        return None
    if "model_config" in attrs:
        kind = MODEL
    elif "layer_names" in attrs or nested_layer_names:
        kind = LAYER_WEIGHTS
    elif any(g in groups for g in _SAVING_LIB_GROUPS):
        kind = SAVING_LIB_WEIGHTS
    else:
        kind = None
    return H5Content(kind, groups, attrs)


def neither_message(path, content: H5Content) -> tuple[str, str]:
    """(message, fix) for an HDF5 file that Keras wrote neither as a model nor as weights."""
    return (f"{path} is {content.describe()}: not a Keras model (no model_config attribute) nor Keras weights (no "
            f"layer_names attribute, no vars/layers groups)",
            "pass a file written by Keras: model.save('model.h5') or model.save('model.keras'), or weights from "
            "model.save_weights(...) with --builder module:function")


def _suffix_for(kind: str) -> str:
    return ".weights.h5" if kind == SAVING_LIB_WEIGHTS else ".h5"  # a full model's `model_weights`: by layer


def _read_as(name: str, kind: str) -> bool:
    """Keras' load_weights reads a file called `name` with the reader for `kind` (its suffix test is case-sensitive)."""
    if kind == SAVING_LIB_WEIGHTS:
        return name.endswith(".weights.h5")
    return name.endswith((".h5", ".hdf5")) and not name.endswith(".weights.h5")


@contextlib.contextmanager
def keras_readable(path, kind: str):
    """`path`, or a link to it in a temporary directory whose name makes Keras read it as `kind`."""
    if _read_as(Path(path).name, kind):
        yield str(path)
        return
    with tempfile.TemporaryDirectory(prefix="exportkit-h5-") as tmp:
        link = Path(tmp) / ("weights" + _suffix_for(kind))
        try:
            os.symlink(Path(path).resolve(), link)
        except OSError:  # no symlinks here: a copy
            shutil.copyfile(path, link)
        yield str(link)
