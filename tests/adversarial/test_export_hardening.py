"""export under faults: defaults, reservation, stale staging directories, permissions, disk full, names."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO, invoke, tree_snapshot

TOML = textwrap.dedent("""\
    format = "checkpoint"
    builder = "nets:build_two_heads"
    python_path = [".."]
    input_specs = ["x:-1,3:float32"]
    name = "heads"
    output_names = ["box", "score"]
""")


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.mark.slow
def test_export_without_o_names_outputs_clears_stale_staging_and_uses_the_umask(sources, tmp_path):
    project = tmp_path / "project"
    shutil.copytree(sources, project)
    (project / "ckpt" / "exportkit.toml").write_text(TOML)
    stale = project / "export" / "heads" / f".exportkit-5-{_dead_pid()}-0123abcd"
    stale.mkdir(parents=True)
    (stale / "saved_model.pb").write_bytes(b"left by a SIGKILLed export")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "exportkit", "export", "ckpt/", "--json", "-"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=300, preexec_fn=lambda: os.umask(0o022))
    assert proc.returncode == 0, proc.stderr
    assert "export/heads" in proc.stderr and stale.name in proc.stderr
    assert "removed stale staging directory" in proc.stderr
    base = project / "export" / "heads"
    assert sorted(p.name for p in base.iterdir()) == ["1"]  # the stale reservation of version 5 is gone
    assert (base / "1").stat().st_mode & 0o777 == 0o755  # what mkdir gives under umask 022, not mkdtemp's 0700
    assert sorted(json.loads(proc.stdout)["outputs"]) == ["box", "score"]
    manifest = json.loads((base / "1" / "assets.extra" / "exportkit" / "manifest.json").read_text())
    assert manifest["output_names"] == ["box", "score"]


def test_output_names_count_must_match(sources, tmp_path):
    proc = invoke("export", sources / "ckpt", "--builder", "nets:build_two_heads", "--python-path", sources,
                  "--input-spec", "x:-1,3:float32", "--output-names", "box", "-o", tmp_path / "base", "--no-verify")
    assert proc.returncode == 2, proc.stderr
    assert "--output-names gives 1 name(s)" in proc.stderr and "returns 2 output(s)" in proc.stderr
    assert "fix:" in proc.stderr and not (tmp_path / "base").exists()


def test_auto_key_warning_names_the_flag(tf, tmp_path):
    from exportkit.savedmodel.lint import lint_saved_model
    from exportkit.savedmodel.reader import read_saved_model_proto

    class Tuple(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
        def serve(self, x):
            return x * 2.0, x + 1.0

    module = Tuple()
    tf.saved_model.save(module, str(tmp_path / "1"), signatures={"serving_default": module.serve})
    auto = [f for f in lint_saved_model(read_saved_model_proto(tmp_path), check_registry=False) if f.code == "auto-key"]
    assert len(auto) == 2 and all("--output-names" in f.message for f in auto)


def test_duplicate_asset_names_are_refused(tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "vocab.txt").write_text(folder)
    proc = invoke("export", tmp_path / "model.keras", "--asset", tmp_path / "a" / "vocab.txt",
                  "--asset", tmp_path / "b" / "vocab.txt", "-o", tmp_path / "base")
    assert proc.returncode == 2
    assert str(tmp_path / "a" / "vocab.txt") in proc.stderr and str(tmp_path / "b" / "vocab.txt") in proc.stderr
    assert "fix:" in proc.stderr and not (tmp_path / "base").exists()


# ------------------------------------------------------------------------------------------- reservation
def test_versions_are_reserved_before_the_work(tmp_path):
    from exportkit.errors import UsageError
    from exportkit.export.writer import staged_version_dir, staging_version

    base = tmp_path / "base"
    with staged_version_dir(base) as first:
        with staged_version_dir(base) as second:  # a concurrent export takes the next number at once
            assert (staging_version(first), staging_version(second)) == (1, 2)
            (second / "saved_model.pb").write_bytes(b"x")
        with pytest.raises(UsageError, match="being exported into .* right now") as info:
            with staged_version_dir(base, 1):
                pass
        assert "fix" not in info.value.message and info.value.remedy
        (first / "saved_model.pb").write_bytes(b"x")
    assert sorted(p.name for p in base.iterdir()) == ["1", "2"]


@pytest.mark.parametrize("requested", [None, 3])
def test_lost_race_is_worded_for_the_case(tmp_path, requested):
    from exportkit.errors import UsageError
    from exportkit.export.writer import staged_version_dir, staging_version

    base = tmp_path / "base"
    base.mkdir()
    with pytest.raises(UsageError) as info:
        with staged_version_dir(base, requested) as staging:
            (base / str(staging_version(staging))).mkdir()  # something that does not reserve versions wrote it
    if requested is None:
        assert "appeared" in info.value.message and "--version" not in info.value.remedy
    else:
        assert "written into" in info.value.message and "--version" in info.value.remedy
    assert [p.name for p in base.iterdir()] == [str(requested or 1)]  # our staging directory is gone


def test_stale_staging_directories_are_removed_and_said(tmp_path):
    from exportkit.export.writer import staged_version_dir

    base = tmp_path / "base"
    stale = base / f".exportkit-1-{_dead_pid()}-deadbeef"
    live = base / f".exportkit-2-{os.getppid()}-cafef00d"  # our parent is alive: its reservation stays
    stale.mkdir(parents=True)
    live.mkdir()
    said = []
    with staged_version_dir(base, notice=said.append) as staging:
        assert staging.name.startswith(f".exportkit-3-{os.getpid()}-")
    assert not stale.exists() and live.exists() and len(said) == 1 and str(stale) in said[0]


def test_interrupt_inside_leaves_the_base_as_it_was(tmp_path):
    from exportkit.export.writer import staged_version_dir

    base = tmp_path / "base"
    (base / "1").mkdir(parents=True)
    before = tree_snapshot(base)
    with pytest.raises(KeyboardInterrupt):
        with staged_version_dir(base) as staging:
            (staging / "half").write_text("written")
            raise KeyboardInterrupt
    assert tree_snapshot(base) == before
    with pytest.raises(KeyboardInterrupt):
        with staged_version_dir(tmp_path / "new"):
            raise KeyboardInterrupt
    assert not (tmp_path / "new").exists()


# ---------------------------------------------------------------------------------- read-only, disk full
def _namespace_available() -> bool:
    if not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode == 0


needs_mounts = pytest.mark.skipif(not _namespace_available(), reason="needs `unshare -rm` to mount a small tmpfs")


def _export_on_tmpfs(tmp_path, mount_options: str, *args) -> tuple[int, str, list[str]]:
    """Run an export onto a tmpfs mounted with `mount_options` in a private mount namespace; returns the exit
    code, stderr and what is left on the tmpfs afterwards."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    argv = " ".join(f"'{a}'" for a in [sys.executable, "-m", "exportkit", "export", *map(str, args)])
    script = (f"mount -t tmpfs -o {mount_options} tmpfs {mnt} || exit 99\n{argv}\necho \"rc=$?\" >&2\n"
              f"echo \"left=$(ls -A {mnt} | tr '\\n' ' ')\" >&2\n")
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "rc=" in proc.stderr, proc.stderr
    code = int(proc.stderr.rsplit("rc=", 1)[1].split()[0])
    left = proc.stderr.rsplit("left=", 1)[1].split()
    return code, proc.stderr, left


