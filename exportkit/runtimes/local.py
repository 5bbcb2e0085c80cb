"""In-process runtimes: the golden record, eager Keras from the training source, and tf.saved_model.load (which
verify runs in the TensorFlow worker process, exportkit.runtimes.session_worker)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from exportkit.errors import CheckFailed, InfraError, UsageError
from exportkit.runtimes import Runtime
from exportkit.savedmodel.loader import failure_message


def require_gpu() -> None:
    """A visible GPU, taking its memory as needed (memory growth, before anything initializes it): the GPU worker or
    server of the same run shares it."""
    from exportkit.tfenv import gpu_memory_growth, import_tf

    gpu_memory_growth()
    if not import_tf().config.list_logical_devices("GPU"):
        raise InfraError("--device gpu, but TensorFlow sees no GPU",
                         "run on a machine with a GPU and `pip install 'exportkit[gpu]'`, or use --device cpu")


def tf_device(device: str | None) -> str | None:
    """`cpu`/`gpu` -> a TF device string; `gpu` without a visible GPU is an infrastructure failure."""
    if device in (None, "cpu"):
        return "/CPU:0" if device else None
    if device == "gpu":
        require_gpu()
        return "/GPU:0"
    if device.startswith("/"):
        return device  # an explicit TF device string, e.g. a logical device in tests
    raise UsageError(f"unknown device {device!r}", "use --device cpu, gpu or all")


def placement(tensors) -> str | None:
    """Where the outputs were computed, e.g. "cpu:0" or "gpu:0", from the eager tensors' devices."""
    devices = sorted({t.device.rpartition("device:")[2].lower() for t in tensors if getattr(t, "device", "")})
    return ",".join(devices) or None


class GoldenRuntime(Runtime):
    """Recorded outputs for recorded inputs only: `golden` (eager Keras at export time) or `trained` (the
    training-time reference, exportkit.record_reference)."""

    name = "golden"
    kind = "recorded"

    def __init__(self, inputs: list[dict], outputs: list[dict], name: str = "golden"):
        self.name = name
        self.record(inputs, outputs)

    def record(self, inputs: list[dict], outputs: list[dict]) -> None:
        """The record to answer from (one signature's)."""
        self._answers = list(zip(inputs, outputs))

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        for recorded_inputs, recorded_outputs in self._answers:
            if recorded_inputs.keys() == inputs.keys() and all(
                    np.array_equal(recorded_inputs[k], inputs[k]) for k in inputs):
                return recorded_outputs
        return None  # not a golden batch: nothing recorded to compare


class SavedModelRuntime(Runtime):
    """`tf.saved_model.load` and the signature's concrete function (the TF2 way of loading)."""

    name = "saved_model"
    kind = "in-process"

    def __init__(self, path: str, signature_name: str, input_dtypes: dict[str, str], device: str | None = "cpu"):
        self.path = str(Path(path).resolve())
        self.signature_name = signature_name
        self.input_dtypes = input_dtypes
        self.device = device
        self._fn = None

    def load(self) -> None:
        self.load_model()
        self._select()

    def load_model(self) -> None:
        """Load, without choosing a signature yet (the worker loads before it is told which one)."""
        import tensorflow as tf

        with tf.device(tf_device(self.device)):
            try:
                self._loaded = tf.saved_model.load(self.path)
            except Exception as err:
                raise CheckFailed(f"tf.saved_model.load failed: {failure_message(err)}",
                                  "this is TF2's loader: where the session runtime (TF Serving's TF1 loader) "
                                  "loads the model, only TF2 users are affected; else the SavedModel is damaged "
                                  "or needs ops this TensorFlow lacks") from err
        self.loaded = True

    def _select(self) -> None:
        if self.signature_name not in self._loaded.signatures:
            from exportkit.savedmodel.signature_defs import signature_names

            raise CheckFailed(f"no signature '{self.signature_name}' (available: "
                              f"{', '.join(signature_names(self._loaded.signatures)) or 'none'})",
                              "pass --signature with one of them")
        self._fn = self._loaded.signatures[self.signature_name]

    def use_signature(self, name: str, input_dtypes: dict[str, str]) -> None:
        self.signature_name, self.input_dtypes = name, input_dtypes
        if self.loaded:
            self._select()

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import tensorflow as tf

        with tf.device(tf_device(self.device)):
            feed = {k: tf.constant(v, dtype=tf.as_dtype(self.input_dtypes[k])) for k, v in inputs.items()}
            outputs = self._fn(**feed)
        self.placed_on = placement(outputs.values())
        return {k: v.numpy() for k, v in outputs.items()}

    def close(self) -> None:
        self._fn = self._loaded = None
        self.loaded = False


class KerasRuntime(Runtime):
    """Eager Keras rebuilt from the training source (`--against`), outputs cast to the signature's dtypes."""

    name = "keras"
    kind = "in-process"

    def __init__(self, source_options, output_dtypes: dict[str, str], device: str | None = "cpu",
                 output_names: list[str] | None = None):
        self.source_options = source_options
        self.output_dtypes = output_dtypes
        self.output_names = output_names or None  # --output-names the export used (manifest)
        self.device = device
        self.select: dict[str, str] | None = None  # signature output key -> model output key (None: all)
        self._model = None

    def use_outputs(self, select: dict[str, str] | None, output_dtypes: dict[str, str]) -> None:
        """Answer with a signature's outputs: `select` maps its keys to the model's (a subset, renamed)."""
        self.select, self.output_dtypes = select, output_dtypes

    def load(self) -> None:
        from exportkit.sources.load import load_source

        self._model = load_source(self.source_options).model
        self.loaded = True

    @property
    def keras_package(self) -> str | None:
        """The Keras that loaded the source ("keras" or "tf_keras"), once loaded."""
        return type(self._model).__module__.split(".")[0] if self._model is not None else None

    def input_specs(self):
        """The model's inputs (after load), for callers that must build them, e.g. from tf.Example records."""
        from exportkit.sources.model_io import model_input_specs

        return model_input_specs(self._model, [])

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import tensorflow as tf

        from exportkit.sources.model_io import feed_model, keyed_outputs

        with tf.device(tf_device(self.device)):
            raw = keyed_outputs(self._model, feed_model(self._model, {k: tf.constant(v) for k, v in inputs.items()}),
                                self.output_names)
        if self.select is not None:
            raw = {key: raw[source] for key, source in self.select.items() if source in raw}
        self.placed_on = placement(list(raw.values()))
        outputs = {}
        for key, tensor in raw.items():
            want = self.output_dtypes.get(key)
            if want and want != "string" and tensor.dtype.name != want:
                tensor = tf.cast(tensor, want)
            outputs[key] = np.asarray(tensor)
        return outputs

    def close(self) -> None:
        self._model = None
        self.loaded = False
