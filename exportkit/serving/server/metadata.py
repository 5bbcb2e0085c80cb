"""GetModelMetadata (model_servers/get_model_metadata_impl.cc): the SignatureDefMap packed into
metadata['signature_def']."""
from __future__ import annotations

import grpc

from exportkit.serving.server.status import RpcError


def get_model_metadata(core, request):
    from tensorflow_serving.apis import get_model_metadata_pb2

    if not request.HasField("model_spec"):
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, "Missing ModelSpec")
    if not request.metadata_field:
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, "GetModelMetadataRequest must specify at least one metadata_field")
    for field in request.metadata_field:
        if field != "signature_def":
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, f"Metadata field {field} is not supported")
    servable = core.servable_for(request.model_spec)
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    for key, value in servable.model.signatures.items():
        signature_map.signature_def[key].CopyFrom(value)
    response = get_model_metadata_pb2.GetModelMetadataResponse()
    response.model_spec.name = servable.name
    response.model_spec.version.value = servable.version
    response.metadata["signature_def"].Pack(signature_map)
    return response
