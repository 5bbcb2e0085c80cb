"""REST conformance with TF Serving: request/response cases shaped after http_rest_api_handler_test.cc (through the
HTTP server, on a two-version tf.compat.v1 model built here) and json_tensor_test.cc (the codec on its own).

Mirrored cases (TF Serving's -> here): http_rest_api_handler_test.cc 36 of its 40 requests (the 4 that read a
configured version label's answer need labels in the model config, serving-core's part; the unknown-label error is
here); json_tensor_test.cc 36 of its 38 TESTs (not: TensorFromNonNullTerminatedBuffer, a C++ buffer detail, and
MakeJsonFromStatus(OK) == "", which has no counterpart: an OK answer is the result's JSON). All mirrored cases match.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from rest_models import MODEL, call, serve_in_process, shared_model_base


PATH = f"/v1/models/{MODEL}"


@pytest.fixture(scope="module")
def rest(tmp_path_factory):
    server, port, versions = serve_in_process(shared_model_base(tmp_path_factory))
    yield port
    server.shutdown()
    server.server_close()
    for served in versions:
        served.close()


def _error(text: str) -> str:
    return json.loads(text)["error"]


# ------------------------------------------------------------------------------------------------ handler tests
@pytest.mark.slow
@pytest.mark.serving
@pytest.mark.parametrize("method,path,words", [
    # kPathRegex: /v1/... is the API's, anything else is not
    ("GET", "/statuspage", "Not found"), ("GET", "/index", "Not found"),
    # UnsupportedApiCalls
    ("GET", "/v1/foo", "Malformed request"), ("POST", "/v1/foo", "Malformed request"),
    ("GET", "/v1/models", "Missing model name"), ("GET", "/v1/models/debug/model_name", "Malformed request"),
    ("POST", "/v1/models", "Malformed request"), ("GET", "/v1/models/foo:predict", "Malformed request"),
    ("GET", "/v1/models/foo/version/50:predict", "Malformed request"),
    ("POST", "/v1/models/foo/version/50:regress", "Malformed request"),
    ("POST", "/v1/models/foo/versions/HELLO:regress", "Malformed request"),
    ("POST", f"/v1/models/foo/versions/{2 ** 64 - 1}:regress", "Failed to convert version"),
    ("POST", "/v1/models/foo/metadata", "Malformed request"),
    ("POST", "/v1/models/foo/label/some_label:regress", "Malformed request"),
    ("POST", "/v1/models/foo/versions/50/labels/some_label:regress", "Malformed request"),
    ("POST", "/v1/models/foo/versions/some_label:regress", "Malformed request"),
    # methods TF Serving's dispatcher passes to the handler, which has no route for them
    ("PUT", PATH, "Malformed request: PUT"), ("DELETE", PATH, "Malformed request: DELETE"),
    ("PATCH", f"{PATH}:predict", "Malformed request: PATCH"),
])
def test_unsupported_calls(rest, method, path, words):
    status, headers, body = call(rest, method, path, body=b"{}" if method != "GET" else None)
    assert status == (404 if words == "Not found" else 400)
    assert headers["Content-Type"] == "application/json"
    assert words in _error(body)


@pytest.mark.slow
@pytest.mark.serving
def test_version_not_a_number_is_refused_before_the_body_is_read(rest):
    """2^64-1 matches the URL's \\d+ but is no int64: 400 from the URL alone, the body (not JSON at all) unread."""
    status, _, body = call(rest, "POST", f"{PATH}/versions/{2 ** 63}:predict", body=b"not json")
    assert status == 400 and _error(body) == f"Failed to convert version: {2 ** 63} to numeric."
    status, _, body = call(rest, "POST", f"{PATH}/versions/{2 ** 63 - 1}:predict", body={"instances": [1.0]})
    assert status == 404 and "Servable not found" in _error(body)


@pytest.mark.slow
@pytest.mark.serving
@pytest.mark.parametrize("path", ["/v1/models/foo:predict", "/v1/models/foo/versions/50:predict",
                                  f"/v1/models/{MODEL}/versions/99:predict"])
def test_predict_model_name_version_errors(rest, path):
    status, _, body = call(rest, "POST", path, body={"instances": [1]})
    assert status == 404 and "Servable not found" in _error(body)


@pytest.mark.slow
@pytest.mark.serving
@pytest.mark.parametrize("path,body,words", [
    (f"{PATH}:predict", b"", "JSON Parse error: The document is empty"),
    (f"{PATH}:predict", b"instances = [1, 2]", "JSON Parse error: Invalid value. at offset: 0"),
    (f"{PATH}:predict", {"instances": ["x", "y"]}, "not of expected type: float"),
    (f"{PATH}/labels/nonexistent:predict", {"instances": ["x", "y"]}, "Unrecognized servable version label"),
    (f"{PATH}:predict", {"signature_name": 100}, "'signature_name' key must be a string value."),
    (f"{PATH}:predict", b'{"instances": [1.0,]}', "JSON Parse error: Invalid value. at offset: 19"),
    (f"{PATH}:predict", b'{"instances": [1.0]', "JSON Parse error: Missing a comma or '}' after an object member. "
                                                 "at offset: 19"),
    (f"{PATH}:predict", b'{"instances": [1e400]}', "JSON Parse error: Number too big to be stored in double."),
    (f"{PATH}:predict", b'{"instances": ["\xff"]}', "JSON Parse error: Invalid encoding in string."),
    (f"{PATH}:predict", [1, 2], "JSON Value: [1, 2] Is not object"),
])
def test_predict_request_errors(rest, path, body, words):
    status, _, text = call(rest, "POST", path, body=body)
    assert status == 400 and words in _error(text), text


