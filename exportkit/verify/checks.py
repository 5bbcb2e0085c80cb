"""verify's checks beyond "the runtimes agree": each returns findings (or report rows) for the report.

Before anything starts (static, no TensorFlow): lint, assets, the I/O-op refusal, --baseline.
While the runtimes are up: the served signatures and warm-up replay (`serving_checks`), generated inputs rejected.
From the outputs: batch independence, determinism and REST = gRPC (`behaviours`, pure functions in
verify/behaviours.py), and the training-time reference chain (`reference_chain`).
A new check goes here (its pure part beside it, like behaviours.py and baseline.py).
"""
from __future__ import annotations

import numpy as np

from exportkit.errors import InfraError, UsageError
from exportkit.findings import Finding
from exportkit.spec import VerifyOptions
from exportkit.verify.baseline import served_signature_findings
from exportkit.verify.compare import compare_batches
from exportkit.verify.execute import Labeled, error_text
from exportkit.verify.inputs import rows, same
from exportkit.verify.plan import read_model
from exportkit.verify.report import VerifyReport


def static_findings(o: VerifyOptions, proto, version_dir):
    """(findings, the io-op findings that refuse execution): lint and assets, read from the files only."""
    from exportkit.compat.oplibs import env_op_libraries
    from exportkit.compat.registry import installed
    from exportkit.deployment import deployment_findings
    from exportkit.lint import IO_OP_REFUSAL, asset_findings, lint_saved_model
    from exportkit.savedmodel import select_meta_graph
    from exportkit.tfenv import tensorflow_version

    server_registry = installed(tensorflow_version())  # the ops the stock TF Serving of this TF links
    findings = lint_saved_model(proto, o.signature_name, server_registry=server_registry,
                                op_libraries=env_op_libraries()) + asset_findings(version_dir)
    findings += deployment_findings(select_meta_graph(proto), o.server_flags, directory=version_dir)
    refused = [f for f in findings if f.code == "io-op" and f.severity == "error"]
    if refused and o.allow_io_ops:
        findings = [Finding("warning", f.code, f.message.replace(IO_OP_REFUSAL, " Executed anyway (--allow-io-ops)."))
                    if f in refused else f for f in findings]
        refused = []
    return findings, refused


def baseline_findings(o: VerifyOptions, signatures: dict, selected: list[str]) -> list[Finding]:
    """Every released signature against its new self: a removed signature is breaking, an added one is not."""
    from exportkit.verify.baseline import compare_signature_sets

    _, _, old = read_model(o.baseline)
    if o.signature_name is not None:
        if o.signature_name not in old:
            raise UsageError(f"baseline {o.baseline} has no signature '{o.signature_name}'",
                             "pass the previous release's SavedModel")
        old = {o.signature_name: old[o.signature_name]}
        signatures = {k: v for k, v in signatures.items() if k in selected}
    return compare_signature_sets(old, signatures)


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


def drop_outputs(outputs: dict[str, list], keys: set[str]) -> None:
    """--allow-nondeterministic: outputs that differ between identical requests are not compared."""
    for per_batch in outputs.values():
        for out in per_batch:
            for key in keys & set(out or {}):
                del out[key]


def reference_chain(report: VerifyReport, outputs: dict[str, list], tolerance) -> list[dict]:
    """On the training-time reference's batches, each link of trained -> reloaded -> SavedModel -> serving on its
    own, so a failure names the link that broke (not just every runtime differing from `trained`)."""
    from exportkit.reference import LINKS

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
