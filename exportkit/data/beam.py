"""`verify --data ... --runner beam`: the in-process comparison as an Apache Beam pipeline, for datasets that
outgrow one machine. The runner is chosen by pipeline options only (`--beam-option runner=...`; FnApiRunner in
this process by default); every DoFn pickles, so the SDK harness may run in other processes or machines (FnApiRunner's
multi_processing, a portable runner's worker pool, Dataflow, Flink): the workers read the records and the model
themselves (exportkit.storage: a bucket URL, or a path they share) and load the model once each, in setup.

    files -> batches (records.DataSource, the very batches of the in-process run) -> Reshuffle
          -> parse (once) -> one DoFn per runtime (model loaded once per worker, in setup)
          -> join by batch id (CoGroupByKey) -> per (runtime, output): OutputStats via a CombineFn
          -> one file of pickled statistics written through Beam's FileSystems, under --temp_location when
             given (the workers must reach it), else a local temporary directory (runners on this machine only),
             read back by the driver and deleted

Statistics merge exactly (stats.OutputStats.merge), so the verdict and the max errors equal the in-process
run's on the same data. With --limit the files are read in order by one worker (the limit is global).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pickle
import re
import shlex
import sys
import tempfile
import uuid
from collections import Counter
from dataclasses import dataclass

from exportkit import storage
from exportkit.data.predictionlog import LOGGED
from exportkit.data.records import DataSource, Feeder
from exportkit.compare.stats import OutputStats
from exportkit.errors import CheckFailed, ExportkitError, InfraError, UsageError
from exportkit.log import log
from exportkit.runtimes.factory import RuntimeSpec, build
from exportkit.runtimes.loop import BatchLoop
from exportkit.runtimes.wrappers import ExampleParsing


@contextlib.contextmanager
def _quiet_beam():
    """Beam's log lines in this process are kept out of exportkit's output unless exportkit logs at DEBUG: the job
    service repeats each worker error with its traceback, and `import apache_beam` warns about BigQuery's missing
    apitools where google-cloud libraries are installed, both through the root logger."""
    loggers = [logging.getLogger(), logging.getLogger("apache_beam")]
    levels = [logger.level for logger in loggers]
    if not log.isEnabledFor(logging.DEBUG):
        for logger in loggers:
            logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


with _quiet_beam():
    import apache_beam as beam
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

# Runners whose workers run on this machine (threads or subprocesses): a local results directory serves them.
LOCAL_RUNNERS = ("FnApiRunner", "DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner")
_ERROR = re.compile(r"exportkit-error\[(\w+)\]: (.*?) \|\| (.*?)(?:\n|$)")


@dataclass
class BeamPlan:
    source: DataSource
    example_key: str | None
    runtimes: list[RuntimeSpec]  # built on the workers (runtimes.factory); the first is the reference
    tolerances: dict  # output key -> (atol, rtol)
    replayer: object = None  # predictionlog.LogReplayer for PredictionLog records (adds the runtime `logged`)
    accumulator: object = None  # (key, atol, rtol) -> the statistics of one output (default stats.OutputStats)


def _relay(err: ExportkitError) -> RuntimeError:
    """Beam re-raises a worker's exception as its own; this text lets the driver give back the original."""
    return RuntimeError(f"exportkit-error[{type(err).__name__}]: {err.message} || {err.remedy or ''}\n")