@pytest.mark.slow
@pytest.mark.serving
@pytest.mark.parametrize("path,doc,expected", [
    (f"{PATH}:predict", {"instances": [[1.0, 2.0], [3.0, 4.0]]}, {"predictions": [[3.5, 4.0], [4.5, 5.0]]}),
    (f"{PATH}/versions/1:predict", {"instances": [1.0, 2.0]}, {"predictions": [2.5, 3.0]}),
    (f"{PATH}/versions/1:predict", {"signature_name": "serving_default", "instances": [3.0, 4.0]},
     {"predictions": [3.5, 4.0]}),
    (f"{PATH}/versions/1:predict", {"signature_name": "serving_default", "inputs": [3.0, 4.0]},
     {"outputs": [3.5, 4.0]}),
    # the signature's x has no shape: TF Serving feeds what the graph accepts, a scalar too
    (f"{PATH}/versions/1:predict", {"inputs": 4.0}, {"outputs": 4.0}),
    (f"{PATH}:regress", {"signature_name": "regress_x_to_y", "examples": [{"x": 80.0}]}, {"results": [43.0]}),
    (f"{PATH}/versions/1:regress", {"signature_name": "regress_x_to_y", "examples": [{"x": 80.0}]},
     {"results": [42.0]}),
    (f"{PATH}/versions/1:classify", {"signature_name": "classify_x_to_y", "examples": [{"x": 20.0}]},
     {"results": [[["", 12.0]]]}),
    (f"{PATH}:classify", {"signature_name": "classify_x_to_y", "examples": [{"x": 10.0}]},
     {"results": [[["", 8.0]]]}),
])
def test_predict_regress_classify(rest, path, doc, expected):
    status, headers, body = call(rest, "POST", path, body=doc)
    assert status == 200, body
    assert headers["Content-Type"] == "application/json" and json.loads(body) == expected


