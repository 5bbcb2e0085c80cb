"""The tf.keras 2 (tf_keras) corpus: models written the way their users write them, and the commands a user types
to export each one and verify the export against it (issue 30).

The models come from real training scripts under user/, one per way of writing Keras 2 code (a *flavour*), each
run once in a process of its own (`python train.py OUT`, as its users run it):

- `tf2x`:    TF 2.x-era code, `import tensorflow as tf; tf.keras...`, trained under TF_USE_LEGACY_KERAS=1;
- `tfkeras`: `import tf_keras as keras`, without the variable;
- `tf212`:   TF 2.12's own tf.keras (Keras 2.12), in the managed TF 2.12 environment (skipped when it is absent).

ecosystem.py writes the SavedModels TFX, TF Recommenders, YDF and a hub-holding tf_keras model export: they are
verified as they are (no export step), and TF Serving serves each one (Predict on serving_default).

An `Entry` is one source: its files, the user modules its commands put on --python-path, the flags a user passes
(only --custom-objects, --builder and, where the issue's example has it, --policy or --keras), the environment
the user runs exportkit in, and the expected verdict: export exits 0 and `verify --against SRC` exits 0. An entry
with `missing` set is also exported without its --custom-objects: exit 2 naming that class, with a fix line whose
flag then works.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
TF212_PYTHON = Path.home() / ".cache" / "exportkit" / "tf" / "2.12" / "bin" / "python"
LEGACY = {"TF_USE_LEGACY_KERAS": "1"}


@dataclass(frozen=True)
class Flavour:
    name: str
    env: dict  # the training script's environment (TF_USE_LEGACY_KERAS is unset unless given here)
    python: str = sys.executable
    what: str = ""


FLAVOURS = {f.name: f for f in (
    Flavour("tf2x", LEGACY, what="TF 2.x-era `tf.keras` code under TF_USE_LEGACY_KERAS=1"),
    Flavour("tfkeras", {}, what="`import tf_keras as keras`"),
    Flavour("tf212", {}, python=str(TF212_PYTHON), what="TF 2.12's tf.keras (Keras 2.12)"),
)}


@dataclass(frozen=True)
class Entry:
    name: str
    flavour: str
    format: str  # h5 | keras | checkpoint | weights | savedmodel
    source: str  # below the flavour's models/ directory
    flags: tuple[str, ...] = ()  # what the user passes besides SRC, -o and --python-path
    env: dict = field(default_factory=dict)  # the user's environment for exportkit (else TF_USE_LEGACY_KERAS unset)
    missing: str = ""  # the class an export without --custom-objects must name
    inputs: dict | None = None  # the export's signature inputs {name: dtype} (None: the model names none)
    policy: str = "float32"  # the dtype policy the export computes under
    reference: bool = False  # train.py recorded SRC.reference.npz (exportkit.record_reference): export uses it
    what: str = ""

    @property
    def keras(self) -> str:
        return "2.12" if self.flavour == "tf212" else "2.21"


F6 = {"features": "float32"}  # the ranker's and RMSNorm model's one input
MIXED = "mixed_float16"
ENTRIES = (
    # ---------------------------------------------------------------- TF 2.x-era code: tf.keras, legacy variable
    Entry("tf2x_ranker_mixed_h5", "tf2x", "h5", "ranker_mixed.h5", ("--custom-objects", "ranker_layers"),
          missing="Scale", inputs=F6, policy=MIXED,
          what="the issue's model: functional, registered Scale (package ranker), mixed_float16 with a float32 "
               "head, one epoch; exported without the legacy variable (the file says Keras 2)"),
    Entry("tf2x_ranker_mixed_keras", "tf2x", "keras", "ranker_mixed.keras", ("--custom-objects", "ranker_layers"),
          env=LEGACY, missing="Scale", inputs=F6, policy=MIXED, reference=True,
          what="the same model as .keras, exported under TF_USE_LEGACY_KERAS=1"),
    Entry("tf2x_ranker_mixed_ckpt", "tf2x", "checkpoint", "ranker_mixed_ckpt",
          ("--builder", "ranker_models:build_ranker", "--policy", MIXED), env=LEGACY, inputs=F6, policy=MIXED,
          what="tf.train.Checkpoint(model=, optimizer=).save() of the mixed ranker, rebuilt by a tf.keras builder"),
    Entry("tf2x_ranker_ckpt_keras_flag", "tf2x", "checkpoint", "ranker_weights",
          ("--builder", "ranker_models:build_ranker", "--keras", "2"), inputs=F6,
          what="model.save_weights(prefix): a TF checkpoint of the model's own object graph; the builder is "
               "tf.keras code and no legacy variable is set, so --keras 2 says which Keras it means"),
    Entry("tf2x_ranker_weights_h5", "tf2x", "weights", "ranker.weights.h5",
          ("--builder", "ranker_models:build_ranker"), env=LEGACY, inputs=F6,
          what="model.save_weights('ranker.weights.h5') + the builder"),
    Entry("tf2x_ranker_savedmodel", "tf2x", "savedmodel", "ranker_savedmodel", ("--custom-objects", "ranker_layers"),
          inputs=F6, what="model.save(dir): a Keras 2 SavedModel (keras_metadata.pb), re-exported"),
    Entry("tf2x_subclassed_keras", "tf2x", "keras", "ranker_subclassed.keras", ("--custom-objects", "ranker_layers"),
          what="a subclassed tf.keras.Model with get_config, registered without a package (Custom>Ranker)"),
    Entry("tf2x_swish_sequential_keras", "tf2x", "keras", "swish_sequential.keras",
          ("--custom-objects", "custom_fns"), env=LEGACY, inputs={"x": "float32"},
          what="Sequential with an unregistered custom activation and layer, and a custom loss in compile"),
    Entry("tf2x_two_tower_keras", "tf2x", "keras", "two_tower.keras", ("--custom-objects", "ranker_layers"),
          inputs={"user": "float32", "item": "float32"},
          what="dict inputs {user, item}; the project's layer module is passed though this model uses none of it"),
    Entry("tf2x_colour_lookup_keras", "tf2x", "keras", "colour_lookup.keras", env=LEGACY,
          inputs={"colour": "string"}, what="a string input through StringLookup(output_mode='one_hot')"),
    Entry("tf2x_hub_h5", "tf2x", "h5", "hub_classifier.h5", ("--custom-objects", "tensorflow_hub"), inputs=F6,
          what="hub.KerasLayer over a TF2 hub module (a tf.Module) built locally"),
    # ------------------------------------------------------------------------------ import tf_keras as keras
    Entry("tfkeras_residual_h5", "tfkeras", "h5", "residual.h5", ("--custom-objects", "blocks"),
          missing="ResidualBlock", inputs={"x": "float32"}, reference=True,
          what="functional with an unregistered layer that owns sublayers"),
    Entry("tfkeras_residual_ckpt", "tfkeras", "checkpoint", "residual_ckpt", ("--builder", "zoo:residual"),
          inputs={"x": "float32"},
          what="a custom training loop's CheckpointManager over tf.train.Checkpoint(model=, optimizer=)"),
    Entry("tfkeras_residual_weights_h5", "tfkeras", "weights", "residual.weights.h5", ("--builder", "zoo:residual"),
          inputs={"x": "float32"}, what="model.save_weights('residual.weights.h5') + the builder"),
    Entry("tfkeras_gated_sequential_keras", "tfkeras", "keras", "gated_sequential.keras",
          ("--custom-objects", "blocks"), missing="Gate",
          what="Sequential with a layer registered without a package (Custom>Gate)"),
    Entry("tfkeras_towers_subclassed_keras", "tfkeras", "keras", "towers_subclassed.keras",
          ("--custom-objects", "blocks"), what="a subclassed model with get_config, registered in package towers"),
    Entry("tfkeras_gated_mixed_keras", "tfkeras", "keras", "gated_mixed.keras", ("--custom-objects", "blocks"),
          inputs={"signal": "float32"}, policy=MIXED, what="mixed_float16 with a float32 softmax head, one epoch"),
    Entry("tfkeras_gated_mixed_weights_h5", "tfkeras", "weights", "gated_mixed.weights.h5",
          ("--builder", "zoo:gated", "--policy", MIXED), inputs={"signal": "float32"}, policy=MIXED,
          what="its .weights.h5 + the builder"),
    Entry("tfkeras_sentiment_savedmodel", "tfkeras", "savedmodel", "sentiment_savedmodel",
          inputs={"review": "string"},
          what="a string input through an adapted TextVectorization (its vocabulary), model.save(dir)"),
    Entry("tfkeras_hub_keras", "tfkeras", "keras", "hub_regressor.keras", ("--custom-objects", "tensorflow_hub"),
          inputs=F6, what="hub.KerasLayer over a tf_keras model saved with tf.saved_model.save"),
    # ------------------------------------------------------------------------------------- TF 2.12's Keras
    Entry("tf212_norm_h5", "tf212", "h5", "norm_212.h5", ("--custom-objects", "norm_layers"), inputs=F6,
          what="written by TF 2.12's tf.keras: a registered RMSNorm (package legacy)"),
    Entry("tf212_norm_keras", "tf212", "keras", "norm_212.keras", ("--custom-objects", "norm_layers"), inputs=F6,
          what="the same saved as model.save('norm_212.keras'): Keras 2.12 writes HDF5 under that name (its zip "
               "format needs save_format='keras_v3'), and tf_keras 2.21 loads it"),
    Entry("tf212_norm_savedmodel", "tf212", "savedmodel", "norm_212_savedmodel", ("--custom-objects", "norm_layers"),
          inputs=F6, what="the same, as Keras 2.12's SavedModel (model.save(dir))"),
)

ECOSYSTEM = ("tfx_trainer", "tfrs_bruteforce", "ydf_gbt", "hub_keras")


@dataclass(frozen=True)
class Built:
    """An entry built under `root`: the paths and command lines."""

    entry: Entry
    root: Path

    @property
    def src(self) -> Path:
        return self.root / self.entry.flavour / "models" / self.entry.source

    @property
    def user_dir(self) -> Path:  # the user's modules, for --python-path
        return self.root / self.entry.flavour / "code"

    def source_args(self, drop_custom_objects: bool = False) -> list[str]:
        flags = list(self.entry.flags)
        if drop_custom_objects:
            at = flags.index("--custom-objects")
            del flags[at:at + 2]
        return [str(self.src), "--python-path", str(self.user_dir), *flags]

    def export_args(self, out: Path, drop_custom_objects: bool = False) -> list[str]:
        src, *rest = self.source_args(drop_custom_objects)
        return ["export", src, "-o", str(out), *rest]

    def verify_args(self, out: Path) -> list[str]:
        src, *rest = self.source_args()
        return ["verify", str(out), "--against", src, *rest]

    def env(self) -> dict:
        """The environment the user runs exportkit in."""
        return user_env(self.entry.env)

    def command_line(self, out: Path | str = "OUT") -> str:
        prefix = "".join(f"{k}={v} " for k, v in self.entry.env.items())
        return prefix + "exportkit " + shlex.join(self.export_args(Path(out)))


def user_env(extra: dict | None = None) -> dict:
    """This environment without TF_USE_LEGACY_KERAS or PYTHONPATH (whatever the test run has), TF quiet, plus
    `extra`: the environment a user's command runs in."""
    base = {k: v for k, v in os.environ.items() if k not in ("TF_USE_LEGACY_KERAS", "PYTHONPATH")}
    return {**base, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONWARNINGS": "ignore", **(extra or {})}


def available_flavours() -> list[str]:
    return [name for name, f in FLAVOURS.items() if Path(f.python).exists()]


def _run(python: str, script: Path, out: Path, cwd: Path, env: dict) -> None:
    proc = subprocess.run([python, str(script), str(out)], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env=user_env(env))
    if proc.returncode:
        raise RuntimeError(f"{script} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")


def build_flavour(root: Path, flavour: str) -> Path:
    """Copy the flavour's user code to ROOT/FLAVOUR/code and run its train.py there (one process)."""
    spec = FLAVOURS[flavour]
    code, models = root / flavour / "code", root / flavour / "models"
    shutil.copytree(HERE / "user" / flavour, code, ignore=shutil.ignore_patterns("__pycache__"))
    models.mkdir(parents=True)
    _run(spec.python, code / "train.py", models, code, spec.env)
    return models


def build_ecosystem(root: Path) -> dict[str, Path]:
    """ROOT/ecosystem/NAME: each a model base directory TF Serving can be pointed at."""
    out = root / "ecosystem"
    out.mkdir(parents=True)
    _run(sys.executable, HERE / "ecosystem.py", out, out, LEGACY)
    return {name: out / name for name in ECOSYSTEM}


def build_all(root: Path, flavours: list[str] | None = None) -> list[Built]:
    """Every available flavour's models (one process each); the entries built."""
    flavours = flavours or available_flavours()
    for flavour in flavours:
        build_flavour(root, flavour)
    return [Built(entry, root) for entry in ENTRIES if entry.flavour in flavours]
