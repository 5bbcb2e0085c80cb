"""verify's plan: which signatures, which runtimes, which batches, and which pairs are compared, decided before any
runtime starts. Plain dataclasses (`print(plan)` shows them; arrays are left out of the repr).

A new runtime: its class in exportkit/runtimes/, its name in RUNTIME_NAMES, a PlannedRuntime here (plan_runtimes)
and its construction in exportkit/runtimes/factory.py. A new kind of pair: `pairs_for` here, its comparison in verify/pairs.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from exportkit.inputs.load import load_inputs
from exportkit.inputs.spec import InputSpec
from exportkit.errors import UsageError
from exportkit.savedmodel.layout import read_golden
from exportkit.savedmodel.manifest import Manifest, signature_entries
from exportkit.runtimes import RUNTIME_NAMES
from exportkit.options.verify import VerifyOptions
from exportkit.tfexample.features import encode_examples, from_manifest
from exportkit.compare.tolerances import Tolerance, resolve_tolerance
from exportkit.inputs.loader import check_samples, chunks, same, signature_batches, tensor_batches, unrecorded

PROTOCOLS = ("grpc", "rest", "both")
PER_DEVICE = ("keras", "saved_model", "session")  # runtimes that run once per --device (labelled name@device)


@dataclass
class Model:
    """The SavedModel as verify reads it before anything starts (protobuf only, no TensorFlow)."""

    version_dir: Path
    proto: Any = field(repr=False)
    signatures: dict = field(repr=False)  # {name: signature in savedmodel.signatures_of's form}
    selected: list[str]  # the signatures to verify
    manifest: Manifest | None = field(repr=False)  # exportkit's manifest (None: a SavedModel exportkit did not write)
    int_range: Any = None  # batches.IntRanges: [LO, HI) of generated integer inputs, per input


@dataclass
class SignatureCheck:
    """One signature to verify: its inputs, its batches, and what the export recorded about it."""

    name: str
    method: str
    specs: list[InputSpec]
    output_dtypes: dict[str, str]
    entry: dict = field(repr=False)  # the manifest's entry ({} for SavedModels exportkit did not write)
    batches: list = field(default_factory=list, repr=False)  # [(origin, batch)]
    golden: tuple = field(default=(None, None), repr=False)
    twin: str | None = None  # a tensor signature answering the same model outputs (for Example signatures)
    tolerance: Callable[[str, str], Tolerance] | None = field(default=None, repr=False)  # (key, dtype) -> Tolerance

    @property
    def examples_input(self) -> bool:
        return bool(self.entry.get("features"))

    @property
    def origins(self) -> list[str]:
        return [origin for origin, _ in self.batches]


@dataclass
class TrainedReference:
    """The training-time reference: the model's inputs and outputs as trained, answering `signature`."""

    signature: str
    path: str | None
    inputs: list = field(repr=False)
    outputs: list = field(repr=False)
    added: list = field(default_factory=list, repr=False)  # its inputs that are not golden batches (run too)


@dataclass
class PlannedRuntime:
    """One runtime to start: `label` names its row in the report (name@device with several devices)."""

    label: str
    name: str  # one of RUNTIME_NAMES
    device: str | None = None
    tf_version: str | None = None  # session@X.Y: a managed TensorFlow X.Y environment
    python: str | None = field(default=None, repr=False)


@dataclass
class Pair:
    """One comparison: `actual`'s outputs against the first of `expected` that answered the same batch.

    kind: `reference` (against the runtimes before it, in RUNTIME_NAMES order), `device` (name@gpu against name@cpu),
    `agreement` (a tf.Example signature against its tensor twin `expected_signature`, in the same runtime)."""

    kind: str
    signature: str
    actual: str
    expected: tuple[str, ...]
    expected_signature: str | None = None


@dataclass
class Plan:
    version_dir: Path
    devices: list[str]
    checks: list[SignatureCheck]
    runtimes: list[PlannedRuntime]
    pairs: list[Pair]
    trained: TrainedReference | None = None
    signatures: dict = field(default_factory=dict, repr=False)  # savedmodel.signatures_of's form
    output_names: list[str] | None = None  # the manifest's (a model returning a list)

    def answering(self, check: SignatureCheck) -> list[PlannedRuntime]:
        """The runtimes that have something to say about `check` (`trained` only about its own signature)."""
        return [r for r in self.runtimes
                if r.name != "trained" or (self.trained is not None and check.name == self.trained.signature)]

    def pairs_of(self, check: SignatureCheck, kind: str) -> list[Pair]:
        return [p for p in self.pairs if p.signature == check.name and p.kind == kind]


