"""exportkit compat against the real loader of TF 2.12 (a managed environment, installed once into the cache:
~70 s and 1.7 GB on a fresh machine) and of this Python's TF 2.21: predicted and observed must agree."""
from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import invoke, run_cli

pytestmark = [pytest.mark.compat, pytest.mark.slow]  # a managed TF 2.12 environment: never in the quick loop
VERSIONS = ("2.12", "2.21")


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> dict[str, Path]:
    import compat_corpus

    return compat_corpus.build_all(tmp_path_factory.mktemp("compat-corpus-observed"))


@pytest.fixture(scope="session")
def exported_samples(sample, tmp_path_factory) -> dict[str, Path]:
    """Two sample exports (mixed precision with custom layers; a lookup table with string input)."""
    base = tmp_path_factory.mktemp("compat-samples")
    out = {}
    for name in ("mixed_functional.keras", "text.keras"):
        entry = sample(name)
        proc = invoke("export", entry["path"], "-o", base / name, "--no-verify", *entry["export_args"])
        assert proc.returncode == 0, proc.stderr
        out[name] = base / name / "1"
    return out


@pytest.fixture(scope="session")
def pythons() -> dict[str, str]:
    from exportkit.tfversions.envs import python_for

    return {v: python_for(v) for v in VERSIONS}  # installs TF 2.12 on first use


class Worker:
    """The standalone worker of exportkit/tfversions/worker.py, driven over its protocol: one process per
    version loads every model in turn (as `session@X.Y` does for one)."""

    def __init__(self, python: str):
        from exportkit.tfversions.envs import WORKER
        from exportkit.tfenv import child_env

        self.dir = tempfile.TemporaryDirectory(prefix="exportkit-compat-test-")
        self.proc = subprocess.Popen([python, "-I", str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, cwd=self.dir.name, env=child_env("cpu"))
        self.tf = self._read()["tf"]

    def _read(self) -> dict:
        while True:
            line = self.proc.stdout.readline()
            assert line, "worker died"
            if line.startswith("{"):
                return json.loads(line)

    def request(self, **payload) -> dict:
        self.proc.stdin.write(json.dumps(payload) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def observe(self, path: Path) -> tuple[str, str | None]:
        """("ok"|"fails", error): load, then run generated batches (sizes 1 and 4) of the default signature."""
        from exportkit.savedmodel.reader import read_saved_model_proto, select_meta_graph
        from exportkit.savedmodel.signature_defs import signatures_of
        from exportkit.inputs.generate import generate_batches
        from exportkit.inputs.npz import save_batches
        from exportkit.inputs.spec import InputSpec

        reply = self.request(op="load", path=str(path), signature="serving_default", device="cpu")
        if not reply["ok"]:
            return "fails", reply["message"]
        signature = signatures_of(select_meta_graph(read_saved_model_proto(path)))["serving_default"]
        specs = [InputSpec(k, v["dtype"], v["shape"]) for k, v in signature["inputs"].items()]
        prefix = f"in{abs(hash(str(path)))}"
        save_batches(self.dir.name, generate_batches(specs, samples=4, seed=0), prefix)
        reply = self.request(op="run", dir=self.dir.name, inputs=prefix, outputs=prefix + "out")
        return ("ok", None) if reply["ok"] else ("fails", reply["message"])

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.proc.stdout.close()
        self.dir.cleanup()


def test_predicted_agrees_with_the_real_loader_on_2_12_and_2_21(corpus, exported_samples, pythons):
    from exportkit.tfversions.analysis import analyze
    from exportkit.savedmodel.reader import read_saved_model_proto, select_meta_graph

    models = {**corpus, **exported_samples}
    table, disagreements = [], []
    for version in VERSIONS:
        worker = Worker(pythons[version])
        try:
            assert worker.tf.startswith(version + ".")
            for name, path in models.items():
                (result,) = analyze(select_meta_graph(read_saved_model_proto(path)), [version])
                observed, error = worker.observe(path)
                table.append((name, version, result.predicted, observed))
                if (result.predicted == "fails") != (observed == "fails"):
                    disagreements.append((name, version, result.predicted, observed, error, result.findings))
        finally:
            worker.close()
    print("\n".join(" ".join(row) for row in table))
    assert not disagreements, disagreements
    observed_fails = {(n, v) for n, v, _, o in table if o == "fails"}
    # Each class really fails on 2.12 (the corpus is not vacuous) and the samples run there.
    assert {(n, "2.12") for n in ("new_op_cpu", "new_op_gpu_only", "kernel_dtype_added", "new_type_attr",
                                 "disallowed_dtype")} <= observed_fails
    assert ("new_op_gpu_only", "2.21") in observed_fails  # only a GPU kernel: no CPU server runs it
    assert not {(n, v) for n, v in observed_fails if n in exported_samples or n == "plain_module"}


def test_compat_run_matrix_through_the_cli(corpus, pythons, tmp_path):
    out = tmp_path / "matrix.json"
    proc = run_cli("compat", corpus["kernel_dtype_added"], "--tf", "2.12,2.21", "--run", "--json", out)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(out.read_text())
    rows = {v["tf"]: v for v in doc["versions"]}
    assert (rows["2.12"]["predicted"], rows["2.12"]["observed"]) == ("fails", "fails")
    assert "GatherV2" in rows["2.12"]["error"]
    assert (rows["2.21"]["predicted"], rows["2.21"]["observed"], rows["2.21"]["error"]) == ("ok", "ok", None)


def test_verify_with_tf_2_12_compares_its_session_runtime_with_the_reference(exported_samples, pythons, tmp_path):
    report = tmp_path / "verify.json"
    proc = run_cli("verify", exported_samples["mixed_functional.keras"], "--tf", "2.12", "--serving", "none",
                   "--json", report)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runtimes = {r["name"]: r for r in json.loads(report.read_text())["runtimes"]}
    assert runtimes["session@2.12"]["status"] == "ok" and runtimes["session@2.12"]["passed"]
    assert {o["key"] for o in runtimes["session@2.12"]["outputs"]} == {"embedding", "score"}
    assert runtimes["golden"]["is_reference"]
