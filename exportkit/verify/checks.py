"""verify's checks beyond "the runtimes agree": each returns findings (or report rows) for the report.

Before anything starts (static, no TensorFlow): lint, assets, the I/O-op refusal, --baseline.
While the runtimes are up: the served signatures and warm-up replay (`serving_checks`), generated inputs rejected,
open dims at other sizes (`dynamic_dims`, pure part in verify/shapes.py).
From the outputs: batch independence, determinism and REST = gRPC (`behaviours`, pure functions in
verify/behaviours.py), NaN/Inf (`non_finite`, verify/finite.py), and the training-time reference chain
(`reference_chain`).
A new check goes here (its pure part beside it, like behaviours.py and baseline.py).
"""
from __future__ import annotations

import numpy as np

from exportkit.inputs.generate import DEFAULT_UNKNOWN_DIM
from exportkit import storage
from exportkit.errors import InfraError, UsageError
from exportkit.findings import Finding
from exportkit.options.verify import VerifyOptions
from exportkit.verify.baseline import served_signature_findings
from exportkit.compare.outputs import compare_batches
from exportkit.verify.execute import Labeled, error_text
from exportkit.inputs.loader import rows, same
from exportkit.verify.plan import read_model
from exportkit.verify.report import VerifyReport


def static_findings(o: VerifyOptions, proto, version_dir):
    """(findings, the io-op findings that refuse execution): lint and assets, read from the files only."""
    from exportkit.tfversions.oplibs import env_op_libraries
    from exportkit.tfversions.installed import registered_ops
    from exportkit.tfversions.registry import installed
    from exportkit.savedmodel.deployment import deployment_findings
    from exportkit.savedmodel.lint import IO_OP_REFUSAL, asset_findings, lint_saved_model
    from exportkit.savedmodel.reader import select_meta_graph
    from exportkit.tfenv import tensorflow_version

    server_registry = installed(tensorflow_version())  # the ops the stock TF Serving of this TF links
    findings = lint_saved_model(proto, o.signature_name, installed_ops=registered_ops(),
                                server_registry=server_registry, op_libraries=env_op_libraries())
    findings += asset_findings(version_dir)
    findings += deployment_findings(select_meta_graph(proto), o.server_flags, directory=version_dir)
    refused = [f for f in findings if f.code == "io-op" and f.severity == "error"]
    if refused and o.allow_io_ops:
        findings = [Finding("warning", f.code, f.message.replace(IO_OP_REFUSAL, " Executed anyway (--allow-io-ops)."))
                    if f in refused else f for f in findings]
        refused = []
    return findings, refused


def baseline_findings(o: VerifyOptions, signatures: dict, selected: list[str],
                      version_dir=None) -> tuple[list[Finding], dict]:
    """Every released signature against its new self: a removed signature is breaking, an added one is not.

    (findings, the report's `baseline`: what was compared with what). The released signatures are --baseline's,
    else the deployed model's (--serving HOST:PORT: GetModelMetadata of the version clients get), else those of
    the newest lower version in the base directory (what TF Serving served before this one); --no-baseline: none."""
    from exportkit.verify.baseline import compare_signature_sets

    compared = {"new": storage.display(version_dir) if version_dir is not None else o.path}
    if o.no_baseline:
        return [], {**compared, "source": "none", "old": None, "why": "--no-baseline"}
    if o.baseline:
        old_dir, _, old = read_model(o.baseline)
        compared.update(source="--baseline", old=storage.display(old_dir))
    else:
        try:
            found = _deployed(o, version_dir) if _remote(o.serving) else _previous_version(version_dir)
        except (UsageError, InfraError) as err:  # the old version is damaged, or the server does not answer: say
            # so, and verify the new one all the same (a server that does not answer fails the serving runtime, exit 3)
            return [Finding("warning", "baseline-unreadable", f"the version served before could not be read, so "
                                                              f"its clients' signatures were not compared: {err.message}")
                    ], {**compared, "source": "none", "old": None, "why": "unreadable"}
        if found is None:
            why = ("the server serves no version of this model" if _remote(o.serving)
                   else "no lower version in the base directory" if version_dir is None or version_dir.name.isdigit()
                   else "not a numbered version directory")
            return [], {**compared, "source": "none", "old": None, "why": why}
        source, where, old = found
        compared.update(source=source, old=where)
    if o.signature_name is not None:
        if o.signature_name not in old:
            if o.baseline:
                raise UsageError(f"baseline {o.baseline} has no signature '{o.signature_name}'",
                                 "pass the previous release's SavedModel")
            return [Finding("info", "baseline-added-signature", f"new signature '{o.signature_name}' (not in "
                                                                f"{compared['old']}: compatible)")], compared
        old = {o.signature_name: old[o.signature_name]}
        signatures = {k: v for k, v in signatures.items() if k in selected}
    found = compare_signature_sets(old, signatures)
    return [Finding(f.severity, f.code, f"{f.message} (compared with {compared['old']})") if f.severity == "error"
            else f for f in found], compared


