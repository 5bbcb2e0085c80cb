"""verify's execution: start every planned runtime, run every signature's batches through it, close them all.

    with started(options, plan) as runtimes:      # every runtime built and started (in parallel), closed on exit
        execution = run_plan(options, plan, runtimes)

A model that cannot load or run is the model's failure (its row says why, exit 1); an InfraError (a server that
does not come up, a worker that dies) is not: its row says so and it goes to `Execution.infra` (exit 3 once the
report is out). A planned runtime (verify/plan.py) becomes a RuntimeSpec here (`runtime_spec`), built by
exportkit.runtimes.factory; its batches go through exportkit.runtimes.loop.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import time
from dataclasses import dataclass, field

from exportkit.dtypes import HALF_DTYPES, numpy_dtype
from exportkit.errors import CheckFailed, ExportkitError, InfraError
from exportkit.savedmodel.layout import variables_bytes
from exportkit.options.verify import VerifyOptions
from exportkit.runtimes.loop import BatchLoop, InputsRejected
from exportkit.verify.latency import latency_summary
from exportkit.verify.plan import Plan, PlannedRuntime, SignatureCheck
from exportkit.verify.report import RuntimeResult


class Labeled:
    """A runtime with a display name that includes its device when several devices run. Runtimes of one `lane`
    answer one after the other (run_plan); `release` unloads the runtime's model once it answered every signature."""

    def __init__(self, runtime, label: str, lane: tuple = (), release: bool = False):
        self.runtime = runtime
        self.label = label
        self.lane = lane or (id(self),)
        self.release = release


# Variables over this size: the worker loads the TF2 and the TF1 way one after the other, the first dropped before
# the second, so it holds one copy of them, as `saved_model_cli run` and TF Serving do, not two (a 1 GB model: 2.7 GB
# instead of 1.7). Below it, both loads at once are faster and the second copy costs little next to TensorFlow.
ONE_LOAD_AT_A_TIME_BYTES = 256 << 20


@dataclass
class Execution:
    """What the runtimes answered: per signature, per runtime label, the outputs of each batch (None: not run)."""

    outputs: dict[str, dict[str, list]] = field(default_factory=dict)
    results: dict[str, list[RuntimeResult]] = field(default_factory=dict)
    infra: list[InfraError] = field(default_factory=list)  # a runtime's environment failed: exit 3


def versioned_pythons(tf_versions) -> dict[str, str]:
    """{X.Y: interpreter with TensorFlow X.Y} for `--tf` (repeatable, each a list/range/all), installing the
    managed environments that are missing (progress on stderr; exit 3 when they cannot be built)."""
    if not tf_versions:
        return {}
    from exportkit.tfversions import parse_versions
    from exportkit.tfversions.envs import python_for

    return {v: python_for(v) for v in parse_versions(list(tf_versions))}


def installed_workers(tf_versions) -> list[tuple[str, str]]:
    """(interpreter, worker script) of each `--tf` environment already installed and sound, nothing installed or
    raised: verify prestarts them; versioned_pythons installs or refuses the others when the plan needs them."""
    if not tf_versions:
        return []
    from exportkit.tfversions import parse_versions
    from exportkit.tfversions.envs import WORKER, python_for

    found = []
    try:
        versions = parse_versions(list(tf_versions))
    except ExportkitError:  # said where the plan reads them
        return []
    for version in versions:
        try:
            found.append((python_for(version, install_missing=False), str(WORKER)))
        except ExportkitError:
            pass
    return found


def build_runtimes(o: VerifyOptions | None, plan: Plan, parse_examples: str | None = None) -> list[Labeled]:
    """Every planned runtime once (runtimes.factory), started; each is pointed at one signature after the other.
    `o`: verify's options (the server, --against, TF32); None for a plan of golden and session runtimes only
    (compat's), which need none of them.

    One TensorFlow worker process per device holds both loads (`saved_model`, `session`, loading at the same time)
    and the embedded server, which answers from the session's load: one TensorFlow import and one TF1 load instead
    of three processes (a 1 GB model needed 7.8 GB that way). `saved_model` runs in this process only when eager
    Keras (`--against`) imports TensorFlow here anyway. `parse_examples`: the serialized tf.Example input that
    eager Keras parses itself (verify --data on a signature over tf.Example)."""
    from exportkit.runtimes.factory import Shared, build

    shared = Shared(str(plan.version_dir), bool(o and o.allow_tf32))
    one_at_a_time = variables_bytes(plan.version_dir) > ONE_LOAD_AT_A_TIME_BYTES
    built = []
    for planned in plan.runtimes:
        spec = runtime_spec(o, plan, planned, preload_session=not one_at_a_time)
        spec.parse_examples = parse_examples if planned.name == "keras" else None
        runtime = build(spec, shared)
        lane = _lane(runtime, one_at_a_time)
        built.append(Labeled(runtime, planned.label, lane, release=one_at_a_time and lane[0] == "tf1"
                             and runtime.name == "saved_model"))
    # the slow ones (worker import, server launch) get going now, in parallel; the session load is sent first: the
    # worker loads one at a time (verify/memory.py), and the session's is measured as a fresh server's first load
    for item in sorted(built, key=lambda item: item.runtime.name != "session"):
        item.runtime.start()
    return built


