"""REST path benchmark: a batch of 96x96x3 float32 images (8: ~4.7 MB of JSON) through `exportkit serve`'s REST API
in this process, and the JSON parsers on the same body.

    python benchmarks/rest_bench.py [--runs 7] [--batch 8] [--out DIR]

Prints the median wall time per Predict call (client send -> answer read, one connection per call, as verify's
REST runtime makes them): with a json.dumps body (what most clients send), and through exportkit's RestClient as
verify's rest runtime calls it (float32 in the fixed-width layout where the checkout has it); and per parse of the
json.dumps body: json (stdlib), python-rapidjson as exportkit calls it (NM_NATIVE: rapidjson's own number parsing,
as TF Serving's), python-rapidjson with Python's float parsing; and the server's read of the fixed-width body.
The model is a tf.compat.v1 graph (mean over each image), so the time is the REST path's, not the model's.
Run it with PYTHONPATH pointing at another checkout to time that checkout's server on the same machine.
"""
from __future__ import annotations

import argparse
import http.client
import json
import tempfile
from pathlib import Path

from harness import median_seconds


def build(tf, version_dir: Path) -> None:
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default(), v1.Session(graph=graph) as session:
        images = v1.placeholder(tf.float32, shape=[None, 96, 96, 3], name="images")
        mean = tf.reduce_mean(images, axis=[1, 2], name="mean")
        info = v1.saved_model.utils.build_tensor_info
        signature = v1.saved_model.signature_def_utils.build_signature_def(
            {"images": info(images)}, {"mean": info(mean)}, "tensorflow/serving/predict")
        builder = v1.saved_model.Builder(str(version_dir))
        builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map={"serving_default": signature})
        builder.save()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--out", default=None, help="where to write the model (default: a temporary directory)")
    args = parser.parse_args()

    import inspect

    import numpy as np
    import rapidjson

    from exportkit.savedmodel.versions import resolve_model_path
    from exportkit.serving.server.http_handler import start_rest
    from exportkit.serving.client.rest_client import RestClient
    from exportkit.serving.server.servable import ServedModel
    from exportkit.serving.server.server_core import ServerCore
    from exportkit.tfenv import import_tf

    tf = import_tf()
    with tempfile.TemporaryDirectory() as scratch:
        version_dir = Path(args.out or scratch) / "images" / "1"
        if not version_dir.exists():
            build(tf, version_dir)
        served = ServedModel(resolve_model_path(str(version_dir)), "images", "cpu")
        served.load()
        server, port = start_rest(ServerCore([served]), 0)
        batch = np.random.default_rng(0).random((args.batch, 96, 96, 3), dtype=np.float32)
        body = json.dumps({"instances": batch.tolist()}).encode("utf-8")

        def predict():
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            connection.request("POST", "/v1/models/images:predict", body=body,
                               headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            answer = response.read()
            connection.close()
            assert response.status == 200, answer[:300]
            got = np.array(json.loads(answer)["predictions"], dtype=np.float32)
            np.testing.assert_allclose(got, batch.mean(axis=(1, 2)), rtol=1e-5)

        client = RestClient(f"127.0.0.1:{port}", "images", timeout=120)
        typed = "input_dtypes" in inspect.signature(client.predict).parameters  # not in a checkout before it

        def client_predict():
            extra = {"input_dtypes": {"images": "float32"}} if typed else {}
            got = client.predict({"images": batch}, {"mean": "float32"}, **extra)["mean"]
            np.testing.assert_allclose(got, batch.mean(axis=(1, 2)), rtol=1e-5)

        predict()  # warm-up
        client_predict()
        rows = [("REST Predict, json.dumps body", median_seconds(predict, args.runs)),
                ("REST Predict, RestClient", median_seconds(client_predict, args.runs)),
                ("parse: json.loads", median_seconds(lambda: json.loads(body), args.runs)),
                ("parse: rapidjson NM_NATIVE", median_seconds(
                    lambda: rapidjson.loads(body.decode(), number_mode=rapidjson.NM_NATIVE | rapidjson.NM_NAN),
                    args.runs)),
                ("parse: rapidjson, Python floats", median_seconds(lambda: rapidjson.loads(body.decode()), args.runs))]
        try:
            from exportkit.serving.json.fixed import fixed_json, parse_fixed_body
        except ImportError:  # a checkout before the fixed-width layout
            pass
        else:
            fixed = fixed_json(batch, b'{"instances":', b"}")
            rows.append(("parse: fixed-width, numpy", median_seconds(lambda: parse_fixed_body(fixed), args.runs)))
        server.shutdown()
        server.server_close()
        served.close()
    print(f"body: {len(body) / 1e6:.2f} MB, median of {args.runs} runs")
    for name, seconds in rows:
        print(f"  {name:34s} {seconds * 1e3:8.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
