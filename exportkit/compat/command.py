"""exportkit compat: will this SavedModel load, run and agree on TF Serving X.Y?  One row per version.

predicted: the static analysis of exportkit.tfversions.analysis for the device asked (no TensorFlow import).
observed (`--run`): the serving-equivalent session runtime on TensorFlow X.Y (`session@X.Y`, a managed
environment), fed the golden inputs and generated batches, compared with the reference (the golden outputs,
else the session runtime on this Python's TensorFlow) with verify's tolerances. Versions run two at a time.
served (`--serving docker[:TAG]`): the real TF Serving X.Y, its official image in a container, asked through gRPC
and compared the same way: the ground truth the prediction and the managed loaders are checked against.
"""
from __future__ import annotations

import sys

from exportkit import storage
from exportkit.errors import UsageError
from exportkit.options.compat import CompatOptions
from exportkit.options.server_flags import STOCK
from exportkit.compat.report import CompatReport, VersionRow, compat_html, compat_markdown, render_text

PARALLEL_VERSIONS = 2


def compat_command(o: CompatOptions) -> int:
    """The CLI's compat: run_compat, rendered where the flags say."""
    from exportkit.report.artifacts import check_report_options, print_report, write_report_files

    check_report_options(o.html, o.summary)
    report = run_compat(o)
    print_report(render_text(report, report.run), report.to_dict(), o.json_out)
    sys.stdout.flush()
    write_report_files(o.html, o.summary, lambda: compat_html(report, other_device_rows(report)),
                       lambda: compat_markdown(report))
    return report.exit_code


def other_device_rows(report: CompatReport) -> list[VersionRow]:
    """The static forecast of the other device (cheap: no TensorFlow), so the HTML shows a version x device matrix."""
    from exportkit.tfversions import analysis
    from exportkit.savedmodel.reader import read_saved_model_proto, select_meta_graph

    other = "gpu" if report.device == "cpu" else "cpu"
    meta_graph = select_meta_graph(read_saved_model_proto(report.path))
    return [VersionRow(r.tf, r.predicted, findings=r.findings)
            for r in analysis.analyze(meta_graph, [v.tf for v in report.versions], other, report.server,
                                      report.flags or STOCK)]


def run_compat(o: CompatOptions) -> CompatReport:
    """The compat matrix, rendered nowhere (the Python API's `exportkit.compat` and the CLI call it). `o.serving`:
    None, or docker[:TAG] to observe each version on TF Serving's own image (`o.launch`: how it is started).
    `o.server`: stock (TF X.Y and the op libraries tensorflow_model_server links) or tf-only."""
    from exportkit.tfversions import analysis, parse_versions
    from exportkit.tfversions.registry import SERVERS
    from exportkit.savedmodel.reader import select_meta_graph
    from exportkit.verify.plan import read_model

    device, server, serving, signature_name = o.device, o.server, o.serving, o.signature_name
    versions = parse_versions(o.tf)
    if server not in SERVERS:
        raise UsageError(f"--server {server!r} is not one of {', '.join(SERVERS)}",
                         "pass --server stock (what tensorflow_model_server links) or --server tf-only")
    if device not in ("cpu", "gpu"):
        raise UsageError(f"--device {device!r} is not cpu or gpu", "pass --device cpu or --device gpu")
    if o.run and device == "gpu":
        raise UsageError("--run observes on the CPU only (the managed environments hold tensorflow-cpu)",
                         "drop --run for the GPU forecast, or use --device cpu --run")
    if serving is not None:
        _check_server_choice(serving, versions)
    version_dir, proto, signatures = read_model(o.path, variables=bool(o.run or serving))  # static: the graph only
    signature = signatures.get(signature_name)
    meta_graph = select_meta_graph(proto)
    flags = o.launch.server_flags  # compat --server-flag: how the servers are started
    predicted = analysis.analyze(meta_graph, versions, device, server, flags)
    rows = [VersionRow(r.tf, r.predicted, findings=r.findings) for r in predicted]
    if o.run or serving:
        if signature is None:
            raise UsageError(f"{version_dir} has no signature '{signature_name}' to run",
                             "pass --signature-name with one of its signatures")
        servers = _servers(serving, [r.tf for r in rows], device, o.launch) if serving else {}
        _observe(rows, version_dir, meta_graph, signature_name, signature, o.samples, o.seed, o.int_range, o.atol,
                 o.rtol, o.tol, run=o.run, servers=servers, device=device, launch=o.launch, load_timeout=o.load_timeout)
    return CompatReport(path=storage.display(version_dir), device=device, versions=rows, run=o.run, server=server,
                        flags=flags)


def _check_server_choice(serving: str, versions: list[str]) -> None:
    from exportkit.serving.launch.docker import is_container_mode

    if not is_container_mode(serving):
        raise UsageError(f"compat --serving {serving!r}: compat observes TF Serving X.Y through its official image",
                         "pass --serving docker (each version's image) or --serving docker:TAG with one --tf X.Y")
    if serving != "docker" and len(versions) != 1:
        raise UsageError(f"--serving {serving} names one image, and --tf names {len(versions)} versions",
                         "pass --serving docker (each version's own image), or one --tf X.Y")