def _remote(serving: str) -> bool:
    from exportkit.serving.launch.docker import is_container_mode

    return serving not in ("auto", "binary", "embedded", "none") and not is_container_mode(serving)


def _previous_version(version_dir):
    """("previous-version", its path, its signatures) of the newest version below `version_dir` in its base
    directory (in the bucket, for a bucket version's mirror), or None (not a numbered version, or the first one)."""
    from exportkit.savedmodel.versions import list_versions, version_path

    if version_dir is None or not version_dir.name.isdigit():
        return None
    base = storage.parent(storage.display(version_dir))
    lower = [v for v in list_versions(base) if v < int(version_dir.name)]
    if not lower:
        return None
    old_dir = version_path(base, lower[-1])
    _, _, old = read_model(str(old_dir), variables=False)
    return "previous-version", str(old_dir), old


def _deployed(o: VerifyOptions, version_dir):
    """("serving", "HOST:PORT model M version V", its signatures): GetModelMetadata of the version a client that
    names no version gets (TF Serving's default: the newest available), or None when the server has no such model."""
    from exportkit.savedmodel.signature_defs import tensor_info_dict
    from exportkit.savedmodel.versions import resolve_model_path
    from exportkit.serving.client.grpc_client import ServingClient, ServingError, as_exportkit_error

    address = o.serving[len("remote:"):] if o.serving.startswith("remote:") else o.serving
    name = o.model_name or resolve_model_path(o.path).default_name  # the name the serving runtime asks for
    with ServingClient(address, name, timeout=min(o.load_timeout, 30.0)) as client:
        try:
            metadata = client.metadata()
            versions = [v.version for v in client.status().model_version_status]
        except ServingError as err:
            if err.code == "NOT_FOUND":
                return None
            raise as_exportkit_error(err, f"GetModelMetadata of model '{name}' at {address} (the baseline)",
                                     "check the address and --model-name, or pass --no-baseline") from None
    old = {key: {"method": sig.method_name,
                 "inputs": {k: tensor_info_dict(v) for k, v in sig.inputs.items()},
                 "outputs": {k: tensor_info_dict(v) for k, v in sig.outputs.items()},
                 "defaults": sorted(getattr(sig, "defaults", None) or ())}
           for key, sig in metadata.items() if key != "__saved_model_init_op"}
    version = f" version {max(versions)}" if versions else ""
    return "serving", f"model '{name}'{version} served at {address}", old


def serving_checks(runtimes_: list[Labeled], signatures, selected, version_dir, results, report,
                   infra: list | None = None) -> None:
    """Served signatures and warm-up replay. An InfraError marks the serving rows and goes to `infra` (the caller
    prints the report, then exits 3); without `infra` it propagates."""
    from exportkit.runtimes.serving import ServingRuntime

    for item in runtimes_:
        runtime = item.runtime
        if not isinstance(runtime, ServingRuntime) or not runtime.loaded:
            continue
        if any(r.status != "ok" for per in results.values() for r in per if r.name == item.label):
            continue
        try:
            served = runtime.served_signatures()
            for name in selected:
                report.findings += served_signature_findings(name, signatures[name], served)
            report.findings += runtime.replay_warmup(str(version_dir))
        except InfraError as err:
            if infra is None:
                raise
            for per in results.values():
                for r in per:
                    if r.name == item.label:
                        r.status, r.error = "error", error_text(err)
            infra.append(err)