# -- the options: which devices, runtimes, signatures and tolerances ---------------------------------------------


def devices_of(device: str) -> list[str]:
    if device not in ("cpu", "gpu", "all"):
        raise UsageError(f"--device {device!r} is not cpu, gpu or all", "pass --device cpu, --device gpu or --device all")
    return ["cpu", "gpu"] if device == "all" else [device]


def protocol_of(protocol: str | None, serving: str) -> str:
    """--serving-protocol; by default both for servers exportkit launches, gRPC for a remote one (REST port unknown)."""
    from exportkit.serving.launch.docker import is_container_mode

    launched = serving in ("auto", "binary", "embedded") or is_container_mode(serving)
    if protocol is None:
        return "both" if launched else "grpc"
    if protocol not in PROTOCOLS:
        raise UsageError(f"--serving-protocol {protocol!r} is not grpc, rest or both", "pass --serving-protocol both")
    if protocol != "grpc" and not launched and serving != "none":
        raise UsageError(f"--serving-protocol {protocol} needs a server exportkit launches (REST port unknown for "
                         f"{serving})", "pass --serving-protocol grpc for a remote server")
    return protocol


def selected_runtimes(spec: str | None, serving: str, against, protocol: str = "grpc") -> list[str]:
    if spec:
        names = [n.strip() for n in spec.split(",") if n.strip()]
        unknown = sorted(set(names) - set(RUNTIME_NAMES))
        if unknown:
            raise UsageError(f"--runtimes: unknown runtime(s) {', '.join(unknown)}", f"use some of {','.join(RUNTIME_NAMES)}")
        if "keras" in names and not against:
            raise UsageError("--runtimes keras needs the training source", "pass --against SRC (and its source options)")
        return names
    names = [n for n in RUNTIME_NAMES if n != "keras" or against]  # "trained" is dropped later without a reference
    if serving == "none":
        return [n for n in names if n not in ("serving", "rest")]
    return [n for n in names if (n != "serving" or protocol != "rest") and (n != "rest" or protocol != "grpc")]


def selected_signatures(requested: str | None, signatures: dict) -> list[str]:
    """Every servable signature, or the one asked for (a missing one is reported as a lint finding)."""
    if requested is not None:
        return [requested] if requested in signatures else []
    return list(signatures)


def check_tol_keys(per_output: dict, output_keys: set[str]) -> None:
    unknown = sorted(set(per_output) - set(output_keys))
    if unknown:
        raise UsageError(f"--tol names output(s) {', '.join(unknown)} that the signature does not have",
                         f"use the output keys: {', '.join(sorted(output_keys))}")


def tolerances_for(atol, rtol, per_output, entry) -> Callable[[str, str], Tolerance]:
    """(output key, dtype) -> Tolerance: --tol, else --atol/--rtol, else what the export recorded, else the dtype's."""
    recorded = (entry or {}).get("tolerances", {})
    compute = {k: v.get("compute_dtype") for k, v in (entry or {}).get("outputs", {}).items()}

    def tolerance(key: str, dtype: str) -> Tolerance:
        if key not in per_output and atol is None and rtol is None and key in recorded:
            return Tolerance(**recorded[key])
        return resolve_tolerance(key, compute.get(key) or dtype, atol=atol, rtol=rtol, per_output=per_output)

    return tolerance


def read_model(path: str, *, variables: bool = True):
    """(version dir, SavedModel proto, {signature name: signature in savedmodel.signatures_of's form}). A bucket
    URL is read from its local mirror (without the variables' bytes when `variables` is False)."""
    from exportkit.savedmodel.reader import read_saved_model_proto, select_meta_graph
    from exportkit.savedmodel.signature_defs import signatures_of
    from exportkit.savedmodel.versions import resolve_savedmodel_dir

    version_dir = resolve_savedmodel_dir(path, variables=variables)
    proto = read_saved_model_proto(version_dir)
    return version_dir, proto, signatures_of(select_meta_graph(proto))


# -- the signatures and their batches -----------------------------------------------------------------------------