def _lane(runtime, one_at_a_time: bool) -> tuple:
    """Runtimes that share a load answer one after the other, in the plan's order: `session`'s direct runs, then
    the embedded server's warm-up and requests on the same TF1 load (and REST on the same server). The other
    lanes (the TF2 load, this process's runtimes, another TensorFlow's worker) run at the same time: the worker
    answers each request in a thread of its own, and most of a run is TensorFlow's C++, which releases the GIL.
    One load at a time: the TF2 load answers first, in the TF1 lane."""
    from exportkit.runtimes.serving import RestRuntime

    if isinstance(runtime, RestRuntime):
        runtime = runtime.grpc
    worker = getattr(runtime, "worker", None)
    if worker is not None:
        return ("tf2" if runtime.name == "saved_model" and not one_at_a_time else "tf1", id(worker))
    if runtime.kind in ("in-process", "recorded"):
        return ("this process",)
    return ("server", id(runtime))


def runtime_spec(o: VerifyOptions | None, plan: Plan, planned: PlannedRuntime, preload_session: bool = True):
    """The RuntimeSpec of a planned runtime, pointed at the plan's first signature."""
    from exportkit.runtimes.factory import RuntimeSpec, ServerSpec

    first, dev = plan.checks[0], planned.device
    names = {r.name for r in plan.runtimes if r.tf_version is None}
    spec = RuntimeSpec(planned.name, str(plan.version_dir), first.name, dev, {s.key: s.dtype for s in first.specs},
                       label=planned.label, allow_tf32=bool(o and o.allow_tf32))
    if planned.tf_version:  # session@X.Y: the serving-equivalent session runtime on TensorFlow X.Y, CPU
        from exportkit.tfversions.envs import WORKER, install_command

        v = planned.tf_version
        spec.device, spec.allow_tf32, spec.python, spec.worker = "cpu", False, planned.python, str(WORKER)
        spec.broken_remedy = f"the TF {v} environment may be damaged: rebuild it with `{install_command(v)} --force`"
    elif planned.name == "saved_model":
        spec.preload, spec.in_process = True, "keras" in names  # TensorFlow is imported here anyway: no round trips
    elif planned.name == "session":
        spec.preload = preload_session
    elif planned.name in ("serving", "rest"):
        spec.signatures = plan.signatures
        spec.server = ServerSpec(o.serving, o.model_name, o.model_version, o.model_server_bin, o.load_timeout,
                                 o.launch, rest="rest" in names, owned_by_rest="serving" not in names)
    elif planned.name == "trained":  # recorded as float32 where the model computed in half precision: as signed
        trained = plan.trained
        dtypes = next(c for c in plan.checks if c.name == trained.signature).output_dtypes
        as_signed = [{k: v.astype(numpy_dtype(dtypes[k])) if k in dtypes and v.dtype.kind == "f"
                      and dtypes[k] in HALF_DTYPES else v for k, v in out.items()} for out in trained.outputs]
        spec.signature, spec.recorded = trained.signature, (trained.inputs, as_signed)
    elif planned.name == "keras":
        spec.source_options, spec.output_dtypes, spec.output_names = o.against, first.output_dtypes, plan.output_names
    return spec


def close_all(runtimes_) -> None:
    """Close every runtime at once: worker and server shutdowns overlap instead of adding up."""

    def close(item):
        try:
            item.runtime.close()
        except Exception:  # closing must never hide the verdict
            pass

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(runtimes_))) as pool:
        list(pool.map(close, runtimes_))


@contextlib.contextmanager
def started(o: VerifyOptions | None, plan: Plan, parse_examples: str | None = None):
    """The plan's runtimes, built and started; every one is closed on the way out, whatever happened."""
    runtimes_ = build_runtimes(o, plan, parse_examples)
    try:
        yield runtimes_
    finally:
        close_all(runtimes_)