PROBE_RUNTIMES = ("session", "saved_model")  # the serving-equivalent one first: what TF Serving would do


def dynamic_dims(o: VerifyOptions, checks, runtimes_: list[Labeled], results, report, int_range,
                 infra: list | None = None) -> None:
    """Open non-batch dims at sizes 1 and long (verify/shapes.py), one row each, on the serving-equivalent runtime
    (one that answered the signature's ordinary batches); a failure is a finding naming the input, dim and size."""
    from exportkit.runtimes.loop import BatchLoop
    from exportkit.verify.shapes import dim_failure, probe_batch, probe_sizes

    tried = {}
    for check in checks:
        sizes = [] if check.examples_input else probe_sizes(check.specs)
        ok = {r.name for r in results.get(check.name, []) if r.status == "ok"}
        item = next((i for name in PROBE_RUNTIMES for i in runtimes_
                     if i.label.split("@")[0] == name and i.label in ok), None)
        if not sizes or item is None or getattr(item.runtime, "rejected_generated", None):
            continue  # (generated inputs it rejects at the default size say nothing about other sizes)
        item.runtime.use_signature(check.name, {s.key: s.dtype for s in check.specs})
        for size in sizes:
            try:
                BatchLoop(item.runtime, timed=False).run(probe_batch(check.specs, size, o.seed, int_range))
            except InfraError as err:
                if infra is None:
                    raise
                infra.append(err)
                return
            except Exception as err:  # the model's failure at a size its signature allows
                text = " ".join(str(getattr(err, "message", None) or err).split())
                report.findings.append(dim_failure(check.name, check.specs, size, item.label,
                                                   text[:300] + ("..." if len(text) > 300 else "")))
        tried[check.name] = sorted({*sizes, DEFAULT_UNKNOWN_DIM})
    if tried:
        report.inputs["open_dim_sizes"] = tried


def rejected_inputs_findings(runtimes_: list[Labeled]) -> list[Finding]:
    rejected = [(item.label, item.runtime.rejected_generated) for item in runtimes_
                if getattr(item.runtime, "rejected_generated", None)]
    if not rejected:
        return []
    return [Finding("warning", "generated-inputs-rejected", (
        f"the model rejects exportkit's generated inputs ({rejected[0][0]}: {rejected[0][1]}); they were "
        f"left out and only the golden/--inputs batches compared. The inputs were wrong, not the model"))]


def behaviours(report: VerifyReport, outputs: dict[str, list], batches, tolerance, allow_nondeterministic: bool,
               output_dtypes: dict[str, str], signature: str | None = None) -> set[str]:
    """Batch independence and determinism in every runtime, REST against gRPC; returns nondeterministic keys."""
    from exportkit.verify.behaviours import behaviour_findings, json_findings

    def index(origin, many=False):
        return next((i for i, (o, b) in enumerate(batches) if o == origin and (rows(b) > 1) == many), None)

    def generated(many=False):
        """The generated batch, or the golden batch equal to it (not run twice, see inputs.unrecorded)."""
        found = index("generated", many)
        if found is None and repeat is not None:
            probe = batches[repeat][1]
            found = next((i for i, (o, b) in enumerate(batches) if o == "golden" and (rows(b) > 1) == many
                          and same({k: np.asarray(v)[:1] for k, v in b.items()}, probe)), None)
        return found

    repeat = index("repeat")
    single, many = generated(), generated(many=True)
    noisy: set[str] = set()
    found = []
    if single is not None and repeat is not None:
        per_runtime = {label: (per_batch[single], per_batch[repeat], per_batch[many] if many is not None else None)
                       for label, per_batch in outputs.items()}
        more, noisy = behaviour_findings(per_runtime, 1, tolerance, allow_nondeterministic)
        found += more
    if "serving" in outputs and "rest" in outputs:
        strip = [{k: v for k, v in (o or {}).items() if k not in noisy} if o is not None else None
                 for o in outputs["serving"]]
        found += json_findings(strip, outputs["rest"], output_dtypes)
    if signature:  # several signatures: say which
        found = [Finding(f.severity, f.code, f"signature '{signature}': {f.message}") for f in found]
    report.findings += found
    return noisy


