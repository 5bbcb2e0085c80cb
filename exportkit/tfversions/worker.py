"""The serving-equivalent session worker for a managed TensorFlow X.Y environment.

STANDALONE on purpose: it runs under `python -I` with that environment's interpreter, TensorFlow and numpy
(TF 2.12 needs numpy < 2), where the exportkit package is not installed. It speaks the protocol of
exportkit.runtimes.session_worker (one JSON request per line on stdin, one JSON reply per line on stdout)
and reads/writes the batch .npz format of exportkit's batch files:

* a batch is one `<prefix>_batch_<i>.npz` zip of `.npy` members keyed by input/output name;
* strings are fixed-width `S` arrays; when an element ends with NUL a `<key>.__len__` member holds the
  exact byte lengths; bfloat16 is stored as 2-byte void (`|V2`).

    {"op": "load", "path": DIR, "signature": NAME, "device": "cpu"} -> {"ok": true, "tf": "2.12.1"}
    {"op": "run", "dir": DIR, "inputs": PREFIX, "outputs": PREFIX, "signature": NAME}   -> {"ok": true}
                                                                     (signature: the loaded one unless given)
    {"op": "memory"} -> {"ok": true, "memory": {...}}: what the load costs this process (MemoryMeter.figures)

MemoryMeter lives here because both workers measure with it and this one cannot import exportkit.
"""
import json
import os
import re
import sys
import threading
import traceback
import zipfile

LENGTHS = ".__len__"
# Libraries that TensorFlow's import loads when installed and no SavedModel load uses; None in sys.modules makes
# their import an ImportError, which the importers handle. Plotting and images (keras.src.visualization, image
# utilities): a third of a second of every worker's import. JAX: tensorflow/lite/python/util.py tries
# `from jax import jit` for the TFLite converter: 1.5 s and 145 MB of every worker's import where jax is installed;
# a jax2tf export's XlaCallModule is a C++ kernel and needs none of it. (exportkit.runtimes.session_worker and
# `exportkit serve` do the same: processes that load SavedModels only.)
NOT_FOR_LOADING = ("matplotlib", "PIL", "jax", "jaxlib")


def _status():
    """{field: bytes} of /proc/self/status's VmRSS, VmHWM, RssAnon, RssFile, RssShmem; {} where there is no /proc."""
    found = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                    found[name] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return found


def _held(status):
    """The memory the process itself holds: anonymous and shared-memory pages. Not RssFile: those are the shared
    libraries' pages (TensorFlow's code), which a worker forked from a warm process faults in again as it first runs
    them, and which the kernel shares between every process that maps them."""
    return status["RssAnon"] + status["RssShmem"] if "RssAnon" in status else None


def _allocated():
    """Bytes TensorFlow's CPU allocator has handed out now, where it keeps statistics (oneDNN's pool); else None."""
    tf = sys.modules.get("tensorflow")
    try:
        return tf.config.experimental.get_memory_info("CPU:0")["current"] if tf is not None else None
    except (ValueError, AttributeError, KeyError):
        return None


