"""`exportkit inspect`: read saved_model.pb into a SavedModelInfo and render it (text or JSON).

Reading never imports TensorFlow (see exportkit.savedmodel.reader), so inspecting takes a fraction of a second where
`saved_model_cli show --all` takes several. Model sources (.h5, .keras, checkpoints) are described by
exportkit.sources.describe, which does need TensorFlow and is imported only for them.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from exportkit import storage
from exportkit.errors import EXIT_CHECK_FAILED, EXIT_OK, UsageError
from exportkit.findings import has_errors
from exportkit.inspection.report import SavedModelInfo, render_text
from exportkit.savedmodel.layout import ASSET_DIRS, variables_bytes
from exportkit.savedmodel.resources import serving_estimate
from exportkit.savedmodel.manifest import Manifest, read_manifest
from exportkit.options.source import source_options

SOURCE_SUFFIXES = (".h5", ".hdf5", ".keras")


# ------------------------------------------------------------------------------------------------ reading
def _files_under(root: Path, top: Path) -> list[str]:
    out = []
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            out.append((Path(dirpath) / name).relative_to(top).as_posix())
    return out



LARGEST_SHOWN = 5


def _variables_summary(directory: Path) -> dict | None:
    """Tensor count, bytes, shards, duplicated bytes and the largest tensors of the checkpoint (read from its
    index, no TensorFlow); None when there is none or it cannot be read (a `checkpoint-unreadable` finding says why)."""
    from exportkit.savedmodel.checkpoint import saved_model_checkpoint

    try:
        checkpoint = saved_model_checkpoint(directory)
    except UsageError:
        return None
    if checkpoint is None:
        return None
    tensors = checkpoint.variables
    largest = sorted(tensors, key=lambda t: (-t.size, t.name))[:LARGEST_SHOWN]
    return {"tensors": len(tensors), "bytes": checkpoint.total_bytes, "shards": checkpoint.num_shards,
            "duplicate_bytes": checkpoint.duplicate_bytes(),
            "largest": [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "bytes": t.size} for t in largest]}


def read_info(path: str | Path, *, signature_name: str | None = None, check_registry: bool = True) -> SavedModelInfo:
    """Everything `inspect` shows about the SavedModel at `path` (version or base directory, or their bucket URL:
only the variables' sizes are listed, their bytes not downloaded). No TF import.

    `signature_name` and `check_registry` are passed to the lint (see exportkit.savedmodel.lint.lint_saved_model).
    """
    from exportkit.savedmodel.deployment import file_findings, file_reads, xla_findings
    from exportkit.savedmodel.graph import graph_of
    from exportkit.savedmodel.lint import asset_findings, lint_saved_model
    from exportkit.savedmodel.reader import read_saved_model_proto, select_meta_graph
    from exportkit.savedmodel.signature_defs import serving_api_findings, signatures_of
    from exportkit.savedmodel.versions import resolve_savedmodel_dir
    from exportkit.tfenv import tensorflow_version
    from exportkit.tfversions.analysis import forecast
    from exportkit.tfversions.installed import registered_ops
    from exportkit.tfversions.registry import installed

    directory = resolve_savedmodel_dir(path, variables=False)
    proto = read_saved_model_proto(directory)
    meta_graph = select_meta_graph(proto)
    assets = sorted(a for d in ASSET_DIRS if (directory / d).is_dir() for a in _files_under(directory / d, directory))
    manifest, manifest_findings = read_manifest(directory)
    server_registry = installed(tensorflow_version()) if check_registry else None
    installed_ops = registered_ops() if check_registry else None
    findings = (lint_saved_model(proto, signature_name, check_registry=check_registry, installed_ops=installed_ops,
                                 server_registry=server_registry)
                + asset_findings(directory) + manifest_findings + serving_api_findings(meta_graph))
    oldest, blocking = forecast(meta_graph)  # with the loader's refusals on every version (missing tensors ...)
    findings += blocking
    reads = file_reads(meta_graph)
    files = file_findings(reads, directory=directory)
    xla = xla_findings(meta_graph, directory=directory)
    deployment = files + xla
    # what the server flag --xla_cpu_compilation_enabled would serve, when XLA is all that stands in the way
    with_xla = oldest if has_errors(xla) and not has_errors(files) else None
    if has_errors(deployment) or any(f.code == "py-func" for f in findings):
        oldest = None  # as compat predicts: no version's stock server serves it
        with_xla = None if any(f.code == "py-func" for f in findings) else with_xla
    findings += deployment
    order = {"error": 0, "warning": 1, "info": 2}
    findings.sort(key=lambda f: order.get(f.severity, 3))
    return SavedModelInfo(
        path=storage.cached_url_of(directory) or os.path.abspath(directory),
        tags=list(meta_graph.meta_info_def.tags),
        tensorflow_version=meta_graph.meta_info_def.tensorflow_version or None,
        signatures=signatures_of(meta_graph),
        ops=graph_of(meta_graph).op_counts(),
        assets=assets,
        variables_bytes=variables_bytes(directory),
        variables=_variables_summary(directory),
        manifest=manifest.to_dict() if manifest else None,
        findings=findings,
        oldest_tf_serving=oldest,
        oldest_tf_serving_with_xla=with_xla,
        files_read=[r.to_dict() for r in reads],
        memory_estimate=serving_estimate(directory),
    )


# ------------------------------------------------------------------------------------------------ command
def is_model_source(path: str | Path, format: str | None = None) -> bool:
    """True for what `export` reads (.h5/.hdf5/.keras/.weights.h5, checkpoint directories or prefixes)."""
    if format:
        return True
    p = Path(path)
    if p.is_file():
        return p.name.lower().endswith(SOURCE_SUFFIXES)
    if p.is_dir():
        from exportkit.savedmodel.versions import other_format

        # A SessionBundle has a `checkpoint` file too: it is reported as what it is (savedmodel.other_format).
        return (p / "checkpoint").is_file() and not (p / "saved_model.pb").is_file() and other_format(p) is None
    return Path(str(p) + ".index").is_file()  # a checkpoint prefix like ckpt/model-100


def _print(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()


def _describe(options, json_out, strict=False, allow_incomplete_config=False, int_range=()) -> int:
    from exportkit.sources.describe import describe_source
    from exportkit.compare.outputs import compare_with_default_tolerances

    result = describe_source(options, allow_incomplete_config=allow_incomplete_config,
                             compare=compare_with_default_tolerances, int_range=list(int_range))
    if json_out:
        data = result.to_dict() if hasattr(result, "to_dict") else result
        _print(json.dumps(data, indent=2, sort_keys=False, default=str))
    elif hasattr(result, "render_text"):
        _print(result.render_text())
    else:
        _print(str(result))
    if getattr(result, "error", None) is not None:
        raise result.error  # what could be read is on stdout; why the rest could not, on stderr (error + fix)
    code = int(getattr(result, "exit_code", EXIT_OK) or EXIT_OK)
    return EXIT_CHECK_FAILED if code == EXIT_OK and strict and has_errors(result.findings) else code


def _request_batch(version_dir: Path, meta_graph, name: str, signature: dict, manifest: Manifest | None,
                   int_range=()) -> dict:
    """One row of inputs for `name`: the golden record's first row when it belongs to this signature, else
    generated (serialized tf.Example where the signature parses them)."""
    from exportkit.inputs.generate import generate_batches
    from exportkit.inputs.ranges import parse_int_range_flags
    from exportkit.savedmodel.int_ranges import savedmodel_int_ranges
    from exportkit.tfexample.signatures import input_specs
    from exportkit.savedmodel.layout import read_golden
    from exportkit.signature_constants import DEFAULT_SIGNATURE

    if manifest and manifest.signature.get("name", DEFAULT_SIGNATURE) == name:
        golden, _ = read_golden(version_dir)
        if golden and set(golden[0]) == set(signature["inputs"]):
            return {k: v[:1] if getattr(v, "ndim", 0) else v for k, v in golden[0].items()}
    specs = input_specs(meta_graph, name, signature, version_dir)
    ranges = savedmodel_int_ranges(parse_int_range_flags(list(int_range)), manifest, meta_graph, {name: signature})
    return generate_batches(specs, samples=1, seed=0, int_range=ranges)[0]


def write_requests(info: SavedModelInfo, out_dir: str, model_name: str | None, int_range=()) -> list[Path]:
    from exportkit.savedmodel.reader import read_saved_model_proto, select_meta_graph
    from exportkit.savedmodel.versions import resolve_savedmodel_dir
    from exportkit.serving.client.samples import request_samples, write_request_samples

    version_dir = resolve_savedmodel_dir(info.path, variables=False)  # a URL's mirror; a local path as it is
    meta_graph = select_meta_graph(read_saved_model_proto(version_dir))
    name = model_name or (version_dir.parent.name if version_dir.name.isdigit() else version_dir.name)
    manifest = Manifest.from_dict(info.manifest) if info.manifest is not None else None
    samples = {}
    for sig_name, signature in info.signatures.items():
        batch = _request_batch(version_dir, meta_graph, sig_name, signature, manifest, int_range)
        samples[sig_name] = request_samples(sig_name, signature, batch, name)
    if storage.is_url(out_dir):  # --requests gs://...: written locally, then uploaded together
        with storage.staged_dir(out_dir, f"--requests {out_dir}") as stage:
            written = write_request_samples(stage, samples, name)
        return [storage.join(out_dir, p.name) for p in written]
    return write_request_samples(out_dir, samples, name)


def inspect_command(path, json_out=False, strict=False, source=None, allow_incomplete_config=False, requests=None,
                    model_name=None, int_range=()) -> int:
    """Show a SavedModel (or describe a model source). Returns the exit code: 0 readable; 1 with --strict and
    an error finding; unreadable input raises UsageError (exit 2). `source()` gives the SourceOptions for a
    model source (built only when `path` is one)."""
    from exportkit.savedmodel.versions import check_path

    if storage.is_url(path):
        if not str(path).lower().endswith(SOURCE_SUFFIXES) or storage.isdir(path):
            return _show(read_info(path), json_out, strict, requests, model_name, int_range)
        path = storage.local_copy(path)  # a .keras/.h5 source in a bucket: described from its local copy
    p = Path(storage.local_path(path))
    check_path(p, "pass a SavedModel (version or base directory) or a model source (.h5, .keras, checkpoint)")
    if not p.exists() and not Path(str(p) + ".index").is_file():
        raise UsageError(f"no such file or directory: {p}",
                         "pass a SavedModel (version or base directory) or a model source (.h5, .keras, checkpoint)")
    options = source() if source else None
    if is_model_source(p, options.format if options else None):
        return _describe(options or source_options(str(p)), json_out, strict, allow_incomplete_config, int_range)
    if p.is_file() and p.name not in ("saved_model.pb", "saved_model.pbtxt"):
        raise UsageError(f"{p} is neither a SavedModel nor a model source exportkit reads",
                         "pass a SavedModel directory, a .h5/.hdf5/.keras/.weights.h5 file or a checkpoint directory")
    return _show(read_info(p), json_out, strict, requests, model_name, int_range)


def _show(info: SavedModelInfo, json_out, strict, requests, model_name, int_range) -> int:
    if requests:
        written = write_requests(info, requests, model_name, int_range)
        print(f"wrote {len(written)} request files for {len(info.signatures)} signature(s) to {requests}",
              file=sys.stderr)
    if json_out:
        _print(json.dumps(info.to_dict(), indent=2))
    else:
        _print(render_text(info))
    return EXIT_CHECK_FAILED if strict and has_errors(info.findings) else EXIT_OK