def run_pipeline(plan: BeamPlan, beam_options: list[str]) -> tuple[dict, int]:
    """Run the comparison; returns ({(runtime label, output key): OutputStats}, records compared)."""
    args = {"runner": "FnApiRunner"}  # not DirectRunner: it tries Prism first, which downloads a binary
    for item in beam_options:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--beam-option {item!r} is not KEY=VALUE", "write it as --beam-option direct_num_workers=2")
        args[key.strip().lstrip("-")] = value
    # A worker's failure reaches the driver as the pipeline's exception (see _relay); its log lines, tracebacks
    # included, would say it again: the workers log only what the user asks for.
    args.setdefault("default_sdk_harness_log_level", "CRITICAL")
    given = args.get("temp_location")
    if not given and args["runner"].rsplit(".", 1)[-1] not in LOCAL_RUNNERS:
        raise UsageError(f"--runner beam with {args['runner']} writes its results under --temp_location, and there is "
                         "none", "pass --beam-option temp_location=gs://BUCKET/tmp (a place the workers and this "
                         "machine both read and write)")
    if args["runner"].rsplit(".", 1)[-1] not in LOCAL_RUNNERS:
        _warn_local_paths(plan, args["runner"])
    # The results file goes also when the pipeline failed (and our own directory with it): they are no one's.
    own = tempfile.TemporaryDirectory(prefix="exportkit-beam-", ignore_cleanup_errors=True) if not given else None
    with _quiet_beam(), (own or contextlib.nullcontext(given)) as base:
        results = FileSystems.join(base, f"exportkit-results-{uuid.uuid4().hex}.pickle")
        try:
            return _run_in(args, results, plan)
        finally:
            with contextlib.suppress(Exception):  # never written, or gone already
                FileSystems.delete([results])


def _warn_local_paths(plan: BeamPlan, runner: str) -> None:
    """Workers elsewhere cannot read this machine's files: say which paths they would look for on their own."""
    specs = [_by_url(spec) for spec in plan.runtimes]
    paths = ([spec.path for spec in specs if spec.path and spec.name != "serving"]
             + [spec.source_options.src for spec in specs if spec.source_options is not None]
             + plan.source.files[:1])
    local = list(dict.fromkeys(str(path) for path in paths if not storage.is_url(path)))
    if local:
        log.warning(f"--runner beam with {runner}: the workers read {', '.join(local)} on their own "
                    "machines; where they run elsewhere, put the model, the source and the records in a bucket")


def _run_in(args: dict, results: str, plan: BeamPlan) -> tuple[dict, int]:
    """run_pipeline with its results written to the file `results` (a Beam FileSystems path)."""
    try:
        with _pipeline(args) as p:
            _build(p, plan, results)
    except ExportkitError:
        raise
    except Exception as err:
        found = _ERROR.search(str(err))
        if found:
            kind = {"UsageError": UsageError, "InfraError": InfraError}.get(found.group(1), CheckFailed)
            raise kind(found.group(2), found.group(3) or None) from None
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InfraError(f"the Beam pipeline failed: {first}", "re-run with --debug for the traceback") from err
    stats, records = {}, 0
    skipped: dict = {}
    with FileSystems.open(results) as fh:
        labelled = pickle.loads(fh.read())
    for kind, value in labelled:
        if kind == "records":
            records += value
        elif kind == "skipped":
            skipped = dict(value)
        else:
            stats[kind] = value
    if plan.replayer is not None:
        plan.replayer.skipped.update(skipped)  # what the workers skipped, counted where the driver reads it
    return stats, records


def _pipeline(args: dict):
    """A Pipeline on the runner the options name. FnApiRunner is built as DirectRunner builds it, with the options
    in its provision info: its multi_processing workers read them there (the harness's log level among them)."""
    options = PipelineOptions([f"--{k}={v}" for k, v in args.items()])
    if args["runner"].rsplit(".", 1)[-1] != "FnApiRunner":
        return beam.Pipeline(options=options)
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    info = fn_runner.ExtendedProvisionInfo(beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded))
    environment = None
    if args.get("direct_running_mode") == "multi_processing" and args["default_sdk_harness_log_level"] == "CRITICAL":
        # FnApiRunner's own multi_processing workers, but with their stderr closed: sdk_worker.py prints a failing
        # bundle's traceback there whatever the log level, and the failure comes back as the pipeline's exception.
        # (FnApiRunner sets that environment itself when the option is on: it goes from what run_pipeline sees.)
        from apache_beam.transforms.environments import SubprocessSDKEnvironment

        command = f"exec {shlex.quote(sys.executable)} -m apache_beam.runners.worker.sdk_worker_main 2>{os.devnull}"
        environment = SubprocessSDKEnvironment.from_command_string(command)
        options = PipelineOptions([f"--{k}={v}" for k, v in args.items() if k != "direct_running_mode"])
    return beam.Pipeline(runner=fn_runner.FnApiRunner(provision_info=info, default_environment=environment),
                         options=options)


