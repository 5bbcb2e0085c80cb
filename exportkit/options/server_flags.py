"""The tensorflow_model_server flags that change whether a model loads or answers: one spelling for every command.

`verify --server-flag NAME=VALUE` states how the real deployment runs its server, `exportkit serve` takes the same
flags as tensorflow_model_server, and a launched binary or container is started with them. Names, defaults and
meanings are model_servers/main.cc's (defaults: server.h's Server::Options):

* xla_cpu_compilation_enabled / xla_gpu_compilation_enabled (false): unless one is set, main.cc calls
  tensorflow::DisableXlaCompilation() before the server starts, on CPU and GPU builds alike, and everything XLA
  must compile (a jit_compile=True function, a jit_scope, an Xla* op such as a JAX export's XlaCallModule:
  exportkit.savedmodel.deployment) fails its request: "XLA compilation disabled".
* enable_signature_method_name_check (false): Classify/Regress/Predict refuse signatures whose method_name is not
  theirs (classifier.cc, regressor.cc, predict_util.cc).
* per_process_gpu_memory_fraction (0: TensorFlow picks): the share of each GPU the server takes at start.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from exportkit.errors import UsageError

XLA_FLAGS = ("xla_cpu_compilation_enabled", "xla_gpu_compilation_enabled")


@dataclass(frozen=True)
class ServerFlags:
    xla_cpu_compilation_enabled: bool = False
    xla_gpu_compilation_enabled: bool = False  # main.cc: "Enable both XLA:CPU JIT and XLA:GPU JIT"
    enable_signature_method_name_check: bool = False
    per_process_gpu_memory_fraction: float = 0.0

    @property
    def xla_enabled(self) -> bool:
        """main.cc: `if (!xla_cpu_compilation_enabled && !xla_gpu_compilation_enabled) DisableXlaCompilation();`"""
        return self.xla_cpu_compilation_enabled or self.xla_gpu_compilation_enabled

    def changed(self) -> dict:
        """{flag: value} of the flags that differ from the stock server's defaults."""
        stock = ServerFlags()
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != getattr(stock, f.name)}

    def argv(self) -> list[str]:
        """tensorflow_model_server arguments for the flags that differ from its defaults."""
        return [f"--{name}={str(value).lower() if isinstance(value, bool) else value}"
                for name, value in self.changed().items()]

    def describe(self) -> str:
        return " ".join(self.argv()) or "stock flags"


STOCK = ServerFlags()
NAMES = tuple(f.name for f in fields(ServerFlags))
_FIX = (f"pass --server-flag NAME=VALUE with NAME one of {', '.join(NAMES)} (tensorflow_model_server's spellings), "
        "e.g. --server-flag xla_cpu_compilation_enabled=true")


def parse_bool(text: str) -> bool | None:
    """TF Serving's (tensorflow::Flags) boolean spellings; None for anything else."""
    return {"true": True, "1": True, "false": False, "0": False}.get(text.strip().lower())


def check_fraction(value: float, flag: str = "--per_process_gpu_memory_fraction") -> float:
    if not 0.0 <= value <= 1.0:
        raise UsageError(f"{flag} must be between 0.0 and 1.0, got {value}",
                         "pass a fraction of the GPU's memory, e.g. 0.5 (0.0: TensorFlow picks, as TF Serving's default)")
    return value


def parse_server_flags(items: list[str] | tuple[str, ...]) -> ServerFlags:
    """`NAME=VALUE` (or a bare boolean `NAME`, meaning true), with or without leading dashes -> ServerFlags."""
    flags = STOCK
    for item in items:
        name, sep, text = item.lstrip("-").partition("=")
        name = name.replace("-", "_")
        if name not in NAMES:
            raise UsageError(f"--server-flag {item!r}: {name!r} is not a tensorflow_model_server flag exportkit models",
                             _FIX)
        if name == "per_process_gpu_memory_fraction":
            try:
                value = check_fraction(float(text), f"--server-flag {name}")
            except ValueError:
                raise UsageError(f"--server-flag {item!r}: {text!r} is not a number", _FIX) from None
        else:
            value = parse_bool(text) if sep else True
            if value is None:
                raise UsageError(f"--server-flag {item!r}: {text!r} is not true or false", _FIX)
        flags = replace(flags, **{name: value})
    return flags
