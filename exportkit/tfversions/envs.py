"""Managed TensorFlow X.Y environments for the observed runs: `<cache>/tf/X.Y`, one venv per minor version.

Each holds `tensorflow-cpu==X.Y.*` (the C++ core TF Serving X.Y is built on), the op libraries the stock
server links (TF Text, TF-DF: `oplibs.env_requirements`, without their dependencies) and whatever numpy pip picks for
it (TF 2.12 needs numpy < 2); exportkit itself is not installed there: the worker is the standalone script
`exportkit/tfversions/worker.py`. The version of the TensorFlow this Python imports needs no environment.
An environment is built in a hidden sibling directory and renamed into place once `import tensorflow` works
in it, so an interrupted install leaves nothing half-built behind; pip runs in its own process group, killed
with the install (and when the install is SIGKILLed: the kernel's parent-death signal to the group's guard, which
kills the group, pip's build subprocesses included), and the next install removes the build directories of
installs that died and whatever still runs from them.

An environment is checked every time it is used: its interpreter must exist and its TensorFlow must be X.Y. The
check is cheap: the stamp in exportkit-env.json (the files' mtimes when TensorFlow was last probed) is compared
with the files; when they changed, `import tensorflow` is run again.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from exportkit.tfversions import check_version
from exportkit.errors import InfraError, UsageError
from exportkit.files import cache_dir, os_error
from exportkit.tfenv import tensorflow_version
from exportkit.processes import pid_alive
from exportkit.log import log

READY = "exportkit-env.json"
WORKER = Path(__file__).with_name("worker.py")


def install_command(version: str) -> str:
    return f"exportkit runtimes install {version}"


def root() -> Path:
    return cache_dir() / "tf"


def env_dir(version: str) -> Path:
    return root() / version


def current_version() -> str | None:
    """The X.Y of the TensorFlow installed next to exportkit (served by this Python, no environment)."""
    full = tensorflow_version()
    return ".".join(full.split(".")[:2]) if full else None


@dataclass
class EnvInfo:
    version: str
    state: str  # "built-in" | "installed" | "broken" (no interpreter) | "absent"
    python: str | None
    tensorflow: str | None  # exact release, e.g. "2.12.1"
    numpy: str | None
    path: str | None
    bytes: int | None  # on disk; measured only for `runtimes list` (info(measure=True))


def _python(directory: Path) -> Path:
    return directory / "bin" / "python"


def info(version: str, measure: bool = False) -> EnvInfo:
    """What is known of `version`'s environment without running it; its size on disk only if `measure` (a walk
    over every file: 0.4 s, on the critical path of every `--tf` run if it were always taken)."""
    version = check_version(version)
    if version == current_version():
        import numpy

        return EnvInfo(version, "built-in", sys.executable, tensorflow_version(), numpy.__version__, None, None)
    directory = env_dir(version)
    try:
        meta = json.loads((directory / READY).read_text())
    except (OSError, ValueError):
        return EnvInfo(version, "absent", None, None, None, None, None)
    size = sum(f.stat().st_size for f in directory.rglob("*") if f.is_file() and not f.is_symlink()) if measure \
        else None
    state = "installed" if _python(directory).exists() else "broken"
    return EnvInfo(version, state, str(_python(directory)), meta.get("tensorflow"), meta.get("numpy"),
                   str(directory), size)


def _stamp(directory: Path) -> list:
    """What changes when the environment's interpreter or TensorFlow changes: mtimes (ns) of the interpreter,
    of site-packages (a package installed or removed) and of tensorflow/ and its __init__.py."""
    site = sorted(directory.glob("lib/python*/site-packages"))
    paths = [_python(directory)] + [q for s in site[:1] for q in (s, s / "tensorflow", s / "tensorflow" / "__init__.py")]
    out = []
    for path in paths:
        try:
            out.append([str(path.relative_to(directory)), path.stat().st_mtime_ns])
        except OSError:
            out.append([str(path.relative_to(directory)), None])
    return out


# What the worker uses of TensorFlow at once (compat/worker.py): a `tensorflow` without them is not TensorFlow.
_PROBE = """
import json, numpy, tensorflow as tf
missing = [name for name in ("get_logger", "bfloat16", "Graph", "compat") if not hasattr(tf, name)]
print(json.dumps({"tensorflow": getattr(tf, "__version__", None), "numpy": numpy.__version__,
                  "file": getattr(tf, "__file__", None), "missing": missing}))