def _build(p, plan: BeamPlan, results: str) -> None:
    source = plan.source
    if source.limit is not None:  # one reader in file order: the limit counts across files
        batches = p | "Files" >> beam.Create([None]) | "Read" >> beam.FlatMap(_all_batches, source)
    else:
        batches = (p | "Files" >> beam.Create(list(range(len(source.units))))
                   | "Read" >> beam.FlatMap(_unit_batches, source))
    batches = batches | "Spread" >> beam.Reshuffle()
    parsed = batches | "Parse" >> beam.ParDo(_Parse(source, plan.example_key, plan.replayer)).with_outputs(
        "skipped", main="fed")
    fed = parsed.fed | "Rows" >> beam.Filter(_has_rows)
    inputs = fed | "Inputs" >> beam.Map(_inputs)
    joined = {"positions": fed | "Positions" >> beam.Map(_positions)}
    for spec in plan.runtimes:
        joined[spec.label] = inputs | f"Run {spec.label}" >> beam.ParDo(_Run(spec))
    if plan.replayer is not None:
        joined[LOGGED] = fed | "Logged" >> beam.Map(_logged)
    labels = [spec.label for spec in plan.runtimes]
    stats = (joined | "Join" >> beam.CoGroupByKey()
             | "Pairs" >> beam.FlatMap(_pairs, labels)
             | "Statistics" >> beam.CombinePerKey(_StatsCombine(plan.tolerances, plan.accumulator)))
    records = (joined["positions"] | "Count" >> beam.Map(_count)
               | "Records" >> beam.CombineGlobally(sum) | "Label" >> beam.Map(_labelled, "records"))
    outputs = [stats, records]
    if plan.replayer is not None:
        outputs.append(parsed.skipped | "Skipped" >> beam.CombineGlobally(_add_counts)
                       | "Label skipped" >> beam.Map(_labelled, "skipped"))
    # One file written by the last step, after every batch is in: a failed run writes nothing (WriteToText would
    # make its temporary directory at the start, racing the failure), and a retried write rewrites the same file.
    (tuple(outputs) | beam.Flatten()
     | "Gather" >> beam.combiners.ToList()
     | "Write" >> beam.Map(_write_results, results))


def _all_batches(_, source: DataSource):
    return source.batches()


def _unit_batches(unit_no: int, source: DataSource):
    return source.unit_batches(unit_no)


def _has_rows(keyed) -> bool:
    return len(keyed[1]) > 0


def _inputs(keyed):
    return keyed[0], keyed[1].inputs


def _positions(keyed):
    fed = keyed[1]
    return keyed[0], (fed.file_nos, fed.indices, fed.offsets, fed.examples)


def _logged(keyed):
    return keyed[0], (keyed[1].logged, keyed[1].logged_rows)


def _add_counts(counts) -> dict:
    total = Counter()
    for c in counts:
        total.update(c)
    return dict(total)


def _count(keyed) -> int:
    return len(keyed[1][1])


def _labelled(value, label: str):
    return label, value


def _write_results(labelled: list, path: str) -> None:
    with FileSystems.create(path) as fh:
        fh.write(pickle.dumps(labelled))


class _Parse(beam.DoFn):
    """Records -> the signature's inputs (records.Fed), once per batch for all runtimes (a bad record fails the
    run); the PredictionLog records it skips are counted on the `skipped` output."""

    def __init__(self, source: DataSource, example_key: str | None, replayer=None):
        self.source, self.example_key, self.replayer = source, example_key, replayer

    def setup(self):
        self.feed = Feeder(self.source, self.source.specs, self.example_key, self.replayer)

    def process(self, batch):
        try:
            fed = self.feed.fed(batch)
        except ExportkitError as err:
            raise _relay(err) from None
        if self.replayer is not None and self.replayer.skipped:
            yield beam.pvalue.TaggedOutput("skipped", dict(self.replayer.skipped))
            self.replayer.skipped.clear()
        yield batch.key, fed


