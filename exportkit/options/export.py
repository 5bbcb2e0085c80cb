"""`exportkit export`'s options: the CLI's flags merged with the optional exportkit.toml next to the source (or
--spec FILE); a flag that is given wins."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from exportkit.errors import UsageError
from exportkit.inputs.ranges import IntRangeFlags, int_range_texts, parse_int_range_flags
from exportkit.options.server_flags import STOCK, ServerFlags, parse_server_flags
from exportkit.options.signatures import SignatureSpec, merge_signatures, parse_signature_arg
from exportkit.options.source import SourceOptions, source_options, source_stem
from exportkit.options.spec_file import find_spec_file, read_spec_file
from exportkit.signature_constants import DEFAULT_SIGNATURE


@dataclass
class ExportOptions:
    """`exportkit export`: the source, where the version goes, its signatures and what is recorded with it."""

    source: SourceOptions
    output: str
    version: int | None = None
    assets: list[str] = field(default_factory=list)
    signature_name: str = DEFAULT_SIGNATURE
    input_specs: list[str] = field(default_factory=list)
    # values of generated integer inputs (golden record, warm-up): LO:HI (every integer input), NAME=LO:HI (one);
    # inputs without one get the range derived from the model's graph (exportkit.sources.int_ranges), else 0:10
    int_range: IntRangeFlags = field(default_factory=IntRangeFlags)
    keep_output_dtype: bool = False
    verify: bool = True
    allow_incomplete_config: bool = False  # custom-config-* findings are warnings, not errors
    reference: str | None = None  # training-time reference (.npz from exportkit.record_reference)
    signatures: list[SignatureSpec] = field(default_factory=list)  # empty: one predict signature `signature_name`
    feature_spec: str | None = None  # JSON overriding the tf.Example features derived from the model's inputs
    output_names: list[str] = field(default_factory=list)  # names for the outputs of a list/tuple-returning model
    output_origin: str | None = None  # how `output` was chosen when -o was not given (printed by export)
    batching_parameters: str | None = None  # TF Serving BatchingParameters: warm-up of every allowed batch size
    server_flags: ServerFlags = STOCK  # --server-flag: how the deployment's server runs (XLA on or off)


def parse_output_names(value) -> list[str]:
    """`box,landmarks,score` (or a TOML list) -> names; empty or repeated names are refused."""
    names = [n.strip() for n in (value.split(",") if isinstance(value, str) else list(value))]
    if not names or any(not n for n in names) or len(set(names)) != len(names):
        raise UsageError(f"--output-names {value!r} must be distinct, non-empty names separated by commas",
                         "write it as --output-names box,landmarks,score (in exportkit.toml: output_names = [...])")
    return names


def export_options(src: str, output: str | None, spec_path: str | None = None, *, version=None, assets=(),
                   signature_name=None, input_specs=(), keep_output_dtype=False, no_verify=False, int_range=None,
                   allow_incomplete_config=False, reference=None, signatures=(), feature_spec=None,
                   output_names=None, batching_parameters=None, server_flag=(), **source_flags) -> ExportOptions:
    spec_file = find_spec_file(src, spec_path)
    spec = read_spec_file(spec_file) if spec_file else {}
    named = merge_signatures([parse_signature_arg(text) for text in signatures], spec.get("signatures", []))
    name = signature_name or spec.get("signature_name") or DEFAULT_SIGNATURE
    if named and name != DEFAULT_SIGNATURE:
        raise UsageError(f"--signature-name {name} and --signature both name signatures",
                         "with --signature, name every signature there (e.g. --signature serving_default)")
    feature_spec = feature_spec or spec.get("feature_spec")
    if feature_spec and not Path(feature_spec).is_file():
        raise UsageError(f"--feature-spec {feature_spec} does not exist", "pass a JSON file (see docs/export.md: --feature-spec)")
    if feature_spec and not any(s.input == "examples" for s in named):
        raise UsageError("--feature-spec is given, but no signature takes tf.Example",
                         "add input=examples to a --signature, or drop --feature-spec")
    origin = None
    if not output:  # `exportkit export ckpt/`: the toml's output, else ./export/<name>
        if spec.get("output"):
            output, origin = spec["output"], f"output in {spec_file}"
        else:
            model_name = spec.get("name") or source_stem(src)
            output = str(Path("export") / model_name)
            origin = f"./export/<name>, name from {spec_file}" if spec.get("name") else "./export/<source name>"
    names = output_names if output_names is not None else spec.get("output_names")
    return ExportOptions(
        source=source_options(src, spec=spec, **source_flags),
        server_flags=parse_server_flags(list(server_flag or ())),
        output=output,
        output_origin=origin,
        output_names=parse_output_names(names) if names else [],
        version=version if version is not None else spec.get("version"),
        assets=list(assets) + list(spec.get("assets", [])),
        signature_name=name,
        input_specs=list(input_specs) or list(spec.get("input_specs", [])),
        int_range=parse_int_range_flags(int_range_texts(int_range) or int_range_texts(spec.get("int_range"))),
        keep_output_dtype=bool(keep_output_dtype or spec.get("keep_output_dtype", False)),
        verify=not no_verify,
        allow_incomplete_config=bool(allow_incomplete_config or spec.get("allow_incomplete_config", False)),
        reference=reference or spec.get("reference"),
        batching_parameters=batching_parameters,
        signatures=named,
        feature_spec=feature_spec,
    )

