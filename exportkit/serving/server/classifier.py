"""Classify (servables/tensorflow/classifier.cc): serialized Examples in, [batch, classes] labels/scores out."""
from __future__ import annotations

import grpc
import numpy as np

from exportkit.signature_constants import CLASSIFY_CLASSES, CLASSIFY_INPUTS, CLASSIFY_METHOD, CLASSIFY_SCORES
from exportkit.serving.server.status import RpcError
from exportkit.serving.server.util import dt_name, run_example_method, shape_text, signature_text


def classify(core, request):
    """RunClassify: the servable the request names, then the signature's classification."""
    return run_classify(core.servable_for(request.model_spec), request)


def run_classify(servable, request):
    from tensorflow_serving.apis import classification_pb2

    return run_example_method(servable, request, classification_pb2.ClassificationResponse(), CLASSIFY_METHOD,
                              preprocess_classification, classification_output_names, CLASSIFY_INPUTS,
                              postprocess_classification)


def preprocess_classification(signature) -> None:
    refusal = classification_refusal(signature.inputs, signature.outputs, signature)
    if refusal:
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, refusal)


def classification_refusal(inputs, outputs, signature=None) -> str | None:
    """classifier.cc PreProcessClassification's refusal of a signature with these input and output keys (None:
    Classify answers on it). Given the SignatureDef, the message ends with its text, as the server's does."""
    if len(inputs) != 1:
        return "Expected one input Tensor."
    if len(outputs) not in (1, 2):
        return f"Expected one or two output Tensors, found {len(outputs)}"
    text = signature_text(signature) if signature else None
    if CLASSIFY_INPUTS not in inputs:
        return "No classification inputs found in SignatureDef" + (f": {text}" if text else "")
    if CLASSIFY_CLASSES not in outputs and CLASSIFY_SCORES not in outputs:
        return ('Expected classification signature outputs to contain at least one of "classes" or "scores".' +
                (f" Signature was: {text}" if text else ""))
    return None


def classification_output_names(signature) -> list[str]:
    return [signature.outputs[k].name for k in (CLASSIFY_CLASSES, CLASSIFY_SCORES) if k in signature.outputs]


def postprocess_classification(signature, n: int, values: dict, result) -> None:
    """classifier.cc PostProcessClassificationResult: [batch, num_classes] string classes / float scores."""
    classes = values.get(signature.outputs[CLASSIFY_CLASSES].name) if CLASSIFY_CLASSES in signature.outputs else None
    scores = values.get(signature.outputs[CLASSIFY_SCORES].name) if CLASSIFY_SCORES in signature.outputs else None
    for what, value, dtype in (("classes", classes, "DT_STRING"), ("scores", scores, "DT_FLOAT")):
        if value is None:
            continue
        value = np.asarray(value)
        if value.ndim != 2:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"Expected Tensor shape: [batch_size num_classes] but got {shape_text(value)}")
        ok = value.dtype == object if what == "classes" else value.dtype == np.float32
        if not ok:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"Expected {what} Tensor of {dtype}. Got: {dt_name(value)}")
        if value.shape[0] != n:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"Expected {what} output batch size of {n}. Got: {value.shape[0]}")
    if classes is not None and scores is not None and classes.shape[1] != scores.shape[1]:
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                       f"Tensors class and score should match in dim_size(1). Got {classes.shape[1]} vs. {scores.shape[1]}")
    num_classes = (classes if classes is not None else scores).shape[1]
    for i in range(n):
        row = result.classifications.add()
        for c in range(num_classes):
            cl = row.classes.add()
            if classes is not None:
                cl.label = bytes(classes[i, c]).decode("utf-8", "replace")
            if scores is not None:
                cl.score = float(scores[i, c])
