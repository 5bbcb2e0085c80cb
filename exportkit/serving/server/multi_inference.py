"""MultiInference (servables/tensorflow/multi_inference.cc): several classify/regress tasks over one model, one
Session.run with the same Examples fed to every task's input tensor."""
from __future__ import annotations

import grpc

from exportkit.signature_constants import (CLASSIFY_INPUTS, CLASSIFY_METHOD, DEFAULT_SIGNATURE, REGRESS_INPUTS,
                                           REGRESS_METHOD, REGRESS_OUTPUTS)
from exportkit.serving.server.classifier import classification_output_names, postprocess_classification, preprocess_classification
from exportkit.serving.server.regressor import postprocess_regression, preprocess_regression
from exportkit.serving.server.status import RpcError
from exportkit.serving.server.util import fill_model_spec, run_examples


def multi_inference(core, request):
    """RunMultiInferenceWithServerCore: the servable of the first task's ModelSpec, then every task."""
    from tensorflow_serving.apis import model_pb2

    spec = request.tasks[0].model_spec if request.tasks else model_pb2.ModelSpec()
    return run_multi_inference(core.servable_for(spec), request)


def run_multi_inference(servable, request):
    from tensorflow_serving.apis import inference_pb2

    model_name, seen, inputs, outputs, tasks = "", set(), set(), set(), []
    for task in request.tasks:
        if not task.model_spec.name:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, "Found ModelSpec with an empty model name.")
        if model_name and task.model_spec.name != model_name:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,
                           "All ModelSpecs in a MultiInferenceRequest must access the same model name.")
        model_name = task.model_spec.name
        name = task.model_spec.signature_name or DEFAULT_SIGNATURE
        if name in seen:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, f"Duplicate evaluation of signature: {name}")
        seen.add(name)
        signature = servable.model.signatures.get(name)
        if signature is None:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, f"Requested signature not found in model graph: {name}")
        if task.method_name == CLASSIFY_METHOD:
            preprocess_classification(signature)
            inputs.add(signature.inputs[CLASSIFY_INPUTS].name)
            outputs.update(classification_output_names(signature))
        elif task.method_name == REGRESS_METHOD:
            preprocess_regression(signature)
            inputs.add(signature.inputs[REGRESS_INPUTS].name)
            outputs.add(signature.outputs[REGRESS_OUTPUTS].name)
        else:
            raise RpcError(grpc.StatusCode.UNIMPLEMENTED, f"Unsupported signature method_name: {task.method_name}")
        tasks.append((task, signature))
    if not tasks:  # TF Serving then runs a Session with nothing to fetch, which TensorFlow refuses
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, "Must specify at least one target to fetch or execute.")
    n, values = run_examples(servable, request.input, sorted(inputs), sorted(outputs))
    response = inference_pb2.MultiInferenceResponse()
    for task, signature in tasks:
        result = response.results.add()
        if task.method_name == CLASSIFY_METHOD:
            postprocess_classification(signature, n, values, result.classification_result)
        else:
            postprocess_regression(signature, n, values, result.regression_result)
        fill_model_spec(result.model_spec, servable, task.model_spec.signature_name, name=task.model_spec.name)
    return response
