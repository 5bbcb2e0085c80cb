"""How to turn a training source (a .h5/.keras file, a checkpoint, weights) into a Keras model: the source flags of
`export SRC`, `verify --against SRC` and `inspect SRC`, merged with the exportkit.toml next to the source."""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from exportkit import storage
from exportkit.errors import UsageError
from exportkit.options.flags import listed
from exportkit.options.spec_file import SPEC_NAME, find_spec_file, read_spec_file

# The source flags by their Python names (the CLI's SourceFlags; tests/test_api.py keeps the two equal).
SOURCE_FLAGS = ("format", "builder", "builder_arg", "model_config", "spec", "custom_objects", "python_path",
                "policy", "unsafe", "keras")


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
    keras: str | None = None  # --keras 2|3 (or `keras` in exportkit.toml): None reads it from the source


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


def source_options(src: str, spec_path: str | None = None, *, format=None, builder=None, builder_args=(),
                   model_config=None, custom_objects=(), python_path=(), policy=None, unsafe=False, keras=None,
                   spec: dict | None = None) -> SourceOptions:
    """Merge the spec file (if any) with CLI flags: a flag that is given wins; lists from both are joined. A source
    in a bucket is read from its local copy (with the exportkit.toml and SRC.reference.npz beside it, if any)."""
    if storage.is_url(src):
        src = local_source(src)
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
        keras=str(keras or spec.get("keras") or "") or None,
    )


def local_source(url: str) -> str:
    """The cached local copy of a source URL (a file, or a checkpoint directory), beside it the exportkit.toml and
    SRC.reference.npz the bucket holds next to it, so that they are found as on disk."""
    local = storage.local_copy(url)
    for sibling in (storage.join(storage.parent(url), SPEC_NAME), url.rstrip("/") + ".reference.npz"):
        if storage.exists(sibling):
            storage.local_copy(sibling)
    return str(local)


def source_stem(src: str) -> str:
    """`ckpt/` -> ckpt, `models/ranker.keras` -> ranker, `w.weights.h5` -> w, `ckpt/ckpt-3` -> ckpt-3."""
    name = Path(src.rstrip("/\\")).name or "model"
    for suffix in (".weights.h5", ".keras", ".hdf5", ".h5"):
        if name.lower().endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name


def source_keywords(flags: dict) -> dict:
    """The source flags by name (SOURCE_FLAGS; a repeatable one takes a list or one string) as source_options'
    keyword arguments; `spec` (the exportkit.toml to read) is not one of them."""
    return dict(format=flags.get("format"), builder=flags.get("builder"),
                builder_args=listed(flags.get("builder_arg")), model_config=flags.get("model_config"),
                custom_objects=listed(flags.get("custom_objects")), python_path=listed(flags.get("python_path")),
                policy=flags.get("policy"), unsafe=bool(flags.get("unsafe")), keras=flags.get("keras"))


def source_from_flags(src, flags: dict) -> SourceOptions:
    """SourceOptions for `src` from the source flags by name (`export SRC`'s, `verify --against SRC`'s)."""
    return source_options(str(src), flags.get("spec"), **source_keywords(flags))