"""


def _probe(python: str, timeout: float = 300) -> dict | str:
    """{"tensorflow", "numpy"} as the interpreter imports them, or why it could not (the last line it said, or that
    its `tensorflow` is not TensorFlow)."""
    try:
        proc = subprocess.run(
            [python, "-I", "-B", "-c", _PROBE],
            capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, timeout=timeout,
            start_new_session=True)  # no preexec_fn: verify calls this with TensorFlow's threads running
    except (OSError, subprocess.TimeoutExpired) as err:
        return str(err)
    if proc.returncode != 0:
        died = f" (killed by {signal.Signals(-proc.returncode).name})" if proc.returncode < 0 else ""
        said = proc.stderr.strip().splitlines()
        return f"{said[-1]}{died}" if said else f"exit {proc.returncode}{died}, no output"
    try:
        meta = json.loads(proc.stdout.strip().splitlines()[-1])
        if isinstance(meta, dict) and meta.get("missing"):
            return f"its `tensorflow` ({meta.get('file')}) is not TensorFlow: it has no {', '.join(meta['missing'])}"
        if isinstance(meta, dict) and isinstance(meta.get("tensorflow"), str):
            return {"tensorflow": meta["tensorflow"], "numpy": meta["numpy"]}
    except (ValueError, IndexError):
        pass
    return f"it printed {proc.stdout.strip()[-80:]!r}, not its TensorFlow version"


def checked(version: str) -> EnvInfo:
    """The environment of `version`, trusted only after its TensorFlow is shown to be X.Y (re-probed when its
    files changed since the last probe): a broken one is exit 3 with the command that rebuilds it."""
    env = info(version)
    if env.state in ("built-in", "absent"):
        return env
    directory = Path(env.path)
    fix = f"rebuild it: `{install_command(version)} --force`"
    if env.state == "broken":
        raise InfraError(f"the TensorFlow {version} environment in {directory} has no interpreter (bin/python)", fix)
    meta = json.loads((directory / READY).read_text())
    if meta.get("stamp") != _stamp(directory):
        probed = _probe(env.python)
        if isinstance(probed, str):
            raise InfraError(f"the TensorFlow {version} environment ({directory}) has no working TensorFlow: "
                             f"{probed}", fix)
        meta.update(probed, stamp=_stamp(directory))
        try:
            _write_meta(directory, meta)
        except OSError:
            pass  # a read-only cache: the probe is repeated next time
    found = ".".join(str(meta.get("tensorflow", "")).split(".")[:2])
    if found != version:
        raise InfraError(f"the TensorFlow {version} environment in {directory} holds TensorFlow "
                         f"{meta.get('tensorflow')}, not {version}", fix)
    return replace(env, tensorflow=meta["tensorflow"], numpy=meta.get("numpy"))


def _write_meta(directory: Path, meta: dict) -> None:
    tmp = directory / (READY + ".tmp")
    tmp.write_text(json.dumps(meta))
    os.replace(tmp, directory / READY)


def list_envs() -> list[EnvInfo]:
    from exportkit.tfversions import SUPPORTED

    return [info(v, measure=True) for v in SUPPORTED]


def _progress(message: str) -> None:
    log.info(f"exportkit: {message}")


def install(version: str, force: bool = False) -> EnvInfo:
    """Create the environment of TF `version` (about a minute and 1.7 GB), showing progress on stderr."""
    version = check_version(version)
    current = info(version)
    if current.state not in ("absent", "broken") and not force:
        return current
    target = env_dir(version)
    try:
        root().mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise os_error(err, f"the cache directory {root()} (EXPORTKIT_CACHE_DIR or XDG_CACHE_HOME)") from None
    _remove_stale_builds()
    building = root() / f".{version}.building-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    began = time.monotonic()
    _progress(f"creating the TensorFlow {version} environment in {target} (once; about a minute and 1.7 GB)")
    # No signal handler of its own (a library installs none behind its caller's back): the CLI turns SIGTERM into
    # KeyboardInterrupt, which removes the build below; pip's group dies with this process in any case.
    try:
        _run_child([sys.executable, "-m", "venv", str(building)], f"python -m venv {building}")
        python = str(_python(building))
        spec = f"tensorflow-cpu=={version}.*"
        _progress(f"pip install {spec}")
        constraints = building / "constraints.txt"
        constraints.write_text(PIP_CONSTRAINTS)
        _pip(python, ["-c", str(constraints), spec], version)
        from exportkit.tfversions.oplibs import env_requirements

        libraries = env_requirements(version)  # the op libraries the stock server links (TF Text, TF-DF)
        if libraries:
            _progress(f"pip install --no-deps {' '.join(libraries)}")
            _pip(python, ["--no-deps", *libraries], version)
        meta = _probe(python)
        if isinstance(meta, str):
            raise InfraError(f"TensorFlow {version} does not import in its new environment: {meta}",
                             f"report it; retry with `{install_command(version)}`")
        _write_meta(building, {**meta, "version": version, "python": sys.version.split()[0],
                               "stamp": _stamp(building)})
        if target.exists():
            shutil.rmtree(target)
        os.replace(building, target)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    _progress(f"TensorFlow {meta['tensorflow']} (numpy {meta['numpy']}) ready in {time.monotonic() - began:.0f} s")
    return info(version)


_BUILDING = re.compile(r"\.(\d+\.\d+)\.building-(\d+)")


def _remove_stale_builds() -> None:
    """Remove the build directories of installs whose process is gone (SIGKILLed, machine rebooted), and the
    processes still running from them (should the guard itself have been killed), and say so."""
    for path in sorted(root().iterdir()):
        match = _BUILDING.fullmatch(path.name)
        if match and path.is_dir() and not _alive(int(match.group(2))):
            _progress(f"removing {path}: left by an install of TensorFlow {match.group(1)} that did not finish")
            _kill_running_from(path)
            shutil.rmtree(path, ignore_errors=True)


def _kill_running_from(directory: Path) -> None:
    """SIGKILL every process whose command line runs from `directory` (Linux /proc; elsewhere nothing)."""
    needle = str(directory).encode() + b"/"
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if needle in (proc / "cmdline").read_bytes():
                os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue


def _alive(pid: int) -> bool:
    return pid != os.getpid() and pid_alive(pid)  # our own pid reused from a dead install's: stale too


# An install's child is this guard, the leader of its own process group, which runs the real command (venv, pip).
# The kernel sends the guard SIGTERM when the install dies, even by SIGKILL (PR_SET_PDEATHSIG, set before exec),
# and the guard kills the whole group: a parent-death signal reaches only the direct child, and pip's build
# subprocesses (setup.py, PEP 517 hooks) and ensurepip's pip would keep running.
_GROUP_GUARD = """
import os, signal, subprocess, sys
def end(*_):
    os.killpg(0, signal.SIGKILL)