def _twin(name: str, entry: dict, entries: dict, selected: list[str]) -> str | None:
    """A tensor-input signature that returns every model output `name` returns (both must answer the same)."""
    wanted = {o.get("model_output") for o in entry.get("outputs", {}).values()} - {None}
    for other in selected:
        e = entries.get(other, {})
        if other != name and e and not e.get("features"):
            have = {o.get("model_output") for o in e.get("outputs", {}).values()}
            if wanted and wanted <= have:
                return other
    return None


def signature_checks(signatures: dict, names: list[str], version_dir, manifest, lo_hi, *, inputs: str | None = None,
                     samples: int = 8, seed: int = 0, atol: float | None = None, rtol: float | None = None,
                     per_output: dict | None = None) -> list[SignatureCheck]:
    """A SignatureCheck per signature of `names`, with its batches: golden, `inputs` (--inputs FILE), then
    generated (`samples`, `seed`, integer inputs in `lo_hi`), and its tolerances (--atol, --rtol, --tol).

    A tf.Example signature exportkit exported (its manifest lists the features) gets serialized Examples encoded
    from tensor batches: its twin tensor signature's, so that both answer the same values; else generated ones.
    """
    check_samples(samples)
    from exportkit.tfexample.signatures import input_specs
    from exportkit.savedmodel.reader import read_saved_model_proto, select_meta_graph

    meta_graph = select_meta_graph(read_saved_model_proto(version_dir))
    entries = signature_entries(manifest)
    checks = []
    for name in names:
        signature = signatures[name]
        specs = input_specs(meta_graph, name, signature, version_dir)  # with ExampleSpecs for tf.Example inputs
        check = SignatureCheck(name, signature.get("method") or "", specs,
                               {k: v["dtype"] for k, v in signature["outputs"].items()}, entries.get(name, {}))
        check.golden = read_golden(version_dir, name, manifest) if manifest else (None, None)
        check.tolerance = tolerances_for(atol, rtol, per_output or {}, check.entry)
        checks.append(check)
    by_name = {c.name: c for c in checks}
    generated = dict(inputs=inputs, samples=samples, seed=seed, explicit=len(names) == 1)  # for tensor_batches
    for check in sorted(checks, key=lambda c: c.examples_input):  # tensor twins first
        if not check.examples_input:
            check.batches = signature_batches(check.golden[0], check.specs, lo_hi, **generated)
            continue
        golden = [("golden", b) for b in (check.golden[0] or [])]
        features = from_manifest(check.entry["features"])
        key = check.specs[0].key
        check.twin = _twin(check.name, check.entry, entries, names)
        if check.twin:
            tensors = [(origin, b) for origin, b in by_name[check.twin].batches if origin != "golden"]
        else:
            specs = sorted((InputSpec(f.input, f.dtype, [-1, *f.shape]) for f in features), key=lambda s: s.key)
            tensors = tensor_batches(specs, lo_hi, **generated)
        check.batches = golden + unrecorded([(origin, {key: encode_examples(b, features)}) for origin, b in tensors],
                                            golden)
    if inputs and not any(origin == "file" for c in checks for origin, _ in c.batches):
        load_inputs(inputs, checks[0].specs)  # raises the UsageError that names the mismatch
    for check in checks:
        check.batches = [(origin, chunk) for origin, batch in check.batches for chunk in chunks(batch)]
    return checks


def _trained_reference(reference, manifest, version_dir, check: SignatureCheck, against) -> TrainedReference | None:
    """--reference FILE wins; else the one the export recorded (its inputs are golden batches); else one found next
    to --against SRC (SRC.reference.npz or `reference` in its exportkit.toml)."""
    from exportkit.sources import reference as refs

    recorded = manifest.reference if manifest else None
    golden_inputs = check.golden[0]
    if not reference and recorded and golden_inputs is not None:
        from exportkit.savedmodel.layout import read_reference_outputs

        inputs = [golden_inputs[i] for i in recorded["golden_batches"]]
        return TrainedReference(check.name, recorded.get("path"), inputs, read_reference_outputs(version_dir))
    if not reference and against is not None:
        reference = refs.find_reference(against.src, None, against.reference)
    if not reference:
        return None
    loaded = refs.read_reference(reference)
    inputs = refs.reference_batches(loaded, check.specs)
    return TrainedReference(check.name, loaded.path, inputs, loaded.outputs, added=inputs)


