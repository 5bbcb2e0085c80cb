"""tf.Example as JSON, both ways: the JSON Examples of a Classify/Regress request (json_tensor.cc
FillClassifyRegressRequestFromJson), and a serialized Example as the JSON a REST client sends.
"""
from __future__ import annotations

import base64

from exportkit.serving.json.decode import array_member, b64decode, is_b64
from exportkit.serving.json.parse import debug_string, json_type
from exportkit.serving.server.status import invalid_argument as _invalid


def fill_example_input(doc: dict, input_proto) -> None:
    """json_tensor.cc FillClassifyRegressRequestFromJson: optional `context`, required non-empty `examples`."""
    context = "context" in doc
    if context:
        example_from_json(doc["context"], input_proto.example_list_with_context.context)
    if "examples" not in doc:
        raise _invalid(f"JSON Value: {debug_string(doc)} When method is classify, key 'examples' is expected and "
                       "was not found")
    examples = array_member(doc, "examples", "Expecting 'examples' value to be an list/array",
                            "'examples' value is an empty array")
    target = input_proto.example_list_with_context if context else input_proto.example_list
    for value in examples:
        example_from_json(value, target.examples.add())


def example_from_json(value, example) -> None:
    """json_tensor.cc MakeExampleFromJsonObject: strings and b64 -> bytes, JSON doubles -> floats, ints/bools -> int64."""
    if not isinstance(value, dict):
        raise _invalid(f"Example must be JSON object but got JSON {json_type(value)}")
    for name, content in value.items():
        feature = example.features.feature[name]
        feature.Clear()
        for item in content if isinstance(content, list) else [content]:
            kind = feature.WhichOneof("kind")

            def want(k):
                if kind not in (None, k):
                    shown = {"bytes_list": "bytes", "float_list": "float", "int64_list": "int64"}[kind]
                    raise _invalid(f"Unexpected element type in feature: {name} expecting type: {shown}")

            if item is None or isinstance(item, list) or (isinstance(item, dict) and not is_b64(item)):
                raise _invalid(f"Feature: {name} has element with unexpected JSON type: {json_type(item)}")
            if isinstance(item, bool):
                want("int64_list")
                feature.int64_list.value.append(1 if item else 0)
            elif isinstance(item, dict):
                want("bytes_list")
                feature.bytes_list.value.append(b64decode(item))
            elif isinstance(item, str):
                want("bytes_list")
                feature.bytes_list.value.append(item.encode("utf-8"))
            elif isinstance(item, float):
                want("float_list")
                feature.float_list.value.append(item)
            else:
                want("int64_list")
                if item >= 2 ** 63:
                    raise _invalid(f"Feature: {name} has uint64_t element. Only int64_t is supported.")
                feature.int64_list.value.append(item)


def example_to_json(serialized: bytes) -> dict:
    """A serialized tf.Example as the JSON object TF Serving's classify/regress accept (bytes as b64 unless UTF-8)."""
    from exportkit.tfexample.signatures import parse_example

    out = {}
    for name, feature in parse_example(serialized).features.feature.items():
        kind = feature.WhichOneof("kind")
        if kind == "bytes_list":
            values = []
            for raw in feature.bytes_list.value:
                try:
                    values.append(raw.decode("utf-8"))
                except UnicodeDecodeError:
                    values.append({"b64": base64.b64encode(raw).decode("ascii")})
        elif kind == "float_list":
            values = [float(v) for v in feature.float_list.value]
        elif kind == "int64_list":
            values = [int(v) for v in feature.int64_list.value]
        else:
            values = []
        out[name] = values
    return out