class _Run(beam.DoFn):
    """One runtime on a worker (runtimes.factory builds it from its spec): its model read by the worker (from the
    bucket, into the worker's own cache), loaded once in setup, batches through runtimes.loop, closed in teardown."""

    def __init__(self, spec: RuntimeSpec):
        if spec.name not in ("saved_model", "keras", "session", "serving"):
            raise UsageError(f"runtime {spec.name!r} cannot run in a Beam worker",
                             "use saved_model, keras, session, serving")
        self.spec = _by_url(spec)

    def setup(self):
        try:
            self.runtime = build(_local(self.spec))
            self.loop = BatchLoop(self.runtime, timed=False)
            self.loop.load()
        except ExportkitError as err:
            raise _relay(err) from None

    def process(self, element):
        key, inputs = element
        if isinstance(self.runtime, ExampleParsing):
            self.runtime.name_record = lambda row: f"#{row} of the batch from file {key[0]}, record {key[1]} on"
        try:
            yield key, self.loop.run(inputs)
        except ExportkitError as err:
            raise _relay(err) from None

    def teardown(self):
        self.runtime.close()


def _by_url(spec: RuntimeSpec) -> RuntimeSpec:
    """`spec` with a bucket model's local mirror (the driver's cache) named by its URL again: the workers may run
    elsewhere, and read the model from the bucket themselves."""
    path = spec.path and storage.cached_url_of(spec.path)
    source = spec.source_options
    src = source is not None and storage.cached_url_of(source.src)
    return dataclasses.replace(spec, path=path or spec.path,
                               source_options=dataclasses.replace(source, src=src) if src else source)


def _local(spec: RuntimeSpec) -> RuntimeSpec:
    """`spec` with its bucket URLs mirrored into this worker's cache (storage.local_copy: downloaded once per
    machine, revalidated by generation/ETag)."""
    path, source = spec.path, spec.source_options
    if path and storage.is_url(path):
        path = str(storage.local_copy(path))
    if source is not None and storage.is_url(source.src):
        source = dataclasses.replace(source, src=str(storage.local_copy(source.src)))
    return dataclasses.replace(spec, path=path, source_options=source)


def _pairs(joined, labels: list[str]):
    """One batch's outputs from every runtime -> ((label, output key), (key, reference, actual, positions))."""
    _, groups = joined
    (positions,) = groups["positions"]
    reference = groups[labels[0]][0]
    for label in labels[1:]:
        outputs = groups[label][0]
        for key in sorted(set(reference) | set(outputs)):
            yield (label, key), (key, reference.get(key), outputs.get(key), positions)
    for logged, rows in groups.get(LOGGED) or []:
        if logged is None:
            continue
        at = tuple(None if p is None else p[rows] for p in positions)
        for key in sorted(set(reference) | set(logged)):
            value = reference.get(key)
            yield (LOGGED, key), (key, None if value is None else value[rows], logged.get(key), at)


class _StatsCombine(beam.CombineFn):
    """stats.OutputStats as the accumulator (None until the first batch, which names the output)."""

    def __init__(self, tolerances: dict, accumulator=None):
        self.tolerances, self.accumulator = tolerances, accumulator or OutputStats

    def create_accumulator(self):
        return None

    def add_input(self, acc, element):
        key, expected, actual, (file_nos, indices, offsets, examples) = element
        if acc is None:
            acc = self.accumulator(key, *self.tolerances.get(key, (0.0, 0.0)))
        if isinstance(acc, OutputStats):
            acc.add(expected, actual, file_nos, indices, offsets)
        else:
            acc.add(expected, actual, file_nos, indices, offsets, examples)
        return acc

    def merge_accumulators(self, accs):
        merged = None
        for acc in accs:
            if acc is not None:
                merged = acc if merged is None else merged.merge(acc)
        return merged

    def extract_output(self, acc):
        return acc
