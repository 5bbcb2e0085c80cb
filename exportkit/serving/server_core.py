"""The registry of served models and versions (model_servers/server_core.cc + the aspired-versions manager):
which servable answers a ModelSpec, and which versions are loaded as the config and the file system change.

Every API (gRPC and REST) asks the core for its servable: `servable(name, version=None, label=None)` or
`servable_for(model_spec)` (both raise the RpcError TF Serving answers); `versions(name)` lists every version of a
model whatever its state (GetModelStatus).
"""
from __future__ import annotations

import logging
import threading

import grpc

from exportkit.savedmodel import ModelLocation
from exportkit.serving.config import ModelConfig
from exportkit.serving.servable import ServedModel
from exportkit.serving.status import RpcError

log = logging.getLogger("exportkit.serve")


class ServerCore:
    def __init__(self, servables: list[ServedModel] = (), device: str = "cpu", session_config=None, batching=None,
                 metrics=None, method_name_check: bool = False):
        self.device = device
        self.method_name_check = method_name_check
        self.session_config = session_config
        self.batching = batching
        self.metrics = metrics  # monitoring.Metrics or None
        self._configs: dict[str, ModelConfig] = {}
        self._servables: dict[str, dict[int, ServedModel]] = {}
        self._labels: dict[str, dict[str, int]] = {}
        self._wanted: dict[str, set[int]] = {}  # versions the policy aspires to, per model
        self.ready = threading.Event()  # cleared while the initial load runs: requests wait for it (see serve())
        self.ready.set()
        self._lock = threading.Lock()  # guards the maps; loading happens outside it
        self._reload = threading.Lock()  # one reload / poll at a time
        for servable in servables:
            self._servables.setdefault(servable.name, {})[servable.version] = servable

    # -- lookups ----------------------------------------------------------------------------------------------
    def versions(self, name: str) -> list[ServedModel]:
        """Every version of `name` the server knows, highest first (ServableStateMonitor's order)."""
        self.ready.wait()
        return self._versions(name)

    def _versions(self, name: str) -> list[ServedModel]:
        with self._lock:
            return sorted(self._servables.get(name, {}).values(), key=lambda s: -s.version)

    def servable_for(self, spec) -> ServedModel:
        """ServableRequestFromModelSpec + GetServableHandle."""
        choice = spec.WhichOneof("version_choice")
        return self.servable(spec.name, version=spec.version.value if choice == "version" else None,
                             label=spec.version_label if choice == "version_label" else None)

    def servable(self, name: str, version: int | None = None, label: str | None = None) -> ServedModel:
        if not name:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, "ModelSpec has no name specified.")
        if label is not None:
            with self._lock:
                version = self._labels.get(name, {}).get(label)
            if version is None:
                raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, f"Unrecognized servable version label: {label}")
        available = [s for s in self.versions(name) if s.state == "AVAILABLE"]
        if version is None:
            if available:
                return available[0]
            raise RpcError(grpc.StatusCode.NOT_FOUND, f"Servable not found for request: Latest({name})")
        for servable in available:
            if servable.version == version:
                return servable
        raise RpcError(grpc.StatusCode.NOT_FOUND, f"Servable not found for request: Specific({name}, {version})")

    # -- config and versions ----------------------------------------------------------------------------------
    def reload_config(self, configs: list[ModelConfig]) -> None:
        """ServerCore::ReloadConfig: serve exactly these models; load and unload versions by policy; labels."""
        with self._reload:
            self.plan(configs)
            self._sync_versions()
            self._update_labels()

    def plan(self, configs: list[ModelConfig]) -> None:
        """Take the config and register the versions to load (state LOADING) without loading them yet."""
        with self._lock:
            self._configs = {c.name: c for c in configs}
        for name in list(self._servables):
            if name not in self._configs:
                for servable in self._versions(name):
                    self._unload(servable)
        for config in configs:
            self._aspire(config)

    def poll_file_system(self) -> None:
        """FileSystemStoragePathSource's poll: new versions load, versions the policy no longer wants unload."""
        with self._reload:
            with self._lock:
                configs = list(self._configs.values())
            for config in configs:
                self._aspire(config)
            self._sync_versions()
            try:
                self._update_labels()
            except RpcError as err:
                log.error("%s", err.message)

    def load_pending(self) -> None:
        """Load every registered version still LOADING (the first load runs here, in the caller's thread)."""
        with self._reload:
            self._sync_versions()
            self._update_labels()

    def _aspire(self, config: ModelConfig) -> None:
        aspired = config.aspired(config.versions_on_disk())
        with self._lock:
            current = self._servables.setdefault(config.name, {})
            for version, directory in aspired.items():
                known = current.get(version)
                if known is None or (known.state == "END" and known.error is None):  # new, or unloaded earlier
                    location = ModelLocation(config.base_path, directory, version, config.name)
                    current[version] = ServedModel(location, config.name, self.device, self.session_config,
                                                   self.batching, self.method_name_check)
            self._wanted[config.name] = set(aspired)

    def _sync_versions(self) -> None:
        """Load what is LOADING, then unload what is no longer aspired (AvailabilityPreservingPolicy: new first)."""
        for name in list(self._servables):
            for servable in sorted(self._versions(name), key=lambda s: s.version):
                if servable.state == "LOADING" and servable.model is None:
                    log.info("loading model '%s' version %d from %s", name, servable.version, servable.version_dir)
                    servable.load()
                    if servable.state == "END":
                        log.error("model '%s' version %d failed to load: %s", name, servable.version,
                                  servable.error[1])
            wanted = self._wanted.get(name)
            if wanted is None:
                continue
            for servable in self._versions(name):
                if servable.version not in wanted and servable.state == "AVAILABLE":
                    self._unload(servable)

    def _unload(self, servable: ServedModel) -> None:
        log.info("unloading model '%s' version %d", servable.name, servable.version)
        servable.state = "END"
        servable.close()

    def _update_labels(self) -> None:
        """UpdateModelVersionLabelMap: a label may only point at an AVAILABLE version."""
        labels: dict[str, dict[str, int]] = {}
        with self._lock:
            configs = list(self._configs.values())
        for config in configs:
            available = {s.version for s in self._versions(config.name) if s.state == "AVAILABLE"}
            for label, version in config.labels.items():
                if version not in available:
                    raise RpcError(grpc.StatusCode.FAILED_PRECONDITION,
                                   f"Request to assign label to version {version} of model {config.name}, which is "
                                   "not currently available for inference")
                labels.setdefault(config.name, {})[label] = version
        with self._lock:
            self._labels = labels

    def failures(self) -> list[ServedModel]:
        """Versions that failed to load (state END with an error)."""
        with self._lock:
            return [s for versions in self._servables.values() for s in versions.values() if s.error]

    def close(self) -> None:
        for name in list(self._servables):
            for servable in self._versions(name):
                servable.close()

    def model_names(self) -> list[str]:
        with self._lock:
            return list(self._configs) or list(self._servables)