signal.signal(signal.SIGTERM, end)
if os.getppid() != int(sys.argv[1]):
    end()  # the install died before the parent-death signal was set
code = subprocess.call(sys.argv[2:])
sys.exit(code if code >= 0 else 128 - code)
"""


def _die_with_parent() -> None:
    """In the guard, before exec: its own process group, and SIGTERM when the install's process dies (Linux)."""
    os.setpgid(0, 0)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _group_child(command: list[str], **kwargs) -> subprocess.Popen:
    """Start `command` in a process group of its own that dies with this process (see _GROUP_GUARD; elsewhere than
    Linux only the group: _kill_group ends it when the install fails or is interrupted)."""
    if sys.platform.startswith("linux"):
        return subprocess.Popen([sys.executable, "-I", "-c", _GROUP_GUARD, str(os.getpid()), *command],
                                preexec_fn=_die_with_parent, **kwargs)
    return subprocess.Popen(command, start_new_session=True, **kwargs)


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the child's whole process group (pip and the builds it started) and reap it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


def _run_child(command: list[str], what: str) -> None:
    proc = _group_child(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate()
    finally:
        _kill_group(proc)
    if proc.returncode != 0:
        raise InfraError(f"{what} failed (exit {proc.returncode}): {(out.strip().splitlines() or [''])[-1]}",
                         "check that this Python has its venv module (Debian: apt-get install python3-venv)")


# TF 2.12/2.13 require `jax>=0.3.15`, unbounded: pip tries every newer jax (they need a newer numpy) and its
# jaxlib before it settles, which took 20 minutes on 2026-12-01. jax 0.4.38 is what it settled on.
PIP_CONSTRAINTS = "jax<=0.4.38\njaxlib<=0.4.38\n"


def _pip(python: str, requirements: list[str], version: str) -> None:
    """pip install with its progress lines relayed to stderr; a failure (no network, no wheel) is exit 3. pip runs
    in its own process group, which dies with the install (interrupted, killed, or failed)."""
    command = [python, "-m", "pip", "install", "--progress-bar", "off", "--disable-pip-version-check", *requirements]
    proc = _group_child(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    try:
        for line in proc.stdout:
            line = line.rstrip()
            if not line or line.startswith("WARNING: Location"):
                continue
            tail = (tail + [line])[-6:]
            if line.startswith(("Collecting", "Downloading", "Installing", "Successfully")):
                _progress(f"  {line[:150]}")
        proc.wait()
    finally:
        _kill_group(proc)
    if proc.returncode != 0:
        reason = next((t for t in reversed(tail) if "ERROR" in t or "Error" in t), tail[-1] if tail else "")
        raise InfraError(f"could not install tensorflow-cpu=={version}.* (pip exit {proc.returncode}): {reason}",
                         f"make PyPI reachable (network, proxy, PIP_INDEX_URL) and run `{install_command(version)}`")


def remove(version: str) -> bool:
    """Delete the environment; False when there was none."""
    version = check_version(version)
    if version == current_version():
        raise UsageError(f"TensorFlow {version} is the one installed next to exportkit, not a managed environment",
                         "nothing to remove; uninstall it with pip if you must")
    directory = env_dir(version)
    if not directory.exists():
        return False
    shutil.rmtree(directory)
    return True


def python_for(version: str, install_missing: bool = True) -> str:
    """The interpreter whose TensorFlow is X.Y (checked, see `checked`), installing its environment on first use."""
    env = checked(version)
    if env.state == "absent":
        if not install_missing:
            raise InfraError(f"no TensorFlow {version} environment", f"run `{install_command(version)}`")
        env = install(version)
    return env.python
