"""Managed TensorFlow environments that lie or break (issue 27): checked before they are trusted, every time they
are used, and installs that die leave neither processes nor build directories behind. The environments are
real venvs (without pip, seconds to make) holding stand-in `tensorflow`/`numpy` packages: no download."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest

from conftest import invoke


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("EXPORTKIT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _fake_env(cache: Path, label: str, tensorflow_init: str, recorded: str | None = None) -> Path:
    """A venv labelled X.Y whose `tensorflow` package is `tensorflow_init`; exportkit-env.json says `recorded`."""
    directory = cache / "tf" / label
    venv.EnvBuilder(with_pip=False, symlinks=True).create(directory)
    site = next(directory.glob("lib/python*/site-packages"))
    (site / "tensorflow").mkdir()
    (site / "tensorflow" / "__init__.py").write_text(tensorflow_init)
    (site / "numpy").mkdir()
    (site / "numpy" / "__init__.py").write_text("__version__ = '1.26.4'\n")
    (directory / "exportkit-env.json").write_text(json.dumps({"tensorflow": recorded or f"{label}.1", "numpy": "1.26.4",
                                                              "version": label}))
    return directory


LOOKS_LIKE_TF = "get_logger = bfloat16 = Graph = compat = None\n"  # what the probe asks of a real TensorFlow


def _error(fn):
    from exportkit.errors import ExportkitError

    with pytest.raises(ExportkitError) as info:
        fn()
    return info.value


def test_an_environment_is_trusted_only_after_its_tensorflow_is_shown_to_be_x_y(cache, monkeypatch):
    from exportkit.tfversions import envs

    directory = _fake_env(cache, "2.14", "__version__ = '2.14.1'\n" + LOOKS_LIKE_TF)
    probes = []
    real_probe = envs._probe
    monkeypatch.setattr(envs, "_probe", lambda python, **kw: probes.append(python) or real_probe(python, **kw))
    assert envs.python_for("2.14", install_missing=False) == str(directory / "bin" / "python")
    assert envs.python_for("2.14", install_missing=False) and len(probes) == 1  # stamped: not probed again
    init = next(directory.glob("lib/python*/site-packages")) / "tensorflow" / "__init__.py"
    init.write_text("__version__ = '2.12.1'\n" + LOOKS_LIKE_TF)  # someone pip-installed another TensorFlow into it
    os.utime(init, ns=(time.time_ns(), time.time_ns() + 10**9))
    err = _error(lambda: envs.python_for("2.14", install_missing=False))
    assert len(probes) == 2 and err.exit_code == 3
    assert "holds TensorFlow 2.12.1, not 2.14" in err.message and "exportkit runtimes install 2.14 --force" in err.remedy


@pytest.mark.parametrize("case", ["not_tensorflow", "dies", "no_python"])
def test_a_broken_environment_is_exit_3_with_the_rebuild_command(cache, case):
    from exportkit.tfversions import envs

    body = {"not_tensorflow": "raise ImportError('this tensorflow is a placeholder package')\n",
            "dies": "import os, signal\nsignal.signal(signal.SIGPIPE, signal.SIG_DFL)\nos.kill(os.getpid(), 13)\n",
            "no_python": "__version__ = '2.13.0'\n"}[case]
    directory = _fake_env(cache, "2.13", body)
    if case == "no_python":
        (directory / "bin" / "python").unlink()
        assert envs.info("2.13").state == "broken"  # `runtimes list` no longer calls it installed
    err = _error(lambda: envs.python_for("2.13", install_missing=False))
    assert err.exit_code == 3 and "exportkit runtimes install 2.13 --force" in err.remedy
    assert {"not_tensorflow": "placeholder package", "dies": "killed by SIGPIPE",
            "no_python": "has no interpreter (bin/python)"}[case] in err.message


def test_a_cache_directory_that_is_a_file(cache):
    cache.write_text("not a directory\n")
    proc = invoke("runtimes", "install", "2.13")
    assert proc.returncode == 2, proc.stderr
    assert "cannot write the cache directory" in proc.stderr and "fix:" in proc.stderr
    assert "unexpected" not in proc.stderr
    listing = invoke("runtimes", "list")
    assert listing.returncode == 0 and "absent" in listing.stdout


@pytest.mark.slow
def test_the_next_install_removes_a_killed_installs_build_and_its_processes(cache, caplog):
    import logging

    from exportkit.tfversions import envs

    caplog.set_level(logging.INFO, logger="exportkit")  # the install's notes (the CLI prints them on stderr)

    dead = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process has it (a finished child's pid
    stale = cache / "tf" / f".2.15.building-{dead}"                 # can be reused while other tests spawn)
    (stale / "bin").mkdir(parents=True)
    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(stale / "bin" / "pip")])
    for _ in range(100):  # until it has exec'd: before, its command line is still pytest's
        if str(stale).encode() in Path(f"/proc/{leftover.pid}/cmdline").read_bytes():
            break
        time.sleep(0.05)
    envs.root().mkdir(parents=True, exist_ok=True)
    envs._remove_stale_builds()
    assert not stale.exists() and leftover.wait(timeout=10) == -signal.SIGKILL
    assert f"removing {stale}: left by an install of TensorFlow 2.15 that did not finish" in caplog.text


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting for a reaper (containers' init may be slow to reap orphans)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


PIP_THEN_KILLED = """
import sys
from exportkit.tfversions import envs
envs._pip(sys.argv[1], ["tensorflow-cpu==2.13.*"], "2.13")
"""


def test_pip_dies_with_an_install_that_is_sigkilled(tmp_path):
    """pip runs in its own process group, whose guard has a parent-death signal: SIGKILL of the install ends it."""
    fake_python = tmp_path / "python"
    pid_file = tmp_path / "pip.pid"
    fake_python.write_text(f"#!/bin/sh\necho $$ > {pid_file}\necho Collecting tensorflow-cpu\nexec sleep 60\n")
    fake_python.chmod(0o755)
    install = subprocess.Popen([sys.executable, "-c", PIP_THEN_KILLED, str(fake_python)], stderr=subprocess.PIPE,
                               text=True)
    for _ in range(300):
        if pid_file.exists() and pid_file.read_text().strip():
            break
        time.sleep(0.1)
    pip_pid = int(pid_file.read_text())
    assert os.getpgid(pip_pid) != os.getpgid(0)  # its own group
    install.kill()
    install.wait()
    install.stderr.close()
    for _ in range(100):
        if not _running(pip_pid):
            break
        time.sleep(0.1)
    else:
        os.kill(pip_pid, signal.SIGKILL)
        pytest.fail("pip kept running after its install was SIGKILLed")


STANDIN_SETUP = """
import os, time
from pathlib import Path
Path(os.environ["STANDIN_PID_FILE"]).write_text(str(os.getpid()))
time.sleep(60)
"""


@pytest.mark.slow
def test_a_sigkilled_install_takes_pip_and_the_builds_it_started_with_it(cache, tmp_path):
    """`exportkit runtimes install` SIGKILLed (a CI step timeout) while pip builds a package: pip and its build
    subprocess end within seconds. The index is a local directory holding one stand-in sdist whose setup.py
    waits (no download; the venv is real, made by `python -m venv` with its ensurepip)."""
    import tarfile

    index, src = tmp_path / "index", tmp_path / "tensorflow_cpu-2.15.0"
    index.mkdir()
    src.mkdir()
    (src / "setup.py").write_text(STANDIN_SETUP)
    (src / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: tensorflow-cpu\nVersion: 2.15.0\n")
    with tarfile.open(index / "tensorflow_cpu-2.15.0.tar.gz", "w:gz") as tar:
        tar.add(src, arcname=src.name)
    pid_file = tmp_path / "setup.pid"
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index), "STANDIN_PID_FILE": str(pid_file),
           "PIP_NO_BUILD_ISOLATION": "0"}  # (pip's inverted spelling of --no-build-isolation)
    install = subprocess.Popen([sys.executable, "-m", "exportkit", "runtimes", "install", "2.15"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(1200):
        if pid_file.exists() and pid_file.read_text().strip() or install.poll() is not None:
            break
        time.sleep(0.1)
    assert install.poll() is None and pid_file.exists(), "the stand-in build never started"
    build = int(pid_file.read_text())
    group = os.getpgid(build)
    assert group != os.getpgid(0)  # pip's own process group
    install.kill()
    install.wait()
    left = []
    for _ in range(100):
        left = [pid for pid in map(int, [p.name for p in Path("/proc").glob("[0-9]*")]) if _in_group(pid, group)]
        if not left:
            break
        time.sleep(0.1)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "pip's processes kept running after the install was SIGKILLed"
    from exportkit.tfversions import envs

    envs._remove_stale_builds()  # what the next install does first
    assert [p.name for p in (cache / "tf").iterdir()] == []


def _in_group(pid: int, group: int) -> bool:
    try:
        return os.getpgid(pid) == group and _running(pid)
    except ProcessLookupError:
        return False


# ------------------------------------------------------------------------------------------ broken environments
def _worker_error(python: Path, model: Path):
    """What the standalone TF X.Y worker under `python` answers when asked to load `model`."""
    from exportkit.tfversions.envs import WORKER
    from exportkit.runtimes.session import SessionRuntime

    runtime = SessionRuntime(str(model), python=str(python), worker=str(WORKER), broken_remedy="rebuild it")
    try:
        return _error(runtime.load)
    finally:
        runtime.close()


def test_a_tensorflow_that_is_not_tensorflow_is_one_message_with_the_rebuild_command(cache, tmp_path):
    """A managed environment whose `tensorflow` has a version and nothing else: refused before it is trusted (the
    probe), and by the worker itself should it start anyway: one message, no AttributeError."""
    from exportkit.tfversions import envs

    directory = _fake_env(cache, "2.14", "__version__ = '2.14.1'\n")
    err = _error(lambda: envs.python_for("2.14", install_missing=False))
    assert err.exit_code == 3 and "exportkit runtimes install 2.14 --force" in err.remedy
    assert "is not TensorFlow" in err.message and "get_logger" in err.message
    assert "AttributeError" not in err.message and "Traceback" not in err.message
    err = _worker_error(directory / "bin" / "python", tmp_path)
    assert err.exit_code == 3 and err.remedy == "rebuild it", err.message
    assert "is not TensorFlow" in err.message and "AttributeError" not in err.message


def test_a_worker_python_without_numpy_is_exit_3_naming_the_package_and_pip(cache, tmp_path):
    import shutil

    directory = _fake_env(cache, "2.14", "__version__ = '2.14.1'\n")
    shutil.rmtree(next(directory.glob("lib/python*/site-packages")) / "numpy")
    python = directory / "bin" / "python"
    err = _worker_error(python, tmp_path)
    assert err.exit_code == 3 and "no module 'numpy'" in err.message, err.message
    assert f"{python} -m pip install numpy" in err.remedy and "Traceback" not in err.message


@pytest.fixture(scope="module")
def python_without_h11(tmp_path_factory) -> Path:
    """A real venv holding every package of this one but h11 (symlinked, so it costs no copy)."""
    directory = tmp_path_factory.mktemp("no_h11") / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(directory)
    site = next(directory.glob("lib/python*/site-packages"))
    ours = Path(next(p for p in sys.path if p.endswith("site-packages") and Path(p, "numpy").is_dir()))
    for entry in ours.iterdir():
        if entry.name.split("-")[0].split(".")[0].lower() != "h11":
            (site / entry.name).symlink_to(entry)
    return directory / "bin" / "python"


@pytest.mark.slow
def test_an_embedded_server_without_h11_is_infrastructure_naming_the_package(python_without_h11, third_party):
    """The model is fine: the Python lacks a dependency of the server. Exit 3 (not the model's FAILED, exit 1)."""
    proc = subprocess.run([str(python_without_h11), "-m", "exportkit", "verify", str(third_party["plain"]),
                           "--serving", "embedded", "--runtimes", "session,serving,rest"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "no module 'h11'" in proc.stderr and f"{python_without_h11} -m pip install h11" in proc.stderr
    # `exportkit serve` as the launcher runs it in a process of its own: its exit 3 is the launcher's InfraError
    proc = subprocess.run([str(python_without_h11), "-I", "-c", LAUNCH_EMBEDDED, str(third_party["plain"])],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = json.loads(proc.stdout)
    assert said["exit_code"] == 3 and f"{python_without_h11} -m pip install h11" in said["remedy"], said
    assert "no module 'h11'" in said["message"] and "unexpected" not in said["message"]


LAUNCH_EMBEDDED = """
import json, sys
from exportkit.errors import ExportkitError
from exportkit.serving.launch.embedded import start_embedded
try:
    start_embedded(sys.argv[1], rest=True).wait().stop()
except ExportkitError as err:
    print(json.dumps({"exit_code": err.exit_code, "message": err.message, "remedy": err.remedy}))
"""