@needs_mounts
def test_read_only_base_is_refused_before_loading(sources, tmp_path):
    code, err, _ = _export_on_tmpfs(tmp_path, "ro", sources / "small.keras", "-o", tmp_path / "mnt" / "base")
    assert code == 2, err
    assert "cannot write to" in err and "read-only file system" in err and "fix:" in err
    assert "unexpected" not in err and "  load" not in err  # checked before the model was loaded


@needs_mounts
@pytest.mark.slow
def test_disk_full_is_a_clear_infrastructure_error(sources, tmp_path):
    code, err, left = _export_on_tmpfs(tmp_path, "size=8k", sources / "small.keras", "-o", tmp_path / "mnt" / "base",
                                       "--no-verify")
    assert code == 3, err
    assert "no space left on device" in err and "fix:" in err and "unexpected" not in err
    assert left == [], "the export left something behind on the full disk"


def test_default_base_directory(tmp_path):
    from exportkit.options.export import export_options
    from exportkit.options.source import source_stem

    assert [source_stem(s) for s in ("ckpt/", "m/ranker.keras", "w.weights.h5", "ckpt/ckpt-3", "old.h5")] == [
        "ckpt", "ranker", "w", "ckpt-3", "old"]
    (tmp_path / "ranker.keras").write_bytes(b"")
    options = export_options(str(tmp_path / "ranker.keras"), None)
    assert options.output == "export/ranker" and "source name" in options.output_origin
    (tmp_path / "exportkit.toml").write_text('output = "../models/ranker"\n')
    options = export_options(str(tmp_path / "ranker.keras"), None)
    assert options.output == str((tmp_path.parent / "models" / "ranker").resolve())
    assert "exportkit.toml" in options.output_origin
    assert export_options(str(tmp_path / "ranker.keras"), "elsewhere").output_origin is None  # -o wins, nothing said
