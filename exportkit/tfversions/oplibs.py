"""Load into a worker the op libraries its server links, before the model is loaded.

The stock `tensorflow_model_server` links TensorFlow Text's ops and TF Decision Forests' inference ops
(model_servers/BUILD, SUPPORTED_TENSORFLOW_OPS); a Python `import tensorflow` has neither. A worker that
stands for the server calls `load_server_op_libraries(saved_model_dir)` first: it registers those libraries
when the model uses their ops, and every library the user named with `--op-library` (exportkit.toml:
`op_libraries`), passed to workers in EXPORTKIT_OP_LIBRARIES. The static verdict still says the stock server
lacks a user's ops: loading them here only lets verify run the model.

Plain Python plus the TensorFlow the worker already imported, and no exportkit imports: the standalone worker
of the managed TF X.Y environments (compat/worker.py) loads this file by path.
"""
from __future__ import annotations

import contextlib
import gzip
import importlib
import json
import os
from pathlib import Path

ENV = "EXPORTKIT_OP_LIBRARIES"  # os.pathsep-separated .so paths and Python module names
REGISTRIES = Path(__file__).resolve().with_name("registries")
# Where each stock library's shared objects are in the packages that ship them (package, glob): loaded with
# tf.load_op_library, as linking them into the server does, without their Python (tools/build_registries.py
# builds the registries from the same files).
SHARED_OBJECTS = {
    "tensorflow-text": [("tensorflow_text", "python/ops/_*.so")],
    "tensorflow-decision-forests": [("ydf_tf", "inference.so"),
                                    ("tensorflow_decision_forests", "tensorflow/ops/inference/inference.so")]}
# What a TensorFlow X.Y environment installs for them (pip --no-deps, next to tensorflow-cpu): the release
# TF Serving X.Y pins where it was built for TF X.Y, else the release built for X.Y (TF-DF's release notes pair
# each with one TF; ydf-tf follows TF's numbers from 2.18); None: no wheel for X.Y (tensorflow-text 2.13).
ENV_PACKAGES = {
    "tensorflow-text": {"2.12": "tensorflow-text==2.12.1", "2.13": None, "2.20": "tensorflow-text==2.20.0"},
    "tensorflow-decision-forests": {
        "2.12": "tensorflow-decision-forests==1.3.0", "2.13": "tensorflow-decision-forests==1.5.0",
        "2.14": "tensorflow-decision-forests==1.7.0", "2.15": "tensorflow-decision-forests==1.8.1",
        "2.16": "tensorflow-decision-forests==1.9.1", "2.17": "tensorflow-decision-forests==1.10.0"},
}
DEFAULT_PACKAGE = {"tensorflow-text": "tensorflow-text=={tf}.*", "tensorflow-decision-forests": "ydf-tf=={tf}.*"}


def env_requirements(tf_minor: str) -> list[str]:
    """pip requirements (installed with --no-deps) of the op libraries a managed TF `tf_minor` env holds."""
    out = []
    for library, table in ENV_PACKAGES.items():
        requirement = table.get(tf_minor, DEFAULT_PACKAGE[library].format(tf=tf_minor))
        if requirement:
            out.append(requirement)
    return out


class OpLibraryError(RuntimeError):
    """A library the model or the user needs could not be loaded; `fix` says what to install or change."""

    def __init__(self, message: str, fix: str):
        super().__init__(f"{message}; fix: {fix}")
        self.message, self.fix = message, fix


def _entries(libraries, base: Path) -> list[str]:
    return [str((base / x).resolve()) if x.endswith(".so") or os.sep in x else x for x in libraries]


