"""`exportkit compat`'s options, from the CLI's flags or the Python API's keyword arguments (the same names)."""
from __future__ import annotations

from dataclasses import dataclass, field

from exportkit.options.flags import check_tolerances, refuse_unknown, texts
from exportkit.options.launch import LaunchOptions
from exportkit.options.server_flags import parse_server_flags
from exportkit.signature_constants import DEFAULT_SIGNATURE


@dataclass
class CompatOptions:
    """`exportkit compat`: which TF versions, predicted or also observed (`run`, `serving`), on which device, with
    which inputs and tolerances, and where the matrix is written."""

    path: str
    tf: list[str] | None = None  # --tf: a list, a range or all (None: every supported version)
    run: bool = False  # observe in TF X.Y's TF1 loader (managed environments)
    device: str = "cpu"
    signature_name: str = DEFAULT_SIGNATURE
    samples: int = 8
    seed: int = 0
    int_range: list[str] = field(default_factory=list)
    atol: float | None = None
    rtol: float | None = None
    tol: list[str] = field(default_factory=list)
    serving: str | None = None  # docker | docker:TAG: observe on TF Serving's official image
    launch: LaunchOptions = field(default_factory=LaunchOptions)  # how the servers are started (--server-flag, ...)
    load_timeout: float = 120.0
    server: str = "stock"  # stock | tf-only: the ops the predicted server has
    json_out: str | None = None
    html: str | None = None
    summary: str | None = None

    def __post_init__(self):
        check_tolerances(self.atol, self.rtol)


_FLAGS = ("device", "signature_name", "samples", "seed", "int_range", "atol", "rtol", "tol", "serving",
          "container_cli", "pull", "load_timeout", "server", "op_library", "server_flag", "json", "html", "summary")


def compat_options(path, tf=None, run=False, **flags) -> CompatOptions:
    """CompatOptions from the flags by name (the CLI and `exportkit.compat()` both build them here). `op_library`
    is the caller's to apply (it is an environment of the workers)."""
    refuse_unknown("compat", flags, _FLAGS)
    flags.pop("op_library", None)
    launch = LaunchOptions(container_cli=flags.pop("container_cli", "docker"), pull=bool(flags.pop("pull", False)),
                           server_flags=parse_server_flags(texts(flags.pop("server_flag", None))))
    if "json" in flags:
        flags["json_out"] = flags.pop("json")
    for name in ("int_range", "tol"):
        if name in flags:
            flags[name] = texts(flags[name])
    return CompatOptions(path=str(path), tf=texts(tf) or None, run=bool(run), launch=launch, **flags)

