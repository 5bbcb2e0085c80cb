"""`exportkit verify`'s options, from the CLI's flags or the Python API's keyword arguments (the same names)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from exportkit import storage
from exportkit.options.flags import check_tolerances, refuse_unknown, size_flag, texts
from exportkit.options.launch import LaunchOptions
from exportkit.options.server_flags import STOCK, ServerFlags, parse_server_flags
from exportkit.options.source import SOURCE_FLAGS, SourceOptions, source_from_flags
from exportkit.options.spec_file import find_spec_file, read_spec_file


@dataclass
class VerifyOptions:
    """`exportkit verify`: what to check (path, signature), with which inputs, through which runtimes, and how
    to compare and report. Flags are validated where they are used, before any runtime starts."""

    path: str
    against: SourceOptions | None = None  # the training source, for the keras runtime
    signature_name: str | None = None  # None: every signature
    inputs: str | None = None
    samples: int = 8
    seed: int = 0
    int_range: list[str] = field(default_factory=list)  # over the ranges the export recorded (LO:HI, NAME=LO:HI)
    save_inputs: str | None = None
    save_outputs: str | None = None
    atol: float | None = None
    rtol: float | None = None
    tol: list[str] = field(default_factory=list)
    runtimes: str | None = None
    serving: str = "auto"
    serving_protocol: str | None = None  # grpc | rest | both; None: both for launched servers, grpc for HOST:PORT
    model_server_bin: str | None = None
    container_cli: str = "docker"  # --serving docker: docker, podman or a path
    pull: bool = False  # --serving docker: pull a missing image
    batching_parameters: str | None = None  # TF Serving BatchingParameters text proto for a launched server
    model_name: str | None = None
    model_version: int | None = None
    load_timeout: float = 120.0
    device: str = "cpu"
    allow_tf32: bool = False
    reference: str | None = None  # --reference: a training-time reference (.npz from exportkit.record_reference)
    allow_io_ops: bool = False  # execute graphs whose signatures reach I/O ops (refused by default)
    allow_nondeterministic: bool = False  # nondeterministic outputs: a warning, left out of the comparisons
    baseline: str | None = None  # None: the newest lower version in the base dir, or the deployed one (HOST:PORT)
    no_baseline: bool = False  # --no-baseline: compare the signatures with no released ones
    json_out: str | None = None
    junit: str | None = None
    html: str | None = None  # --html FILE: the self-contained HTML report
    summary: str | None = None  # --summary FILE: the verdict as GitHub-flavoured Markdown
    # --data: verify over the records of a dataset (exportkit.verify.dataset)
    data: str | None = None
    limit: int | None = None
    batch_size: int = 256
    sample: float | None = None
    save_failures: str | None = None
    runner: str = "in-process"
    beam_options: list[str] = field(default_factory=list)
    tf_versions: list[str] = field(default_factory=list)  # --tf: also session@X.Y in managed environments
    server_flags: ServerFlags = STOCK  # --server-flag: how the deployment's tensorflow_model_server runs
    max_latency_ms: float | None = None  # fail when a runtime's steady-state p99 exceeds it (verify/latency.py)
    # fail when the model's peak memory / the swap's exceeds it (verify/memory.py): bytes, or a size ("512MB")
    max_memory: int | None = None
    max_swap_memory: int | None = None

    def __post_init__(self):
        check_tolerances(self.atol, self.rtol)
        self.max_memory = size_flag("--max-memory", self.max_memory)
        self.max_swap_memory = size_flag("--max-swap-memory", self.max_swap_memory)

    @property
    def launch(self) -> LaunchOptions:
        """How a server verify launches is run (container CLI, --pull, batching parameters, server flags)."""
        return LaunchOptions(container_cli=self.container_cli, pull=self.pull,
                             batching_parameters=self.batching_parameters, server_flags=self.server_flags)



# keyword (the flag's longest name) -> VerifyOptions field
_RENAMES = {"tf": "tf_versions", "beam_option": "beam_options", "json": "json_out"}


def memory_limits(path: str) -> dict:
    """`max_memory` / `max_swap_memory` of the exportkit.toml in the model's base directory (the flags win)."""
    where = Path(path)
    base = where.parent if (where / "saved_model.pb").is_file() or (where / "saved_model.pbtxt").is_file() else where
    spec_file = find_spec_file(str(base), None) if base.is_dir() else None
    spec = read_spec_file(spec_file) if spec_file else {}
    return {k: spec[k] for k in ("max_memory", "max_swap_memory") if k in spec}


def verify_options(path, **flags) -> VerifyOptions:
    """VerifyOptions from the flags by name: the CLI and `exportkit.verify()` both build them here. The source flags
    describe `against`; `op_library` is the caller's to apply (it is an environment of the workers)."""
    fields = {f.name for f in dataclasses.fields(VerifyOptions)} - {"path", "against", "server_flags",
                                                                    *_RENAMES.values()}
    refuse_unknown("verify", flags, fields | set(_RENAMES) | set(SOURCE_FLAGS) | {"against", "op_library",
                                                                                   "server_flag"})
    if "server_flag" in flags:
        flags["server_flags"] = parse_server_flags(texts(flags.pop("server_flag")))
    against = flags.pop("against", None)
    source = {name: flags.pop(name) for name in SOURCE_FLAGS if name in flags}
    flags.pop("op_library", None)
    values = {_RENAMES.get(k, k): v for k, v in flags.items()}
    for name, limit in memory_limits(str(path)).items():
        values[name] = limit if values.get(name) is None else values[name]
    for name in ("int_range", "tol", "tf_versions", "beam_options"):
        if name in values:
            values[name] = texts(values[name])
    for name in ("inputs", "reference"):  # files read whole: a bucket URL is read from its cached local copy
        if values.get(name) and storage.is_url(values[name]):
            values[name] = str(storage.local_copy(values[name]))
    return VerifyOptions(path=str(path), against=source_from_flags(against, source) if against else None, **values)