@pytest.mark.slow
@pytest.mark.serving
# Newest version first: ServableStateMonitor::VersionMap is ordered by std::greater (core/servable_state_monitor.h),
# and get_model_status_impl.cc answers in that order.
@pytest.mark.parametrize("path,versions", [(PATH, ["2", "1"]), (f"{PATH}/versions/1", ["1"])])
def test_get_status(rest, path, versions):
    status, _, body = call(rest, "GET", path)
    assert status == 200
    assert json.loads(body) == {"model_version_status": [
        {"version": v, "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}} for v in versions]}


@pytest.mark.slow
@pytest.mark.serving
def test_get_model_metadata(rest):
    status, _, body = call(rest, "GET", f"{PATH}/metadata")
    doc = json.loads(body)
    assert status == 200 and doc["model_spec"] == {"name": MODEL, "signature_name": "", "version": "2"}
    signatures = doc["metadata"]["signature_def"]["signature_def"]
    assert signatures["serving_default"]["inputs"]["x"] == {"dtype": "DT_FLOAT", "tensor_shape": {
        "dim": [], "unknown_rank": True}, "name": "x:0"}
    assert signatures["regress_x_to_y"]["method_name"] == "tensorflow/serving/regress"


# ------------------------------------------------------------------------------------------------ beyond the handler tests
@pytest.mark.slow
@pytest.mark.serving
def test_signature_with_no_inputs_is_refused_as_tf_serving_does(rest):
    status, _, body = call(rest, "POST", f"{PATH}:predict", body={"signature_name": "no_inputs", "instances": [1]})
    assert status == 400 and _error(body) == "Failed to get input map for signature: no_inputs"


@pytest.mark.slow
@pytest.mark.serving
def test_b64_that_is_not_an_example_is_invalid_argument(rest):
    for path, doc in [(f"{PATH}:predict", {"signature_name": "regress_x_to_y", "instances": [{"b64": "AP8="}]}),
                      (f"{PATH}:regress", {"signature_name": "regress_x_to_y", "examples": [{"x": {"b64": "AP8="}}]})]:
        status, _, body = call(rest, "POST", path, body=doc)
        assert status == 400 and _error(body), body


@pytest.mark.slow
@pytest.mark.serving
def test_strings_bytes_and_named_inputs(rest):
    status, _, body = call(rest, "POST", f"{PATH}:predict",
                           body={"signature_name": "strings", "instances": ["ab", {"b64": "AP8A"}]})
    assert status == 200 and json.loads(body) == {"predictions": [
        {"echo_bytes": {"b64": "YWI="}, "length": 2}, {"echo_bytes": {"b64": "AP8A"}, "length": 3}]}
    status, _, body = call(rest, "POST", f"{PATH}:predict", body={
        "signature_name": "two_inputs", "instances": [{"ints": [1, 2], "text": "x"}, {"ints": [3, 4], "text": "yz"}]})
    assert status == 200 and json.loads(body) == {"predictions": [{"length": 1, "sum": 3}, {"length": 2, "sum": 7}]}
    status, _, body = call(rest, "POST", f"{PATH}:predict",
                           body={"signature_name": "two_inputs", "inputs": {"ints": [[1, 2]]}})
    assert status == 400 and _error(body) == "Missing named input: text in 'inputs' object."


@pytest.mark.slow
@pytest.mark.serving
def test_floats_reach_clients_unrounded(rest):
    """float64 outputs in max_digits10 where 6 digits would not read back; a float32 input 0.1 stays 0.1."""
    status, _, body = call(rest, "POST", f"{PATH}:predict", body={"signature_name": "double", "inputs": [1.0, 0.1]})
    assert status == 200 and "0.33333333333333331" in body
    assert json.loads(body)["outputs"] == [1.0 / 3.0, 0.1 / 3.0]
    status, _, body = call(rest, "POST", f"{PATH}/versions/1:predict", body={"inputs": [0.1, 1e-8, 3e38]})
    got = np.array(json.loads(body)["outputs"], dtype=np.float32)
    np.testing.assert_array_equal(got, np.float32(0.5) * np.float32([0.1, 1e-8, 3e38]) + np.float32(2))


@pytest.mark.slow
@pytest.mark.serving
def test_deep_nesting_does_not_crash_the_parser(rest):
    """json_tensor_test DeeplyNestedWellFormed/Malformed through HTTP, and 990 levels inside a value."""
    deep = "[" * 100_000 + "]" * 100_000  # 500,000 levels: test_codec_deep_nesting
    status, _, body = call(rest, "POST", f"{PATH}/versions/1:predict",
                           body='{"instances": [1.0], "nested": ' + deep + "}", timeout=60)
    assert status == 200 and json.loads(body) == {"predictions": [2.5]}
    status, _, body = call(rest, "POST", f"{PATH}:predict", body='{"signature_name": ' + deep + "}", timeout=60)
    assert status == 400 and "key must be a string value" in _error(body)
    status, _, body = call(rest, "POST", f"{PATH}:predict",
                           body='{"instances": ' + "[" * 990 + "1.0" + "]" * 990 + "}")
    assert status == 400 and "rank 989" in _error(body)  # one level is the batch


# ------------------------------------------------------------------------------------------------ json_tensor tests
def _request(doc, infomap):
    """What the handler does: FillSignature, then the inputs."""
    from exportkit.serving.json.decode import fill_predict_request, signature_name
    from exportkit.serving.json.parse import parse_json

    parsed = parse_json((doc if isinstance(doc, str) else json.dumps(doc)).encode())
    return fill_predict_request(parsed, infomap, signature_name(parsed))


def _request_error(doc, infomap) -> str:
    from exportkit.serving.server.status import RpcError

    with pytest.raises(RpcError) as caught:
        _request(doc, infomap)
    assert caught.value.code.name == "INVALID_ARGUMENT"
    return caught.value.message


def test_codec_row_and_columnar_inputs():
    arrays, row = _request({"instances": [[1, 2], [3, 4], [5, 6]]}, {"default": "int32"})  # SingleUnnamedTensor
    assert row and arrays["default"].dtype == np.int32 and arrays["default"].tolist() == [[1, 2], [3, 4], [5, 6]]
    arrays, _ = _request({"instances": [1, 2.0, 3, 4, 5.003, 0.007, 0.0]}, {"default": "float32"})  # MixedInput..
    np.testing.assert_array_equal(arrays["default"], np.float32([1, 2, 3, 4, 5.003, 0.007, 0]))
    arrays, _ = _request({"instances": [1.0, 2, 0.662, 0]}, {"default": "float64"})
    assert arrays["default"].dtype == np.float64 and arrays["default"].tolist() == [1.0, 2.0, 0.662, 0.0]
    for doc in ('{"instances": [1435774380]}', '{"instances": [1435774380.0]}'):  # FloatTensorWithPrecisionLoss
        assert _request(doc, {"default": "float32"})[0]["default"][0] == np.float32(1435774380)
    high, low = float(np.finfo(np.float64).max), float(np.finfo(np.float64).tiny)
    big = _request(f'{{"instances": [{high!r}, {-high!r}, {low!r}, {-low!r}]}}', {"default": "float32"})[0]
    assert big["default"].tolist()[:2] == [math.inf, -math.inf] and big["default"].tolist()[2:] == [0.0, -0.0]
    assert math.copysign(1, big["default"][3]) == -1
    arrays, row = _request({"signature_name": "predict_images", "instances": [[1, 2]]}, {"default": "int32"})
    assert arrays["default"].shape == (1, 2)
    arrays, _ = _request({"instances": [{"b64": "aGVsbG8="}, {"b64": "d29ybGQ="}]}, {"default": "string"})
    assert arrays["default"].tolist() == [b"hello", b"world"]  # SingleUnnamedTensorBase64Scalars
    arrays, _ = _request({"instances": [[{"b64": "aGVsbG8="}], [{"b64": "d29ybGQ="}]]}, {"default": "string"})
    assert arrays["default"].shape == (2, 1)  # ..Base64Lists
    arrays, _ = _request({"instances": [{"default": [[{"b64": "aGVsbG8="}], [{"b64": "d29ybGQ="}]]}]},
                         {"default": "string"})
    assert arrays["default"].shape == (1, 2, 1)  # SingleNamedTensorBase64
    arrays, _ = _request('{"instances": [{"i": [[1,2]], "s": ["foo"], "f": [1.0, NaN], "d": [NaN]},'
                         '{"i": [[7,8]], "s": ["baz"], "f": [2.0, Infinity], "d": [2.0]}]}',
                         {"i": "int32", "s": "string", "f": "float32", "d": "float64"})  # MultipleNamedTensor
    assert arrays["i"].shape == (2, 1, 2) and arrays["s"].tolist() == [[b"foo"], [b"baz"]]
    assert np.isnan(arrays["f"][0, 1]) and arrays["f"][1, 1] == np.inf and arrays["d"].dtype == np.float64
    arrays, row = _request({"inputs": {"int_tensor": [[[1, 2], [3, 4], [5, 6]]]}}, {"int_tensor": "int32"})
    assert not row and arrays["int_tensor"].shape == (1, 3, 2)  # SingleUnnamedTensorColumnarFormat
    arrays, _ = _request({"inputs": [[[1, 2], [3, 4], [5, 6]]]}, {"int_tensor": "int32"})
    assert arrays["int_tensor"].shape == (1, 3, 2)
    arrays, _ = _request({"inputs": {"i": [[1, 2]], "s": "scalar", "extra": 1}}, {"i": "int32", "s": "string"})
    assert arrays["s"].shape == () and set(arrays) == {"i", "s"}  # MultipleNamedTensorColumnarFormat


@pytest.mark.slow
def test_codec_deep_nesting():
    deep = "[" * 500_000 + "]" * 500_000
    arrays, _ = _request('{"instances": [1], "nested": ' + deep + "}", {"default": "int32"})
    assert arrays["default"].tolist() == [1]  # DeeplyNestedWellFormed
    from exportkit.serving.json.decode import signature_name
    from exportkit.serving.json.parse import parse_json
    from exportkit.serving.server.status import RpcError

    with pytest.raises(RpcError, match="key must be a string value"):  # DeeplyNestedMalformed (100,000 levels)
        signature_name(parse_json(('{"signature_name": ' + "[" * 100_000 + "]" * 100_000 + "}").encode()))
    with pytest.raises(RpcError, match="Missing a comma or ']' after an array element. at offset: 2002"):
        parse_json(("[" * 2000 + "1 2" + "]" * 2000).encode())


@pytest.mark.parametrize("doc,infomap,words", [
    ("", {"d": "int32"}, "document is empty"),  # SingleUnnamedTensorErrors
    ({"signature_name": 5, "instances": [[1, 2], [3, 4], [5, 6, 7]]}, {"d": "int32"}, "must be a string value"),
    ({"instances": [[1, 2], [3, 4], [5, 6, 7]], "inputs": [[1, 2], [3, 4], [5, 6, 7]]}, {"d": "int32"},
     "Not formatted correctly"),
    ({"instances": [[1, 2], [3, 4], [5, 6, 7]]}, {"d": "int32"}, "Expecting tensor size"),
    ({"instances": [[1, 2], [3, 4], [[5, 6]]]}, {"d": "int32"}, "Expecting shape"),
    ({"instances": [1, [1]]}, {"d": "int32"}, "Expecting shape"),
    ({"instances": [[1, 2], ["a", "b"]]}, {"d": "int32"}, "not of expected type"),
    ({"instances": [{"i": [[1, 2], [3, 4]], "s": ["foo", "bar"]}, {"i": [[[7, 8], [9, 0]]], "s": ["baz", "bat"]}]},
     {"i": "int32", "s": "string"}, "Expecting shape"),  # MultipleNamedTensorErrors
    ({"instances": [{"i": [[1, 2], [3, 4], [5, 6]], "s": ["foo"]}, {"i": [[7, 8]], "s": ["baz"]}]},
     {"i": "int32", "s": "string"}, "Expecting tensor size"),
    ({"instances": [{"i": [[1, 2]], "s": ["foo"]}, [1, 20, 30]]}, {"i": "int32", "s": "string"},
     "Expecting object but got list"),
    ({"instances": [["baz", "bar"], {"s": ["baz", "bat"]}]}, {"s": "string"}, "Expecting value/list but got object"),
    ({"instances": [{"i": [1]}]}, {"i": "int32", "s": "string"}, "keys must be equal to: i,s"),
    ({"instances": [1.5]}, {"d": "int32"}, "JSON Value: 1.5 Type: Number is not of expected type: int32"),
    ({"instances": [2 ** 31]}, {"d": "int32"}, "is not of expected type: int32"),
    ({"instances": [{"b64": "!!"}]}, {"d": "string"}, "Unable to base64 decode"),
    ({"instances": [[{"b64": "AA==", "x": 1}]]}, {"d": "string"}, "not formatted correctly for base64 data"),
    ({"instances": []}, {"d": "int32"}, "No values in 'instances' array"),
    ({"examples": []}, {"d": "int32"}, "Missing 'inputs' or 'instances' key"),
])
def test_codec_input_errors(doc, infomap, words):
    assert words in _request_error(doc, infomap)


def test_codec_outputs():
    from exportkit.serving.json.encode import predict_json

    def both(outputs):
        return json.loads(predict_json(outputs, row=True)), json.loads(predict_json(outputs, row=False))

    ints = np.array([[[1, 2], [3, 4], [5, 6]], [[7, 8], [9, 0], [1, 2]]], dtype=np.int32)
    assert both({"t": ints}) == ({"predictions": ints.tolist()}, {"outputs": ints.tolist()})  # FromJsonSingleTensor
    assert both({"t": np.arange(1, 6, dtype=np.int32)})[0] == {"predictions": [1, 2, 3, 4, 5]}
    words = np.array([[b"hello", b"world"], [b"tf", b"serving"]], dtype=object)
    assert both({"s_bytes": words})[0] == {"predictions": [[{"b64": "aGVsbG8="}, {"b64": "d29ybGQ="}],
                                                           [{"b64": "dGY="}, {"b64": "c2VydmluZw=="}]]}
    floats = np.float32([[9000000, 999999, 0.5], [0.0003, 0.00003, 555557.5]])  # ..SixDigitPrecision
    assert "[9e+06, 999999.0, 0.5]" in predict_json({"f": floats}, row=True)
    assert "[0.0003, 3e-05, 555557.5]" in predict_json({"f": floats}, row=True)
    text = predict_json({"f": np.float32([[np.nan, np.inf], [3, -np.inf]])}, row=True)  # ..NonFinite
    assert "[NaN, Infinity]" in text and "[3.0, -Infinity]" in text
    named = {"i": ints, "s": np.array([[b"foo", b"bar"], [b"baz", b"bat"]], dtype=object),
             "f": np.float32([[1.0], [2.0]]), "d": np.float64([8.0, 9.0])}  # FromJsonMultipleNamedTensors
    row, columns = both(named)
    assert row["predictions"][1] == {"i": ints[1].tolist(), "s": ["baz", "bat"], "f": [2.0], "d": 9.0}
    assert columns["outputs"]["d"] == [8.0, 9.0] and columns["outputs"]["f"] == [[1.0], [2.0]]
    assert both({"z": np.zeros((0, 2), np.int32)})[0] == {"predictions": []}  # ..ZeroBatchTensor(s)
    assert both({"z": np.zeros((0, 1, 2)), "w": np.zeros((0, 3, 4))})[0] == {"predictions": []}
    from exportkit.serving.server.status import RpcError

    for outputs, words in [({}, "empty tensor map"), ({"t": np.int32(1)}, "no shape information"),
                           ({"a": np.zeros((2, 3)), "b": np.zeros((1, 3))}, "inconsistent batch size"),
                           ({"a": np.zeros((0, 2)), "b": np.zeros((1, 2))}, "inconsistent batch size"),
                           ({"c": np.complex64([1, 2])}, "tensor type: complex64")]:
        with pytest.raises(RpcError, match=words):
            predict_json(outputs, row=True)


def test_codec_classify_regress_results_and_status():
    from tensorflow_serving.apis import classification_pb2, regression_pb2

    from exportkit.serving.json.encode import classify_json, error_json, regress_json
    from exportkit.serving.server.status import RpcError

    result = classification_pb2.ClassificationResult()
    for labels in ((("car", 0.2), ("bike", 0.7)), (("car", 0.7), ("bike", 0.1))):
        classes = result.classifications.add()
        for label, score in labels:
            classes.classes.add(label=label, score=score)
    assert json.loads(classify_json(result)) == {"results": [[["car", 0.2], ["bike", 0.7]],
                                                             [["car", 0.7], ["bike", 0.1]]]}
    regressions = regression_pb2.RegressionResult()
    for value in (0.2, math.inf, 1.0, -math.inf, math.nan):
        regressions.regressions.add(value=value)
    assert regress_json(regressions) == '{\n    "results": [0.2, Infinity, 1.0, -Infinity, NaN]\n}'
    with pytest.raises(RpcError, match="empty ClassificationResults"):
        classify_json(classification_pb2.ClassificationResult())
    with pytest.raises(RpcError, match="empty RegressionResults"):
        regress_json(regression_pb2.RegressionResult())
    assert json.loads(error_json('Bad key: "key"')) == {"error": 'Bad key: "key"'}  # MakeJsonFromTensors Status*


def test_codec_examples():
    from tensorflow_serving.apis import classification_pb2, regression_pb2

    from exportkit.serving.json.decode import signature_name
    from exportkit.serving.json.examples import fill_example_input
    from exportkit.serving.json.parse import parse_json
    from exportkit.serving.server.status import RpcError

    doc = parse_json(b'{"signature_name": "custom", "context": {"query": "pizza", "location": ["sfo"]},'
                     b'"examples": [{"names": ["foo", "bar"], "ratings": [8.0, 9.0, NaN, Infinity], "age": 20},'
                     b'{"names": ["baz", {"b64": "aGVsbG8="}], "ratings": 6.0, "mix": [1, true, false]}]}')
    request = classification_pb2.ClassificationRequest()
    fill_example_input(doc, request.input)  # RequestWithContextAndSignature
    assert signature_name(doc) == "custom"
    with_context = request.input.example_list_with_context
    assert list(with_context.context.features.feature["location"].bytes_list.value) == [b"sfo"]
    first, second = (e.features.feature for e in with_context.examples)
    assert list(first["names"].bytes_list.value) == [b"foo", b"bar"] and list(first["age"].int64_list.value) == [20]
    assert list(second["names"].bytes_list.value) == [b"baz", b"hello"]
    assert list(second["mix"].int64_list.value) == [1, 1, 0] and list(second["ratings"].float_list.value) == [6.0]
    plain = regression_pb2.RegressionRequest()  # RequestNoContext (the typed tests run both request kinds)
    fill_example_input(parse_json(b'{"examples": [{"names": ["foo", "bar"], "ratings": [8.0, 9.0], "age": 20},'
                                  b'{"names": ["baz"], "ratings": 6.0}]}'), plain.input)
    assert plain.input.WhichOneof("kind") == "example_list"
    first, second = (e.features.feature for e in plain.input.example_list.examples)
    assert list(first["ratings"].float_list.value) == [8.0, 9.0] and list(first["age"].int64_list.value) == [20]
    assert list(second["names"].bytes_list.value) == [b"baz"] and "age" not in second
    for text, words in [('{"signature_name": 1, "examples": [{}]}', "'signature_name' key must be a string"),
                        ('{"examples": [1]}', "Example must be JSON object"),
                        ('{"examples": {}}', "list/array"), ('{"context": 1, "examples": [{}]}', "Example must be JSON"),
                        ('{"examples": [{"names": null}]}', "names has element with unexpected JSON type: Null"),
                        ('{"examples": [{"names": [1, "x"]}]}', "feature: names expecting type: int64"),
                        ('{"examples": [{"names": [{"a": 1}]}]}', "names has element with unexpected JSON type: Object"),
                        ('{"examples": [{"names": [[1]]}]}', "names has element with unexpected JSON type: Array"),
                        ('{"examples": [{"names": 18446744073709551615}]}', "Only int64_t is supported"),
                        ('{"examples": []}', "'examples' value is an empty array"),
                        ('{"instances": []}', "key 'examples' is expected and was not found")]:
        with pytest.raises(RpcError) as caught:
            doc = parse_json(text.encode())
            signature_name(doc)
            fill_example_input(doc, classification_pb2.ClassificationRequest().input)
        assert words in caught.value.message, text


def test_client_request_bodies_carry_the_values_json_dumps_would():
    """verify's REST client writes arrays with orjson: the same values as json.dumps(a.tolist()) (a float32
    widened to float64 in its shortest text), the json path where orjson would write something else (NaN)."""
    import orjson

    from exportkit.serving.client.rest_client import _exact_for_orjson, decode_json

    rng = np.random.default_rng(5)
    tiny = np.frombuffer(rng.integers(0, 2 ** 32, 4096, dtype=np.uint32), dtype=np.float32)
    for array in (rng.random((3, 5, 2), dtype=np.float32), tiny[np.isfinite(tiny)], rng.normal(size=7) * 1e300,
                  np.array([[1e-45, 3.4028235e38, -0.0, 1e-5]], np.float32), np.float16([0.1, 65504]),
                  np.arange(-3, 3, dtype=np.int8), np.array([True, False]), np.array([2 ** 64 - 1], np.uint64)):
        fast = _exact_for_orjson(array)
        assert fast is not None
        sent = json.loads(orjson.dumps(fast, option=orjson.OPT_SERIALIZE_NUMPY))
        assert sent == json.loads(json.dumps(array.tolist()))
        if array.dtype.kind == "f":
            assert np.array_equal(np.array(sent, dtype=array.dtype).view(np.uint8), array.view(np.uint8))
    for unsuitable in (np.array([1.0, np.nan], np.float32), np.array([np.inf]), np.float32(1.5),
                       np.array([b"a"], object)):
        assert _exact_for_orjson(unsuitable) is None
    assert decode_json(b'{"predictions": [NaN, Infinity, 1.5]}')["predictions"][2] == 1.5
    assert decode_json(b'{"error": "\xff"}') == {"error": "\ufffd"}


# ------------------------------------------------------------------------------------------------ fixed-width bodies
def _tokens_replaced(text: bytes, tokens: list[bytes]) -> bytes:
    """`text` (a fixed_json array) with its numbers replaced by `tokens`, in order."""
    import re

    numbers = iter(tokens)
    return re.sub(rb"[ -][0-9.e+-]{14}", lambda _: next(numbers), text)


def _rapidjson_doubles(text: bytes) -> np.ndarray:
    from exportkit.serving.json.parse import parse_json

    return np.array(parse_json(b'{"instances":' + text + b"}")["instances"], dtype=np.float64)


def test_fixed_width_numbers_read_as_rapidjson_reads_them():
    """The server's numpy reader gives the doubles rapidjson gives for any digits and exponent in the layout (its
    own rounding: StrtodNormalPrecision, not correctly rounded beyond 1e22), and every float32 the client writes
    reads back as itself (benchmarks/rest_exact.py checks all 2**32)."""
    from exportkit.serving.json.fixed import fixed_json, read_fixed_array

    rng = np.random.default_rng(34)
    count = 6000
    digits = rng.integers(0, 10, (count, 11)).astype(np.uint8) + ord("0")
    tokens = [(b"- "[rng.integers(2):][:1] + bytes(d[:1]) + b"." + bytes(d[1:9]) + b"e" + b"+-"[rng.integers(2):][:1]
               + bytes(d[9:])) for d in digits]
    tokens += [b" 0.00000000e+00", b"-0.00000000e+00", b" 9.99999999e+99", b"-1.00000000e-99", b" 1.79769313e+99"]
    for shape in ((len(tokens),), (len(tokens) // 5, 5), (1, len(tokens) // 5, 1, 5)):
        text = _tokens_replaced(fixed_json(np.zeros(shape, np.float32)), tokens)
        got = read_fixed_array(text)
        assert got is not None and got.shape == shape
        assert np.array_equal(got.reshape(-1).view(np.uint64), _rapidjson_doubles(text).reshape(-1).view(np.uint64))
    bits = rng.integers(0, 2 ** 32, 200000, dtype=np.uint32).view(np.float32)
    powers = np.float32(10.0) ** np.arange(-45, 39, dtype=np.float32)
    near = (powers.view(np.int32)[:, None] + np.arange(-3, 4)).astype(np.int32).view(np.float32).reshape(-1)
    values = np.concatenate([bits[np.isfinite(bits)], near[np.isfinite(near)],
                             np.float32([0.0, -0.0, 1e-45, -1e-45, 3.4028235e38, -3.4028235e38, 0.1, 1.0])])
    text = fixed_json(values)
    assert text[:1] == b"[" and len(text) == 16 * values.size + 1
    for read in (read_fixed_array(text), _rapidjson_doubles(text)):
        assert np.array_equal(read.astype(np.float32).view(np.uint32), values.view(np.uint32))


def test_fixed_width_bodies_are_taken_only_whole_and_exact():
    """parse_fixed_body takes a body only in exactly the layout; anything else (which may still be JSON, read the
    ordinary way) is None, so its answer and refusals are the ordinary path's."""
    from exportkit.serving.json.decode import fill_predict_request
    from exportkit.serving.json.fixed import fixed_json, parse_fixed_body
    from exportkit.serving.json.parse import parse_json

    values = np.random.default_rng(3).normal(size=(4, 3, 2)).astype(np.float32)
    body = fixed_json(values, b'{"signature_name":"serving_default","instances":', b"}")
    fixed = parse_fixed_body(body)
    assert fixed.doc == {"signature_name": "serving_default", "instances": 0}
    ordinary, row = fill_predict_request(parse_json(body), {"x": "float32"}, "serving_default")
    assert row and np.array_equal(fixed.inputs({"x": "float32"})["x"].view(np.uint32), ordinary["x"].view(np.uint32))
    assert np.array_equal(fixed.inputs({"x": "float64"})["x"],
                          fill_predict_request(parse_json(body), {"x": "float64"}, "")[0]["x"])
    assert fixed.inputs({"x": "int32"}) is None and fixed.inputs({"x": "float32", "y": "float32"}) is None
    assert parse_fixed_body(fixed_json(values, b'{"instances":', b"}")).doc == {"instances": 0}
    number = body.index(b"[ ") + 1 if b"[ " in body else body.index(b"[-") + 1
    for variant in [
        body[:number + 3] + b"x" + body[number + 4:],  # not a digit
        body[:number + 2] + b"," + body[number + 3:],  # a comma inside a number
        body[:number] + b"+" + body[number + 1:],  # a sign JSON has not
        body[:number + 11] + b"E" + body[number + 12:],  # valid JSON, not the layout
        body[:number + 15] + b" " + body[number + 15:],  # whitespace between tokens
        body[:number + 15] + body[number + 16:],  # a comma missing
        body.replace(b"],[", b"], [", 1),
        body[:-1] + b" }", body + b" ", body[:-2] + b"}",  # trailing bytes, a bracket missing
        body.replace(b'"serving_default"', b"7"),  # signature_name not a string
        body.replace(b'{"signature', b'{"other":1,"signature'),  # another member
        body.replace(b'"instances":', b'"inputs":'),
        b'{"instances":' + fixed_json(values[:, :2])[:-1] + b"," + fixed_json(values[0])[1:] + b"}",
    ]:
        assert parse_fixed_body(variant) is None, variant[:80]


def test_fixed_width_bodies_read_as_they_arrive_read_as_whole_ones():
    """The server reads a body while it arrives (FixedBodyReader, fed what each recv gives): whatever the pieces,
    it gets what parse_fixed_body gets from the whole body, a FixedBody or None, and a trickle of one-byte pieces
    costs no more than a bounded copy per byte (the head and a row are what it holds)."""
    from exportkit.serving.json.fixed import FixedBodyReader, fixed_json, parse_fixed_body

    rng = np.random.default_rng(12)
    for shape in ((5,), (3, 4), (2, 3, 700), (9, 2, 2, 3)):
        values = rng.normal(size=shape).astype(np.float32)
        body = fixed_json(values, b'{"signature_name":"s","instances":', b"}")
        whole = parse_fixed_body(body)
        bodies = [body, body[:-1] + b" ", body.replace(b"e-", b"e+", 1), body[:40] + b"x" + body[41:], body + b"}"]
        for variant in bodies:
            for size in (1, 15, 16, 999, len(variant)):
                reader = FixedBodyReader(len(variant))
                for start in range(0, len(variant), size):
                    reader.feed(variant[start:start + size])
                got, expected = reader.body(variant), parse_fixed_body(variant)
                assert (got is None) == (expected is None), (shape, size, variant[:60])
                if got is not None:
                    assert got.doc == expected.doc and np.array_equal(got.values, expected.values)
        assert whole is not None and parse_fixed_body(bodies[1]) is None and parse_fixed_body(bodies[3]) is None


@pytest.mark.slow
@pytest.mark.serving
def test_fixed_width_bodies_answer_and_refuse_as_ordinary_ones(rest):
    """Through the server: a fixed-width body gets the answer, byte for byte, and the refusal, word for word, that the
    same JSON gets the ordinary way (a space after "instances": takes it off the fast path): another input map, an
    unknown signature, a corrupted number; and the answer that json.dumps of the same float32 values gets."""
    from exportkit.serving.json.fixed import fixed_json
    from exportkit.serving.client.rest_client import RestClient

    values = np.random.default_rng(8).random((3, 2, 2), dtype=np.float32) * 100 - 50
    for signature in ("serving_default", "two_inputs", "strings", "double", "nonexistent"):
        head = json.dumps({"signature_name": signature}, separators=(",", ":"))[:-1].encode() + b',"instances":'
        fixed = fixed_json(values, head, b"}")
        ordinary = fixed.replace(b'"instances":', b'"instances": ')
        assert call(rest, "POST", f"{PATH}/versions/1:predict", body=fixed)[::2] == \
            call(rest, "POST", f"{PATH}/versions/1:predict", body=ordinary)[::2], signature
    dumped = json.dumps({"instances": values.tolist()}).encode()
    assert call(rest, "POST", f"{PATH}:predict", body=fixed_json(values, b'{"instances":', b"}"))[::2] == \
        call(rest, "POST", f"{PATH}:predict", body=dumped)[::2]
    fixed = fixed_json(values, b'{"instances":', b"}")
    corrupted = fixed.replace(b"e+01", b"e+0x", 1)
    status, _, text = call(rest, "POST", f"{PATH}:predict", body=corrupted)
    assert status == 400 and _error(text) == f"JSON Parse error: Missing a comma or ']' after an array element. " \
                                             f"at offset: {corrupted.index(b'e+0x') + 3}"
    client = RestClient(f"127.0.0.1:{rest}", MODEL, 1)
    got = client.predict({"x": values}, {"y": "float32"}, input_dtypes={"x": "float32"})["y"]
    np.testing.assert_array_equal(got, np.float32(0.5) * values + np.float32(2))


def test_codec_float_texts_are_format_float():
    """predict_json formats a float array at once: the texts are format_float's, element by element (TF Serving's
    `%.6g`-if-it-reads-back, which a filter decides without formatting where it certainly does not)."""
    from exportkit.serving.json.encode import _float_texts, format_float

    rng = np.random.default_rng(6)
    powers = np.float32(10.0) ** np.arange(-44, 38, dtype=np.float32)
    values = np.concatenate([
        rng.integers(0, 2 ** 32, 30000, dtype=np.uint32).view(np.float32), rng.random(10000, dtype=np.float32),
        (rng.random(10000) * 2000 - 1000).round(2).astype(np.float32), np.arange(-2000, 2000, dtype=np.float32) / 8,
        (powers.view(np.int32)[:, None] + np.arange(-40, 40)).astype(np.int32).view(np.float32).reshape(-1),
        np.float32([0, -0.0, np.nan, np.inf, -np.inf, 1e-45, 3.4028235e38, 999999.5, 9999995, 16777216])])
    assert _float_texts(values, False) == [format_float(v) for v in values.tolist()]
    doubles = np.concatenate([values[np.isfinite(values)].astype(np.float64), rng.normal(size=5000),
                              rng.random(2000).round(4), [np.nan, -np.inf, 1 / 3]])
    assert _float_texts(doubles, True) == [format_float(v, double=True) for v in doubles.tolist()]
