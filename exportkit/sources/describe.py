"""`exportkit inspect SRC` for a model source: inputs, outputs, dtype policy and the custom objects it needs."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from exportkit.errors import EXIT_OK, EXIT_USAGE, UsageError
from exportkit.findings import Finding
from exportkit.sources.kerases import KERAS3, prepare_process
from exportkit.options.source import SourceOptions


@dataclass
class SourceDescription:
    path: str
    format: str
    sha256: str | None = None
    policy: str | None = None
    inputs: list[dict] = field(default_factory=list)
    outputs: list[dict] = field(default_factory=list)
    custom_objects_needed: list[dict] = field(default_factory=list)
    parameters: int | None = None
    load_error: str | None = None
    findings: list[Finding] = field(default_factory=list)  # custom-object contracts (exportkit.sources.contracts)
    exit_code: int = EXIT_OK
    error: UsageError | None = field(default=None, repr=False)  # why loading failed: the caller reports it on stderr

    def to_dict(self) -> dict:
        data = asdict(replace(self, error=None))
        data.pop("exit_code")
        data.pop("error")
        return data

    def render_text(self) -> str:
        lines = [f"source   {self.path}", f"format   {self.format}"]
        if self.policy:
            lines.append(f"policy   {self.policy}")
        if self.parameters is not None:
            lines.append(f"params   {self.parameters:,}")
        for title, tensors in (("inputs", self.inputs), ("outputs", self.outputs)):
            if tensors:
                lines.append(f"{title}:")
                lines += [f"  {t['key']:<24} {t['dtype']:<9} {t['shape']}"
                          + (f"  values {t['int_range']}" if t.get("int_range") else "") for t in tensors]
        if self.custom_objects_needed:
            lines.append("custom objects needed:")
            lines += [f"  {c['name']:<24} from {c['module'] or '?'}" for c in self.custom_objects_needed]
        if self.findings:
            lines.append("findings:")
            lines += [f"  {f.severity:<7}  {f.code}  {f.message}" for f in self.findings]
        return "\n".join(lines)


def describe_source(options: SourceOptions, allow_incomplete_config: bool = False, compare=None,
                    int_range: list[str] = ()) -> SourceDescription:
    """`compare` judges rebuilt custom layers' outputs (see exportkit.sources.contracts.check_contracts);
    `int_range`: --int-range values over the derived ranges, for the generated batch the model is run on."""
    from exportkit.sources import load

    path = options.src
    fmt = load.source_format(options)
    keras = prepare_process(options, fmt) or KERAS3  # before TensorFlow: which Keras `tf.keras` means
    description = SourceDescription(path=str(Path(path).resolve()), format=fmt)
    if fmt in ("h5", "keras"):
        config = load._read_config(Path(path), fmt)
        if config is not None:
            load.import_tf()
            needed = load.unresolved_classes(config, {}, keras)
            description.custom_objects_needed = [{"name": n, "module": m} for n, m in needed]
    try:
        loaded = load.load_source(options)
    except UsageError as err:
        description.load_error = str(err)
        description.exit_code = EXIT_USAGE
        description.error = err
        return description
    description.sha256, description.policy = loaded.sha256, loaded.policy
    description.parameters = int(loaded.model.count_params())
    try:
        batches = _describe_io(loaded.model, description, list(int_range))
    except UsageError as err:  # the model fails on the generated batch: the inputs are known, say why
        description.exit_code, description.error = EXIT_USAGE, err
        return description
    from exportkit.sources.contracts import check_contracts

    description.findings = check_contracts(loaded.model, batches, loaded.custom_objects, allow_incomplete_config,
                                           compare)
    return description


def _describe_io(model, description: SourceDescription, int_range: list[str]) -> list[dict]:
    """Inputs and outputs from one generated batch (integers in the derived ranges, as export draws them), which
    is returned for the contract check."""
    import tensorflow as tf

    from exportkit.inputs.generate import generate_batches
    from exportkit.inputs.ranges import format_int_range, parse_int_range_flags
    from exportkit.sources.int_ranges import generated_inputs_failure, int_ranges_for
    from exportkit.sources.model_io import feed_model, keyed_outputs, model_input_specs

    specs = model_input_specs(model, [])
    ranges = int_ranges_for(model, specs, parse_int_range_flags(int_range))
    description.inputs = [{"key": s.key, "dtype": s.dtype, "shape": s.shape,
                           **({"int_range": format_int_range(ranges.of(s.key))} if s.key in ranges.by_input else {})}
                          for s in specs]
    batch = generate_batches(specs, samples=1, seed=0, int_range=ranges)[0]
    try:
        outputs = keyed_outputs(model, feed_model(model, {k: tf.constant(v) for k, v in batch.items()}))
    except (tf.errors.OpError, ValueError, TypeError) as err:
        raise generated_inputs_failure(err, specs, ranges) from err
    for key, tensor in outputs.items():
        shape = [-1] + [int(d) for d in tensor.shape[1:]]
        description.outputs.append({"key": key, "dtype": tensor.dtype.name, "shape": shape})
    return [batch]
