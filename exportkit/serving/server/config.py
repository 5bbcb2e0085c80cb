"""The model server's text-proto configs (server.cc ParseProtoTextFile): ModelServerConfig, BatchingParameters,
MonitoringConfig, and what a ModelConfig's version policy and labels ask for.

ModelServerConfig comes from tensorflow-serving-api. That wheel ships neither session_bundle_config.proto
(BatchingParameters) nor monitoring_config.proto, so those two messages are declared here with TF Serving's exact
field names and numbers (tensorflow_serving/servables/tensorflow/session_bundle_config.proto,
tensorflow_serving/config/monitoring_config.proto) and parsed with the same text_format.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache

from exportkit import storage
from exportkit.errors import UsageError

LATEST, ALL, SPECIFIC = "latest", "all", "specific"


@lru_cache(maxsize=None)
def _declared_messages() -> dict:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, wrappers_pb2

    pool = descriptor_pool.DescriptorPool()
    wrappers = descriptor_pb2.FileDescriptorProto()
    wrappers_pb2.DESCRIPTOR.CopyToProto(wrappers)
    pool.Add(wrappers)
    f = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="exportkit/tf_serving_configs.proto", package="tensorflow.serving",
                                               syntax="proto3", dependency=["google/protobuf/wrappers.proto"])

    def add(message, fields):
        m = proto.message_type.add(name=message)
        for name, number, kind, label, type_name in fields:
            m.field.add(name=name, number=number, type=kind, label=label, type_name=type_name or None)

    one, many = f.LABEL_OPTIONAL, f.LABEL_REPEATED
    msg = f.TYPE_MESSAGE
    add("BatchingParameters", [
        ("max_batch_size", 1, msg, one, ".google.protobuf.Int64Value"),
        ("batch_timeout_micros", 2, msg, one, ".google.protobuf.Int64Value"),
        ("max_enqueued_batches", 3, msg, one, ".google.protobuf.Int64Value"),
        ("num_batch_threads", 4, msg, one, ".google.protobuf.Int64Value"),
        ("thread_pool_name", 5, msg, one, ".google.protobuf.StringValue"),
        ("allowed_batch_sizes", 6, f.TYPE_INT64, many, ""),
        ("pad_variable_length_inputs", 7, f.TYPE_BOOL, one, ""),
        ("enable_large_batch_splitting", 8, msg, one, ".google.protobuf.BoolValue"),
        ("max_execution_batch_size", 9, msg, one, ".google.protobuf.Int64Value"),
    ])
    add("PrometheusConfig", [("enable", 1, f.TYPE_BOOL, one, ""), ("path", 2, f.TYPE_STRING, one, "")])
    add("MonitoringConfig", [("prometheus_config", 1, msg, one, ".tensorflow.serving.PrometheusConfig")])
    pool.Add(proto)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"tensorflow.serving.{name}"))
            for name in ("BatchingParameters", "MonitoringConfig")}


def parse_text_proto(path: str, message, flag: str):
    """ParseProtoTextFile: TF Serving's error text ("Error parsing text-format <type>: ...") on a bad file."""
    from google.protobuf import text_format

    full_name = message.DESCRIPTOR.full_name
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as err:
        raise UsageError(f"{flag}: cannot read {path}: {err.strerror}", f"pass the path of a {full_name} text file")
    try:
        return text_format.Parse(text, message)
    except text_format.ParseError as err:
        raise UsageError(f"Error parsing text-format {full_name}: {err}",
                         f"fix the {full_name} text proto in {path}") from None


def read_model_server_config(path: str):
    from tensorflow_serving.config import model_server_config_pb2

    return parse_text_proto(path, model_server_config_pb2.ModelServerConfig(), "--model_config_file")


def read_batching_parameters(path: str | None):
    message = _declared_messages()["BatchingParameters"]()
    return parse_text_proto(path, message, "--batching_parameters_file") if path else message


def read_monitoring_config(path: str):
    return parse_text_proto(path, _declared_messages()["MonitoringConfig"](), "--monitoring_config_file")


# ------------------------------------------------------------------------------------------ one model's config
@dataclass
class ModelConfig:
    """One entry of model_config_list: where its versions live and which of them to serve."""

    name: str
    base_path: str
    policy: str = LATEST
    num_latest: int = 1
    specific: tuple[int, ...] = ()
    labels: dict[str, int] = field(default_factory=dict)
    fixed_dirs: dict[int, str] | None = None  # `exportkit serve VERSION_DIR`: exactly this version, no polling

    def versions_on_disk(self) -> dict[int, str]:
        """FileSystemStoragePathSource: every integer-named child of base_path (TF Serving does not look inside)."""
        if self.fixed_dirs is not None:
            return dict(self.fixed_dirs)
        if storage.is_url(self.base_path):
            return self._versions_in_bucket()
        try:
            children = os.listdir(self.base_path)
        except OSError:
            return {}
        return {int(c): os.path.join(self.base_path, c) for c in children
                if c.isdigit() and os.path.isdir(os.path.join(self.base_path, c))}

    def _versions_in_bucket(self) -> dict[int, str]:
        """versions_on_disk for gs://, s3://: GetChildren lists every object below the base path there, and the
        source keeps each one's first path component (file_system_storage_path_source.cc), which is what
        storage.listdir gives: a version is aspired as soon as one of its objects exists. Unlike a missing local
        directory, a base path that cannot be listed (no bucket, no endpoint) raises: at start-up that is the
        server's error (exit 2 or 3), and a poll that fails keeps what is served, as TF Serving's does."""
        return {int(c): storage.join(self.base_path, c) for c in storage.listdir(self.base_path) if c.isdigit()}

    def aspired(self, on_disk: dict[int, str]) -> dict[int, str]:
        """The versions the policy wants served (file_system_storage_path_source.cc)."""
        if self.policy == ALL:
            return on_disk
        if self.policy == SPECIFIC:
            return {v: d for v, d in on_disk.items() if v in self.specific}
        return {v: on_disk[v] for v in sorted(on_disk)[-self.num_latest:]} if self.num_latest > 0 else {}


def model_configs(config) -> list[ModelConfig]:
    """The ModelConfigs of a ModelServerConfig, checked as server_core.cc ValidateModelConfigList does."""
    kind = config.WhichOneof("config")
    if kind is None:
        return []
    if kind != "model_config_list":
        raise UsageError("ModelServer does not yet support custom model config.",
                         "use model_config_list in --model_config_file")
    out, seen = [], set()
    for entry in config.model_config_list.config:
        if entry.name in seen:
            raise UsageError(f"Illegal to list model {entry.name} multiple times in config list",
                             "list each model once in --model_config_file")
        seen.add(entry.name)
        if entry.model_platform not in ("", "tensorflow"):
            raise UsageError(f"model {entry.name}: model_platform {entry.model_platform!r} is not supported",
                             'use model_platform: "tensorflow"')
        base = entry.base_path
        if not os.path.isabs(base) and "://" not in base:
            raise UsageError(f"Expected model {entry.name} to have an absolute path or URI; got base_path()={base}",
                             "write base_path as an absolute path")
        policy = entry.model_version_policy.WhichOneof("policy_choice") or LATEST
        num = entry.model_version_policy.latest.num_versions if policy == LATEST else 1
        out.append(ModelConfig(entry.name, base, policy, num or 1, tuple(entry.model_version_policy.specific.versions),
                               dict(entry.version_labels)))
    return out
