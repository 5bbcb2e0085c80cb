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


def _error(fn):
    from exportkit.errors import ExportkitError

    with pytest.raises(ExportkitError) as info:
        fn()
    return info.value


def test_an_environment_is_trusted_only_after_its_tensorflow_is_shown_to_be_x_y(cache, monkeypatch):
    from exportkit.compat import envs

    directory = _fake_env(cache, "2.14", "__version__ = '2.14.1'\n")
    probes = []
    real_probe = envs._probe
    monkeypatch.setattr(envs, "_probe", lambda python, **kw: probes.append(python) or real_probe(python, **kw))
    assert envs.python_for("2.14", install_missing=False) == str(directory / "bin" / "python")
    assert envs.python_for("2.14", install_missing=False) and len(probes) == 1  # stamped: not probed again
    init = next(directory.glob("lib/python*/site-packages")) / "tensorflow" / "__init__.py"
    init.write_text("__version__ = '2.12.1'\n")  # someone pip-installed another TensorFlow into it
    os.utime(init, ns=(time.time_ns(), time.time_ns() + 10**9))
    err = _error(lambda: envs.python_for("2.14", install_missing=False))
    assert len(probes) == 2 and err.exit_code == 3
    assert "holds TensorFlow 2.12.1, not 2.14" in err.message and "exportkit runtimes install 2.14 --force" in err.remedy


@pytest.mark.parametrize("case", ["not_tensorflow", "dies", "no_python"])
def test_a_broken_environment_is_exit_3_with_the_rebuild_command(cache, case):
    from exportkit.compat import envs

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
def test_the_next_install_removes_a_killed_installs_build_and_its_processes(cache, capsys):
    from exportkit.compat import envs

    dead = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process has it (a finished child's pid
    stale = cache / "tf" / f".2.15.building-{dead}"                 # can be reused while other tests spawn)
    (stale / "bin").mkdir(parents=True)
    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(stale / "bin" / "pip")])
    envs.root().mkdir(parents=True, exist_ok=True)
    envs._remove_stale_builds()
    assert not stale.exists() and leftover.wait(timeout=10) == -signal.SIGKILL
    assert f"removing {stale}: left by an install of TensorFlow 2.15 that did not finish" in capsys.readouterr().err


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting for a reaper (containers' init may be slow to reap orphans)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


PIP_THEN_KILLED = """
import sys
from exportkit.compat import envs
envs._pip(sys.argv[1], ["tensorflow-cpu==2.13.*"], "2.13")
"""


def test_pip_dies_with_an_install_that_is_sigkilled(tmp_path):
    """pip runs in its own process group with a parent-death signal: SIGKILL of the install ends it too."""
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
    assert os.getpgid(pip_pid) == pip_pid  # its own group
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