def spec_op_libraries(spec_file: Path) -> list[str]:
    """`op_libraries = [...]` of an exportkit.toml (paths relative to the file); [] without the key or file."""
    import tomllib

    try:
        data = tomllib.loads(spec_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []  # no file; a broken one is reported by the commands that read their options from it
    value = data.get("op_libraries", [])
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise OpLibraryError(f"{spec_file}: op_libraries must be a list of strings",
                             'write op_libraries = ["build/my_ops.so", "my_package.ops"]')
    return _entries(value, spec_file.parent)


@contextlib.contextmanager
def op_libraries_env(libraries, spec_file: Path = Path("exportkit.toml")):
    """EXPORTKIT_OP_LIBRARIES set to `libraries` (--op-library, paths made absolute) and the `op_libraries` of
    `spec_file` (default: ./exportkit.toml) for the workers started inside; restored afterwards."""
    before = os.environ.get(ENV)
    entries = _entries(libraries or [], Path.cwd()) + spec_op_libraries(spec_file)
    if entries:
        os.environ[ENV] = os.pathsep.join(entries)
    try:
        yield entries
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before


class NotLinkedError(RuntimeError):
    """The model uses ops of a newer release of a library than the one the stock server X.Y links: the server
    refuses it the way it refuses any unregistered op (a model failure, not the environment's)."""


def _overlay(name: str) -> dict:
    with gzip.open(REGISTRIES / name, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def pinned_release(library: str, tf_minor: str) -> str | None:
    """"tensorflow-text 2.12.1": the release of `library` the stock TF Serving `tf_minor` links."""
    try:
        names = json.loads((REGISTRIES / "servers.json").read_text())[tf_minor]["libraries"]
    except (OSError, KeyError, ValueError):
        return None
    for name in names:
        if name.startswith(library + "-"):
            return f"{library} {name[len(library) + 1:-len('.json.gz')]}"
    return None


def pinned_ops(library: str, tf_minor: str) -> set[str] | None:
    """The ops of the release of `library` the stock TF Serving `tf_minor` links; None when unknown."""
    release = pinned_release(library, tf_minor)
    return set(_overlay(f"{library}-{release.split()[-1]}.json.gz")["ops"]) if release else None


def env_op_libraries() -> tuple[str, ...]:
    """The --op-library entries passed to the workers (EXPORTKIT_OP_LIBRARIES)."""
    return tuple(x for x in os.environ.get(ENV, "").split(os.pathsep) if x)


def stock_library_ops() -> dict[str, set[str]]:
    """{library: every op some release of it linked by a stock server registers} from the shipped overlays."""
    out: dict[str, set[str]] = {}
    for path in sorted(REGISTRIES.glob("*.json.gz")):
        if not path.name.startswith("tf-"):
            doc = _overlay(path.name)
            out.setdefault(doc["library"], set()).update(doc["ops"])
    return out


def saved_model_ops(saved_model_dir: str) -> set[str]:
    """Op names of the graph and its function library (needs TensorFlow's protobuf modules)."""
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    pb = Path(saved_model_dir) / "saved_model.pb"
    if not pb.is_file():
        return set()  # a .pbtxt model: the loader reports what is missing
    proto.ParseFromString(pb.read_bytes())
    ops = set()
    for meta_graph in proto.meta_graphs:
        ops.update(node.op for node in meta_graph.graph_def.node)
        for function in meta_graph.graph_def.library.function:
            ops.update(node.op for node in function.node_def)
    return ops


def load_server_op_libraries(saved_model_dir: str | None, user_libraries: list[str] | None = None) -> list[str]:
    """Register the stock server's libraries the model's ops need and the user's (`user_libraries`, default
    EXPORTKIT_OP_LIBRARIES); returns what was loaded. Raises OpLibraryError naming the package to install."""
    import tensorflow as tf

    loaded = []
    if user_libraries is None:
        user_libraries = env_op_libraries()
    for entry in user_libraries:
        try:
            if entry.endswith(".so"):
                tf.load_op_library(entry)
            else:
                importlib.import_module(entry)
        except Exception as err:  # noqa: BLE001  (NotFoundError, ImportError, a library built for another TF)
            raise OpLibraryError(f"--op-library {entry} could not be loaded into TensorFlow {tf.__version__}: "
                                 f"{type(err).__name__}: {' '.join(str(err).split())[:300]}",
                                 "pass a shared object built for this TensorFlow (tf.sysconfig.get_compile_flags / "
                                 "get_link_flags) or an importable Python module that registers the ops") from err
        loaded.append(entry)
    if saved_model_dir is None:
        return loaded
    ops = saved_model_ops(saved_model_dir)
    tf_minor = ".".join(tf.__version__.split(".")[:2])
    for library, library_ops in stock_library_ops().items():
        pinned = pinned_ops(library, tf_minor)
        unlinked = sorted((ops & library_ops) - pinned) if pinned is not None else []
        if unlinked:
            release = pinned_release(library, tf_minor)
            raise NotLinkedError(f"Op type not registered '{unlinked[0]}' in the stock TF Serving {tf_minor}: it links "
                                 f"{release}, which lacks {', '.join(unlinked)}")
        needed = sorted(ops & library_ops)  # loading a library twice (tensorflow_text imported) is a no-op
        if not needed:
            continue
        files = _shared_objects(library)
        if not files:
            requirement = ENV_PACKAGES[library].get(tf_minor, DEFAULT_PACKAGE[library].format(tf=tf_minor))
            fix = (f"pip install --no-deps '{requirement}' next to TensorFlow {tf.__version__} (or `exportkit runtimes "
                   f"install --force {tf_minor}` for a managed environment)" if requirement else
                   f"no {library} wheel is built for TensorFlow {tf_minor}: check this version statically "
                   f"(`exportkit compat` without --run)")
            raise OpLibraryError(
                f"the model uses {library} ops ({', '.join(needed[:3])}{' ...' if len(needed) > 3 else ''}), which the "
                f"stock TF Serving links, but this TensorFlow {tf.__version__} environment has no {library}", fix)
        try:
            for path in files:
                tf.load_op_library(path)
        except Exception as err:  # noqa: BLE001  (built for another TensorFlow: undefined symbols)
            raise OpLibraryError(f"{library}'s {Path(path).name} does not load into TensorFlow {tf.__version__}: "
                                 f"{type(err).__name__}: {' '.join(str(err).split())[:300]}",
                                 f"install the {library} release built for TensorFlow {tf_minor}") from err
        loaded += files
    return loaded


def _shared_objects(library: str) -> list[str]:
    """The first installed package's shared objects for `library` (found without importing the package)."""
    import importlib.util

    for package, pattern in SHARED_OBJECTS[library]:
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.submodule_search_locations:
            files = sorted(Path(next(iter(spec.submodule_search_locations))).glob(pattern))
            if files:
                return [str(f) for f in files]
    return []


def load_for_worker(saved_model_dir: str | None) -> list[str]:
    """`load_server_op_libraries` for the workers inside exportkit: a failure is an InfraError (exit 3)."""
    from exportkit.errors import InfraError  # not in compat/worker.py, which runs without exportkit

    try:
        return load_server_op_libraries(saved_model_dir)
    except OpLibraryError as err:
        raise InfraError(err.message, err.fix) from err
