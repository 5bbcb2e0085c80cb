"""Options objects for the commands; source and export options merge the optional exportkit.toml next to a
checkpoint (or --spec FILE) with CLI flags, which win."""
from __future__ import annotations

import ast
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from exportkit.inputs.load import IntRangeFlags, int_range_texts, parse_int_range_flags
from exportkit.errors import UsageError
from exportkit.signature_constants import DEFAULT_SIGNATURE
from exportkit.options.server_flags import STOCK, ServerFlags

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
    keras: str | None = None  # --keras 2|3 (or `keras` in exportkit.toml): None reads it from the source


METHODS = ("predict", "classify", "regress")
INPUT_KINDS = ("tensors", "examples")
_SIGNATURE_KEYS = ("outputs", "input", "method", "scores", "classes")
_SIGNATURE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]*")


@dataclass
class SignatureSpec:
    """One named signature of an export (`--signature NAME:key=value,...` or `[signatures.NAME]`).

    Only what can be checked without the model is checked here; outputs are checked against the model later.
    """

    name: str
    outputs: list[str] | None = None  # model output keys (a subset); None = all
    input: str = "tensors"  # tensors | examples (one string tensor of serialized tf.Example)
    method: str = "predict"  # predict | classify | regress
    scores: str | None = None  # classify: the model output that holds the class scores
    classes: str | None = None  # classify: label file, one class per line, shipped as an asset


def _signature_error(where: str, problem: str, fix: str) -> UsageError:
    return UsageError(f"{where}: {problem}", fix)


def signature_spec(name: str, values: dict, where: str) -> SignatureSpec:
    """A SignatureSpec from `key: value` pairs (CLI or TOML), checked for what needs no model."""
    if not _SIGNATURE_NAME.fullmatch(name or ""):
        raise _signature_error(where, f"bad signature name {name!r}",
                               "use letters, digits and _ . / - (e.g. --signature embed:outputs=embedding)")
    unknown = sorted(set(values) - set(_SIGNATURE_KEYS))
    if unknown:
        raise _signature_error(where, f"unknown key(s) {', '.join(unknown)}", f"use only: {', '.join(_SIGNATURE_KEYS)}")
    outputs = values.get("outputs")
    if isinstance(outputs, str):
        outputs = [o.strip() for o in outputs.split("+") if o.strip()]
    if outputs is not None and (not isinstance(outputs, list) or not outputs):
        raise _signature_error(where, "outputs must name at least one model output", "write outputs=a+b")
    spec = SignatureSpec(name=name, outputs=outputs, input=str(values.get("input", "tensors")),
                         method=str(values.get("method", "predict")), scores=values.get("scores"),
                         classes=values.get("classes"))
    if spec.input not in INPUT_KINDS:
        raise _signature_error(where, f"input={spec.input} is not tensors or examples", "write input=tensors or input=examples")
    if spec.method not in METHODS:
        raise _signature_error(where, f"method={spec.method} is not predict, classify or regress",
                               "write method=predict, method=classify or method=regress")
    if spec.method in ("classify", "regress") and spec.input != "examples":
        raise _signature_error(where, f"a {spec.method} signature takes serialized tf.Example (TF Serving's "
                                      f"{spec.method.capitalize()} API sends Examples), but input={spec.input}",
                               f"add input=examples to signature '{name}'")
    if spec.method != "classify" and (spec.scores or spec.classes):
        raise _signature_error(where, "scores= and classes= belong to classify signatures",
                               f"add method=classify to signature '{name}', or drop scores=/classes=")
    if spec.method == "classify" and outputs is not None:
        raise _signature_error(where, "a classify signature names its outputs scores and classes, not outputs=",
                               "write scores=MODEL_OUTPUT (and classes=labels.txt)")
    if spec.method == "regress" and outputs is not None and len(outputs) != 1:
        raise _signature_error(where, f"a regress signature has one output, got outputs={'+'.join(outputs)}",
                               "name one model output: outputs=OUTPUT")
    if spec.classes is not None and not Path(spec.classes).is_file():
        raise _signature_error(where, f"classes file {spec.classes} does not exist",
                               "pass a text file with one class label per line: classes=labels.txt")
    return spec


def parse_signature_arg(text: str) -> SignatureSpec:
    """`NAME[:key=value[,key=value...]]`, e.g. `embed:outputs=embedding` or `cls:input=examples,method=classify`."""
    name, _, rest = text.partition(":")
    values = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--signature {text!r}: {item!r} is not key=value",
                             "write --signature NAME:outputs=a+b,input=examples,method=predict")
        if key.strip() in values:
            raise UsageError(f"--signature {text!r}: {key.strip()}= is given twice",
                             f"give each key once (several outputs: {key.strip()}=a+b)")
        values[key.strip()] = value.strip()
    return signature_spec(name.strip(), values, f"--signature {text!r}")


def merge_signatures(flags: list[SignatureSpec], table: list[SignatureSpec]) -> list[SignatureSpec]:
    """exportkit.toml's signatures, each replaced by a flag of the same name, then the other flags; names unique."""
    seen = set()
    for spec in flags:
        if spec.name in seen:
            raise UsageError(f"--signature {spec.name} is given twice", "give each signature a unique name")
        seen.add(spec.name)
    by_name = {spec.name: spec for spec in flags}
    merged = [by_name.pop(spec.name, spec) for spec in table]
    return merged + [spec for spec in flags if spec.name in by_name]


@dataclass
class ExportOptions:
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

    def __post_init__(self):
        check_tolerances(self.atol, self.rtol)


def check_tolerances(atol: float | None, rtol: float | None) -> None:
    """--atol/--rtol: finite and >= 0 (NaN compares false everywhere and -inf made the search for the required
    tolerance spin): a UsageError naming the flag."""
    for flag, value in (("--atol", atol), ("--rtol", rtol)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise UsageError(f"{flag} {value} must be a finite number >= 0",
                             f"pass {flag} 1e-5 (for example), or leave it out for the dtype's default")


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
    "allow_incomplete_config", "reference", "signatures", "feature_spec", "output", "name", "output_names",
    "keras",  # 2 or 3: which Keras loads the source (exportkit.sources.kerases)
    "op_libraries",  # read by verify/serve/compat (exportkit.tfversions.oplibs.op_libraries_env)
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


def source_options(src: str, spec_path: str | None = None, *, format=None, builder=None, builder_args=(),
                   model_config=None, custom_objects=(), python_path=(), policy=None, unsafe=False, keras=None,
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
        keras=str(keras or spec.get("keras") or "") or None,
    )


def source_stem(src: str) -> str:
    """`ckpt/` -> ckpt, `models/ranker.keras` -> ranker, `w.weights.h5` -> w, `ckpt/ckpt-3` -> ckpt-3."""
    name = Path(src.rstrip("/\\")).name or "model"
    for suffix in (".weights.h5", ".keras", ".hdf5", ".h5"):
        if name.lower().endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name


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
                   output_names=None, batching_parameters=None, **source_flags) -> ExportOptions:
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