def non_finite(report: VerifyReport, outputs: dict[str, list], signature: str | None = None) -> None:
    """NaN/Inf in the outputs: a warning, an error where the reference was finite (verify/finite.py)."""
    from exportkit.compare.finite import non_finite_findings

    report.findings += non_finite_findings(outputs, signature)


def drop_outputs(outputs: dict[str, list], keys: set[str]) -> None:
    """--allow-nondeterministic: outputs that differ between identical requests are not compared."""
    for per_batch in outputs.values():
        for out in per_batch:
            for key in keys & set(out or {}):
                del out[key]


def reference_chain(report: VerifyReport, outputs: dict[str, list], tolerance) -> list[dict]:
    """On the training-time reference's batches, each link of trained -> reloaded -> SavedModel -> serving on its
    own, so a failure names the link that broke (not just every runtime differing from `trained`)."""
    from exportkit.sources.reference import LINKS

    if "trained" not in outputs:
        return []
    index = [i for i, o in enumerate(outputs["trained"]) if o is not None]

    def runtime(*names):
        for r in report.runtimes:
            if r.name.split("@")[0] in names and r.name in outputs and all(outputs[r.name][i] is not None for i in index):
                return r.name
        return None

    reloaded, saved = runtime("golden", "keras"), runtime("saved_model")
    chain = []

    def link(name, a, b):
        if a is None or b is None:
            why = ("no reloaded model: export with the reference, or pass --against SRC" if reloaded is None
                   else "a runtime of this link did not run")
            chain.append({"link": name, "from": a, "to": b, "output": None, "passed": None, "reason": f"not checked: {why}"})
            return
        for c in compare_batches([outputs[a][i] for i in index], [outputs[b][i] for i in index], tolerance):
            chain.append({"link": name, "from": a, "to": b, "output": c.key, "passed": c.passed,
                          "max_abs_err": c.max_abs_err, "reason": c.reason or ""})

    if reloaded is None and saved is not None:  # no reloaded model here: the first two links as one
        link("trained -> SavedModel", "trained", saved)
    else:
        link(LINKS[0], "trained", reloaded)
        link(LINKS[1], reloaded, saved)
    for label in [r.name for r in report.runtimes if r.name.split("@")[0] in ("session", "serving")]:
        if label in outputs:
            link(LINKS[2], saved or reloaded, label)
    return chain


def message_sizes(o: VerifyOptions, plan, execution, report: VerifyReport) -> None:
    """The gRPC messages of every signature at the batch sizes tried, from what the server answered (else the
    serving-equivalent session)."""
    for check in plan.checks:
        answered = execution.outputs.get(check.name, {})
        labels = sorted(answered, key=lambda label: (label.split("@")[0] not in ("serving", "session"), label))
        answers = [next((answered[label][i] for label in labels if answered[label][i] is not None), None)
                   for i in range(len(check.batches))]
        signature_message_sizes(o, plan.version_dir, check.name, plan.signatures[check.name],
                                [b for _, b in check.batches], answers, report)


def signature_message_sizes(o: VerifyOptions, version_dir, name: str, signature: dict, batches: list[dict],
                            answers: list, report: VerifyReport) -> None:
    """One signature's gRPC request and answer per batch size (verify/messages.py) into `report.messages`, and
    findings over the limits."""
    from exportkit.savedmodel.signature_defs import serving_api
    from exportkit.savedmodel.versions import resolve_model_path
    from exportkit.serving.messages import ModelSpec
    from exportkit.verify.messages import signature_sizes, size_findings

    where = resolve_model_path(str(version_dir))
    sizes = signature_sizes(name, serving_api(signature)[0], batches, answers,
                            ModelSpec(o.model_name or where.default_name, name, where.version))
    report.messages.append(sizes)
    report.findings += size_findings(sizes)