def _servers(serving: str, versions: list[str], device: str, launch) -> dict[str, str]:
    """{X.Y: the --serving mode of its image}: the one named, or the newest local tensorflow/serving:X.Y.Z."""
    from exportkit.serving.launch import docker as container

    if serving != "docker":
        return {versions[0]: serving}
    cli = container.ContainerCli(launch.container_cli if launch else "docker")
    return {v: f"docker:{container.image_of_version(cli, v, device)}" for v in versions}


def _observe(rows, version_dir, meta_graph, signature_name, signature, samples, seed, int_range, atol, rtol, tol, *,
             run=True, servers=None, device="cpu", launch=None, load_timeout=120.0) -> None:
    """Fill `observed`/`error` of each row from session@X.Y (`run`) and `served` from TF Serving X.Y's image
    (`servers`: {X.Y: docker mode}), compared with the reference like verify does."""
    from exportkit.inputs.ranges import parse_int_range_flags
    from exportkit.savedmodel.int_ranges import savedmodel_int_ranges
    from exportkit.savedmodel.manifest import read_manifest
    from exportkit.compare.tolerances import parse_tol
    from exportkit.verify.report import VerifyReport
    from exportkit.verify.execute import build_runtimes, close_all, run_signature, started, versioned_pythons
    from exportkit.verify.memory import figures_by_label
    from exportkit.verify.pairs import compare_all
    from exportkit.verify.plan import Plan, plan_runtimes, signature_checks, tolerances_for

    from exportkit.runtimes.factory import RuntimeSpec, ServerSpec, build
    from exportkit.verify.execute import Labeled

    # installs what is missing, before anything runs
    pythons = versioned_pythons([",".join(r.tf for r in rows)]) if run else {}
    manifest, _ = read_manifest(version_dir)
    lo_hi = savedmodel_int_ranges(parse_int_range_flags(int_range or []), manifest, meta_graph,
                                  {signature_name: signature})
    check = signature_checks({signature_name: signature}, [signature_name], version_dir, manifest, lo_hi,
                             samples=samples, seed=seed)[0]
    batches = check.batches
    # The reference: the golden record where there is one, else the session runtime on this Python's TF.
    names = ["golden", "session"] if check.golden[0] is not None else ["session"]

    def plan(names, pythons=None):
        return Plan(version_dir, ["cpu"], [check], plan_runtimes(names, ["cpu"], pythons), [])

    report = VerifyReport(path=storage.display(version_dir), signature=signature_name, reference="")
    outputs: dict[str, list] = {}
    memory: dict[str, dict] = {}
    versions = list(pythons)
    waves = [versions[i:i + PARALLEL_VERSIONS] for i in range(0, len(versions), PARALLEL_VERSIONS)]
    with started(None, plan(names)) as references:  # golden and session runtimes: no verify options needed
        # overlaps the references
        wave = build_runtimes(None, plan([], {v: pythons[v] for v in waves[0]})) if waves else []
        for item in references:
            report.runtimes.append(run_signature(item, check, outputs))
    for version, mode in (servers or {}).items():  # one container at a time: each holds the model
        server = Labeled(build(RuntimeSpec("serving", str(version_dir), signature_name, device,
                                           signatures={signature_name: signature},
                                           server=ServerSpec(mode, load_timeout=load_timeout, launch=launch))),
                         f"serving@{version}")
        try:
            report.runtimes.append(run_signature(server, check, outputs))
        finally:
            close_all([server])
    for index in range(len(waves)):
        if index:
            wave = build_runtimes(None, plan([], {v: pythons[v] for v in waves[index]}))
        try:
            for item in wave:
                report.runtimes.append(run_signature(item, check, outputs))
            memory.update(figures_by_label(wave))  # what the load takes in each TensorFlow (verify/memory.py)
        finally:
            close_all(wave)
    per_output = dict(parse_tol(t) for t in tol or [])
    compare_all(report, outputs, batches, tolerances_for(atol, rtol, per_output, check.entry), ["cpu"])
    by_label = {r.name: r for r in report.runtimes}
    for row in rows:
        if f"serving@{row.tf}" in by_label:
            result = by_label[f"serving@{row.tf}"]
            row.served, row.server_error, _ = _verdict(result, report.reference)
            row.server = result.server
        if f"session@{row.tf}" in by_label:
            row.observed, row.error, row.agreement = _verdict(by_label[f"session@{row.tf}"], report.reference)
            row.memory = memory.get(f"session@{row.tf}")


def _verdict(result, reference: str) -> tuple[str, str | None, str | None]:
    """(ok | fails, why it fails, how close it came to the reference) of one runtime's result."""
    if result.status == "error":
        return "fails", result.error, None
    bad = [c for c in result.comparisons if not c.passed]
    errors = [c.max_abs_err for c in result.comparisons if c.max_abs_err is not None]
    agreement = f"with {reference}, max abs err {max(errors):.2g}" if errors else f"with {reference}"
    if bad:
        return "fails", "; ".join(f"output '{c.key}' disagrees with {reference}: {c.reason}" for c in bad), agreement
    return "ok", None, agreement
