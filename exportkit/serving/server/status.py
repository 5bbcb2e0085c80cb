"""The status an API answers with (tensorflow_serving/util/status_util, TF's error codes = gRPC's codes)."""
from __future__ import annotations

import grpc


class RpcError(Exception):
    """A gRPC status to answer with (code: grpc.StatusCode); REST maps it to an HTTP status."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def grpc_code(tf_code: int) -> grpc.StatusCode:
    """TensorFlow's error codes are gRPC's codes (same numbers)."""
    for code in grpc.StatusCode:
        if code.value[0] == tf_code:
            return code
    return grpc.StatusCode.UNKNOWN


def invalid_argument(message: str) -> RpcError:
    return RpcError(grpc.StatusCode.INVALID_ARGUMENT, message)