def trained_reference(o: VerifyOptions, manifest, version_dir, checks: list[SignatureCheck]) -> TrainedReference | None:
    """The training-time reference, its batches added to the signature it answers (and to its tf.Example twins).

    The reference holds the model's inputs and outputs: it answers the export's first signature (the model's
    tensors, every output), or for other SavedModels the first signature that takes tensors."""
    first = manifest.signature_name if manifest else None
    check = next((c for c in checks if c.name == first), None) if first else next(
        (c for c in checks if not c.examples_input), None)
    if check is None or check.examples_input:
        return None
    trained = _trained_reference(o.reference, manifest, version_dir, check, o.against)
    if trained is not None and trained.added:
        golden = [b for origin, b in check.batches if origin == "golden"]
        extra = [("reference", chunk) for b in trained.added if not any(same(b, g) for g in golden)
                 for chunk in chunks(b)]
        at = len(golden)
        check.batches[at:at] = extra
        for other in checks:  # an Example twin gets the same values, as Examples, at the same place
            if other.twin == check.name:
                key, features = other.specs[0].key, from_manifest(other.entry["features"])
                other.batches[at:at] = [(origin, {key: encode_examples(b, features)}) for origin, b in extra]
    return trained


# -- the runtimes and the pairs -------------------------------------------------------------------------------------


def plan_runtimes(names: list[str], devices: list[str], pythons: dict[str, str] | None = None) -> list[PlannedRuntime]:
    """Every runtime once, in RUNTIME_NAMES order (the reference is the first that answers), then session@X.Y."""
    multi = len(devices) > 1
    planned = []
    for name in names:
        if name in PER_DEVICE:
            planned += [PlannedRuntime(f"{name}@{dev}" if multi else name, name, dev) for dev in devices]
        elif name in ("serving", "rest"):
            planned.append(PlannedRuntime(name, name, devices[-1]))
        else:
            planned.append(PlannedRuntime(name, name))
    order = {n: i for i, n in enumerate(RUNTIME_NAMES)}
    planned.sort(key=lambda r: (order[r.name], r.label))
    return planned + [PlannedRuntime(f"session@{v}", "session", "cpu", tf_version=v, python=python)
                      for v, python in (pythons or {}).items()]


def pairs_for(signature: str, labels: list[str], devices: list[str]) -> list[Pair]:
    """Each runtime against the ones before it (per batch, the first that answered is the reference); with
    --device all, also every @gpu runtime against its @cpu twin."""
    pairs = [Pair("reference", signature, label, tuple(labels[:i])) for i, label in enumerate(labels) if i]
    if len(devices) > 1:
        pairs += [Pair("device", signature, label, (label[: -len("@gpu")] + "@cpu",)) for label in labels
                  if label.endswith("@gpu") and label[: -len("@gpu")] + "@cpu" in labels]
    return pairs


def make_plan(o: VerifyOptions, model: Model, names: list[str], devices: list[str], per_output: dict,
              pythons: dict[str, str]) -> Plan:
    """The whole plan. Without a golden record (a third-party SavedModel) or a training-time reference, the
    runtimes that would replay them are left out; the others still agree or not."""
    version_dir, manifest = model.version_dir, model.manifest
    checks = signature_checks(model.signatures, model.selected, version_dir, manifest, model.int_range,
                              inputs=o.inputs, samples=o.samples, seed=o.seed, atol=o.atol, rtol=o.rtol,
                              per_output=per_output)
    names = list(names)
    if "golden" in names and all(c.golden[0] is None for c in checks):
        names.remove("golden")
    trained = trained_reference(o, manifest, version_dir, checks)
    if trained is None and "trained" in names:
        names.remove("trained")
    plan = Plan(Path(version_dir), devices, checks, plan_runtimes(names, devices, pythons), [], trained,
                model.signatures, manifest.output_names if manifest else None)
    by_name = {c.name: c for c in checks}
    for check in checks:
        labels = [r.label for r in plan.answering(check)]
        plan.pairs += pairs_for(check.name, labels, devices)
        if check.twin:
            plan.pairs += [Pair("agreement", check.name, label, (label,), check.twin) for label in labels
                           if label != "golden" and label in {r.label for r in plan.answering(by_name[check.twin])}]
    return plan
