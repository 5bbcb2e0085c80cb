"""The registry of served models and versions (model_servers/server_core.cc + the aspired-versions manager):
which servable answers a ModelSpec, and which versions are loaded as the config and the file system change.

Every API (gRPC and REST) asks the core for its servable: `servable(name, version=None, label=None)` or
`servable_for(model_spec)` (both raise the RpcError TF Serving answers); `versions(name)` lists every version of a
model whatever its state (GetModelStatus). Inside a request scope (scope.py) the version handed out stays loaded
until the request ends, as a ServableHandle keeps it.

Versions move as the manager moves them: AvailabilityPreservingPolicy picks one action at a time (`next_action`:
unload an unaspired version only once an aspired one serves, then load the highest new one), a load is retried
`max_num_load_retries` times `load_retry_interval_micros` apart (loader_harness.cc, util/retrier.cc), and an
unload waits until no request holds the version (basic_manager.cc ExecuteUnload).
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import grpc

from exportkit.savedmodel.versions import ModelLocation
from exportkit.serving.server.config import ModelConfig
from exportkit.serving.server.scope import current
from exportkit.serving.server.servable import ServedModel
from exportkit.serving.server.status import RpcError

log = logging.getLogger("exportkit.serve")


@dataclass(frozen=True)
class LoadRetries:
    """--max_num_load_retries / --load_retry_interval_micros (model_servers/server.h: 5 and one minute)."""

    max_num_load_retries: int = 5
    load_retry_interval_micros: int = 60 * 1000 * 1000


NO_RETRIES = LoadRetries(0, 0)


def next_action(versions: list[tuple[int, bool, str]]) -> tuple[str, int] | None:
    """AvailabilityPreservingPolicy::GetNextAction over (version, is_aspired, state) with state "new", "ready" or
    anything else (loading, unloading, ended): ("unload"|"load", version) or None.

    An unaspired ready version is unloaded (the lowest first) when no version is aspired, when an aspired one is
    ready, or while more than one unaspired version is ready; otherwise the highest new aspired version loads.
    So a new version that fails to load leaves the old one serving."""
    has_aspired = any(aspired for _, aspired, _ in versions)
    has_aspired_serving = any(aspired and state == "ready" for _, aspired, state in versions)
    unaspired_serving = [v for v, aspired, state in versions if not aspired and state == "ready"]
    if unaspired_serving and (not has_aspired or has_aspired_serving or len(unaspired_serving) > 1):
        return "unload", min(unaspired_serving)
    new = [v for v, aspired, state in versions if aspired and state == "new"]
    return ("load", max(new)) if new else None


class ServerCore:
    def __init__(self, servables: list[ServedModel] = (), device: str = "cpu", session_config=None, batching=None,
                 metrics=None, method_name_check: bool = False, retries: LoadRetries = NO_RETRIES):
        self.device = device
        self.method_name_check = method_name_check
        self.session_config = session_config
        self.batching = batching
        self.metrics = metrics  # monitoring.Metrics or None
        self.retries = retries
        self._configs: dict[str, ModelConfig] = {}
        self._servables: dict[str, dict[int, ServedModel]] = {}
        self._labels: dict[str, dict[str, int]] = {}
        self._wanted: dict[str, set[int]] = {}  # versions the policy aspires to, per model
        self._lock = threading.Lock()  # guards the maps and the versions' states; loading happens outside it
        self._reload = threading.Lock()  # one reload / poll at a time
        self._stopping = threading.Event()  # ends a retry's wait
        for servable in servables:
            self._servables.setdefault(servable.name, {})[servable.version] = servable

    # -- lookups ----------------------------------------------------------------------------------------------
    def versions(self, name: str) -> list[ServedModel]:
        """Every version of `name` the server knows, highest first (ServableStateMonitor's order)."""
        with self._lock:
            return self._sorted(name)

    def _sorted(self, name: str) -> list[ServedModel]:
        return sorted(self._servables.get(name, {}).values(), key=lambda s: -s.version)

    def servable_for(self, spec) -> ServedModel:
        """ServableRequestFromModelSpec + GetServableHandle."""
        choice = spec.WhichOneof("version_choice")
        return self.servable(spec.name, version=spec.version.value if choice == "version" else None,
                             label=spec.version_label if choice == "version_label" else None)

    def servable(self, name: str, version: int | None = None, label: str | None = None) -> ServedModel:
        """The AVAILABLE version asked for; inside a request scope it is held until the request ends."""
        if not name:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, "ModelSpec has no name specified.")
        with self._lock:
            if label is not None:
                version = self._labels.get(name, {}).get(label)
                if version is None:
                    raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, f"Unrecognized servable version label: {label}")
            available = [s for s in self._sorted(name) if s.state == "AVAILABLE"]
            chosen = available[0] if available and version is None else \
                next((s for s in available if s.version == version), None)
            if chosen is None:
                what = f"Latest({name})" if version is None else f"Specific({name}, {version})"
                raise RpcError(grpc.StatusCode.NOT_FOUND, f"Servable not found for request: {what}")
            scope = current()
            if scope is not None:  # taken under the lock that _unload takes to retire it: never a closed one
                chosen.acquire()
                scope.held.append(chosen)
            return chosen

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
            for name, versions in self._servables.items():
                if name not in self._configs:
                    self._wanted[name] = set()  # a model left the config: every version unloads
                    for version in [v for v, known in versions.items() if _policy_state(known) == "new"]:
                        del versions[version]
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
            current_versions = self._servables.setdefault(config.name, {})
            for version, directory in aspired.items():
                known = current_versions.get(version)
                if known is None or (known.state == "END" and known.error is None):  # new, or unloaded earlier
                    location = ModelLocation(config.base_path, directory, version, config.name)
                    current_versions[version] = ServedModel(location, config.name, self.device, self.session_config,
                                                            self.batching, self.method_name_check, self.metrics)
            for version, known in list(current_versions.items()):
                if version not in aspired and _policy_state(known) == "new":
                    del current_versions[version]  # no longer aspired before it was loaded: never loads
            self._wanted[config.name] = set(aspired)

    def _sync_versions(self) -> None:
        """Apply the policy's actions, one at a time, until it has none left (AspiredVersionsManager's loop)."""
        for name in list(self._servables):
            if name not in self._wanted:  # servables handed in ready-made (verify's worker): not the policy's
                continue
            while True:
                with self._lock:
                    wanted = self._wanted[name]
                    snapshot = [(s.version, s.version in wanted, _policy_state(s)) for s in self._sorted(name)]
                    action = next_action(snapshot)
                    servable = self._servables[name][action[1]] if action else None
                if action is None:
                    break
                if action[0] == "load":
                    self._load(servable)
                else:
                    self._unload(servable)

    def _load(self, servable: ServedModel) -> None:
        """LoaderHarness::LoadApproved + Load: up to max_num_load_retries more attempts while still aspired."""
        attempts = 1 + max(0, self.retries.max_num_load_retries)
        for attempt in range(attempts):
            if attempt:
                log.info("Retrying of Loading servable: {name: %s version: %d} retry: %d",
                         servable.name, servable.version, attempt)
            else:
                log.info("loading model '%s' version %d from %s", servable.name, servable.version,
                         servable.version_dir)
            servable.load()
            if servable.state == "AVAILABLE":
                return
            log.error("model '%s' version %d failed to load: %s", servable.name, servable.version, servable.error[1])
            if attempt + 1 == attempts or not self._still_aspired(servable):
                return
            failed = servable.error
            with self._lock:  # GetModelStatus says LOADING (status OK) while the retry waits, as TF Serving does
                servable.state, servable.error = "LOADING", None
            if self._stopping.wait(max(0, self.retries.load_retry_interval_micros) / 1e6):
                with self._lock:
                    servable.state, servable.error = "END", failed
                return

    def _still_aspired(self, servable: ServedModel) -> bool:
        """AspiredVersionsManager cancels a load's retries once the version is no longer aspired."""
        with self._lock:
            return servable.version in self._wanted.get(servable.name, set())

    def _unload(self, servable: ServedModel) -> None:
        """BasicManager::ExecuteUnload: out of the serving map first, then unloaded once no request holds it."""
        log.info("unloading model '%s' version %d", servable.name, servable.version)
        with self._lock:
            servable.state = "UNLOADING"
        servable.wait_unheld()
        servable.close()
        with self._lock:
            servable.state = "END"

    def _update_labels(self) -> None:
        """UpdateModelVersionLabelMap: a label may only point at an AVAILABLE version."""
        labels: dict[str, dict[str, int]] = {}
        with self._lock:
            configs = list(self._configs.values())
            for config in configs:
                available = {s.version for s in self._sorted(config.name) if s.state == "AVAILABLE"}
                for label, version in config.labels.items():
                    if version not in available:
                        raise RpcError(grpc.StatusCode.FAILED_PRECONDITION,
                                       f"Request to assign label to version {version} of model {config.name}, "
                                       "which is not currently available for inference")
                    labels.setdefault(config.name, {})[label] = version
            self._labels = labels

    def failures(self) -> list[ServedModel]:
        """Versions that failed to load (state END with an error)."""
        with self._lock:
            return [s for versions in self._servables.values() for s in versions.values() if s.error]

    def stop_retries(self) -> None:
        self._stopping.set()

    def close(self) -> None:
        self._stopping.set()
        for name in list(self._servables):
            for servable in self.versions(name):
                servable.close()

    def model_names(self) -> list[str]:
        with self._lock:
            return list(self._configs) or list(self._servables)


def _policy_state(servable: ServedModel) -> str:
    """The LoaderHarness state AvailabilityPreservingPolicy looks at: kNew ("new"), kReady ("ready"), or other."""
    if servable.state == "AVAILABLE":
        return "ready"
    if servable.state == "LOADING" and not servable.attempts:
        return "new"
    return servable.state.lower()
