"""The registry of served models and versions (model_servers/server_core.cc): which servable answers a ModelSpec.

Every API (gRPC and REST) asks the core for its servable: `servable(name, version=None, label=None)` or
`servable_for(model_spec)`; `versions(name)` lists every version of a model whatever its state (GetModelStatus).
"""
from __future__ import annotations

import grpc

from exportkit.serving.status import RpcError


class ServerCore:
    def __init__(self, servables: list):
        self._servables = list(servables)

    def versions(self, name: str) -> list:
        return [s for s in self._servables if s.name == name]

    def servable_for(self, spec):
        """The AVAILABLE servable a ModelSpec names (GetServableHandle), or the RpcError TF Serving answers."""
        choice = spec.WhichOneof("version_choice")
        return self.servable(spec.name, version=spec.version.value if choice == "version" else None,
                             label=spec.version_label if choice == "version_label" else None)

    def servable(self, name: str, version: int | None = None, label: str | None = None):
        wanted = f"Specific({name}, {version})" if version is not None else f"Latest({name})"
        candidates = [s for s in self.versions(name) if version is None or s.version == version]
        if not candidates:
            served = ", ".join(f"model '{s.name}' version {s.version}" for s in self._servables)
            raise RpcError(grpc.StatusCode.NOT_FOUND, f"Servable not found for request: {wanted} (served: {served})")
        if label is not None:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT,  # as TF Serving (server_core.cc)
                           f"Unrecognized servable version label: {label} (no labels are configured)")
        servable = max(candidates, key=lambda s: s.version)
        if servable.state == "LOADING":
            raise RpcError(grpc.StatusCode.UNAVAILABLE, f"model '{name}' version {servable.version} is still loading")
        if servable.state != "AVAILABLE":
            raise RpcError(grpc.StatusCode.NOT_FOUND,
                           f"Servable not found for request: {wanted} (version {servable.version} failed to load)")
        return servable
