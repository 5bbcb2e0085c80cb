"""exportkit.toml: the export options kept next to a checkpoint (or given with --spec FILE), read into a dict of
flag values that the CLI's flags override (options/source.py, options/export.py)."""
from __future__ import annotations

import tomllib
from pathlib import Path

from exportkit.errors import UsageError
from exportkit.options.signatures import SignatureSpec, signature_spec

SPEC_NAME = "exportkit.toml"


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
    "allow_incomplete_config", "reference", "signatures", "feature_spec", "output", "name", "output_names",
    "keras",  # 2 or 3: which Keras loads the source (exportkit.sources.kerases)
    "op_libraries",  # read by verify/serve/compat (exportkit.tfversions.oplibs.op_libraries_env)
    "max_memory", "max_swap_memory",  # verify's memory gates, from the base directory's file (options/verify.py)
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
    for key in ("model_config", "reference", "feature_spec", "output"):
        if key in data and not Path(data[key]).is_absolute():
            data[key] = str((base / data[key]).resolve())
    if "signatures" in data:
        data["signatures"] = _signature_tables(path, data["signatures"])
    if "builder_args" in data and not isinstance(data["builder_args"], dict):
        raise UsageError(f"{path}: builder_args must be a table", "write [builder_args] with key = value lines")
    return data


def _signature_tables(path: Path, tables) -> list[SignatureSpec]:
    """`[signatures.NAME]` tables; a relative classes= path is relative to the file."""
    if not isinstance(tables, dict) or not all(isinstance(t, dict) for t in tables.values()):
        raise UsageError(f"{path}: signatures must be tables", "write [signatures.NAME] with key = value lines")
    specs = []
    for name, table in tables.items():
        table = dict(table)
        if "classes" in table and not Path(table["classes"]).is_absolute():
            table["classes"] = str((path.parent / table["classes"]).resolve())
        specs.append(signature_spec(name, table, f"{path} [signatures.{name}]"))
    return specs
