"""GetModelStatus (model_servers/get_model_status_impl.cc): the state of every version of a model, or of one."""
from __future__ import annotations

import grpc

from exportkit.serving.server.status import RpcError


def get_model_status(core, request):
    from tensorflow_serving.apis import get_model_status_pb2

    if not request.HasField("model_spec"):
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, "Missing ModelSpec")
    spec = request.model_spec
    versions = core.versions(spec.name)
    if not versions:
        raise RpcError(grpc.StatusCode.NOT_FOUND, f"Could not find any versions of model {spec.name}")
    if spec.HasField("version"):
        versions = [s for s in versions if s.version == spec.version.value]
        if not versions:
            raise RpcError(grpc.StatusCode.NOT_FOUND, f"Could not find version {spec.version.value} of model {spec.name}")
    response = get_model_status_pb2.GetModelStatusResponse()
    for servable in versions:
        entry = response.model_version_status.add()
        entry.version = servable.version
        entry.state = get_model_status_pb2.ModelVersionStatus.State.Value(servable.state)
        entry.status.SetInParent()  # error_code OK, as TF Serving always reports it
        if servable.error:
            entry.status.error_code = servable.error[0]
            entry.status.error_message = servable.error[1]
    return response