def run_plan(o: VerifyOptions, plan: Plan, runtimes_: list[Labeled]) -> Execution:
    """Every runtime over every signature's batches, lane by lane at the same time (see `_lane`); each loads once."""
    from exportkit.tfenv import import_tf, tf32

    execution = Execution({c.name: {} for c in plan.checks}, {c.name: [] for c in plan.checks})
    if any(r.runtime.kind == "in-process" for r in runtimes_):
        import_tf()
    lanes: dict[tuple, list[Labeled]] = {}
    for item in runtimes_:
        lanes.setdefault(item.lane, []).append(item)

    def run_lane(lane: list[Labeled]) -> dict:
        answered = {}
        for item in lane:
            for check in plan.checks:
                answered[id(item), check.name] = run_signature(item, check, execution.outputs[check.name],
                                                               execution.infra)
            if item.release:
                item.runtime.release()
        return answered

    gpu = "gpu" in plan.devices
    with tf32(o.allow_tf32) if gpu else contextlib.nullcontext():
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(lanes) or 1, thread_name_prefix="lane")
        try:
            answered = {k: v for done in pool.map(run_lane, lanes.values()) for k, v in done.items()}
        finally:  # interrupted: the runtimes are closed on the way out, which ends the lanes still waiting
            pool.shutdown(wait=False, cancel_futures=True)
    for check in plan.checks:  # the report's order is the plan's, whichever lane answered first
        answers = execution.outputs[check.name]
        execution.outputs[check.name] = {item.label: answers[item.label] for item in runtimes_ if item.label in answers}
        execution.results[check.name] = [result for item in runtimes_
                                         if (result := answered[id(item), check.name]) is not None]
    return execution


OMIT = ""  # _prepare: the runtime has nothing to say about this signature (no row in the report)


def _prepare(runtime, check: SignatureCheck) -> str | None:
    """Point `runtime` at `check`'s signature; returns why it cannot answer for it (it is then skipped)."""
    from exportkit.runtimes.local import GoldenRuntime, KerasRuntime

    if isinstance(runtime, GoldenRuntime) and runtime.name == "trained":
        return None if check.name == runtime.signature_name else OMIT
    if isinstance(runtime, GoldenRuntime):
        runtime.record(check.golden[0] or [], check.golden[1] or [])
        return None if check.golden[0] is not None else "no golden record for this signature"
    if isinstance(runtime, KerasRuntime):
        if check.examples_input or not check.method.endswith("predict"):
            return ("eager Keras takes the model's tensors; this signature is checked against the golden record "
                    "and its tensor twin")
        outputs = check.entry.get("outputs", {})
        runtime.use_outputs({k: v.get("model_output") or k for k, v in outputs.items()} or None,
                            check.output_dtypes)
        return None
    runtime.use_signature(check.name, {s.key: s.dtype for s in check.specs})
    return runtime.refusal()


def error_text(err) -> str:
    """The full failure for the report: first line the summary, then details (a server's log tail), then the fix."""
    text = err.message if hasattr(err, "message") else str(err)
    remedy = getattr(err, "remedy", None)
    return f"{text}\nfix: {remedy}" if remedy else text


def run_signature(item: Labeled, check: SignatureCheck, outputs, infra: list | None = None) -> RuntimeResult | None:
    """`item` over `check`'s batches into outputs[label]; its report row (None: it has nothing to say here)."""
    runtime = item.runtime
    began = time.perf_counter()
    result = RuntimeResult(name=item.label, kind=runtime.kind, device=runtime.device, server=runtime.server,
                           status="ok", error=None, seconds=0.0, is_reference=False, comparisons=[],
                           signature=check.name)
    try:
        skip = _prepare(runtime, check)
        if skip == OMIT:
            return None
        if skip:
            result.status, result.error = "skipped", skip
        else:
            loop = BatchLoop(runtime)
            outputs[item.label] = loop.run_all(check.batches)
            if runtime.kind != "recorded":  # golden/trained replay a record: no latency to speak of
                result.latency = latency_summary(loop.timings)
    except InputsRejected as err:  # our inputs were wrong: say so instead of blaming the model
        result.status = "error"
        result.error = (f"the generated inputs are not valid for this model ({err}): the inputs were wrong, not "
                        f"the model; pass real inputs with --inputs (.npz, .json, or a .tfrecord of tf.Example)")
    except CheckFailed as err:  # the model cannot load or run here: the model's failure
        result.status, result.error = "error", error_text(err)
    except InfraError as err:  # not the model's fault: shown in the table, exit 3 once the report is out
        if infra is None:
            raise
        result.status, result.error = "error", error_text(err)
        infra.append(err)
    except Exception as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else ""
        result.status, result.error = "error", f"{type(err).__name__}: {first_line}"
    result.server = runtime.server
    result.device = runtime.placed_on or runtime.device
    result.seconds = time.perf_counter() - began
    return result

