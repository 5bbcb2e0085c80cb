"""SavedModels the way TF Serving's own test models are written (tf.compat.v1 graphs + SavedModelBuilder, inputs of
unknown shape, serialized tf.Example inputs, classify/regress method names, two versions), and a REST server over
them in this process. Shared by the REST conformance tests and the hostile-client tests."""
from __future__ import annotations

import http.client
import json
from pathlib import Path

MODEL = "half_plus_two"


def build_version(tf, version_dir: Path, offset: float) -> None:
    """y = 0.5 * x + offset on a float input of unknown rank, the same over Examples (regress and classify), plus
    string inputs, two named inputs of different dtypes and a signature with no inputs."""
    v1 = tf.compat.v1
    sig = v1.saved_model.signature_def_utils.build_signature_def
    info = v1.saved_model.utils.build_tensor_info
    graph = tf.Graph()
    with graph.as_default(), v1.Session(graph=graph) as session:
        a = v1.Variable(0.5, name="a")
        b = v1.Variable(offset, name="b")
        x = v1.placeholder(tf.float32, shape=None, name="x")  # no shape at all, as half_plus_two's
        y = tf.add(a * x, b, name="y")
        serialized = v1.placeholder(tf.string, shape=[None], name="tf_example")
        features = v1.io.parse_example(serialized, {"x": v1.io.FixedLenFeature([1], tf.float32)})
        y_examples = tf.identity(a * features["x"] + b, name="y_examples")
        text = v1.placeholder(tf.string, shape=[None], name="text")
        ints = v1.placeholder(tf.int32, shape=[None, None], name="ints")
        double = v1.placeholder(tf.float64, shape=[None], name="double")
        signatures = {
            "serving_default": sig({"x": info(x)}, {"y": info(y)}, "tensorflow/serving/predict"),
            "regress_x_to_y": sig({"inputs": info(serialized)}, {"outputs": info(y_examples)},
                                  "tensorflow/serving/regress"),
            "classify_x_to_y": sig({"inputs": info(serialized)}, {"scores": info(y_examples)},
                                   "tensorflow/serving/classify"),
            "strings": sig({"text": info(text)}, {"length": info(tf.strings.length(text)),
                                                   "echo_bytes": info(tf.identity(text))},
                           "tensorflow/serving/predict"),
            "two_inputs": sig({"ints": info(ints), "text": info(text)},
                              {"sum": info(tf.reduce_sum(ints, axis=1)), "length": info(tf.strings.length(text))},
                              "tensorflow/serving/predict"),
            "double": sig({"double": info(double)}, {"third": info(double / 3.0)}, "tensorflow/serving/predict"),
            "no_inputs": sig({}, {"seven": info(tf.constant(7.0))}, "tensorflow/serving/predict"),
        }
        session.run(v1.global_variables_initializer())
        builder = v1.saved_model.Builder(str(version_dir))
        builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map=signatures)
        builder.save()


def build_model(tf, base: Path) -> Path:
    """Version 1: y = 0.5x + 2 (half plus two), version 2: y = 0.5x + 3."""
    for version, offset in ((1, 2.0), (2, 3.0)):
        build_version(tf, base / MODEL / str(version), offset)
    return base / MODEL


_BUILT: dict[str, Path] = {}


def shared_model_base(tmp_path_factory) -> Path:
    """The model, built once per test session whichever module asks first (TensorFlow is imported then)."""
    if "base" not in _BUILT:
        from exportkit.tfenv import import_tf

        _BUILT["base"] = build_model(import_tf(), tmp_path_factory.mktemp("rest_models"))
    return _BUILT["base"]


def serve_in_process(model_base: Path, **limits):
    """A ServerCore over both versions and its REST server on a free port: (server, port, versions)."""
    from exportkit.savedmodel.versions import resolve_model_path
    from exportkit.serving.server.http_handler import start_rest
    from exportkit.serving.server.http_server import Limits
    from exportkit.serving.server.servable import ServedModel
    from exportkit.serving.server.server_core import ServerCore

    versions = []
    for version_dir in sorted(model_base.iterdir()):
        served = ServedModel(resolve_model_path(str(version_dir)), MODEL, "cpu")
        served.load()
        assert served.state == "AVAILABLE", served.error
        versions.append(served)
    server, port = start_rest(ServerCore(versions), 0, limits=Limits(**limits))
    return server, port, versions


def call(port: int, method: str, path: str, body=None, headers=None, timeout: float = 30) -> tuple[int, dict, str]:
    """(status, headers, body text) of one request on a fresh connection."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read().decode("utf-8", "replace")
    finally:
        connection.close()
