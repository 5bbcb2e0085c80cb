"""Options objects for the commands; source and export options merge the optional exportkit.toml next to a
checkpoint (or --spec FILE) with CLI flags, which win."""
from __future__ import annotations

import ast
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from exportkit.errors import UsageError
from exportkit.savedmodel import DEFAULT_SIGNATURE

SPEC_NAME = "exportkit.toml"


@dataclass
class SourceOptions:
    """Everything needed to turn a source path into a Keras model."""

    src: str
    format: str | None = None
    builder: str | None = None
    builder_args: dict = field(default_factory=dict)
    model_config: str | None = None
    custom_objects: list[str] = field(default_factory=list)
    python_path: list[str] = field(default_factory=list)
    policy: str | None = None
    unsafe: bool = False
    reference: str | None = None  # `reference` in exportkit.toml (SRC.reference.npz is found without it)


@dataclass
class ExportOptions:
    source: SourceOptions
    output: str
    version: int | None = None
    assets: list[str] = field(default_factory=list)
    signature_name: str = DEFAULT_SIGNATURE
    input_specs: list[str] = field(default_factory=list)
    int_range: str = "0:10"  # values of generated integer inputs (golden record, warm-up): LO:HI
    keep_output_dtype: bool = False
    verify: bool = True
    allow_incomplete_config: bool = False  # custom-config-* findings are warnings, not errors
    reference: str | None = None  # training-time reference (.npz from exportkit.record_reference)


@dataclass
class VerifyOptions:
    """`exportkit verify`: what to check (path, signature), with which inputs, through which runtimes, and how
    to compare and report. Flags are validated where they are used, before any runtime starts."""

    path: str
    against: SourceOptions | None = None  # the training source, for the keras runtime
    signature_name: str = DEFAULT_SIGNATURE
    inputs: str | None = None
    samples: int = 8
    seed: int = 0
    int_range: str | None = None
    save_inputs: str | None = None
    save_outputs: str | None = None
    atol: float | None = None
    rtol: float | None = None
    tol: list[str] = field(default_factory=list)
    runtimes: str | None = None
    serving: str = "auto"
    model_server_bin: str | None = None
    model_name: str | None = None
    model_version: int | None = None
    load_timeout: float = 120.0
    device: str = "cpu"
    allow_tf32: bool = False
    reference: str | None = None  # --reference: a training-time reference (.npz from exportkit.record_reference)
    baseline: str | None = None
    json_out: str | None = None
    junit: str | None = None
    # --data: verify over the records of a dataset (exportkit.verify.dataset)
    data: str | None = None
    limit: int | None = None
    batch_size: int = 256
    sample: float | None = None
    save_failures: str | None = None
    runner: str = "in-process"
    beam_options: list[str] = field(default_factory=list)
    tf_versions: list[str] = field(default_factory=list)  # --tf: also session@X.Y in managed environments


def parse_builder_args(items: list[str]) -> dict:
    """`key=value` pairs; values are Python literals (`3`, `'a'`, `[1, 2]`), else taken as plain strings."""
    args = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--builder-arg {item!r} is not key=value", "write it as --builder-arg hidden=32")
        try:
            args[key.strip()] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            args[key.strip()] = raw
    return args


def find_spec_file(src: str, spec_path: str | None) -> Path | None:
    if spec_path:
        path = Path(spec_path)
        if not path.is_file():
            raise UsageError(f"spec file {spec_path} does not exist", "pass the path of an exportkit.toml to --spec")
        return path
    src_path = Path(src)
    folder = src_path if src_path.is_dir() else src_path.parent
    candidate = folder / SPEC_NAME
    return candidate if candidate.is_file() else None


_TOML_KEYS = {
    "format", "builder", "builder_args", "model_config", "custom_objects", "python_path", "policy", "unsafe",
    "assets", "signature_name", "input_specs", "keep_output_dtype", "version", "int_range",
    "allow_incomplete_config", "reference",
}
_PATH_LISTS = ("python_path", "assets")


def read_spec_file(path: Path) -> dict:
    """Read exportkit.toml; relative paths in it are relative to the file's own directory."""
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise UsageError(f"{path} is not valid TOML ({err})", "fix the file or pass --spec with another one")
    unknown = sorted(set(data) - _TOML_KEYS)
    if unknown:
        raise UsageError(f"{path}: unknown key(s) {', '.join(unknown)}", f"use only: {', '.join(sorted(_TOML_KEYS))}")
    base = path.parent
    for key in _PATH_LISTS:
        if key in data:
            data[key] = [str((base / p).resolve()) if not Path(p).is_absolute() else p for p in data[key]]
    for key in ("model_config", "reference"):
        if key in data and not Path(data[key]).is_absolute():
            data[key] = str((base / data[key]).resolve())
    if "builder_args" in data and not isinstance(data["builder_args"], dict):
        raise UsageError(f"{path}: builder_args must be a table", "write [builder_args] with key = value lines")
    return data


def source_options(src: str, spec_path: str | None = None, *, format=None, builder=None, builder_args=(),
                   model_config=None, custom_objects=(), python_path=(), policy=None, unsafe=False,
                   spec: dict | None = None) -> SourceOptions:
    """Merge the spec file (if any) with CLI flags: a flag that is given wins; lists from both are joined."""
    if spec is None:
        spec_file = find_spec_file(src, spec_path)
        spec = read_spec_file(spec_file) if spec_file else {}
    merged_args = dict(spec.get("builder_args", {}))
    merged_args.update(parse_builder_args(list(builder_args)))
    return SourceOptions(
        src=src,
        format=format or spec.get("format"),
        builder=builder or spec.get("builder"),
        builder_args=merged_args,
        model_config=model_config or spec.get("model_config"),
        custom_objects=list(custom_objects) + list(spec.get("custom_objects", [])),
        python_path=list(python_path) + list(spec.get("python_path", [])),
        policy=policy or spec.get("policy"),
        unsafe=bool(unsafe or spec.get("unsafe", False)),
        reference=spec.get("reference"),
    )


def export_options(src: str, output: str, spec_path: str | None = None, *, version=None, assets=(),
                   signature_name=None, input_specs=(), keep_output_dtype=False, no_verify=False, int_range=None,
                   allow_incomplete_config=False, reference=None, **source_flags) -> ExportOptions:
    spec_file = find_spec_file(src, spec_path)
    spec = read_spec_file(spec_file) if spec_file else {}
    return ExportOptions(
        source=source_options(src, spec=spec, **source_flags),
        output=output,
        version=version if version is not None else spec.get("version"),
        assets=list(assets) + list(spec.get("assets", [])),
        signature_name=signature_name or spec.get("signature_name") or DEFAULT_SIGNATURE,
        input_specs=list(input_specs) or list(spec.get("input_specs", [])),
        int_range=int_range or spec.get("int_range", "0:10"),
        keep_output_dtype=bool(keep_output_dtype or spec.get("keep_output_dtype", False)),
        verify=not no_verify,
        allow_incomplete_config=bool(allow_incomplete_config or spec.get("allow_incomplete_config", False)),
        reference=reference or spec.get("reference"),
    )