def _reset_peak():
    """VmHWM back to the current RSS (`echo 5 > /proc/self/clear_refs`, Linux >= 4.0); False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _trim():
    """Give freed heap back to the kernel (glibc's malloc_trim), so that a load does not reuse memory an earlier one
    freed and look smaller than it is in a fresh server."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class MemoryMeter:
    """What a version costs the process that loads it, from the kernel's own accounting (/proc/self/status).

    Loads go one at a time (`load`), each between two readings of the memory the process holds (_held), so each
    one's growth is its own although the worker holds several (verify's TF2 load, the previous version for the swap).
    glibc's malloc_trim runs before each reading, so the figures are what is kept, not heap freed and not yet given
    back. The figures of a loader (`figures`): baseline = held before its load; loaded = what its load and the
    first run of each signature (the warm-up, measured the same way) added; peak = VmHWM since its load began (reset
    through clear_refs; else the highest reading `sample` saw) less the shared libraries' pages, the baseline and what
    the loads after it still hold: a lower bound of the true peak, exact unless code pages were first touched after
    the peak."""

    def __init__(self):
        self.lock = threading.Lock()
        self.loads = {}  # loader -> {"before": held before its load, "grown": what it added}, in load order
        self.peak_from = None  # the loader whose load reset VmHWM
        self.sampled = 0
        self.hwm_reset = False
        self.pooled = 0  # what unloaded models left in TensorFlow's CPU allocator's pool (`release`)

    def load(self, loader, do_load, reset_peak=False):
        """do_load() between two readings, one load at a time. Also what is not the model's, to be left out of the
        figures of loads before it (the embedded server's code: TF Serving's is in its binary before any load);
        calls under one name add up."""
        with self.lock:
            _trim()
            before, in_use = _held(_status()), _allocated()
            if reset_peak:
                self.hwm_reset, self.peak_from, self.sampled = _reset_peak(), loader, before or 0
            result = do_load()
            _trim()  # what it freed is not held (a transient graph copy, say): the figure is what it keeps
            after = _held(_status())
            if before is not None and after is not None:
                grown = after - before
                if self.pooled and in_use is not None:  # it took memory an unloaded model left in the pool
                    reused = min(self.pooled, max(0, (_allocated() or 0) - in_use))
                    grown, self.pooled = grown + reused, self.pooled - reused
                earlier = self.loads.get(loader, {"before": before, "grown": 0})
                self.loads[loader] = {"before": earlier["before"], "grown": earlier["grown"] + grown}
            return result

    def sample(self):
        self.sampled = max(self.sampled, _held(_status()) or 0)

    def release(self, loader, do_unload):
        """do_unload() between two readings: what the unloaded model leaves in TensorFlow's own CPU allocator (with
        oneDNN, the default on x86, a pool that keeps freed tensors' memory) is credited to the next loads, which
        reuse it instead of growing the process (see `load`)."""
        with self.lock:
            before = _held(_status())
            do_unload()
            _trim()
            after = _held(_status())
            entry = self.loads.pop(loader, None)
            if entry is not None and before is not None and after is not None:
                self.pooled += max(0, entry["grown"] - (before - after))

    def figures(self, loader):
        """{"baseline_bytes", "loaded_bytes", "peak_bytes", "method"} of `loader`'s load; {} when not measured."""
        entry = self.loads.get(loader)
        status = _status()
        if entry is None or _held(status) is None:
            return {}
        names = list(self.loads)
        later = sum(self.loads[n]["grown"] for n in names[names.index(loader) + 1:])
        by_hwm = self.hwm_reset and self.peak_from == loader
        highest = status["VmHWM"] - status["RssFile"] if by_hwm else max(self.sampled, _held(status))
        loaded = entry["grown"]
        return {"baseline_bytes": entry["before"], "loaded_bytes": loaded,
                "peak_bytes": max(highest - entry["before"] - later, loaded),
                "method": "RssAnon+RssShmem, peak from VmHWM" if by_hwm else "RssAnon+RssShmem, peak sampled"}


def reply(stream, **payload):
    stream.write(json.dumps(payload) + "\n")
    stream.flush()


def load_batches(np, bfloat16, directory, prefix):
    pattern = re.compile(re.escape(prefix + "_batch_") + r"(\d+)\.npz")
    found = sorted((int(m.group(1)), name) for name in os.listdir(directory) if (m := pattern.fullmatch(name)))
    batches = []
    for _, name in found:
        with np.load(os.path.join(directory, name), allow_pickle=False) as z:
            batch = {}
            for key in z.files:
                if key.endswith(LENGTHS):
                    continue
                arr = z[key]
                if arr.dtype.kind == "V" and arr.dtype.itemsize == 2:
                    arr = arr.view(bfloat16)
                elif arr.dtype.kind == "S":
                    lengths = z[key + LENGTHS].reshape(-1) if key + LENGTHS in z.files else None
                    raw = np.ascontiguousarray(arr).view(np.uint8).reshape(-1, arr.dtype.itemsize)
                    flat = [bytes(row[: int(lengths[i])]) if lengths is not None else bytes(arr.reshape(-1)[i])
                            for i, row in enumerate(raw)]
                    arr = np.array(flat + [None], dtype=object)[:-1].reshape(arr.shape)
                batch[key] = arr
            batches.append(batch)
    return batches


def save_batches(np, directory, batches, prefix):
    for i, batch in enumerate(batches):
        path = os.path.join(directory, f"{prefix}_batch_{i}.npz")
        with zipfile.ZipFile(path + ".tmp", "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
            for key, arr in batch.items():
                arr = np.asarray(arr)
                members = {key: arr}
                if arr.dtype.kind in "OS":
                    values = [bytes(x) if isinstance(x, (bytes, np.bytes_)) else str(x).encode() for x in arr.flat]
                    width = max((len(v) for v in values), default=1) or 1
                    members[key] = np.array(values, dtype=f"S{width}").reshape(arr.shape)
                    if any(v.endswith(b"\0") for v in values):
                        members[key + LENGTHS] = np.array([len(v) for v in values], dtype=np.int64).reshape(arr.shape)
                for name, value in members.items():
                    with zf.open(name + ".npy", "w", force_zip64=True) as fh:  # (ascontiguousarray makes 0-d 1-d)
                        np.lib.format.write_array(fh, np.require(value, requirements="C"), allow_pickle=False)
        os.replace(path + ".tmp", path)


def session_callable(session, feeds, fetches):
    """The C++ session's callable (as exportkit.savedmodel.loader runs it, and TF Serving's C++ session): no Python
    feed-shape check against the placeholders' static shapes."""
    from tensorflow.core.protobuf import config_pb2

    for name in feeds + fetches:
        session.graph.get_tensor_by_name(name)  # a missing tensor: a KeyError that names it
    return session._make_callable_from_options(config_pb2.CallableOptions(feed=feeds, fetch=fetches))


def as_feed(np, graph, name, value):
    dtype = graph.get_tensor_by_name(name).dtype
    return np.asarray(value, dtype=object if dtype.name == "string" else dtype.as_numpy_dtype)


def load_op_libraries(path):
    """exportkit/tfversions/oplibs.py (standalone too, loaded by path): TF Text / TF-DF ops the model needs, as the
    stock server links them, and the user's --op-library entries."""
    import importlib.util

    where = os.path.join(os.path.dirname(__file__), "oplibs.py")
    spec = importlib.util.spec_from_file_location("exportkit_oplibs", where)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.load_server_op_libraries(path)


def environment_failure(err):
    """A reply's fields for what is wrong with this Python: a module it lacks (the caller words it with its pip
    command), or numpy/TensorFlow that do not import or are not what they claim."""
    if isinstance(err, ModuleNotFoundError) and err.name:
        return {"kind": "infra", "missing_module": err.name, "message": f"no module {err.name!r}"}
    tf = sys.modules.get("tensorflow")
    if isinstance(err, AttributeError) and tf is not None and getattr(err, "obj", None) is tf:
        return {"kind": "infra", "message": f"imports a `tensorflow` ({getattr(tf, '__file__', None)}) that is not "
                                            f"TensorFlow: it has no {err.name}"}
    return {"kind": "infra", "message": f"cannot import numpy and TensorFlow: {type(err).__name__}: "
                                        f"{' '.join(str(err).split())[:300]}"}


def prepare():
    """What the worker does before its ready line; exportkit's fork server (exportkit/runtimes/forkserver.py) does it
    once for all the workers it forks from this environment."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.modules.update(dict.fromkeys(NOT_FOR_LOADING))  # see NOT_FOR_LOADING
    import numpy as np
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    return np, tf


def main():
    channel = sys.stdout
    sys.stdout = sys.stderr  # anything TensorFlow prints goes to stderr, not into the protocol
    try:
        np, tf = prepare()
        bfloat16 = tf.bfloat16.as_numpy_dtype
    except Exception as err:  # this Python's fault: said on the ready line, which the caller turns into exit 3
        reply(channel, ok=False, ready=True, **environment_failure(err))
        return 1
    reply(channel, ok=True, ready=True, tf=tf.__version__)
    session = signature = None
    meter = MemoryMeter()
    ran = set()  # the signatures that have run once (ids of their SignatureDefs)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if request["op"] == "load":
                load_op_libraries(request["path"])
                config = tf.compat.v1.ConfigProto()
                if request.get("device", "cpu") == "cpu":
                    config.device_count["GPU"] = 0
                graph = tf.Graph()
                session = tf.compat.v1.Session(graph=graph, config=config)
                with graph.as_default():
                    meta_graph = meter.load("session", lambda: tf.compat.v1.saved_model.loader.load(
                        session, ["serve"], request["path"]), reset_peak=True)
                signatures = dict(meta_graph.signature_def)
                ran.clear()
                if request["signature"] not in signatures:
                    reply(channel, ok=False, kind="model", message=f"no signature {request['signature']!r} "
                          f"(available: {', '.join(sorted(signatures))})")
                    continue
                signature = signatures[request["signature"]]
                reply(channel, ok=True, tf=tf.__version__)
            elif request["op"] == "run":
                if request.get("signature") and request["signature"] in signatures:
                    signature = signatures[request["signature"]]
                elif request.get("signature"):
                    reply(channel, ok=False, kind="model", message=f"no signature {request['signature']!r} "
                          f"(available: {', '.join(sorted(signatures))})")
                    continue
                keys = sorted(signature.outputs)
                fetches = [signature.outputs[k].name for k in keys]
                batches = load_batches(np, bfloat16, request["dir"], request["inputs"])

                def answer():
                    outputs = []
                    for batch in batches:
                        feeds = sorted(batch)
                        run = session_callable(session, [signature.inputs[k].name for k in feeds], fetches)
                        values = [as_feed(np, session.graph, signature.inputs[k].name, batch[k]) for k in feeds]
                        outputs.append(dict(zip(keys, run(*values))))
                    return outputs

                first = id(signature) not in ran  # its first run (the warm-up) counts to the load, as in the
                ran.add(id(signature))            # session worker
                outputs = meter.load("session", answer) if first else answer()
                meter.sample()
                save_batches(np, request["dir"], outputs, request["outputs"])
                reply(channel, ok=True)
            elif request["op"] == "memory":
                reply(channel, ok=True, memory=meter.figures("session"))
        except Exception as err:  # the model's failure: report it, stay alive for the caller to close
            if type(err).__name__ == "OpLibraryError":  # this environment lacks a library, not the model's fault
                reply(channel, ok=False, kind="infra", message=err.message, remedy=err.fix)
                continue
            if isinstance(err, ModuleNotFoundError) and err.name:
                reply(channel, ok=False, **environment_failure(err))
                continue
            message = f"{type(err).__name__}: {' '.join(str(err).split())[:800]}"
            reply(channel, ok=False, kind="model", message=message, detail=traceback.format_exc()[-4000:])
    return 0


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    os._exit(code)  # the caller closed stdin: skip TensorFlow's slow teardown
